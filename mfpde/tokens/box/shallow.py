"""The single-layer (shallow) model: one explicit residual attention layer, its own forward map (theory §2).

    μ_T = μ_0 + T M⁻¹ L(μ_0; V[μ_0; ρ])   (= μ_0 − T ∇·(μ_0 V[μ_0; ρ]) discretised by upwind DG),

so ŷ = ∫ g dμ_T is linear in ρ and R(ρ) convex: the setting of the exponential-convergence theorem
(theory §5.4). It is not a positivity-preserving solve of the transport equation (F), and it has no
depth steps. Taped as one forward-Euler :class:`~mfpde.tokens.rk.TapedStep`
(:data:`mfpde.tokens.rk.FORWARD_EULER`) for the discrete adjoint.
"""

from __future__ import annotations

from mpi4py import MPI

import dolfinx.fem
import numpy as np

from mfpde.errors import NumericalError
from mfpde.heads import HeadMeasure
from mfpde.tokens import rk
from mfpde.tokens.box.readout import Readout
from mfpde.tokens.box.transport import SampleOperator, Tape, TokenTransport, TransportReport

__all__ = ["solve_shallow"]


def solve_shallow(tokens: TokenTransport, u: dolfinx.fem.Function, heads: HeadMeasure, T: float,
                  g: Readout | None = None, tape: Tape | None = None) -> TransportReport:
    """μ_0 ↦ μ_T of the single residual layer of depth T, in place (theory §2, shallow model).

    Args:
        tokens: the token solver (its spaces, velocity and DG operator).
        u: μ_0 in ``tokens.W``; overwritten with μ_T.
        heads: the reduced head distribution ρ.
        T: the layer's depth (step size of the one explicit step).
        g: readout for ŷ.
        tape: if given, the step is appended (a forward-Euler :class:`~mfpde.tokens.rk.TapedStep`) for the adjoint.

    Returns:
        The report of the solve (``substeps`` = 1; ``outflow`` is T times the outflow rate of μ_0).

    Raises:
        NumericalError: non-finite values.
    """
    mass0 = tokens.mass(u)
    op, keep = SampleOperator(tokens), tape is not None
    tokens._tape_bytes = 0
    vel0 = op.velocity(u.x.array, heads, keep)
    new, r, taped = rk.step(rk.FORWARD_EULER, op, u.x.array.copy(), T, heads, vel0, keep, tokens.budget, limited=False)
    u.x.array[:] = new
    if tape is not None:
        assert taped is not None
        tape.append(taped)
    if not tokens.comm.allreduce(bool(np.all(np.isfinite(u.x.array))), op=MPI.LAND):
        raise NumericalError("non-finite token density in the shallow layer")
    _, mean, cov, yhat = tokens.moments(u, g)
    return TransportReport(mass0, tokens.mass(u), float(r), tokens.min_density(u), mean.tolist(), cov.tolist(), yhat, 1)
