"""Checks of the continuation of noisy tokens on the circle (theory §10), against closed forms it does not use.

* ``noisy_threshold``: the first branch point of the uniform branch, located by the continuation (the sign change
  of det ∂F/∂u along the branch, refined by the Illinois iteration with Newton corrections; the exact Jacobian),
  against K_c = τβ/I_1(β) (scipy.special.iv) at several β and τ: relative error ≤ 1e-8. The collocation of the
  stationary equation is spectral (the kernel e^{β cos} is entire), so its discrete K_c differs from the exact one
  by the trapezoidal rule's error ≈ I_N(β), far below 1e-8 at N ≥ 41 for β ≤ 8; what remains is the location's
  tolerance (|Δs| ≤ 1e-13 of the step) and round-off, ≈ 1e-15.
* ``noisy_tricritical``: β*, where the bifurcation from the uniform state switches from supercritical to
  subcritical: the root in β of the measured curvature c₂(β) = dK/d(a²) of the bifurcating branch at its branch
  point (:func:`~mfpde.continuation_job.curvature`: two Newton solves at amplitudes ρ, 2ρ, ρ = 10⁻², Richardson),
  by scipy.optimize.brentq, against the root of I₂(β)/I₁(β) = 1/2 (brentq on scipy.special.iv). Threshold,
  derived: c₂'s error is the Richardson remainder O(ρ⁴) ≈ 10⁻⁸ plus the Newton tolerance over ρ², 10⁻¹²/10⁻⁴ =
  10⁻⁸: δc₂ ≤ 10⁻⁷ with a factor 5 to spare; β*'s error is δc₂/|dc₂/dβ|, with the slope measured at the root
  (≈ 0.1 at τ = 1): the threshold is 10⁻⁷/|dc₂/dβ| (≈ 10⁻⁶).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import numpy as np
import scipy.optimize
import scipy.special

from mfpde.verify.registry import Outcome, register

if TYPE_CHECKING:
    from mfpde.tokens.circle.stationary import CircleStationary

__all__ = ["measured_beta_star", "measured_threshold"]

#: CPU budgets (full; quick: half).
BUDGET_S = 300.0
#: The scan's step over the closed form's K_c: no point of the scan lands on it (the location is the continuation's).
STEP = 0.0437
#: The bound on the error of the measured curvature c₂ (module docstring).
C2_ERROR = 1e-7


def _first_branch_point(beta: float, tau: float, points: int,
                        deadline: float = math.inf) -> tuple[float, CircleStationary, np.ndarray, np.ndarray]:
    """(K of the first branch point of the uniform branch, the problem, its state x, the branch direction)."""
    from mfpde.continuation import Newton, StepControl, branch_direction, continue_branch
    from mfpde.tokens.circle.stationary import CircleStationary as Problem

    P = Problem(points, beta, tau)
    guess = tau * beta / float(scipy.special.iv(1, beta))  # only the range of the scan
    lo, hi = 0.8 * guess, 1.1 * guess
    W = np.concatenate([np.full(P.m, (2 * math.pi) ** 2 / P.m), [1.0]])
    t0 = np.zeros(P.m + 1)
    t0[-1] = 1.0
    with Newton(P, P.m) as nw:
        br = continue_branch(P, nw, np.concatenate([P.uniform(), [lo]]), t0, W,
                             StepControl(STEP * guess, 1e-9, STEP * guess, lo, hi, 100), None, deadline)
    bps = [e for e in br.events if e.kind == "branch_point"]
    if not bps:
        raise ArithmeticError(f"no branch point on the uniform branch in [{lo:.6g}, {hi:.6g}] at β = {beta:g}")
    ev = bps[0]
    x = np.concatenate([ev.u, [ev.K]])
    return ev.K, P, x, branch_direction(P, x, ev.tangent, W)


def measured_threshold(beta: float, tau: float, points: int) -> float:
    """K_c measured by the continuation (the first branch point of the uniform branch)."""
    return _first_branch_point(beta, tau, points)[0]


def _c2(beta: float, tau: float, points: int) -> float:
    from mfpde.continuation import Newton
    from mfpde.continuation_job import _amplitude_row, curvature

    _, P, x, d = _first_branch_point(beta, tau, points)
    if _amplitude_row(P, 1) @ d < 0:
        d = -d
    with Newton(P, P.m) as nw:
        return curvature(P, nw, x, d, 1)


def measured_beta_star(tau: float, points: int) -> tuple[float, float]:
    """(β* as the root of the measured c₂(β) in [1.5, 3.5] by brentq, |dc₂/dβ| at it by a central difference)."""
    root = float(scipy.optimize.brentq(lambda b: _c2(b, tau, points), 1.5, 3.5, xtol=1e-12, rtol=1e-13))
    h = 1e-3
    slope = (_c2(root + h, tau, points) - _c2(root - h, tau, points)) / (2 * h)
    return root, abs(slope)


def beta_star_closed_form() -> float:
    """The root of I₂(β)/I₁(β) = 1/2 (scipy.special.iv, brentq)."""
    return float(scipy.optimize.brentq(lambda b: scipy.special.iv(2, b) / scipy.special.iv(1, b) - 0.5, 0.5, 10.0,
                                       xtol=1e-15, rtol=4 * np.finfo(float).eps))


@register("noisy_threshold", "§10 (K_c of noisy tokens)", "K_c = τβ/I_1(β), scipy.special.iv", kind="rel. error",
          budget_s=BUDGET_S, distributed=False)
def check_noisy_threshold(quick: bool) -> Outcome:
    """Max relative |K_c(measured) − τβ/I_1(β)| over β, τ ≤ 1e-8."""
    c0 = time.process_time()
    cases = [(1.0, 1.0), (4.0, 0.5)] if quick else [(0.5, 1.0), (1.0, 1.0), (2.0, 0.3), (4.0, 1.0), (8.0, 0.5)]
    points = 41 if quick else 63
    errs, lines = [], []
    for beta, tau in cases:
        kc = tau * beta / float(scipy.special.iv(1, beta))
        try:
            k = measured_threshold(beta, tau, points)
        except ArithmeticError as e:
            return Outcome(math.nan, 0.0, "≤ 1e-8", False, str(e))
        errs.append(abs(k - kc) / kc)
        lines.append(f"β={beta:g} τ={tau:g}: K_c {k:.15g} vs {kc:.15g} (rel {errs[-1]:.1e})")
    worst = max(errs)
    return Outcome(worst, 0.0, "≤ 1e-8", worst <= 1e-8 and time.process_time() - c0 < BUDGET_S,
                   f"N = {points}; " + "; ".join(lines), [], 1e-8)


@register("noisy_tricritical", "§10 (β*, continuous vs discontinuous)", "root of I₂/I₁ = 1/2 (brentq, scipy)",
          kind="β*", budget_s=BUDGET_S, distributed=False)
def check_noisy_tricritical(quick: bool) -> Outcome:
    """|β*(measured) − β*(closed form)| ≤ C2_ERROR/|dc₂/dβ| (module docstring); the sign of c₂ on either side."""
    points = 41 if quick else 63
    ref = beta_star_closed_form()
    try:
        bs, slope = measured_beta_star(1.0, points)
        below, above = _c2(2.0, 1.0, points), _c2(3.0, 1.0, points)
    except (ArithmeticError, ValueError) as e:
        return Outcome(math.nan, ref, "bracket", False, f"no root of c₂(β) in [1.5, 3.5]: {e}")
    tol = C2_ERROR / max(slope, 1e-12)
    ok = abs(bs - ref) <= tol and below > 0 > above
    return Outcome(bs, ref, f"≤ {tol:.1e} (δc₂ ≤ {C2_ERROR:g} over |dc₂/dβ| = {slope:.3g}); c₂(2) > 0 > c₂(3)", ok,
                   f"N = {points}: β* {bs:.12f} vs {ref:.12f} (error {abs(bs - ref):.1e}); c₂(2) = {below:.6g}, "
                   f"c₂(3) = {above:.6g}", [], tol)
