"""Diagnostics of a density on the circle (theory §9): initial data, Fourier modes, clusters, W1 on the circle.

* :func:`initial_density`: ``circle_modes`` (1/2π)(1 + Σ a cos(k(θ − φ))) at the DG nodes, and ``circle_noise``
  (1/2π)(1 + amplitude·ξ_j), ξ_j i.i.d. N(0, 1) seeded, one value per cell (clipped at 0), as the reference
  notebook draws it on its grid (its σ = 0.01 on the density is amplitude = 0.01·2π); both with mass 1.
* :func:`fourier`: |μ̂_k| = |∫ e^{−ikθ} dμ| by the Gauss rule of μ_h (μ̂_0 = mass; the mode a cos(k(θ−φ))/2π
  has |μ̂_k| = a/2).
* :func:`clusters`: local maxima of the cell means above twice the uniform density (mass/π), with their angles.
* :func:`w1_circle`: W1 on the circle, min_c ∫₀^{2π} |F_μ(θ) − F_ν(θ) − c| dθ (c the median of F_μ − F_ν:
  Rabin, Delon & Gousseau, J. Math. Imaging Vis. 41, 2011), from the CDFs on a fine uniform grid.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from mfpde.tokens.circle.dg import CircleMesh, _lagrange

__all__ = ["cdf_at", "cdf_density", "cdf_points", "clusters", "clusters_cdf", "fourier", "initial_density",
           "moments", "w1_circle"]

Array = npt.NDArray[np.float64]


def initial_density(mesh: CircleMesh, kind: str, modes: list[list[float]] | None = None, amplitude: float = 0.0,
                    seed: int = 0, data_cells: int | None = None) -> Array:
    """μ_0 at the DG nodes (n, p+1), mass 1 (``kind``: ``"circle_modes"`` or ``"circle_noise"``).

    ``data_cells``: the cells ``circle_noise`` is drawn on (default the mesh's n; a multiple of n), each of the
    mesh's cells taking the mean of its draws: the same data at a coarser resolution (the resolution check).
    """
    if kind == "circle_modes":
        def f(t: Array) -> Array:
            terms = (a * np.cos(k * (t - ph)) for k, a, ph in (modes or []))
            return (1.0 + sum(terms, np.zeros_like(t))) / (2 * math.pi)

        mu = mesh.interpolate(f)
    else:
        m = data_cells or mesh.n
        if m % mesh.n:
            raise ValueError(f"the noise's {m} cells are not a multiple of the mesh's {mesh.n}")
        xi = np.random.default_rng(seed).standard_normal(m)
        cell = (np.maximum(1.0 + amplitude * xi, 0.0) / (2 * math.pi)).reshape(mesh.n, -1).mean(axis=1)
        mu = np.repeat(cell[:, None], mesh.degree + 1, axis=1)
    return mu / mesh.mass(mu)


def moments(theta: Array, weights: Array | float, K: int) -> npt.NDArray[np.complex128]:
    """μ̂_k = Σ_j w_j e^{−ikθ_j}, k = 1..K, of the weighted points (θ_j, w_j) (a scalar w: equal weights); shape (K,)."""
    th = np.asarray(theta, float).ravel()
    w = np.broadcast_to(np.asarray(weights, float), np.shape(theta)).ravel()
    return np.asarray(np.exp(-1j * np.outer(np.arange(1, K + 1), th)) @ w)


def fourier(mesh: CircleMesh, mu: Array, K: int) -> Array:
    """|μ̂_k| for k = 1..K by the Gauss rule of μ_h (:func:`moments` of the nodes), shape (K,)."""
    return np.asarray(np.abs(moments(mesh.nodes, mesh.weights(mu), K)), dtype=np.float64)


def clusters(mesh: CircleMesh, mu: Array) -> tuple[int, list[float]]:
    """(number, angles in [0, 2π)) of the local maxima of the cell means above 2 × mass/2π.

    A maximum is a cell above its left neighbour and not below its right one (periodic); its angle is the vertex
    of the parabola through the three cell means.
    """
    c = mesh.cell_means(mu)
    left, right = np.roll(c, 1), np.roll(c, -1)
    idx = np.flatnonzero((c > left) & (c >= right) & (c > 2 * mesh.mass(mu) / (2 * math.pi)))
    den = left[idx] - 2 * c[idx] + right[idx]
    off = np.where(den != 0, 0.5 * (left[idx] - right[idx]) / np.where(den != 0, den, 1.0), 0.0)
    ang = ((idx + 0.5 + off) * mesh.h) % (2 * math.pi)
    return len(idx), sorted(float(a) for a in ang)


def _grid(M: int) -> Array:
    return np.asarray((np.arange(M) + 0.5) * (2 * math.pi / M), dtype=np.float64)


def cdf_density(mesh: CircleMesh, mu: Array, M: int) -> Array:
    """F_μ(θ) = ∫_0^θ μ_h at the M midpoints of a uniform grid (M a multiple of n), exact for μ_h."""
    if M % mesh.n:
        raise ValueError(f"M = {M} must be a multiple of n = {mesh.n}")
    r = M // mesh.n
    s = (np.arange(r) + 0.5) / r
    # ∫_0^s ℓ_j by the Gauss rule of degree p on [0, s] (exact: ℓ_j has degree p)
    x, wg = np.polynomial.legendre.leggauss(mesh.degree + 1)
    part = np.zeros((r, mesh.degree + 1))
    for i, si in enumerate(s):
        V, _ = _lagrange(mesh.s, 0.5 * si * (x + 1.0))
        part[i] = 0.5 * si * (wg @ V)
    cells = mesh.cell_means(mu) * mesh.h
    before = np.concatenate([[0.0], np.cumsum(cells)[:-1]])
    return np.asarray((before[:, None] + mesh.h * (mu @ part.T)).ravel(), dtype=np.float64)


def cdf_points(theta: Array, M: int, weights: Array | None = None) -> Array:
    """The empirical CDF of points θ (mod 2π), with equal or given weights (summing to 1), at the M midpoints."""
    th = np.mod(np.asarray(theta, float), 2 * math.pi)
    order = np.argsort(th)
    w = np.full(len(th), 1.0 / len(th)) if weights is None else np.asarray(weights, float)[order]
    cum = np.concatenate([[0.0], np.cumsum(w)])
    return cum[np.searchsorted(th[order], _grid(M), side="right")]


def w1_circle(F: Array, G: Array | Any) -> float:
    """W1 on the circle from two CDFs on the same uniform midpoint grid of M points (G may be a callable of θ).

    The grid error is at most 2π/M times the larger density bound (or 2π/M for an empirical measure).
    """
    F = np.asarray(F, float)
    G = np.asarray(G(_grid(len(F))) if callable(G) else G, float)
    D = F - G
    return float(np.sum(np.abs(D - np.median(D))) * 2 * math.pi / len(F))


def cdf_at(mesh: CircleMesh, mu: Array, theta: Array) -> Array:
    """F_μ(θ) = ∫_0^θ μ_h at angles θ ∈ [0, 2π), exact for μ_h (the Gauss rule of degree p on [cell start, θ])."""
    th = np.mod(np.asarray(theta, float), 2 * math.pi)
    c = np.minimum((th / mesh.h).astype(int), mesh.n - 1)
    s = th / mesh.h - c
    x, wg = np.polynomial.legendre.leggauss(mesh.degree + 1)
    pts = (0.5 * s[:, None] * (x[None, :] + 1.0)).ravel()
    V, _ = _lagrange(mesh.s, pts)  # (len(th)·(p+1), p+1)
    V = V.reshape(len(th), len(x), mesh.degree + 1)
    part = 0.5 * s[:, None] * np.einsum("q,iqj->ij", wg, V)  # ∫_0^s ℓ_j
    before = np.concatenate([[0.0], np.cumsum(mesh.cell_means(mu) * mesh.h)[:-1]])
    return np.asarray(before[c] + mesh.h * np.einsum("ij,ij->i", part, mu[c]), dtype=np.float64)


#: Runs of hot bins closer than 2π/BRIDGE (0.1 rad) are one cluster; distinct clusters are ≥ 2π/k_max(β) apart (0.57 rad
#: at β = 64).
BRIDGE = 64
#: A run holding less mass than this is not a cluster (a few bins above the threshold: a lone label of a coarse
#: flow map in transit between clusters, a wiggle of a coarse mesh); the k_max ≤ 11 clusters of β ≤ 64 hold ≈ 1/11.
MIN_CLUSTER_MASS = 1.0 / 64


def clusters_cdf(F: Array) -> tuple[int, list[float]]:
    """(number, angles) of the clusters of a measure given by its CDF at the angles 2πj/N (N = len(F), mass 1).

    A cluster is a maximal cyclic run of bins [2πj/N, 2π(j+1)/N) whose mass exceeds twice the uniform bin mass
    (density above twice the uniform density at the bins' resolution), runs less than 2π/BRIDGE apart counted as
    one (the flanks of one peak crossing the threshold), holding at least MIN_CLUSTER_MASS; its angle is the
    circular mean of its bins weighted by their masses. Unlike local maxima, wiggles inside one peak do not count.
    """
    F = np.asarray(F, float)
    N = len(F)
    m = np.diff(np.concatenate([F, [F[0] + 1.0]]))
    hot = m > 2.0 / N
    if hot.all() or not hot.any():
        return 0, []
    start = int(np.flatnonzero(~hot)[0])  # rotate so that a run never wraps
    hot, m = np.roll(hot, -start), np.roll(m, -start)
    ang = (np.arange(N) + start + 0.5) * (2 * math.pi / N)
    edges = np.diff(np.concatenate([[0], hot.astype(int), [0]]))
    runs = [[int(a), int(b)] for a, b in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True)]
    gap = max(1, N // BRIDGE)
    joined = [runs[0]]
    for a, b in runs[1:]:  # bridge gaps shorter than 2π/BRIDGE: the flanks of one peak crossing the threshold
        if a - joined[-1][1] < gap:
            joined[-1][1] = b
        else:
            joined.append([a, b])
    spans = [[(a, b)] for a, b in joined]
    if len(spans) > 1 and joined[0][0] + N - joined[-1][1] < gap:  # across the cut
        spans[0] = spans.pop() + spans[0]
    out = []
    for parts in spans:
        if sum(float(m[a:b].sum()) for a, b in parts) < MIN_CLUSTER_MASS:  # a straggler, not a cluster
            continue
        z = sum(np.sum(m[a:b] * np.exp(1j * ang[a:b])) for a, b in parts)
        out.append(float(np.mod(np.angle(z), 2 * math.pi)))
    return len(out), sorted(out)
