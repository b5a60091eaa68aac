"""The strongest particle code a user would write for attention on S², with no mfpde code (the benchmark's peer).

Quadrature particles (N Gauss–Legendre nodes in cos ϑ × 2N longitudes, masses w_j μ_0(ξ_j)) moved by the attention
velocity of their own measure (theory §9), computed with the harmonic (Funk–Hecke) force

    K∗μ(x) = Σ_{ℓ ≤ L} 4π i_ℓ(β) Σ_m μ̂_ℓm Y_ℓm(x),   μ̂_ℓm = Σ_j m_j Y_ℓm(X_j),
    v = β⁻¹ ∇_S K∗μ (USA),   v = β⁻¹ ∇_S K∗μ / K∗μ (SA),

O(n L²) per evaluation: scipy's ``sph_harm_y_all`` gives every Y_ℓ^m and its (ϑ, φ) derivatives at once, and
∇_S Y = ∂_ϑY e_ϑ + (sin ϑ)⁻¹ ∂_φY e_φ. L is the first degree with Σ_{ℓ>L} (2ℓ+1) i_ℓ(β) < 1e-12 e^β unless given.
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

__all__ = ["harmonic_velocity", "peer_solve", "real_harmonics_grad"]


def real_harmonics_grad(L: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Y (n, (L+1)²), ∇_S Y (n, (L+1)², 3)) of the real orthonormal harmonics at x (n, 3), column ℓ² + ℓ + m."""
    r = np.linalg.norm(x, axis=1)
    th = np.arccos(np.clip(x[:, 2] / r, -1.0, 1.0))
    ph = np.mod(np.arctan2(x[:, 1], x[:, 0]), 2 * math.pi)
    y, g = scipy.special.sph_harm_y_all(L, L, th, ph, diff_n=1)  # (L+1, 2L+1, n), (L+1, 2L+1, n, 2)
    st, ct, sp, cp = np.sin(th), np.cos(th), np.sin(ph), np.cos(ph)
    e_th = np.stack([ct * cp, ct * sp, -st], axis=1)
    e_ph = np.stack([-sp, cp, np.zeros_like(sp)], axis=1)
    inv = 1.0 / np.maximum(st, 1e-300)
    ll = np.repeat(np.arange(L + 1), 2 * np.arange(L + 1) + 1)
    m = np.concatenate([np.arange(-k, k + 1) for k in range(L + 1)])
    scale = np.where(m == 0, 1.0, math.sqrt(2.0) * (-1.0) ** np.abs(m))[:, None]

    def pick(z: np.ndarray) -> np.ndarray:  # Re for m ≥ 0, Im for m < 0, scaled
        return np.asarray(np.where((m >= 0)[:, None], z.real, z.imag) * scale)

    Y = pick(y[ll, np.abs(m)]).T  # (n, (L+1)²)
    dth, dph = pick(g[ll, np.abs(m), :, 0]).T, pick(g[ll, np.abs(m), :, 1]).T
    G = dth[:, :, None] * e_th[:, None, :] + (dph * inv[:, None])[:, :, None] * e_ph[:, None, :]
    return Y, G


def harmonic_velocity(x: np.ndarray, w: np.ndarray, beta: float, softmax: bool, L: int) -> np.ndarray:
    """The attention velocity (n, 3) of the particles x (n, 3) with masses w (n,) at themselves."""
    Y, G = real_harmonics_grad(L, x)
    lam = 4 * math.pi * scipy.special.spherical_in(np.repeat(np.arange(L + 1), 2 * np.arange(L + 1) + 1), beta)
    c = lam * (Y.T @ w)
    grad = np.einsum("nkd,k->nd", G, c) / beta
    return grad / (Y @ c)[:, None] if softmax else grad


def series_degree(beta: float, tol: float = 1e-12) -> int:
    """The first L with the Bessel tail Σ_{ℓ>L} (2ℓ+1) i_ℓ(β) < tol e^β (theory §9's rule)."""
    ll = np.arange(400)
    terms = (2 * ll + 1) * scipy.special.spherical_in(ll, beta)
    tail = np.cumsum(terms[::-1])[::-1]  # tail[k] = Σ_{ℓ ≥ k}
    return int(np.flatnonzero(tail < tol * math.exp(beta))[0]) - 1


def peer_solve(modes: list[list[float]], beta: float, attention: str, N: int, T: float, t_out: np.ndarray,
               rtol: float = 1e-10, L: int | None = None, L_power: int = 16) -> dict:
    """Particles, μ̂_ℓm and degree powers (ℓ ≤ L_power) at ``t_out``; ``cpu_s`` is the solve's process time."""
    t, wt = np.polynomial.legendre.leggauss(N)
    ph = (np.arange(2 * N) + 0.5) * math.pi / N
    s = np.sqrt(1 - t * t)
    xi = np.stack([np.outer(s, np.cos(ph)), np.outer(s, np.sin(ph)), np.outer(t, np.ones(2 * N))], -1).reshape(-1, 3)
    wq = np.outer(wt, np.full(2 * N, math.pi / N)).ravel()
    Lm = max(int(mo[0]) for mo in modes)
    Y0, _ = real_harmonics_grad(Lm, xi)
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
        return harmonic_velocity(y.reshape(n, 3), w, beta, softmax, L).ravel()

    cpu = time.process_time()
    sol = scipy.integrate.solve_ivp(rhs, (0.0, T), xi.ravel(), method="DOP853", t_eval=t_out, rtol=rtol, atol=rtol)
    cpu = time.process_time() - cpu
    X = sol.y.T.reshape(-1, n, 3)
    X /= np.linalg.norm(X, axis=2, keepdims=True)
    co = np.array([real_harmonics_grad(L_power, x)[0].T @ w for x in X])
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
            k = np.exp(beta * (x @ x.T)) * w
            num = k @ x / (k.sum(1, keepdims=True) if softmax else 1.0)
            direct = num - np.sum(num * x, 1)[:, None] * x
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
