"""The discrete adjoint of the token solver and the first variation δR/δρ (theory §3).

**Discrete adjoint** (chosen over the continuous costate (B)): the reverse pass differentiates exactly
the discrete forward map of :class:`~mfpde.tokens.box.transport.TokenTransport`, one SSP-RK3 sub-step at a time,
by the transpose that :func:`mfpde.tokens.rk.step_transpose` reads off the scheme's Shu–Osher table; for SSP-RK3

    v₁ = L₁(v₀ + h F(v₀)),  v₂ = L₂(¾v₀ + ¼(v₁ + h F(v₁))),  v₃ = L₃(⅓v₀ + ⅔(v₂ + h F(v₂))),
    q₃ = L₃'ᵀp₃,  q₂ = L₂'ᵀ ⅔(I + hF'(v₂))ᵀq₃,  q₁ = L₁'ᵀ ¼(I + hF'(v₁))ᵀq₂,  p₀ = ⅓q₃ + ¾q₂ + (I + hF'(v₀))ᵀq₁,

with the costate p (∂R/∂v of each stage state; written p, not λ, which is the entropy weight),
F(v) = M⁻¹ b(V[v], v) and F'(v)ᵀp = J_uᵀ z + (∂V/∂v)ᵀ J_Vᵀ z, z = M⁻¹p. J_u and J_V are the UFL
derivatives of the upwind-DG form with respect to μ and to the velocity field; L_i is the positivity limiter
of DG1 (the identity for DG0 and on unlimited cells; its transpose: :mod:`mfpde.tokens.limiter`); (∂V/∂v)ᵀ is the
nonlocal McKean–Vlasov term, the discrete counterpart of the source S_t of theory §3.1 (B), computed by
:func:`mfpde.tokens.attention.velocity_vjp`. So the gradient is the exact derivative of the discrete risk (DG0
and DG1, limiter included, away from the kinks where a cell starts or stops being limited) and the Taylor test
has slope 2.
The upwind flux is only piecewise smooth in the velocity: where V·n = 0 on a facet (e.g. V ≡ 0 when
∫ v dρ = 0 for every a) the discrete risk has a kink and the reverse pass returns the average of the
one-sided derivatives (UFL's sign(0) = 0), which need not be a descent direction. Start ρ_0 off that set.

**First variation** (theory §3.1 (G)). The velocity depends on ρ only through c_k = ∫_{a(θ)=a_k} v dρ
(:class:`~mfpde.heads.HeadMeasure`), so the reverse pass returns D(a_k) = ∂R/∂c_k and

    δR/δρ(θ) = v(θ) D(a(θ))     (per layer block for depth-indexed models, theory §3.1 (D)),

exact for the discrete R as a function of the Θ quadrature weights m_j ρ_j; evaluated on Θ by
:func:`mfpde.params.theta.first_variation_values`. The sums over samples are in
:mod:`mfpde.training.objective`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import dolfinx.fem
import dolfinx.la
import numpy as np
import numpy.typing as npt
import ufl

from mfpde.heads import HeadMeasure
from mfpde.tokens import rk
from mfpde.tokens.box.readout import Readout
from mfpde.tokens.box.tape import CheckpointedTape, reverse
from mfpde.tokens.box.transport import Tape, TokenTransport
from mfpde.tokens.box.velocity import VelocityLinearization
from mfpde.tokens.limiter import LimiterRecord, limit_transpose

__all__ = ["DiscreteAdjoint", "Gradient", "dyhat_dmu"]

logger = logging.getLogger(__name__)
Array = npt.NDArray[np.float64]


class DiscreteAdjoint:
    """Reverse pass through a taped forward solve of :class:`TokenTransport`.

    Args:
        tokens: the token solver whose ``solve(..., tape=...)`` produced the tape.
    """

    def __init__(self, tokens: TokenTransport):
        self.tokens = tokens
        self.z = dolfinx.fem.Function(tokens.W)
        self.costate = dolfinx.fem.Function(tokens.W)
        # Transposed Jacobian actions as vector forms: (J_uᵀz)_j = ∂/∂μ_j L(μ, V)[z] and (J_Vᵀz)_j likewise,
        # i.e. the form with its test function replaced by z, differentiated in the direction of a test
        # function. One vector assembly each instead of a matrix assembly and a transposed product.
        w = ufl.TestFunction(tokens.W)
        Lz = ufl.replace(tokens.L_expr, {w: self.z})
        self.JuT = dolfinx.fem.form(ufl.derivative(Lz, tokens.u, ufl.TestFunction(tokens.W)))
        self.JVT = dolfinx.fem.form(ufl.derivative(Lz, tokens.vel, ufl.TestFunction(tokens.P)))
        self.r = dolfinx.fem.Function(tokens.W)
        self.xi = dolfinx.fem.Function(tokens.P)
        q = tokens.quad
        offset = int(q.counts[: tokens.comm.rank].sum())
        inv = np.empty_like(q.order)
        inv[q.order] = np.arange(len(q.order))
        self.local_pos = inv[offset + np.arange(len(q.local_dofs))]  # sorted position of each local node

    def _Ft(self, v: Array, heads: HeadMeasure, p: Array, lin: VelocityLinearization | None
            ) -> tuple[Array, Array]:
        """F'(v)ᵀ p (owned DG dofs) and ∂(p·F)/∂c (N_a,) at the stage state v, for the costate p.

        The velocity's linearisation at v is taken from the tape (``lin``) or, where the tape has none,
        re-evaluated.
        """
        tokens = self.tokens
        n = tokens.n_owned
        tokens.u.x.array[:] = v
        if lin is not None:
            tokens.velocity.restore(lin)
        else:
            tokens.velocity.update(tokens.u, heads, linearize=True)
        self.costate.x.array[:n] = p
        self.costate.x.scatter_forward()
        tokens.mass_solver.solve(self.costate.x.petsc_vec, self.z.x.petsc_vec)  # M symmetric: M⁻ᵀ = M⁻¹
        self.z.x.scatter_forward()
        self.r.x.array[:] = 0.0
        self.xi.x.array[:] = 0.0
        if tokens.fv is not None:  # k = 0: the facet arrays of the same scheme
            tokens.fv.transpose(v, self.z.x.array, tokens.fv.normal_flux(tokens.vel.x.array), self.r.x.array,
                                self.xi.x.array)
        else:
            dolfinx.fem.assemble_vector(self.r.x.array, self.JuT)
            dolfinx.fem.assemble_vector(self.xi.x.array, self.JVT)
        for f in (self.r, self.xi):
            f.x.scatter_reverse(dolfinx.la.InsertMode.add)
        out = self.r.x.array[:n].copy()
        gw, gc = tokens.velocity.vjp(self.xi)
        out_local = np.zeros(len(tokens.u.x.array))
        np.add.at(out_local, tokens.quad.local_dofs, tokens.quad.local_m * gw[self.local_pos])
        return out + out_local[:n], gc

    def backward(self, tape: Tape | CheckpointedTape, p_T: Array, n_layers: int) -> tuple[Array, list[Array]]:
        """Run the reverse pass.

        Args:
            tape: from ``TokenTransport.solve(..., tape=tape)`` or ``solve_shallow(..., tape=tape)`` (a
                :class:`~mfpde.tokens.box.tape.CheckpointedTape` replays its segments here).
            p_T: the costate at depth T, ∂R/∂μ_T on the owned DG dofs, shape (n_owned,).
            n_layers: number of layer blocks.

        Returns:
            (p_0, [∂R/∂c per layer]): the costate of μ_0, shape (n_owned,), and per layer block the
            derivative with respect to the head masses c_k of the head measure, shape (N_a,) (shape (0,)
            for a block that no step used).
        """
        dR_dc: list[Array | None] = [None] * n_layers
        p = p_T.copy()
        for step in reverse(tape):
            p, gc = rk.step_transpose(self, step, p)
            prev = dR_dc[step.layer]
            dR_dc[step.layer] = gc if prev is None else prev + gc
            del step  # let a checkpointed tape's next replay go without this step's linearisation alive
        return p, [g if g is not None else np.zeros(0) for g in dR_dc]

    def rate_transpose(self, state: Array, heads: HeadMeasure, vel: VelocityLinearization | None, costate: Array
                       ) -> tuple[Array, Array]:
        """F'(state)ᵀ costate and ∂(costate · F)/∂c: the :class:`~mfpde.tokens.rk.DepthAdjoint` of the solver."""
        return self._Ft(state, heads, costate, vel)

    def limit_transpose(self, record: LimiterRecord | None, costate: Array) -> Array:
        """The transposed Zhang–Shu limiter (identity where no cell was limited)."""
        return limit_transpose(record, costate)


def dyhat_dmu(tokens: TokenTransport, g: Readout) -> Array:
    """∂ŷ/∂μ_i = m_i g(x_i) on the owned DG dofs (ŷ by the lumped quadrature), shape (n_owned,)."""
    d = tokens.msh.geometry.dim
    n = tokens.n_owned
    x = tokens.W.tabulate_dof_coordinates()[:n, :d]
    return tokens.m[:n] * g(x)


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
