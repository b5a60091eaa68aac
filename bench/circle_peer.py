"""Hand-written competitor ("the peer") for mean-field self-attention on the circle.

Tokens are a probability measure mu_t on the circle theta in [0, 2 pi) moving in depth t by

    d_t mu + d_theta(mu u) = 0,
    u(theta) = Z(theta)^-1 int exp(beta cos(phi - theta)) sin(phi - theta) dmu(phi),

with Z(theta) = int exp(beta cos(phi - theta)) dmu(phi) ("softmax", SA) or Z = 1 ("unnormalised", USA).

Method (numpy + scipy only, written as a careful expert user would):

* Lagrangian particles at the quantiles of mu_0: X_0(u_j) = F_0^{-1}(u_j), u_j = (j + 1/2)/N, weights 1/N
  (F_0 is inverted by Newton to round-off), so that mu_t = X_t # mu_0.
* Force by the Fourier series of the kernel, O(N K):
  exp(beta cos psi) sin psi = (2/beta) sum_k k I_k(beta) sin(k psi),
  exp(beta cos psi)         = I_0(beta) + 2 sum_k I_k(beta) cos(k psi),
  with the moments S_k = (1/N) sum_j exp(i k X_j); K is where I_k/I_0 drops below round-off.
* Time integration with scipy: solve_ivp (DOP853 by default) or odeint/LSODA (long horizons, stiff once
  the clusters have collapsed; an analytic Jacobian is supplied).
* Reconstruction of the CDF on the 1024-point grid by inverting the spectral (trigonometric) interpolant of
  the periodic part X(u) - 2 pi u of the quantile map; where the map is no longer smooth (the interpolant
  is not monotone) it falls back to the monotone cubic (PCHIP) interpolant of the quantile map.

Run ``python bench/circle_peer.py`` for the accuracy / CPU table (cases A, B, C).
"""

from __future__ import annotations

import time

import numpy as np
from scipy.integrate import odeint, solve_ivp
from scipy.special import ive

TWO_PI = 2.0 * np.pi
NGRID = 1024
THETA = TWO_PI * np.arange(NGRID) / NGRID


# ----------------------------------------------------------------------------------------------------------
# Initial data
# ----------------------------------------------------------------------------------------------------------
def initial_cdf(theta: np.ndarray, modes: np.ndarray) -> np.ndarray:
    """Closed-form CDF F_0(theta) = mu_0([0, theta)) of mu_0 = (1/2pi)(1 + sum a cos(k(theta - phi)))."""
    theta = np.asarray(theta, dtype=float)
    s = theta.copy()
    for k, a, ph in np.asarray(modes, dtype=float).reshape(-1, 3):
        s += (a / k) * (np.sin(k * (theta - ph)) + np.sin(k * ph))
    return s / TWO_PI


def initial_quantiles(modes: np.ndarray, N: int) -> np.ndarray:
    """Particles X_0(u_j) = F_0^{-1}(u_j), u_j = (j + 1/2)/N, by Newton from the uniform guess (to round-off)."""
    modes = np.asarray(modes, dtype=float).reshape(-1, 3)
    k = modes[:, 0:1]
    a = modes[:, 1:2]
    ph = modes[:, 2:3]
    ak = a / k
    shift = (ak * np.sin(k * ph)).sum()
    target = TWO_PI * (np.arange(N) + 0.5) / N
    x = target.copy()
    for _ in range(60):
        arg = k * (x - ph)
        g = x + (ak * np.sin(arg)).sum(0) + shift - target
        dg = 1.0 + (a * np.cos(arg)).sum(0)
        dx = g / dg
        x -= dx
        if np.max(np.abs(dx)) < 1e-15:
            break
    return x


# ----------------------------------------------------------------------------------------------------------
# Force
# ----------------------------------------------------------------------------------------------------------
def fourier_cutoff(beta: float, tol: float = 1e-17) -> int:
    """Number K of kernel harmonics: the first k with k I_k(beta)/I_0(beta) < tol (round-off)."""
    ks = np.arange(1, int(2 * beta) + 60)
    r = ks * ive(ks, beta) / ive(0, beta)
    return int(np.argmax(r < tol)) + 1


