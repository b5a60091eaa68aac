"""Special functions of S^{d−1} for the independent spectral reference (:mod:`mfpde.verify.hypersphere_reference`).

Written from the definitions only (no code of the package is used), in logarithms so that large d is safe:
log |S^k|, log I_ν(β), the normalised Funk–Hecke eigenvalues λ_ℓ(β) = Γ(d/2)(2/β)^{d/2−1} I_{ℓ+d/2−1}(β),
K_c = τβ/λ_1(β), β*⁽ᵈ⁾ (the root of I_{d/2+1}/I_{d/2} = 1/d), the dimension N(d, ℓ) of the degree-ℓ harmonics and
the Gegenbauer polynomials normalised to P_ℓ(1) = 1 (scipy's).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.optimize
import scipy.special as sp

__all__ = ["beta_star", "gegenbauer", "harmonic_dimension", "k_c", "lam", "log_bessel_i", "log_sphere_area"]




def log_sphere_area(k: int) -> float:
    """Return log |S^k| = log(2 π^{(k+1)/2} / Γ((k+1)/2)), the log of the unnormalised area of the unit k-sphere.

    Args:
        k: dimension of the sphere (k >= 0; |S^0| = 2, |S^1| = 2π, |S^2| = 4π).

    Returns:
        The natural log of the area (dimensionless).
    """
    if k < 0:
        raise ValueError(f"sphere dimension must be >= 0, got {k}")
    return math.log(2.0) + 0.5 * (k + 1) * math.log(math.pi) - math.lgamma(0.5 * (k + 1))


def log_bessel_i(nu: float | np.ndarray, beta: float) -> np.ndarray:
    """Return log I_ν(β) for ν >= 0, β > 0, without underflow.

    Uses the exponentially scaled ``scipy.special.ive`` (log I = log ive + β) where it is representable, and
    the power series I_ν(β) = Σ_k (β/2)^{2k+ν} / (k! Γ(ν+k+1)) summed in logs where ive underflows (ν ≫ β).

    Args:
        nu: order(s) ν >= 0.
        beta: argument β > 0.

    Returns:
        Array of log I_ν(β) (same shape as ``nu``).
    """
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    nu = np.atleast_1d(np.asarray(nu, dtype=np.float64))
    scaled = sp.ive(nu, beta)
    out = np.empty_like(nu)
    good = scaled > 1e-280
    out[good] = np.log(scaled[good]) + beta
    if np.any(~good):
        k = np.arange(int(beta) + 80, dtype=np.float64)
        for i in np.flatnonzero(~good):
            terms = (2 * k + nu[i]) * math.log(beta / 2) - sp.gammaln(k + 1) - sp.gammaln(nu[i] + k + 1)
            out[i] = sp.logsumexp(terms)
    return out


def _log_lam(ell: np.ndarray, beta: float, d: int) -> np.ndarray:
    """Return log λ_ℓ(β) = log Γ(d/2) + (d/2 − 1) log(2/β) + log I_{ℓ+d/2−1}(β) (array over ℓ)."""
    h = 0.5 * d
    return sp.gammaln(h) + (h - 1.0) * math.log(2.0 / beta) + log_bessel_i(np.asarray(ell) + h - 1.0, beta)


def lam(l: int | np.ndarray, beta: float, d: int) -> float | np.ndarray:  # noqa: E741
    """Funk–Hecke eigenvalue λ_ℓ(β) of e^{β x·y} on S^{d-1} w.r.t. the normalised measure ν = σ/|S^{d-1}|.

    ∫ e^{β x·y} P_ℓ(y·e) dσ(y) = |S^{d-1}| λ_ℓ(β) P_ℓ(x·e), λ_ℓ(β) = Γ(d/2) (2/β)^{d/2−1} I_{ℓ+d/2−1}(β)
    (d = 2: I_ℓ(β); d = 3: the modified spherical Bessel function i_ℓ(β)). Computed in logs (no underflow of
    I_ν for ν ≫ β).

    Args:
        l: degree ℓ >= 0 (int or integer array).
        beta: inverse temperature β > 0.
        d: ambient dimension (the sphere is S^{d-1}), d >= 2.

    Returns:
        λ_ℓ(β) (float for scalar ℓ, array otherwise; dimensionless).
    """
    _check_d(d)
    scalar = np.ndim(l) == 0
    out = np.exp(_log_lam(np.atleast_1d(np.asarray(l, dtype=np.float64)), beta, d))
    return float(out[0]) if scalar else out


def k_c(beta: float, tau: float, d: int) -> float:
    """Critical coupling K_c = τβ/λ_1(β) at which the uniform state μ_0 = 1/|S^{d-1}| loses stability.

    Args:
        beta: inverse temperature β > 0.
        tau: noise level τ > 0.
        d: ambient dimension, d >= 2.

    Returns:
        K_c (same units as K).
    """
    return float(tau * beta / lam(1, beta, d))


def beta_star(d: int) -> float:
    """β*(d): the root of I_{d/2+1}(β)/I_{d/2}(β) = 1/d, above which the bifurcation from uniform is subcritical.

    Solved by brentq on the ratio of exponentially scaled Bessel functions (ive), to xtol 1e-15.
    Values: d = 2: 2.446918..., d = 3: 1.816155..., d = 4: 1.575257..., d = 64: 1.031494....

    Args:
        d: ambient dimension, d >= 2.

    Returns:
        β* (dimensionless inverse temperature).
    """
    _check_d(d)
    h = 0.5 * d

    def f(b: float) -> float:
        return math.exp(log_bessel_i(h + 1.0, b)[0] - log_bessel_i(h, b)[0]) - 1.0 / d

    return float(scipy.optimize.brentq(f, 1e-3, max(100.0, 10.0 * d), xtol=1e-15, rtol=4 * np.finfo(float).eps))


def harmonic_dimension(l: int | np.ndarray, d: int) -> np.ndarray:  # noqa: E741
    """N(d, ℓ): dimension of the space of degree-ℓ spherical harmonics on S^{d-1} (as float64, via logs).

    N(d, 0) = 1; N(d, ℓ) = (2ℓ+d−2)/(ℓ+d−2) · C(ℓ+d−2, ℓ) for ℓ >= 1 (d = 2: 2; d = 3: 2ℓ+1). Equivalently
    ∫ P_ℓ² dν = 1/N(d, ℓ) for the normalised Gegenbauer P_ℓ(1) = 1.

    Args:
        l: degree(s) ℓ >= 0.
        d: ambient dimension, d >= 2.

    Returns:
        Array of N(d, ℓ).
    """
    return np.exp(_log_harmonic_dimension(np.atleast_1d(np.asarray(l, dtype=np.float64)), d))


def _log_harmonic_dimension(ell: np.ndarray, d: int) -> np.ndarray:
    out = np.zeros_like(ell, dtype=np.float64)
    pos = ell >= 1
    e = ell[pos]
    out[pos] = np.log(2 * e + d - 2) - np.log(e + d - 2) + sp.gammaln(e + d - 1) - sp.gammaln(e + 1) - sp.gammaln(d - 1)
    return out


def gegenbauer(L: int, z: np.ndarray, d: int) -> np.ndarray:
    """P_0..P_L at points z: Gegenbauer C_ℓ^{(d−2)/2} normalised to P_ℓ(1) = 1 (Chebyshev T_ℓ for d = 2).

    Three-term recurrence (ℓ + d − 2) P_{ℓ+1} = (2ℓ + d − 2) z P_ℓ − ℓ P_{ℓ−1}, P_0 = 1, P_1 = z; |P_ℓ| <= 1 on
    [−1, 1], so nothing overflows for large d.

    Args:
        L: highest degree.
        z: points in [−1, 1] (1-D array).
        d: ambient dimension, d >= 2.

    Returns:
        Array of shape (len(z), L + 1), column ℓ = P_ℓ(z).
    """
    z = np.asarray(z, dtype=np.float64)
    P = np.empty((z.size, L + 1))
    P[:, 0] = 1.0
    if L >= 1:
        P[:, 1] = z
    for ell in range(1, L):
        P[:, ell + 1] = ((2 * ell + d - 2) * z * P[:, ell] - ell * P[:, ell - 1]) / (ell + d - 2)
    return P


def _check_d(d: int) -> None:
    if int(d) != d or d < 2:
        raise ValueError(f"dimension d must be an integer >= 2, got {d}")
