"""The even stationary states of noisy tokens on the circle in Fourier coefficients, where the kernel is diagonal.

The same equation as :mod:`mfpde.tokens.circle.stationary` (theory §10): μ = p(μ) := exp(κ G∗μ)/∫exp(κ G∗μ),
κ = K/(τβ), G∗μ(θ) = ∫ e^{β cos(θ−φ)} μ(φ) dφ, on the even states μ(θ) = Σ_{k=0}^{M} c_k cos kθ. The unknowns are
the cosine coefficients c_0..c_M (M = (N−1)/2, N = ``continuation.points``): the convolution is diagonal,
G∗cos kθ = λ_k cos kθ with λ_k = 2π I_k(β) exactly, so the Gibbs exponent costs O(M²) and no N × N kernel
matrix is formed. The nonlinearity is evaluated at the N equispaced angles (the half 0..M of them, by the
even symmetry) and projected back by the trapezoidal rule (exact for the cosines of degree ≤ M on N odd
points): with T the projection, C the synthesis (values at the half grid), w the half grid's weights of ∫,

    F(c, K) = c − T p,   ∂F/∂c = I − κ T (diag p − p (w∘p)ᵀ) C Λ,   ∂F/∂K = −(τβ)⁻¹ T (diag p − p (w∘p)ᵀ) C Λ c,

Λ = diag(λ_k). This is the collocation of :class:`~mfpde.tokens.circle.stationary.CircleStationary` on the same
N points written in the basis in which its kernel is diagonal (with the kernel's exact eigenvalues instead of
their trapezoidal aliases, which differ by I_{N−k}(β)): K_c = τβ/I_1(β) to round-off, the branch points and
folds equal to the collocation's to Newton's tolerance. Newton's method is numpy's (:class:`DenseNewton`: no
PETSc), the matrices are (M+1) × (M+1).

Stability. The evolution linearised about a stationary μ is L δμ = ∂_θ(μ ∂_θ(H δμ)), H δμ = τ δμ/μ −
(K/β) G∗δμ (a Wasserstein gradient flow: L = −𝓜H with 𝓜 = −∂_θ μ ∂_θ ≥ 0). About an even μ the cosine and sine
perturbations decouple; in each block (degrees 1..M, mass zero) the Galerkin matrices H_jk = ⟨φ_j, H φ_k⟩ and
M_jk = ∫ μ φ_j′ φ_k′ (the trapezoidal rule on 4M + 3 points) give L = −G⁻¹ M G⁻¹ H (G = π I, the Gram matrix),
whose eigenvalues are those of the symmetric −Rᵀ H R/π² (M = R Rᵀ): real, by a symmetric eigensolver. The
translation mode (δμ = μ′, a sine, eigenvalue 0 off the uniform state) is left out. About the uniform state the
eigenvalues are K k² I_k(β)/β − τ k², each twice (cosine and sine), as the collocation's.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from mfpde.tokens.bessel import iv_orders
from mfpde.tokens.spectral_gibbs import SpectralGibbs

__all__ = ["CircleSpectral"]

Array = npt.NDArray[np.float64]


class CircleSpectral(SpectralGibbs):
    """The even stationary states in the cosine coefficients c_0..c_{M′}; β, τ fixed, K the parameter.

    N = ``points`` equispaced angles carry the nonlinearity (its resolution: the states' sharpness); the unknowns are
    the coefficients of the degrees k ≤ M′ = min((N−1)/2, the first k with 2 I_k(β) < 1e-18 I_0(β)): beyond M′ the
    kernel's eigenvalues vanish to round-off, so that the Gibbs exponent κ G∗μ, hence μ = p(μ) itself, depends on
    those coefficients alone (the higher ones of μ follow from them: the density of a point is p(c), exact at any
    angle).

    Args:
        points: N, odd, ≥ 9.
        beta: β > 0 of the head (its a), ≤ 700.
        noise: τ > 0.

    Raises:
        ValueError: N even or < 9, τ ≤ 0, β ≤ 0.
    """

    domain = "circle"
    discretisation = "spectral"
    #: the continuation solves it by numpy's Newton (:class:`mfpde.continuation_newton.DenseNewton`), not PETSc's SNES
    dense_newton = True
    #: the kernel's eigenvalues below this times λ_0 are dropped (with the coefficients they multiply)
    KERNEL_TOL = 1e-18
    #: the stability blocks stop 2 degrees beyond the state's last coefficient above this times its mean
    BLOCK_TOL = 1e-14

    def __init__(self, points: int, beta: float, noise: float):
        if points < 9 or points % 2 == 0:
            raise ValueError(f"the spectral discretisation needs an odd number of points >= 9, got {points}")
        if not noise > 0 or not beta > 0:
            raise ValueError(f"need τ > 0 and β > 0, got τ = {noise}, β = {beta}")
        N = self.N = int(points)
        self.beta, self.noise = float(beta), float(noise)
        M = self.M = (N - 1) // 2
        self._iv = iv_orders(M + 1, self.beta)  # I_k(β), k = 0..M+1 (Miller's recurrence: no scipy)
        small = np.nonzero(2 * self._iv[1:] < self.KERNEL_TOL * self._iv[0])[0]
        self.m = min(M, int(small[0]) + 1 if len(small) else M) + 1  # unknowns c_0..c_{M′}
        self.k = np.arange(self.m)
        self.h = 2 * math.pi / N
        self.theta = self.h * np.arange(M + 1)  # the half grid 0..M of the N angles
        allk = np.arange(M + 1)
        cos = np.cos(np.outer(self.theta, allk))
        self.w = np.full(M + 1, 2 * self.h)  # ∫_0^{2π} f of an even f from its half-grid values (trapezoidal)
        self.w[0] = self.h
        norm = np.where(allk == 0, 1 / (2 * math.pi), 1 / math.pi)
        self.T_all = norm[:, None] * (cos * self.w[:, None]).T  # all M + 1 coefficients from half-grid values
        self.T = self.T_all[: self.m]
        self.C = cos[:, : self.m]  # values at the half grid from the unknowns
        self.lam = 2 * math.pi * self._iv[: self.m]  # λ_k = 2π I_k(β)
        self.CL = self.C * self.lam[None, :]
        self.gram = np.where(self.k == 0, 2 * math.pi, math.pi)  # ∫ cos jθ cos kθ dθ (diagonal)
        self._I = np.eye(self.m)
        self._fine: tuple[Array, ...] | None = None
        self._gibbs_setup(self.CL, self.T, self.w)
        #: what the continuation's report adds: the discretisation and its number of unknowns
        self.report_fields = {"discretisation": self.discretisation, "unknowns": self.m}

    # -- states ---------------------------------------------------------------------------------
    def uniform(self) -> Array:
        """The uniform state 1/2π: c = (1/2π, 0, ...), shape (m,)."""
        u = np.zeros(self.m)
        u[0] = 1.0 / (2 * math.pi)
        return u

    def density(self, u: Array, K: float | None = None) -> Array:
        """μ at the half grid θ_i = ih, i = 0..M (μ(−θ) = μ(θ)), shape (M+1,).

        With K: the Gibbs density p(c) of the point (c, K), the state itself where it is a solution; without, the
        sum of the unknowns' cosines (the degrees ≤ M′ of μ).
        """
        return np.array(self._gibbs(u, K)[0]) if K is not None else self.C @ u

    def mode_state(self, k: int) -> Array:
        """Cos kθ: the k-th unit vector (the null vector of the uniform state's Jacobian at τβ/I_k(β)), shape (m,)."""
        return np.array(self._I[k])

    def threshold(self, k: int) -> float:
        """τβ/I_k(β): where mode k of the uniform state turns unstable (theory §10)."""
        iv = self._iv[k] if k < len(self._iv) else iv_orders(k, self.beta)[k]
        return self.noise * self.beta / float(iv)

    def inner_weights(self) -> Array:
        """W on x = (c, K): 2π ∫ μ² dθ in the coefficients (4π², then 2π² per cosine), 1 for K, shape (m+1,).

        The collocation's weights (2π)²/m per half-grid value give the same norm of μ (to the trapezoidal rule).
        """
        return np.concatenate([2 * math.pi * self.gram, [1.0]])

    def amplitude(self, k: int) -> Array:
        """The row r with r·c = ∫ μ cos kθ dθ = π c_k (mode k's amplitude), shape (m,); 0 for k > M′."""
        r = np.zeros(self.m)
        if 0 <= k < self.m:
            r[k] = self.gram[k]
        return r

    def dominant_mode(self, u: Array) -> int:
        """The mode k ≥ 1 of the largest |c_k|."""
        c = np.abs(np.asarray(u, float))
        c[0] = 0.0
        return int(np.argmax(c))

    # -- what a branch reports ----------------------------------------------------------------------
    def order_parameter(self, u: Array) -> float:
        """|μ̂_1| = |∫ μ e^{iθ} dθ| / ∫ μ = |c_1|/(2 c_0) (0 uniform, 1 a point mass)."""
        return float(abs(u[1]) / (2 * u[0]))

    def signed_amplitude(self, u: Array) -> float:
        """∫ μ cos θ dθ = π c_1 (with its sign: a cluster at 0 or at π)."""
        return float(math.pi * u[1])

    def interaction(self, u: Array) -> float:
        """∬ e^{β cos(θ−φ)} dμ dμ = Σ_k λ_k ∫cos² kθ c_k² (exact in the coefficients: λ_k ≈ 0 beyond M′)."""
        return float(np.sum(self.lam * self.gram * u * u))

    def free_energy(self, u: Array, K: float) -> float:
        """E(μ) = τ ∫ μ log μ − (K/2β) ∬ e^{β cos(θ−φ)} dμ dμ (theory §10) of a solution (c, K).

        The entropy of μ = p(c) by the trapezoidal rule on the N angles, with log p = g − log Z exactly.
        """
        mu = self._gibbs(u, K)[0]
        ent = self.noise * float(self.w @ (mu * np.log(np.where(mu > 0, mu, 1.0))))
        return ent - K / (2 * self.beta) * self.interaction(u)

    def resolved(self, u: Array, tol: float = 1e-9) -> bool:
        """Whether μ's highest cosine coefficients at the N angles are below ``tol`` times μ̂_0.

        |μ̂_k|/2 for the top eighth of k ≤ M (the collocation's rule), μ the sum of the unknowns' cosines
        (:meth:`resolved_point`: the density of a point).
        """
        return self._tail(self.C @ np.asarray(u, float), tol)

    def resolved_point(self, x: Array, tol: float = 1e-9) -> bool:
        """:meth:`resolved` of the Gibbs density p(c) of the point x = (c, K): the state itself."""
        return self._tail(self._gibbs(x[:-1], float(x[-1]))[0], tol)

    def _tail(self, mu: Array, tol: float) -> bool:
        c = np.abs(self.T_all @ mu)
        return bool(0.5 * c[-max(2, len(c) // 8):].max() <= tol * c[0])

    # -- stability ----------------------------------------------------------------------------------
    def _fine_grid(self) -> tuple[Array, ...]:
        """The half 0..2M+1 of 4M + 3 equispaced angles: weights of ∫_0^{2π} (even integrands), bases (built once).

        (weights, λ_k cos kθ for k ≤ M′ (the Gibbs exponent), then for k = 1..M: cos kθ, sin kθ, (cos kθ)′,
        (sin kθ)′.)
        """
        if self._fine is None:
            n = 4 * self.M + 3
            th = 2 * math.pi * np.arange((n + 1) // 2) / n
            wf = np.full(len(th), 4 * math.pi / n)
            wf[0] = 2 * math.pi / n
            k = np.arange(1, self.M + 1)
            cos, sin = np.cos(np.outer(th, k)), np.sin(np.outer(th, k))
            self._fine = (wf, np.cos(np.outer(th, self.k)) * self.lam[None, :], cos, sin, -sin * k, cos * k)
        return self._fine

    def _block(self, wf: Array, mu: Array, phi: Array, dphi: Array, K: float) -> tuple[Array, Array]:
        """(−Rᵀ H R/π² of one block (module docstring): symmetric, (Mt, Mt) for the Mt columns of phi; R)."""
        H = self.noise * (phi * (wf / mu)[:, None]).T @ phi
        lam = np.zeros(phi.shape[1])
        lam[: self.m - 1] = self.lam[1:]  # λ_k ≈ 0 beyond M′
        H[np.diag_indices_from(H)] -= K / self.beta * lam * math.pi
        R = np.linalg.cholesky((dphi * (wf * mu)[:, None]).T @ dphi)
        return -(R.T @ H @ R) / math.pi**2, R

    def block_size(self, coef: Array) -> int:
        """The degrees 1..Mt of the stability blocks: 2 beyond the state's last coefficient above BLOCK_TOL μ̂_0.

        At least the unknowns' degrees, at most M. The leading eigenvectors are as smooth as the state: the blocks
        on those degrees give the leading eigenvalues to 1e-11 of the blocks on all M (measured along the β = 4
        diagram; their own round-off is 2e-12).
        """
        big = np.nonzero(np.abs(coef) >= self.BLOCK_TOL * abs(coef[0]))[0]
        return int(min(self.M, max(self.m + 1, int(big[-1]) + 2)))

    def stability(self, u: Array, K: float, count: int = 4,
                  solver: str = "dense") -> tuple[npt.NDArray[np.complex128], bool]:
        """(the ``count`` leading eigenvalues of L without the translation mode, stable): the symmetric blocks.

        The translation mode (a unit vector ŷ of the sine block's symmetric coordinates, an eigenvector of eigenvalue
        0 up to the discretisation) is moved to the bottom of the spectrum by subtracting σ ŷŷᵀ (σ: the block's
        largest entry times 10 + 1), which leaves the other eigenvalues as they were.

        Args:
            u: the state (m,).
            K: the coupling.
            count: how many eigenvalues of largest real part are returned.
            solver: ignored (the blocks are symmetric and small: numpy's eigvalsh answers).

        Returns:
            (eigenvalues sorted by decreasing real part, shape (count,) complex (real here); True if all real parts
            are < 0 up to 1e-9 times the largest |eigenvalue|); NaN and False where μ is not positive.
        """
        wf, CLf, cos, sin, dcos, dsin = self._fine_grid()
        u = np.asarray(u, float)
        g = K / (self.noise * self.beta) * (CLf @ u)
        mu = np.exp(g - g.max())
        mu /= float(wf @ mu)  # the state p(c) at the fine angles
        coef = self.T_all @ self._gibbs(u, K)[0]  # μ̂_k, k = 0..M
        Mt = self.block_size(coef)
        try:
            even = np.linalg.eigvalsh(self._block(wf, mu, cos[:, :Mt], dcos[:, :Mt], K)[0])
            S, R = self._block(wf, mu, sin[:, :Mt], dsin[:, :Mt], K)
            trans = -np.arange(1, Mt + 1) * coef[1 : Mt + 1]  # μ′ = −Σ k μ̂_k sin kθ: the translation
            if np.linalg.norm(trans) > 1e-8 * max(1.0, float(np.abs(mu).max())):
                y = np.linalg.solve(R, trans)  # R⁻¹ a: its symmetric coordinates
                y /= np.linalg.norm(y)
                S -= (10 * float(np.abs(S).max()) + 1) * np.outer(y, y)
            odd = np.linalg.eigvalsh(S)
        except np.linalg.LinAlgError:  # μ not positive somewhere: no stability to speak of
            return np.full(count, np.nan, dtype=complex), False
        vals = np.sort(np.concatenate([even, odd]))[::-1][:count].astype(complex)
        return vals, _stable(vals)


def _stable(vals: npt.NDArray[np.complex128]) -> bool:
    """:func:`mfpde.stability.linearly_stable` (all real parts < 0 up to 1e-9 times the largest |eigenvalue|)."""
    return bool(np.all(vals.real < 1e-9 * max(1.0, float(np.abs(vals).max(initial=0.0)))))
