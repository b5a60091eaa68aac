"""The strongest particle code a user would write for attention on S², with no mfpde code (the benchmark's peer).

Quadrature particles (N Gauss–Legendre nodes in cos ϑ × 2N longitudes, masses w_j μ_0(ξ_j)) moved by the attention
velocity of their own measure (theory §9), computed with the harmonic (Funk–Hecke) force

    ∫ e^{β x·y} f(y) dμ(y) = Σ_{ℓ ≤ L} 4π i_ℓ(β) Σ_m (fμ)^_ℓm Y_ℓm(x),   (fμ)^_ℓm = Σ_j m_j f(X_j) Y_ℓm(X_j),

for f = 1 (Z) and f = y_i (the numerator N), v = P_x N/Z (SA) or P_x N (USA): four transforms of degree L and one
evaluation of the harmonics (scipy's ``sph_harm_y_all``, every Y_ℓ^m at once; no derivatives and no pole
singularity), O(n L²) per evaluation. L is the first degree with Σ_{ℓ>L} (2ℓ+1) i_ℓ(β) < 1e-12 e^β unless given.
Or (``force="direct"``) the direct O(n²) sum, one n × n kernel matrix e^{β X Xᵀ} by BLAS and two products: the
cheaper force for few particles, exact at any β (SA shifted by each row's maximum).
The ODE is integrated by scipy's DOP853 (``solve_ivp``) in R³ with the harmonics at X/|X|; outputs are projected
onto the sphere. The real orthonormal Y_ℓm follow the usual convention (√2 (−1)^m Re/Im of Y_ℓ^{|m|}), so
``modes = [[ℓ, m, a], ...]`` means μ_0 = 1/4π + Σ a Y_ℓm.

    python bench/sphere_peer.py    # a self-check against the direct sum and the growth rate of ℓ = 3
"""

from __future__ import annotations

import math
import time

import numpy as np
import scipy.integrate
import scipy.special

__all__ = ["direct_velocity", "harmonic_velocity", "peer_solve", "real_harmonics", "series_degree"]


def real_harmonics(L: int, x: np.ndarray) -> np.ndarray:
    """The real orthonormal harmonics Y (n, (L+1)²) at x (n, 3) (any radius: at x/|x|), column ℓ² + ℓ + m."""
    r = np.linalg.norm(x, axis=1)
    th = np.arccos(np.clip(x[:, 2] / r, -1.0, 1.0))
    ph = np.mod(np.arctan2(x[:, 1], x[:, 0]), 2 * math.pi)
    y = scipy.special.sph_harm_y_all(L, L, th, ph)  # (L+1, 2L+1, n), orders m at index m mod 2L+1
    ll = np.repeat(np.arange(L + 1), 2 * np.arange(L + 1) + 1)
    m = np.concatenate([np.arange(-k, k + 1) for k in range(L + 1)])
    z = y[ll, np.abs(m)]
    scale = np.where(m == 0, 1.0, math.sqrt(2.0) * (-1.0) ** np.abs(m))[:, None]
    return np.asarray((np.where((m >= 0)[:, None], z.real, z.imag) * scale).T)


def harmonic_velocity(x: np.ndarray, w: np.ndarray, beta: float, softmax: bool, L: int) -> np.ndarray:
    """The attention velocity (n, 3) of the particles x (n, 3) (unit vectors) with masses w (n,) at themselves.

    Funk–Hecke for the four measures μ and y_i μ: Z = ∫ e^{βx·y} dμ and N_i = ∫ e^{βx·y} y_i dμ(y) are
    Σ 4π i_ℓ(β) (coefficients) Y_ℓm(x); v = P_x N / Z (SA) or P_x N (USA).
    """
    Y = real_harmonics(L, x)
    lam = 4 * math.pi * scipy.special.spherical_in(np.repeat(np.arange(L + 1), 2 * np.arange(L + 1) + 1), beta)
    moments = Y.T @ (w[:, None] * np.column_stack([np.ones(len(x)), x]))  # ((L+1)², 4)
    ZN = Y @ (lam[:, None] * moments)  # (n, 4)
    N = ZN[:, 1:] / ZN[:, :1] if softmax else ZN[:, 1:]
    return N - np.sum(N * x, axis=1)[:, None] * x


def direct_velocity(x: np.ndarray, w: np.ndarray, beta: float, softmax: bool) -> np.ndarray:
    """The attention velocity (n, 3) of the particles x (n, 3) with masses w (n,), by the direct O(n²) sum."""
    e = beta * (x @ x.T)
    if softmax:
        e -= e.max(axis=1, keepdims=True)
    k = np.exp(e) * w
    num = k @ x
    if softmax:
        num /= k.sum(axis=1, keepdims=True)
    return num - np.sum(num * x, axis=1)[:, None] * x


