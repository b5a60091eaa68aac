"""Noisy tokens on the circle: the drift–diffusion step by the Scharfetter–Gummel flux, and the free energy.

Solves theory §10 on the circle,

    ∂_t μ + ∂_θ(μ u) = τ ∂²_θ μ,   u = Σ_h c_h Z_h⁻¹ ∫ e^{β_h cos(φ−θ)} sin(φ−θ) dμ(φ)

(USA: Z_h ≡ 1; for a single Dirac head (β, K) this is ∂_t μ + K ∂_θ(μ v) = τ ∂²_θ μ, v = β⁻¹ ∂_θ(e^{β cos}∗μ)).
Only DG0 (the finite-volume scheme of cell means) carries noise: the edge flux is the Scharfetter–Gummel
(exponentially fitted) flux of the edge velocity u_e and the two neighbouring cell values,

    F = (τ/h) [B(−P) μ_left − B(P) μ_right],   P = u_e h/τ,   B(x) = x/(eˣ − 1) ≥ 0,

which is the upwind flux as τ → 0 and the centred diffusion flux as u_e → 0, exact for the constant-coefficient
1-D flux (Scharfetter & Gummel, IEEE Trans. Electron Devices 16, 1969; the Θ side's EAFE,
:mod:`mfpde.params.eafe`, is its finite-element form). Positivity: forward Euler gives
μ_j⁺ = (1 − Δt τ/h² (B(P_j) + B(−P_{j+1}))) μ_j + (Δt τ/h²)(B(−P_j) μ_{j−1} + B(P_{j+1}) μ_{j+1}), all
coefficients ≥ 0 when Δt τ/h² max_j (B(P_j) + B(−P_{j+1})) ≤ cfl ≤ 1 (:meth:`NoisyCircleTransport.max_stable_dt`);
SSP-RK3 is a convex combination of such steps. The fluxes telescope: the mass is conserved to round-off.

The free energy (USA; the Wasserstein gradient flow's Lyapunov functional, theory §10)

    E(μ) = τ ∫ μ log μ − Σ_h (c_h/2β_h) ∬ e^{β_h cos(θ−φ)} dμ(θ) dμ(φ)

is evaluated by the Gauss rule of μ_h and FFT convolutions (:func:`free_energy`); heads with β_h = 0 (zero
velocity) add a constant and are left out.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
import scipy.special

from mfpde.heads import HeadMeasure
from mfpde.tokens.circle.dg import CircleMesh, CircleTransport

__all__ = ["NoisyCircleTransport", "bernoulli", "circle_operator", "free_energy"]

Array = npt.NDArray[np.float64]


def bernoulli(x: Array) -> Array:
    """B(x) = x/(eˣ − 1) (B(0) = 1), without cancellation or overflow (0 for large x, |x| for large −x)."""
    with np.errstate(over="ignore"):
        return np.asarray(1.0 / scipy.special.exprel(np.asarray(x, float)), float)


class NoisyCircleTransport(CircleTransport):
    """DG0 on the circle with noise τ > 0: the Scharfetter–Gummel flux (module docstring).

    Args:
        mesh: the circle mesh (degree 0).
        noise: τ > 0.
        attention, cfl, max_dt: as :class:`CircleTransport`.

    Raises:
        ValueError: a degree other than 0, or τ ≤ 0.
    """

    def __init__(self, mesh: CircleMesh, noise: float, attention: str = "unnormalised", cfl: float = 0.4,
                 max_dt: float | None = None):
        if mesh.degree != 0:
            raise ValueError(f"noise needs DG degree 0 (the Scharfetter–Gummel scheme), got {mesh.degree}")
        if not noise > 0:
            raise ValueError(f"noise must be > 0, got {noise}")
        super().__init__(mesh, attention, cfl, max_dt)
        self.noise = float(noise)

    def _coefficients(self, ue: Array) -> tuple[Array, Array]:
        """(B(−P), B(P)) at the left edge of every cell, shape (n,) each."""
        P = ue * self.mesh.h / self.noise
        return bernoulli(-P), bernoulli(P)

    def rate(self, state: Array, vel: tuple[Array, Array, float]) -> tuple[Array, float]:
        """(dμ/dt = (F_j − F_{j+1})/h with F_j the SG flux at the left edge of cell j, 0.0), shape (n, 1)."""
        h = self.mesh.h
        bm, bp = self._coefficients(vel[1])
        mu = state[:, 0]
        F = (self.noise / h) * (bm * np.roll(mu, 1) - bp * mu)
        return ((F - np.roll(F, -1)) / h)[:, None], 0.0

    def max_stable_dt(self, vel: tuple[Array, Array, float]) -> Array:
        """The positive forward-Euler step cfl·h²/(τ max_j (B(P_j) + B(−P_{j+1}))), capped; shape (1,)."""
        _, ue, cap = vel
        if not np.all(np.isfinite(ue)):
            return np.array([math.nan])
        bm, bp = self._coefficients(ue)
        out = float(np.max(bp + np.roll(bm, -1))) * self.noise / self.mesh.h**2
        return np.array([min(self.cfl / out if out > 0 else math.inf, cap)])


    def diffusion_substeps(self, dt: float) -> float:
        """The sub-steps a depth step dt needs for the noise alone (u = 0: B = 1): 2 dt τ/(cfl h²)."""
        return 2.0 * dt * self.noise / (self.cfl * self.mesh.h**2)


def circle_operator(mesh: CircleMesh, tokens: Any) -> CircleTransport:
    """The DG operator of ``[tokens]``: :class:`NoisyCircleTransport` if ``tokens.noise`` > 0, else upwind DG."""
    if tokens.noise > 0:
        return NoisyCircleTransport(mesh, tokens.noise, tokens.attention, tokens.cfl)
    return CircleTransport(mesh, tokens.attention, tokens.cfl)


def interaction(mesh: CircleMesh, mu: Array, beta: float) -> float:
    """∬ e^{β cos(θ−φ)} dμ_h dμ_h by the Gauss rule of μ_h (circulant in the cell index: FFTs)."""
    m = mesh.weights(mu)  # (n, p+1)
    j = np.arange(mesh.n)
    shift = (j[None, None, :] + mesh.s[None, :, None] - mesh.s[:, None, None]) * mesh.h  # (r, q, n)
    g = np.fft.rfft(np.exp(beta * np.cos(shift)), axis=-1)  # even kernel: the sign of the shift is immaterial
    mhat = np.fft.rfft(m, axis=0).T  # (q, n//2+1)
    conv = np.fft.irfft(np.einsum("rqk,qk->rk", np.conj(g), mhat), mesh.n, axis=-1)  # (r, n)
    return float(np.sum(conv.T * m))


def free_energy(mesh: CircleMesh, mu: Array, heads: HeadMeasure, noise: float) -> float:
    """E(μ_h) of theory §10 (module docstring), non-dimensional; −∞-free: μ log μ = 0 where μ = 0."""
    mu = np.asarray(mu, float)
    ent = 0.0
    if noise > 0:
        pos = np.where(mu > 0, mu, 1.0)
        ent = noise * float(np.sum(mesh.weights(mu * np.log(pos))))
    e = ent
    for beta, c in zip(heads.a, heads.c, strict=True):
        if abs(float(beta)) > 1e-12:
            e -= float(c) / (2 * float(beta)) * interaction(mesh, mu, float(beta))
    return e
