"""Convergence rates: the one fitted from a run and the one the theorems guarantee (theory §5.4, §6.2).

* :func:`fit_rate`: c in F(ρ_s) − F* ≈ C e^{−cs}, by least squares on the decaying part.
* :func:`theoretical_rate`: for entropic training with λ, λ₂ > 0,
  - ``value`` heads: δR/δρ = v D is linear in θ, so every Gibbs measure p_ρ is Gaussian with
    α = λ₂/λ and the rate is exactly 2λ₂ (theory §5.4, §6.2);
  - other families: the Holley–Stroock perturbation of the Bakry–Émery bound,
    c ≥ 2λ₂ exp(−osc δR/δρ / λ) (theory §5.4), tiny (vacuous) for small λ;
  - otherwise no rate is guaranteed (None).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

__all__ = ["fit_rate", "theoretical_rate"]


def fit_rate(s: npt.NDArray[np.float64], gap: npt.NDArray[np.float64]) -> float:
    """Exponential rate c of gap(s) ≈ C e^{−c s}, by least squares on log gap over its decaying part.

    Args:
        s: training times, shape (m,).
        gap: F(ρ_s) − F*, shape (m,).

    Returns:
        c, or NaN when fewer than three values exceed max(1e-3 gap[0], 1e-14).
    """
    ok = gap > max(1e-3 * gap[0], 1e-14) if len(gap) else gap
    if ok.sum() < 3:
        return math.nan
    return float(-np.polyfit(s[ok], np.log(gap[ok]), 1)[0])


def theoretical_rate(family: str, lam: float, lam2: float, oscillation: float) -> tuple[float | None, str | None]:
    """The exponential rate of F(ρ_s) − F* that theory §5.4 guarantees, and what it is.

    Args:
        family: the head family's name.
        lam: λ, the entropy weight.
        lam2: λ₂, the confinement weight.
        oscillation: osc δR/δρ = max − min over Θ (used for families other than ``value``).

    Returns:
        (rate, kind): the rate and a one-line description, or (None, None) when no rate is guaranteed.
    """
    if lam > 0 and lam2 > 0 and family == "value":
        return 2 * lam2, "2 λ₂: Gaussian Gibbs measures, α = λ₂/λ (theory §5.4)"
    if lam > 0 and lam2 > 0:
        return 2 * lam2 * math.exp(-oscillation / lam), "lower bound 2 λ₂ exp(−osc δR/δρ / λ) (theory §5.4)"
    return None, None
