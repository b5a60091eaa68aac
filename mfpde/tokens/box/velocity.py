"""The McKean–Vlasov velocity as a field on the token mesh, with its vector–Jacobian product, in one class.

V[μ; ρ] (theory §1.3 (F)) is a continuous vector P1 field, evaluated at the mesh vertices from the whole
of μ: each rank gathers the quadrature data of μ (:class:`~mfpde.tokens.box.quadrature.TokenQuadrature`) and
calls the kernels of :mod:`mfpde.tokens.attention`, on tensor grids by separable products. The
vector–Jacobian product is the nonlocal term of the discrete adjoint (the source S_t of theory §3.1 (B));
in d = 1 it interpolates in s = a x (:mod:`mfpde.tokens.box.chebyshev`).

**Gather-free forward** (:mod:`mfpde.tokens.box.reduced`): the gather sends all N_y weights of μ to every rank at
every evaluation. On more than one rank a plain (not linearised) update instead sums each rank's own quadrature
points against the Chebyshev points of the mesh's global bounding box and reduces those sums ((n + 1)^d (d + 1)
N_a numbers, fewer than N_y on any mesh where it pays), then interpolates at the local vertices: the same map on
any number of ranks, to the order of the sums, and within the Chebyshev tail tolerance (1e-14 · max |y|) of the
gathered paths. Where it does not converge, or a head's exponent range is too large, it gathers as before.
Linearised updates (training's forward, whose :meth:`VelocityOperator.vjp` must be the exact transpose of the map
used) always take the gathered paths below.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from mpi4py import MPI

import dolfinx.fem
import numpy as np
import numpy.typing as npt

from mfpde.heads import HeadMeasure
from mfpde.tokens.attention import (
    CHEBYSHEV_DEGREES,
    TensorGrid,
    TiltedInterpolant,
    active_heads,
    softmax_moments_direct,
    tilted_interpolant,
    velocity_vjp,
)
from mfpde.tokens.box.chebyshev import velocity_vjp_1d
from mfpde.tokens.box.interpolated import InterpolatedSoftmax
from mfpde.tokens.box.quadrature import TokenQuadrature
from mfpde.tokens.box.reduced import global_support, reduced_tilted_interpolant
from mfpde.tokens.box.separable import SeparableFactors, TensorSoftmax

__all__ = ["VelocityLinearization", "VelocityOperator"]

Array = npt.NDArray[np.float64]

#: The first degree of the gather-free grid, which fixes its smallest message (:meth:`VelocityOperator.update`).
_FIRST_DEGREE = 16
#: The cost of the gather-free grid sums per point and grid node, in units of one multiply-add of the d = 2 tensor
#: path's separable product (whose factors are cached): about 2.4 measured by bench/bench_box_scaling.py (2 cores).
_GRID_COST = 2.4


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
        gather_free: whether plain updates reduce kernel sums instead of gathering μ (:mod:`mfpde.tokens.box.reduced`):
            None (the default) on more than one rank where the grid's message, (n + 1)^d (d + 1) numbers (× N_a in
            d = 2; n the degree of the last gather-free evaluation, 16 at first), is not larger than the N_y weights
            a gather moves, and, on a d = 2 tensor grid, where the grid sums of the largest rank, ``_GRID_COST``
            (n + 1)² N_y,local, cost less than the exact separable product m₁n₁n₂ + m₁m₂n₂ that every rank computes
            on the gathered μ (from about 20 ranks of 4096 cells each); True always (one rank too: for tests and
            benchmarks); False never. The same on every rank. Linearised updates always gather.
        path: the path of the last update, "gathered" or "reduced".
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
        # Unstructured d = 2: the bounding box of the whole mesh and its vertex count, the same on every rank
        # (the interpolation grid must not depend on the partition).
        lo = x.min(axis=0) if len(x) else np.full(d, np.inf)
        hi = x.max(axis=0) if len(x) else np.full(d, -np.inf)
        self.comm.Allreduce(MPI.IN_PLACE, lo, op=MPI.MIN)
        self.comm.Allreduce(MPI.IN_PLACE, hi, op=MPI.MAX)
        self._box = np.stack([lo, hi], axis=1)
        self._n_vertices = self.comm.allreduce(self.n_owned, op=MPI.SUM)
        self._n_y = int(quad.counts.sum())
        self._n_y_max = int(quad.counts.max())  # the most quadrature points of one rank
        self.gather_free: bool | None = None
        # the degree of the last gather-free evaluation: its message size, and where the next one starts
        self._reduced_degree = _FIRST_DEGREE
        self.path = "gathered"
        self._vjp_degree = 16  # the d = 1 VJP's last Chebyshev degree: where the next call starts
        self._lin: VelocityLinearization | None = None
        self._factor_cache: SeparableFactors | None = None
        self._factor_declined = b""  # the heads (a.tobytes()) whose whole-box exponent range was too large

    def update(self, u: dolfinx.fem.Function, heads: HeadMeasure, linearize: bool = False) -> None:
        """Set :attr:`field` to V[μ; ρ] at the vertices, for μ = u (theory §1.3 (F)). Collective.

        With ``linearize`` every head is evaluated (also those with c_k = 0) and the softmax factors are kept
        for the next :meth:`vjp`: the reverse pass then costs one batched product more than the forward
        instead of a second evaluation of the kernels.

        A plain update on more than one rank reduces kernel sums instead of gathering μ (:attr:`gather_free`); a
        linearised one always gathers, so that :meth:`vjp` is the exact transpose of the map it evaluated.
        """
        self._lin = None
        if not linearize and self._reduce(heads):
            vals = self._reduced(u, heads)
            if vals is not None:
                self.path = "reduced"
                self.field.x.array[:] = vals.reshape(-1, self.d).ravel()
                return
        self.path = "gathered"
        wts = self.quad.gather(u)
        lin = VelocityLinearization(wts, heads, np.empty(0))  # the field is copied in below
        if wts.sum() <= 0:
            self.field.x.array[:] = 0.0
            if linearize:
                self._lin = replace(lin, field=np.array(self.field.x.array, dtype=np.float64))
            return
        a, c = active_heads(heads, linearize)
        if not len(a):
            vals = np.zeros_like(self.x)
        elif self.grid is not None and self.d == 2:
            assert self.quad.grid_axes is not None  # grid is only set on a tensor-grid quadrature
            lin.tensor = TensorSoftmax(self.grid, self.quad.grid_axes, self.quad.grid(wts), a,
                                       self.separable_factors(a))
            vals = lin.tensor.velocity(c)[self.index]
        else:
            fast = (self._chebyshev_1d if self.d == 1 else self._interpolated)(lin, wts, a, c, linearize)
            if fast is None:  # the direct log-domain sums
                mom = [softmax_moments_direct(self.x, self.quad.points, wts, ak) for ak in a]
                lin.logz, lin.m = np.stack([lz for lz, _ in mom]), np.stack([mk for _, mk in mom])
                fast = np.tensordot(c, lin.m, axes=1)
            vals = fast
        self.field.x.array[:] = vals.reshape(-1, self.d).ravel()
        if linearize:
            self._lin = replace(lin, field=np.array(self.field.x.array, dtype=np.float64))

    def _reduce(self, heads: HeadMeasure) -> bool:
        """Whether a plain update takes the gather-free path (:attr:`gather_free`); the same on every rank."""
        if self.gather_free is not None:
            return self.gather_free
        n_a = 1 if self.d == 1 else len(active_heads(heads, False)[0])
        grid = (self._reduced_degree + 1) ** self.d
        if self.comm.size == 1 or grid * (self.d + 1) * n_a > self._n_y:  # one rank, or the gather's message is smaller
            return False
        if self.grid is not None and self.d == 2:  # the exact separable product: cheaper on few ranks
            assert self.quad.grid_axes is not None
            (m1, m2), (n1, n2) = self.grid.shape, self.quad.grid_axes.shape
            return _GRID_COST * grid * self._n_y_max <= m1 * n1 * n2 + m1 * m2 * n2
        return True  # the gathered d = 1 and grid paths also cost ∝ N_y on every rank: the reduced sums N_y / P

    def _reduced(self, u: dolfinx.fem.Function, heads: HeadMeasure) -> Array | None:
        """V at the local vertices from this rank's part of μ and reductions of kernel sums. Collective.

        :mod:`mfpde.tokens.box.reduced`; None (on every rank alike) where the Chebyshev series does not converge,
        the interval in s = a x is one point (d = 1), or a head's exponent range is too large (d = 2).
        """
        y, w = self.quad.local_points, self.quad.local_weights(u)
        a, c = active_heads(heads, False)
        if not len(a):
            return np.zeros_like(self.x)
        if self.d == 2:
            S = InterpolatedSoftmax(self._box, y, w, a, max_points=(64 + 1) ** 2, comm=self.comm,
                                    start=self._reduced_degree)
            if not S.ok:  # not converged by degree 64 (the next call starts there), or a head too sharp
                self._reduced_degree = 64 if not len(S.rest) else self._reduced_degree
                return None
            self._reduced_degree = S.n
            return S.velocity(self.x, c)
        support = global_support(self.comm, y, w)
        if support is None:  # μ = 0
            return np.zeros_like(self.x)
        s = np.concatenate([a * self._box[0, 0], a * self._box[0, 1]])
        lo, hi = float(s.min()), float(s.max())
        if hi - lo < 1e-12:
            return None
        interp = reduced_tilted_interpolant(self.comm, lo, hi, y[:, 0], w, max(support[2], 1e-300),
                                            start=self._reduced_degree)
        if interp is None:  # not converged by the last degree: the next call starts there
            self._reduced_degree = CHEBYSHEV_DEGREES[-1]
            return None
        self._reduced_degree = interp.n
        return (c @ interp.outer(a, self.x[:, 0]))[:, None] if len(self.x) else np.zeros_like(self.x)

    def _chebyshev_1d(self, lin: VelocityLinearization, wts: Array, a: Array, c: Array, linearize: bool
                      ) -> Array | None:
        """In d = 1, the velocity by Chebyshev interpolation in s = a x (None where it would not pay or converge)."""
        s = np.outer(a, self.x[:, 0])
        if not s.size or float(s.max()) - float(s.min()) < 1e-12:  # no local vertex (more ranks than cells), one s
            return None
        interp = tilted_interpolant(float(s.min()), float(s.max()), self.quad.points[:, 0], wts,
                                    max_degree=s.size // 4 - 1, kernel=linearize)
        if interp is None:
            return None
        lin.m, lin.interp = interp.outer(a, self.x[:, 0])[..., None], interp
        return np.tensordot(c, lin.m, axes=1)

    def _interpolated(self, lin: VelocityLinearization, wts: Array, a: Array, c: Array, linearize: bool
                      ) -> Array | None:
        """Unstructured d = 2: the velocity interpolated from a Chebyshev grid of the mesh's bounding box.

        :mod:`mfpde.tokens.box.interpolated`; None where the grid does not converge or would not pay.
        """
        S = InterpolatedSoftmax(self._box, self.quad.points, wts, a, max_points=4 * self._n_vertices)
        if not S.ok:
            return None
        lin.interp2d = S
        return S.velocity(self.x, c)

    def separable_factors(self, a: Array) -> SeparableFactors | None:
        """The μ-independent separable factors of the heads a, built once per set of heads and kept."""
        assert self.grid is not None and self.quad.grid_axes is not None
        f = self._factor_cache.take(a) if self._factor_cache is not None else None
        if f is None and a.tobytes() != self._factor_declined:
            f = SeparableFactors.build(self.grid, self.quad.grid_axes, a)
            if f is None:  # the exponent range over the box is too large: per-μ shifts, do not ask again
                self._factor_declined = a.tobytes()
            elif self._factor_cache is None or len(a) >= len(self._factor_cache.a):
                self._factor_cache = f
        return f

    @property
    def linearization(self) -> VelocityLinearization | None:
        """The state of the last ``update(..., linearize=True)`` (None after a plain update), for a tape."""
        return self._lin

    def restore(self, lin: VelocityLinearization) -> None:
        """Set :attr:`field` and the linearisation from a taped ``update(..., linearize=True)``."""
        self.field.x.array[:] = lin.field
        self._lin = lin

    def vjp(self, xi: dolfinx.fem.Function) -> tuple[Array, Array]:
        """The transpose of the derivative of V[μ; ρ] applied to a cotangent field (theory §3.1). Collective.

        Linearised at the μ and ρ of the last ``update(..., linearize=True)``.

        Args:
            xi: the cotangent, a Function on :attr:`P` (owned values used).

        Returns:
            (g_w, g_c): ∂/∂w of Σ_x ξ·V for the quadrature weights w of μ, shape (N_y,) in the gathered
            order of :attr:`quad`, the same on every rank; and ∂/∂c_k, shape (N_a,).

        Raises:
            RuntimeError: no linearisation (``update`` was not called with ``linearize=True``).
        """
        lin = self._lin
        if lin is None:
            raise RuntimeError("VelocityOperator.vjp needs update(..., linearize=True) first")
        comm, d, n, heads, wts = self.comm, self.d, self.n_owned, lin.heads, lin.wts
        if wts.sum() <= 0:  # V ≡ 0 here (zero mass): no sensitivity
            return np.zeros(len(wts)), np.zeros(len(heads.a))
        xi_own = np.asarray(xi.x.array[: n * d], dtype=np.float64).reshape(-1, d)
        if lin.tensor is not None:
            assert self.grid is not None
            Xi = np.zeros((*self.grid.shape, d))
            Xi[tuple(i[:n] for i in self.index)] = xi_own
            comm.Allreduce(MPI.IN_PLACE, Xi, op=MPI.SUM)
            gW, gc = lin.tensor.vjp(heads.c, Xi)
            return gW.ravel()[self.quad.flat_index], gc
        if lin.interp2d is not None:  # the grid heads on the grid (Ξ summed over ranks), the others direct
            S = lin.interp2d
            Xi = S.grid_cotangent(self.x_owned, xi_own)
            comm.Allreduce(MPI.IN_PLACE, Xi, op=MPI.SUM)
            gw, gc = S.vjp(Xi, heads.c)
            if len(S.rest):
                g1, g2 = velocity_vjp(self.x_owned, self.quad.points, wts,
                                      HeadMeasure(heads.a[S.rest], heads.c[S.rest]), xi_own)
                g = np.concatenate([g1, g2])
                comm.Allreduce(MPI.IN_PLACE, g, op=MPI.SUM)
                gw += g[: len(g1)]
                gc[S.rest] = g[len(g1):]
            return gw, gc
        assert lin.m is not None
        moments = (lin.logz[:, :n], lin.m[:, :n]) if lin.logz is not None else None
        res = None
        if d == 1 and moments is None:  # one function of s = a x serves every head: Chebyshev in s
            # Each rank's sum over its own vertices, by whichever path suits them (a rank with few vertices
            # declines the interpolation): the choice is local, and every rank then joins the same reduction.
            res = velocity_vjp_1d(self.x_owned, self.quad.points, wts, heads, xi_own, start=self._vjp_degree,
                                  m=lin.m[:, :n, 0], interp=lin.interp)
        if res is not None:
            self._vjp_degree = max(res[2], 16)
            gw, gc = res[0], res[1]
        else:
            gw, gc = velocity_vjp(self.x_owned, self.quad.points, wts, heads, xi_own, moments)
        g = np.concatenate([gw, gc])  # one reduction (buffer interface, no pickling)
        comm.Allreduce(MPI.IN_PLACE, g, op=MPI.SUM)
        return g[: len(gw)], g[len(gw):]


@dataclass
class VelocityLinearization:
    """What :meth:`VelocityOperator.vjp` reuses from an ``update(..., linearize=True)``; kept on the tape.

    Attributes:
        wts: the gathered quadrature weights of μ, shape (N_y,).
        heads: the head measure (every head).
        field: the velocity's local dof values, shape (n_local d,).
        tensor: the separable softmax factors (d = 2 tensor grids).
        m: the tilted means at the local vertices, shape (N_a, n_local, d) (other paths).
        logz: log Z at the local vertices, shape (N_a, n_local) (direct sums only).
        interp: the d = 1 Chebyshev interpolant in s = a x with the kernel's coefficients (Chebyshev path only).
        interp2d: the tilted means on a Chebyshev grid (d = 2, unstructured meshes).
    """

    wts: Array
    heads: HeadMeasure
    field: Array
    tensor: TensorSoftmax | None = None
    m: Array | None = None
    logz: Array | None = None
    interp: TiltedInterpolant | None = None
    interp2d: InterpolatedSoftmax | None = None

    @property
    def nbytes(self) -> int:
        """Memory held, in bytes."""
        arrays = [self.wts, self.field, self.m, self.logz] + (
            [self.interp.coef, self.interp.kernel_coef] if self.interp is not None else [])
        return (sum(a.nbytes for a in arrays if a is not None) + (self.tensor.nbytes if self.tensor is not None else 0)
                + (self.interp2d.nbytes if self.interp2d is not None else 0))
