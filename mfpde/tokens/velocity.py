"""The McKean–Vlasov velocity as a field on the token mesh, with its vector–Jacobian product, in one class.

V[μ; ρ] (theory §1.3 (F)) is a continuous vector P1 field, evaluated at the mesh vertices from the whole
of μ: each rank gathers the quadrature data of μ (:class:`~mfpde.tokens.quadrature.TokenQuadrature`) and
calls the kernels of :mod:`mfpde.tokens.attention`, on tensor grids by separable products. The
vector–Jacobian product is the nonlocal term of the discrete adjoint (the source S_t of theory §3.1 (B));
in d = 1 it interpolates in s = a x (:mod:`mfpde.tokens.chebyshev`).
"""

from __future__ import annotations

from mpi4py import MPI

import dolfinx.fem
import numpy as np
import numpy.typing as npt

from mfpde.tokens.attention import (
    HeadMeasure,
    TensorGrid,
    velocity,
    velocity_tensor,
    velocity_vjp,
    velocity_vjp_tensor,
)
from mfpde.tokens.chebyshev import velocity_vjp_1d
from mfpde.tokens.quadrature import TokenQuadrature

__all__ = ["VelocityOperator"]

Array = npt.NDArray[np.float64]


class VelocityOperator:
    """V[μ; ρ] at the vertices of the token mesh, and the transpose of its derivative.

    Args:
        msh: the token mesh.
        quad: the quadrature of the token density space on ``msh``.
        axes: the vertex coordinates per axis for a box (tensor-grid kernels), else None.

    Attributes:
        P: the vector P1 space of the velocity; field: the velocity (set by :meth:`update`).
        x: vertex coordinates of the local dofs of P, shape (n_local, d).
        grid, index: the vertex grid and each local vertex's grid index (tensor path), or None.
    """

    def __init__(self, msh: dolfinx.mesh.Mesh, quad: TokenQuadrature,
                 axes: tuple[Array, ...] | None) -> None:
        d = msh.geometry.dim
        self.comm, self.quad, self.d = msh.comm, quad, d
        self.P = dolfinx.fem.functionspace(msh, ("Lagrange", 1, (d,)))
        self.field = dolfinx.fem.Function(self.P, name="velocity")
        x = self.P.tabulate_dof_coordinates()[:, :d]  # one row per vertex (blocked space)
        self.x = x
        self.grid: TensorGrid | None = None
        self.index: tuple[npt.NDArray[np.int64], ...] = ()
        if axes is not None and quad.grid_axes is not None:
            idx = [np.rint((x[:, j] - axes[j][0]) / (axes[j][1] - axes[j][0])).astype(np.int64)
                   for j in range(d)]
            if all(np.allclose(axes[j][idx[j]], x[:, j], atol=1e-9) for j in range(d)):
                self.grid = TensorGrid(tuple(axes))
                self.index = tuple(idx)
        self.n_owned = self.P.dofmap.index_map.size_local
        self.x_owned = x[: self.n_owned].reshape(-1, d)
        self._vjp_degree = 16  # the d = 1 VJP's last Chebyshev degree: where the next call starts

    def update(self, u: dolfinx.fem.Function, heads: HeadMeasure) -> None:
        """Set :attr:`field` to V[μ; ρ] at the vertices, for μ = u (theory §1.3 (F)). Collective."""
        wts = self.quad.gather(u)
        if wts.sum() <= 0:
            self.field.x.array[:] = 0.0
            return
        if self.grid is not None:
            assert self.quad.grid_axes is not None  # grid is only set on a tensor-grid quadrature
            Vg = velocity_tensor(self.grid, self.quad.grid_axes, self.quad.grid(wts), heads)
            vals = Vg[self.index]
        else:
            vals = velocity(self.x, self.quad.points, wts, heads)
        self.field.x.array[:] = vals.reshape(-1, self.d).ravel()

    def vjp(self, u: dolfinx.fem.Function, heads: HeadMeasure, xi: dolfinx.fem.Function
            ) -> tuple[Array, Array]:
        """The transpose of the derivative of V[μ; ρ] applied to a cotangent field (theory §3.1). Collective.

        Args:
            u: μ (the density the velocity was evaluated at).
            heads: the reduced head distribution (every a kept).
            xi: the cotangent, a Function on :attr:`P` (owned values used).

        Returns:
            (g_w, g_c): ∂/∂w of Σ_x ξ·V for the quadrature weights w of μ, shape (N_y,) in the gathered
            order of :attr:`quad`, the same on every rank; and ∂/∂c_k, shape (N_a,).
        """
        comm, d = self.comm, self.d
        wts = self.quad.gather(u)
        xi_own = np.asarray(xi.x.array[: self.n_owned * d], dtype=np.float64).reshape(-1, d)
        if d == 1:  # one function of s = a x serves every head: Chebyshev in s (mfpde.tokens.chebyshev)
            # Each rank's sum over its own vertices, by whichever path suits them (a rank with few vertices
            # declines the interpolation): the choice is local, and every rank then joins the same reduction.
            res = velocity_vjp_1d(self.x_owned, self.quad.points, wts, heads, xi_own, start=self._vjp_degree)
            if res is not None:
                self._vjp_degree = max(res[2], 16)
                gw, gc = res[0], res[1]
            else:
                gw, gc = velocity_vjp(self.x_owned, self.quad.points, wts, heads, xi_own)
            return comm.allreduce(gw, op=MPI.SUM), comm.allreduce(gc, op=MPI.SUM)
        if self.grid is not None:
            Xi = np.zeros((*self.grid.shape, d))
            idx = tuple(i[: self.n_owned] for i in self.index)
            Xi[idx] = xi_own
            Xi = comm.allreduce(Xi, op=MPI.SUM)
            assert self.quad.grid_axes is not None  # grid is only set on a tensor-grid quadrature
            gW, gc = velocity_vjp_tensor(self.grid, self.quad.grid_axes, self.quad.grid(wts), heads, Xi)
            return gW.ravel()[self.quad.flat_index], gc
        gw, gc = velocity_vjp(self.x_owned, self.quad.points, wts, heads, xi_own)
        return comm.allreduce(gw, op=MPI.SUM), comm.allreduce(gc, op=MPI.SUM)
