"""The circle's measures as quantile maps (theory §9): the data's quantile labels and the CDF reconstructed from them.

A probability measure μ on the circle is the push-forward of the uniform measure on [0, 1) by its quantile map
X(v) (μ([X(0), X(v))) = v); its CDF is the inverse of X. :mod:`mfpde.tokens.circle.flow` transports X at M labels
v_j = (j + ½)/M; this module makes the labels of the data (:func:`modes_labels`, :func:`noise_labels`) and turns labels
back into a CDF at the angles 2πj/CDF_POINTS:

* :func:`cdf_from_map`: spectral, from X and ∂_vX at the labels (a trigonometric Hermite interpolant of 2M
  frequencies, :func:`hermite_map`), while the labels resolve the map;
* :func:`cdf_local_hermite`: a monotone piecewise-cubic Hermite map with the exact derivatives (fourth order, local);
* :func:`cdf_linear`: the labels' own measure, linear between them (second order; needs no derivative);
* :func:`cluster_masses`: the masses of the groups of labels that clusters are made of.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["CDF_POINTS", "HERMITE_TAIL", "Labels", "cdf_from_map", "cdf_linear", "cdf_local_hermite", "cluster_masses",
           "hermite_map", "modes_cdf", "modes_density", "modes_labels", "noise_labels"]

Array = npt.NDArray[np.float64]
CArray = npt.NDArray[np.complex128]
#: The angles θ_j = 2πj/CDF_POINTS at which the CDF of μ_t is reported.
CDF_POINTS = 1024
#: The spectral tail of the Hermite interpolant above which the map counts as unresolved (measured: 1e-2 where
#: M = 32 labels give W1 1e-4 at the side-by-side problem, 2e-2 and more where collapsing clusters make it oscillate).
HERMITE_TAIL = 1.5e-2


def modes_density(modes: list[list[float]]) -> Callable[[Array], Array]:
    """μ_0(θ) = (1/2π)(1 + Σ a cos(k(θ − φ))) for ``modes`` = [[k, a, φ], ...]."""
    def f(t: Array) -> Array:
        return np.asarray((1.0 + sum((a * np.cos(k * (t - ph)) for k, a, ph in modes), np.zeros_like(t)))
                          / (2 * math.pi), dtype=float)
    return f


def modes_cdf(modes: list[list[float]]) -> Callable[[Array], Array]:
    """F_0(θ) = ∫_0^θ μ_0 = (θ + Σ (a/k)(sin(k(θ − φ)) + sin(kφ)))/2π."""
    def F(t: Array) -> Array:
        return np.asarray((t + sum(((a / k) * (np.sin(k * (t - ph)) + np.sin(k * ph)) for k, a, ph in modes),
                                   np.zeros_like(t))) / (2 * math.pi), dtype=float)
    return F


@dataclass(frozen=True)
class Labels:
    """M labels of μ_0 at its quantiles v_j = (j + ½)/M, each of mass 1/M.

    Attributes:
        X0: positions F_0^{-1}(v_j) (M,), increasing in [0, 2π).
        L0: log ∂_vX_0(v_j) = −log μ_0(X0_j) (M,).
        smooth: μ_0 analytic (the map may be interpolated spectrally); False for cell-wise data.
    """

    X0: Array
    L0: Array
    smooth: bool

    @property
    def M(self) -> int:
        """The number of labels."""
        return len(self.X0)


def modes_labels(modes: list[list[float]], M: int) -> Labels:
    """The quantile labels of ``circle_modes`` data: Newton on the closed-form F_0 from the uniform guess.

    Raises:
        ValueError: M < 2, or Newton not converged to round-off in 60 iterations (a density near 0).
    """
    if M < 2:
        raise ValueError(f"need M >= 2 labels, got {M}")
    k, a, ph = (np.array([m[i] for m in modes], float) for i in range(3))
    v = (np.arange(M) + 0.5) / M
    target = 2 * math.pi * v - np.sum((a / k) * np.sin(k * ph))  # 2π F_0(x) = x + Σ (a/k) sin(k(x − φ)) + const
    x, ak, kph, tol = 2 * math.pi * v, a / k, k * ph, 8 * math.pi * float(np.finfo(float).eps)
    for _ in range(60):  # Newton on 2πF_0(x) = 2πv, the modes as one (M, modes) array
        arg = np.outer(x, k)
        arg -= kph
        dx = np.sin(arg) @ ak
        dx += x - target
        dx /= 1.0 + np.cos(arg) @ a  # 2π μ_0(x)
        x = x - dx
        if float(np.max(np.abs(dx))) <= tol:
            break
    else:
        raise ValueError("the quantiles of data.modes did not converge (a density too close to 0)")
    arg = np.outer(x, k)
    arg -= kph
    return Labels(x, -np.log((1.0 + np.cos(arg) @ a) / (2 * math.pi)),  # −log μ_0(x)
                  smooth=True)


def noise_labels(cells: Array, M: int) -> Labels:
    """The quantile labels of a density constant on each of n equal cells (values ``cells`` (n,), mass 1).

    The CDF is piecewise linear, so its inverse is exact: the label v lies in the first cell whose cumulative mass
    exceeds v, at the linear position inside it.
    """
    n = len(cells)
    h = 2 * math.pi / n
    mass = np.asarray(cells, float) * h
    cum = np.concatenate([[0.0], np.cumsum(mass)])
    v = (np.arange(M) + 0.5) / M * cum[-1]
    j = np.clip(np.searchsorted(cum, v, side="right") - 1, 0, n - 1)
    x = (j + (v - cum[j]) / mass[j]) * h
    return Labels(x, -np.log(np.asarray(cells, float)[j] / cum[-1]), smooth=False)


def _hermite_coefficients(X: Array, D: Array) -> tuple[CArray, CArray, float]:
    """(c_k (k = 0..M−1), c_{k−M}, the spectral tail) of the trigonometric Hermite interpolant (:func:`hermite_map`)."""
    M = len(X)
    v = (np.arange(M) + 0.5) / M
    P = np.fft.fft(X - 2 * math.pi * v) / M
    Q = np.fft.fft(D - 2 * math.pi) / M
    k = np.arange(M)
    ck = (Q / (2j * math.pi) - (k - M) * P) / M  # frequency k
    cm = P - ck  # frequency k − M
    a, b = np.abs(ck), np.abs(cm)
    total = float(a.sum() + b.sum())
    tail = float(a[M // 2 :].sum() + b[: M - M // 2 + 1].sum()) / total if total > 0 else 0.0
    return ck, cm, tail


def _hermite_grid(ck: CArray, cm: CArray, U: int) -> tuple[Array, Array]:
    """The map and its derivative at v = (i + ½·U/M)/U (U,) from the coefficients of :func:`_hermite_coefficients`."""
    M = len(ck)
    # p is real, so c_{−f} = conj(c_f) (f = 1..M−1) and one real inverse FFT of the frequencies 0..M suffices; the
    # unpaired −M term enters as conj(c_{−M})/2 at +M
    Z = np.zeros(U // 2 + 1, complex)
    Z[:M] = ck * U
    Z[M] = np.conj(cm[0]) * (U / 2)
    Zd = np.zeros_like(Z)
    Zd[: M + 1] = Z[: M + 1] * (2j * math.pi * np.arange(M + 1))
    p = np.fft.irfft(Z, U)
    p += _ramp(U)
    p += math.pi / M
    dp = np.fft.irfft(Zd, U)
    dp += 2 * math.pi
    return p, dp


@functools.lru_cache(maxsize=8)
def _ramp(U: int) -> Array:
    """2πi/U, i = 0..U−1 (read-only): the linear part of the map on the grid of U points."""
    r = 2 * math.pi * np.arange(U) / U
    r.flags.writeable = False
    return r


def hermite_map(X: Array, D: Array, U: int) -> tuple[Array, Array, float]:
    """The quantile map and its derivative at v = (i + ½·U/M)/U, i = 0..U−1, from X and ∂_vX at the M labels.

    The periodic part p(v) = X(v) − 2πv is the trigonometric polynomial of the 2M frequencies −M..M−1 that matches
    p and p' at the M labels (a 2 × 2 solve per aliased pair of frequencies), evaluated by one inverse FFT of size
    U ≥ 2M. Returns shapes (U,), (U,) and the tail Σ_{|k| ≥ M/2}|c_k| / Σ_k |c_k| (how much of the interpolant lives
    in the upper half of its frequencies: small while the labels resolve the map).
    """
    ck, cm, tail = _hermite_coefficients(X, D)
    return (*_hermite_grid(ck, cm, U), tail)


def _invert(Xf: Array, Xd: Array, v0: float, theta: Array) -> Array:
    """V with X(v) ≡ θ (mod 2π) from the map on a uniform grid (U,) starting at v0 (cubic Hermite, Newton)."""
    U = len(Xf)
    h = 1.0 / U
    Xf = np.concatenate([Xf, Xf[:1] + 2 * math.pi])
    Xd = np.concatenate([Xd, Xd[:1]]) * h
    x0 = Xf[0]
    lifted = theta - x0
    turns = np.floor(lifted / (2 * math.pi))  # θ − 2π·turns lies in [x0, x0 + 2π)
    lifted -= 2 * math.pi * turns
    lifted += x0
    i = np.searchsorted(Xf, lifted, side="right")
    i -= 1
    np.minimum(i, U - 1, out=i)  # lifted < x0 + 2π, up to its rounding
    xa, xb, da, db = Xf[i], Xf[i + 1], Xd[i], Xd[i + 1]
    y, dx = lifted - xa, xb - xa  # the cubic on the cell, x(s) − xa = ((c3 s + c2) s + da) s, s ∈ [0, 1]
    c2, c3 = 3 * dx - 2 * da - db, da + db - 2 * dx
    c2d, c3d = 2 * c2, 3 * c3
    s = np.minimum(np.maximum(y / np.where(dx > 0, dx, 1.0), 0.0), 1.0)
    for _ in range(8):  # from the chord's root: Newton on the cubic converges quadratically (2–3 on a fine grid)
        val = c3 * s
        val += c2
        val *= s
        val += da
        val *= s
        val -= y
        der = c3d * s
        der += c2d
        der *= s
        der += da
        val /= np.maximum(der, 1e-300)  # ≥ 0 on a monotone cell: a flat end takes the clipped step
        s -= val
        np.minimum(np.maximum(s, 0.0, out=s), 1.0, out=s)
        if float(np.max(np.abs(val))) <= 1e-8:  # the error left is ~ step² ≤ 1e-16 of a cell: round-off
            break
    s += i
    s *= h
    s += v0
    s += turns
    return s


def cdf_from_map(X: Array, L: Array, theta: Array | None = None) -> tuple[Array, float] | None:
    """The CDF μ_t([0, θ)) (up to a constant) at ``theta`` (default the CDF_POINTS angles) from labels and log ∂_vX.

    Spectral while the map is smooth (trigonometric Hermite interpolation, :func:`hermite_map`, on a grid of
    max(8·CDF_POINTS, 8M) points, then the inverse by cubic Hermite and Newton). Returns (the CDF, the spectral
    tail of :func:`hermite_map`), or None where the labels do not resolve the map: an interpolant that is not
    increasing on the grid, or a tail above HERMITE_TAIL (clusters collapsing; :func:`cdf_linear` then).
    """
    th = _angles() if theta is None else np.asarray(theta, float)
    M = len(X)
    U = max(4 * CDF_POINTS, 8 * M)  # inversion error ≤ 3e-10 (measured, M = 48..640; 1e-12 at M = 48)
    ck, cm, tail = _hermite_coefficients(X, np.exp(L))
    if tail > HERMITE_TAIL:  # decided before the grid is evaluated
        return None
    Xf, Xd = _hermite_grid(ck, cm, U)
    if not (Xd > 0).all() or not (Xf[1:] > Xf[:-1]).all():
        return None
    return _invert(Xf, Xd, 0.5 / M, th), tail


def cdf_local_hermite(X: Array, L: Array, theta: Array | None = None) -> Array:
    """The CDF (up to a constant) from the piecewise-cubic Hermite map through (v_j, X_j, ∂_vX_j = e^{L_j}).

    Fourth order in the label spacing where the map is smooth, local (no ringing where the labels do not resolve
    it), and increasing: the exact derivatives are scaled so that α² + β² ≤ 9 on every interval (Fritsch & Carlson,
    SIAM J. Numer. Anal. 17, 1980; α, β the end derivatives over the secant). Shape of ``theta``.
    """
    th = _angles() if theta is None else np.asarray(theta, float)
    M = len(X)
    h = 1.0 / M
    D = np.exp(L)
    sec = np.diff(np.concatenate([X, X[:1] + 2 * math.pi])) / h  # interval j: v_j to v_{j+1} (cyclic)
    pos = sec > 0
    a = np.where(pos, D / np.where(pos, sec, 1.0), 0.0)
    b = np.where(pos, np.roll(D, -1) / np.where(pos, sec, 1.0), 0.0)
    r = np.hypot(a, b)
    tau = np.where(r > 3.0, 3.0 / np.where(r > 0, r, 1.0), 1.0) * pos  # 0 on an empty interval: a flat piece
    D = D * np.minimum(tau, np.roll(tau, 1))  # each node by the smaller factor of its two intervals
    return _invert(np.asarray(X, float), D, 0.5 / M, th)


def cdf_linear(X: Array, theta: Array | None = None) -> Array:
    """The CDF of the labels' measure, linear between them: F(X_j) = (j + ½)/M (up to a constant); shape theta.

    The map is increasing (the flow of a 1-D velocity keeps the order of the labels), so this is the exact CDF of
    the piecewise-uniform measure between consecutive labels; second order in their spacing, and exact in the sense
    of mass for collapsed clusters (a jump of the CDF).
    """
    th = _angles() if theta is None else np.asarray(theta, float)
    M = len(X)
    x = np.sort(np.asarray(X, float))
    x = x - 2 * math.pi * math.floor(x[0] / (2 * math.pi))
    f = (np.arange(M) + 0.5) / M
    xs = np.concatenate([x - 2 * math.pi, x, x + 2 * math.pi])
    fs = np.concatenate([f - 1.0, f, f + 1.0])
    return np.asarray(np.interp(th, xs, fs), dtype=float)


def _angles() -> Array:
    return np.asarray(2 * math.pi * np.arange(CDF_POINTS) / CDF_POINTS, dtype=float)


def cluster_masses(X: Array, w: Array, gap: float) -> Array:
    """The masses of the groups of labels, cut where two cyclically consecutive positions are > ``gap`` apart.

    Args:
        X: label positions (M,) (radians, any lift).
        w: their weights (M,).
        gap: the cut (radians).

    Returns:
        The group masses (G,), in cyclic order from the first cut; one group of the total mass if no gap exceeds it.
    """
    x = np.mod(X, 2 * math.pi)
    o = np.argsort(x)
    x, ww = x[o], w[o]
    gaps = np.diff(np.concatenate([x, [x[0] + 2 * math.pi]]))
    cut = np.flatnonzero(gaps > gap)  # a group ends at each cut index
    if len(cut) == 0:
        return np.array([float(ww.sum())])
    c = np.concatenate([[0.0], np.cumsum(np.roll(ww, -(cut[-1] + 1)))])  # start after the last cut
    ends = np.mod(cut - cut[-1], len(x))
    ends[-1] = len(x)
    ends = np.sort(ends)
    return np.diff(np.concatenate([[0.0], c[ends]]))
