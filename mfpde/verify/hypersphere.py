"""Noisy tokens on S^{d−1} (theory §11): the hypersphere's stationary states against an independent spectral solve.

The references share no code with :mod:`mfpde.tokens.hypersphere`: the special functions of
:mod:`mfpde.verify.hypersphere_special` (scipy's Gegenbauer polynomials, Bessel functions in logarithms) and the
fixed-point solve of :mod:`mfpde.verify.hypersphere_reference` (Gegenbauer moments as unknowns, parameterised by
the amplitude ∫ μ z dσ, so it passes the fold; scipy's Gauss–Jacobi rule; the free energy by quadrature).

* ``hypersphere_threshold``: the branch point the continuation locates on the uniform branch against
  K_c = τβ/λ_1(β) for d from 2 to 128 (quick: 2 to 64), to 1e-8 (Illinois to 1e-13 in the arclength; the
  Gauss rule of the normalised measure is exact for the uniform state's perturbations, polynomials in z).
* ``hypersphere_tricritical``: β*⁽ᵈ⁾ as the root in β of the measured curvature c₂ = dK/d(a²) of the bifurcating
  branch (Newton probes at amplitudes ρ, 2ρ and Richardson, error O(ρ⁴) ≈ 1e-8) against the root of
  I_{d/2+1}/I_{d/2} = 1/d, to 1e-6 relative.
* ``hypersphere_maxwell``: the fold K_f and the Maxwell point K_M of the continuation against the reference, to
  1e-8 relative (both converge to ≈ 1e-12), with d = 2 and d = 3 also against the circle's and the sphere's own
  stationary problems (other codes: collocation in θ, Gauss–Legendre with the I_0 kernel).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import scipy.optimize

from mfpde.verify.registry import Outcome, register

__all__ = ["continued", "curvature_at"]

BUDGET_S = {True: 60.0, False: 240.0}
#: (d, β, the collocation points) of the Maxwell cases: β above β*⁽ᵈ⁾, τ = 1.
MAXWELL_CASES = {True: ((2, 3.0, 48), (3, 2.5, 48), (16, 2.0, 96)),
                 False: ((2, 3.0, 48), (3, 2.5, 48), (4, 2.0, 64), (16, 2.0, 96), (64, 1.2, 96), (128, 2.5, 128))}
TRICRITICAL_DIMS = {True: (2, 4, 16), False: (2, 3, 4, 5, 6, 8, 16, 32, 64, 128)}
THRESHOLD_DIMS = {True: (2, 5, 64), False: (2, 3, 4, 8, 16, 32, 64, 128)}
K_TOL, BETA_TOL = 1e-8, 1e-6


def continued(P: Any, lo: float, hi: float, step: float) -> dict[str, Any]:
    """The branches of :func:`mfpde.bifurcation.noisy_branches` in K ∈ [lo, hi] (scipy eigenvalues)."""
    from mfpde.bifurcation import noisy_branches
    from mfpde.continuation import StepControl

    return noisy_branches(P, lo, hi, StepControl(step, 1e-9, 100 * step, lo, hi, 600), eig_solver="scipy")


def curvature_at(beta: float, d: int, points: int = 32) -> float:
    """c₂ = dK/d(a²) of the degree-1 branch at its branch point K_c, by the continuation's probes (τ = 1)."""
    from mfpde.bifurcation import curvature
    from mfpde.continuation import Newton
    from mfpde.tokens.hypersphere.stationary import HypersphereStationary

    P = HypersphereStationary(points, beta, 1.0, d, rule="gauss")  # exact for the uniform state's polynomials
    x = np.concatenate([P.uniform(), [P.threshold(1)]])
    direction = np.concatenate([P.mode_state(1), [0.0]])
    with Newton(P, P.m) as newton:
        return curvature(P, newton, x, direction, 1)


@register("hypersphere_threshold", "§11 K_c on S^{d−1}", "τβ/λ_1(β) by scipy's Bessel functions (logarithms)",
          kind="relative error", budget_s=BUDGET_S[False], distributed=False)
def check_hypersphere_threshold(quick: bool) -> Outcome:
    """The located branch point of degree 1 within 1e-8 of τβ/λ_1(β), d = 2 … 128."""
    from mfpde.tokens.hypersphere.stationary import HypersphereStationary
    from mfpde.verify.hypersphere_special import k_c

    worst, rows = 0.0, list[str]()
    for d in THRESHOLD_DIMS[quick]:
        beta = 1.5
        kc = k_c(beta, 1.0, d)
        P = HypersphereStationary(32, beta, 1.0, d, rule="gauss")  # exact for the uniform state's polynomials
        res = continued(P, 0.9 * kc, 1.1 * kc, 0.02 * kc)
        found = [e["parameter"] for e in res["bifurcations"] if e["mode"] == 1 and "curvature" in e]
        err = abs(found[0] - kc) / kc if len(found) == 1 else math.inf
        worst = max(worst, err)
        rows.append(f"d = {d}: {err:.1e}")
    return Outcome(worst, 0.0, f"≤ {K_TOL:g}", worst <= K_TOL, "; ".join(rows) + " (β = 1.5, τ = 1)",
                   tolerance=K_TOL)


