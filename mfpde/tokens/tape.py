"""The forward → adjoint hand-off of the token solver: the taped steps of one forward solve.

:class:`~mfpde.tokens.transport.TokenTransport` appends one record per sub-step when asked for a tape;
:class:`~mfpde.tokens.adjoint.DiscreteAdjoint` reads them back in reverse (theory §3, discrete adjoint).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from mfpde.tokens.attention import HeadMeasure
from mfpde.tokens.limiter import LimiterRecord
from mfpde.tokens.velocity import VelocityLinearization

__all__ = ["TAPE_BUDGET_BYTES", "EulerStep", "RK3Step", "Tape"]

Array = npt.NDArray[np.float64]
#: Memory per tape for the velocity linearisations of the stages (:class:`RK3Step`); beyond it the reverse
#: pass re-evaluates the velocity at the stages left without one (about one forward kernel more per stage).
TAPE_BUDGET_BYTES = 2**30


@dataclass(frozen=True)
class RK3Step:
    """One taped SSP-RK3 sub-step, what the discrete adjoint (:mod:`mfpde.tokens.adjoint`) differentiates.

    Attributes:
        h: the sub-step size in depth.
        heads: the reduced head distribution the step used.
        v0, v1, v2: the three stage states (local DG dofs, owned and ghost), shape (n_local,).
        layer: the layer block whose ρ the step used (0 for weight-tied models).
        lin: the velocity's linearisation at each stage (what the reverse pass would otherwise recompute),
            or None where the tape's memory budget (``TAPE_BUDGET_BYTES``) was spent.
        limiter: the positivity limiter after each of the three stages (k = 1; None where no cell was limited).
    """

    h: float
    heads: HeadMeasure
    v0: Array
    v1: Array
    v2: Array
    layer: int
    lin: tuple[VelocityLinearization | None, ...] = (None, None, None)
    limiter: tuple[LimiterRecord | None, ...] = (None, None, None)


@dataclass(frozen=True)
class EulerStep:
    """The taped single explicit layer of the shallow model (:mod:`mfpde.tokens.shallow`): μ_T = v0 + h F(v0)."""

    h: float
    heads: HeadMeasure
    v0: Array
    layer: int
    lin: VelocityLinearization | None = None


#: The forward → adjoint hand-off: the taped steps of one forward solve, in depth order.
Tape = list[RK3Step | EulerStep]
