"""The single-layer (shallow) model: one explicit residual attention layer, its own forward map (theory §2).

    μ_T = μ_0 + T M⁻¹ L(μ_0; V[μ_0; ρ])   (= μ_0 − T ∇·(μ_0 V[μ_0; ρ]) discretised by upwind DG),

so ŷ = ∫ g dμ_T is linear in ρ and R(ρ) convex: the setting of the exponential-convergence theorem
(theory §5.4). It is not a positivity-preserving solve of the transport equation (F), and it has no
depth steps. Taped as one :class:`~mfpde.tokens.transport.EulerStep` for the discrete adjoint.
"""

from __future__ import annotations

from mpi4py import MPI

import dolfinx.fem
import numpy as np

from mfpde.errors import NumericalError
from mfpde.tokens.attention import HeadMeasure
from mfpde.tokens.readout import Readout
from mfpde.tokens.transport import EulerStep, Tape, TokenTransport, TransportReport

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
        tape: if given, the step is appended as an :class:`EulerStep` for the adjoint.

    Returns:
        The report of the solve (``substeps`` = 1; ``outflow`` is T times the outflow rate of μ_0).

    Raises:
        NumericalError: non-finite values.
    """
    mass0 = tokens.mass(u)
    tokens.velocity.update(u, heads, linearize=tape is not None)
    if tape is not None:
        tape.append(EulerStep(T, heads, u.x.array.copy(), 0, tokens.velocity.linearization))
    du, r = tokens.rate(u)
    u.x.array[:] += T * du.x.array
    if not tokens.comm.allreduce(bool(np.all(np.isfinite(u.x.array))), op=MPI.LAND):
        raise NumericalError("non-finite token density in the shallow layer")
    _, mean, cov, yhat = tokens.moments(u, g)
    return TransportReport(mass0, tokens.mass(u), T * r, tokens.min_density(u), mean.tolist(), cov.tolist(), yhat, 1)
