"""The registry of verification checks: name, theory section, reference, and the function that measures.

A check measures one quantity (:class:`Outcome`: measured, reference value, error, threshold), compares it
with a threshold that comes from the theory or from the order of the scheme (never read off a run), and says
what it was compared with (``reference``): a closed form of theory §6, finite differences, or an independent
particle code. Check functions are collective: every rank
calls them and every rank gets the same :class:`Outcome`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["CHECKS", "Check", "Outcome", "Series", "register"]

Array = npt.NDArray[np.float64]


@dataclass
class Series:
    """A convergence series for a log-log plot: errors against a step (h, Δs, N, H, L or δ).

    Attributes:
        x: the steps, shape (m,); err: the errors, shape (m,); xlabel: what x is;
        expected: the expected slope (the scheme's order or the theorem's exponent), or None;
        fitted: the fitted slope; label: the legend entry.
    """

    x: list[float] | list[int]
    err: list[float]
    xlabel: str
    expected: float | None
    fitted: float
    label: str = "error"


@dataclass
class Outcome:
    """What a check measured: one quantity, its reference value, the error, the threshold, the verdict.

    The table and the docs show one kind per column: ``measured`` (of the check's registered ``kind`` and
    ``unit``), ``reference`` (the value theory gives it: the scheme's order for an order check, the theorem's
    rate for a rate check, the closed-form value for an exact-solution check, 0 for a drift that is 0 in exact
    arithmetic; None for a bound, which has no reference value), ``error`` = |measured − reference| (None
    without a reference) and ``threshold``, the condition the verdict applies: on the error when there is a
    reference, else on the measured value. Where a check measures several cases (meshes, degrees, models), the
    row is the case nearest to failing and the others are in ``detail``.

    Attributes:
        measured: the measured (or fitted) quantity of the case shown.
        reference: its reference value, or None (a bound with no reference value).
        threshold: the condition, as the table prints it (``"≤ 0.1"``; conditions on other cases or quantities,
            which the verdict also applies, follow after a semicolon).
        passed: the verdict; detail: one line with the numbers behind it;
        series: convergence series to plot (may be empty).
        tolerance: the bound of ``threshold`` on the error (or on the measured value without a reference), when
            it is one number; None when the condition is not a single bound (a band, a count).
    """

    measured: float
    reference: float | None
    threshold: str
    passed: bool
    detail: str
    series: list[Series] = field(default_factory=list)
    tolerance: float | None = None

    @property
    def error(self) -> float | None:
        """|measured − reference|, in the units of the measured quantity (None without a reference)."""
        return None if self.reference is None else abs(self.measured - self.reference)

    def record(self, check: Check) -> dict[str, Any]:
        """The ``checks`` entry of report.json (interface.md), plus the theory section and the series.

        ``value`` is ``measured`` under its former name (read by earlier reports' readers).
        """
        err = self.error
        return {"name": check.name, "kind": check.kind, "unit": check.unit, "measured": _finite(self.measured),
                "value": _finite(self.measured), "reference_value": _opt(self.reference),
                "error": _opt(err), "tolerance": _opt(self.tolerance), "threshold": self.threshold,
                "passed": bool(self.passed), "detail": self.detail, "reference": check.reference,
                "theory": check.section, "series": [asdict(s) for s in self.series]}


def _opt(x: float | None) -> float | None:
    return None if x is None else _finite(x)


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


#: Default budgets of a check: CPU seconds (full size) and explicit steps (:mod:`mfpde.budget`). A
#: check that takes more steps has stalled (it fails with the reason); one over its time fails as too slow.
DEFAULT_BUDGET_S, DEFAULT_STEPS = 300.0, 200_000


@dataclass(frozen=True)
class Check:
    """A registered check.

    Attributes:
        name: the check name of interface.md; section: the theory.md section it verifies;
        reference: what the code is compared with; run: the measurement, ``run(quick) -> Outcome``
        (collective); kind: what its measured value is (``slope``: a fitted log-log slope, an order or an
        exponent; ``rate``: a fitted decay rate; ``mass drift``, ``|Δ δR/δρ|``: a quantity that is 0 in exact
        arithmetic; ``min density``; ``moment``, ``risk``: the value of a quantity with a closed form;
        ``e_h/R_h``: an error over its Richardson estimate; ``ratio to bound``; ``clusters``); unit: its unit
        (``""``: none); budget_s: the CPU-time budget of the full (not quick) check in seconds (quick: half);
        steps: its budget of explicit steps (:mod:`mfpde.budget`); distributed: whether its solves are spread over
        the ranks (False: each rank computes the same thing alone, on ``COMM_SELF`` or replicated, so the rank
        count cannot change it and the test suite's MPI pass skips it).
    """

    name: str
    section: str
    reference: str
    run: Callable[[bool], Outcome]
    kind: str
    unit: str = ""
    budget_s: float = DEFAULT_BUDGET_S
    steps: int = DEFAULT_STEPS
    distributed: bool = True


#: The registered checks, in the order of the table.
CHECKS: dict[str, Check] = {}

CheckFunction = Callable[[bool], Outcome]


def register(name: str, section: str, reference: str, kind: str = "slope", unit: str = "",
             budget_s: float = DEFAULT_BUDGET_S, steps: int = DEFAULT_STEPS,
             distributed: bool = True) -> Callable[[CheckFunction], CheckFunction]:
    """Decorator: register ``fn(quick) -> Outcome`` as the check ``name`` (kind, unit, budgets as in :class:`Check`)."""

    def deco(fn: CheckFunction) -> CheckFunction:
        CHECKS[name] = Check(name, section, reference, fn, kind, unit, budget_s, steps, distributed)
        return fn

    return deco
