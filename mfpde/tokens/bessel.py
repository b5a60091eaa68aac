"""Modified Bessel functions I_k(x) of integer and half-integer order, without scipy (its import costs start-up).

Miller's backward recurrence (Abramowitz & Stegun 9.6.26, 10.2.18): I_{ν−1}(x) = I_{ν+1}(x) + (2ν/x) I_ν(x) run
downwards from an order far beyond the largest wanted, where I_ν(x) is negligible against I_{ν−1}(x), gives the
ratios I_ν/I_{ν₀} to the precision of the arithmetic (the recurrence is stable downwards); they are normalised by
the lowest order's closed form: I_0 (numpy's ``i0``) for integer orders, i_0(x) = sinh(x)/x for the modified
spherical Bessel functions i_ℓ(x) = √(π/2x) I_{ℓ+½}(x). Agrees with scipy.special.iv and spherical_in to a few
units of the last place (tests/tokens/circle/test_spectral.py).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

__all__ = ["iv_orders", "spherical_in_orders"]

Array = npt.NDArray[np.float64]
#: A partial result above this is scaled down (with everything computed so far) to keep the recurrence finite.
_BIG = 1e250


def _start(order: int, x: float) -> int:
    """The order from which the recurrence starts: beyond ``order`` and beyond x by many widths √x."""
    return int(order + 30 + x + 12 * math.sqrt(x + 1.0))


def _ratios(order: int, x: Array, half: bool) -> Array:
    """I_{k+s}(x)/I_s(x) for k = 0..order (s = ½ if ``half`` else 0), shape (order+1, *x.shape); x > 0."""
    s = 0.5 if half else 0.0
    if x.ndim == 0:  # one argument: the recurrence in Python floats (numpy's per-element overhead is 100×)
        return _ratios_scalar(order, float(x), s)
    out = np.zeros((order + 1, *x.shape))
    hi = np.zeros_like(x)
    cur = np.full_like(x, 1e-300)
    for nu in range(_start(order, float(np.max(x))), 0, -1):
        lower = hi + (2 * (nu + s) / x) * cur  # I_{nu−1+s}
        hi, cur = cur, lower
        if nu - 1 <= order:
            out[nu - 1] = cur
        big = cur > _BIG
        if np.any(big):
            scale = np.where(big, 1.0 / _BIG, 1.0)
            hi, cur, out = hi * scale, cur * scale, out * scale
    return out / out[0]


def _ratios_scalar(order: int, x: float, s: float) -> Array:
    """:func:`_ratios` of one argument x > 0."""
    out = [0.0] * (order + 1)
    hi, cur = 0.0, 1e-300
    for nu in range(_start(order, x), 0, -1):
        hi, cur = cur, hi + (2 * (nu + s) / x) * cur  # I_{nu−1+s}
        if nu - 1 <= order:
            out[nu - 1] = cur
        if cur > _BIG:
            hi, cur = hi / _BIG, cur / _BIG
            out = [v / _BIG for v in out]
    return np.array(out) / out[0]


def iv_orders(order: int, x: float | Array) -> Array:
    """I_k(x) for k = 0..order (x > 0, finite up to x ≈ 700), shape (order+1, *shape of x)."""
    xa = np.asarray(x, dtype=float)
    return _ratios(order, xa, half=False) * np.i0(xa)


def spherical_in_orders(order: int, x: float) -> Array:
    """i_ℓ(x) = √(π/2x) I_{ℓ+½}(x) for ℓ = 0..order (x > 0), shape (order+1,); i_0(x) = sinh(x)/x."""
    xa = np.asarray(x, dtype=float)
    # I_{ℓ+½} by the recurrence from order ½; i_ℓ/i_0 = I_{ℓ+½}/I_{½}
    return _ratios(order, xa, half=True) * (math.sinh(float(x)) / float(x))
