"""Step budgets: every explicit time-stepping loop charges its steps, so a stalled computation ends with a verdict.

Used by the depth sub-steps of the token solvers (:func:`mfpde.tokens.rk.depth_step`) and the CFL sub-steps of
the Θ transport (:mod:`mfpde.params.muscl`); ``mfpde verify`` runs each check inside a budget, so a check whose
solve stalls (a velocity that blows up and halves the CFL step again and again) fails with the reason instead of
hanging.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from mfpde.errors import NumericalError

__all__ = ["StepBudget", "spend", "step_budget"]


@dataclass
class StepBudget:
    """A bound on the explicit steps (depth sub-steps, CFL sub-steps of Θ transport) of a computation.

    Attributes:
        limit: the most steps allowed (a count of sub-steps, one per row and sub-step).
        used: the steps taken so far.
    """

    limit: int
    used: int = 0


_BUDGETS: list[StepBudget] = []


@contextmanager
def step_budget(limit: int) -> Iterator[StepBudget]:
    """Within the block, more than ``limit`` explicit steps raise :class:`~mfpde.errors.NumericalError`.

    So a stalled solve (a velocity that blows up and halves the CFL step again and again) ends with a verdict
    instead of running for ever. Budgets nest; every enclosing one is charged. The count is the same on every
    rank of a solve (sub-step counts come from collective CFL bounds), so all its ranks stop together.
    """
    b = StepBudget(int(limit))
    _BUDGETS.append(b)
    try:
        yield b
    finally:
        _BUDGETS.remove(b)


def spend(n: int, what: str = "depth sub-steps") -> None:
    """Charge n steps to the active budgets.

    Raises:
        NumericalError: a budget is exceeded (the computation stalled).
    """
    for b in _BUDGETS:
        b.used += n
        if b.used > b.limit:
            raise NumericalError(f"step budget spent: more than {b.limit} {what} (a stalled or blown-up solve)")
