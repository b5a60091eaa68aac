"""The picture of a sphere run: μ_t in Mollweide views at several depths, clusters marked (rank 0, matplotlib)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import scipy.spatial

from mfpde.tokens.sphere.diag import lonlat

__all__ = ["PANELS", "panel_title", "pick_panels", "sphere_figure"]

#: The most depths pictured.
PANELS = 4
#: The longitude × latitude grid each panel samples μ on (nearest cell).
GRID = (360, 180)


def pick_panels(n: int, panels: int = PANELS) -> list[int]:
    """The indices of ``panels`` output depths out of n, first and last included, evenly spaced."""
    return sorted({int(round(i)) for i in np.linspace(0, n - 1, min(n, panels))})


def panel_title(t: float, count: int, collapsed: bool = False) -> str:
    """A panel's title: the depth and the report's cluster count there (``collapsed``: the flow solver's)."""
    if collapsed:
        return f"t = {t:.4g}, " + (f"{count} collapsed" if count else "none collapsed")
    return f"t = {t:.4g}" + (f", {count} cluster{'s' if count > 1 else ''}" if count else "")


#: max μ / min μ below this: the colour scale is linear about the uniform density (a log one shows one colour).
NEAR_UNIFORM = 10.0
#: Cluster centres closer than this (rad) share one ring, labelled with their number (one ring is 9 points wide).
SPOT = 0.05


def _spots(c: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """The distinct ring positions of cluster centres c (k, 3) and how many clusters each holds (within SPOT)."""
    spots: list[np.ndarray] = []
    many: list[int] = []
    for x in c:
        for i, y in enumerate(spots):
            if float(np.dot(x, y)) > math.cos(SPOT):
                many[i] += 1
                break
        else:
            spots.append(x)
            many.append(1)
    return np.array(spots), many


def sphere_figure(ts: list[float], snaps: list[tuple[Any, Any]], centres: list[list[list[float]]],
                  title: str, collapsed: bool = False) -> Any:
    """Mollweide panels of μ at the depths ``ts``, each from (cell centres (n, 3), cell values (n,)).

    Args:
        ts: the depths of the panels.
        snaps: per panel, the cells' centres and mean densities (all cells).
        centres: per panel, the cluster centres (unit vectors) to mark.
        title: the figure's title.
        collapsed: the clusters are the flow solver's, groups of particles collapsed to a point: the titles say
            so, and a caption says that the bumps not circled are still forming (counted by DG, not by the flow).

    One colour scale for all panels, logarithmic from the uniform density 1/4π ÷ 10 up, so that a forming cluster
    and the depleted region between clusters are both visible; the uniform density is the colour bar's mark. Where
    μ stays within a factor :data:`NEAR_UNIFORM` of its minimum (no cluster: noise, small modes), that scale is a
    single colour; the scale is then linear and diverging, centred on 1/4π, as wide as the largest deviation.
    """
    import matplotlib.colors
    from matplotlib.figure import Figure

    lon = np.linspace(-math.pi, math.pi, GRID[0] + 1)
    lat = np.linspace(-math.pi / 2, math.pi / 2, GRID[1] + 1)
    lc, tc = 0.5 * (lon[1:] + lon[:-1]), 0.5 * (lat[1:] + lat[:-1])
    LC, TC = np.meshgrid(lc, tc)
    grid = np.stack([np.cos(TC) * np.cos(LC), np.cos(TC) * np.sin(LC), np.sin(TC)], axis=-1).reshape(-1, 3)
    fields = []
    for c, v in snaps:
        _, idx = scipy.spatial.cKDTree(np.asarray(c, float)).query(grid)
        fields.append(np.asarray(v, float)[idx].reshape(LC.shape))
    uniform = 1.0 / (4 * math.pi)
    hi = max(float(np.max(f)) for f in fields)
    low = min(float(np.min(f)) for f in fields)
    near = low > 0 and hi / low < NEAR_UNIFORM  # no cluster: a linear scale about the uniform density shows μ
    if near:
        d = max(hi - uniform, uniform - low, 1e-12 * uniform)
        norm: Any = matplotlib.colors.Normalize(uniform - d, uniform + d)
        lo, cmap = uniform - d, "RdBu_r"
    else:
        lo = min(uniform / 10.0, hi / 100.0)
        norm, cmap = matplotlib.colors.LogNorm(lo, max(hi, 10 * lo)), "magma"
    n = len(fields)
    fig = Figure(figsize=(4.2 * n, 2.9))  # outside pyplot: nothing to close
    fig.subplots_adjust(left=0.01, right=0.99, top=0.84, bottom=0.22, wspace=0.05)
    for k, (t, f, cl) in enumerate(zip(ts, fields, centres, strict=True)):
        ax = fig.add_subplot(1, n, k + 1, projection="mollweide")
        im = ax.pcolormesh(lon, lat, np.maximum(f, lo), norm=norm, cmap=cmap, shading="flat")
        if cl:
            spots, many = _spots(np.asarray(cl, float))
            x, y = lonlat(spots)
            ax.plot(x, y, "o", mfc="none", mec="cyan", ms=9, mew=1.5, clip_on=False)
            for xi, yi, m in zip(x, y, many, strict=True):
                if m > 1:  # groups about to merge: one ring, their number beside it (the title counts each)
                    ax.annotate(f"×{m}", (xi, yi), xytext=(7, -11), textcoords="offset points", color="cyan",
                                fontsize=8, fontweight="bold", annotation_clip=False)
        ax.set_title(panel_title(t, len(cl), collapsed) if k or cl else f"t = {t:.4g}", fontsize=10)
        ax.set_xticklabels([])
        ax.set_yticklabels([])
        ax.grid(True, alpha=0.3)
    cax = fig.add_axes((0.3, 0.1, 0.4, 0.04))
    cb = fig.colorbar(im, cax=cax, orientation="horizontal")
    cb.set_label(("density μ_t (linear, centred on the uniform 1/4π)" if near else
                  "density μ_t (log scale); uniform 1/4π marked")
                 + ("\ncircled: clusters whose particles collapsed to < 10⁻³ rad (the report's clusters_t); "
                    "the other bumps are still forming" if collapsed else ""))
    cb.ax.axvline(uniform, color="black" if near else "white", lw=1.5)
    fig.suptitle(title, fontsize=11, y=0.99)
    return fig
