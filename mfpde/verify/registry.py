"""The registry of verification checks: name, theory section, reference, and the function that measures.

A check measures one number, compares it with a threshold that comes from the theory or from the order of
the scheme (never read off a run), and says what it was compared with (``reference``): a closed form of
theory §6, finite differences, or an independent particle code. Check functions are collective: every rank
calls them and every rank gets the same :class:`Outcome`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["CHECKS", "KINDS", "Check", "Outcome", "Series", "register"]

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
    """What a check measured.

    Attributes:
        value: the measured number; threshold: the bound it is compared with (a string says how);
        passed: the verdict; detail: one line with the numbers behind it;
        series: convergence series to plot (may be empty).
    """

    value: float
    threshold: str
    passed: bool
    detail: str
    series: list[Series] = field(default_factory=list)

    def record(self, check: Check) -> dict[str, Any]:
        """The ``checks`` entry of report.json (interface.md), plus the theory section and the series."""
        return {"name": check.name, "kind": KINDS.get(check.name, "value"), "value": _finite(self.value),
                "threshold": self.threshold,
                "passed": bool(self.passed), "detail": self.detail, "reference": check.reference,
                "theory": check.section, "series": [asdict(s) for s in self.series]}


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
        (collective); budget_s: the CPU-time budget of the full (not quick) check in seconds (quick: half);
        steps: its budget of explicit steps (:mod:`mfpde.budget`); distributed: whether its solves are spread over
        the ranks (False: each rank computes the same thing alone, on ``COMM_SELF`` or replicated, so the rank
        count cannot change it and the test suite's MPI pass skips it).
    """

    name: str
    section: str
    reference: str
    run: Callable[[bool], Outcome]
    budget_s: float = DEFAULT_BUDGET_S
    steps: int = DEFAULT_STEPS
    distributed: bool = True


#: The registered checks, in the order of the table.
CHECKS: dict[str, Check] = {}

#: What each check's measured value is (one kind per check, the ``kind`` column of the table): a fitted log-log
#: slope (an order or exponent, no unit), a fitted rate (per unit of training time s), a ratio of a quantity to
#: its bound (≤ 1 passes), a minimum density, or a difference/error in the units of the compared quantity.
KINDS: dict[str, str] = {
    "adjoint_taylor": "slope", "adjoint_gaussian_exact": "slope", "token_mass": "ratio to bound",
    "token_positivity": "min density", "gaussian_exact_d2": "slope", "fp_positivity": "min density",
    "fp_gibbs_steady_state": "ratio to bound", "mpi_consistency": "max difference", "shallow_yhat_exact": "slope",
    "splitting_order": "slope", "theta_transport_order": "slope", "deep_ntk_rate": "rate [1/s]",
    "ntk_degenerate_control": "|R_S − R_LS|", "ntk_gaussian_exact": "slope", "gaussian_exact_d1": "slope",
    "token_space_order": "slope", "stability_w1_data": "slope", "stability_w1_rho": "slope",
    "particle_agreement_n": "slope", "finite_heads_rate": "slope", "depth_order": "slope",
    "langevin_heads_rate": "slope", "shallow_exponential_rate": "rate [1/s]", "gibbs_fixed_point": "error",
    "free_energy_certificate": "ratio to bound", "fp_energy_decay": "slope", "depth_indexed_particles": "slope",
    "adjoint_taylor_interpolated": "slope", "offcentre_exact": "ratio to bound", "batched_gradient_d2": "slope",
    "risk_transport_order": "slope", "circle_growth_rates": "slope", "circle_mode_selection": "clusters",
    "circle_particles": "slope", "circle_mass_positivity": "ratio to bound",
    "circle_flow_map": "slope", "free_energy_exact": "rate [1/s]",
}


CheckFunction = Callable[[bool], Outcome]


def register(name: str, section: str, reference: str, budget_s: float = DEFAULT_BUDGET_S,
             steps: int = DEFAULT_STEPS, distributed: bool = True) -> Callable[[CheckFunction], CheckFunction]:
    """Decorator: register ``fn(quick) -> Outcome`` as the check ``name`` (budgets as in :class:`Check`)."""

    def deco(fn: CheckFunction) -> CheckFunction:
        CHECKS[name] = Check(name, section, reference, fn, budget_s, steps, distributed)
        return fn

    return deco
