"""The independent reference of the continuation checks: zonal stationary states of noisy tokens from the definitions.

:class:`ZonalReference` solves the stationary equation μ = e^{κ G∗μ}/∫e^{κ G∗μ} (κ = K/(τβ)) in the coefficients
a_ℓ = ∫ μ φ_ℓ dσ of the zonal basis (cos ℓθ on the circle's even states, P_ℓ(cos ϑ) on the sphere's zonal ones),
where the kernel is diagonal (λ_ℓ = 2π I_ℓ(β), 4π i_ℓ(β): scipy.special), parameterised by the amplitude of the
branch's mode, by Newton with the exact Jacobian. The closed forms of c₂ and c₁ from the weakly nonlinear expansion
(:func:`closed_c2`, :func:`closed_c1`), and the free energy's second variation assembled densely
(:func:`second_variation_least`, :func:`sphere_second_variation_least`). No code of mfpde's solvers is used here;
the checks are in :mod:`mfpde.verify.continuation_checks` and :mod:`mfpde.verify.continuation_branches`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import scipy.optimize
import scipy.special

__all__ = ["FOLD_XATOL", "ZonalReference", "azimuthal_kernels", "circle_state", "closed_c1", "closed_c2",
           "second_variation_least", "sphere_second_variation_least", "sphere_state"]

Array = npt.NDArray[np.float64]
EPS = float(np.finfo(float).eps)
#: Brent's tolerance in the amplitude of the reference's fold.
FOLD_XATOL = 1e-9


class ZonalReference:
    """The stationary equation in zonal coefficients (module docstring), for one branch of mode ``k``.

    Args:
        domain: "circle" (even states, basis cos ℓθ) or "sphere" (zonal states, basis P_ℓ(cos ϑ)).
        beta, tau: β, τ.
        k: the branch's mode; its coefficients are those of ℓ in ``modes`` (default: the multiples of k, or all
            degrees on the sphere for odd k; the symmetry class of the branch).
        L: how many coefficients; nodes: the quadrature's nodes.
    """

    def __init__(self, domain: str, beta: float, tau: float, k: int = 1, L: int = 48, nodes: int = 0,
                 modes: Sequence[int] | None = None):
        self.domain, self.beta, self.tau, self.k = domain, float(beta), float(tau), int(k)
        if modes is None:
            modes = [k * j for j in range(1, L + 1)] if domain == "circle" or k % 2 == 0 else list(range(1, L + 1))
        self.modes = np.asarray(modes)
        if domain == "circle":
            n = nodes or 512
            x = 2 * math.pi * np.arange(n) / n
            self.w = np.full(n, 2 * math.pi / n)
            self.phi = np.cos(np.outer(self.modes, x))  # (L, n)
            lam = 2 * math.pi * scipy.special.iv(self.modes, self.beta)
            norm = np.full(len(self.modes), math.pi)
        else:
            n = nodes or 128
            z, wz = np.polynomial.legendre.leggauss(n)
            self.w = 2 * math.pi * wz
            self.phi = np.array([scipy.special.eval_legendre(int(ell), z) for ell in self.modes])
            lam = 4 * math.pi * scipy.special.spherical_in(self.modes, self.beta)
            norm = 4 * math.pi / (2 * self.modes + 1)
        self.g = lam / norm  # G∗μ = const + Σ_ℓ g_ℓ a_ℓ φ_ℓ
        self.i = int(np.flatnonzero(self.modes == k)[0])
        # at the uniform state a_k = κ g_k a_k ‖φ_k‖²/|Ω| (‖φ_k‖² = norm) ⇒ κ_c = |Ω|/λ_k
        area = 2 * math.pi if domain == "circle" else 4 * math.pi
        self.K_c = self.tau * self.beta * area / float(lam[self.i])
        self._cache: dict[float, Array] = {}

    def _gibbs(self, c: Array, kappa: float) -> tuple[Array, Array]:
        h = (self.g * c) @ self.phi
        e = kappa * h
        p = self.w * np.exp(e - e.max())
        return p / p.sum(), h

    def solve(self, a: float, guess: Array | None = None, tol: float = 1e-15) -> Array:
        """The stationary state of amplitude a: (a_ℓ for ℓ in modes, a_k = a; κ), by Newton to |F| ≤ ``tol``."""
        if guess is None:
            near = min(self._cache, key=lambda b: abs(b - a)) if self._cache else None
            if near is not None:
                guess = self._cache[near]
            else:
                guess = np.zeros(len(self.modes) + 1)
                guess[-1] = self.K_c / (self.tau * self.beta)
        z = np.array(guess, dtype=float)
        z[self.i] = a
        free = np.ones(len(z), bool)
        free[self.i] = False
        for _ in range(80):
            c, kappa = z[:-1], z[-1]
            p, h = self._gibbs(c, kappa)
            mean = self.phi @ p
            F = c - mean
            if np.max(np.abs(F)) <= tol:
                self._cache[float(a)] = z.copy()
                return z
            P = self.phi * p
            cov = P @ self.phi.T - np.outer(mean, mean)
            J = np.empty((len(c), len(z)))
            J[:, :-1] = np.eye(len(c)) - kappa * cov * self.g[None, :]
            J[:, -1] = -(P @ h - mean * (p @ h))
            dz = np.linalg.solve(J[:, free], -F)
            z[free] += dz
            if np.max(np.abs(dz)) <= 4 * EPS * max(1.0, np.max(np.abs(z))):
                self._cache[float(a)] = z.copy()
                return z
        raise ArithmeticError(f"the reference's Newton did not converge at amplitude {a:g} ({self.domain}, "
                              f"β = {self.beta:g}, mode {self.k})")

    def K(self, a: float) -> float:
        """The coupling of the stationary state of amplitude a."""
        return float(self.solve(a)[-1]) * self.tau * self.beta

    def fold(self, a_max: float = 0.95, da: float = 0.02) -> tuple[float, float]:
        """(K_f, a_f): the least K over the branch (a scan in a from 0, then scipy's bounded Brent, xatol 1e-9)."""
        grid, Ks = [], []
        a = da
        while a <= a_max:
            grid.append(a)
            Ks.append(self.K(a))
            if len(Ks) >= 3 and Ks[-1] > Ks[-2] < Ks[-3]:
                break
            a += da
        else:
            raise ArithmeticError("no fold in the reference's branch up to amplitude {a_max}")
        res = scipy.optimize.minimize_scalar(self.K, bounds=(grid[-3], grid[-1]), method="bounded",
                                             options={"xatol": FOLD_XATOL})
        return float(res.fun), float(res.x)

    def curvature_in_a(self, a: float, h: float = 1e-3) -> float:
        """K''(a) by the central difference (K(a + h) − 2K(a) + K(a − h))/h²."""
        return (self.K(a + h) - 2 * self.K(a) + self.K(a - h)) / h**2

    def probes(self, rho: float, count: int = 3) -> dict[float, float]:
        """K(a) at a = ±ρ, ±2ρ, …, ±count·ρ, each Newton from the previous."""
        out = {}
        for s in (1, -1):
            self._cache.clear()
            for j in range(1, count + 1):
                out[s * j * rho] = self.K(s * j * rho)
        return out


def closed_c2(domain: str, beta: float, tau: float, k: int, d: int = 3) -> float:
    """c₂ = dK/d(a²) at the branch point of mode k (circle) or degree 1 (sphere, S^{d−1}), from the expansion below.

    With g = κ Σ_ℓ g_ℓ a_ℓ φ_ℓ and |Ω|μ = e^g/⟨e^g⟩ (⟨·⟩ the mean over Ω), a_ℓ = ⟨(g + g²/2 + g³/6 − g⟨g²⟩/2) φ_ℓ⟩
    to third order. Circle, mode k (θ → kθ): a_{2k} = g_{2k}/2 + g_k²/8, so a_{2k} = g_k²/(8(1 − κI_{2k})); then
    a_k = g_k/2 + g_k g_{2k}/4 − g_k³/16 with g_k = 2κI_k a_k gives κ − κ_k = a²(1 − 2r)/(2I_k(1 − r)), r = I_{2k}/I_k.
    Sphere, degree 1 (⟨z²P_2⟩ = 2/15, ⟨z⁴⟩ = 1/5): a_2 = g_1²/(15(1 − κi_2)), a_1 = g_1/3 + (2/15)g_1g_2 − g_1³/45
    with g_1 = 3κ i_1 a, so κ − κ_1 = (3/5)a²(1 − 3r)/(i_1(1 − r)), r = i_2/i_1. K = τβκ. S^{d−1} (``domain``
    "hypersphere"), in the normalised measure with Gegenbauer P_ℓ(1) = 1, N_ℓ harmonics of degree ℓ, g_ℓ = κN_ℓλ_ℓa_ℓ:
    ⟨z²⟩ = 1/d, ⟨z⁴⟩ = 3/(d(d+2)), ⟨z²P_2⟩ = (d−1)/(dN_2), N_2 = (d+2)(d−1)/2 give
    κ − κ_1 = a² d(1 − dr)/(λ_1(d+2)(1 − r)), r = λ_2/λ_1: c₂ = K_1 d(1 − dr)/((d+2)(1 − r)) (d = 2, 3: the above).
    """
    if domain == "hypersphere":
        from mfpde.verify.hypersphere_special import k_c, lam

        r = float(lam(2, beta, d) / lam(1, beta, d))
        return k_c(beta, tau, d) * d * (1 - d * r) / ((d + 2) * (1 - r))
    if domain == "circle":
        r = float(scipy.special.iv(2 * k, beta) / scipy.special.iv(k, beta))
        return tau * beta / float(scipy.special.iv(k, beta)) * (1 - 2 * r) / (2 * (1 - r))
    if k != 1:
        raise ValueError("the sphere's closed form of c₂ is that of degree 1")
    i1, i2 = (float(scipy.special.spherical_in(j, beta)) for j in (1, 2))
    r = i2 / i1
    return tau * beta / i1 * 0.6 * (1 - 3 * r) / (1 - r)


def closed_c1(domain: str, beta: float, tau: float, k: int) -> float:
    """c₁ = dK/da at the branch point: 0 where a ↦ −a is a symmetry (every circle mode, odd degrees on S²).

    Sphere, degree 2: a_2 = g_2/5 + ⟨P_2³⟩g_2²/2 with ⟨P_2³⟩ = 2/35 and g_2 = 5κi_2 a, so κ − κ_2 = −(5/7)a/i_2 and
    c₁ = −(5/7) K_2, K_2 = τβ/i_2(β).
    """
    if domain == "circle" or k % 2 == 1:
        return 0.0
    if k != 2:
        raise ValueError("the sphere's closed form of c₁ is that of degree 2")
    return -5 / 7 * tau * beta / float(scipy.special.spherical_in(2, beta))


def second_variation_least(mu: Array, dmu: Array | None, K: float, beta: float, tau: float) -> float:
    """The least eigenvalue of δ²E on the mass-zero perturbations of a state μ on the circle, μ′ left out.

    μ at N equispaced angles (N ≫ the state's bandwidth); metric ∫ν²/μ. With ψ = ν √(h/μ):
    δ²E = τ|ψ|² − (K/β) h ψᵀ S G S ψ, S = diag √μ, G_ij = e^{β cos(θ_i − θ_j)}, on ψ ⊥ √μ (mass zero) and, where
    ``dmu`` (μ′ at the angles) is given, ψ ⊥ μ′/√μ (the translation, eigenvalue 0).
    """
    N = len(mu)
    h = 2 * math.pi / N
    th = h * np.arange(N)
    G = np.exp(beta * np.cos(th[:, None] - th[None, :]))
    s = np.sqrt(mu)
    H = tau * np.eye(N) - (K / beta) * h * (s[:, None] * G * s[None, :])
    cons = [s] if dmu is None else [s, dmu / s]
    Q = np.linalg.svd(np.array(cons).T, full_matrices=True)[0][:, len(cons):]
    return float(np.linalg.eigvalsh(Q.T @ H @ Q)[0])


def circle_state(ref: ZonalReference, a: float, n: int) -> tuple[Array, Array | None, float]:
    """(μ, μ′ (None for the uniform state), K) of the reference's state of amplitude a at n angles."""
    th = 2 * math.pi * np.arange(n) / n
    if a == 0.0:
        return np.full(n, 1 / (2 * math.pi)), None, math.nan
    z = ref.solve(a)
    c, kappa = z[:-1], z[-1]
    hh = (ref.g * c) @ np.cos(np.outer(ref.modes, th))
    dh = -(ref.g * c * ref.modes) @ np.sin(np.outer(ref.modes, th))
    e = np.exp(kappa * (hh - hh.max()))
    mu = e / (2 * math.pi / n * e.sum())
    return mu, kappa * dh * mu, float(kappa) * ref.tau * ref.beta


def azimuthal_kernels(t: Array, beta: float, orders: int = 8) -> list[Array]:
    """K_m(t, t′) = 2π I_m(β s s′) e^{β t t′} at the nodes t, m = 0..orders (s = √(1 − t²))."""
    s = np.sqrt(1 - t**2)
    ss, tt = beta * np.outer(s, s), beta * np.outer(t, t)
    return [2 * math.pi * scipy.special.ive(m, ss) * np.exp(ss + tt) for m in range(orders + 1)]


def sphere_second_variation_least(t: Array, w: Array, mu: Array, dmu: Array | None, K: float, beta: float,
                                  tau: float, kernels: Sequence[Array]) -> float:
    """The least eigenvalue of δ²E on perturbations f(t) cos mφ, m = 0..orders, of a zonal state on S².

    Gauss–Legendre nodes t, weights w; μ and μ′ at them. δ²E = c_m [τ∫f²/μ dt − (K/β)∬ f K_m f′], c_0 = 2π,
    c_m = π, K_m(t, t′) = 2π I_m(β s s′) e^{β t t′} (s = √(1 − t²)), in the metric ∫f²/μ dt; m = 0 on ∫f dt = 0,
    m = 1 without the rotations f = s μ′ (where ``dmu`` is given); ``kernels``: :func:`azimuthal_kernels`.
    """
    s = np.sqrt(1 - t**2)
    r = np.sqrt(w * mu)
    least = math.inf
    for m, Km in enumerate(kernels):
        H = tau * np.eye(len(t)) - (K / beta) * (r[:, None] * Km * r[None, :])
        cons = [r] if m == 0 else ([s * dmu * np.sqrt(w / mu)] if m == 1 and dmu is not None else [])
        if cons:
            Q = np.linalg.svd(np.array(cons).T, full_matrices=True)[0][:, len(cons):]
            H = Q.T @ H @ Q
        least = min(least, float(np.linalg.eigvalsh(H)[0]))
    return least


def sphere_state(ref: ZonalReference, a: float, t: Array) -> tuple[Array, Array | None, float]:
    """(μ, μ′ (None for the uniform state), K) of the reference's zonal state of amplitude a at the nodes t."""
    if a == 0.0:
        return np.full(len(t), 1 / (4 * math.pi)), None, math.nan
    z = ref.solve(a)
    c, kappa = z[:-1], z[-1]
    P = np.array([scipy.special.eval_legendre(int(ell), t) for ell in ref.modes])
    dP = np.array([np.polynomial.legendre.legval(t, np.polynomial.legendre.legder(np.eye(int(ell) + 1)[-1]))
                   for ell in ref.modes])
    hh, dh = (ref.g * c) @ P, (ref.g * c) @ dP
    e = np.exp(kappa * (hh - hh.max()))
    _, wz = np.polynomial.legendre.leggauss(len(t))
    mu = e / (2 * math.pi * float(wz @ e))
    return mu, kappa * dh * mu, float(kappa) * ref.tau * ref.beta
