"""Checks of the continuation of noisy tokens on the circle and the sphere (theory §10), against closed forms.

Each check measures in both discretisations of the stationary states (the spectral default of
``continuation.discretisation``, then the collocation: :func:`mfpde.verify.continuation_checks.problem`), with
the continuation's own Newton solver, the same cases and thresholds: the spectral one's K_c is τβ/I_1(β) with the
kernel's exact eigenvalues (to round-off), and its c₂ carries the same probes' truncation and Newton tolerance.

* ``noisy_threshold``: the first branch point of the uniform branch, located by the continuation (the sign change
  of det ∂F/∂u along the branch, refined by the Illinois iteration with Newton corrections; the exact Jacobian),
  against K_c = τβ/I_1(β) (scipy.special.iv) at several β and τ: relative error ≤ 1e-8. The collocation of the
  stationary equation is spectral (the kernel e^{β cos} is entire), so its discrete K_c differs from the exact one
  by the trapezoidal rule's error ≈ I_N(β), far below 1e-8 at N ≥ 41 for β ≤ 8; what remains is the location's
  tolerance (|Δs| ≤ 1e-13 of the step) and round-off, ≈ 1e-15.
* ``noisy_tricritical``: β*, where the bifurcation from the uniform state switches from supercritical to
  subcritical: the root in β of the measured curvature c₂(β) = dK/d(a²) of the bifurcating branch at its branch
  point (:func:`~mfpde.bifurcation.curvature`: two Newton solves at amplitudes ρ, 2ρ, ρ = 10⁻², Richardson),
  by scipy.optimize.brentq, against the root of I₂(β)/I₁(β) = 1/2 (brentq on scipy.special.iv). Threshold,
  derived: c₂'s error is the Richardson remainder O(ρ⁴) ≈ 10⁻⁸ plus the Newton tolerance over ρ², 10⁻¹²/10⁻⁴ =
  10⁻⁸: δc₂ ≤ 10⁻⁷ with a factor 5 to spare; β*'s error is δc₂/|dc₂/dβ|, with the slope measured at the root
  (≈ 0.1 at τ = 1): the threshold is 10⁻⁷/|dc₂/dβ| (≈ 10⁻⁶).
* ``noisy_threshold_sphere``, ``noisy_tricritical_sphere``: the same on S² for the zonal states
  (:class:`~mfpde.tokens.sphere.stationary.SphereStationary`, Gauss–Legendre in cos ϑ, exact in the azimuth),
  against K_c = τβ/i_1(β) (scipy.special.spherical_in) and the root of I_{5/2}(β)/I_{3/2}(β) = 1/3 (brentq on
  scipy.special.iv), with the same thresholds and the same derivation: the collocation's error in K_c is the
  Gauss rule's on an entire integrand (below 1e-14 at n ≥ 24 for β ≤ 8), and the amplitude a = ∫ μ x_3 dσ has the
  circle's scale (|a| ≤ 1), so the probes' errors in c₂ are the circle's.
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
    from mfpde.bifurcation import Stationary

__all__ = ["beta_star_closed_form", "closed_threshold", "measured_beta_star", "measured_threshold"]

#: CPU budgets (full; quick: half).
BUDGET_S = 300.0
#: The scan's step over the closed form's K_c: no point of the scan lands on it (the location is the continuation's).
STEP = 0.0437
#: The bound on the error of the measured curvature c₂ (module docstring).
C2_ERROR = 1e-7


def _problem(domain: str, beta: float, tau: float, points: int, discretisation: str = "spectral") -> Stationary:
    from mfpde.verify.continuation_checks import problem

    return problem(domain, points, beta, tau, discretisation)


def closed_threshold(domain: str, beta: float, tau: float) -> float:
    """τβ/I_1(β) (circle), τβ/i_1(β) (sphere), from scipy.special."""
    if domain == "sphere":
        return tau * beta / float(scipy.special.spherical_in(1, beta))
    return tau * beta / float(scipy.special.iv(1, beta))


def _first_branch_point(beta: float, tau: float, points: int, deadline: float = math.inf, domain: str = "circle",
                        disc: str = "spectral") -> tuple[float, Stationary, np.ndarray, np.ndarray]:
    """(K of the first branch point of the uniform branch, the problem, its state x, the branch direction)."""
    from mfpde.continuation import StepControl, branch_direction, continue_branch
    from mfpde.continuation_newton import newton_solver

    P = _problem(domain, beta, tau, points, disc)
    guess = closed_threshold(domain, beta, tau)  # only the range of the scan
    lo, hi = 0.8 * guess, 1.1 * guess
    W = P.inner_weights()
    t0 = np.zeros(P.m + 1)
    t0[-1] = 1.0
    with newton_solver(P) as nw:
        br = continue_branch(P, nw, np.concatenate([P.uniform(), [lo]]), t0, W,
                             StepControl(STEP * guess, 1e-9, STEP * guess, lo, hi, 100), None, deadline)
    bps = [e for e in br.events if e.kind == "branch_point"]
    if not bps:
        raise ArithmeticError(f"no branch point on the uniform branch in [{lo:.6g}, {hi:.6g}] at β = {beta:g}")
    ev = bps[0]
    x = np.concatenate([ev.u, [ev.K]])
    return ev.K, P, x, branch_direction(P, x, ev.tangent, W)


def measured_threshold(beta: float, tau: float, points: int, domain: str = "circle", disc: str = "spectral") -> float:
    """K_c measured by the continuation (the first branch point of the uniform branch) in the discretisation."""
    return _first_branch_point(beta, tau, points, domain=domain, disc=disc)[0]


def _c2(beta: float, tau: float, points: int, domain: str = "circle", disc: str = "spectral") -> float:
    from mfpde.bifurcation import amplitude_row, curvature
    from mfpde.continuation_newton import newton_solver

    _, P, x, d = _first_branch_point(beta, tau, points, domain=domain, disc=disc)
    if amplitude_row(P, 1) @ d < 0:
        d = -d
    with newton_solver(P) as nw:
        return curvature(P, nw, x, d, 1)


#: The bracket of β* of the measured c₂(β) by domain.
BRACKET = {"circle": (1.5, 3.5), "sphere": (1.2, 2.6)}


def measured_beta_star(tau: float, points: int, domain: str = "circle", disc: str = "spectral") -> tuple[float, float]:
    """(β* as the root of the measured c₂(β) in BRACKET by brentq, |dc₂/dβ| at it by a central difference)."""
    lo, hi = BRACKET[domain]
    root = float(scipy.optimize.brentq(lambda b: _c2(b, tau, points, domain, disc), lo, hi, xtol=1e-12, rtol=1e-13))
    h = 1e-3
    slope = (_c2(root + h, tau, points, domain, disc) - _c2(root - h, tau, points, domain, disc)) / (2 * h)
    return root, abs(slope)


def beta_star_closed_form(domain: str = "circle") -> float:
    """The root of I_{d/2+1}(β)/I_{d/2}(β) = 1/d on S^{d−1}: I₂/I₁ = 1/2 (circle), I_{5/2}/I_{3/2} = 1/3 (sphere)."""
    nu, d = (1.5, 3) if domain == "sphere" else (1.0, 2)
    return float(scipy.optimize.brentq(lambda b: scipy.special.iv(nu + 1, b) / scipy.special.iv(nu, b) - 1 / d, 0.5,
                                       10.0, xtol=1e-15, rtol=4 * np.finfo(float).eps))


def _threshold_outcome(quick: bool, domain: str) -> Outcome:
    """Max relative |K_c(measured) − closed form| over β, τ and both discretisations ≤ 1e-8."""
    from mfpde.verify.continuation_checks import DISCRETISATIONS, worst_line

    c0 = time.process_time()
    cases = [(1.0, 1.0), (4.0, 0.5)] if quick else [(0.5, 1.0), (1.0, 1.0), (2.0, 0.3), (4.0, 1.0), (8.0, 0.5)]
    points = POINTS[domain][quick]
    errs, lines = [], []
    per = dict.fromkeys(DISCRETISATIONS, 0.0)
    for disc in DISCRETISATIONS:
        for beta, tau in cases:
            kc = closed_threshold(domain, beta, tau)
            try:
                k = measured_threshold(beta, tau, points, domain, disc)
            except ArithmeticError as e:
                return Outcome(math.nan, 0.0, "≤ 1e-8", False, f"{disc}: {e}")
            errs.append(abs(k - kc) / kc)
            per[disc] = max(per[disc], errs[-1])
            lines.append(f"{disc} β={beta:g} τ={tau:g}: K_c {k:.15g} vs {kc:.15g} (rel {errs[-1]:.1e})")
    worst = max(errs)
    return Outcome(worst, 0.0, "≤ 1e-8", worst <= 1e-8 and time.process_time() - c0 < BUDGET_S,
                   f"N = {points}; {worst_line(per)}; " + "; ".join(lines), [], 1e-8)


def _tricritical_outcome(quick: bool, domain: str) -> Outcome:
    """|β*(measured) − β*(closed form)| ≤ C2_ERROR/|dc₂/dβ| and c₂'s sign on either side, in both discretisations.

    The value reported is the β* farther from the closed form (over its bound).
    """
    from mfpde.verify.continuation_checks import DISCRETISATIONS

    points = POINTS[domain][quick]
    ref = beta_star_closed_form(domain)
    lo, hi = SIDES[domain]
    ok, worst, worst_bs, worst_tol, lines = True, -1.0, math.nan, math.nan, []
    for disc in DISCRETISATIONS:
        try:
            bs, slope = measured_beta_star(1.0, points, domain, disc)
            below, above = _c2(lo, 1.0, points, domain, disc), _c2(hi, 1.0, points, domain, disc)
        except (ArithmeticError, ValueError) as e:
            return Outcome(math.nan, ref, "bracket", False, f"{disc}: no root of c₂(β) in {BRACKET[domain]}: {e}")
        tol = C2_ERROR / max(slope, 1e-12)
        ok &= abs(bs - ref) <= tol and below > 0 > above
        if abs(bs - ref) / tol > worst:
            worst, worst_bs, worst_tol = abs(bs - ref) / tol, bs, tol
        lines.append(f"{disc}: β* {bs:.12f} vs {ref:.12f} (error {abs(bs - ref):.1e} ≤ {tol:.1e}, |dc₂/dβ| = "
                     f"{slope:.3g}); c₂({lo:g}) = {below:.6g}, c₂({hi:g}) = {above:.6g}")
    return Outcome(worst_bs, ref, f"≤ {worst_tol:.1e} (δc₂ ≤ {C2_ERROR:g} over |dc₂/dβ|); c₂({lo:g}) > 0 > "
                   f"c₂({hi:g})", ok, f"N = {points}; " + "; ".join(lines), [], worst_tol)


#: Collocation points by domain, (full, quick).
POINTS = {"circle": (63, 41), "sphere": (40, 24)}
#: β on either side of β*, where c₂ must be positive and negative.
SIDES = {"circle": (2.0, 3.0), "sphere": (1.5, 2.2)}


@register("noisy_threshold", "§10 (K_c of noisy tokens)", "K_c = τβ/I_1(β), scipy.special.iv", kind="rel. error",
          budget_s=BUDGET_S, distributed=False)
def check_noisy_threshold(quick: bool) -> Outcome:
    """Max relative |K_c(measured) − τβ/I_1(β)| over β, τ ≤ 1e-8."""
    return _threshold_outcome(quick, "circle")


@register("noisy_tricritical", "§10 (β*, continuous vs discontinuous)", "root of I₂/I₁ = 1/2 (brentq, scipy)",
          kind="β*", budget_s=BUDGET_S, distributed=False)
def check_noisy_tricritical(quick: bool) -> Outcome:
    """β* on the circle (:func:`_tricritical_outcome`)."""
    return _tricritical_outcome(quick, "circle")


@register("noisy_threshold_sphere", "§10 (K_c of noisy tokens on S²)", "K_c = τβ/i_1(β), scipy.special.spherical_in",
          kind="rel. error", budget_s=BUDGET_S, distributed=False)
def check_noisy_threshold_sphere(quick: bool) -> Outcome:
    """Max relative |K_c(measured) − τβ/i_1(β)| over β, τ ≤ 1e-8 (zonal states on S²)."""
    return _threshold_outcome(quick, "sphere")


@register("noisy_tricritical_sphere", "§10 (β* on S², continuous vs discontinuous)",
          "root of I_{5/2}/I_{3/2} = 1/3 (brentq, scipy)", kind="β*", budget_s=BUDGET_S, distributed=False)
def check_noisy_tricritical_sphere(quick: bool) -> Outcome:
    """β* on S² (:func:`_tricritical_outcome`)."""
    return _tricritical_outcome(quick, "sphere")
