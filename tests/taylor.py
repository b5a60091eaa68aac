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