def make_velocity(N: int, beta: float, attention: str):
    """Return f(t, x) -> u(x_i) for N equal-weight particles at x, by the kernel's Fourier series, O(N K).

    Powers exp(i k x) for k = 1..K are built by doubling (K/2 + K/4 + ... complex products, log2(K) numpy
    calls); moments and back-evaluation are complex matrix-vector products (BLAS).
    """
    K = fourier_cutoff(beta)
    k = np.arange(1, K + 1, dtype=float)
    ivk = ive(k, beta)
    if attention in ("softmax", "SA"):
        a = ((2.0 / beta) * k * ivk / ive(0, beta)).astype(complex)
        b = (2.0 * ivk / ive(0, beta)).astype(complex)
        softmax = True
    elif attention in ("unnormalised", "unnormalized", "USA"):
        a = ((2.0 / beta) * k * ivk * np.exp(beta)).astype(complex)  # ive(k, b) e^b = I_k(b)
        b = None
        softmax = False
    else:
        raise ValueError(f"unknown attention {attention!r}")
    w = np.full(N, 1.0 / N, dtype=complex)
    E = np.empty((K, N), dtype=complex)
    Er0 = E[0].real
    Ei0 = E[0].imag
    # doubling: rows n..n+m-1 (k = n+1..n+m) = rows 0..m-1 (k = 1..m) times row n-1 (k = n)
    blocks = []
    n = 1
    while n < K:
        m = min(n, K - n)
        blocks.append((E[:m], E[n - 1], E[n:n + m]))
        n += m
    mult = np.multiply
    cos = np.cos
    sin = np.sin
    conj = np.conjugate
    aS = np.empty(K, dtype=complex)

    if softmax:
        bS = np.empty(K, dtype=complex)

        def f(t, x):
            cos(x, out=Er0)
            sin(x, out=Ei0)
            for p, q, o in blocks:
                mult(p, q, out=o)
            S = conj(E @ w)
            mult(a, S, out=aS)
            mult(b, S, out=bS)
            return (aS @ E).imag / (-1.0 - (bS @ E).real)
    else:
        a = -a  # u = -Im((a conj S) @ E)

        def f(t, x):
            cos(x, out=Er0)
            sin(x, out=Ei0)
            for p, q, o in blocks:
                mult(p, q, out=o)
            mult(a, conj(E @ w), out=aS)
            return (aS @ E).imag

    return f


def make_jacobian(N: int, beta: float, attention: str):
    """Dense analytic Jacobian du_i/dx_j of the particle velocity (pairwise, O(N^2)); for LSODA / BDF."""
    softmax = attention in ("softmax", "SA")
    eb = 1.0 if softmax else np.exp(beta)
    invN = 1.0 / N

    def jac(x, t=None):
        d = x[None, :] - x[:, None]  # d_ij = x_j - x_i
        c = np.cos(d)
        s = np.sin(d)
        h = np.exp(beta * (c - 1.0))  # e^{beta cos} / e^beta (scale cancels for SA)
        g = h * s
        gp = h * (c - beta * s * s)  # d/dpsi (e^{beta cos psi} sin psi) (scaled)
        A = g.sum(1) * invN
        dA = gp * invN
        np.fill_diagonal(dA, 0.0)
        dA[np.diag_indices(N)] = -dA.sum(1)
        if not softmax:
            return dA * eb
        Z = h.sum(1) * invN
        dZ = (-beta * invN) * g
        np.fill_diagonal(dZ, 0.0)
        dZ[np.diag_indices(N)] = -dZ.sum(1)
        u = A / Z
        return (dA - u[:, None] * dZ) / Z[:, None]

    return jac


