"""Chebyshev series at the sources s = a_k x_i by the affine substitution of x (d = 1, issue 12).

In d = 1 every head and every point enter the attention kernels through s = a_k x_i (theory §1.3 (F)). On an
interval [lo, hi] holding the sources, the Chebyshev variable t = (2s − lo − hi)/(hi − lo) is, for each head,
affine in x̂ = (x − x_c)/x_r ∈ [−1, 1]: t = λ_k x̂ + β_k with |λ_k| + |β_k| ≤ 1. So T_m(t) is a polynomial of
degree m in x̂, T_m(λ_k x̂ + β_k) = Σ_j C_kmj T_j(x̂), and with V the Chebyshev–Vandermonde matrix of x̂

    Σ_i w_ki T_m(t_ki) = Σ_j C_kmj (w V)_kj        (moments: the VJP's, :mod:`mfpde.tokens.box.chebyshev`),
    Σ_m c_m T_m(t_ki) = Σ_j (c C)_kj V_ij          (values: the forward's interpolant at every source),

two matrix products each, O(N_a (N_x + n) n), instead of n passes of the three-term recurrence (or of
Clenshaw's) over the N_a N_x sources. The rows C_k come from the same recurrence in the Chebyshev basis of x̂
(x̂ T_j = (T_{j+1} + T_{|j−1|})/2), whose coefficients stay bounded since |λ_k| + |β_k| ≤ 1; they and V are
cached (the heads, the points and the interval are those of every stage of a solve). Non-dimensional.
"""

from __future__ import annotations

import functools

import numpy as np
import numpy.typing as npt

__all__ = ["substituted_moments", "substituted_values"]

Array = npt.NDArray[np.float64]


@functools.lru_cache(maxsize=8)
def _substitution(a: bytes, lo: float, hi: float, xc: float, xr: float, n: int) -> Array:
    """C with T_m(λ_k x̂ + β_k) = Σ_j C[m, (k, j)] T_j(x̂), shape (n + 1, N_a (n + 1)); a as bytes (cache key)."""
    av = np.frombuffer(a, dtype=np.float64)
    lam, beta = 2.0 * av * xr / (hi - lo), (2.0 * av * xc - lo - hi) / (hi - lo)
    K, w = len(av), n + 2  # one zero column beyond degree n: x̂ p stays inside
    C = np.zeros((K, n + 1, w))
    C[:, 0, 0] = 1.0
    C[:, 1, 0], C[:, 1, 1] = beta, lam
    xp = np.zeros((K, w))
    for m in range(1, n):  # T_{m+1}(y) = 2 y T_m(y) − T_{m−1}(y), y = λ x̂ + β, in coefficients of x̂
        p = C[:, m]
        xp[:, 0] = 0.5 * p[:, 1]
        xp[:, 1] = p[:, 0] + 0.5 * p[:, 2]
        xp[:, 2 : w - 1] = 0.5 * (p[:, 1 : w - 2] + p[:, 3:w])
        xp[:, w - 1] = 0.5 * p[:, w - 2]
        C[:, m + 1] = 2.0 * (lam[:, None] * xp + beta[:, None] * p) - C[:, m - 1]
    return np.ascontiguousarray(C[:, :, : n + 1].transpose(1, 0, 2).reshape(n + 1, -1))


@functools.lru_cache(maxsize=8)
def _vandermonde(x: bytes, xc: float, xr: float, n: int) -> Array:
    """The Chebyshev–Vandermonde matrix of x̂ = (x − x_c)/x_r, shape (N_x, n + 1); x as bytes (cache key)."""
    return np.asarray(np.polynomial.chebyshev.chebvander(np.clip((np.frombuffer(x) - xc) / xr, -1.0, 1.0), n),
                      dtype=np.float64)


def _frame(a: Array, xs: Array, lo: float, hi: float, n: int) -> tuple[Array, Array] | None:
    """(C, V) for these heads, points, interval and degree; None where x has one point (no x̂) or n < 2."""
    xmin, xmax = float(xs.min()), float(xs.max())
    if xmax - xmin < 1e-12 * max(1.0, abs(xmax)) or n < 2 or not hi > lo:
        return None
    xc, xr = 0.5 * (xmax + xmin), 0.5 * (xmax - xmin)
    V = _vandermonde(np.ascontiguousarray(xs, dtype=np.float64).tobytes(), xc, xr, n)
    return _substitution(np.ascontiguousarray(a, dtype=np.float64).tobytes(), lo, hi, xc, xr, n), V


def substituted_moments(a: Array, xs: Array, weights: Array, lo: float, hi: float, n: int) -> Array | None:
    """Σ_{k,i} weights[r, k, i] T_m(t(a_k x_i)) for m = 0..n, shape (n + 1, R) (None: see :func:`_frame`).

    Args:
        a: the heads' scalars, shape (N_a,).
        xs: the points, shape (N_x,).
        weights: shape (R, N_a, N_x).
        lo: the lower end of the interval of s (holding every a_k x_i).
        hi: its upper end.
        n: the degree.
    """
    f = _frame(a, xs, lo, hi, n)
    if f is None:
        return None
    C, V = f
    return C @ (weights @ V).reshape(len(weights), -1).T


def substituted_values(a: Array, xs: Array, coef: Array, lo: float, hi: float) -> Array | None:
    """Σ_m coef_m T_m(t(a_k x_i)), shape (N_a, N_x) (None: see :func:`_frame`); coef of shape (n + 1,)."""
    n = len(coef) - 1
    f = _frame(a, xs, lo, hi, n)
    if f is None:
        return None
    C, V = f
    return (coef @ C).reshape(len(a), n + 1) @ V.T
