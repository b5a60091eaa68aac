"""The discrete adjoint of the token solver and the first variation δR/δρ (theory §3).

**Discrete adjoint** (chosen over the continuous costate (B)): the reverse pass differentiates exactly
the discrete forward map of :class:`~mfpde.transport.TokenTransport`, one SSP-RK3 sub-step at a time,

    v₁ = v₀ + h F(v₀),  v₂ = ¾v₀ + ¼(v₁ + h F(v₁)),  v₃ = ⅓v₀ + ⅔(v₂ + h F(v₂)),
    λ₂ = ⅔(I + hF'(v₂))ᵀλ₃,  λ₁ = ¼(I + hF'(v₁))ᵀλ₂,  λ₀ = ⅓λ₃ + ¾λ₂ + (I + hF'(v₀))ᵀλ₁,

with F(v) = M⁻¹ b(V[v], v) and F'(v)ᵀλ = J_uᵀ z + (∂V/∂v)ᵀ J_Vᵀ z, z = M⁻¹λ. J_u and J_V are the UFL
derivatives of the upwind-DG form with respect to μ and to the velocity field; (∂V/∂v)ᵀ is the
nonlocal McKean–Vlasov term, the discrete counterpart of the source S_t of theory §3.1 (B), computed by
:func:`mfpde.attention.velocity_vjp`. So the gradient is the exact derivative of the discrete risk (for
DG0; for DG1 wherever the positivity limiter is inactive) and the Taylor test has slope 2.
The upwind flux is only piecewise smooth in the velocity: where V·n = 0 on a facet (e.g. V ≡ 0 when
∫ v dρ = 0 for every a) the discrete risk has a kink and the reverse pass returns the average of the
one-sided derivatives (UFL's sign(0) = 0), which need not be a descent direction. Start ρ_0 off that set.

**First variation** (theory §3.1 (G)). The velocity depends on ρ only through c_k = ∫_{a(θ)=a_k} v dρ
(:class:`~mfpde.attention.HeadMeasure`), so the reverse pass returns D(a_k) = ∂R/∂c_k and

    δR/δρ(θ) = v(θ) D(a(θ))     (per layer block for depth-indexed models, theory §3.1 (D)),

exact for the discrete R as a function of the Θ quadrature weights m_j ρ_j.

Samples are split across MPI ranks in groups (each group owns a token mesh on a sub-communicator); the
sums over samples are one ``allreduce``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from mpi4py import MPI

import dolfinx.fem
import dolfinx.la
import numpy as np
import numpy.typing as npt
import ufl

from mfpde.attention import HeadFamily, HeadMeasure, velocity_vjp, velocity_vjp_tensor
from mfpde.transport import Readout, TokenTransport

logger = logging.getLogger(__name__)
Array = npt.NDArray[np.float64]


class DiscreteAdjoint:
    """Reverse pass through a taped forward solve of :class:`TokenTransport`.

    Args:
        tt: the token solver whose ``solve(..., tape=...)`` produced the tape.
    """

    def __init__(self, tt: TokenTransport):
        self.tt = tt
        self.z = dolfinx.fem.Function(tt.W)
        self.lam = dolfinx.fem.Function(tt.W)
        # Transposed Jacobian actions as vector forms: (J_uᵀz)_j = ∂/∂μ_j L(μ, V)[z] and (J_Vᵀz)_j likewise,
        # i.e. the form with its test function replaced by z, differentiated in the direction of a test
        # function. One vector assembly each instead of a matrix assembly and a transposed product.
        w = ufl.TestFunction(tt.W)
        Lz = ufl.replace(tt.L_expr, {w: self.z})
        self.JuT = dolfinx.fem.form(ufl.derivative(Lz, tt.u, ufl.TestFunction(tt.W)))
        self.JVT = dolfinx.fem.form(ufl.derivative(Lz, tt.vel, ufl.TestFunction(tt.P)))
        self.r = dolfinx.fem.Function(tt.W)
        self.xi = dolfinx.fem.Function(tt.P)
        q = tt.quad
        offset = int(q.counts[: tt.comm.rank].sum())
        inv = np.empty_like(q.order)
        inv[q.order] = np.arange(len(q.order))
        self.local_pos = inv[offset + np.arange(len(q.local_dofs))]  # sorted position of each local node
        self.n_vown = tt.P.dofmap.index_map.size_local
        d = tt.msh.geometry.dim
        self.x_own = tt.vx[: self.n_vown].reshape(-1, d)

    def _Ft(self, v: Array, heads: HeadMeasure, lam: Array) -> tuple[Array, Array]:
        """F'(v)ᵀ λ (owned DG dofs) and ∂(λ·F)/∂c (N_a,) at the stage state v."""
        tt = self.tt
        n = tt.n_owned
        tt.u.x.array[:] = v
        tt.update_velocity(tt.u, heads)
        self.lam.x.array[:n] = lam
        self.lam.x.scatter_forward()
        tt.mass_solver.solve(self.lam.x.petsc_vec, self.z.x.petsc_vec)  # M symmetric: M⁻ᵀ = M⁻¹
        self.z.x.scatter_forward()
        for f, form in ((self.r, self.JuT), (self.xi, self.JVT)):
            f.x.array[:] = 0.0
            dolfinx.fem.assemble_vector(f.x.array, form)
            f.x.scatter_reverse(dolfinx.la.InsertMode.add)
        out = self.r.x.array[:n].copy()
        gw, gc = self._kernel_vjp(tt.u, heads)
        out_local = np.zeros(len(tt.u.x.array))
        np.add.at(out_local, tt.quad.local_dofs, tt.quad.local_m * gw[self.local_pos])
        return out + out_local[:n], gc

    def _kernel_vjp(self, u: dolfinx.fem.Function, heads: HeadMeasure) -> tuple[Array, Array]:
        tt, comm = self.tt, self.tt.comm
        d = tt.msh.geometry.dim
        wts = tt.quad.gather(u)
        xi = self.xi.x.array[: self.n_vown * d].reshape(-1, d)
        if tt.vgrid is not None:
            Xi = np.zeros((*tt.vgrid.shape, d))
            idx = tuple(i[: self.n_vown] for i in tt.vindex)
            Xi[idx] = xi
            Xi = comm.allreduce(Xi, op=MPI.SUM)
            gW, gc = velocity_vjp_tensor(tt.vgrid, tt.quad.grid_axes, tt.quad.grid(wts), heads, Xi)
            return gW.ravel()[tt.quad.flat_index], gc
        gw, gc = velocity_vjp(self.x_own, tt.quad.points, wts, heads, xi)
        return comm.allreduce(gw, op=MPI.SUM), comm.allreduce(gc, op=MPI.SUM)

    def backward(self, tape: list, lam_T: Array, n_layers: int) -> tuple[Array, list[Array]]:
        """Run the reverse pass.

        Args:
            tape: from ``TokenTransport.solve(..., tape=tape)``.
            lam_T: ∂R/∂μ_T on the owned DG dofs, shape (n_owned,).
            n_layers: number of layer blocks.

        Returns:
            (λ₀, [∂R/∂c per layer]): the cotangent of μ_0 (n_owned,) and, per layer, shape (N_a,).
        """
        gcs: list[Array | None] = [None] * n_layers
        lam3 = lam_T.copy()
        for entry in reversed(tape):
            if entry[0] == "euler":  # the shallow model's single explicit layer: λ₀ = (I + hF'(v₀))ᵀλ₁
                _, h, heads, v0, layer = entry
                f0, c0 = self._Ft(v0, heads, lam3)
                lam3 = lam3 + h * f0
                gcs[layer] = h * c0 if gcs[layer] is None else gcs[layer] + h * c0
                continue
            h, heads, v0, v1, v2, layer = entry
            f2, c2 = self._Ft(v2, heads, lam3)
            lam2 = 2.0 / 3.0 * (lam3 + h * f2)
            f1, c1 = self._Ft(v1, heads, lam2)
            lam1 = 0.25 * (lam2 + h * f1)
            f0, c0 = self._Ft(v0, heads, lam1)
            lam3 = lam3 / 3.0 + 0.75 * lam2 + lam1 + h * f0
            gc = h * (2.0 / 3.0 * c2 + 0.25 * c1 + c0)
            gcs[layer] = gc if gcs[layer] is None else gcs[layer] + gc
        return lam3, [g if g is not None else np.zeros(0) for g in gcs]


