"""The twin against the PDE: W1 between the heads and ρ_s, gaps, and the fitted exponents with their errors.

* :func:`w1_heads`: W1 (p = 1, exact for the P1 density: ∫|F_H − F_ρ| on a fine grid where F_ρ is exact) or sliced
  W1 (p = 2: the mean over directions of the 1-D W1 of the projections; ρ by a midpoint rule of
  :data:`SUBCELLS`² points per Θ cell) between the empirical head measure and the PDE's P1 density on Θ;
* :func:`w1_tokens`: W1 between the twin's token cloud at depth T and the PDE's μ_T (its DG0 cells as atoms);
* :func:`fit_gaps`: the exponent of a gap against a size (H, N or L) from the seed means and standard errors,
  sizes whose gap is not above twice the PDE's own discretisation error left out (flagged) of the fit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.stats import wasserstein_distance

from mfpde.fitting import fit_power, slope_se

__all__ = ["SLICES", "SUBCELLS", "fit_gaps", "ProjectedDensity", "rho_quadrature", "w1_heads", "w1_tokens"]

Array = npt.NDArray[np.float64]
#: Directions of the sliced W1 on a 2-D Θ (equally spaced on a half circle).
SLICES = 16
#: Midpoints per Θ cell and axis of the quadrature of ρ in the sliced W1 (its W1 error is below h/(4·SUBCELLS)).
SUBCELLS = 8
#: A gap is fitted only where it exceeds this multiple of the PDE's own discretisation error.
PDE_ERROR_MARGIN = 2.0


def _grid_axes(points: Array) -> list[Array]:
    return [np.unique(np.round(points[:, j], 12)) for j in range(points.shape[1])]


def rho_quadrature(points: Array, rho: Array) -> tuple[Array, Array]:
    """A quadrature of the P1 density ``rho`` at the Θ nodes (a tensor grid): points (M, p) and weights (M,).

    The midpoints of :data:`SUBCELLS`^p sub-cells of each cell, weights ρ (linear, bilinear interpolation of
    the nodal values: the P1 density of a triangulated square differs from it by O(h²)) times the sub-cell's
    size, normalised to 1. As a measure it is within h/(4·SUBCELLS) of ρ in W1.
    """
    from scipy.interpolate import RegularGridInterpolator

    p = points.shape[1]
    axes = _grid_axes(points)
    grid = np.zeros(tuple(len(a) for a in axes))
    idx = tuple(np.searchsorted(axes[j], np.round(points[:, j], 12)) for j in range(p))
    grid[idx] = np.maximum(rho, 0.0)
    t = (np.arange(SUBCELLS) + 0.5) / SUBCELLS
    mids = [(a[:-1, None] + np.diff(a)[:, None] * t[None]).ravel() for a in axes]
    sizes = [np.repeat(np.diff(a), SUBCELLS) / SUBCELLS for a in axes]
    Q = np.stack([m.ravel() for m in np.meshgrid(*mids, indexing="ij")], 1)
    size = np.prod(np.stack([m.ravel() for m in np.meshgrid(*sizes, indexing="ij")], 1), axis=1)
    w = RegularGridInterpolator(axes, grid)(Q) * size
    return Q, w / w.sum()


def _directions(p: int) -> Array:
    if p == 1:
        return np.ones((1, 1))
    ang = np.pi * (np.arange(SLICES) + 0.5) / SLICES
    return np.stack([np.cos(ang), np.sin(ang)], 1)


class ProjectedDensity:
    """The projections of a P1 density's quadrature (:func:`rho_quadrature`) on the W1 directions, sorted once.

    Args:
        points: the Θ nodes (N_θ, p), a tensor grid; rho: the nodal values.
    """

    def __init__(self, points: Array, rho: Array) -> None:
        q, wq = rho_quadrature(points, rho)
        self.dirs = _directions(points.shape[1])
        self.sorted, self.cdf = [], []
        for u in self.dirs:
            proj = q @ u
            o = np.argsort(proj, kind="stable")
            self.sorted.append(proj[o])
            self.cdf.append(np.cumsum(wq[o]))

    def w1(self, heads: Array, weights: Array | None = None) -> float:
        """The mean over directions of ∫|F_heads − F_ρ| (exact for the two discrete measures)."""
        out = []
        for u, xs, cw in zip(self.dirs, self.sorted, self.cdf, strict=True):
            h = heads @ u
            o = np.argsort(h, kind="stable")
            hs = h[o]
            hw = np.cumsum(np.full(len(h), 1.0 / len(h)) if weights is None else weights[o] / weights.sum())
            pos = np.searchsorted(xs, hs, side="right")  # the heads merged into the sorted quadrature: O(M + H)
            grid = np.insert(xs, pos, hs)
            is_q = np.insert(np.ones(len(xs), bool), pos, False)
            i = np.cumsum(is_q)[:-1] - 1  # the last quadrature point (head) at or before each grid point
            j = np.cumsum(~is_q)[:-1] - 1
            F = np.where(i >= 0, cw[np.maximum(i, 0)], 0.0)
            G = np.where(j >= 0, hw[np.maximum(j, 0)], 0.0)
            out.append(float(np.sum(np.abs(F - G) * np.diff(grid))))
        return float(np.mean(out))


def w1_heads(heads: Array, points: Array, rho: Array, weights: Array | None = None) -> float:
    """W1 (1-D Θ) or sliced W1 (2-D Θ) between weighted heads (H, p) and the P1 density ``rho`` on Θ.

    Sliced: the mean over :data:`SLICES` directions. ``weights`` default to equal; ``points`` are the Θ nodes
    (a tensor grid, the box's).
    """
    return ProjectedDensity(points, rho).w1(heads, weights)


def w1_tokens(tokens: Array, weights: Array, points: Array, mass: Array) -> float:
    """W1 (d = 1) or sliced W1 (d = 2) between weighted tokens (N, d) and atoms ``points`` of masses ``mass``."""
    m = np.maximum(mass, 0.0)
    return float(np.mean([wasserstein_distance(tokens @ u, points @ u, u_weights=weights, v_weights=m)
                          for u in _directions(tokens.shape[1])]))


def _sizes_text(xs: list[int]) -> str:
    return f"size {xs[0]}" if len(xs) == 1 else "sizes " + ", ".join(str(x) for x in xs)


def fit_gaps(sizes: list[int], gaps: Array, pde_error: float, expected: float | None,
             signed: bool = False) -> dict[str, Any]:
    """The exponent q of gap ≈ C size^q from per-seed gaps (len(sizes), S), with its standard error.

    The gap of a size is the mean over seeds of |gap| (one seed's gap), or with ``signed`` |mean over seeds of
    gap| (the seed-mean bias); its standard error the seeds' standard deviation / √S.
    Sizes whose mean gap is not above :data:`PDE_ERROR_MARGIN` × ``pde_error``, and seed-mean biases not above two
    standard errors (not resolved from zero), are left out (``fitted`` says which entered). The
    standard error of q combines the Monte-Carlo error of the means (:func:`mfpde.fitting.slope_se`) and the
    residual scatter of the log-log fit (:func:`mfpde.fitting.fit_power`, when more than two sizes are fitted).

    Returns:
        ``slope``, ``se`` (None when fewer than two sizes are fitted), ``expected``, ``sizes``, ``gaps`` (the
        means), ``gap_se``, ``fitted`` (which sizes entered the fit), ``pde_error``, ``note``.
    """
    g = np.asarray(gaps, float) if signed else np.abs(np.asarray(gaps, float))
    mean = np.abs(g.mean(axis=1))
    se = g.std(axis=1, ddof=1) / math.sqrt(g.shape[1]) if g.shape[1] > 1 else np.full(len(mean), np.nan)
    floor = PDE_ERROR_MARGIN * pde_error if math.isfinite(pde_error) else 0.0
    resolved = [not (signed and math.isfinite(e) and m <= 2 * e) for m, e in zip(mean, se, strict=True)]
    fitted = [bool(m > floor and m > 0 and r) for m, r in zip(mean, resolved, strict=True)]
    out: dict[str, Any] = {"slope": None, "se": None, "expected": expected, "sizes": list(sizes),
                           "gaps": mean.tolist(), "gap_se": se.tolist(), "fitted": fitted, "pde_error": pde_error,
                           "note": ""}
    xs = [s for s, f in zip(sizes, fitted, strict=True) if f]
    if len(sizes) < 2:
        out["note"] = "a single size: no exponent"
        out["fitted"] = [False] * len(sizes)
        return out
    below = [s for s, m in zip(sizes, mean, strict=True) if not m > floor]
    unresolved = [s for s, r, m in zip(sizes, resolved, mean, strict=True) if not r and m > floor]
    why = []
    if below:
        why.append(f"{_sizes_text(below)} at or below twice the PDE's own discretisation error ({pde_error:.3g}; the "
                   "PDE's mesh decides these gaps, not the network: refine tokens.cells)")
    if unresolved:
        why.append(f"the seed mean of {_sizes_text(unresolved)} within two standard errors of zero (more seeds: "
                   "twin.seeds)")
    if len(xs) < 2:
        out["note"] = "no exponent: " + "; ".join(why)
        return out
    ys, es = mean[fitted], se[fitted]
    law = fit_power(xs, ys)
    mc = slope_se(xs, ys, es)
    resid = law.se_q if len(xs) > 2 and math.isfinite(law.se_q) else 0.0
    out["slope"], out["se"] = law.q, float(math.hypot(mc, resid))
    if why:
        out["note"] = "left out of the fit: " + "; ".join(why)
    return out
