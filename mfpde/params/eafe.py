"""The edge-averaged exponential fitting (EAFE, Scharfetter–Gummel) rate and P1 helpers on Θ (theory §4, §7).

The rate λB(Δφ/λ), B(x) = x/(eˣ − 1), is the i → j transition rate (per unit edge weight) of the
parameter Fokker–Planck generator of :class:`mfpde.params.fokker_planck.ParameterFokkerPlanck`
(Xu & Zikatanov, Math. Comp. 68 (1999) 1429–1446; Scharfetter & Gummel, IEEE Trans. Electron Devices 16
(1969) 64–77).
"""

from __future__ import annotations

import math

from mpi4py import MPI

import dolfinx
import numpy as np
from dolfinx import fem
from numpy.typing import ArrayLike, NDArray

__all__ = ["lam_bernoulli"]

# Below |x| < _SMALL the Bernoulli function is evaluated by its Taylor series (error < x⁴/720).
_SMALL = 1e-6
# MPI tag for the consensus exchange inside the column IndexMap constructor.
_INDEXMAP_TAG = 4417


def lam_bernoulli(dphi: ArrayLike, lam: float) -> NDArray[np.float64]:
    """Evaluate λ·B(Δφ/λ), B(x) = x/(eˣ − 1), stably for every λ ≥ 0 (the EAFE / Scharfetter–Gummel rate).

    With Δφ = Φ_j − Φ_i this is the rate (per unit edge weight w_ij) at which mass leaves node i for node j.
    For λ → 0 it tends to the upwind rate max(Φ_i − Φ_j, 0) = max(−Δφ, 0), which is returned for λ = 0, so
    the Tikhonov (WGF) transport is the λ → 0 limit of the same formula. No overflow for any |Δφ/λ|:
    x < 0 uses Δφ/expm1(x) (|expm1| ≤ 1), x > 0 uses Δφ e^{−x}/(−expm1(−x)), |x| < 1e-6 the series
    λ(1 − x/2 + x²/12), and B(0) = 1.

    Args:
        dphi: Potential differences Φ_j − Φ_i, any shape (non-dimensional).
        lam: Entropic regularisation λ ≥ 0.

    Returns:
        λ B(Δφ/λ), same shape as ``dphi``, all entries ≥ 0.

    Raises:
        ValueError: If ``lam`` is negative or not finite.
    """
    d = np.asarray(dphi, dtype=np.float64)
    if not (math.isfinite(lam) and lam >= 0.0):
        raise ValueError(f"lam must be finite and >= 0, got {lam!r}")
    if lam == 0.0:
        return np.maximum(-d, 0.0)
    x = d / lam
    out = np.empty_like(x)
    small = np.abs(x) < _SMALL
    neg = (x < 0.0) & ~small
    pos = (x > 0.0) & ~small
    xs = x[small]
    out[small] = lam * (1.0 - 0.5 * xs + xs * xs / 12.0)
    out[neg] = d[neg] / np.expm1(x[neg])
    out[pos] = d[pos] * np.exp(-x[pos]) / -np.expm1(-x[pos])
    out[np.isnan(x)] = np.nan
    return out


def check_p1(V: fem.FunctionSpace) -> None:
    """Raise ValueError unless V is a scalar continuous P1 Lagrange space."""
    el = V.ufl_element()
    scalar = V.dofmap.index_map_bs == 1 and V.dofmap.bs == 1 and el.reference_value_shape == ()
    if not (scalar and el.family_name == "P" and el.degree == 1 and not el.discontinuous):
        raise ValueError("ParameterFokkerPlanck needs a scalar P1 Lagrange space ('Lagrange', 1)")


def global_sum(comm: MPI.Comm, x: float) -> float:
    return float(comm.allreduce(float(x), op=MPI.SUM))


def dof_coords(V: fem.FunctionSpace) -> NDArray[np.float64]:
    """Coordinates of the owned dofs, shape (num_owned_dofs, p) with p = geometric dimension."""
    n = V.dofmap.index_map.size_local
    gdim = V.mesh.geometry.dim
    return np.array(V.tabulate_dof_coordinates()[:n, :gdim], dtype=np.float64)


def make_index_map(
    comm: MPI.Comm, n: int, ghosts: NDArray[np.int64], owners: NDArray[np.int32]
) -> dolfinx.common.IndexMap:
    """IndexMap with ``n`` owned indices and the given global ghosts and their owner ranks (collective)."""
    return dolfinx.common.IndexMap(comm, n, ghosts, owners, _INDEXMAP_TAG)
