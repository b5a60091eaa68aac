"""The closed forms of the free-energy benchmark: the problem, F*, the exact Lie law, the drift, the entropy estimators.

The single residual layer (theory §2, §5.4) with Gaussian data in d = 1, two samples N(0.3, 0.25), N(−0.5, 0.1)
with targets 1 and −0.5 (the optimum fits neither: the residuals at ρ* are 0.6 and −0.3), squared loss, λ = 0.1,
λ₂ = 1, Θ = [−3, 3]^p:

* value heads θ = v (p = 1, a = 0.5): ŷ^i = m₀ⁱ + k_i ā, k_i = m₀ⁱ(1 + aσ₀ⁱ²), so R is quadratic in ā and
  ρ* = N(ā*, λ/λ₂), ā* = ⟨k(y − m₀)⟩/(λ₂ + ⟨k²⟩) (theory §6.2, n samples): F* in closed form;
* scalar heads θ = (a, v) (p = 2): ŷ^i = m₀ⁱ + m₀ⁱ(ā + σ₀ⁱ²b̄), Φ quadratic, ρ* Gaussian; its moments solve five
  algebraic equations (:func:`mfpde.exact.shallow_scalar_rate`, residual < 1e-10), F* from them.

In both, δR/δρ(θ) = v D(a) with D(a) = α + βa affine, whose two numbers are moments of ρ (:func:`first_variation`):
the "closed-form drift" that the particles and the PDE's same-drift path use instead of a token solve.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.spatial import cKDTree
from scipy.special import digamma
from scipy.stats import gaussian_kde

from mfpde.exact import shallow_scalar_rate
from mfpde.verify.models import A_FIXED, M0, S0

LAM, LAM2, Y = 0.1, 1.0, (1.0, -0.5)
M, SIG2, TGT = np.array(M0), np.array(S0), np.array(Y)
RHO0 = {"value": (0.4,), "scalar": (0.2, 0.4)}
VAR0 = 0.05
K_VALUE = M * (1 + A_FIXED * SIG2)


def fixed_point(family: str) -> dict[str, Any]:
    """F*, the Gibbs minimiser's moments and the asymptotic rates of F − F* (continuous, and for the Lie step)."""
    if family == "value":
        k = K_VALUE
        k2 = float(np.mean(k * k))
        astar = float(np.mean(k * (TGT - M))) / (LAM2 + k2)
        v = LAM / LAM2
        F = float(np.mean(0.5 * (M + k * astar - TGT) ** 2)) + 0.5 * LAM2 * (astar**2 + v) \
            - 0.5 * LAM * math.log(2 * math.pi * math.e * v)
        return {"F": F, "mean": [astar], "rate": min(2 * (LAM2 + k2), 4 * LAM2), "theorem": 2 * LAM2, "k2": k2}
    z, c = shallow_scalar_rate(LAM, LAM2, M, SIG2, TGT)
    ma, mv, saa, sav, svv = z
    r = M + M * (mv + SIG2 * (sav + ma * mv)) - TGT
    det = saa * svv - sav**2
    F = float(np.mean(0.5 * r * r)) + 0.5 * LAM2 * (ma**2 + mv**2 + saa + svv) \
        - 0.5 * LAM * math.log((2 * math.pi * math.e) ** 2 * det)
    # Φ's Hessian at ρ* is [[λ₂, β], [β, λ₂]]: p_ρ* Gaussian, LSI α = (λ₂ − |β|)/λ (theory §5.4) at ρ* only
    beta = float(np.mean(r * M * SIG2))
    return {"F": F, "mean": [float(ma), float(mv)], "rate": c, "theorem": 2 * (LAM2 - abs(beta))}


def first_variation(family: str, abar: float, bbar: float) -> tuple[float, float, float]:
    """(α, β, R): δR/δρ(θ) = v(α + βa) and the risk R for a ρ with ā = ∫v dρ and b̄ = ∫av dρ (b̄ unused for value)."""
    if family == "value":
        r = M + K_VALUE * abar - TGT
        return float(np.mean(r * K_VALUE)), 0.0, float(np.mean(0.5 * r * r))
    r = M + M * (abar + SIG2 * bbar) - TGT
    return float(np.mean(r * M)), float(np.mean(r * M * SIG2)), float(np.mean(0.5 * r * r))