# ----------------------------------------------------------------------------------------------------------
# Reconstruction of the CDF on the grid from the particles (the quantile map at u_j = (j + 1/2)/N)
# ----------------------------------------------------------------------------------------------------------
def _lift_targets(theta: np.ndarray, x_first: float):
    """Theta = theta' + 2 pi m with theta' in [x_first, x_first + 2 pi): returns (theta', m)."""
    m = np.floor((theta - x_first) / TWO_PI)
    return theta - TWO_PI * m, m


def _exp_powers(s: np.ndarray, kmax: int) -> np.ndarray:
    """Rows exp(2 pi i k s) for k = 0..kmax, shape (kmax+1, len(s)), by doubling products."""
    P = np.empty((kmax + 1, s.size), dtype=complex)
    P[0] = 1.0
    if kmax >= 1:
        P[1] = np.exp(2j * np.pi * s)
    n = 2
    while n <= kmax:
        m = min(n - 1, kmax + 1 - n)
        np.multiply(P[1:m + 1], P[n - 1], out=P[n:n + m])
        n += m
    return P


def _spectral_coefficients(X: np.ndarray):
    """Rfft of the periodic part P_j = X_j - 2 pi u_j of the quantile map at u_j = (j+1/2)/N."""
    N = X.size
    return np.fft.rfft(X - TWO_PI * (np.arange(N) + 0.5) / N)


