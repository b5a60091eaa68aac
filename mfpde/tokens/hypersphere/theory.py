"""Linear theory of attention on S^{d−1} for any d ≥ 2 (theory §11), in logarithms so that d = 4096 does not underflow.

Funk–Hecke: ∫ e^{β x·y} P_ℓ(y·e) dσ(y) = |S^{d−1}| λ_ℓ(β) P_ℓ(x·e), P_ℓ the Gegenbauer polynomial C_ℓ^{(d−2)/2}
normalised to P_ℓ(1) = 1 (the Jacobi polynomial P_ℓ^{(α,α)}/P_ℓ^{(α,α)}(1), α = (d − 3)/2; d = 2: T_ℓ), with the
normalised eigenvalues

    λ_ℓ(β) = Γ(d/2) (2/β)^{d/2−1} I_{ℓ+d/2−1}(β)     (d = 2: I_ℓ(β), the circle's; d = 3: i_ℓ(β), the sphere's).

About the uniform state 1/|S^{d−1}|: noise-free, degree ℓ grows at γ_ℓ = ℓ(ℓ+d−2) λ_ℓ(β)/β (unnormalised
attention, USA), ÷ λ_0(β) (softmax, SA); with noise τ and coupling K (one head (β, K), USA) at
K ℓ(ℓ+d−2) λ_ℓ(β)/β − τ ℓ(ℓ+d−2), so the uniform state loses stability at K_c = τβ/λ_1(β). The bifurcation is
continuous below β*⁽ᵈ⁾, the root of I_{d/2+1}(β)/I_{d/2}(β) = 1/d, and discontinuous above it (Mun–Rosenzweig).

The Bessel functions are taken as ive (scaled by e^{−β}) and, where ive underflows (order ≫ β), by the
logarithm of the leading term of their series with the ratio ₀F₁ (scipy's hyp0f1), exact in both regimes.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import scipy.optimize
import scipy.special

__all__ = ["ATTENTIONS", "beta_star", "critical_coupling", "fastest_degree", "growth_rate", "log_bessel_i",
           "log_eigenvalue", "eigenvalue", "sphere_area"]

#: The attention variants: softmax (SA) and unnormalised (USA).
ATTENTIONS = ("softmax", "unnormalised")


def sphere_area(k: int) -> float:
    """|S^k| = 2π^{(k+1)/2}/Γ((k+1)/2), the surface of the unit sphere in R^{k+1} (|S^0| = 2, |S^1| = 2π)."""
    return float(2.0 * math.exp((k + 1) / 2 * math.log(math.pi) - math.lgamma((k + 1) / 2)))


def log_bessel_i(nu: npt.ArrayLike, x: float) -> npt.NDArray[np.float64]:
    """Log I_ν(x), x > 0, ν ≥ −1/2 (shape of ``nu``), without under- or overflow.

    I_ν(x) = (x/2)^ν/Γ(ν+1) · ₀F₁(; ν+1; x²/4): the series form where it is finite (order ≳ x, where ive
    underflows), log ive(ν, x) + x elsewhere.
    """
    nu = np.asarray(nu, dtype=float)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        a = np.log(scipy.special.ive(nu, x)) + x
        b = nu * math.log(x / 2) - scipy.special.gammaln(nu + 1) + np.log(scipy.special.hyp0f1(nu + 1, x * x / 4))
    # ive is accurate while it is a normal number; the series' ₀F₁ is ≤ e^{x²/(4(ν+1))}, finite and accurate there
    return np.where(np.isfinite(a) & (scipy.special.ive(nu, x) > 1e-280), a, b)


def log_eigenvalue(l: npt.ArrayLike, beta: float, d: int) -> npt.NDArray[np.float64]:
    """Log λ_ℓ(β) = log Γ(d/2) + (d/2 − 1) log(2/β) + log I_{ℓ+d/2−1}(β) (shape of ``l``)."""
    ll = np.asarray(l, dtype=float)
    return math.lgamma(d / 2) + (d / 2 - 1) * math.log(2 / beta) + log_bessel_i(ll + d / 2 - 1, beta)


def eigenvalue(l: npt.ArrayLike, beta: float, d: int) -> npt.NDArray[np.float64]:
    """λ_ℓ(β) of S^{d−1} (module docstring; shape of ``l``); 0 where it underflows."""
    return np.exp(log_eigenvalue(l, beta, d))


def _check(beta: float, d: int, attention: str = "unnormalised") -> None:
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if not (isinstance(d, int | np.integer) and d >= 2):
        raise ValueError(f"d must be an integer >= 2, got {d}")


def growth_rate(l: npt.ArrayLike, beta: float, d: int, attention: str = "softmax") -> npt.NDArray[np.float64]:
    """γ_ℓ = ℓ(ℓ+d−2) λ_ℓ(β)/β (USA), ÷ λ_0(β) (SA): the noise-free growth rate of degree ℓ (shape of ``l``).

    Raises:
        ValueError: an unknown ``attention``, β ≤ 0 or d < 2.
    """
    _check(beta, d, attention)
    ll = np.asarray(l, dtype=float)
    log_g = log_eigenvalue(ll, beta, d) - math.log(beta)
    if attention == "softmax":
        log_g = log_g - log_eigenvalue(0, beta, d)
    return ll * (ll + d - 2) * np.exp(log_g)


def fastest_degree(beta: float, d: int, l_max: int = 400) -> int:
    """The degree ℓ ≥ 1 of largest γ_ℓ (SA and USA differ by a factor in β only)."""
    _check(beta, d)
    ll = np.arange(1, l_max + 1)
    return int(ll[np.argmax(growth_rate(ll, beta, d, "unnormalised"))])


def critical_coupling(beta: float, noise: float, d: int, l: int = 1) -> float:
    """K_ℓ = τβ/λ_ℓ(β): where degree ℓ of the uniform state turns unstable (ℓ = 1: K_c)."""
    _check(beta, d)
    return float(noise * beta * np.exp(-log_eigenvalue(l, beta, d)))


def beta_star(d: int) -> float:
    """β*⁽ᵈ⁾: the root of I_{d/2+1}(β)/I_{d/2}(β) = 1/d, where the bifurcation of noisy tokens turns first order.

    The ratio rises from 0 at β = 0 to 1 as β → ∞ (strictly: Amos 1974), so the root is unique; it lies in
    (0, 4] for every d ≥ 2 (≈ 1 + 2/d for large d). Solved by Brent's method on the ratio of scaled Bessel
    functions, to the double's last digits.
    """
    if not (isinstance(d, int | np.integer) and d >= 2):
        raise ValueError(f"d must be an integer >= 2, got {d}")

    def f(b: float) -> float:
        return float(np.exp(log_bessel_i(d / 2 + 1, b) - log_bessel_i(d / 2, b))) - 1.0 / d

    return float(scipy.optimize.brentq(f, 1e-3, 10.0, xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=200))
