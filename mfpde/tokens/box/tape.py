"""The forward → adjoint hand-off of the token solvers: the taped steps of one forward solve.

:class:`~mfpde.tokens.box.transport.TokenTransport` (through :func:`mfpde.tokens.rk.depth_step`) and the shallow layer
append one :class:`~mfpde.tokens.rk.TapedStep` per sub-step when asked for a tape;
:class:`~mfpde.tokens.box.adjoint.DiscreteAdjoint` reads them back in reverse (theory §3, discrete adjoint) by
:func:`mfpde.tokens.rk.step_transpose`.
"""

from __future__ import annotations

from mfpde.tokens.rk import TapedStep

__all__ = ["TAPE_BUDGET_BYTES", "Tape", "TapedStep"]

#: Memory per tape for the velocity linearisations of the stages; beyond it the reverse pass re-evaluates the
#: velocity at the stages left without one (about one forward kernel more per stage).
TAPE_BUDGET_BYTES = 2**30

#: The forward → adjoint hand-off: the taped steps of one forward solve, in depth order.
Tape = list[TapedStep]
