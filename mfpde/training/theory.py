"""Convergence rates in a run report, each only where it means what it says (theory §5.4, §5.5, §6.2).

* :func:`theoretical_rate`: the rate a theorem guarantees, or None with the reason none applies:
  - single-layer model (ŷ linear in ρ, R convex, theory §2), entropic with λ, λ₂ > 0 (theory §5.4):
    ``value`` heads: δR/δρ = v D is linear in θ, every Gibbs measure p_ρ is Gaussian, α = λ₂/λ and the
    rate is exactly 2λ₂ (theory §6.2); other families: the Holley–Stroock lower bound
    2λ₂ exp(−osc δR/δρ / λ);
  - deep models with λ = λ₂ = 0 (theory §5.5): the local rate 2κ₀/n of R with κ₀ the smallest NTK
    eigenvalue (:func:`ntk_summary`, :func:`deep_rate`), when the NTK is not degenerate;
  - otherwise None: R is not convex in ρ for a deep model (theory §2), so §5.4 does not apply, and §5.5
    is stated for λ = λ₂ = 0 only.
* :func:`certified_fit`: the rate c of F(ρ_s) − F* ≈ C e^{−cs}, with F* known to within the certificate
  F(ρ) − F* ≤ λ KL(ρ ‖ p_ρ) of theory §5.4 (where it is a bound: :func:`mfpde.training.report.certificate_bound`):
  fitted only where the gap F − F(ρ_S) exceeds ten times the certificate at the end, against an F* inside the
  certificate's bracket [F(ρ_S) − λKL, F(ρ_S)] estimated from the tail (Aitken's Δ² on the last three rows,
  :func:`mfpde.fitting.tail_limit`; where the tail is no exponential, jointly with the rate on the window,
  :func:`mfpde.fitting.fit_rate_offset`): taking F* = F(ρ_S) made the rows near the end fall faster than the
  exponential and the rate come out high (2.250 for 2.238 on demos/shallow.toml; 3% to 19% on coarse rows).
* the least-squares fits themselves: :func:`mfpde.fitting.fit_rate`, :func:`mfpde.fitting.fit_rate_offset`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from mfpde.fitting import fit_rate_offset, tail_limit

__all__ = ["certified_fit", "deep_rate", "ntk_summary", "theoretical_rate"]

Array = npt.NDArray[np.float64]


def theoretical_rate(family: str, lam: float, lam2: float, oscillation: float, shallow: bool = True
                     ) -> tuple[float | None, str]:
    """The exponential rate of F(ρ_s) − F* that theory §5.4 guarantees, and what it is or why there is none.

    Args:
        family: the head family's name.
        lam: λ, the entropy weight.
        lam2: λ₂, the confinement weight.
        oscillation: osc δR/δρ = max − min over Θ (used for families other than ``value``).
        shallow: whether the model is the single residual layer (ŷ linear in ρ).

    Returns:
        (rate, kind) or (None, reason).
    """
    if not shallow:
        if lam == 0 and lam2 == 0:
            return None, "deep model, λ = λ₂ = 0: the local rate of theory §5.5 needs the NTK (see ntk)"
        return None, ("deep model: R is not convex in ρ (theory §2), so the exponential rate of theory §5.4 "
                      "does not apply; §5.5 is stated for λ = λ₂ = 0")
    if lam > 0 and lam2 > 0 and family == "value":
        return 2 * lam2, "2 λ₂: Gaussian Gibbs measures, α = λ₂/λ (theory §5.4, §6.2)"
    if lam > 0 and lam2 > 0:
        return 2 * lam2 * math.exp(-oscillation / lam), "lower bound 2 λ₂ exp(−osc δR/δρ / λ) (theory §5.4)"
    return None, "single-layer model without entropy (λ = 0) or confinement (λ₂ = 0): theory §5.4 needs both"


def ntk_summary(K: Array, n: int, horizon: float) -> dict[str, Any]:
    """The NTK spectrum and whether it is degenerate for the §5.5 rate over the run (theory §5.5, §6.2).

    R falls at least like exp(−2κ₀ s/n): an eigenvalue κ with 2κS/n < 1 (S the training horizon) gives
    a direction the run cannot fit, so the NTK counts as degenerate when the smallest one is below
    n/(2S). The numerical rank counts eigenvalues above n ε λ_max·10⁴ (eigvalsh's backward error times
    the round-off of the adjoint's Θ integrals, generously).

    Args:
        K: the Gram matrix, shape (n, n).
        n: number of training samples.
        horizon: S = steps · Δs.

    Returns:
        ``eigenvalues`` (ascending), ``min_eigenvalue``, ``max_eigenvalue``, ``numerical_rank``,
        ``fit_threshold`` n/(2S), ``degenerate``, and ``warning`` when degenerate.
    """
    ev = np.linalg.eigvalsh(K) if K.size else np.zeros(0)
    lmax = float(ev[-1]) if len(ev) else 0.0
    tol = n * np.finfo(float).eps * 1e4 * max(lmax, 0.0)
    thresh = n / (2 * horizon) if horizon > 0 else math.inf
    degenerate = bool(len(ev) == 0 or ev[0] < thresh)
    out: dict[str, Any] = {"eigenvalues": ev.tolist(), "min_eigenvalue": float(ev[0]) if len(ev) else None,
                           "max_eigenvalue": lmax, "numerical_rank": int((ev > tol).sum()),
                           "fit_threshold": thresh, "degenerate": degenerate}
    if degenerate:
        out["warning"] = (f"NTK degenerate: smallest eigenvalue {out['min_eigenvalue']:.3g} < n/(2S) = {thresh:.3g} "
                          f"(numerical rank {out['numerical_rank']} of {n}): the hypothesis K ⪰ κ₀ I of theory "
                          "§5.5 fails on this run's horizon")
    return out


def deep_rate(ntk: dict[str, Any], n: int) -> tuple[float | None, str]:
    """The local rate 2κ₀/n of R (theory §5.5, λ = λ₂ = 0) at the final ρ, or None with the reason."""
    if ntk["degenerate"]:
        return None, "theory §5.5 does not apply: " + ntk["warning"]
    return 2 * ntk["min_eigenvalue"] / n, "2 κ₀/n, κ₀ the smallest NTK eigenvalue at the final ρ (theory §5.5, local)"


def certified_fit(s: Array, F: Array, certificate_end: float, f_star: float | None = None
                  ) -> tuple[float | None, bool, str, float | None]:
    """Rate of F(ρ_s) − F* with F* bracketed by the certificate of theory §5.4 at the end of the run.

    F(ρ_S) − λ KL(ρ_S ‖ p_{ρ_S}) ≤ F* ≤ F(ρ_S), so on the window F − F(ρ_S) ≥ 10 λ KL(ρ_S ‖ p_{ρ_S})
    the gap F − F(ρ_S) is F − F* to within 10%. On that window log(F − F*) is fitted, F* the limit of the
    exponential through the last three rows (:func:`mfpde.fitting.tail_limit`) clipped into the bracket, or where
    those rows are no decaying exponential (round-off) F* fitted jointly with the rate in the bracket
    (:func:`mfpde.fitting.fit_rate_offset`); ``f_star`` known independently (an exact minimiser) is used instead,
    and then the window is the rows with F − F* above round-off.

    Args:
        s: training times, shape (m,).
        F: free energies, shape (m,).
        certificate_end: λ KL(ρ_S ‖ p_{ρ_S}) at the last row.
        f_star: F* where it is known, else None.

    Returns:
        (rate or None, converged, what F* is, the F* fitted against or None): converged when at least three rows
        lie in the window.
    """
    floor = 1e-14 * max(1.0, abs(F[-1]))
    if f_star is not None:
        win = F - f_star > 1e4 * floor
        ref = f"F* = {f_star:.12g}, known"
        if win.sum() < 3:
            return None, False, ref + "; fewer than three rows with F − F* above round-off", f_star
        return float(fit_rate_offset(s[win], F[win], f_star, f_star)[0]), True, ref, float(f_star)
    gap = F - F[-1]
    if not math.isfinite(certificate_end) or certificate_end < 0:
        return None, False, "no certificate", None
    win = gap >= 10 * certificate_end
    win &= gap > floor
    ref = f"F* = F(ρ_S) to within λ KL(ρ_S ‖ p_ρ_S) = {certificate_end:.3g} (certificate, theory §5.4)"
    if win.sum() < 3:
        return None, False, ref + "; fewer than three rows with F − F(ρ_S) ≥ 10 × that: not converged", None
    lo, hi = float(F[-1]) - certificate_end, float(F[-1])
    tail = tail_limit(s, F)
    if tail is None:
        rate, fstar = fit_rate_offset(s[win], F[win], lo, hi)
        how = "fitted jointly with the rate in that bracket"
    else:
        fstar = min(max(tail, lo), hi)
        rate = fit_rate_offset(s[win], F[win], fstar, fstar)[0]
        how = "estimated in that bracket by Aitken's Δ² on the last three rows"
    return float(rate), True, ref + f", {how}: F(ρ_S) − F* = {hi - fstar:.3g}", float(fstar)
