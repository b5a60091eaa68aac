"""The one home of the fits that verify, the tests and the benchmarks use: orders, rates, their error bars.

* :func:`fit_order`: the least-squares slope of log err against log x (the order of a scheme in h, Δs, 1/N,
  or a Taylor-test slope), as scikit-fem's convergence tests fit it;
* :func:`fit_rate`: the exponential rate c of y(s) ≈ C e^{−cs} by least squares on log y (theory §5.4, §5.5);
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

__all__ = ["PowerLaw", "fit_order", "fit_power", "fit_rate", "richardson_bound", "slope_se", "slope_tolerance"]

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
