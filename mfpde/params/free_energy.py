"""The free energy of the head distribution, in one place (theory §2, §4).

Two functionals appear, and they are kept apart by name:

* :func:`training_free_energy`: the training objective F(ρ) = R(ρ) + (λ₂/2)∫|θ|²dρ + λ∫ρ log ρ
  (theory §2), summed over layer blocks; its decay is what ``history.csv`` and the fitted rate report.
* :func:`diagnostics` ``["free_energy"]``: the Lyapunov functional of one Fokker–Planck step with the
  potential Φ frozen, F_Φ(ρ) = ∫Φρ + λ∫ρ log ρ (theory §4, §7 item 5), with its dissipation and the
  distance to the Gibbs density p ∝ e^{−Φ/λ}; the report takes ρ's moments and the Gibbs residual from it.

Both use the lumped-mass quadrature Σ_i m_i f(θ_i) on the owned P1 dofs, reduced over MPI.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

from mpi4py import MPI

import dolfinx.fem
import numpy as np
from dolfinx import fem
from numpy.typing import NDArray

from mfpde.params.eafe import dof_coords, global_sum

if TYPE_CHECKING:
    from mfpde.params.theta import ThetaSpace

__all__ = ["Generator", "diagnostics", "gibbs_kl", "training_free_energy"]

Array = NDArray[np.float64]


class Generator(Protocol):
    """The edge data of a Fokker–Planck generator that :func:`diagnostics` needs.

    :class:`mfpde.params.fokker_planck.ParameterFokkerPlanck` is one.
    """

    V: fem.FunctionSpace
    comm: MPI.Comm
    lam: float
    n_owned: int
    m: Array
    rows: Array
    lcols: Array

    def check_args(self, rho: fem.Function, phi: fem.Function) -> None:
        """Raise ValueError unless rho and phi are Functions of ``V``."""
        ...

    def gather(self, f: fem.Function) -> Array:
        """Owned and column-ghost values of f."""
        ...

    def rates(self, phi_c: Array) -> tuple[Array, Array]:
        """Edge rates (w_ij r_ij, w_ij r_ji) per CSR entry of the owned rows."""
        ...


def training_free_energy(theta: ThetaSpace, rhos: list[dolfinx.fem.Function], conf: NDArray[np.float64], lam: float,
                         risk: float) -> dict[str, float]:
    """F = R + (λ₂/2)∫|θ|²dρ + λ∫ρ log ρ (theory §2), summed over layer blocks, and its parts.

    Args:
        theta: the Θ space (lumped mass and owned dofs).
        rhos: ρ per layer block (P1 on Θ).
        conf: (λ₂/2)|θ|² at the local dofs, shape (n_local,).
        lam: λ (0 for Tikhonov regularisation).
        risk: R(ρ).

    Returns:
        ``risk``, ``free_energy`` (F), ``entropy`` (Σ_ℓ ∫ρ^ℓ log ρ^ℓ), ``mass_rho`` (mean over blocks of
        ∫ρ^ℓ), ``min_rho`` (min over blocks and dofs); the same on every rank.
    """
    n, m, comm = theta.n_owned, theta.m[: theta.n_owned], theta.comm
    ent = conf_energy = mass = 0.0
    rmin = math.inf
    for r in rhos:
        x = r.x.array[:n]
        xl = np.where(x > 0, x * np.log(np.where(x > 0, x, 1.0)), 0.0)
        ent += comm.allreduce(float(m @ xl), op=MPI.SUM)
        conf_energy += comm.allreduce(float(m @ (conf[:n] * x)), op=MPI.SUM)
        mass += comm.allreduce(float(m @ x), op=MPI.SUM) / len(rhos)
        rmin = min(rmin, comm.allreduce(float(np.min(x, initial=math.inf)), op=MPI.MIN))
    return {"risk": risk, "free_energy": risk + conf_energy + lam * ent, "entropy": ent, "mass_rho": mass,
            "min_rho": rmin}


def gibbs_kl(comm: MPI.Comm, m: Array, lam: float, rho: Array, phi: Array) -> tuple[float, Array]:
    """KL(ρ ‖ p) = Σ m_i ρ_i log(ρ_i/p_i) against the nodal Gibbs density p ∝ e^{−Φ/λ} (Σ m_i p_i = 1). Collective.

    λ KL(ρ_s ‖ p_ρs) bounds F(ρ_s) − F* (theory §5.4). log p = −(Φ − Φ_min)/λ − log Z is taken in the log domain:
    p underflows to 0 where (Φ − Φ_min)/λ > 745 while ρ > 0, and log(ρ/0) would make the KL infinite.

    Args:
        comm: the Θ mesh's communicator.
        m: lumped masses of the owned dofs.
        lam: λ > 0.
        rho: owned nodal values of ρ.
        phi: owned nodal values of Φ.

    Returns:
        (KL, the owned nodal values of p).
    """
    fmin = comm.allreduce(float(np.min(phi, initial=math.inf)), op=MPI.MIN)
    e = np.exp(-(phi - fmin) / lam)
    z = global_sum(comm, np.dot(m, e))
    logp = -(phi - fmin) / lam - math.log(z)
    kl_terms = np.where(rho > 0.0, rho * (np.log(np.where(rho > 0.0, rho, 1.0)) - logp), 0.0)
    return global_sum(comm, np.dot(m, kl_terms)), e / z


def diagnostics(fp: Generator, rho: fem.Function, phi: fem.Function) -> dict[str, object]:
    """Lumped-mass diagnostics of ρ against Φ, reduced over MPI (same scalars on every rank). Collective.

    Args:
        fp: the solver whose generator (edge weights and rates) defines the dissipation.
        rho: Density ρ in V.
        phi: Full potential Φ in V.

    Returns:
        Dict with

        * ``mass``: Σ m_i ρ_i;  ``min_rho``: min_i ρ_i;
        * ``entropy``: Σ m_i ρ_i log ρ_i (0 log 0 = 0);
        * ``free_energy``: F = Σ m_i (Φ_i ρ_i + λ ρ_i log ρ_i) (theory §4, the Lyapunov functional);
        * ``dissipation``: D = ½ Σ_{i,j} J_ij (ξ_i − ξ_j) ≥ 0 with ξ = Φ + λ log ρ and the edge flux
          J_ij = w_ij (r_ij ρ_i − r_ji ρ_j), so that dF/ds = −D for the semi-discrete flow
          (discrete analogue of −∫|∇(Φ + λ log ρ)|² dρ, theory §7 item 5); NaN if some ρ_i ≤ 0 and λ > 0;
        * ``gibbs``: owned nodal values of p ∝ e^{−Φ/λ}, Σ m_i p_i = 1 (``None`` for λ = 0);
        * ``kl``: Σ m_i ρ_i log(ρ_i/p_i) (NaN for λ = 0);  ``l1_gibbs``: Σ m_i |ρ_i − p_i| (NaN for λ = 0);
        * ``mean``: shape (p,), Σ m_i ρ_i θ_i / mass;  ``cov``: shape (p, p), the centred second moment.
    """
    fp.check_args(rho, phi)
    comm, n, m, lam = fp.comm, fp.n_owned, fp.m, fp.lam
    r = rho.x.array[:n]
    f = phi.x.array[:n]
    mass = global_sum(comm, np.dot(m, r))
    rmin = float(comm.allreduce(float(np.min(r, initial=math.inf)), op=MPI.MIN))
    rlogr = np.where(r > 0.0, r * np.log(np.where(r > 0.0, r, 1.0)), 0.0)
    entropy = global_sum(comm, np.dot(m, rlogr))
    free_energy = global_sum(comm, np.dot(m, f * r)) + lam * entropy

    phi_c = fp.gather(phi)
    rho_c = fp.gather(rho)
    out, inn = fp.rates(phi_c)
    flux = out * rho_c[fp.rows] - inn * rho_c[fp.lcols]
    if lam > 0.0:
        if rmin > 0.0:
            xi = phi_c + lam * np.log(np.where(rho_c > 0.0, rho_c, 1.0))
            dissipation = 0.5 * global_sum(comm, np.dot(flux, xi[fp.rows] - xi[fp.lcols]))
        else:
            dissipation = math.nan
    else:
        dissipation = 0.5 * global_sum(comm, np.dot(flux, phi_c[fp.rows] - phi_c[fp.lcols]))

    if lam > 0.0:
        kl, p = gibbs_kl(comm, m, lam, r, f)
        l1 = global_sum(comm, np.dot(m, np.abs(r - p)))
        gibbs_arr: NDArray[np.float64] | None = p
    else:
        kl = l1 = math.nan
        gibbs_arr = None

    x = dof_coords(fp.V)
    mean = np.array(comm.allreduce((m * r) @ x, op=MPI.SUM)) / mass
    y = x - mean
    cov = np.array(comm.allreduce((y * (m * r)[:, None]).T @ y, op=MPI.SUM)) / mass
    return {
        "mass": mass,
        "min_rho": rmin,
        "entropy": entropy,
        "free_energy": free_energy,
        "dissipation": dissipation,
        "gibbs": gibbs_arr,
        "kl": kl,
        "l1_gibbs": l1,
        "mean": mean,
        "cov": cov,
    }
