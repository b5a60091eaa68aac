"""The Taylor test of the risk's first variation, shared by the training tests (importable like ``roundoff``)."""

from __future__ import annotations

from mpi4py import MPI

import numpy as np

from mfpde.fitting import fit_order


def risk_taylor_slope(pb, g0, heads, chi: np.ndarray, eps0: float, measure: float) -> tuple[float, list[float]]:
    """The slope of |R(ρ + εχ) − R(ρ) − ε⟨δR/δρ, χ⟩| against ε = eps0/2^k (k = 0..3): 2 for an exact first variation.

    χ (the Θ nodal values, shape (n_local,)) is made mean-free over Θ of the given measure; ⟨δR/δρ, χ⟩ is the
    lumped Θ quadrature of the first variation of ``g0`` (the gradient at ``heads``), summed over ``pb.comm``.
    Returns (slope, the remainders). ``pb.rhos[0]`` is left perturbed by the last ε.
    """
    from mfpde.params.theta import first_variation_values

    th, comm = pb.theta, pb.comm
    n = th.n_owned
    chi = chi - comm.allreduce(float(th.m[:n] @ chi[:n]), op=MPI.SUM) / measure
    dr = first_variation_values(pb.family, heads[0], g0.D[0], th.x)
    pred = comm.allreduce(float((th.m[:n] * chi[:n] * dr[:n]).sum()), op=MPI.SUM)
    base = pb.rhos[0].x.array.copy()
    eps = eps0 / 2.0 ** np.arange(4)
    errs = []
    for e in eps:
        pb.rhos[0].x.array[:] = base + e * chi
        errs.append(abs(pb.gradient(pb.heads()).risk - g0.risk - e * pred))
    return fit_order(eps, errs), errs


def assert_jacobian_exact(P, u: np.ndarray, K: float, eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    """∂F/∂u and ∂F/∂K of a stationary problem ``P`` (``residual``, ``jacobian``, ``m`` unknowns) against central
    differences at (u, K): error O(ε²) ≈ 1e-10 at ε = 1e-6, held to 1e-7 (of max |∂F/∂u| for ∂F/∂u). Returns
    (∂F/∂u, ∂F/∂K)."""
    Ju, JK = P.jacobian(u, K)
    fd = np.stack([(P.residual(u + eps * e, K) - P.residual(u - eps * e, K)) / (2 * eps) for e in np.eye(P.m)], 1)
    assert np.abs(fd - Ju).max() < 1e-7 * np.abs(Ju).max()
    assert np.abs((P.residual(u, K + eps) - P.residual(u, K - eps)) / (2 * eps) - JK).max() < 1e-7
    return Ju, JK
