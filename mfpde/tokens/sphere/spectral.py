"""The zonal stationary states of noisy tokens on S² in Legendre coefficients, where the kernel is diagonal.

The same equation as :mod:`mfpde.tokens.sphere.stationary` (theory §10): μ = p(μ) := exp(κ G∗μ)/∫exp(κ G∗μ),
κ = K/(τβ), G∗μ(x) = ∫ e^{β x·y} μ(y) dσ(y), on the zonal states μ(t) = Σ_{ℓ=0}^{n−1} c_ℓ P_ℓ(t), t = x_3. The
unknowns are the Legendre coefficients c_ℓ: by the Funk–Hecke formula the convolution is diagonal,
G∗P_ℓ = λ_ℓ P_ℓ with λ_ℓ = 4π i_ℓ(β) exactly (i_ℓ the modified spherical Bessel function), so no kernel matrix is
collocated. The nonlinearity is evaluated at the n Gauss–Legendre nodes t_i (weights w_i, q = 2π w the rule of
∫_{S²} for zonal functions) and projected back by the same rule (exact for degrees ≤ n−1): with V_iℓ = P_ℓ(t_i)
and C the projection (C V = I),

    F(c, K) = c − C p,   ∂F/∂c = I − κ C (diag p − p (q∘p)ᵀ) V Λ,   ∂F/∂K = −(τβ)⁻¹ C (diag p − p (q∘p)ᵀ) V Λ c,

Λ = diag(λ_ℓ): the collocation of :class:`~mfpde.tokens.sphere.stationary.SphereStationary` at the same n nodes with
its kernel matrix replaced by the exact one on the polynomials of degree < n (they differ by the quadrature error
of the azimuthally integrated kernel: spectrally small). K_c = τβ/i_1(β) to round-off. Newton's method is numpy's
(:class:`~mfpde.continuation_newton.DenseNewton`: no PETSc).

Stability against ZONAL perturbations: L δμ = ∇·(μ ∇(H δμ)), H δμ = τ δμ/μ − (K/β) G∗δμ (the Wasserstein gradient
flow: L = −𝓜H, 𝓜 = −∇·μ∇ ≥ 0); in the degrees ℓ = 1..n−1 (mass zero) the Galerkin matrices
H_jk = ∫ P_j H P_k dσ, M_jk = ∫ μ (1−t²) P_j′ P_k′ dσ (Gauss–Legendre on 2n nodes) and the Gram matrix G give
L = −G⁻¹ M G⁻¹ H, whose eigenvalues are those of the symmetric −Rᵀ Ĥ R, Ĥ = G^{−½} H G^{−½},
G^{−½} M G^{−½} = R Rᵀ: real, by a symmetric eigensolver. About 1/4π they are K ℓ(ℓ+1) i_ℓ(β)/β − τ ℓ(ℓ+1), as the
collocation's. Against the NON-ZONAL perturbations f(t) cos mφ, m = 1..8: the free energy's second variation at
the n nodes, as :meth:`SphereStationary.azimuthal_hessian` (its state-free kernels built once), in its symmetric
form τ I − (K/2πβ) s sᵀ ∘ B_m, s = √(q μ); the verdict (> −1e-9 τ) by a Cholesky factorisation, the rotations
(m = 1, f = √(1−t²) μ′) shifted out of the way first.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from numpy.polynomial import legendre

from mfpde.tokens.bessel import iv_orders, spherical_in_orders
from mfpde.tokens.spectral_gibbs import SpectralGibbs

__all__ = ["SphereSpectral"]

Array = npt.NDArray[np.float64]
#: The azimuthal orders m ≥ 1 whose second variation :meth:`SphereSpectral.stability` examines.
AZIMUTHAL_ORDERS = 8


class SphereSpectral(SpectralGibbs):
    """The zonal stationary states in the Legendre coefficients c_0..c_{L′}; β, τ fixed; K the parameter.

    n = ``points`` Gauss–Legendre nodes carry the nonlinearity (its resolution: the states' sharpness); the unknowns
    are the coefficients of the degrees ℓ ≤ L′ = min(n−1, the first ℓ with (2ℓ+1) i_ℓ(β) < 1e-18 i_0(β)): beyond L′
    the kernel's eigenvalues vanish to round-off, so that the Gibbs exponent, hence μ = p(μ) itself, depends on those
    coefficients alone (the density of a point is p(c), exact at any t).

    Args:
        points: n ≥ 9, the Gauss–Legendre nodes of the nonlinearity.
        beta: β > 0 of the head (its a), ≤ 700.
        noise: τ > 0.

    Raises:
        ValueError: n < 9, τ ≤ 0, β ≤ 0.
    """

    domain = "sphere"
    discretisation = "spectral"
    #: the continuation solves it by numpy's Newton (:class:`mfpde.continuation_newton.DenseNewton`), not PETSc's SNES
    dense_newton = True
    #: the kernel's eigenvalues (2ℓ+1) i_ℓ(β) below this times i_0(β) are dropped (with the coefficients they multiply)
    KERNEL_TOL = 1e-18
    #: the zonal stability block stops 2 degrees beyond the state's last coefficient above this times c_0
    BLOCK_TOL = 1e-14

    def __init__(self, points: int, beta: float, noise: float):
        if points < 9:
            raise ValueError(f"the spectral discretisation needs >= 9 points, got {points}")
        if not noise > 0 or not beta > 0:
            raise ValueError(f"need τ > 0 and β > 0, got τ = {noise}, β = {beta}")
        n = self.N = int(points)
        self.beta, self.noise = float(beta), float(noise)
        self._in = spherical_in_orders(n, self.beta)  # i_ℓ(β), ℓ = 0..n (Miller's recurrence: no scipy)
        ell = np.arange(n + 1)
        small = np.nonzero((2 * ell[1:] + 1) * self._in[1:] < self.KERNEL_TOL * self._in[0])[0]
        self.m = min(n - 1, int(small[0]) + 1 if len(small) else n - 1) + 1  # unknowns c_0..c_{L′}
        self.ell = np.arange(self.m)
        self.t, self.w = legendre.leggauss(n)
        self.q = 2 * math.pi * self.w
        V = np.asarray(legendre.legvander(self.t, n - 1), dtype=float)
        self.C_all = ((2 * np.arange(n) + 1) / 2)[:, None] * (V * self.w[:, None]).T  # values → all n coefficients
        self.C = self.C_all[: self.m]
        self.V = V[:, : self.m]
        self.lam = 4 * math.pi * self._in[: self.m]  # λ_ℓ = 4π i_ℓ(β)
        self.VL = self.V * self.lam[None, :]
        self.gram = 4 * math.pi / (2 * self.ell + 1)  # ∫_{S²} P_ℓ² dσ
        self._I = np.eye(self.m)
        self._In = np.eye(n)
        # √(1−t²) P_ℓ′(t_i), ℓ ≤ L′: the rotations' f = √(1−t²) μ′ at the nodes (μ′ = κ μ (G∗μ)′ from the unknowns)
        self.sdVL = _sine_derivatives(self.t, V)[:, : self.m] * self.lam[None, :]
        self._fine: tuple[Array, ...] | None = None
        self._gibbs_setup(self.VL, self.C, self.q)
        #: what the continuation's report adds: the discretisation and its number of unknowns
        self.report_fields = {"discretisation": self.discretisation, "unknowns": self.m}
        self._B: dict[int, Array] = {}

    # -- states ---------------------------------------------------------------------------------
    def uniform(self) -> Array:
        """The uniform state 1/4π: c = (1/4π, 0, ...), shape (n,)."""
        u = np.zeros(self.m)
        u[0] = 1.0 / (4 * math.pi)
        return u

    def density(self, u: Array, K: float | None = None) -> Array:
        """μ at the n nodes, shape (n,).

        With K the Gibbs density p(c) of the point (c, K) (the state itself where it is a solution), without it the
        sum of the unknowns' Legendre polynomials (the degrees ≤ L′ of μ).
        """
        return np.array(self._gibbs(u, K)[0]) if K is not None else self.V @ u

    def mode_state(self, k: int) -> Array:
        """P_k: the k-th unit vector (the null vector of the uniform state's Jacobian at τβ/i_k(β)), shape (n,)."""
        return np.array(self._I[k])

    def threshold(self, k: int) -> float:
        """τβ/i_k(β): where degree k of the uniform state turns unstable (theory §10)."""
        i_k = self._in[k] if k < len(self._in) else spherical_in_orders(k, self.beta)[k]
        return self.noise * self.beta / float(i_k)

    def inner_weights(self) -> Array:
        """W on x = (c, K): 4π ∫ μ² dσ in the coefficients (16π²/(2ℓ+1)), 1 for K, shape (n+1,).

        The collocation's (4π)²/n per node gives the same norm to the uniform state.
        """
        return np.concatenate([4 * math.pi * self.gram, [1.0]])

    def amplitude(self, k: int) -> Array:
        """The row r with r·c = ∫ μ P_k dσ = 4π c_k/(2k+1) (degree k's zonal amplitude), shape (n,)."""
        r = np.zeros(self.m)
        if 0 <= k < self.m:
            r[k] = self.gram[k]
        return r

    def dominant_mode(self, u: Array) -> int:
        """The degree ℓ ≥ 1 of the largest Legendre coefficient in the L² norm of S², |c_ℓ| √(4π/(2ℓ+1))."""
        c = np.abs(np.asarray(u, float)) * np.sqrt(self.gram)
        c[0] = 0.0
        return int(np.argmax(c))

    # -- what a branch reports ----------------------------------------------------------------------
    def order_parameter(self, u: Array) -> float:
        """|∫ x dμ| / ∫ dμ = |c_1|/(3 c_0) (0 uniform, 1 a point mass)."""
        return float(abs(u[1]) / (3 * u[0]))

    def signed_amplitude(self, u: Array) -> float:
        """∫ μ x_3 dσ = 4π c_1/3 (with its sign: a cluster at the north or the south pole)."""
        return float(4 * math.pi * u[1] / 3)

    def interaction(self, u: Array) -> float:
        """∬ e^{β x·y} dμ dμ = Σ_ℓ λ_ℓ ∫P_ℓ² dσ c_ℓ² (exact in the coefficients)."""
        return float(np.sum(self.lam * self.gram * u * u))

    def free_energy(self, u: Array, K: float) -> float:
        """E(μ) = τ ∫ μ log μ − (K/2β) ∬ e^{β x·y} dμ dμ (theory §10) of a solution (c, K).

        The entropy of μ = p(c) by the Gauss rule, the interaction in the coefficients.
        """
        mu = self._gibbs(u, K)[0]
        ent = self.noise * float(self.q @ (mu * np.log(np.where(mu > 0, mu, 1.0))))
        return ent - K / (2 * self.beta) * self.interaction(u)

    def resolved(self, u: Array, tol: float = 1e-9) -> bool:
        """Whether μ's highest Legendre coefficients (the top eighth of the n) are below ``tol`` times its mean.

        The collocation's rule; μ the sum of the unknowns' polynomials (:meth:`resolved_point`: the density of a point).
        """
        return self._tail(self.V @ np.asarray(u, float), tol)

    def resolved_point(self, x: Array, tol: float = 1e-9) -> bool:
        """:meth:`resolved` of the Gibbs density p(c) of the point x = (c, K): the state itself."""
        return self._tail(self._gibbs(x[:-1], float(x[-1]))[0], tol)

    def _tail(self, mu: Array, tol: float) -> bool:
        c = np.abs(self.C_all @ mu)
        return bool(c[-max(2, self.N // 8):].max() <= tol * c[0])

    # -- stability ----------------------------------------------------------------------------------
    def _fine_rule(self) -> tuple[Array, ...]:
        """The 2n Gauss–Legendre nodes' weights of ∫_{S²}, λ_ℓ P_ℓ (ℓ ≤ L′), P_ℓ and √(1−t²) P_ℓ′ (1 ≤ ℓ < n) there."""
        if self._fine is None:
            n = self.N
            t, w = legendre.leggauss(2 * n)
            V = np.asarray(legendre.legvander(t, n - 1), dtype=float)
            self._fine = (2 * math.pi * w, V[:, : self.m] * self.lam[None, :], V[:, 1:], _sine_derivatives(t, V)[:, 1:])
        return self._fine

    def block_size(self, u: Array, K: float) -> int:
        """The degrees 1..Lt of the zonal block: 2 beyond the state's last Legendre coefficient above BLOCK_TOL c_0.

        The coefficients in the norm of L²(S²) (c_ℓ/√(2ℓ+1)), whose round-off does not grow with ℓ.
        At least the unknowns' degrees, at most n−1. The leading eigenvectors are as smooth as the state (as on the
        circle, :meth:`~mfpde.tokens.circle.spectral.CircleSpectral.block_size`).
        """
        coef = np.abs(self.C_all @ self._gibbs(u, K)[0]) / np.sqrt(2 * np.arange(self.N) + 1)  # in L²(S²)'s norm
        big = np.nonzero(coef >= self.BLOCK_TOL * coef[0])[0]
        return int(min(self.N - 1, max(self.m + 1, int(big[-1]) + 2)))

    def zonal_block(self, u: Array, K: float, degrees: int | None = None) -> Array:
        """The symmetric −Rᵀ Ĥ R of the zonal perturbations (module docstring), degrees 1..``degrees`` (n−1)."""
        qf, VLf, P, dP = self._fine_rule()
        Lt = self.N - 1 if degrees is None else degrees
        P, dP = P[:, :Lt], dP[:, :Lt]
        g = K / (self.noise * self.beta) * (VLf @ np.asarray(u, float))
        mu = np.exp(g - g.max())
        mu /= float(qf @ mu)  # the state p(c) at the fine nodes
        gram = 4 * math.pi / (2 * np.arange(1, Lt + 1) + 1)
        lam = np.zeros(Lt)
        lam[: self.m - 1] = self.lam[1:]  # λ_ℓ ≈ 0 beyond L′
        h = 1.0 / np.sqrt(gram)  # G^{−½}
        H = self.noise * (P * (qf / mu)[:, None]).T @ P
        H[np.diag_indices_from(H)] -= K / self.beta * lam * gram
        Mm = (dP * (qf * mu)[:, None]).T @ dP
        R = np.linalg.cholesky(h[:, None] * Mm * h[None, :])
        return -(R.T @ (h[:, None] * H * h[None, :]) @ R)

    def _kernel(self, m: int) -> Array:
        """e^{β t t′} 2π I_m(β s s′) at the n nodes (state-free: the orders 1..8 built at the first call)."""
        if m not in self._B:
            s = np.sqrt(1.0 - self.t**2)
            ss, tt = self.beta * np.outer(s, s), self.beta * np.outer(self.t, self.t)
            top = max(m, AZIMUTHAL_ORDERS)
            Im = iv_orders(top, ss)
            with np.errstate(over="ignore"):  # I_m(β s s′) e^{β t t′} ≤ e^β: finite to β = 700
                for j in range(1, top + 1):
                    self._B[j] = 2 * math.pi * Im[j] * np.exp(tt)
        return self._B[m]

    def azimuthal_stable(self, u: Array, K: float, orders: int = AZIMUTHAL_ORDERS) -> bool:
        """Whether the second variation on f(t) cos mφ, m = 1..orders, is > −1e-9 τ (module docstring).

        The symmetric form S_m = τ I − (K/2πβ) s sᵀ ∘ B_m (s = √(q μ): the metric ∫ f²/μ made the identity) is
        tested by a Cholesky factorisation of S_m + 1e-9 τ I. At m = 1 the rotations of a non-uniform state
        (g = √(q/μ) √(1−t²) μ′, eigenvalue 0) are first shifted to τ by adding τ ĝĝᵀ.
        """
        mu, kappa = self._gibbs(u, K)
        s = np.sqrt(self.q * mu)
        rot = kappa * mu * (self.sdVL @ np.asarray(u, float))  # √(1−t²) μ′, μ′ = κ μ (G∗μ)′
        shift = 1e-9 * self.noise * self._In
        for m in range(1, orders + 1):
            S = self.noise * self._In - K / (2 * math.pi * self.beta) * np.outer(s, s) * self._kernel(m) + shift
            if m == 1 and np.abs(rot).max() > 1e-8 * np.abs(mu).max():
                g = rot * np.sqrt(self.q / mu)
                g /= np.linalg.norm(g)
                S += self.noise * np.outer(g, g)
            try:
                np.linalg.cholesky(S)
            except np.linalg.LinAlgError:
                return False
        return True

    def stability(self, u: Array, K: float, count: int = 4,
                  solver: str = "dense") -> tuple[npt.NDArray[np.complex128], bool]:
        """(the ``count`` leading zonal eigenvalues, stable), non-zonal orders m = 1..8 included.

        Args:
            u: the state (n,).
            K: the coupling.
            count: how many eigenvalues of largest real part are returned.
            solver: ignored (the zonal block is symmetric and small: numpy's eigvalsh answers).

        Returns:
            (the zonal eigenvalues sorted by decreasing real part, shape (count,) complex (real here); True if they
            are < 0 up to 1e-9 times the largest |eigenvalue| and :meth:`azimuthal_stable`).
        """
        try:
            block = self.zonal_block(u, K, self.block_size(u, K))
            vals = np.sort(np.linalg.eigvalsh(block))[::-1][:count].astype(complex)
        except np.linalg.LinAlgError:  # μ not positive somewhere: no stability to speak of
            return np.full(count, np.nan, dtype=complex), False
        zonal = bool(np.all(vals.real < 1e-9 * max(1.0, float(np.abs(vals).max(initial=0.0)))))
        return vals, zonal and self.azimuthal_stable(u, K)


def _sine_derivatives(t: Array, V: Array) -> Array:
    """√(1−t²) P_ℓ′(t) from V = P_ℓ(t), ℓ = 0..L, at nodes |t| < 1: ℓ (P_{ℓ−1} − t P_ℓ)/√(1−t²), shape of V."""
    out = np.zeros_like(V)
    ell = np.arange(1, V.shape[1])
    out[:, 1:] = ell[None, :] * (V[:, :-1] - t[:, None] * V[:, 1:]) / np.sqrt(1.0 - t**2)[:, None]
    return out
