"""The stationary states of noisy tokens on the circle (theory §10): the discrete equation, its Jacobian, stability.

The stationary equation of ∂_t μ + K ∂_θ(μ v) = τ ∂²_θ μ, v = β⁻¹ ∂_θ(G∗μ), G∗μ(θ) = ∫ e^{β cos(θ−φ)} μ(φ) dφ
(USA, one head (β, K)) is the fixed point

    μ = p(μ) := exp(κ G∗μ) / ∫ exp(κ G∗μ),   κ = K/(τβ),

a smooth periodic problem: it is discretised by collocation at N equispaced points θ_i = ih, h = 2π/N (N odd,
so that no Nyquist mode exists), with the trapezoidal rule for G∗μ and ∫ — spectrally accurate for the analytic
kernel, so the thresholds K_c, β* of the discrete problem equal the exact ones to round-off at N ≈ 60. (The DG0
Scharfetter–Gummel scheme's stationary states converge at its order 2 only; :mod:`mfpde.tokens.circle.noise`.)

The translations θ ↦ θ + a map stationary states to stationary states: the unknowns are restricted to the even
states μ(−θ) = μ(θ) (values at i = 0..(N−1)/2, m = (N+1)/2 unknowns), which removes the translation's null
direction of the Jacobian without a phase condition. The residual F(u, K) = R(μ − p(μ)), μ = E u (E the even
extension, R the restriction), has the exact Jacobian

    ∂F/∂u = R (I − κ (diag p − h p pᵀ) A) E,   ∂F/∂K = −(τβ)⁻¹ R (diag p − h p pᵀ) A μ,

A_ij = h e^{β cos(θ_i − θ_j)} (dense: N ≲ 200 here). Stability is that of the evolution: the collocation
linearisation L δμ = τ D² δμ − K D(δμ v + μ δv), δv = β⁻¹ D A δμ (D the Fourier differentiation matrix), on
the mass-zero perturbations (L maps onto them), without the translation mode D μ (eigenvalue 0 off the uniform
state). About the uniform state its eigenvalues are K k² I_k(β)/β − τ k² (theory §10).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import scipy.linalg
import scipy.special

from mfpde.stability import leading_eigenpairs, linearly_stable

__all__ = ["CircleStationary"]

Array = npt.NDArray[np.float64]


class CircleStationary:
    """The discrete stationary equation on N (odd) collocation points, β, τ fixed; K the parameter.

    Args:
        points: N, odd, ≥ 9.
        beta: β ≥ 0 of the head (its a).
        noise: τ > 0.

    Raises:
        ValueError: N even or < 9, τ ≤ 0, β < 0.
    """

    domain = "circle"

    def __init__(self, points: int, beta: float, noise: float):
        if points < 9 or points % 2 == 0:
            raise ValueError(f"the collocation needs an odd number of points >= 9, got {points}")
        if not noise > 0 or not beta >= 0:
            raise ValueError(f"need τ > 0 and β >= 0, got τ = {noise}, β = {beta}")
        N = self.N = points
        self.beta, self.noise = float(beta), float(noise)
        self.h = 2 * math.pi / N
        self.theta = self.h * np.arange(N)
        d = self.theta[:, None] - self.theta[None, :]
        self.A = self.h * np.exp(self.beta * np.cos(d))
        self.m = (N + 1) // 2
        idx = np.minimum(np.arange(N), N - np.arange(N))  # μ_i = μ_{N−i}: the index of i's even unknown
        self.E = np.zeros((N, self.m))
        self.E[np.arange(N), idx] = 1.0
        self.R = np.eye(N)[: self.m]
        j = np.arange(N)
        diff = j[:, None] - j[None, :]
        with np.errstate(divide="ignore"):
            D = 0.5 * (-1.0) ** diff / np.sin(diff * self.h / 2)
        D[diff == 0] = 0.0
        self.D = D  # the Fourier differentiation matrix of odd N (Trefethen, Spectral Methods in MATLAB, ch. 3)
        self.Q = scipy.linalg.null_space(np.ones((1, N)))  # orthonormal basis of the mass-zero vectors, (N, N−1)

    # -- states ---------------------------------------------------------------------------------
    def uniform(self) -> Array:
        """The uniform state 1/2π as even unknowns, shape (m,)."""
        return np.full(self.m, 1.0 / (2 * math.pi))

    def density(self, u: Array) -> Array:
        """μ at the N points from the even unknowns u (m,), shape (N,)."""
        return self.E @ u

    def mode_state(self, k: int) -> Array:
        """Cos kθ as even unknowns (the null vector of the uniform state's Jacobian at K = τβ/I_k(β)), shape (m,)."""
        return np.cos(k * self.theta[: self.m])

    def threshold(self, k: int) -> float:
        """τβ/I_k(β): where mode k of the uniform state turns unstable (theory §10)."""
        return self.noise * self.beta / float(scipy.special.iv(k, self.beta))

    def inner_weights(self) -> Array:
        """W of the continuation's inner product on x = (u, K): (2π)²/m per unknown, 1 for K, shape (m+1,)."""
        return np.concatenate([np.full(self.m, (2 * math.pi) ** 2 / self.m), [1.0]])

    def amplitude(self, k: int) -> Array:
        """The row r with r·u = ∫ μ cos kθ dθ (mode k's amplitude), shape (m,)."""
        return self.h * self.E.T @ np.cos(k * self.theta)

    def dominant_mode(self, u: Array) -> int:
        """The mode k ≥ 1 of the largest Fourier coefficient of the density of u."""
        c = np.abs(np.fft.rfft(self.density(u)))
        c[0] = 0.0
        return int(np.argmax(c))

    def _gibbs(self, mu: Array, K: float) -> tuple[Array, float]:
        kappa = K / (self.noise * self.beta) if self.beta > 0 else 0.0
        g = kappa * (self.A @ mu)
        p = np.exp(g - g.max())
        return p / (self.h * p.sum()), kappa

    # -- the equation ---------------------------------------------------------------------------
    def residual(self, u: Array, K: float) -> Array:
        """F(u, K) = R(μ − p(μ)), shape (m,)."""
        mu = self.density(u)
        return self.R @ (mu - self._gibbs(mu, K)[0])

    def jacobian(self, u: Array, K: float) -> tuple[Array, Array]:
        """(∂F/∂u (m, m), ∂F/∂K (m,)), exact (module docstring)."""
        mu = self.density(u)
        p, kappa = self._gibbs(mu, K)
        S = np.diag(p) - self.h * np.outer(p, p)
        SA = S @ self.A
        Ju = self.R @ (np.eye(self.N) - kappa * SA) @ self.E
        JK = -(self.R @ (SA @ mu)) / (self.noise * self.beta) if self.beta > 0 else np.zeros(self.m)
        return Ju, JK

    # -- what a branch reports ----------------------------------------------------------------------
    def order_parameter(self, u: Array) -> float:
        """|μ̂_1| = |∫ μ e^{iθ} dθ| (0 uniform, 1 a point mass) of the probability density μ."""
        mu = self.density(u)
        return float(abs(self.h * np.sum(mu * np.exp(1j * self.theta))) / (self.h * mu.sum()))

    def signed_amplitude(self, u: Array) -> float:
        """∫ μ cos θ dθ (the even states' μ̂_1, with its sign: a cluster at 0 or at π)."""
        return float(self.h * np.sum(self.density(u) * np.cos(self.theta)))

    def free_energy(self, u: Array, K: float) -> float:
        """E(μ) = τ ∫ μ log μ − (K/2β) ∬ e^{β cos(θ−φ)} dμ dμ (theory §10), trapezoidal rule."""
        mu = self.density(u)
        ent = self.noise * self.h * float(np.sum(mu * np.log(np.where(mu > 0, mu, 1.0))))
        return ent - (K / (2 * self.beta) * self.h * float(mu @ self.A @ mu) if self.beta > 0 else 0.0)

    def resolved(self, u: Array, tol: float = 1e-9) -> bool:
        """Whether μ's highest Fourier coefficients are below ``tol`` times its mean (the collocation resolves it)."""
        c = np.abs(np.fft.rfft(self.density(u)))
        return bool(c[-max(2, len(c) // 8):].max() <= tol * c[0])

    def linearisation(self, u: Array, K: float) -> Array:
        """L of the evolution (module docstring) on the mass-zero vectors, in the basis Q: shape (N−1, N−1)."""
        mu = self.density(u)
        D, b = self.D, self.beta
        v = D @ (self.A @ mu) / b if b > 0 else np.zeros(self.N)
        dv = D @ self.A / b if b > 0 else np.zeros((self.N, self.N))
        L = self.noise * D @ D - K * D @ (np.diag(v) + mu[:, None] * dv)
        return self.Q.T @ L @ self.Q

    def stability(self, u: Array, K: float, count: int = 4,
                  solver: str = "slepc") -> tuple[npt.NDArray[np.complex128], bool]:
        """(the ``count`` leading eigenvalues of L without the translation mode, stable), by SLEPc or scipy.

        Args:
            u: the state (m,).
            K: the coupling.
            count: how many eigenvalues of largest real part are returned.
            solver: "slepc" (slepc4py's Krylov–Schur) or "scipy" (the dense reference, scipy.linalg.eig).

        Returns:
            (eigenvalues sorted by decreasing real part, shape (count,) complex; True if all real parts < 0 up to
            1e-9 times the largest |eigenvalue|).
        """
        Lr = self.linearisation(u, K)
        want = count + 1
        vals, vecs = leading_eigenpairs(Lr, want, solver)
        trans = self.Q.T @ (self.D @ self.density(u))
        keep = np.ones(len(vals), bool)
        if np.linalg.norm(trans) > 1e-8 * max(1.0, float(np.abs(self.density(u)).max())):
            align = np.abs(trans.conj() @ vecs) / (np.linalg.norm(trans) * np.linalg.norm(vecs, axis=0))
            keep[int(np.argmax(align))] = False  # the translation mode: eigenvalue 0, not a stability question
        vals = vals[keep][:count]
        return vals, linearly_stable(vals)