def _fine_grid(c: np.ndarray, N: int, M: int, nder: int):
    """X and its first nder derivatives (in s = u - 1/(2N)) on the fine grid s = m/M by zero-padded irfft."""
    cp = np.zeros(M // 2 + 1, dtype=complex)
    kmax = N // 2
    cp[:kmax + 1] = c
    if N % 2 == 0:
        cp[kmax] *= 0.5  # the Nyquist cosine splits into +-N/2 on the finer grid
    cp *= M / N
    ik = 2j * np.pi * np.arange(M // 2 + 1)
    s = np.arange(M) / M
    out = [np.fft.irfft(cp, M) + TWO_PI * (s + 0.5 / N)]
    for d in range(1, nder + 1):
        cp = cp * ik
        out.append(np.fft.irfft(cp, M) + (TWO_PI if d == 1 else 0.0))
    return out


def cdf_spectral(X: np.ndarray, theta: np.ndarray = THETA, fine: int = 8, exact_newton: bool = False):
    """CDF mu([0, theta)) by inverting the trigonometric interpolant of the quantile map.

    X: sorted lifted particle positions at u_j = (j+1/2)/N (not wrapped; X(u+1) = X(u) + 2 pi).
    The periodic part P(u) = X(u) - 2 pi u is interpolated by its DFT (trigonometric interpolation at the N
    nodes). The interpolant and its first two derivatives are evaluated on a fine grid of fine*N points by
    zero-padded inverse FFTs; between fine-grid points it is replaced by the quintic Hermite interpolant of
    those values (relative error <= (pi/fine)^6/46080 on the highest harmonic, ~1e-7 for fine = 8, far
    less on the low harmonics that carry the map: below round-off in practice), and X(u) = theta is solved
    on each fine cell by safeguarded Newton. exact_newton=True instead does Newton with exact O(N)
    evaluation of the trigonometric polynomial at each target (slower; used to verify the above).
    Returns None when the interpolant is not monotone on the fine grid (map not smooth / not resolved).
    """
    N = X.size
    c = _spectral_coefficients(X)
    M = max(fine * N, 4096)
    Xf, D1, D2 = _fine_grid(c, N, M, 2)
    if D1.min() <= 0.0 or np.any(np.diff(Xf) <= 0.0):
        return None
    th, m = _lift_targets(theta, Xf[0])
    Xe = np.append(Xf, Xf[0] + TWO_PI)
    i = np.clip(np.searchsorted(Xe, th, side="right") - 1, 0, M - 1)
    h = 1.0 / M
    y0 = Xe[i]
    y1 = Xe[i + 1]
    if exact_newton:
        kmax = N // 2
        alpha = c / N
        alpha[1:] *= 2.0
        if N % 2 == 0:
            alpha[-1] *= 0.5
        ak = alpha * (2j * np.pi * np.arange(kmax + 1))
        lo = i * h
        hi = lo + h
        s = lo + (th - y0) / (y1 - y0) * h
        for _ in range(8):
            E = _exp_powers(s, kmax)
            val = (alpha @ E).real + TWO_PI * (s + 0.5 / N) - th
            der = (ak @ E).real + TWO_PI
            sn = s - val / der
            pos = val > 0
            hi = np.where(pos, np.minimum(hi, s), hi)
            lo = np.where(pos, lo, np.maximum(lo, s))
            bad = ~((sn >= lo) & (sn <= hi))
            sn[bad] = 0.5 * (lo[bad] + hi[bad])
            step = np.max(np.abs(sn - s))
            s = sn
            if step < 1e-16:
                break
    else:
        ip = (i + 1) % M
        d0 = D1[i] * h
        d1 = D1[ip] * h
        s0 = D2[i] * h * h
        s1 = D2[ip] * h * h
        a1 = d0
        a2 = 0.5 * s0
        R0 = y1 - y0 - a1 - a2
        R1 = d1 - a1 - 2.0 * a2
        R2 = s1 - 2.0 * a2
        a3 = 10.0 * R0 - 4.0 * R1 + 0.5 * R2
        a4 = -15.0 * R0 + 7.0 * R1 - R2
        a5 = 6.0 * R0 - 3.0 * R1 + 0.5 * R2
        y = th - y0
        tau = y / (y1 - y0)
        lo = np.zeros_like(tau)
        hi = np.ones_like(tau)
        for _ in range(30):
            val = ((((a5 * tau + a4) * tau + a3) * tau + a2) * tau + a1) * tau - y
            der = (((5.0 * a5 * tau + 4.0 * a4) * tau + 3.0 * a3) * tau + 2.0 * a2) * tau + a1
            pos = val > 0
            hi = np.where(pos, tau, hi)
            lo = np.where(pos, lo, tau)
            tn = tau - val / der
            bad = ~((tn >= lo) & (tn <= hi))
            if bad.any():
                tn[bad] = 0.5 * (lo[bad] + hi[bad])
            step = np.max(np.abs(tn - tau))
            tau = tn
            if step < 1e-13:
                break
        s = (i + tau) * h
    F = s + 0.5 / N + m
    return F - F[0]


def cdf_pchip(X: np.ndarray, theta: np.ndarray = THETA) -> np.ndarray:
    """CDF by inverting the monotone cubic (PCHIP, Fritsch-Carlson/Butland) interpolant of u -> X(u).

    Periodic: node slopes are the harmonic means of the neighbouring secants (zero when one of them is zero:
    coincident particles), so the interpolant is monotone whatever the data. This is the fall-back when the
    map is no longer smooth (clusters collapsed); the inverse on each cubic piece is found by safeguarded
    Newton.
    """
    N = X.size
    h = 1.0 / N
    Xn = np.append(X, X[0] + TWO_PI)
    dX = np.diff(Xn)  # secant rises, >= 0
    dprev = np.roll(dX, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where((dX > 0) & (dprev > 0), 2.0 * dX * dprev / (dX + dprev), 0.0)  # h * X'(u_j)
    th, m = _lift_targets(theta, X[0])
    i = np.searchsorted(X, th, side="right") - 1  # X[i] <= th < Xn[i+1]
    D = dX[i]
    d0 = slope[i]
    d1 = slope[(i + 1) % N]
    a1 = d0
    a2 = 3.0 * D - 2.0 * d0 - d1
    a3 = d0 + d1 - 2.0 * D
    y = th - X[i]
    tau = y / D
    lo = np.zeros_like(tau)
    hi = np.ones_like(tau)
    for _ in range(60):
        val = ((a3 * tau + a2) * tau + a1) * tau - y
        der = (3.0 * a3 * tau + 2.0 * a2) * tau + a1
        pos = val > 0
        hi = np.where(pos, tau, hi)
        lo = np.where(pos, lo, tau)
        with np.errstate(divide="ignore", invalid="ignore"):
            tn = tau - val / der
        bad = ~((tn >= lo) & (tn <= hi))
        if bad.any():
            tn[bad] = 0.5 * (lo[bad] + hi[bad])
        step = np.max(np.abs(tn - tau))
        tau = tn
        if step < 1e-13:
            break
    F = (i + 0.5 + tau) * h + m
    return F - F[0]


def cdf_linear(X: np.ndarray, theta: np.ndarray = THETA) -> np.ndarray:
    """CDF by inverting the piecewise-linear interpolant of the quantile map (second order, monotone)."""
    N = X.size
    u = (np.arange(N) + 0.5) / N
    ue = np.concatenate((u[-1:] - 1.0, u, u[:1] + 1.0))
    Xe = np.concatenate((X[-1:] - TWO_PI, X, X[:1] + TWO_PI))
    th, m = _lift_targets(theta, X[0])
    F = np.interp(th, Xe, ue) + m
    return F - F[0]


def cdf_step(X: np.ndarray, theta: np.ndarray = THETA) -> np.ndarray:
    """Step CDF of the empirical measure: (number of particles with X mod 2 pi < theta)/N."""
    xs = np.sort(np.mod(X, TWO_PI))
    return np.searchsorted(xs, theta, side="left") / X.size


def spectral_tail(X: np.ndarray) -> float:
    """Largest trigonometric-interpolation coefficient of the quantile map over the top 5/8 of the band.

    A resolution indicator: round-off level when the map is resolved by the N particles; large (and the
    interpolant rippled by Gibbs oscillations) when clusters make the map steeper than N nodes can follow.
    """
    N = X.size
    c = np.abs(_spectral_coefficients(X)) * (2.0 / N)
    return float(c[int(0.375 * N):].max())


def reconstruct_cdf(X: np.ndarray, how: str = "spectral", theta: np.ndarray = THETA, tail_tol: float = 1e-5):
    """CDF on the grid from particle positions X (lifted) by `how`.

    how:
      "spectral": inverse of the trigonometric interpolant of the quantile map; falls back to "pchip" when
                  that interpolant is not monotone (clusters collapsed: the map is then a near-staircase
                  that no trigonometric polynomial of degree N/2 resolves).
      "auto":     "spectral" when the map is resolved (spectral_tail(X) <= tail_tol), else "pchip": the
                  rippled (Gibbs) interpolant of an unresolved map is monotone for a while but its density
                  oscillates, which spoils the cluster count; PCHIP has no ripple at the scale of the grid.
      "pchip", "linear", "step": see cdf_pchip, cdf_linear, cdf_step.
    """
    X = np.sort(X)
    if how == "auto":
        how = "spectral" if spectral_tail(X) <= tail_tol else "pchip"
    if how == "spectral":
        F = cdf_spectral(X, theta)
        return cdf_pchip(X, theta) if F is None else F
    if how == "pchip":
        return cdf_pchip(X, theta)
    if how == "linear":
        return cdf_linear(X, theta)
    if how == "step":
        return cdf_step(X, theta)
    raise ValueError(f"unknown reconstruction {how!r}")


# ----------------------------------------------------------------------------------------------------------
# The solve
# ----------------------------------------------------------------------------------------------------------
def integrate_particles(x0, beta, attention, t_eval, rtol, atol=None, method="DOP853", jacobian=True):
    """Integrate the particle ODE from t = 0; returns positions at each t in t_eval, shape (len(t_eval), N).

    method: any solve_ivp method name ("DOP853", "RK45", "LSODA", "BDF", "Radau"), or "odeint"
    (scipy.integrate.odeint, LSODA driven from Fortran: one Python call per right-hand side, no per-step
    Python overhead). The implicit/stiff ones get the analytic dense Jacobian when jacobian=True.
    """
    t_eval = np.atleast_1d(np.asarray(t_eval, dtype=float))
    N = x0.size
    if atol is None:
        atol = rtol
    f = make_velocity(N, beta, attention)
    if method == "odeint":
        tt = np.concatenate(([0.0], t_eval))
        kw = {}
        if jacobian:
            jac = make_jacobian(N, beta, attention)
            kw["Dfun"] = jac
        Y = odeint(lambda y, t: f(t, y), x0, tt, rtol=rtol, atol=atol, mxstep=10**7, **kw)
        return Y[1:]
    kw = {}
    if method in ("LSODA", "BDF", "Radau") and jacobian:
        jac = make_jacobian(N, beta, attention)
        kw["jac"] = lambda t, y: jac(y)
    if t_eval.size == 1:  # one output depth: take the last step, no dense-output evaluations
        sol = solve_ivp(f, (0.0, t_eval[0]), x0, method=method, rtol=rtol, atol=atol, **kw)
        if not sol.success:
            raise RuntimeError(sol.message)
        return sol.y[:, -1:].T
    sol = solve_ivp(f, (0.0, t_eval[-1]), x0, method=method, rtol=rtol, atol=atol, t_eval=t_eval, **kw)
    if not sol.success:
        raise RuntimeError(sol.message)
    return sol.y.T


def peer_cdf(modes, beta, attention, t_eval, N, rtol, atol=None, method="DOP853", reconstruct="spectral"):
    """CDF mu_t([0, theta_j)), theta_j = 2 pi j/1024, at each depth of t_eval: array (len(t_eval), 1024).

    Everything is done here on each call (nothing cached): quantile particles of mu_0 (N of them), the
    integration (rtol, atol, method; see integrate_particles) and the reconstruction (see reconstruct_cdf)
    at each output depth. attention: "softmax" (SA) or "unnormalised" (USA).
    """
    x0 = initial_quantiles(modes, N)
    Y = integrate_particles(x0, float(beta), attention, t_eval, rtol, atol, method)
    return np.array([reconstruct_cdf(y, reconstruct) for y in Y])


def w1_circle(F, G) -> float:
    """W1 on the circle between two CDFs on the 1024 grid: (2 pi/1024) sum |F - G - c|, c = median(F - G)."""
    d = np.asarray(F, dtype=float) - np.asarray(G, dtype=float)
    return float(TWO_PI / d.size * np.abs(d - np.median(d)).sum())


def cluster_count(F) -> int:
    """Number of clusters from a CDF on the 1024 grid.

    Bin masses dF_j = F_{j+1} - F_j (periodic, F_1024 = F_0 + 1); a cluster is a bin that is above its left
    neighbour and not below its right neighbour (periodic), with mass above twice the uniform 1/1024.
    """
    F = np.asarray(F, dtype=float)
    m = np.diff(np.append(F, F[0] + 1.0))
    left = np.roll(m, 1)
    right = np.roll(m, -1)
    return int(np.count_nonzero((m > left) & (m >= right) & (m > 2.0 / m.size)))


def merge_times(t_eval, cdfs):
    """Output depths at which the cluster count drops (from one depth to the next); returns (times, counts)."""
    counts = np.array([cluster_count(F) for F in cdfs])
    drops = np.nonzero(np.diff(counts) < 0)[0] + 1
    return np.asarray(t_eval)[drops], counts


def peer_merge_times(modes, beta, attention, t_eval, N, rtol, atol=None, method="odeint", reconstruct="spectral"):
    """Long-horizon run: returns (cdfs, cpu_seconds) with cdfs = peer_cdf(...) at every depth of t_eval.

    cpu_seconds is the process CPU time of the peer_cdf call; merge_times(t_eval, cdfs) gives the depths
    where the cluster count drops.
    """
    t0 = time.process_time()
    cdfs = peer_cdf(modes, beta, attention, t_eval, N, rtol, atol, method, reconstruct)
    return cdfs, time.process_time() - t0