def _phi(family: str, mu: np.ndarray, Mm: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(H, g, R) of Φ = ½θᵀHθ + gᵀθ for a ρ with mean μ and second moments M (ā = μ_v, b̄ = M_av); R the risk."""
    if family == "value":
        al, _, R = first_variation(family, float(mu[0]), 0.0)
        return np.array([[LAM2]]), np.array([al]), R
    al, be, R = first_variation(family, float(mu[1]), float(Mm[0, 1]))
    return np.array([[LAM2, be], [be, LAM2]]), np.array([0.0, al]), R


def lie_law(family: str, ds: float, steps: int) -> tuple[np.ndarray, float]:
    """The exact Lie law of the moments in continuous Θ: F − F* per step, and its asymptotic rate −2 log r/Δs.

    The Lie step is backward Euler with Φ_n = ½θᵀH_nθ + g_nᵀθ frozen; testing with θ and θθᵀ closes the moments:
    (I + ΔsH_n)μ' = μ − Δs g_n and A M' + M' A = M + Δs(2λI − g_nμ'ᵀ − μ'g_nᵀ), A = I/2 + ΔsH_n. The gap is
    that of the Gaussian with these moments (exact up to λ KL(ρ_n ‖ Gaussian) ≥ 0, the non-Gaussian part of
    backward Euler, as :func:`mfpde.exact.shallow_gap`). r: the spectral radius of the map's Jacobian (central
    differences, step 1e-7) at its fixed point; F − F* is quadratic in the distance, hence the 2. Δs → 0 gives
    :func:`mfpde.exact.shallow_scalar_rate`'s c (scalar) and min(2(λ₂ + ⟨k²⟩), 4λ₂) (value).
    """
    from scipy.linalg import solve_sylvester

    p = len(RHO0[family])
    iu = np.triu_indices(p)
    fstar = float(fixed_point(family)["F"])

    def unpack(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        Mm = np.zeros((p, p))
        Mm[iu] = z[p:]
        return z[:p], Mm + np.triu(Mm, 1).T

    def step(z: np.ndarray) -> np.ndarray:
        mu, Mm = unpack(z)
        Hs, g, _ = _phi(family, mu, Mm)
        mu1 = np.linalg.solve(np.eye(p) + ds * Hs, mu - ds * g)
        A = 0.5 * np.eye(p) + ds * Hs
        M1 = solve_sylvester(A, A, Mm + ds * (2 * LAM * np.eye(p) - np.outer(g, mu1) - np.outer(mu1, g)))
        return np.concatenate([mu1, M1[iu]])

    def gap(z: np.ndarray) -> float:
        mu, Mm = unpack(z)
        S = Mm - np.outer(mu, mu)
        ent = -0.5 * math.log((2 * math.pi * math.e) ** p * np.linalg.det(S))
        return _phi(family, mu, Mm)[2] + 0.5 * LAM2 * float(np.trace(Mm)) + LAM * ent - fstar

    mu0 = np.asarray(RHO0[family], float)
    z = np.concatenate([mu0, (VAR0 * np.eye(p) + np.outer(mu0, mu0))[iu]])
    gaps = [gap(z)]
    for _ in range(steps):
        z = step(z)
        gaps.append(gap(z))
    for _ in range(int(60 / ds)):
        z = step(z)
    e = 1e-7
    J = np.array([(step(z + e * u) - step(z - e * u)) / (2 * e) for u in np.eye(len(z))]).T
    return np.array(gaps), -2 * math.log(float(np.max(np.abs(np.linalg.eigvals(J))))) / ds


def drift(family: str, th: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Hessian, g) of Φ = δR/δρ(ρ_H) + λ₂|θ|²/2 = ½θᵀHθ + gᵀθ + const for the empirical measure of the heads."""
    if family == "value":
        return _phi(family, np.array([th[:, 0].mean()]), np.zeros((1, 1)))[:2]
    Mm = np.array([[0.0, (th[:, 0] * th[:, 1]).mean()], [0.0, 0.0]])
    return _phi(family, np.array([0.0, th[:, 1].mean()]), Mm)[:2]


def risk_conf(family: str, th: np.ndarray) -> float:
    """R(ρ_H) + (λ₂/2)⟨|θ|²⟩ of the empirical measure."""
    bbar = 0.0 if family == "value" else float((th[:, 0] * th[:, 1]).mean())
    R = first_variation(family, float(th[:, -1].mean()), bbar)[2]
    return R + 0.5 * LAM2 * float(np.mean(np.sum(th * th, axis=1)))


def negentropy_knn(th: np.ndarray) -> float:
    """∫ρ log ρ by Kozachenko–Leonenko, k = 1: −[ψ(H) − ψ(1) + log V_p + (p/H) Σ log ε_i], ε_i the 1-NN distance."""
    H, p = th.shape
    eps = cKDTree(th).query(th, k=2)[0][:, 1]
    vol = 2.0 if p == 1 else math.pi
    return -float(digamma(H) - digamma(1) + math.log(vol) + p * np.mean(np.log(eps)))


def negentropy_kde(th: np.ndarray) -> float:
    """∫ρ log ρ ≈ (1/H) Σ log ρ̂(θ_i), ρ̂ = scipy.stats.gaussian_kde (Scott's bandwidth), resubstitution."""
    return float(np.mean(np.log(gaussian_kde(th.T)(th.T))))
