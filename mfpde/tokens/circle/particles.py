"""An independent particle code on the circle (theory §9): N tokens θ_i, the attention ODE, two force evaluations.

    dθ_i/dt = u_N(θ_i),   u_N(θ) = Σ_h c_h Z_h(θ)^{-1} (1/N) Σ_j e^{β_h cos(θ_j − θ)} sin(θ_j − θ)

(Z_h = (1/N) Σ_j e^{β_h cos(θ_j − θ)} for softmax, 1 for the unnormalised variant). Nothing is shared with the
PDE solver (:mod:`mfpde.tokens.circle.dg`): no mesh, no FFT, no rk.py.

* :func:`dense_velocity`: the O(N²) pairwise sum, as the particle codes of the literature do it.
* :func:`bessel_velocity`: the same sum through the Fourier series of the kernel, e^{β cos ψ} = I₀(β) +
  2 Σ_k I_k(β) cos kψ, hence e^{β cos ψ} sin ψ = −β⁻¹ d/dψ e^{β cos ψ} = (2/β) Σ_k k I_k(β) sin kψ: with the
  empirical moments S_k = (1/N) Σ_j e^{ikθ_j}, u_N(θ) = (2/β) Σ_k k I_k(β) Im(e^{−ikθ} S_k). O(N K); the series is
  cut where I_k(β) e^{−β} < 1e-17 (exact to round-off).
* :func:`transport_particles`: classical RK4 (or explicit Euler, as the reference notebook) with a fixed step.
* :func:`sample_modes`: N i.i.d. draws of (1/2π)(1 + Σ a cos(k(θ − φ))) by inverting its closed-form CDF.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import scipy.special

__all__ = ["bessel_velocity", "dense_velocity", "dense_velocity_derivative", "sample_modes", "transport_particles"]

Array = npt.NDArray[np.float64]


def dense_velocity(theta: Array, beta: float, softmax: bool, chunk: int = 2048) -> Array:
    """u_N at the particles by the pairwise sum (the notebook's −(1/N) Σ_j e^{β cos(θ_i−θ_j)} sin(θ_i−θ_j))."""
    out = np.empty(len(theta))
    for s in range(0, len(theta), chunk):
        d = theta[None, :] - theta[s:s + chunk, None]  # θ_j − θ_i
        e = np.exp(beta * (np.cos(d) - (1.0 if softmax else 0.0)))
        num = (e * np.sin(d)).mean(axis=1)
        out[s:s + chunk] = num / e.mean(axis=1) if softmax else num
    return out


def dense_velocity_derivative(theta: Array, beta: float, softmax: bool) -> Array:
    """u_N'(θ_i) (the θ-derivative of the field, particles fixed) by pairwise sums, d_ij = θ_j − θ_i.

    N = (1/N) Σ_j e^{β cos d} sin d, N' = −(1/N) Σ_j e^{β cos d}(cos d − β sin² d); Z = (1/N) Σ_j e^{β cos d},
    Z' = (1/N) Σ_j β sin d e^{β cos d}; u' = N' (USA), (N'Z − NZ')/Z² (SA).
    """
    d = theta[None, :] - theta[:, None]
    e = np.exp(beta * (np.cos(d) - (1.0 if softmax else 0.0)))
    s, c = np.sin(d), np.cos(d)
    N, dN = (e * s).mean(axis=1), -(e * (c - beta * s * s)).mean(axis=1)
    if not softmax:
        return np.asarray(dN, dtype=np.float64)
    Z, dZ = e.mean(axis=1), (beta * s * e).mean(axis=1)
    return np.asarray((dN * Z - N * dZ) / (Z * Z), dtype=np.float64)


def _series_length(beta: float) -> int:
    k = 1
    while scipy.special.ive(k, abs(beta)) > 1e-17:
        k += 1
    return k


def bessel_velocity(theta: Array, beta: float, softmax: bool, at: Array | None = None) -> Array:
    """u_N at the points ``at`` (default: the particles) by the Bessel series of the kernel; shape of ``at``."""
    x = theta if at is None else at
    K = _series_length(beta)
    k = np.arange(1, K + 1)
    Sk = np.exp(1j * np.outer(k, theta)).mean(axis=1)  # (K,)
    Ik = scipy.special.ive(k, beta)  # I_k(β) e^{−β}
    ph = np.exp(-1j * np.outer(x, k)) * Sk[None, :]  # (M, K)
    num = (2.0 / beta) * (ph.imag @ (k * Ik))
    if softmax:
        return np.asarray(num / (scipy.special.ive(0, beta) + 2.0 * (ph.real @ Ik)), dtype=np.float64)
    return np.asarray(num * math.exp(beta), dtype=np.float64)


def transport_particles(theta0: Array, beta: float, softmax: bool, T: float, steps: int, method: str = "rk4",
                        velocity: Callable[[Array, float, bool], Array] = bessel_velocity) -> Array:
    """The particles at depth T after ``steps`` fixed steps of RK4 (or ``"euler"``); a new array (not wrapped)."""
    th, dt = np.array(theta0, dtype=float), T / steps
    for _ in range(steps):
        k1 = velocity(th, beta, softmax)
        if method == "euler":
            th = th + dt * k1
            continue
        k2 = velocity(th + 0.5 * dt * k1, beta, softmax)
        k3 = velocity(th + 0.5 * dt * k2, beta, softmax)
        k4 = velocity(th + dt * k3, beta, softmax)
        th = th + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
    return th


def sample_modes(N: int, modes: list[list[float]], rng: np.random.Generator) -> Array:
    """N i.i.d. angles of the density (1/2π)(1 + Σ a cos(k(θ − φ))) (Σ|a| < 1), by bisection on its CDF.

    F(θ) = (θ + Σ (a/k)(sin(k(θ − φ)) + sin(kφ)))/2π is increasing; 60 bisections give 2π·2⁻⁶⁰ accuracy.
    """
    u = rng.random(N)

    def F(t: Array) -> Array:
        return (t + sum((a / k) * (np.sin(k * (t - ph)) + np.sin(k * ph)) for k, a, ph in modes)) / (2 * math.pi)

    lo, hi = np.zeros(N), np.full(N, 2 * math.pi)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        below = F(mid) < u
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return 0.5 * (lo + hi)
