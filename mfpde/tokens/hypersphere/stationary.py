"""The zonal stationary states of noisy tokens on S^{d−1}, any d ≥ 2 (theory §10, §11): equation, stability, energy.

The stationary equation of ∂_t μ + K ∇_S·(μ v) = τ Δ_S μ, v = β⁻¹ ∇_S Φ, Φ(x) = ∫ e^{β x·y} μ(y) dσ(y) (USA, one
head (β, K)) is μ ∝ exp(κ Φ), κ = K/(τβ). The states here are ZONAL, μ = μ(z), z = x·e: the uniform state
loses stability through degree 1 (K_c = τβ/λ_1(β)), whose zonal member carries the bifurcation, and the zonal
restriction removes the rotations' null directions (as the circle's even and the sphere's zonal restrictions do).
The unknowns are ν = |S^{d−1}| μ (the density of the normalised measure σ̄: the uniform state is 1 in every d) at
the n nodes of the Gauss rule of σ̄ in z (:func:`~mfpde.tokens.hypersphere.zonal.gauss_rule`); the convolution is
the azimuthally averaged kernel collocated there,

    Φ(z_i) = Σ_j q_j e^{β z_i z_j} G(β s_i s_j) ν_j,   A_ij = q_j e^{β z_i z_j} G(β s_i s_j),

an entire function of z and z′, so K_c, β* and the folds of the discrete problem equal the exact ones to round-off
at n ≈ 40 for moderate d (the kernel's width in z is ≈ 1/√d, the rule's nodes follow it). With p(ν) =
e^{κ A ν}/Σ q e^{κ A ν} the residual is RELATIVE, F(ν, K) = ν/p(ν) − 1 (for large d a clustered ν spans many decades
over the nodes; at a solution its Jacobian is that of ν − p scaled by rows, so Newton's steps there are the same),
with the exact Jacobian ∂F/∂ν = diag(1/p) − κ diag(ν/p) (I − 1 (q∘p)ᵀ) A,
∂F/∂K = −(τβ)⁻¹ diag(ν/p) (I − 1 (q∘p)ᵀ) A ν.

The free energy in mfpde's convention (theory §11): E(μ) = τ ∫ μ log μ dσ − (K/2β) ∬ e^{β x·y} dμ dμ
= τ Σ q ν log ν − τ log|S^{d−1}| − (K/2β) νᵀ diag(q) A ν.

Stability against ZONAL perturbations: the linearisation of the zonal evolution

    L δν = (1 − z²) D f − (d − 1) z f,   f = τ D δν − (K/β)(δν D Φ + ν D A δν),

(the zonal divergence (1−z²)^{−(d−3)/2} ∂_z[(1−z²)^{(d−1)/2} f]), D the differentiation matrix of the interpolant,
projected on the orthonormal degrees 1..n−2 (degree 0 is the mass, which L conserves). About the uniform state its
eigenvalues are K ℓ(ℓ+d−2) λ_ℓ(β)/β − τ ℓ(ℓ+d−2). Against the NON-ZONAL perturbations f(z) Y_m(ω), Y_m a
degree-m harmonic of S^{d−2} (d = 2: m = 1 only, the odd perturbations; d ≥ 3: m = 1..8): the sign of the free
energy's second variation τ Σ q f²/ν − (K/β) fᵀ diag(q) [e^{β z z′} B_m(β s s′)] diag(q) f in the metric
Σ q f²/ν (for a Wasserstein gradient flow its inertia is the linearisation's), the rotations (f = s ν′, m = 1) left
out.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import scipy.linalg

from mfpde.stability import leading_eigenpairs, linearly_stable
from mfpde.tokens.hypersphere.theory import critical_coupling
from mfpde.tokens.hypersphere.zonal import azimuthal_kernel, gauss_rule, orthonormal_basis

__all__ = ["AZIMUTHAL_ORDERS", "HypersphereStationary"]

Array = npt.NDArray[np.float64]
#: The azimuthal orders m ≥ 1 whose second variation :meth:`HypersphereStationary.stability` examines (d ≥ 3).
AZIMUTHAL_ORDERS = 8


class HypersphereStationary:
    """The discrete zonal stationary equation on S^{d−1} at n Gauss nodes in z; β, τ, d fixed; K the parameter.

    Args:
        points: n ≥ 9, the collocation nodes.
        beta: β > 0 of the head (its a), ≤ 700.
        noise: τ > 0.
        dim: d ≥ 2, the ambient dimension (tokens on S^{d−1}).

    Raises:
        ValueError: n < 9, τ ≤ 0, β ≤ 0 or d < 2.
    """

    domain = "hypersphere"

    def __init__(self, points: int, beta: float, noise: float, dim: int):
        if points < 9:
            raise ValueError(f"the collocation needs >= 9 points, got {points}")
        if not noise > 0 or not beta > 0:
            raise ValueError(f"need τ > 0 and β > 0, got τ = {noise}, β = {beta}")
        if not (int(dim) == dim and dim >= 2):
            raise ValueError(f"need an integer d >= 2, got {dim}")
        n = self.N = self.m = int(points)
        self.beta, self.noise, self.d = float(beta), float(noise), int(dim)
        self.t, self.q = gauss_rule(n, self.d)  # z_i and the weights of σ̄ (sum 1)
        self.A = azimuthal_kernel(self.t, self.beta, self.d) * self.q[None, :]
        self.log_area = _log_area(self.d - 1)
        lam = 1.0 / np.array([np.prod(self.t[j] - np.delete(self.t, j)) for j in range(n)])
        diff = self.t[:, None] - self.t[None, :]
        np.fill_diagonal(diff, 1.0)
        D = (lam[None, :] / lam[:, None]) / diff
        np.fill_diagonal(D, 0.0)
        np.fill_diagonal(D, -D.sum(axis=1))
        self.D = D  # differentiation of the interpolant through the nodes (barycentric; Berrut & Trefethen 2004)
        self.V = orthonormal_basis(self.t, n - 1, self.d)  # p_ℓ(z_i), ℓ = 0..n−1, orthonormal in σ̄
        self.C = (self.V * self.q[:, None]).T  # values → coefficients (exact for degree ≤ n − 1)
        self.P1 = orthonormal_basis(np.ones(1), n - 1, self.d)[0]  # p_ℓ(1): P_ℓ = p_ℓ/p_ℓ(1)
        self._Bq: dict[int, Array] = {}  # q q′ e^{β z z′} B_m(β s s′) of the azimuthal orders, built when first asked

    # -- states ---------------------------------------------------------------------------------
    def uniform(self) -> Array:
        """The uniform state ν = 1 at the nodes, shape (n,)."""
        return np.ones(self.m)

    def density(self, u: Array) -> Array:
        """ν = |S^{d−1}| μ at the n nodes (the unknowns themselves), shape (n,)."""
        return np.asarray(u, float)

    def mode_state(self, k: int) -> Array:
        """P_k(z) at the nodes (the null vector of the uniform state's Jacobian at K_k), shape (n,)."""
        return self.V[:, k] / self.P1[k]

    def threshold(self, k: int) -> float:
        """τβ/λ_k(β): where degree k of the uniform state turns unstable (theory §11)."""
        return critical_coupling(self.beta, self.noise, self.d, k)

    def inner_weights(self) -> Array:
        """W of the continuation's inner product on x = (ν, K): the weights q of σ̄ (the L²(σ̄) norm), 1 for K."""
        return np.concatenate([self.q, [1.0]])

    def amplitude(self, k: int) -> Array:
        """The row r with r·ν = ∫ μ P_k dσ = ∫ ν P_k dσ̄ (degree k's zonal amplitude), shape (n,)."""
        return self.q * self.V[:, k] / self.P1[k]

    def dominant_mode(self, u: Array) -> int:
        """The degree ℓ ≥ 1 of the largest orthonormal coefficient of u."""
        c = np.abs(self.C @ self.density(u))
        c[0] = 0.0
        return int(np.argmax(c))

    def _gibbs(self, nu: Array, K: float) -> tuple[Array, float]:
        kappa = K / (self.noise * self.beta)
        g = kappa * (self.A @ nu)
        p = np.exp(g - g.max())
        return p / float(self.q @ p), kappa

    # -- the equation ---------------------------------------------------------------------------
    def residual(self, u: Array, K: float) -> Array:
        """F(ν, K) = ν/p(ν) − 1 (module docstring: the relative residual, p > 0 always), shape (n,)."""
        nu = self.density(u)
        return nu / self._gibbs(nu, K)[0] - 1.0

    def jacobian(self, u: Array, K: float) -> tuple[Array, Array]:
        """(∂F/∂ν (n, n), ∂F/∂K (n,)), exact (module docstring)."""
        nu = self.density(u)
        p, kappa = self._gibbs(nu, K)
        SA = (np.eye(self.m) - np.outer(np.ones(self.m), self.q * p)) @ self.A  # ∂ log p/∂ν = κ SA
        r = nu / p
        return np.diag(1.0 / p) - kappa * r[:, None] * SA, -r * (SA @ nu) / (self.noise * self.beta)

    # -- what a branch reports ----------------------------------------------------------------------
    def order_parameter(self, u: Array) -> float:
        """|∫ x dμ| / ∫ dμ = |Σ q z ν| / Σ q ν (0 uniform, 1 a point mass)."""
        nu = self.density(u)
        return float(abs(self.q @ (nu * self.t)) / (self.q @ nu))

    def signed_amplitude(self, u: Array) -> float:
        """∫ μ x·e dσ (with its sign: a cluster about e or about −e)."""
        return float(self.q @ (self.density(u) * self.t))

    def interaction(self, u: Array) -> float:
        """∬ e^{β x·y} dμ dμ = νᵀ diag(q) A ν (−2β ∂E/∂K: the free energy's slope along a stationary branch)."""
        nu = self.density(u)
        return float((self.q * nu) @ self.A @ nu)

    def free_energy(self, u: Array, K: float) -> float:
        """E(μ) = τ ∫ μ log μ dσ − (K/2β) ∬ e^{β x·y} dμ dμ (theory §11), by the Gauss rule."""
        nu = self.density(u)
        ent = self.noise * (float(self.q @ (nu * np.log(np.where(nu > 0, nu, 1.0)))) - self.log_area)
        return ent - K / (2 * self.beta) * self.interaction(nu)

    def resolved(self, u: Array, tol: float = 1e-9) -> bool:
        """Whether ν's highest orthonormal coefficients are below ``tol`` times its mean (the rule resolves it)."""
        c = np.abs(self.C @ self.density(u))
        return bool(c[-max(2, self.m // 8):].max() <= tol * c[0])

    def linearisation(self, u: Array, K: float) -> Array:
        """L of the zonal evolution (module docstring) in the orthonormal degrees 1..n−2: shape (n−2, n−2)."""
        nu = self.density(u)
        D, b, z = self.D, self.beta, self.t
        f = self.noise * D - K / b * (np.diag(D @ (self.A @ nu)) + nu[:, None] * (D @ self.A))
        L = (1.0 - z**2)[:, None] * (D @ f) - ((self.d - 1) * z)[:, None] * f
        return (self.C @ L @ self.V)[1:-1, 1:-1]

    def stability(self, u: Array, K: float, count: int = 4,
                  solver: str = "slepc") -> tuple[npt.NDArray[np.complex128], bool]:
        """(the ``count`` leading eigenvalues of the zonal L by SLEPc or scipy, stable), non-zonal orders included.

        Returns:
            (the zonal eigenvalues sorted by decreasing real part, shape (count,) complex; True if all their real
            parts are < 0 up to 1e-9 times the largest |eigenvalue| and the second variation on the azimuthal
            orders is > 0 up to 1e-9 τ).
        """
        vals = leading_eigenpairs(self.linearisation(u, K), count, solver)[0][:count]
        orders = 1 if self.d == 2 else AZIMUTHAL_ORDERS
        return vals, linearly_stable(vals) and bool(np.all(self.azimuthal_hessian(u, K, orders)
                                                            > -1e-9 * self.noise))

    def azimuthal_hessian(self, u: Array, K: float, orders: int = AZIMUTHAL_ORDERS) -> Array:
        """The least eigenvalue of the free energy's second variation on f(z) Y_m(ω), m = 1..orders (module docstring).

        About the uniform state: λ_m = τ − K B̄_m/β with B̄_m the σ̄-mean of e^{β z z′} B_m over the first variable
        pairs, i.e. λ_m = τ − K λ_m^{…}/β degree by degree. At m = 1 the rotations of a non-uniform state
        (f = s ν′(z), eigenvalue 0) are left out.

        Returns:
            λ_m for m = 1..orders, shape (orders,).
        """
        nu = self.density(u)
        s = np.sqrt(1.0 - self.t**2)
        metric = np.diag(self.q / nu)
        rot = s * (self.D @ nu)
        out = np.zeros(orders)
        for m in range(1, orders + 1):
            if m not in self._Bq:  # the state-free part, once per order
                self._Bq[m] = np.outer(self.q, self.q) * azimuthal_kernel(self.t, self.beta, self.d, m)
            H = self.noise * metric - K / self.beta * self._Bq[m]
            vals, vecs = scipy.linalg.eigh(H, metric)
            if m == 1 and np.abs(rot).max() > 1e-8 * np.abs(nu).max():
                align = np.abs(rot @ metric @ vecs) / (math.sqrt(rot @ metric @ rot)
                                                       * np.sqrt(np.sum(vecs * (metric @ vecs), axis=0)))
                vals = np.delete(vals, int(np.argmax(align[:4])))
            out[m - 1] = vals[0]
        return out


def _log_area(k: int) -> float:
    """Log |S^k| = log 2 + ((k+1)/2) log π − log Γ((k+1)/2), for k where |S^k| underflows."""
    return math.log(2.0) + (k + 1) / 2 * math.log(math.pi) - math.lgamma((k + 1) / 2)