def series_degree(beta: float, tol: float = 1e-12) -> int:
    """The first L with the Bessel tail Σ_{ℓ>L} (2ℓ+1) i_ℓ(β) < tol e^β (theory §9's rule)."""
    ll = np.arange(400)
    terms = (2 * ll + 1) * scipy.special.spherical_in(ll, beta)
    tail = np.cumsum(terms[::-1])[::-1]  # tail[k] = Σ_{ℓ ≥ k}
    return int(np.flatnonzero(tail < tol * math.exp(beta))[0]) - 1


def peer_solve(modes: list[list[float]], beta: float, attention: str, N: int, T: float, t_out: np.ndarray,
               rtol: float = 1e-10, L: int | None = None, L_power: int = 16, force: str = "harmonic") -> dict:
    """Particles, μ̂_ℓm and degree powers (ℓ ≤ L_power) at ``t_out``; ``cpu_s`` is the solve's process time.

    ``force``: "harmonic" (the Funk–Hecke series of degree L) or "direct" (the O(n²) sum).
    """
    if force not in ("harmonic", "direct"):
        raise ValueError(f"force must be 'harmonic' or 'direct', got {force!r}")
    t, wt = np.polynomial.legendre.leggauss(N)
    ph = (np.arange(2 * N) + 0.5) * math.pi / N
    s = np.sqrt(1 - t * t)
    xi = np.stack([np.outer(s, np.cos(ph)), np.outer(s, np.sin(ph)), np.outer(t, np.ones(2 * N))], -1).reshape(-1, 3)
    wq = np.outer(wt, np.full(2 * N, math.pi / N)).ravel()
    Lm = max(int(mo[0]) for mo in modes)
    Y0 = real_harmonics(Lm, xi)
    mu0 = np.full(len(xi), 1 / (4 * math.pi))
    for ll, m, a in modes:
        mu0 += a * Y0[:, int(ll) ** 2 + int(ll) + int(m)]
    w = wq * mu0
    w /= w.sum()
    L = series_degree(beta) if L is None else L
    softmax = attention == "softmax"
    n = len(w)
    nfev = 0

    def rhs(_t: float, y: np.ndarray) -> np.ndarray:
        nonlocal nfev
        nfev += 1
        X = y.reshape(n, 3)
        X = X / np.linalg.norm(X, axis=1, keepdims=True)
        if force == "direct":
            return direct_velocity(X, w, beta, softmax).ravel()
        return harmonic_velocity(X, w, beta, softmax, L).ravel()

    cpu = time.process_time()
    sol = scipy.integrate.solve_ivp(rhs, (0.0, T), xi.ravel(), method="DOP853", t_eval=t_out, rtol=rtol, atol=rtol)
    cpu = time.process_time() - cpu
    X = sol.y.T.reshape(-1, n, 3)
    X /= np.linalg.norm(X, axis=2, keepdims=True)
    co = np.array([real_harmonics(L_power, x).T @ w for x in X])
    power = np.array([[np.sum(c[ll * ll:(ll + 1) ** 2] ** 2) for ll in range(L_power + 1)] for c in co])
    return {"t": sol.t, "x": X, "w": w, "coefficients": co, "power": power, "cpu_s": cpu, "nfev": nfev, "L": L,
            "success": bool(sol.success)}


def _selfcheck() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    w = rng.uniform(0.5, 1.5, 300)
    w /= w.sum()
    for beta in (5.0, 9.0):
        for softmax in (True, False):
            direct = direct_velocity(x, w, beta, softmax)
            v = harmonic_velocity(x, w, beta, softmax, series_degree(beta))
            print(f"β={beta:g} {'SA' if softmax else 'USA'}: |harmonic − direct| / |direct| = "
                  f"{np.abs(v - direct).max() / np.abs(direct).max():.1e}")
    beta, ll = 5.0, 3
    g = ll * (ll + 1) * scipy.special.spherical_in(ll, beta) / beta / scipy.special.spherical_in(0, beta)
    ts = np.linspace(0, 3 / g, 7)
    amps = [peer_solve([[ll, 1, s * 1e-6]], beta, "softmax", 12, ts[-1], ts, rtol=1e-12)["coefficients"][:, 13]
            for s in (1, -1)]
    rate = np.polyfit(ts, np.log(np.abs(amps[0] - amps[1]) / 2), 1)[0]
    print(f"SA β=5 ℓ=3 rate {rate:.10f}, theory {g:.10f}, relative error {abs(rate / g - 1):.1e}")


if __name__ == "__main__":
    _selfcheck()
