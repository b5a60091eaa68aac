"""Independent spectral reference for zonal stationary states of noisy tokens on the sphere S^{d-1}, d >= 2.

Written from the definitions only (no code of the package is used), pure numpy/scipy in float64.

Conventions
-----------
* σ is the unnormalised surface measure on S^{d-1}, |S^k| = 2π^{(k+1)/2}/Γ((k+1)/2); ν = σ/|S^{d-1}| is the
  probability measure. A zonal density μ(z), z = x·e ∈ [-1, 1], is a probability density w.r.t. σ; internally
  the code works with ρ = |S^{d-1}| μ, the density w.r.t. ν (ρ = 1 is the uniform state), so that no power of
  π or Gamma function of d ever has to be formed (large d is safe). Under ν the law of z is
  dν(z) = (1 - z²)^α dz / B, α = (d-3)/2, with B its normalising constant.
* Kernel k(x, y) = e^{β x·y}. Funk–Hecke: ∫ e^{β x·y} P_ℓ(y·e) dν(y) = λ_ℓ(β) P_ℓ(x·e), with P_ℓ the Gegenbauer
  polynomial C_ℓ^{(d-2)/2} normalised to P_ℓ(1) = 1 (Chebyshev T_ℓ for d = 2) and
  λ_ℓ(β) = Γ(d/2) (2/β)^{d/2-1} I_{ℓ+d/2-1}(β)  (d = 2: I_ℓ(β); d = 3: i_ℓ(β)).
  ∫ P_ℓ P_m dν = δ_ℓm / N(d, ℓ), N(d, ℓ) = dimension of the degree-ℓ spherical harmonics.
* Stationary states at coupling K, noise τ > 0: μ = e^{κΦ}/∫e^{κΦ}dσ, Φ(x) = ∫ e^{β x·y} μ(y) dσ(y),
  κ = K/(τβ). Free energy E(μ) = τ ∫ μ log μ dσ − K/(2β) ∬ e^{β x·y} μ(x) μ(y) dσ dσ (absolute, so the uniform
  state has E_0(K) = −τ log|S^{d-1}| − K λ_0(β)/(2β)).
* Unknowns (spectral, Gegenbauer basis): the moments m_ℓ = ∫ ρ P_ℓ dν = ∫ μ P_ℓ dσ, ℓ = 1..L (m_0 = 1 is the
  mass). Then Φ = Σ_ℓ g_ℓ m_ℓ P_ℓ with g_ℓ = N(d, ℓ) λ_ℓ(β) (diagonal). The amplitude a = m_1 = ∫ μ z dσ
  parameterises the branch: for given a, Newton (exact Jacobian, from covariances under ρ dν) solves
  G_ℓ(κ, m) = ∫ e^{κΦ} P_ℓ dν / ∫ e^{κΦ} dν − m_ℓ = 0, ℓ = 1..L, for (κ, m_2..m_L). Integrals in z use an
  n-point Gauss–Jacobi rule with weight (1 − z²)^α (scipy.special.roots_jacobi), the exponential handled in
  log-sum-exp form. Default truncation L = n // 2. The special functions: :mod:`mfpde.verify.hypersphere_special`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import scipy.optimize
import scipy.special as sp

from mfpde.verify.hypersphere_special import (  # noqa: F401  (re-exported)
    _check_d,
    _log_harmonic_dimension,
    _log_lam,
    beta_star,
    gegenbauer,
    harmonic_dimension,
    k_c,
    lam,
    log_bessel_i,
    log_sphere_area,
)

__all__ = ["Branch", "FoldMaxwell", "State", "beta_star", "branch", "fold_and_maxwell", "fold_maxwell_point",
           "gegenbauer", "harmonic_dimension", "k_c", "lam", "log_bessel_i", "log_sphere_area", "solve_state"]



@dataclass(frozen=True)
class State:
    """A zonal stationary state on the branch, at amplitude a = ∫ μ z dσ.

    Attributes:
        a: amplitude ∫ μ z dσ (the ℓ = 1 moment), in (−1, 1).
        K: coupling K at which this state is stationary.
        kappa: κ = K/(τβ).
        moments: m_ℓ = ∫ μ P_ℓ dσ for ℓ = 0..L (m_0 = 1, m_1 = a).
        free_energy: E(μ) (absolute, see module docstring).
        free_energy_uniform: E(μ_0) of the uniform state at the same K.
        delta_free_energy: E(μ) − E(μ_0), computed directly (no cancellation of the −τ log|S^{d−1}| term).
        dK_da: dK/da along the branch (implicit differentiation of the discrete equations).
        iterations: Newton iterations used.
    """

    a: float
    K: float
    kappa: float
    moments: np.ndarray
    free_energy: float
    free_energy_uniform: float
    delta_free_energy: float
    dK_da: float
    iterations: int


class _Spectral:
    """Discretisation for fixed (β, τ, d, n, L): Gauss–Jacobi nodes, P_ℓ table, g_ℓ = N(d,ℓ) λ_ℓ(β)."""

    def __init__(self, beta: float, tau: float, d: int, n: int, L: int | None = None) -> None:
        _check_d(d)
        if not (beta > 0 and tau > 0):
            raise ValueError(f"beta and tau must be > 0, got beta={beta}, tau={tau}")
        if n < 4:
            raise ValueError(f"need n >= 4 quadrature nodes, got {n}")
        self.beta, self.tau, self.d, self.n = float(beta), float(tau), int(d), int(n)
        self.L = int(L) if L is not None else max(3, n // 2)
        if not 2 <= self.L <= n - 1:
            raise ValueError(f"truncation L={self.L} must be in [2, n-1]")
        alpha = 0.5 * (d - 3)
        z, w = sp.roots_jacobi(n, alpha, alpha)
        if not (np.all(np.isfinite(w)) and np.all(w > 0)):
            raise FloatingPointError(f"Gauss-Jacobi weights not finite/positive for n={n}, alpha={alpha}")
        self.z = z
        self.logw = np.log(w) - math.log(w.sum())  # probability weights of ν in z
        P = gegenbauer(self.L, z, d)
        P[np.abs(P) < 1e-250] = 0.0  # flush would-be subnormals (z^ℓ-like for large d): they only cost time
        self.P1 = P[:, 1:]  # ℓ = 1..L
        ell = np.arange(self.L + 1, dtype=np.float64)
        logg = _log_harmonic_dimension(ell, d) + _log_lam(ell, beta, d)
        g = np.where(logg > -575.0, np.exp(logg), 0.0)  # < 1e-250: no effect, and no subnormals
        self.lam0 = float(np.exp(_log_lam(np.array([0.0]), beta, d))[0])
        self.g1 = g[1:]
        self.logS = log_sphere_area(d - 1)

    def kappa_c(self) -> float:
        return 1.0 / float(lam(1, self.beta, self.d))

    def evaluate(self, kappa: float, m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, float]:
        """G(κ, m), dG/dκ, dG/dm (full L×L), the entropy ∫ρ log ρ dν, and S = Σ g_ℓ m_ℓ² (ℓ >= 1)."""
        phi = self.P1 @ (self.g1 * m)
        u = kappa * phi
        logq = u + self.logw
        lse = float(sp.logsumexp(logq))
        logq -= lse
        q = np.where(logq > -575.0, np.exp(logq), 0.0)  # q_j = w_j ρ_j, Σ q = 1 (subnormals flushed)
        mom = q @ self.P1
        G = mom - m
        Pc = self.P1 - mom
        # covariance of P_ℓ, P_k under ρ dν (einsum, not BLAS: multithreaded BLAS thrashes on these small sizes)
        C = np.einsum("ji,jk->ik", Pc, q[:, None] * Pc)
        dG_dm = kappa * C * self.g1[None, :] - np.eye(self.L)
        dG_dk = C @ (self.g1 * m)
        entropy = float(q @ u - lse)
        S = float(np.sum(self.g1 * m * m))
        return G, dG_dk, dG_dm, entropy, S

    def solve(self, a: float, kappa0: float, m0: np.ndarray, maxit: int = 60) -> State:
        """Newton on (κ, m_2..m_L) with m_1 = a fixed; backtracking on the residual norm."""
        kappa = float(kappa0)
        m = np.array(m0, dtype=np.float64, copy=True)
        m[0] = a
        G, dk, dm, ent, S = self.evaluate(kappa, m)
        res = float(np.max(np.abs(G)))
        tol = 1e-15
        converged_steps = 0
        for it in range(1, maxit + 1):  # noqa: B007  (it is reported)
            J = np.column_stack([dk, dm[:, 1:]])
            step = np.linalg.solve(J, -G)
            t = 1.0
            while True:
                k_new = kappa + t * step[0]
                m_new = m.copy()
                m_new[1:] += t * step[1:]
                G_new, dk_new, dm_new, ent_new, S_new = self.evaluate(k_new, m_new)
                res_new = float(np.max(np.abs(G_new)))
                if np.isfinite(res_new) and (res_new < (1 - 1e-4 * t) * res or res_new < 10 * tol or t < 1e-3):
                    break
                t *= 0.5
            kappa, m, G, dk, dm, ent, S, res = k_new, m_new, G_new, dk_new, dm_new, ent_new, S_new, res_new
            small_step = abs(t * step[0]) <= 1e-14 * abs(kappa) and np.max(np.abs(t * step[1:]), initial=0.0) <= 1e-14
            if res < tol or (small_step and res < 1e-12):
                converged_steps += 1
                if converged_steps >= 2:  # one extra Newton step after convergence
                    break
        else:
            if not res < 1e-11:
                raise RuntimeError(f"Newton did not converge at a={a}: residual {res:.3e} after {maxit} steps")
        if not (np.isfinite(kappa) and np.all(np.isfinite(m))):
            raise FloatingPointError(f"non-finite state at a={a}")
        # dκ/da by implicit differentiation: J [dκ, dm_2..L]/da = −∂G/∂m_1
        J = np.column_stack([dk, dm[:, 1:]])
        dkappa_da = float(np.linalg.solve(J, -dm[:, 0])[0])
        K = kappa * self.tau * self.beta
        E0 = -self.tau * self.logS - K * self.lam0 / (2 * self.beta)
        dE = self.tau * ent - K / (2 * self.beta) * S
        return State(
            a=float(a),
            K=float(K),
            kappa=float(kappa),
            moments=np.concatenate([[1.0], m]),
            free_energy=float(E0 + dE),
            free_energy_uniform=float(E0),
            delta_free_energy=float(dE),
            dK_da=float(dkappa_da * self.tau * self.beta),
            iterations=it,
        )


class _Tracer:
    """Continuation in a from the bifurcation point, with a cache used for warm starts."""

    def __init__(self, disc: _Spectral, h: float = 0.01) -> None:
        self.disc = disc
        self.h = h
        self.cache: dict[float, State] = {}

    def _guess(self, a: float) -> tuple[float, np.ndarray]:
        if not self.cache:
            m = np.zeros(self.disc.L)
            m[0] = a
            return self.disc.kappa_c(), m
        keys = np.array(sorted(self.cache))
        i = int(np.argmin(np.abs(keys - a)))
        s = self.cache[keys[i]]
        # secant predictor from the two nearest cached states, when a lies near them
        if len(keys) >= 2:
            j = i - 1 if (a < keys[i] and i > 0) or i == len(keys) - 1 else i + 1
            s2 = self.cache[keys[j]]
            w = (a - s.a) / (s2.a - s.a)
            if abs(w) <= 2.0:
                return s.kappa + w * (s2.kappa - s.kappa), s.moments[1:] + w * (s2.moments[1:] - s.moments[1:])
        return s.kappa, s.moments[1:]

    def at(self, a: float) -> State:
        """State at amplitude a, marching from the nearest cached state (or from a small a) in steps <= h."""
        a = float(a)
        if a in self.cache:
            return self.cache[a]
        if not 0 < a < 1:
            raise ValueError(f"amplitude must be in (0, 1), got {a}")
        if self.cache:
            keys = np.array(sorted(self.cache))
            start = float(keys[int(np.argmin(np.abs(keys - a)))])
        else:
            start = min(a, 1e-3)
            self.cache[start] = self.disc.solve(start, *self._guess(start))
        nsteps = int(math.ceil(abs(a - start) / self.h))
        for s in np.linspace(start, a, nsteps + 1)[1:]:
            s = float(s)
            if s not in self.cache:
                self.cache[s] = self.disc.solve(s, *self._guess(s))
        return self.cache[a]


def solve_state(a: float, beta: float, tau: float, d: int, n: int, L: int | None = None) -> State:
    """The zonal stationary state on the bifurcating branch with amplitude a = ∫ μ z dσ.

    Reached by continuation in a from a = 1e-3 (started at K_c, μ = uniform + a d z / |S^{d−1}|).

    Args:
        a: amplitude in (0, 1).
        beta: inverse temperature β > 0.
        tau: noise τ > 0.
        d: ambient dimension, d >= 2.
        n: Gauss–Jacobi nodes in z.
        L: Gegenbauer truncation (default n // 2).

    Returns:
        The :class:`State`.
    """
    return _Tracer(_Spectral(beta, tau, d, n, L)).at(a)


@dataclass(frozen=True)
class Branch:
    """The bifurcating zonal branch sampled at given amplitudes (arrays aligned with ``a``, sorted ascending).

    Attributes:
        a: amplitudes ∫ μ z dσ.
        K: coupling K(a).
        E: free energy E(μ_a) (absolute).
        E_uniform: free energy of the uniform state at the same K, −τ log|S^{d−1}| − K λ_0(β)/(2β).
        dE: E − E_uniform (computed without cancellation).
        states: the full :class:`State` objects.
    """

    a: np.ndarray
    K: np.ndarray
    E: np.ndarray
    E_uniform: np.ndarray
    dE: np.ndarray
    states: tuple[State, ...]


def branch(
    beta: float, tau: float, d: int, amplitudes: np.ndarray | list[float], n: int, L: int | None = None
) -> Branch:
    """K(a), E(a) along the branch bifurcating from uniform at K_c, and E of the uniform state at that K.

    Args:
        beta: inverse temperature β > 0.
        tau: noise τ > 0.
        d: ambient dimension, d >= 2 (the sphere is S^{d−1}).
        amplitudes: amplitudes a = ∫ μ z dσ in (0, 1) (any order; returned sorted).
        n: Gauss–Jacobi nodes in z.
        L: Gegenbauer truncation (default n // 2).

    Returns:
        A :class:`Branch`.
    """
    tr = _Tracer(_Spectral(beta, tau, d, n, L))
    a = np.sort(np.asarray(amplitudes, dtype=np.float64))
    states = tuple(tr.at(float(x)) for x in a)
    return Branch(
        a=a,
        K=np.array([s.K for s in states]),
        E=np.array([s.free_energy for s in states]),
        E_uniform=np.array([s.free_energy_uniform for s in states]),
        dE=np.array([s.delta_free_energy for s in states]),
        states=states,
    )


class FoldMaxwell(NamedTuple):
    """Fold and Maxwell point of a subcritical branch.

    Attributes:
        K_c: τβ/λ_1(β).
        K_f: the fold, min over a of K(a).
        K_M: the Maxwell coupling, E(branch) = E(uniform), on the upper (a > a_f) part.
        a_f: amplitude at the fold.
        a_M: amplitude at the Maxwell point.
        K_f_golden: K_f found instead by bounded Brent minimisation of a ↦ K(a) (a cross-check of K_f).
    """

    K_c: float
    K_f: float
    K_M: float
    a_f: float
    a_M: float
    K_f_golden: float


def fold_maxwell_point(
    beta: float, tau: float, d: int, n: int, L: int | None = None, h: float = 0.01, a_max: float = 0.995
) -> FoldMaxwell:
    """Fold K_f and Maxwell coupling K_M of the subcritical branch (β > β*(d)), with amplitudes.

    Continuation in a on a grid of step h; the fold is the root of dK/da (exact implicit derivative of the
    discrete equations) by brentq to xtol 1e-15 (cross-checked by bounded Brent minimisation of K(a)); the
    Maxwell point is the root of E(branch) − E(uniform) in a > a_f by brentq to xtol 1e-15.

    Args:
        beta: inverse temperature β > β*(d).
        tau: noise τ > 0.
        d: ambient dimension, d >= 2.
        n: Gauss–Jacobi nodes in z.
        L: Gegenbauer truncation (default n // 2).
        h: continuation step in a.
        a_max: largest amplitude scanned.

    Returns:
        :class:`FoldMaxwell`.

    Raises:
        ValueError: if β <= β*(d) (supercritical: no fold), or no fold/Maxwell point is found below a_max.
    """
    if beta <= beta_star(d):
        raise ValueError(f"beta={beta} <= beta*(d={d})={beta_star(d)}: supercritical, no fold")
    disc = _Spectral(beta, tau, d, n, L)
    tr = _Tracer(disc, h=h)
    grid = np.concatenate([[1e-3, 2e-3, 5e-3], np.arange(h, a_max, h)])
    fold_bracket = maxwell_bracket = None
    prev = None
    for a in grid:
        s = tr.at(float(a))
        if prev is not None:
            if fold_bracket is None and prev.dK_da < 0 <= s.dK_da:
                fold_bracket = (prev.a, s.a)
            if (
                fold_bracket is not None
                and prev.delta_free_energy > 0 >= s.delta_free_energy
                and prev.a >= fold_bracket[0]
            ):
                maxwell_bracket = (prev.a, s.a)
                break
        elif s.dK_da >= 0:
            raise ValueError(f"K(a) increasing at a={a}: no subcritical fold resolved (beta={beta}, d={d})")
        prev = s
    if fold_bracket is None or maxwell_bracket is None:
        raise ValueError(f"fold/Maxwell point not found for a < {a_max} (beta={beta}, d={d}, n={n})")
    xtol, rtol = 1e-15, 4 * np.finfo(float).eps
    a_f = scipy.optimize.brentq(lambda x: tr.at(x).dK_da, *fold_bracket, xtol=xtol, rtol=rtol)
    a_lo, a_hi = fold_bracket
    golden = scipy.optimize.minimize_scalar(
        lambda x: tr.at(float(x)).K, bounds=(a_lo, a_hi), method="bounded", options={"xatol": 1e-10}
    )
    a_M = scipy.optimize.brentq(lambda x: tr.at(x).delta_free_energy, *maxwell_bracket, xtol=xtol, rtol=rtol)
    return FoldMaxwell(
        K_c=k_c(beta, tau, d),
        K_f=tr.at(a_f).K,
        K_M=tr.at(a_M).K,
        a_f=float(a_f),
        a_M=float(a_M),
        K_f_golden=float(golden.fun),
    )


def fold_and_maxwell(beta: float, tau: float, d: int, n: int, L: int | None = None) -> tuple[float, float]:
    """(K_f, K_M): fold and Maxwell couplings of the subcritical branch; see :func:`fold_maxwell_point`.

    Args:
        beta: inverse temperature β > β*(d).
        tau: noise τ > 0.
        d: ambient dimension, d >= 2.
        n: Gauss–Jacobi nodes in z.
        L: Gegenbauer truncation (default n // 2).

    Returns:
        (K_f, K_M) as floats, with K_f < K_M < K_c.
    """
    r = fold_maxwell_point(beta, tau, d, n, L)
    return r.K_f, r.K_M
