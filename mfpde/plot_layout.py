"""Hand layout of the figures of :mod:`mfpde.plots` (inches, no layout engine: text layout costs most).

Imports nothing of mfpde and no solver, as the plots.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["legend_below", "spread_tick_labels"]

Array = npt.NDArray[np.float64]


def _col(history: list[dict[str, float]], key: str) -> Array | None:
    """The column ``key`` of the history rows, shape (rows,), or None if the rows have no such key."""
    return np.array([h[key] for h in history], dtype=float) if history and key in history[0] else None


def _figure(width: float, height: float) -> Figure:
    """A figure of that size in inches, outside pyplot (no figure manager: nothing to close)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))


def _place(fig: Figure, x: float, y: float, w: float, h: float) -> Axes:
    """An axis with its lower left corner at (x, y) and size w × h, all in inches from the figure's lower left."""
    W, H = fig.get_size_inches()
    return fig.add_axes((x / W, y / H, w / W, h / H))


def _outer_ticks(ax: Axes, x: bool, y: bool, nbins: int = 4) -> None:
    """At most nbins + 1 ticks on the x (y) axis of an outer panel of a grid of panels, none on an inner one."""
    from matplotlib.ticker import MaxNLocator, NullLocator

    for show, axis in ((x, ax.xaxis), (y, ax.yaxis)):
        axis.set_major_locator(MaxNLocator(nbins=nbins, steps=[1, 2, 2.5, 5, 10]) if show else NullLocator())


def _log_minor(ax: Axes) -> None:
    """A log y axis: labels in plain text (:func:`_log_labels`).

    Over more than 1.5 decades (minor ticks unlabelled),
    minor ticks and grid lines at 2 and 5 × 10^k only; data within 1% of a constant get a decade around them.
    """
    from matplotlib.ticker import LogLocator

    _log_labels(ax)
    dlo, dhi = ax.dataLim.intervaly
    if 0 < dlo <= dhi < 1.01 * dlo:  # flat data (a risk constant to round-off): matplotlib spans an ulp or so
        ax.set_ylim(dlo / 2, dhi * 2)
    lo, hi = ax.get_ylim()
    if lo > 0 and hi / lo > 10**1.5:
        ax.yaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))


def _aspect(points: Array) -> float:
    """Height over width of the bounding box of 2-D points, within [0.5, 2] (panels of that shape)."""
    ext = np.ptp(points, axis=0)
    return float(np.clip(ext[1] / ext[0], 0.5, 2.0)) if ext[0] > 0 and ext[1] > 0 else 1.0


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def _log_labels(ax: Axes) -> None:
    """Tick labels of a log y axis as 10⁻³, 2×10⁻³ in plain text (matplotlib's default builds them in mathtext)."""
    from matplotlib.ticker import LogFormatter

    class Pow10(LogFormatter):
        def _num_to_string(self, x: float, vmin: float, vmax: float) -> str:
            e = math.floor(math.log10(x) + 1e-9)
            m = x / 10.0**e
            power = "10" + str(e).translate(_SUPERSCRIPT)
            return power if abs(m - 1.0) < 1e-9 else f"{m:g}×{power}"

    ax.yaxis.set_major_formatter(Pow10())
    ax.yaxis.set_minor_formatter(Pow10(labelOnlyBase=False))


def _overlap(boxes: list[Any]) -> bool:
    """Whether any two of the display boxes (matplotlib Bbox) overlap."""
    return any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def spread_tick_labels(ax: Axes) -> float:
    """Rotate the x tick labels of ``ax`` where they overlap flat; the angle in degrees (0: left flat).

    Drawn first (the figure's canvas) to measure the labels. Rotated labels anchored at their right end are parallel
    lines through the ticks, Δx sin θ apart for ticks Δx apart: θ is the least of 30°, 45°, 60°, 90° at which that
    exceeds 1.2 times a label's height. Long category names ("free_energy", "neg_entropy") ran into each other in
    the MPI demo's figure.
    """
    fig = ax.get_figure()
    assert fig is not None
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    labels = [t for t in ax.get_xticklabels() if t.get_text()]
    boxes = [t.get_window_extent(renderer) for t in labels]
    if len(labels) < 2 or not _overlap(boxes):
        return 0.0
    xs = np.sort([0.5 * (b.x0 + b.x1) for b in boxes])
    gap, height = float(np.diff(xs).min()), max(b.height for b in boxes)
    angle = next((a for a in (30.0, 45.0, 60.0) if gap * math.sin(math.radians(a)) >= 1.2 * height), 90.0)
    for t in labels:
        t.set_rotation(angle)
        t.set_horizontalalignment("right")
        t.set_rotation_mode("anchor")
    return angle


def legend_below(ax: Axes, *twins: Axes, ncol: int = 2, fontsize: float = 8, drop: float = 0.18) -> Any:
    """One legend for ``ax`` and its twin axes (twinx), below the axis, outside its data area.

    Legends inside a panel of curves that span it (the digits demo's risk and accuracies: "lower left" and
    "lower right" lay over the curves) hide data wherever they go; below the x label they hide none. ``drop``: the
    legend's top, in axis heights below the axis (clear of the tick labels and the x label).
    """
    handles, labels = ax.get_legend_handles_labels()
    for tw in twins:
        h, lab = tw.get_legend_handles_labels()
        handles, labels = handles + h, labels + lab
    for tw in twins:
        if (old := tw.get_legend()) is not None:
            old.remove()
    return ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -drop), ncol=ncol, fontsize=fontsize,
                     frameon=False)