def dyhat_dmu(tt: TokenTransport, g: Readout) -> Array:
    """∂ŷ/∂μ_i = m_i g(x_i) on the owned DG dofs (ŷ by the lumped quadrature), shape (n_owned,)."""
    d = tt.msh.geometry.dim
    n = tt.n_owned
    x = tt.W.tabulate_dof_coordinates()[:n, :d]
    return tt.m[:n] * g(x)


@dataclass
class Gradient:
    """Risk, predictions and first variation for one ρ.

    Attributes:
        risk: R(ρ) = (1/n) Σ ½(ŷ^i − y^i)².
        yhat: ŷ^i for all samples, shape (n,).
        D: per layer, ∂R/∂c at the a-values of the head measure, shape (N_a,).
        Dy: per layer, per sample ∂ŷ^i/∂c, shape (n, N_a) (for the NTK); only if asked.
    """

    risk: float
    yhat: Array
    D: list[Array]
    Dy: list[Array] | None = None


def first_variation_values(family: HeadFamily, heads: HeadMeasure, D: Array, theta: Array) -> Array:
    """δR/δρ(θ) = v(θ) D(a(θ)) at points θ of shape (N, p) whose a(θ) are among ``heads.a``.

    Raises:
        KeyError: some a(θ) is not an a-value of the head measure.
    """
    a = np.round(family.a(theta), 12)
    lookup = {float(ak): k for k, ak in enumerate(np.round(heads.a, 12))}
    idx = np.array([lookup[float(x)] for x in a], dtype=np.int64) if len(a) else np.zeros(0, np.int64)
    return family.v(theta) * D[idx]
