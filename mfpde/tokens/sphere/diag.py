"""Diagnostics of a measure on S² (theory §9): degree powers, clusters, a cell histogram of point masses.

Every function takes the measure as point masses (x (n, 3) unit vectors, w (n,) masses) or as cell values with
their centres, so that the DG solver (cell quadrature points) and the flow solver (particles) share them.
"""

from __future__ import annotations

import math
from typing import Any

from mpi4py import MPI

import numpy as np
import numpy.typing as npt
import scipy.spatial

from mfpde.tokens.sphere.kernel import degree_power
from mfpde.tokens.sphere.sht import analysis

__all__ = ["CLUSTER_FACTOR", "cell_clusters", "kde", "lonlat", "measure_power"]

Array = npt.NDArray[np.float64]
#: A cluster is a local maximum of the cell means above this multiple of the uniform density 1/4π.
CLUSTER_FACTOR = 2.0


def measure_power(x: Array, w: Array, L: int, comm: MPI.Comm = MPI.COMM_SELF) -> Array:
    """Σ_m μ̂_ℓm² for ℓ = 0..L (shape (L+1,)), μ̂_ℓm = Σ_j w_j Y_ℓm(x_j) summed over the ranks of ``comm``.

    The measure of each rank is its own points (x (n, 3) unit vectors, w (n,) masses); one allreduce of the
    (L+1)² coefficients. The uniform probability measure has power 1/4π at ℓ = 0 and 0 elsewhere.
    """
    c = analysis(L, x, np.asarray(w, float)) if len(x) else np.zeros((L + 1) ** 2)
    return degree_power(comm.allreduce(c, op=MPI.SUM) if comm.size > 1 else c)


def cell_clusters(centres: Array, means: Array, radius: float) -> tuple[int, list[list[float]]]:
    """(count, centres) of the clusters: cells whose mean exceeds CLUSTER_FACTOR/4π and every cell's within ``radius``.

    Args:
        centres: the cells' centres (n, 3), on or near S² (all cells of the mesh: gathered).
        means: the cells' mean densities (n,).
        radius: the chordal distance within which cells are neighbours (about twice the largest cell diameter).

    Returns:
        The number of local maxima above the threshold and their centres (unit vectors), strongest first. Ties
        (a plateau) count once: the cell of lowest index wins.
    """
    means = np.asarray(means, float)
    hot = np.flatnonzero(means > CLUSTER_FACTOR / (4 * math.pi))
    if hot.size == 0:
        return 0, []
    tree = scipy.spatial.cKDTree(centres)
    peaks = []
    for i in hot:
        nb = np.asarray(tree.query_ball_point(centres[i], radius), int)
        other = nb[nb != i]
        if np.all((means[other] < means[i]) | ((means[other] == means[i]) & (other > i))):
            peaks.append(i)
    peaks.sort(key=lambda i: -means[i])
    pts = centres[peaks] / np.linalg.norm(centres[peaks], axis=1)[:, None]
    return len(peaks), pts.tolist()


def kde(x: Array, w: Array, points: Array, kappa: float, chunk: int = 4096) -> Array:
    """The density (m,) at ``points`` (m, 3) of the point masses (x (n, 3), w (n,)) smoothed on S².

    The kernel is von Mises–Fisher's of concentration κ, Σ_j w_j κ e^{κ(x·x_j − 1)}/(2π(1 − e^{−2κ})): each a
    probability density on S² (standard deviation ≈ 1/√κ radians), so the integral is Σ w and the density > 0.
    """
    x, w, points = np.asarray(x, float), np.asarray(w, float), np.asarray(points, float)
    c = kappa / (2 * math.pi * -math.expm1(-2 * kappa))
    out = np.empty(len(points))
    for s in range(0, len(points), chunk):
        out[s:s + chunk] = c * np.exp(kappa * (points[s:s + chunk] @ x.T - 1.0)) @ w
    return out


def lonlat(x: Any) -> tuple[Array, Array]:
    """(longitude in (−π, π], latitude in [−π/2, π/2]) of the unit vectors x (n, 3)."""
    x = np.asarray(x, float).reshape(-1, 3)
    return np.arctan2(x[:, 1], x[:, 0]), np.arcsin(np.clip(x[:, 2] / np.linalg.norm(x, axis=1), -1, 1))
