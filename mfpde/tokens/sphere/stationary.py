"""The zonal stationary states of noisy tokens on S² (theory §10): the discrete equation, its Jacobian, stability.

The stationary equation of ∂_t μ + K ∇_S·(μ v) = τ Δ_S μ, v = β⁻¹ ∇_S(G∗μ), G∗μ(x) = ∫ e^{β x·y} μ(y) dσ(y)
(USA, one head (β, K)) is the fixed point μ = p(μ) := exp(κ G∗μ)/∫ exp(κ G∗μ), κ = K/(τβ). The states computed
here are ZONAL, μ(x) = μ(t), t = cos ϑ = x_3 (axisymmetric about the z-axis): the uniform state loses stability
through the degree ℓ = 1 (K_c = τβ/i_1(β)), whose zonal member P_1(t) = t carries the bifurcation, and the zonal
restriction removes the rotations' null directions of the Jacobian (as the circle's even restriction removes the
translations). For zonal μ the convolution is, integrated over the azimuth exactly,

    G∗μ(t) = ∫_{−1}^{1} 2π I_0(β s s') e^{β t t'} μ(t') dt',   s = √(1 − t²),

an entire function of t and t' (I_0 is even in its argument): it is discretised by Gauss–Legendre collocation at n
nodes t_i with weights w_i, A_ij = 2π w_j I_0(β s_i s_j) e^{β t_i t_j} (dense), ∫_{S²} f dσ = 2π Σ w_i f(t_i) —
spectrally accurate, so the discrete K_c equals τβ/i_1(β) to round-off at n ≈ 40. The unknowns are μ(t_i) (no
further restriction: the reflection t ↦ −t is a discrete symmetry). The residual F(u, K) = u − p(u) has the exact
Jacobian ∂F/∂u = I − κ (diag p − p (2π w∘p)ᵀ) A, ∂F/∂K = −(τβ)⁻¹ (diag p − p (2π w∘p)ᵀ) A u.

Stability against ZONAL perturbations: the linearisation of the evolution restricted to them,
L δμ = D[(1 − t²)(τ D δμ − (K/β)(δμ D G + μ D A δμ))], G = A μ, D the differentiation matrix of the
Gauss–Legendre interpolant, projected on the Legendre degrees 1..n−2 (degree 0 is the mass, which L conserves;
the top degree is left out so that L maps the basis into the interpolated space
exactly about the uniform state). About 1/4π its eigenvalues are K ℓ(ℓ+1) i_ℓ(β)/β − τ ℓ(ℓ+1), ℓ = 1..n−2
(theory §10; each the zonal member of its 2ℓ+1). Against the NON-ZONAL perturbations f(t) cos mφ, m = 1..8:
the sign of the free energy's second variation (:meth:`SphereStationary.azimuthal_hessian`; for a Wasserstein
gradient flow its inertia is the linearisation's), the rotations left out. Orders m > 8 are not examined (their
kernel term falls as i_m(β): at the uniform state λ_m = τ − K i_m(β)/β).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import scipy.special
from numpy.polynomial import legendre

from mfpde.stability import leading_eigenpairs, linearly_stable

__all__ = ["SphereStationary"]

Array = npt.NDArray[np.float64]
#: The azimuthal orders m ≥ 1 whose second variation :meth:`SphereStationary.stability` examines.
AZIMUTHAL_ORDERS = 8


class SphereStationary:
    """The discrete zonal stationary equation on n Gauss–Legendre nodes in t = cos ϑ, β, τ fixed; K the parameter.

    Args:
        points: n ≥ 9, the collocation nodes.
        beta: β > 0 of the head (its a), ≤ 700.
        noise: τ > 0.

    Raises:
        ValueError: n < 9, τ ≤ 0, β ≤ 0.
    """

    domain = "sphere"

    def __init__(self, points: int, beta: float, noise: float):
        if points < 9:
            raise ValueError(f"the collocation needs >= 9 points, got {points}")
        if not noise > 0 or not beta > 0:
            raise ValueError(f"need τ > 0 and β > 0, got τ = {noise}, β = {beta}")
        n = self.N = self.m = int(points)
        self.beta, self.noise = float(beta), float(noise)
        self.t, self.w = legendre.leggauss(n)
        self.q = 2 * math.pi * self.w  # the quadrature weights of ∫_{S²} for zonal functions, shape (n,)
        s = np.sqrt(1.0 - self.t**2)
        ss, tt = self.beta * np.outer(s, s), self.beta * np.outer(self.t, self.t)
        # 2π I_0(β s s') e^{β t t'} = 2π ive(0, β s s') e^{β (s s' + t t')}: the exponent ≤ β (no overflow to β = 700)
        self.A = 2 * math.pi * scipy.special.ive(0, ss) * np.exp(ss + tt) * self.w[None, :]
        lam = 1.0 / np.array([np.prod(self.t[j] - np.delete(self.t, j)) for j in range(n)])
        diff = self.t[:, None] - self.t[None, :]
        np.fill_diagonal(diff, 1.0)
        D = (lam[None, :] / lam[:, None]) / diff
        np.fill_diagonal(D, 0.0)
        np.fill_diagonal(D, -D.sum(axis=1))
        self.D = D  # differentiation of the interpolant through the nodes (barycentric; Berrut & Trefethen 2004)
        self.V = legendre.legvander(self.t, n - 1)  # P_ℓ(t_i), ℓ = 0..n−1
        self.C = ((2 * np.arange(n) + 1) / 2)[:, None] * (self.V * self.w[:, None]).T  # values → Legendre coefficients

    # -- states ---------------------------------------------------------------------------------
    def uniform(self) -> Array:
        """The uniform state 1/4π at the nodes, shape (n,)."""
        return np.full(self.m, 1.0 / (4 * math.pi))

    def density(self, u: Array) -> Array:
        """μ at the n nodes (the unknowns themselves), shape (n,)."""
        return np.asarray(u, float)

    def mode_state(self, k: int) -> Array:
        """P_k(t) at the nodes (the null vector of the uniform state's Jacobian at K = τβ/i_k(β)), shape (n,)."""
        return np.array(self.V[:, k], dtype=float)

    def threshold(self, k: int) -> float:
        """τβ/i_k(β): where degree k of the uniform state turns unstable (theory §10)."""
        return self.noise * self.beta / float(scipy.special.spherical_in(k, self.beta))

    def inner_weights(self) -> Array:
        """W of the continuation's inner product on x = (u, K): (4π)²/n per node, 1 for K, shape (n+1,)."""
        return np.concatenate([np.full(self.m, (4 * math.pi) ** 2 / self.m), [1.0]])

    def amplitude(self, k: int) -> Array:
        """The row r with r·u = ∫ μ P_k dσ (degree k's zonal amplitude), shape (n,)."""
        return self.q * self.V[:, k]

    def dominant_mode(self, u: Array) -> int:
        """The degree ℓ ≥ 1 of the largest Legendre coefficient (in the L² norm of S²) of u."""
        c = np.abs(self.C @ self.density(u)) * np.sqrt(4 * math.pi / (2 * np.arange(self.m) + 1))
        c[0] = 0.0
        return int(np.argmax(c))

    def _gibbs(self, mu: Array, K: float) -> tuple[Array, float]:
        kappa = K / (self.noise * self.beta)
        g = kappa * (self.A @ mu)
        p = np.exp(g - g.max())
        return p / float(self.q @ p), kappa

    # -- the equation ---------------------------------------------------------------------------
    def residual(self, u: Array, K: float) -> Array:
        """F(u, K) = μ − p(μ), shape (n,)."""
        mu = self.density(u)
        return mu - self._gibbs(mu, K)[0]

    def jacobian(self, u: Array, K: float) -> tuple[Array, Array]:
        """(∂F/∂u (n, n), ∂F/∂K (n,)), exact (module docstring)."""
        mu = self.density(u)
        p, kappa = self._gibbs(mu, K)
        SA = (np.diag(p) - np.outer(p, self.q * p)) @ self.A
        return np.eye(self.m) - kappa * SA, -(SA @ mu) / (self.noise * self.beta)

    # -- what a branch reports ----------------------------------------------------------------------
    def order_parameter(self, u: Array) -> float:
        """|∫ x dμ| / ∫ dμ (0 uniform, 1 a point mass); the power of degree 1, Σ_m μ̂_1m², is (3/4π) times its square."""
        mu = self.density(u)
        return float(abs(self.q @ (mu * self.t)) / (self.q @ mu))

    def signed_amplitude(self, u: Array) -> float:
        """∫ μ x_3 dσ (the zonal μ̂_1, with its sign: a cluster at the north or the south pole)."""
        return float(self.q @ (self.density(u) * self.t))

    def free_energy(self, u: Array, K: float) -> float:
        """E(μ) = τ ∫ μ log μ − (K/2β) ∬ e^{β x·y} dμ dμ (theory §10), Gauss–Legendre × exact azimuth."""
        mu = self.density(u)
        ent = self.noise * float(self.q @ (mu * np.log(np.where(mu > 0, mu, 1.0))))
        return ent - K / (2 * self.beta) * float((self.q * mu) @ self.A @ mu)

    def resolved(self, u: Array, tol: float = 1e-9) -> bool:
        """Whether μ's highest Legendre coefficients are below ``tol`` times its mean (the collocation resolves it)."""
        c = np.abs(self.C @ self.density(u))
        return bool(c[-max(2, self.m // 8):].max() <= tol * c[0])

    def linearisation(self, u: Array, K: float) -> Array:
        """L of the zonal evolution (module docstring) in Legendre degrees 1..n−2: shape (n−2, n−2)."""
        mu = self.density(u)
        D, b = self.D, self.beta
        flux = (1.0 - self.t**2)[:, None] * (self.noise * D - K / b * (np.diag(D @ (self.A @ mu))
                                                                       + mu[:, None] * (D @ self.A)))
        L = D @ flux
        return (self.C @ L @ self.V)[1:-1, 1:-1]

    def stability(self, u: Array, K: float, count: int = 4,
                  solver: str = "slepc") -> tuple[npt.NDArray[np.complex128], bool]:
        """(the ``count`` leading eigenvalues of the zonal L by SLEPc or scipy, stable), non-zonal orders included.

        Args:
            u: the state (n,).
            K: the coupling.
            count: how many eigenvalues of largest real part are returned.
            solver: "slepc" (slepc4py's Krylov–Schur) or "scipy" (the dense reference, scipy.linalg.eig).

        Returns:
            (the zonal eigenvalues sorted by decreasing real part, shape (count,) complex; True if all their real
            parts are < 0 up to 1e-9 times the largest |eigenvalue| and the second variation on the azimuthal
            orders m = 1..AZIMUTHAL_ORDERS is > 0 up to 1e-9 τ).
        """
        Lr = self.linearisation(u, K)
        vals = leading_eigenpairs(Lr, count, solver)[0][:count]
        zonal = linearly_stable(vals)
        return vals, zonal and bool(np.all(self.azimuthal_hessian(u, K, AZIMUTHAL_ORDERS) > -1e-9 * self.noise))

    def azimuthal_hessian(self, u: Array, K: float, orders: int = 8) -> Array:
        """The least eigenvalue of the free energy's second variation on perturbations f(t) cos mφ, m = 1..orders.

        For δμ = f(t) cos mφ (mass zero for m ≥ 1), δ²E = π [τ ∫ f²/μ dt − (K/β) ∬ f 2π I_m(β s s′) e^{β t t′} f′],
        discretised by the Gauss–Legendre rule (Nyström; f′s and the kernel's factors s^m make the integrands
        polynomial, so it converges spectrally) and measured in the metric ∫ f²/μ dt: λ_m = min (δ²E/π) / ∫ f²/μ.
        For a Wasserstein gradient flow the linearisation is −M H with M = −∇·(μ∇·) positive on the mass-zero
        perturbations, so the signs of its eigenvalues are those of H's (Sylvester's law of inertia): λ_m > 0 for
        every m ≥ 1 is stability against the non-zonal perturbations. At m = 1 the rotations of a non-uniform
        state (f = s μ′(t), eigenvalue 0) are left out. About 1/4π: λ_m = τ − K i_m(β)/β.

        Returns:
            λ_m for m = 1..orders, shape (orders,).
        """
        import scipy.linalg

        mu = self.density(u)
        s = np.sqrt(1.0 - self.t**2)
        ss, tt = self.beta * np.outer(s, s), self.beta * np.outer(self.t, self.t)
        metric = np.diag(self.q / mu)
        rot = s * (self.D @ mu)
        out = np.zeros(orders)
        for m in range(1, orders + 1):
            Bm = 2 * math.pi * scipy.special.ive(m, ss) * np.exp(ss + tt)
            H = self.noise * metric - K / self.beta * np.outer(self.q, self.q) * Bm / (2 * math.pi)
            vals, vecs = scipy.linalg.eigh(H, metric)
            if m == 1 and np.abs(rot).max() > 1e-8 * np.abs(mu).max():
                align = np.abs(rot @ metric @ vecs) / (math.sqrt(rot @ metric @ rot)
                                                       * np.sqrt(np.sum(vecs * (metric @ vecs), axis=0)))
                vals = np.delete(vals, int(np.argmax(align[:4])))
            out[m - 1] = vals[0]
        return out
