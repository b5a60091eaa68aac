"""The picture of a sphere run: μ_t in Mollweide views at several depths, clusters marked (rank 0, matplotlib)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import scipy.spatial

from mfpde.tokens.sphere.diag import lonlat

__all__ = ["PANELS", "pick_panels", "sphere_picture"]

#: The most depths pictured.
PANELS = 4
#: The longitude × latitude grid each panel samples μ on (nearest cell).
GRID = (360, 180)


def pick_panels(n: int, panels: int = PANELS) -> list[int]:
    """The indices of ``panels`` output depths out of n, first and last included, evenly spaced."""
    return sorted({int(round(i)) for i in np.linspace(0, n - 1, min(n, panels))})


def sphere_picture(path: Path, ts: list[float], snaps: list[tuple[Any, Any]], centres: list[list[list[float]]],
                   title: str) -> None:
    """Mollweide panels of μ at the depths ``ts``, each from (cell centres (n, 3), cell values (n,)).

    Args:
        path: the PNG (its directory is created).
        ts: the depths of the panels.
        snaps: per panel, the cells' centres and mean densities (all cells).
        centres: per panel, the cluster centres (unit vectors) to mark.
        title: the figure's title.

    One colour scale for all panels, logarithmic from the uniform density 1/4π ÷ 10 up, so that a forming cluster
    and the depleted region between clusters are both visible; the uniform density is the colour bar's mark.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.colors
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
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
    lo = min(uniform / 10.0, hi / 100.0)
    norm = matplotlib.colors.LogNorm(lo, max(hi, 10 * lo))
    n = len(fields)
    fig = plt.figure(figsize=(4.2 * n, 2.9))
    fig.subplots_adjust(left=0.01, right=0.99, top=0.84, bottom=0.22, wspace=0.05)
    for k, (t, f, cl) in enumerate(zip(ts, fields, centres, strict=True)):
        ax = fig.add_subplot(1, n, k + 1, projection="mollweide")
        im = ax.pcolormesh(lon, lat, np.maximum(f, lo), norm=norm, cmap="magma", shading="flat")
        if cl:
            x, y = lonlat(np.asarray(cl, float))
            ax.plot(x, y, "o", mfc="none", mec="cyan", ms=9, mew=1.5)
        ax.set_title(f"t = {t:.4g}" + (f", {len(cl)} cluster{'s' if len(cl) > 1 else ''}" if cl else ""),
                     fontsize=10)
        ax.set_xticklabels([])
        ax.set_yticklabels([])
        ax.grid(True, alpha=0.3)
    cax = fig.add_axes((0.3, 0.1, 0.4, 0.04))
    cb = fig.colorbar(im, cax=cax, orientation="horizontal")
    cb.set_label("density μ_t (log scale); uniform 1/4π marked")
    cb.ax.axvline(uniform, color="white", lw=1.5)
    fig.suptitle(title, fontsize=11, y=0.99)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
