"""Zonal functions on S^{d−1}: the Gauss rule in z = x·e, the orthonormal Gegenbauer basis, the azimuthal kernels.

A zonal function f(x) = f(z), z = x·e, integrates against the NORMALISED surface measure σ̄ = σ/|S^{d−1}| as

    ∫ f dσ̄ = c_d ∫_{−1}^{1} f(z) (1 − z²)^{(d−3)/2} dz,   c_d = Γ(d/2)/(√π Γ((d−1)/2)),

a Jacobi weight with α = β = (d − 3)/2 (d = 2: Chebyshev; d = 3: Legendre). Its orthonormal polynomials p_ℓ are
the Gegenbauer polynomials C_ℓ^{(d−2)/2} up to a constant; they obey z p_ℓ = b_{ℓ+1} p_{ℓ+1} + b_ℓ p_{ℓ−1} with

    b_1² = 1/(2(1 + λ)),   b_ℓ² = ℓ(ℓ + 2λ − 1)/(4(ℓ + λ)(ℓ + λ − 1)) (ℓ ≥ 2),   λ = (d − 2)/2,

from which the Gauss rule follows by Golub–Welsch (the nodes are the eigenvalues of the Jacobi matrix; the weights,
by the Christoffel function 1/Σ_ℓ p_ℓ(z_i)², keep their relative accuracy where they are tiny): the weights
sum to 1 and the rule is exact to degree 2n − 1 for every d. Working
with σ̄ and the density ν = |S^{d−1}| μ keeps every number O(1) at d = 4096, where |S^{d−1}| ≈ 10^{−2000}.

The azimuthal average of e^{β x·y} over the S^{d−2} of y at fixed y·e (and of its products with the degree-m
spherical harmonics of S^{d−2}, normalised): for x·e = z, y·e = z′, s = √(1−z²)√(1−z′²),

    e^{β z z′} B_m(β s),   B_m(t) = (t/2)^m Γ(ν+1)/Γ(ν+m+1) ₀F₁(; ν+m+1; t²/4),   ν = (d − 3)/2,

B_0 = G of theory §11 (d = 2: cosh t, d = 3: I_0(t)); B_m = Γ(ν+1)(2/t)^ν I_{ν+m}(t) is the Funk–Hecke
eigenvalue of S^{d−2} (d = 2 has m ≤ 1 only: S^0 is two points, B_1 = sinh t).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import scipy.linalg
import scipy.special

__all__ = ["angle_rule", "azimuthal_kernel", "gauss_rule", "orthonormal_basis", "recurrence"]

Array = npt.NDArray[np.float64]


def recurrence(n: int, d: int) -> Array:
    """b_1..b_n of the orthonormal Gegenbauer polynomials of S^{d−1} (module docstring), shape (n,)."""
    lam = (d - 2) / 2
    ell = np.arange(1, n + 1, dtype=float)
    b2 = np.empty(n)
    b2[0] = 1.0 / (2.0 * (1.0 + lam))
    e = ell[1:]
    b2[1:] = e * (e + 2 * lam - 1) / (4 * (e + lam) * (e + lam - 1))
    return np.sqrt(b2)


def gauss_rule(n: int, d: int) -> tuple[Array, Array]:
    """(nodes z_i ascending, weights q_i summing to 1) of the n-point Gauss rule of σ̄ in z (Golub–Welsch)."""
    b = recurrence(n - 1, d)
    z = scipy.linalg.eigh_tridiagonal(np.zeros(n), b, eigvals_only=True)
    z = 0.5 * (z - z[::-1])  # the rule is symmetric about 0
    q = 1.0 / np.sum(orthonormal_basis(z, n - 1, d) ** 2, axis=1)  # Christoffel: relative accuracy at every node
    return z, q / q.sum()


def angle_rule(n: int, d: int) -> tuple[Array, Array]:
    """(nodes z_i = cos θ_i ascending, weights q_i summing to 1): Gauss–Legendre in the polar angle θ ∈ [0, π].

    ∫ f dσ̄ = c_d ∫_0^π f(cos θ) sin^{d−2}θ dθ with the weight's logarithm in the weights (no underflow at any d):
    not exact for polynomials in z, but spectrally accurate for smooth f, and its nodes are spread evenly in θ, so
    that a state concentrated in a cap of width ≈ 1/√d anywhere (a cluster at large d) is resolved by n ≈ 10√d
    nodes, where the Gauss rule of σ̄ (:func:`gauss_rule`), whose nodes gather in the band |z| ≲ 3/√d, needs n ≈ d.
    """
    x, w = np.polynomial.legendre.leggauss(n)
    theta = 0.5 * math.pi * (x + 1.0)
    logq = np.log(w) + (d - 2) * np.log(np.sin(theta))
    q = np.exp(logq - logq.max())
    z = np.cos(theta)[::-1]
    return z, (q / q.sum())[::-1]


def orthonormal_basis(z: Array, degree: int, d: int) -> Array:
    """p_ℓ(z_i) for ℓ = 0..degree, orthonormal in σ̄ (p_0 = 1), shape (len(z), degree + 1)."""
    b = recurrence(max(degree, 1), d)
    z = np.asarray(z, dtype=float)
    V = np.zeros((z.size, degree + 1))
    V[:, 0] = 1.0
    if degree >= 1:
        V[:, 1] = z / b[0]
    for ell in range(1, degree):
        V[:, ell + 1] = (z * V[:, ell] - b[ell - 1] * V[:, ell - 1]) / b[ell]
    return V


def azimuthal_kernel(z: Array, beta: float, d: int, m: int = 0) -> Array:
    """e^{β z_i z_j} B_m(β s_i s_j) (module docstring) on the nodes, shape (n, n); finite for β ≤ 700."""
    nu = (d - 3) / 2
    s = np.sqrt(np.clip(1.0 - z * z, 0.0, None))
    t = beta * np.outer(s, s)
    log_b = np.log(scipy.special.hyp0f1(nu + m + 1, t * t / 4))
    if m:
        with np.errstate(divide="ignore"):
            log_b += m * np.log(t / 2) + math.lgamma(nu + 1) - math.lgamma(nu + m + 1)
    return np.exp(beta * np.outer(z, z) + log_b)
