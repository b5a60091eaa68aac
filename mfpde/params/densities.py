"""P1 densities on Θ with the lumped mass: the Gaussian initial ρ₀ and the Gibbs density p ∝ e^{−Φ/λ} (theory §4).

Normalised so that Σ_i m_i ρ_i = 1 with the lumped mass m_i = ∫ φ_i of :func:`lumped_mass_owned`.
"""

from __future__ import annotations

import math

from mpi4py import MPI

import numpy as np
from dolfinx import fem
from numpy.typing import ArrayLike, NDArray

from mfpde import spaces
from mfpde.params.eafe import dof_coords, global_sum

__all__ = ["gaussian_density", "gibbs", "lumped_mass_owned"]


def lumped_mass_owned(V: fem.FunctionSpace) -> NDArray[np.float64]:
    """Lumped (row-sum) P1 mass m_i = ∫_Θ φ_i dθ of the *owned* dofs, shape (num_owned_dofs,), entries > 0.

    (:func:`mfpde.spaces.lumped_mass` returns the owned and ghost dofs.)
    """
    return spaces.lumped_mass(V)[: V.dofmap.index_map.size_local]


def gibbs(V: fem.FunctionSpace, phi: fem.Function, lam: float) -> fem.Function:
    """Discrete Gibbs density p_i ∝ exp(−Φ_i/λ), normalised so that Σ_i m_i p_i = 1 (lumped mass).

    This is the exact steady state of the EAFE generator (detailed balance), theory §4 "proximal Gibbs
    measure" p_ρ ∝ exp(−Φ/λ) with Φ = δR/δρ + λ₂|θ|²/2.

    Args:
        V: Scalar P1 space on Θ.
        phi: The full potential Φ in V (non-dimensional).
        lam: Entropic regularisation λ > 0.

    Returns:
        A new P1 Function ``gibbs`` with owned and ghost values set.

    Raises:
        ValueError: If ``lam`` ≤ 0 (the λ = 0 Gibbs measure is a Dirac mass at argmin Φ).
    """
    if not (math.isfinite(lam) and lam > 0.0):
        raise ValueError(f"the Gibbs density needs lam > 0, got {lam!r}")
    comm = V.mesh.comm
    n = V.dofmap.index_map.size_local
    m = lumped_mass_owned(V)
    phi_o = phi.x.array[:n]
    phi_min = comm.allreduce(float(phi_o.min()) if n > 0 else math.inf, op=MPI.MIN)
    e = np.exp(-(phi_o - phi_min) / lam)
    z = global_sum(comm, np.dot(m, e))
    p = fem.Function(V, name="gibbs")
    p.x.array[:n] = e / z
    p.x.scatter_forward()
    return p


def gaussian_density(V: fem.FunctionSpace, mean: ArrayLike, cov: ArrayLike) -> fem.Function:
    """Interpolate the Gaussian N(mean, cov) density in V and normalise it to lumped mass Σ m_i ρ_i = 1.

    Args:
        V: Scalar P1 space on Θ ⊂ R^p.
        mean: Mean, shape (p,) (a scalar is accepted for p = 1).
        cov: Covariance, shape (p, p) symmetric positive definite (a scalar variance for p = 1).

    Returns:
        A new P1 Function ``rho`` with owned and ghost values set.
    """
    p = V.mesh.geometry.dim
    mu = np.atleast_1d(np.asarray(mean, dtype=np.float64)).reshape(p)
    c = np.atleast_2d(np.asarray(cov, dtype=np.float64)).reshape(p, p)
    cinv = np.linalg.inv(c)
    n = V.dofmap.index_map.size_local
    y = dof_coords(V) - mu
    vals = np.exp(-0.5 * np.einsum("ni,ij,nj->n", y, cinv, y))
    m = lumped_mass_owned(V)
    z = global_sum(V.mesh.comm, np.dot(m, vals))
    rho = fem.Function(V, name="rho")
    rho.x.array[:n] = vals / z
    rho.x.scatter_forward()
    return rho
