"""Closed-form solutions the solvers are checked against (theory §6.1, §6.2, and Ornstein–Uhlenbeck).

Pure numpy (and scipy for one ODE): no meshes. Used by the tests, the demo and the benchmarks, so each
formula is written once. Everything is non-dimensional.

* :func:`gaussian_transport`: a Gaussian token measure stays Gaussian under heads A = aI, V = vI
  (theory §6.1): Σ_T = Σ₀ (I − 2b̄TΣ₀)⁻¹, m_T = e^{āT} (I − 2b̄TΣ₀)^{−1/2} m₀.
* :func:`gaussian_euler_network`: the L-layer residual network x ← x + (T/L)V[μ; ρ](x) on the same Gaussian
  (the velocity is affine, so each layer maps Gaussians to Gaussians): the exact discrete-depth moments.
* :func:`gaussian_risk_derivatives`: ∂G/∂ā, ∂G/∂b̄ of G = ½(m_T − y)² (readout g = x₁, d = 1), so that
  δR/δρ(a, v) = v (∂_āG + a ∂_b̄G) (theory §6.1).
* :func:`value_yhat`, :func:`value_training_law`: the value family θ = v with A = aI fixed (theory §6.2):
  ŷ(ā) and the ODEs of the mean and variance of a Gaussian ρ_s.
* :func:`shallow_yhat`, :func:`shallow_training_law`: the single residual layer (theory §2, §6.2 shallow
  case): ŷ = m₀ + T m₀ (ā + σ₀² b̄), and for value heads the closed-form Gaussian training law;
  :func:`shallow_scalar_rate`: for scalar heads θ = (a, v), the Gaussian fixed point and the rate of F − F*;
  :func:`shallow_lie_law`, :func:`shallow_gap`: the Lie step's exact moments and F − F* in continuous Θ.
* :func:`ou_moments`: the Fokker–Planck equation with the quadratic potential Φ = (λ₂/2)|θ − c|²
  (Ornstein–Uhlenbeck): Gaussians stay Gaussian with explicit moments.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from numpy.typing import ArrayLike

__all__ = ["gaussian_euler_network", "gaussian_risk_derivatives", "gaussian_transport", "ou_moments",
           "shallow_fixed_point", "shallow_gap", "shallow_lie_law", "shallow_scalar_rate", "shallow_training_law",
           "shallow_yhat", "value_training_law", "value_yhat"]

Array = npt.NDArray[np.float64]


def gaussian_transport(m0: ArrayLike, S0: ArrayLike, abar: float, bbar: float, T: float) -> tuple[Array, Array]:
    """Mean and covariance at depth T of μ₀ = N(m₀, Σ₀) transported by heads A = aI, V = vI (theory §6.1).

    Args:
        m0: initial mean, shape (d,) (a scalar for d = 1).
        S0: initial covariance, shape (d, d) (a scalar for d = 1), symmetric positive definite.
        abar: ā = ∫ v dρ.
        bbar: b̄ = ∫ a v dρ.
        T: depth.

    Returns:
        (m_T, Σ_T) of shapes (d,) and (d, d).

    Raises:
        ValueError: T is at or beyond the blow-up depth (b̄ > 0 and I − 2b̄TΣ₀ not positive definite).
    """
    m0, S0 = np.atleast_1d(np.asarray(m0, float)), np.atleast_2d(np.asarray(S0, float))
    B = np.eye(len(m0)) - 2.0 * bbar * T * S0  # symmetric, commutes with S0
    lam, Q = np.linalg.eigh(B)
    if not np.all(lam > 0):
        raise ValueError(f"depth T = {T} is past the blow-up depth of the Gaussian solution (b̄ = {bbar})")
    return math.exp(abar * T) * (Q @ np.diag(lam**-0.5) @ Q.T) @ m0, S0 @ np.linalg.inv(B)


def gaussian_euler_network(m0: float, s0: float, abar: float, bbar: float, T: float, L: int) -> tuple[float, float]:
    """Mean and variance after L residual layers x ← x + h V[μ; ρ](x), h = T/L, from μ₀ = N(m₀, σ₀²) in d = 1.

    For μ = N(m, σ²) the velocity is affine, V(x) = ām + b̄σ²x (theory §6.1), so the layer maps μ to
    N(m(1 + h(ā + b̄σ²)), σ²(1 + hb̄σ²)²): forward Euler of the moment ODEs of theory §6.1, exactly.
    """
    m, s, h = m0, s0, T / L
    for _ in range(L):
        m, s = m * (1.0 + h * (abar + bbar * s)), s * (1.0 + h * bbar * s) ** 2
    return m, s


def gaussian_risk_derivatives(abar: float, bbar: float, m0: float, s0: float, T: float,
                              y: float) -> tuple[float, float]:
    """∂G/∂ā and ∂G/∂b̄ for G(ā, b̄) = ½(ŷ − y)², ŷ = m_T of μ₀ = N(m₀, σ₀²) in d = 1 (theory §6.1).

    With these, the first variation of R(ρ) = G(ā, b̄) is δR/δρ(a, v) = v (∂_āG + a ∂_b̄G).

    Args:
        abar: ā = ∫ v dρ.
        bbar: b̄ = ∫ a v dρ.
        m0: the initial mean m₀.
        s0: the initial variance σ₀².
        T: depth.
        y: the target.

    Returns:
        (∂G/∂ā, ∂G/∂b̄).
    """
    q = 1.0 - 2.0 * bbar * s0 * T
    yhat = m0 * np.exp(abar * T) / np.sqrt(q)
    return float((yhat - y) * yhat * T), float((yhat - y) * yhat * s0 * T / q)


def value_yhat(abar: float | Array, a: float, m0: float, s0: float, T: float = 1.0) -> float | Array:
    """ŷ(ā) = m₀ e^{āT} (1 − 2aā σ₀² T)^{−1/2}: the value family (b̄ = aā), readout g = x (theory §6.2).

    Args:
        abar: ā = ∫ v dρ (scalar or array).
        a: the fixed A = aI.
        m0: mean of the Gaussian input.
        s0: variance σ₀² of the Gaussian input.
        T: depth.

    Returns:
        ŷ, of the shape of ``abar``.
    """
    return m0 * np.exp(abar * T) / np.sqrt(1 - 2 * a * abar * s0 * T)


def value_training_law(S: float, abar0: float, var0: float, lam: float, lam2: float, a: float, m0: float,
                       s0: float, y: float, T: float = 1.0) -> Array:
    """Mean and variance of ρ_S for the value family, one Gaussian sample, entropic training (theory §6.2).

    A Gaussian ρ₀ = N(ā₀, v₀) stays Gaussian, N(ā_s, v_s), with

        dā/ds = −G'(ā) − λ₂ā,    dv/ds = −2λ₂v + 2λ,    G(ā) = ½(ŷ(ā) − y)²,

    solved by ``scipy.integrate.solve_ivp`` (rtol 1e-11, atol 1e-12). G' is the central difference of G
    with step 1e-6 (error ~1e-12, far below what the PDE checks resolve).

    Args:
        S: final training time.
        abar0: mean of ρ₀.
        var0: variance of ρ₀.
        lam: λ, the entropy weight.
        lam2: λ₂, the confinement weight.
        a: the fixed A = aI.
        m0: mean of the input N(m₀, σ₀²).
        s0: variance σ₀² of the input.
        y: the target.
        T: depth.

    Returns:
        (ā_S, v_S), shape (2,).
    """
    from scipy.integrate import solve_ivp  # scipy loads in ~0.3 s: only when this law is asked for

    def dG(ab: float, e: float = 1e-6) -> float:
        gp = 0.5 * (value_yhat(ab + e, a, m0, s0, T) - y) ** 2
        gm = 0.5 * (value_yhat(ab - e, a, m0, s0, T) - y) ** 2
        return float((gp - gm) / (2 * e))

    sol = solve_ivp(lambda s, z: [-dG(z[0]) - lam2 * z[0], -2 * lam2 * z[1] + 2 * lam], (0, S), [abar0, var0],
                    rtol=1e-11, atol=1e-12)
    return sol.y[:, -1]


def shallow_yhat(abar: float, bbar: float, m0: float, s0: float, T: float = 1.0) -> float:
    """ŷ of the single residual layer μ_T = μ₀ − T ∇·(μ₀ V[μ₀; ρ]), readout g = x, μ₀ = N(m₀, σ₀²) (theory §2).

    Derivation: ∫ x dμ_T = m₀ + T ∫ V[μ₀; ρ] dμ₀ (integration by parts), and for μ₀ Gaussian the tilted
    mean is m₀ + σ₀² a x (theory §6.1), so v_θ(x, μ₀) = v (m₀ + σ₀² a x) and ∫ v_θ dμ₀ = v m₀ (1 + a σ₀²).
    Averaging over ρ: ŷ = m₀ + T m₀ (ā + σ₀² b̄). For value heads (b̄ = aā) this is m₀ + T κ ā with
    κ = m₀ (1 + a σ₀²), the shallow case of theory §6.2 (T = 1).

    Args:
        abar: ā = ∫ v dρ.
        bbar: b̄ = ∫ a v dρ.
        m0: mean of the input.
        s0: variance σ₀² of the input.
        T: the layer's depth.

    Returns:
        ŷ.
    """
    return float(m0 + T * m0 * (abar + s0 * bbar))


def _shallow_gain(lam2: float, a: float, m0: float, s0: float, y: float, T: float) -> tuple[float, float]:
    """(k, ā*) of the shallow model, value heads, one sample (theory §6.2).

    k = T m₀(1 + aσ₀²) (ŷ = m₀ + kā), ā* = k(y − m₀)/(λ₂ + k²).
    """
    k = T * m0 * (1.0 + a * s0)
    return k, k * (y - m0) / (lam2 + k * k)


def shallow_training_law(S: float, abar0: float, var0: float, lam: float, lam2: float, a: float, m0: float,
                         s0: float, y: float, T: float = 1.0) -> Array:
    """Mean and variance of ρ_S for the shallow model with value heads, one Gaussian sample (theory §6.2).

    G(ā) = ½(m₀ + Tκā − y)² is quadratic, so the law of :func:`value_training_law` is linear and solved
    in closed form: with k = Tκ, ā* = k(y − m₀)/(λ₂ + k²), ā_S = ā* + (ā₀ − ā*) e^{−(λ₂ + k²)S} and
    v_S = λ/λ₂ + (v₀ − λ/λ₂) e^{−2λ₂S}.

    Args:
        S: training time.
        abar0: mean of ρ₀.
        var0: variance of ρ₀.
        lam: λ ≥ 0.
        lam2: λ₂ > 0.
        a: the fixed A = aI.
        m0: mean of the input N(m₀, σ₀²).
        s0: variance σ₀² of the input.
        y: the target.
        T: the layer's depth.

    Returns:
        (ā_S, v_S), shape (2,).
    """
    k, astar = _shallow_gain(lam2, a, m0, s0, y, T)
    return np.array([astar + (abar0 - astar) * math.exp(-(lam2 + k * k) * S),
                     lam / lam2 + (var0 - lam / lam2) * math.exp(-2.0 * lam2 * S)])


def shallow_fixed_point(lam: float, lam2: float, a: float, m0: float, s0: float, y: float, T: float = 1.0
                        ) -> tuple[float, float, float]:
    """The minimiser ρ* = N(ā*, λ/λ₂) of F_λ for the shallow model, value heads, one sample, and F* (theory §6.2).

    With k = Tκ = T m₀(1 + aσ₀²): ā* = k(y − m₀)/(λ₂ + k²), and
    F* = ½(m₀ + kā* − y)² + (λ₂/2)(ā*² + λ/λ₂) − (λ/2) log(2πe λ/λ₂)   (R + confinement + λ ∫ρ* log ρ*).

    Args:
        lam: λ > 0.
        lam2: λ₂ > 0.
        a: the fixed A = aI.
        m0: mean of the input N(m₀, σ₀²).
        s0: variance σ₀² of the input.
        y: the target.
        T: the layer's depth.

    Returns:
        (ā*, λ/λ₂, F*).
    """
    k, astar = _shallow_gain(lam2, a, m0, s0, y, T)
    var = lam / lam2
    entropy = -0.5 * math.log(2 * math.pi * math.e * var)  # ∫ρ* log ρ* of N(ā*, var)
    F = 0.5 * (m0 + k * astar - y) ** 2 + 0.5 * lam2 * (astar**2 + var) + lam * entropy
    return astar, var, F


def shallow_lie_law(steps: int, ds: float, abar0: float, var0: float, lam: float, lam2: float, a: float, m0: float,
                    s0: float, y: float, T: float = 1.0) -> Array:
    """Mean and variance of ρ after each Lie step of the shallow value model, continuous Θ (theory §4, §6.2).

    The Lie step is one backward-Euler step with the potential frozen at ρ^n: ρ^{n+1} − Δs 𝓛_n ρ^{n+1} = ρ^n,
    𝓛_n ρ = ∂_v(ρ Φ_n') + λ ∂_v²ρ, Φ_n = g_n v + (λ₂/2)v², g_n = k(m₀ + kā_n − y) (k, ā* of the shallow
    gain). The drift is linear, so testing with v and v² closes the moments, exactly for every Δs:
    ā_{n+1}(1 + λ₂Δs) = ā_n − Δs g_n and M_{n+1}(1 + 2λ₂Δs) = M_n − 2Δs g_n ā_{n+1} + 2λΔs (M = ∫v²ρ).
    Hence ā_n − ā* = qⁿ(ā₀ − ā*) with q = (1 − k²Δs)/(1 + λ₂Δs), the discrete counterpart of e^{−(λ₂+k²)Δs}.

    Returns:
        (ā_n, V_n) for n = 0..steps, shape (steps + 1, 2).
    """
    k, _ = _shallow_gain(lam2, a, m0, s0, y, T)
    out = np.empty((steps + 1, 2))
    m, M = abar0, var0 + abar0 * abar0
    out[0] = m, var0
    for n in range(steps):
        g = k * (m0 + k * m - y)
        m = (m - ds * g) / (1.0 + lam2 * ds)
        M = (M - 2.0 * ds * g * m + 2.0 * lam * ds) / (1.0 + 2.0 * lam2 * ds)
        out[n + 1] = m, M - m * m
    return out


def shallow_gap(mean: ArrayLike, var: ArrayLike, lam: float, lam2: float, a: float, m0: float, s0: float, y: float,
                T: float = 1.0) -> Array:
    """F(ρ) − F* of the shallow value model for ρ with the given mean and variance (theory §6.2).

    R is quadratic in ā and ρ* = N(ā*, v*), v* = λ/λ₂, is the Gibbs measure of Φ*, so for every ρ
    F(ρ) − F* = ½(λ₂ + k²)(ā − ā*)² + λ KL(ρ ‖ N(ā, v*)), and KL(ρ ‖ N(ā, v*)) = ½(V/v* − 1 − log(V/v*))
    + KL(ρ ‖ N(ā, V)): the formula returned is exact for Gaussian ρ and misses only the last term, ≥ 0.
    """
    k, astar = _shallow_gain(lam2, a, m0, s0, y, T)
    r = np.asarray(var, dtype=float) / (lam / lam2)
    return 0.5 * (lam2 + k * k) * (np.asarray(mean, dtype=float) - astar) ** 2 + 0.5 * lam * (r - 1.0 - np.log(r))


def ou_moments(s: float, c: ArrayLike, m0: ArrayLike, v0: ArrayLike, lam: float, lam2: float
               ) -> tuple[Array, Array]:
    """Mean and per-axis variance at time s of ∂_sρ = ∇·(ρ λ₂(θ − c)) + λΔρ from N(m₀, diag v₀).

    The Fokker–Planck equation with Φ = (λ₂/2)|θ − c|² (Ornstein–Uhlenbeck): each axis relaxes
    independently, m_s = c + (m₀ − c) e^{−λ₂s}, v_s = λ/λ₂ + (v₀ − λ/λ₂) e^{−2λ₂s} (off-diagonal
    covariances stay 0).

    Args:
        s: training time.
        c: the centre, shape (p,).
        m0: initial mean, shape (p,).
        v0: initial variances, shape (p,).
        lam: λ > 0.
        lam2: λ₂ > 0.

    Returns:
        (m_s, v_s), each of shape (p,).
    """
    c, m0, v0 = (np.asarray(x, dtype=float) for x in (c, m0, v0))
    return c + (m0 - c) * np.exp(-lam2 * s), lam / lam2 + (v0 - lam / lam2) * np.exp(-2 * lam2 * s)


def shallow_scalar_rate(lam: float, lam2: float, m0: ArrayLike, s0: ArrayLike, y: ArrayLike, T: float = 1.0,
                        guess: ArrayLike = (0.0, 0.0, 0.1, 0.0, 0.1)) -> tuple[Array, float]:
    """Fixed point and asymptotic rate of F − F* for the shallow model with scalar heads θ = (a, v) (theory §6.2).

    ŷ^i = m₀ⁱ + T m₀ⁱ(ā + σ₀ⁱ² b̄) with ā = ∫v dρ, b̄ = ∫av dρ (:func:`shallow_yhat`), R = (1/n)Σ½(ŷ^i − y^i)²,
    so δR/δρ(a, v) = αv + βav with α = (1/n)Σ r_i T m₀ⁱ, β = (1/n)Σ r_i T m₀ⁱσ₀ⁱ², r_i = ŷ^i − y^i: the full
    potential Φ = δR/δρ + (λ₂/2)|θ|² is quadratic, ∇Φ = Hθ + g with H = [[λ₂, β], [β, λ₂]], g = (0, α).
    A Gaussian ρ = N(μ, Σ) therefore stays Gaussian under ∂_sρ = ∇·(ρ∇Φ) + λΔρ, with

        dμ/ds = −(Hμ + g),    dΣ/ds = −HΣ − ΣH + 2λI,    ā = μ_v, b̄ = Σ_av + μ_a μ_v.

    At the fixed point z* of these five ODEs F is minimal (F − F* is quadratic in z − z*), so F − F* decays
    at twice the slowest rate of the linearisation: c = 2 min_k (−Re λ_k(J)), J the Jacobian at z*
    (central differences, step 1e-7: relative error ~1e-8); the value-head analogue is min(2(λ₂ + k²), 4λ₂)
    (theory §7 item 6).

    Args:
        lam: λ > 0.
        lam2: λ₂ > 0.
        m0: input means m₀ⁱ, shape (n,).
        s0: input variances σ₀ⁱ², shape (n,).
        y: targets, shape (n,).
        T: the layer's depth.
        guess: start of the fixed-point solve, (μ_a, μ_v, Σ_aa, Σ_av, Σ_vv).

    Returns:
        (z*, c): the fixed point (μ_a, μ_v, Σ_aa, Σ_av, Σ_vv), shape (5,), and the rate c.

    Raises:
        ValueError: the fixed-point solve did not converge, or the fixed point is not a stable Gaussian.
    """
    from scipy.optimize import fsolve

    m, s, t = (np.asarray(v, dtype=float) for v in (m0, s0, y))

    def rhs(z: Array) -> Array:
        ma, mv, saa, sav, svv = z
        r = m + T * m * (mv + s * (sav + ma * mv)) - t
        al, be = float(np.mean(r * T * m)), float(np.mean(r * T * m * s))
        H = np.array([[lam2, be], [be, lam2]])
        mu, S = np.array([ma, mv]), np.array([[saa, sav], [sav, svv]])
        dmu = -(H @ mu + np.array([0.0, al]))
        dS = -H @ S - S @ H + 2 * lam * np.eye(2)
        return np.array([dmu[0], dmu[1], dS[0, 0], dS[0, 1], dS[1, 1]])

    z, _, ok, msg = fsolve(rhs, np.asarray(guess, dtype=float), xtol=1e-13, full_output=True)
    if ok != 1 or np.abs(rhs(z)).max() > 1e-10 or z[2] * z[4] - z[3] ** 2 <= 0:
        raise ValueError(f"no Gaussian fixed point of the scalar-head law: {msg}")
    e = 1e-7
    J = np.array([(rhs(z + e * u) - rhs(z - e * u)) / (2 * e) for u in np.eye(5)]).T
    rates = -np.linalg.eigvals(J).real
    if rates.min() <= 0:
        raise ValueError(f"the fixed point of the scalar-head law is not stable: rates {rates}")
    return z, 2.0 * float(rates.min())
