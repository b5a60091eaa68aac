"""Tokens on the circle in Lagrangian form: μ_t = X_t # μ_0, the flow map on the quantiles of μ_0 (theory §8).

The continuity equation ∂_t μ + ∂_θ(μ u[μ]) = 0 is equivalent to the flow-map equation for the quantile map X_t(v)
(v ∈ [0, 1) the mass coordinate: μ_t([X_t(0), X_t(v))) = v),

    ∂_t X_t(v) = u[μ_t](X_t(v)),   u(θ) = Σ_h c_h Z_h(θ)^{-1} ∫₀¹ e^{β_h cos(X_t(w) − θ)} sin(X_t(w) − θ) dw,

Z_h ≡ 1 (USA) or Z_h(θ) = ∫₀¹ e^{β_h cos(X_t(w) − θ)} dw (SA). Design, and why:

* **Labels at the quantiles, equal weights.** M labels v_j = (j + ½)/M start at X_0(v_j) = F_0^{-1}(v_j), F_0 the
  closed-form CDF of the data (Newton to round-off; ``circle_noise``: the exact inverse of its piecewise-linear
  CDF). Each label carries the mass 1/M exactly. X_t(v) − 2πv is periodic and, for smooth data, analytic, so the
  midpoint rule in v of every smooth integrand converges spectrally: the discrete system is the deterministic
  particle system on these labels.
* **The force by the Fourier series of the kernel**, O(MK) instead of the O(M²) pairwise sum:
  e^{β cos ψ} = I₀(β) + 2 Σ_k I_k(β) cos kψ, so e^{β cos ψ} sin ψ = (2/β) Σ_k k I_k(β) sin kψ, and with the moments
  S_k = (1/M) Σ_j e^{ikX_j},

      N(θ) = (2/β) Σ_k k I_k(β) Im(e^{−ikθ} S_k),   Z(θ) = I₀(β) + 2 Σ_k I_k(β) Re(e^{−ikθ} S_k),

  cut at the first K with I_k(β)/I₀(β) < 1e-17 (:func:`series_length`: the tail is below round-off). The powers
  e^{ikX_j} are one cumulative product. The direct pairwise sum (:func:`mfpde.tokens.circle_particles.dense_velocity`)
  is the tests' reference.
* **The map's derivative rides along** (the variational equation): L_j = log ∂_v X_t(v_j) obeys
  dL_j/dt = u'(X_j), u' from the same moments at almost no extra cost; L_0 = −log μ_0(X_0(v_j)). With X and ∂_v X at
  the labels the periodic part of the map is interpolated by a trigonometric **Hermite** interpolant of 2M modes
  (:func:`hermite_map`): the reconstruction error of M labels is that of 2M plain samples (measured: W1 1e-7 at
  M = 64 where plain interpolation needs M ≈ 120). The CDF at any angle is the inverse of that map (cubic
  Hermite on an oversampled grid, Newton-polished; :func:`cdf_from_map`).
* **Integrators: explicit while non-stiff, implicit once clusters collapse.** DOP853 (scipy's, order 8, with a PI
  step-size controller: :mod:`mfpde.tokens.adaptive`) steps (X, L) while the map is smooth. A collapsing cluster
  contracts at the rate σ = −min_j u'(X_j)
  (the diagonal of the Jacobian, available from L's right-hand side); when the explicit step is held by stability
  (h σ ≥ 2 for 8 accepted steps in a row) the solve switches to LSODA (ODEPACK, BDF with the exact dense Jacobian,
  :meth:`FourierForce.jacobian`) on X alone, and the CDF from then on is the exact one of the weighted labels,
  linear between them (a collapsed cluster is a jump of the CDF, which no smooth interpolant holds). The switch
  depth and both integrators' counts are recorded.

Everything is replicated: every MPI rank solves the same small ODE with the same numbers.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import scipy.integrate
import scipy.special

from mfpde.tokens.adaptive import DOP853PI

__all__ = ["CDF_POINTS", "FlowMap", "FlowSolution", "FourierForce", "Labels", "cdf_from_map", "cdf_linear",
           "cdf_local_hermite",
           "cluster_masses", "hermite_map", "modes_cdf", "modes_density", "modes_labels", "noise_labels",
           "series_length"]

Array = npt.NDArray[np.float64]
#: The angles θ_j = 2πj/CDF_POINTS at which the CDF of μ_t is reported.
CDF_POINTS = 1024
#: The series is cut where I_k(β)/I₀(β) falls below this (double round-off, with a margin).
SERIES_CUT = 1e-17
#: The spectral tail of the Hermite interpolant above which the map counts as unresolved (measured: 1e-2 where
#: M = 32 labels give W1 1e-4 at the side-by-side problem, 2e-2 and more where collapsing clusters make it oscillate).
HERMITE_TAIL = 1.5e-2
#: Stiffness switch: h σ at or above this for SWITCH_STEPS accepted explicit steps in a row.
SWITCH_H_SIGMA, SWITCH_STEPS = 2.0, 8


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
    x = 2 * math.pi * v
    for _ in range(60):  # Newton on 2πF_0(x) = 2πv, the modes as one (M, modes) array
        arg = np.outer(x, k) - k * ph
        dx = (x + np.sin(arg) @ (a / k) - target) / (1.0 + np.cos(arg) @ a)
        x = x - dx
        if float(np.max(np.abs(dx))) <= 4 * np.finfo(float).eps * 2 * math.pi:
            break
    else:
        raise ValueError("the quantiles of data.modes did not converge (a density too close to 0)")
    return Labels(x, -np.log(modes_density(modes)(x)), smooth=True)


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


def series_length(beta: float) -> int:
    """The first K with I_K(β)/I₀(β) < 1e-17: the terms kept in the Fourier series of the kernel."""
    b = abs(float(beta))
    cut = SERIES_CUT * scipy.special.ive(0, b)
    start = 1
    while True:  # blocks of 64 orders: one or two blocks up to β ≈ 100
        k = np.arange(start, start + 64)
        small = np.flatnonzero(scipy.special.ive(k, b) < cut)
        if len(small):
            return int(k[small[0]])
        start += 64


class FourierForce:
    """The attention velocity of M equal-weight labels by the Fourier series of the kernel (see the module).

    With E_kj = e^{ikX_j} (k = 1..K, by doubling: log₂K products of row blocks, round-off ≈ log₂K ε) and the moments
    S_k = (1/M) Σ_j E_kj, every quantity is a row of one product R = (C ⊙ conj S) E (rows C of real coefficients):
    N = −Im R_a, Z = I₀ + Re R_{2I}, and their θ-derivatives N' = −Re R_{ka}, Z' = −Im R_{2kI}. The arrays are
    allocated once: a call is a dozen numpy operations on (K, M) arrays.

    Args:
        heads_a: inverse temperatures β_h ≥ 0 (H,).
        heads_c: head weights c_h (H,).
        attention: "softmax" (SA: u = Σ_h c_h N_h/Z_h) or "unnormalised" (USA: u = Σ_h c_h e^{β_h} N_h, one row).
        M: the number of labels.

    Raises:
        ValueError: an unknown attention or a negative β.
    """

    def __init__(self, heads_a: Array, heads_c: Array, attention: str, M: int):
        if attention not in ("softmax", "unnormalised"):
            raise ValueError(f"attention must be 'softmax' or 'unnormalised', got {attention!r}")
        a, c = np.asarray(heads_a, float), np.asarray(heads_c, float)
        if np.any(a < 0):
            raise ValueError(f"inverse temperatures must be >= 0, got {a.tolist()}")
        self.softmax, self.M = attention == "softmax", M
        self.K = max(series_length(b) for b in a)
        k = np.arange(1, self.K + 1).astype(float)
        self.k = k
        rows: list[Array] = []  # USA: [a]; SA: [a_h, 2I_h] per head
        self.i0: list[tuple[float, float]] = []
        for b, ch in zip(a, c, strict=True):
            if b < 1e-12:  # β → 0: e^{β cos ψ} sin ψ → sin ψ (the k = 1 term alone), Z → 1
                ik, i0, an = np.where(k == 1, 0.5, 0.0), 1.0, np.where(k == 1, 1.0, 0.0)
            else:
                ik, i0 = scipy.special.ive(k, b), float(scipy.special.ive(0, b))  # I_k(β) e^{−β}
                an = (2.0 / b) * k * ik
            if self.softmax:
                rows += [an, 2.0 * ik]
                self.i0.append((i0, float(ch)))
            else:  # USA is linear in the kernel: Σ_h c_h e^{β_h} (2/β_h) k I_k(β_h) e^{−β_h}
                rows = [(rows[0] if rows else 0.0) + ch * an * math.exp(min(b, 700.0))]
        self.A = np.array(rows, dtype=float).T  # (K, columns): the coefficients, for the tests' scale
        C = np.array(rows, dtype=float)
        self._C = np.concatenate([C, C * k]).astype(complex)  # the rows and their k-weighted rows (derivatives)
        self._nrow = len(rows)
        self._CS = np.empty_like(self._C)
        # USA's right-hand side of (X, L) in one product: rows −a and −i·k a give u = Im R₀, u' = Im R₁
        self._C_usa = np.array([-self._C[0], -1j * self._C[1]]) if not self.softmax else self._C[:0]
        self._CS_usa = np.empty_like(self._C_usa)
        self.nfev = 0
        self._E = np.empty((self.K, M), complex)
        self._w = np.full(M, 1.0 / M, complex)
        self._blocks = []
        n = 1
        while n < self.K:
            m = min(n, self.K - n)
            self._blocks.append((self._E[:m], self._E[n - 1], self._E[n : n + m]))
            n += m

    def _powers(self, X: Array) -> Array:
        """E_kj = e^{ikX_j} (K, M) in the preallocated array."""
        E = self._E
        np.cos(X, out=E[0].real)
        np.sin(X, out=E[0].imag)
        for p, q, o in self._blocks:
            np.multiply(p, q, out=o)
        return E

    def _rows(self, X: Array, derivative: bool) -> Array:
        E = self._powers(X)
        S = np.conj(E @ self._w)
        nr = 2 * self._nrow if derivative else self._nrow
        CS = self._CS[:nr]
        np.multiply(self._C[:nr], S, out=CS)
        return np.asarray(CS @ E)

    def field(self, X: Array, derivative: bool = False) -> tuple[Array, Array | None]:
        """(u(X_j), u'(X_j) or None) of the labels X (M,) at their own positions."""
        self.nfev += 1
        R = self._rows(X, derivative)
        if not self.softmax:
            return -R[0].imag, (-R[1].real if derivative else None)
        u = np.zeros(len(X))
        du = np.zeros(len(X)) if derivative else None
        nr = self._nrow
        for h, (i0, ch) in enumerate(self.i0):
            N, Z = -R[2 * h].imag, i0 + R[2 * h + 1].real
            u += ch * N / Z
            if du is not None:
                dN, dZ = -R[nr + 2 * h].real, -R[nr + 2 * h + 1].imag
                du += ch * (dN * Z - N * dZ) / (Z * Z)
        return u, du

    def rhs(self, _t: float, Y: Array) -> Array:
        """d(X, L)/dt = (u(X), u'(X)) for the state Y = (X, L) (2M,): the flow map and its log-derivative."""
        M = self.M
        if not self.softmax:
            self.nfev += 1
            E = self._powers(Y[:M])
            np.multiply(self._C_usa, np.conj(E @ self._w), out=self._CS_usa)
            return np.asarray((self._CS_usa @ E).imag.ravel())
        out = np.empty(2 * M)
        u, du = self.field(Y[:M], True)
        out[:M], out[M:] = u, du if du is not None else 0.0
        return out

    def velocity(self, X: Array) -> Array:
        """The velocity u at the labels (M,)."""
        return self.field(X)[0]

    def jacobian(self, X: Array) -> Array:
        """∂u_i/∂X_l (M, M), exact: through the moments (1/M)·(a rank-K product) and, on the diagonal, through θ = X_i.

        USA: ∂N(X_i)/∂X_l = (1/M) Σ_k a_k k Re(e^{ik(X_l − X_i)}), plus N'(X_i) on the diagonal; SA: (∂N Z − N ∂Z)/Z²
        with ∂Z(X_i)/∂X_l = −(1/M) Σ_k 2I_k k Im(e^{ik(X_l − X_i)}), plus Z'(X_i).
        """
        M = len(X)
        R = self._rows(X, True)
        P = self._E.T.copy()  # e^{ikX}, (M, K)
        Pc = P.conj()
        nr = self._nrow
        C = self._C.real
        if not self.softmax:
            J = ((Pc * (C[0] * self.k)) @ P.T).real / M
            J[np.diag_indices(M)] -= R[1].real
            return np.asarray(J)
        J = np.zeros((M, M))
        for h, (i0, ch) in enumerate(self.i0):
            N, Z = -R[2 * h].imag, i0 + R[2 * h + 1].real
            dN, dZ = -R[nr + 2 * h].real, -R[nr + 2 * h + 1].imag
            JN = ((Pc * (C[2 * h] * self.k)) @ P.T).real / M
            JZ = -((Pc * (C[2 * h + 1] * self.k)) @ P.T).imag / M
            JN[np.diag_indices(M)] += dN
            JZ[np.diag_indices(M)] += dZ
            J += ch * (JN * Z[:, None] - N[:, None] * JZ) / (Z * Z)[:, None]
        return J


def hermite_map(X: Array, D: Array, U: int) -> tuple[Array, Array, float]:
    """The quantile map and its derivative at v = (i + ½·U/M)/U, i = 0..U−1, from X and ∂_vX at the M labels.

    The periodic part p(v) = X(v) − 2πv is the trigonometric polynomial of the 2M frequencies −M..M−1 that matches
    p and p' at the M labels (a 2 × 2 solve per aliased pair of frequencies), evaluated by one inverse FFT of size
    U ≥ 2M. Returns shapes (U,), (U,) and the tail Σ_{|k| ≥ M/2}|c_k| / Σ_k |c_k| (how much of the interpolant lives
    in the upper half of its frequencies: small while the labels resolve the map).
    """
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
    # p is real, so c_{−f} = conj(c_f) (f = 1..M−1) and one real inverse FFT of the frequencies 0..M suffices; the
    # unpaired −M term enters as conj(c_{−M})/2 at +M
    Z = np.zeros(U // 2 + 1, complex)
    Z[:M] = ck
    Z[M] = np.conj(cm[0]) / 2
    f = np.arange(U // 2 + 1)
    p = np.fft.irfft(Z, U) * U
    dp = np.fft.irfft(Z * (2j * math.pi) * f, U) * U
    return p + 2 * math.pi * (np.arange(U) / U + 0.5 / M), dp + 2 * math.pi, tail


def _invert(Xf: Array, Xd: Array, v0: float, theta: Array) -> Array:
    """V with X(v) ≡ θ (mod 2π) from the map on a uniform grid (U,) starting at v0 (cubic Hermite, Newton)."""
    U = len(Xf)
    h = 1.0 / U
    Xf = np.concatenate([Xf, Xf[:1] + 2 * math.pi])
    Xd = np.concatenate([Xd, Xd[:1]]) * h
    x0 = Xf[0]
    lifted = x0 + np.mod(theta - x0, 2 * math.pi)
    i = np.clip(np.searchsorted(Xf, lifted, side="right") - 1, 0, U - 1)
    xa, xb, da, db = Xf[i], Xf[i + 1], Xd[i], Xd[i + 1]
    s = np.clip((lifted - xa) / np.where(xb > xa, xb - xa, 1.0), 0.0, 1.0)
    for _ in range(3):  # from the chord's root: Newton on the cubic converges quadratically
        s2, s3 = s * s, s * s * s
        val = (2 * s3 - 3 * s2 + 1) * xa + (s3 - 2 * s2 + s) * da + (3 * s2 - 2 * s3) * xb + (s3 - s2) * db - lifted
        der = (6 * s2 - 6 * s) * (xa - xb) + (3 * s2 - 4 * s + 1) * da + (3 * s2 - 2 * s) * db
        s = np.clip(s - val / np.where(der > 0, der, 1.0), 0.0, 1.0)
    return np.asarray(v0 + (i + s) * h - np.rint((lifted - theta) / (2 * math.pi)), dtype=float)


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
    Xf, Xd, tail = hermite_map(X, np.exp(L), U)
    if tail > HERMITE_TAIL or not np.all(Xd > 0) or not np.all(np.diff(Xf) > 0):
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


@dataclass
class FlowSolution:
    """The flow map at the output depths.

    Attributes:
        t: output depths (T,); X: label positions (T, M), not wrapped; cdf: the CDF at the CDF_POINTS angles (T, 1024),
        shifted so that cdf[:, 0] = 0; reconstruction: "hermite" or "linear" per output; stats: integrator counts and
        the switch depth (``switch_t``, None if the solve stayed explicit).
    """

    t: Array
    X: Array
    cdf: Array
    reconstruction: list[str]
    stats: dict[str, Any] = field(default_factory=dict)


class FlowMap:
    """The flow-map ODE on the quantile labels of μ_0 (see the module).

    Args:
        labels: the initial labels (:func:`modes_labels`, :func:`noise_labels`).
        heads_a, heads_c: inverse temperatures β_h and weights c_h of the reduced head measure (H,).
        attention: "softmax" (SA) or "unnormalised" (USA).
    """

    def __init__(self, labels: Labels, heads_a: Array, heads_c: Array, attention: str = "unnormalised"):
        self.labels = labels
        self.M = labels.M
        self.force = FourierForce(heads_a, heads_c, attention, self.M)

    def rhs(self, t: float, Y: Array) -> Array:
        """d(X, L)/dt = (u(X), u'(X)), shape (2M,) (:meth:`FourierForce.rhs`)."""
        return self.force.rhs(t, Y)

    def _cdf(self, X: Array, L: Array | None) -> tuple[Array, str]:
        """(the CDF at the CDF_POINTS angles, shifted to F(0) = 0; the reconstruction used).

        "hermite" (spectral, while the labels resolve the map), "cubic" (local monotone Hermite with the exact
        derivatives, where they do not), "linear" (in the stiff phase, where the derivative is not carried, and for
        cell-wise data).
        """
        got = cdf_from_map(X, L) if L is not None and self.labels.smooth else None
        if got is not None:
            F, kind = got[0], "hermite"
        elif L is not None and self.labels.smooth:
            F, kind = cdf_local_hermite(X, L), "cubic"
        else:
            F, kind = cdf_linear(X), "linear"
        return F - F[0], kind

    def solve(self, t_out: Array, rtol: float = 1e-10, callback: Callable[[int, float], None] | None = None,
              deadline: float = math.inf) -> FlowSolution:
        """X_t and the CDF at the depths ``t_out`` (increasing, > 0; X = X_0 at t = 0 is not an output unless 0 is).

        Args:
            t_out: output depths (T,).
            rtol: the integrators' relative tolerance (absolute: rtol radians on X, rtol on L).
            callback: called as callback(i, t_i) after output i (progress).
            deadline: a time.process_time() after which the solve stops.

        Returns:
            The solution at every output depth.

        Raises:
            NumericalError: the explicit or the stiff integrator failed, a non-finite state, or the deadline; the
                message names the depth reached (the last good output is in ``exc.partial``, a FlowSolution).
        """
        import time

        from mfpde.errors import NumericalError

        t_out = np.asarray(t_out, float)
        M = self.M
        Xs: list[Array] = []
        Fs: list[Array] = []
        kinds: list[str] = []
        stats: dict[str, Any] = {"explicit": "DOP853 (PI step control)", "stiff": "LSODA (BDF, exact Jacobian)",
                                 "switch_t": None, "explicit_steps": 0, "stiff_steps": 0, "nfev": 0, "njev": 0}

        def record(X: Array, L: Array | None) -> None:
            F, kind = self._cdf(X, L)
            Xs.append(np.array(X))
            Fs.append(F)
            kinds.append(kind)
            if callback is not None:
                callback(len(Xs) - 1, float(t_out[len(Xs) - 1]))

        def fail(msg: str) -> NumericalError:
            stats["nfev"] = self.force.nfev
            e = NumericalError(msg)
            e.partial = FlowSolution(t_out[: len(Xs)], np.array(Xs).reshape(len(Xs), M),
                                     np.array(Fs).reshape(len(Fs), CDF_POINTS), kinds, stats)
            return e

        i = 0
        while i < len(t_out) and t_out[i] <= 0.0:
            record(self.labels.X0, self.labels.L0)
            i += 1
        Y = np.concatenate([self.labels.X0, self.labels.L0])
        t = 0.0
        if i < len(t_out):
            solver = DOP853PI(self.force.rhs, 0.0, Y, float(t_out[-1]), rtol=rtol, atol=rtol)
            held = 0
            while i < len(t_out):
                msg = solver.step()
                stats["explicit_steps"] += 1
                if solver.status == "failed" or not np.all(np.isfinite(solver.y)):
                    raise fail(f"flow map: the explicit integrator failed at t = {solver.t:.6g} ({msg})")
                dense = None
                while i < len(t_out) and t_out[i] <= solver.t:
                    if t_out[i] == solver.t:  # the step ended on it (the last depth is t_bound): no interpolant
                        y = solver.y
                    else:
                        dense = dense or solver.dense_output()
                        y = dense(t_out[i])
                    record(y[:M], y[M:])
                    i += 1
                t, Y = solver.t, solver.y
                if i >= len(t_out) or solver.status == "finished":
                    break
                sigma = max(0.0, -float(np.min(solver.f[M:])))  # the contraction rate, from the stored rhs
                held = held + 1 if solver.step_size * sigma >= SWITCH_H_SIGMA else 0
                if held >= SWITCH_STEPS:
                    stats["switch_t"] = float(t)
                    break
                if time.process_time() > deadline:
                    raise fail(f"CPU-time budget exceeded at t = {t:.6g}")
        if i < len(t_out):
            X = Y[:M]
            ts = np.concatenate([[t], t_out[i:]])
            with warnings.catch_warnings():  # a failure is reported by its message below, not by scipy's warning
                warnings.simplefilter("ignore")
                out, info = scipy.integrate.odeint(lambda x, _t: self.force.velocity(x), X, ts,
                                                   Dfun=lambda x, _t: self.force.jacobian(x), rtol=rtol, atol=rtol,
                                                   full_output=True, mxstep=100_000)
            good = 0  # outputs reached with a finite state
            while (good + 1 < len(ts) and info["tcur"][good] >= ts[good + 1] * (1 - 1e-12)
                   and np.all(np.isfinite(out[good + 1]))):
                good += 1
            stats["stiff_steps"] = int(info["nst"][good - 1]) if good else 0  # entries past a failure are unset
            stats["njev"] = int(info["nje"][good - 1]) if good else 0
            stats["nfev"] = self.force.nfev
            for j in range(1, good + 1):
                record(out[j], None)
            if good + 1 < len(ts):
                raise fail(f"flow map: the stiff integrator failed after t = {float(ts[good]):.6g} "
                           f"({info['message'].strip()})")
        stats["nfev"] = self.force.nfev
        return FlowSolution(t_out, np.array(Xs), np.array(Fs), kinds, stats)


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