@register("hypersphere_tricritical", "§11 β*⁽ᵈ⁾, where the transition turns first order",
          "the root of I_{d/2+1}(β)/I_{d/2}(β) = 1/d (scipy)", kind="relative error", budget_s=BUDGET_S[False],
          distributed=False)
def check_hypersphere_tricritical(quick: bool) -> Outcome:
    """β*⁽ᵈ⁾ as the root of the continuation's measured curvature c₂(β), within 1e-6 of the Bessel-ratio root."""
    from mfpde.verify.hypersphere_special import beta_star

    deadline = time.process_time() + BUDGET_S[quick]
    worst, rows = 0.0, list[str]()
    for d in TRICRITICAL_DIMS[quick]:
        if time.process_time() > deadline:
            return Outcome(math.inf, 0.0, f"≤ {BETA_TOL:g}", False, f"CPU budget exhausted at d = {d}: "
                           + "; ".join(rows))
        root = scipy.optimize.brentq(lambda b, d=d: curvature_at(b, d), 0.9, 3.0, xtol=1e-12)
        ref = beta_star(d)
        err = abs(root - ref) / ref
        worst = max(worst, err)
        rows.append(f"d = {d}: {root:.7f} ({err:.1e})")
    return Outcome(worst, 0.0, f"≤ {BETA_TOL:g}", worst <= BETA_TOL, "; ".join(rows), tolerance=BETA_TOL)


@register("hypersphere_maxwell", "§11 fold and Maxwell point (first-order transition)",
          "a spectral fixed-point solve in the Gegenbauer moments, parameterised by the amplitude",
          kind="relative error", budget_s=BUDGET_S[False], distributed=False)
def check_hypersphere_maxwell(quick: bool) -> Outcome:
    """K_f and K_M of the continuation within 1e-8 of the reference; d = 2, 3 also against the circle and sphere."""
    from mfpde.tokens.circle.stationary import CircleStationary
    from mfpde.tokens.hypersphere.stationary import HypersphereStationary
    from mfpde.tokens.sphere.stationary import SphereStationary
    from mfpde.verify.hypersphere_reference import fold_maxwell_point

    deadline = time.process_time() + BUDGET_S[quick]
    worst, rows = 0.0, list[str]()
    for d, beta, n in MAXWELL_CASES[quick]:
        if time.process_time() > deadline:
            return Outcome(math.inf, 0.0, f"≤ {K_TOL:g}", False, "CPU budget exhausted: " + "; ".join(rows))
        ref = fold_maxwell_point(beta, 1.0, d, 80 if d < 64 else 160)  # its clustered states need n ≈ d at large d
        lo, hi = ref.K_f - 0.3 * (ref.K_c - ref.K_f), ref.K_c + 0.1 * (ref.K_c - ref.K_f)
        step = 0.05 * (hi - lo)
        got = _fold_maxwell(continued(HypersphereStationary(n, beta, 1.0, d), lo, hi, step))
        errs = [abs(got[0] - ref.K_f) / ref.K_f, abs(got[1] - ref.K_M) / ref.K_M]
        if d in (2, 3):  # the circle's and the sphere's own stationary problems
            other = CircleStationary(2 * n + 1, beta, 1.0) if d == 2 else SphereStationary(n, beta, 1.0)
            mine = _fold_maxwell(continued(other, lo, hi, step))
            errs += [abs(mine[0] - got[0]) / got[0], abs(mine[1] - got[1]) / got[1]]
        errs = [e if math.isfinite(e) else math.inf for e in errs]  # not found: NaN, which max() would pass over
        worst = max(worst, *errs)
        rows.append(f"d = {d}, β = {beta:g}: K_f = {got[0]:.10f}, K_M = {got[1]:.10f} ({max(errs):.1e})")
    return Outcome(worst, 0.0, f"≤ {K_TOL:g}", worst <= K_TOL, "; ".join(rows), tolerance=K_TOL)


def _fold_maxwell(res: dict[str, Any]) -> tuple[float, float]:
    """(K_f, K_M) of degree 1's branch in a continuation's result (NaN where not found)."""
    ev = res["bifurcations"]
    fold = next((e["parameter"] for e in ev if e["kind"] == "fold" and e["mode"] == 1), math.nan)
    km = next((e["parameter"] for e in ev if e["kind"] == "maxwell" and e.get("found") and e["mode"] == 1), math.nan)
    return float(fold), float(km)
