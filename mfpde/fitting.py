"""The one home of the fits that verify, the tests and the benchmarks use: orders, rates, their error bars.

* :func:`fit_order`: the least-squares slope of log err against log x (the order of a scheme in h, Δs, 1/N,
  or a Taylor-test slope), as scikit-fem's convergence tests fit it;
* :func:`fit_rate`: the exponential rate c of y(s) ≈ C e^{−cs} by least squares on log y (theory §5.4, §5.5);
* :func:`fit_rate_offset`: the rate c and the limit y* of y(s) ≈ y* + C e^{−cs}, y* bracketed (F − F* with F*
  known only to within a certificate: taking y* = y(S), the last value, biases c high, by 10% and more);
  :func:`tail_limit`: y* of the exponential through the last three values (Aitken's Δ², any spacing);
* :func:`slope_tolerance`, :func:`slope_se`: how far bounded or random errors in the values move a fitted slope,
  so a threshold on a slope is derived, not read off a run;
* :func:`fit_power`: the law y ≈ C x^q with the standard errors of q and log C from the residuals, and the x
  where the law reaches a target (an extrapolation: the law is only measured inside the fitted range);
* :func:`richardson_bound`: the error of the finest value of a refinement from the last two (Richardson).

Pure numpy; non-dimensional.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["PowerLaw", "fit_order", "fit_power", "fit_rate", "fit_rate_offset", "richardson_bound", "slope_se",
           "slope_tolerance", "tail_limit"]

Array = npt.NDArray[np.float64]
Values = Array | list[float] | list[int]


def fit_order(x: Values, err: Values) -> float:
    """The least-squares slope of log err against log x (``np.polyfit``), shapes (m,), m ≥ 2.

    Raises:
        ValueError: fewer than two points, or a non-positive x or err (no logarithm).
    """
    xs, es = np.asarray(x, float), np.asarray(err, float)
    if len(xs) < 2 or len(xs) != len(es) or not (np.all(xs > 0) and np.all(es > 0)):
        raise ValueError(f"fit_order needs m >= 2 positive pairs, got x={xs.tolist()} err={es.tolist()}")
    return float(np.polyfit(np.log(xs), np.log(es), 1)[0])


@dataclass(frozen=True)
class PowerLaw:
    """y ≈ C x^q fitted by least squares on logs; ``se_q``, ``se_logc``: standard errors from the residuals.

    ``xi_mean`` is the mean log x of the fitted points (where the law is best known).

    With m points the residual variance has m − 2 degrees of freedom (0 for m = 2: the errors are then nan).
    """

    q: float
    log_c: float
    se_q: float
    se_logc: float
    xi_mean: float

    def __call__(self, x: float) -> float:
        """C x^q."""
        return math.exp(self.log_c + self.q * math.log(x))

    def solve(self, y: float) -> tuple[float, float]:
        """(x with C x^q = y, its relative standard error): an extrapolation outside the fitted range.

        log x = (log y − log C)/q; the error propagates from q only (the leading term far from the data, where
        |log x − mean log x_i| is large): σ(log x) ≈ |log x − ξ̄| σ_q/|q|, ξ̄ the mean log of the fitted x.
        """
        lx = (math.log(y) - self.log_c) / self.q
        return math.exp(lx), abs(lx - self.xi_mean) * self.se_q / abs(self.q)


def fit_power(x: Values, y: Values) -> PowerLaw:
    """The power law y ≈ C x^q by least squares on (log x, log y), shapes (m,), m ≥ 2, x, y > 0.

    Raises:
        ValueError: as :func:`fit_order`.
    """
    q = fit_order(x, y)
    xi, eta = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
    log_c = float(eta.mean() - q * xi.mean())
    m = len(xi)
    sxx = float(((xi - xi.mean()) ** 2).sum())
    s2 = float(((eta - log_c - q * xi) ** 2).sum() / (m - 2)) if m > 2 else math.nan
    se_q = math.sqrt(s2 / sxx)
    se_c = math.sqrt(s2 * (1.0 / m + xi.mean() ** 2 / sxx))
    return PowerLaw(q, log_c, se_q, se_c, float(xi.mean()))


def fit_rate(s: Values, y: Values) -> float:
    """The exponential rate c of y(s) ≈ C e^{−c s} by least squares on log y, shapes (m,), m ≥ 2, y > 0.

    The caller chooses the window (the decaying part above the floor); units: 1/[s].

    Raises:
        ValueError: fewer than two points, or a non-positive y.
    """
    ss, ys = np.asarray(s, float), np.asarray(y, float)
    if len(ss) < 2 or len(ss) != len(ys) or not np.all(ys > 0):
        raise ValueError(f"fit_rate needs m >= 2 pairs with y > 0, got {len(ss)} points")
    return float(-np.polyfit(ss, np.log(ys), 1)[0])


def fit_rate_offset(s: Values, y: Values, lo: float, hi: float) -> tuple[float, float]:
    """(c, y*) of y(s) ≈ y* + C e^{−cs} with y* in [lo, hi], shapes (m,), m ≥ 3: three parameters jointly.

    For each y* the least-squares line of log(y − y*) against s gives C and c in closed form; y* minimises that
    line's residual sum of squares (the profile, by bounded Brent, scipy.optimize.minimize_scalar, to 1e-13 of the
    bracket's width) over [lo, min(hi, min y − 1e-15 (1 + |min y|))]. For an exact y* + C e^{−cs} the profile is 0
    at the true y*, so c is exact up to the search's tolerance, where y* = hi = y(S) (the last value) made the
    rows near the end fall faster than e^{−cs} (log(e^{−cs} − e^{−cS})). ``lo == hi``: y* is known, log(y − y*)
    is fitted alone (:func:`fit_rate`). Units: c in 1/[s], y* in [y].

    Raises:
        ValueError: fewer than three points, lo > hi, or (y* known) a y ≤ y*.
    """
    import scipy.optimize

    ss, ys = np.asarray(s, float), np.asarray(y, float)
    if len(ss) < 3 or len(ss) != len(ys) or not lo <= hi:
        raise ValueError(f"fit_rate_offset needs m >= 3 pairs and lo <= hi, got {len(ss)} points, [{lo}, {hi}]")
    if lo == hi:
        return fit_rate(ss, ys - lo), float(lo)
    top = min(hi, float(ys.min()) - 1e-15 * (1.0 + abs(float(ys.min()))))
    if top <= lo:
        return fit_rate(ss, ys - lo), float(lo)

    def misfit(ystar: float) -> float:
        z = np.log(ys - ystar)
        coef = np.polyfit(ss, z, 1)
        return float(((z - np.polyval(coef, ss)) ** 2).sum())

    res = scipy.optimize.minimize_scalar(misfit, bounds=(lo, top), method="bounded",
                                         options={"xatol": 1e-13 * (top - lo) + 1e-300})
    ystar = min((float(res.x), lo, top), key=misfit)  # the bracket's ends too (a monotone profile)
    return fit_rate(ss, ys - ystar), ystar


def tail_limit(s: Values, y: Values) -> float | None:
    """The limit y* of the exponential y* + C e^{−cs}, c > 0, through the last three points (Aitken's Δ²).

    With a = s₁ − s₀, b = s₂ − s₁ the ratio q = (y₂ − y₁)/(y₁ − y₀) = (1 − e^{−cb})/(e^{ca} − 1) falls from b/a
    (c → 0) to 0 (c → ∞), so c is the root of that equation (brentq; equal spacing: q = e^{−ca}, Aitken's Δ²
    y* = y₂ − (y₂ − y₁)²/(y₂ − 2y₁ + y₀)) and y* = y₂ − (y₂ − y₁)/(1 − e^{cb}). None where the three points are not
    such an exponential (q outside (0, b/a), e.g. round-off at a converged tail). Units: [y].
    """
    import scipy.optimize

    ss, ys = np.asarray(s, float)[-3:], np.asarray(y, float)[-3:]
    if len(ss) < 3 or not np.all(np.isfinite(ys)):
        return None
    a, b = float(ss[1] - ss[0]), float(ss[2] - ss[1])
    d0, d1 = float(ys[1] - ys[0]), float(ys[2] - ys[1])
    if a <= 0 or b <= 0 or d0 == 0:
        return None
    q = d1 / d0
    if not 0 < q < b / a * (1 - 1e-12):
        return None

    def ratio(c: float) -> float:
        return -math.expm1(-c * b) / math.expm1(c * a) - q

    hi = 1.0 / a
    while ratio(hi) > 0:
        hi *= 2
        if hi * min(a, b) > 700:
            return None
    c = scipy.optimize.brentq(ratio, 1e-300, hi, xtol=1e-300, rtol=4 * np.finfo(float).eps)
    return float(ys[2] + d1 / math.expm1(c * b))


def _slope_weights(x: Values) -> Array:
    """w_i = (ξ_i − ξ̄)/Σ(ξ_j − ξ̄)², ξ = log x: the least-squares slope of log err is Σ w_i log err_i."""
    xi = np.log(np.asarray(x, float))
    return (xi - xi.mean()) / ((xi - xi.mean()) ** 2).sum()


def richardson_bound(fine: Values, coarse: Values, order_min: float) -> Array:
    """|v_h − v| ≤ |v_2h − v_h|/(2^p − 1) for a quantity v_h − v = K h^p + o(h^p) of order p ≥ ``order_min``.

    (Richardson; h may be any step refined by 2 between ``coarse`` and ``fine``, e.g. 1/N.) An error common
    to both does not enter it.
    """
    return np.abs(np.asarray(coarse, float) - np.asarray(fine, float)) / (2**order_min - 1)


def slope_tolerance(x: Values, values: Values, bounds: Values) -> float:
    """Bound on how far errors |v_i − v*_i| ≤ bounds_i move the log-log slope of ``values`` against x.

    With v_i = v*_i(1 + ε_i) the least-squares slope is q = q* + Σ w_i log(1 + ε_i) (:func:`_slope_weights`),
    and |ε_i| ≤ E_i/(1 − E_i) with E_i = bounds_i/|v_i|, so |q − q*| ≤ Σ|w_i| · max_i −log(1 − E_i).
    """
    E = float(np.max(np.asarray(bounds, float) / np.abs(np.asarray(values, float))))
    return float(np.abs(_slope_weights(x)).sum() * -np.log1p(-E)) if E < 1 else float("inf")


def slope_se(x: Values, values: Values, se: Values) -> float:
    """Standard error of the log-log slope of independent Monte-Carlo means ``values`` with standard errors ``se``.

    log v_i has standard error ≈ se_i/v_i (delta method), so the slope Σ w_i log v_i has
    (Σ w_i² (se_i/v_i)²)^{1/2}.
    """
    rel = np.asarray(se, float) / np.asarray(values, float)
    return float(np.sqrt(np.sum((_slope_weights(x) * rel) ** 2)))
