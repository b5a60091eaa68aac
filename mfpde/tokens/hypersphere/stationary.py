"""The zonal stationary states of noisy tokens on S^{d−1}, any d ≥ 2 (theory §10, §11): equation, stability, energy.

The stationary equation of ∂_t μ + K ∇_S·(μ v) = τ Δ_S μ, v = β⁻¹ ∇_S Φ, Φ(x) = ∫ e^{β x·y} μ(y) dσ(y) (USA, one
head (β, K)) is μ ∝ exp(κ Φ), κ = K/(τβ). The states here are ZONAL, μ = μ(z), z = x·e: the uniform state
loses stability through degree 1 (K_c = τβ/λ_1(β)), whose zonal member carries the bifurcation, and the zonal
restriction removes the rotations' null directions (as the circle's even and the sphere's zonal restrictions do).
The unknowns are the LOG-densities u = log ν, ν = |S^{d−1}| μ (the density of the normalised measure σ̄: the
uniform state is ν = 1, u = 0 in every d), at the n nodes of the Gauss rule of σ̄ in z
(:func:`~mfpde.tokens.hypersphere.zonal.gauss_rule`): a stationary u = κΦ − log Z is as smooth as the potential
Φ, while ν = e^u of a clustered state at large d spans hundreds of decades over the nodes. The convolution is the
azimuthally averaged kernel collocated there,

    Φ(z_i) = Σ_j q_j e^{β z_i z_j} G(β s_i s_j) ν_j,   A_ij = q_j e^{β z_i z_j} G(β s_i s_j),

an entire function of z and z′, so K_c, β* and the folds of the discrete problem equal the exact ones to round-off
at n ≈ 40 for moderate d (the kernel's width in z is ≈ 1/√d, the rule's nodes follow it). With g = κ A e^u and
log p = g − log Σ q e^g the residual is F(u, K) = u − log p, with the exact Jacobian
∂F/∂u = I − κ (I − 1 (q∘p)ᵀ) A diag(e^u), ∂F/∂K = −(τβ)⁻¹ (I − 1 (q∘p)ᵀ) A e^u. The exponent κ A ν ≈ κ λ_0
(≈ 50 at d = 64, ≈ d at the threshold) carries its round-off into log p: Newton's absolute tolerance is
:attr:`HypersphereStationary.newton_atol`, 1e-12 (1 + λ_0/λ_1), above it in every d.

The free energy in mfpde's convention (theory §11): E(μ) = τ ∫ μ log μ dσ − (K/2β) ∬ e^{β x·y} dμ dμ
= τ Σ q ν log ν − τ log|S^{d−1}| − (K/2β) νᵀ diag(q) A ν.

Stability is the free energy's (for a Wasserstein gradient flow the inertia of its second variation is the
linearisation's): δ²E = τ Σ q f²/ν − (K/β) fᵀ diag(q) [e^{β z z′} B_m(β s s′)] diag(q) f in the metric Σ q f²/ν,
on the ZONAL perturbations of mass zero (m = 0) and on f(z) Y_m(ω), Y_m a degree-m harmonic of S^{d−2} (d = 2:
m = 1 only, the odd perturbations; d ≥ 3: m = 1..8), the rotations (f = s ν′, m = 1) left out; symmetric
eigenproblems in g = f √(q/ν), without differentiation matrices. The reported growth rates are the leading
eigenvalues of the linearisation of the zonal evolution

    L δν = (1 − z²) D f − (d − 1) z f,   f = τ D δν − (K/β)(δν D Φ + ν D A δν)

(the zonal divergence (1−z²)^{−(d−3)/2} ∂_z[(1−z²)^{(d−1)/2} f]; D the differentiation matrix of the interpolant,
its barycentric weights in logarithms), projected on the orthonormal degrees 1..⌊2n/3⌋ (degree 0 is the mass,
which L conserves; the top third aliases: at d = 64, n = 96 it showed growth rates of 1e5 the state does not have).
About the uniform state they are K ℓ(ℓ+d−2) λ_ℓ(β)/β − τ ℓ(ℓ+d−2).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import scipy.linalg
import scipy.special

from mfpde.stability import leading_eigenpairs, linearly_stable
from mfpde.tokens.hypersphere.theory import critical_coupling, eigenvalue
from mfpde.tokens.hypersphere.zonal import angle_rule, azimuthal_kernel, gauss_rule, orthonormal_basis

__all__ = ["AZIMUTHAL_ORDERS", "HypersphereStationary"]

Array = npt.NDArray[np.float64]
#: The azimuthal orders m ≥ 1 whose second variation :meth:`HypersphereStationary.stability` examines (d ≥ 3).
AZIMUTHAL_ORDERS = 8
#: Past this entry size the collocated linearisation is noise (its derivatives at large n and d): no eigenvalues.
LINEARISATION_MAX = 1e100
#: The collocation rules: "gauss" (the Gauss rule of σ̄ in z: exact, for moderate d) and "angle" (Gauss–Legendre in
#: the polar angle: spread evenly, for clustered states at large d).
RULES = ("gauss", "angle")
#: The dimension from which the angle rule is the default: at d = 128, β = 2.5 the Gauss rule of σ̄ on 64 points put
#: K_M at 81.17 (its nodes gather in |z| ≲ 3/√d, the clustered state sits at z ≈ 0.8) where the angle rule gives
#: 80.0207203275 on 128 and 192 points alike; at d = 16 both agree to 1e-13.
ANGLE_FROM_DIM = 16
#: The floor of the continuation's node weights, times 1/n (:meth:`HypersphereStationary.inner_weights`).
FLOOR_W = 1e-3


class HypersphereStationary:
    """The discrete zonal stationary equation on S^{d−1} at n Gauss nodes in z; β, τ, d fixed; K the parameter.

    Args:
        points: n ≥ 9, the collocation nodes.
        beta: β > 0 of the head (its a), ≤ 700.
        noise: τ > 0.
        dim: d ≥ 2, the ambient dimension (tokens on S^{d−1}).
        rule: the collocation nodes, "gauss" or "angle" (:data:`RULES`); "" picks "angle" from ANGLE_FROM_DIM on.

    Raises:
        ValueError: n < 9, τ ≤ 0, β ≤ 0 or d < 2.
    """

    domain = "hypersphere"

    def __init__(self, points: int, beta: float, noise: float, dim: int, rule: str = ""):
        if points < 9:
            raise ValueError(f"the collocation needs >= 9 points, got {points}")
        if not noise > 0 or not beta > 0:
            raise ValueError(f"need τ > 0 and β > 0, got τ = {noise}, β = {beta}")
        if not (int(dim) == dim and dim >= 2):
            raise ValueError(f"need an integer d >= 2, got {dim}")
        n = self.N = self.m = int(points)
        self.beta, self.noise, self.d = float(beta), float(noise), int(dim)
        self.label = f"hypersphere S^{self.d - 1}"  # the domain in words (the continuation's log and plot)
        self.report_fields = {"dim": self.d}  # what the continuation's report adds
        rule = rule or ("gauss" if dim < ANGLE_FROM_DIM else "angle")
        if rule not in RULES:
            raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
        self.rule = rule
        if rule == "angle":  # values → Legendre coefficients in the angle (the nodes ascend in z: descend in θ)
            x, w = np.polynomial.legendre.leggauss(n)
            self._angle_x = x  # θ = π(x + 1)/2 ascending: the nodes reversed
            self._angle_C = (((2 * np.arange(n) + 1) / 2)[:, None]
                             * (np.polynomial.legendre.legvander(x, n - 1) * w[:, None]).T)[:, ::-1]
        self.t, self.q = (gauss_rule if rule == "gauss" else angle_rule)(n, self.d)  # z_i, the weights of σ̄ (sum 1)
        self.kernel = azimuthal_kernel(self.t, self.beta, self.d)  # e^{β z z′} B_0(β s s′), symmetric
        self.A = self.kernel * self.q[None, :]
        self.log_area = _log_area(self.d - 1)
        diff = self.t[:, None] - self.t[None, :]
        np.fill_diagonal(diff, 1.0)
        # the barycentric weights 1/Π_k (t_j − t_k) in logarithms: at n = 160 they span more than the double range
        log_w = -np.sum(np.log(np.abs(diff)), axis=1)
        sign = np.where(np.arange(n) % 2 == (n - 1) % 2, 1.0, -1.0)  # the nodes ascend: n − 1 − j negative factors
        D = sign[None, :] * sign[:, None] * np.exp(log_w[None, :] - log_w[:, None]) / diff
        np.fill_diagonal(D, 0.0)
        np.fill_diagonal(D, -D.sum(axis=1))
        self.D = D  # differentiation of the interpolant through the nodes (barycentric; Berrut & Trefethen 2004)
        self.V = orthonormal_basis(self.t, n - 1, self.d)  # p_ℓ(z_i), ℓ = 0..n−1, orthonormal in σ̄
        self.C = (self.V * self.q[:, None]).T  # values → coefficients (exact for degree ≤ n − 1)
        #: the degrees 1..this of the linearisation: the top third alias (the drift's products raise the degree, and
        #: at large d and n they showed growth rates of 1e5 that the states do not have)
        self.resolved_degree = max(2, (2 * n) // 3)
        self.P1 = orthonormal_basis(np.ones(1), n - 1, self.d)[0]  # p_ℓ(1): P_ℓ = p_ℓ/p_ℓ(1)
        self.lam0 = float(eigenvalue(0, self.beta, self.d))  # λ_0(β): Φ of the uniform state
        #: Newton's absolute tolerance: 1e-12 times the exponent κ λ_0 at the threshold, 1 + λ_0/λ_1 (≈ d)
        self.newton_atol = 1e-12 * (1.0 + self.lam0 / float(eigenvalue(1, self.beta, self.d)))
        self._Bq: dict[int, Array] = {}  # e^{β z z′} B_m(β s s′) of the azimuthal orders, built when first asked

    # -- states ---------------------------------------------------------------------------------
    def uniform(self) -> Array:
        """The uniform state u = log ν = 0 at the nodes, shape (n,)."""
        return np.zeros(self.m)

    def density(self, u: Array) -> Array:
        """ν = |S^{d−1}| μ = e^u at the n nodes, shape (n,)."""
        with np.errstate(over="ignore"):  # a failed Newton trial: inf, rejected
            return np.exp(np.asarray(u, float))

    def mode_state(self, k: int) -> Array:
        """P_k(z) at the nodes (the null vector of the uniform state's Jacobian at K_k, in u as in ν), shape (n,)."""
        return self.V[:, k] / self.P1[k]

    def threshold(self, k: int) -> float:
        """τβ/λ_k(β): where degree k of the uniform state turns unstable (theory §11)."""
        return critical_coupling(self.beta, self.noise, self.d, k)

    def inner_weights(self) -> Array:
        """W of the continuation's inner product on x = (u, K): the weights q of σ̄ floored at FLOOR_W/n, 1 for K.

        The L²(σ̄) norm of log ν, except that the outer nodes' weights (1e-35 at d = 64, n = 96) are raised to a
        floor: the branch direction is an SVD of the Jacobian with its columns scaled by W^{−1/2}, which such a range
        of scales would spoil.
        """
        return np.concatenate([np.maximum(self.q, FLOOR_W / self.m), [1.0]])

    def amplitude(self, k: int) -> Array:
        """The row r with r·u = ∫ log ν P_k dσ̄: degree k's amplitude of the log-density, shape (n,).

        The continuation's linear coordinate; to first order about the uniform state it is ∫ μ P_k dσ.
        """
        return self.q * self.V[:, k] / self.P1[k]

    def density_amplitude(self, u: Array, k: int) -> float:
        """∫ μ P_k dσ = ∫ ν P_k dσ̄ (degree k's zonal amplitude of the density: the report's)."""
        return float(self.amplitude(k) @ self.density(u))

    def dominant_mode(self, u: Array) -> int:
        """The degree ℓ ≥ 1 of the largest orthonormal coefficient of u (a tangent: in log ν as in ν to first order)."""
        c = np.abs(self.C @ np.asarray(u, float))
        c[0] = 0.0
        return int(np.argmax(c))

    def _log_gibbs(self, nu: Array, K: float) -> tuple[Array, Array, float]:
        """(log p, p, κ) of the Gibbs map p(ν) = e^{κ A ν}/Σ q e^{κ A ν} (log-sum-exp)."""
        kappa = K / (self.noise * self.beta)
        g = kappa * (self.A @ nu)
        with np.errstate(all="ignore"):  # a failed Newton trial overflows here: non-finite, and SNES rejects it
            logp = g - scipy.special.logsumexp(g, b=self.q)
            return logp, np.exp(logp), kappa


    # -- the equation ---------------------------------------------------------------------------

    def residual(self, u: Array, K: float) -> Array:
        """F(u, K) = u − log p(e^u) (module docstring), shape (n,)."""
        return np.asarray(u, float) - self._log_gibbs(self.density(u), K)[0]

    def jacobian(self, u: Array, K: float) -> tuple[Array, Array]:
        """(∂F/∂u (n, n), ∂F/∂K (n,)), exact (module docstring)."""
        nu = self.density(u)
        _, p, kappa = self._log_gibbs(nu, K)
        SA = (np.eye(self.m) - np.outer(np.ones(self.m), self.q * p)) @ self.A  # ∂ log p/∂ν = κ SA
        return np.eye(self.m) - kappa * SA * nu[None, :], -(SA @ nu) / (self.noise * self.beta)

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
        return ent - K / (2 * self.beta) * self.interaction(u)

    def resolved(self, u: Array, tol: float = 1e-9) -> bool:
        """Whether log ν's highest coefficients are below ``tol`` times its largest or 1.

        Gegenbauer coefficients in z (the Gauss rule), Legendre in the angle (the angle rule). The collocation
        resolves the state: log ν = κΦ − log Z is as smooth as the potential.
        """
        c = np.abs((self.C if self.rule == "gauss" else self._angle_C) @ np.asarray(u, float))
        return bool(c[-max(2, self.m // 8):].max() <= tol * max(1.0, float(c.max())))

    def linearisation(self, u: Array, K: float) -> Array:
        """L of the zonal evolution (module docstring) in the orthonormal degrees 1..⌊2n/3⌋: a square matrix."""
        nu = self.density(u)
        D, b, z = self.D, self.beta, self.t
        f = self.noise * D - K / b * (np.diag(D @ (self.A @ nu)) + nu[:, None] * (D @ self.A))
        L = (1.0 - z**2)[:, None] * (D @ f) - ((self.d - 1) * z)[:, None] * f
        return (self.C @ L @ self.V)[1:self.resolved_degree + 1, 1:self.resolved_degree + 1]

    def stability(self, u: Array, K: float, count: int = 4,
                  solver: str = "slepc") -> tuple[npt.NDArray[np.complex128], bool]:
        """(the ``count`` leading eigenvalues of the zonal L by SLEPc or scipy, stable), non-zonal orders included.

        The verdict is the free energy's: its second variation on the zonal mass-zero perturbations
        (:meth:`zonal_hessian`) and on the azimuthal orders (:meth:`azimuthal_hessian`) > 0 up to 1e-9 τ (symmetric
        eigenproblems without differentiation matrices: for a Wasserstein gradient flow their inertia is the
        linearisation's). The eigenvalues are the collocated linearisation's; where their sign disagrees with the
        zonal second variation (the collocation's derivatives lose accuracy for large d and n), they are NaN.

        Returns:
            (the zonal eigenvalues sorted by decreasing real part, shape (count,) complex, or NaN; the verdict).
        """
        with np.errstate(all="ignore"):
            L = self.linearisation(u, K)
        # the verdict is the second variation's; the collocated derivatives overflow at large n (angle rule)
        vals = np.full(count, np.nan, dtype=complex)
        if np.all(np.isfinite(L)) and float(np.abs(L).max(initial=0.0)) < LINEARISATION_MAX:
            try:
                vals = leading_eigenpairs(L, count, solver)[0][:count]
            except (ArithmeticError, SystemError, ValueError, np.linalg.LinAlgError):  # LAPACK refused its scaling
                pass
        zonal = float(self.zonal_hessian(u, K)) > -1e-9 * self.noise
        if np.all(np.isfinite(vals)) and linearly_stable(vals) != zonal:
            vals = np.full(count, np.nan, dtype=complex)
        orders = 1 if self.d == 2 else AZIMUTHAL_ORDERS
        return vals, zonal and bool(np.all(self.azimuthal_hessian(u, K, orders) > -1e-9 * self.noise))

    def zonal_hessian(self, u: Array, K: float) -> float:
        """The least eigenvalue of δ²E on the zonal perturbations f of mass zero (Σ q f = 0), in the metric Σ q f²/ν.

        δ²E = τ Σ q f²/ν − (K/β) fᵀ diag(q) [e^{β z z′} B_0(β s s′)] diag(q) f; about the uniform state its
        eigenvalues are τ − K λ_ℓ(β)/β, ℓ ≥ 1 (zero at K_ℓ = τβ/λ_ℓ).
        """
        w = np.sqrt(self.q * self.density(u))  # g = f √(q/ν): the metric is the identity, the mass Σ q f = w·g
        H = self.noise * np.eye(self.m) - K / self.beta * w[:, None] * self.kernel * w[None, :]
        Qm = scipy.linalg.null_space(w[None, :] / np.linalg.norm(w))  # the mass-zero perturbations
        return float(scipy.linalg.eigvalsh(Qm.T @ H @ Qm)[0])

    def azimuthal_hessian(self, u: Array, K: float, orders: int = AZIMUTHAL_ORDERS) -> Array:
        """The least eigenvalue of the free energy's second variation on f(z) Y_m(ω), m = 1..orders (module docstring).

        About the uniform state: λ_m = τ − K B̄_m/β with B̄_m the σ̄-mean of e^{β z z′} B_m over the first variable
        pairs, i.e. λ_m = τ − K λ_m^{…}/β degree by degree. At m = 1 the rotations of a non-uniform state
        (f = s ν′(z), eigenvalue 0) are left out.

        Returns:
            λ_m for m = 1..orders, shape (orders,).
        """
        nu = self.density(u)
        w = np.sqrt(self.q * nu)  # g = f √(q/ν): the metric Σ q f²/ν is the identity (tiny q at large d and n)
        rot = self._rotation(u) * w  # f = s ν′ = s ν u′, g = f √(q/ν)
        out = np.zeros(orders)
        for m in range(1, orders + 1):
            if m not in self._Bq:  # the state-free part, once per order
                self._Bq[m] = azimuthal_kernel(self.t, self.beta, self.d, m)
            H = self.noise * np.eye(self.m) - K / self.beta * w[:, None] * self._Bq[m] * w[None, :]
            vals, vecs = scipy.linalg.eigh(H)
            if m == 1 and np.linalg.norm(rot) > 1e-8 * np.linalg.norm(w):
                align = np.abs(rot @ vecs) / np.linalg.norm(rot)
                vals = np.delete(vals, int(np.argmax(align[:4])))
            out[m - 1] = vals[0]
        return out

    def _rotation(self, u: Array) -> Array:
        """The rotations' zonal profile over ν at the nodes (m = 1): s u′(z) = −du/dθ, f = ν s u′ = s ν′.

        The Gauss rule differentiates the interpolant (D); the angle rule its Legendre series in θ, since at large d
        the barycentric D of those nodes turned a cap's u′ into noise (the rotation's eigenvector was then not
        found, and the rotation's zero eigenvalue, ±1e-9 by round-off, decided the verdict).
        """
        u = np.asarray(u, float)
        if self.rule == "gauss":
            return np.sqrt(1.0 - self.t**2) * (self.D @ u)
        c = np.polynomial.legendre.legder(self._angle_C @ u)
        return np.asarray(-(2.0 / math.pi) * np.polynomial.legendre.legval(self._angle_x, c)[::-1], dtype=float)


def _log_area(k: int) -> float:
    """Log |S^k| = log 2 + ((k+1)/2) log π − log Γ((k+1)/2), for k where |S^k| underflows."""
    return math.log(2.0) + (k + 1) / 2 * math.log(math.pi) - math.lgamma((k + 1) / 2)
