"""Round-off bounds for the exact properties the tests assert (conservation, equal paths, rank counts).

A test that asserts an exact property (mass conserved, two algorithms for one sum agree, a run on 1 and 2
ranks agree) must not compare with a number read off one machine: BLAS kernels, MUMPS and the MPI
reduction order round differently on other CPUs and rank counts. It states instead how many floating-point
operations the quantity went through, from the problem size (dofs, cells, steps), and asserts the standard
worst-case bound of N. J. Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., SIAM 2002:

* every operation is exact up to a relative error u = ε/2 (the unit round-off, §2.2);
* a result that passes through n operations carries at most γ_n = nu / (1 − nu) relative error (Lemma 3.1);
* a sum or dot product of n terms, in any order, is exact to γ_{n−1} Σ|terms| (eq. (4.4), Lemma 3.1 and
  eq. (3.4)), so two orders of the same sum differ by at most 2 γ_{n−1} Σ|terms|;
* a triangular solve or an LU factorisation of order n has backward error γ_n |L||U| (Thm 8.5, 9.3).

Worst-case bounds exceed the usual error by about √n (Higham & Mary, SIAM J. Sci. Comput. 41 (2019)
A2815), so they leave room for any CPU, and they stay far below every bug worth catching: a planted sign,
factor or half-step error moves these quantities by 1e-8 or more, the bounds are 1e-13 to 1e-10.
"""

from __future__ import annotations

import numpy as np

#: The unit round-off of IEEE double precision, u = 2⁻⁵³ (Higham §2.1).
U = float(np.finfo(np.float64).eps) / 2


def gamma(n: float) -> float:
    """γ_n = nu / (1 − nu): the relative error bound of n rounded operations (Higham Lemma 3.1).

    Raises:
        ValueError: if nu ≥ 1 (the bound is void).
    """
    if n * U >= 1.0:
        raise ValueError(f"gamma({n}): nu >= 1, no bound")
    return n * U / (1.0 - n * U)


def sum_error(n: int, abs_sum: float = 1.0) -> float:
    """|fl(Σ x_i) − Σ x_i| ≤ γ_{n−1} Σ|x_i| for n terms in any order (Higham eq. (4.4))."""
    return gamma(max(n - 1, 1)) * abs_sum


def reordered(n: int, abs_sum: float = 1.0) -> float:
    """Two evaluations of one n-term sum in different orders (other ranks, other kernels) differ by at
    most twice :func:`sum_error`."""
    return 2.0 * sum_error(n, abs_sum)


def conservation(steps: int, ops_per_step: int, ndofs: int, total: float = 1.0) -> float:
    """|Σ_K − Σ_0| for a scheme that conserves Σ = Σ_i m_i u_i exactly in exact arithmetic, u ≥ 0.

    Each of ``steps`` updates rounds every value u_i to γ_{ops_per_step} of the magnitudes it is made of
    (all of the order of u_i for a positive, CFL-limited update), so it moves Σ by at most
    γ_{ops_per_step} Σ|m_i u_i| = γ_{ops_per_step} · total; the two sums Σ_0 and Σ_K of ``ndofs`` terms
    add γ_{ndofs} · total each.
    """
    return (steps * gamma(ops_per_step) + 2.0 * gamma(ndofs)) * total


def implicit_step(n: int, ds: float, ds_stab: float, mass_ratio: float, total: float = 1.0) -> float:
    """m-weighted ℓ1 round-off, Σ m_i |ρ̂_i − ρ_i|, of one backward-Euler Fokker–Planck step (M_L + ΔsL)ρ = M_Lρ⁰.

    A = M_L + ΔsL is an M-matrix with column sums m (1ᵀL = 0), so A⁻¹ ≥ 0 and mᵀA⁻¹ = 1ᵀ: a backward error
    δA ρ̂ becomes an m-weighted ℓ1 error ≤ ‖δA ρ̂‖₁. LU (MUMPS) has |δA| ≤ γ_{3n}|L̂||Û| (Higham Thm 9.3),
    and A is column diagonally dominant (growth factor ≤ 2, Higham Thm 9.9), taken as ‖|L̂||Û|‖₁ ≤ 3‖A‖₁.
    ‖A‖₁ ≤ max_j (m_j + 2Δs L_jj) ≤ max m · (1 + 2Δs/Δs_stab) with Δs_stab = min_j m_j/L_jj (the solver's
    ``stability_limit``), and ‖ρ̂‖₁ ≤ total / min m. Hence the bound
    γ_{3n} · 3 · (1 + 2Δs/Δs_stab) · (max m / min m) · total.
    """
    return gamma(3 * n) * 3.0 * (1.0 + 2.0 * ds / ds_stab) * mass_ratio * total


def softmax_error(exponent: float, n: int, d: int = 2) -> float:
    """Relative round-off η of each softmax weight p_i = e^{e_i − max e} / Σ_j e^{e_j − max e} (and of Z).

    The exponents e_i = a x·y_i + log w_i (a d-term dot product and two more operations) carry an absolute
    error γ_{d+3} |e_i| ≤ γ_{d+3} E, E = max |e_i|; the shift adds another E γ_1, and exp turns absolute
    errors of its argument into relative ones. Then n-term sums and a division: γ_{n+2} (P. Blanchard,
    D. J. Higham and N. J. Higham, *Accurately computing the log-sum-exp and softmax functions*, IMA J.
    Numer. Anal. 41 (2021) 2311–2330, §3–4). Hence η = 2E γ_{d+3} + γ_{n+2}; log Z is then exact to η plus
    u |log Z|, and a tilted mean Σ p_i y_i to (2η + γ_n) max |y|.
    """
    return 2.0 * exponent * gamma(d + 3) + gamma(n + 2)
