"""The truncation of the Funk–Hecke series of K∗μ on S² (theory §9): the Bessel tail and the degree it sets.

(K∗μ)(x) = Σ_ℓm 4π i_ℓ(β) μ̂_ℓm Y_ℓm(x); cut at degree L it errs by at most ‖μ‖ Σ_{ℓ>L} (2ℓ+1) i_ℓ(β)
(the addition theorem, |P_ℓ| ≤ 1), and Σ_ℓ (2ℓ+1) i_ℓ(β) = e^β bounds the sum of the terms' sizes.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import scipy.special

__all__ = ["DEFAULT_TOL", "EPS", "degree_power", "harmonic_degree", "harmonic_tail"]

Array = npt.NDArray[np.float64]

#: machine epsilon of doubles, 2⁻⁵²
EPS = 2.0**-52
#: the default bound on the Bessel tail of the potential, relative to ‖μ‖ e^β (:func:`harmonic_degree`)
DEFAULT_TOL = 1e-14


def harmonic_tail(beta: float, L: int, derivative: bool = False) -> float:
    """The Bessel tail e^{−β} Σ_{ℓ>L} (2ℓ+1) i_ℓ(β): the truncation error of K∗μ at degree L per unit mass.

    Relative to e^β; with ``derivative`` each term × ℓ(ℓ+1)/2 (the bound of |∇_S P_ℓ(x·y)|): the error of
    ∇_S K∗μ. Uses ``scipy.special.ive`` (no overflow at any β).
    """
    ll = np.arange(L + 1, L + 60 + int(4 * beta))
    t = (2 * ll + 1) * np.sqrt(np.pi / (2 * beta)) * scipy.special.ive(ll + 0.5, beta)
    if derivative:
        t = t * ll * (ll + 1) / 2
    return float(t.sum())


def harmonic_degree(beta: float, tol: float = DEFAULT_TOL) -> int:
    """The least L with Σ_{ℓ>L} (2ℓ+1) i_ℓ(β) ≤ tol e^β (theory §9: L ≈ 20, 25, 32 at β = 5, 9, 16, tol 1e-12).

    Raises:
        ValueError: β ≤ 0 or tol outside (0, 1).
    """
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if not 0 < tol < 1:
        raise ValueError(f"tol must be in (0, 1), got {tol}")
    L = 0
    while harmonic_tail(beta, L) > tol:
        L += 1
    return L


def degree_power(coefficients: Array) -> Array:
    """Σ_m μ̂_ℓm² for ℓ = 0..L from coefficients of shape ((L+1)²,): shape (L+1,)."""
    L = math.isqrt(len(coefficients)) - 1
    return np.add.reduceat(np.asarray(coefficients) ** 2, np.arange(L + 1) ** 2)


