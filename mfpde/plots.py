"""PNG plots of a run (matplotlib, Agg backend): loss.png, rho.png, tokens.png (interface.md).

Plots take arrays and never solve: the run driver hands in what it computed at an output step. Each figure is
built by a function returning the :class:`matplotlib.figure.Figure` (``loss_figure``, ``rho_figure``,
``tokens_figure``, for tests and notebooks) and written by :func:`plot_run` through a temporary file and a
rename, so a reader (or a run that fails later) never sees a half-written PNG. Drawn at every output step while
the training waits (under MPI each figure on its own rank, :data:`FIGURES`), they are laid out by hand (inches;
no layout engine), ticks on the outer panels of a grid only: text layout and ticks cost most. Non-dimensional.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from mfpde.plot_layout import _aspect, _figure, _outer_ticks, _place
from mfpde.plot_loss import loss_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.cm import ScalarMappable
    from matplotlib.figure import Figure

__all__ = ["FIGURES", "RhoSeries", "TokenSeries", "circle_title", "loss_figure", "plot_run", "rho_figure",
           "save_figure", "space_depth_figure", "tokens_figure"]

Array = npt.NDArray[np.float64]
Box = tuple[float, float, float, float]
#: How many ρ_s (from ρ_0 to the last) rho.png shows per layer block, besides the Gibbs measure.
N_RHO_PANELS = 4
#: The figures of a run, in the order of the ranks that draw them under MPI (figure k on rank k mod size).
FIGURES = ("loss", "rho", "tokens")


@dataclass
class RhoSeries:
    """ρ_s on Θ at the output steps so far, and the Gibbs measure of the last.

    Attributes:
        points: Θ node coordinates, shape (N_θ, p), p = 1 or 2 (θ = v, or θ = (a, v)).
        s: training times of the snapshots, shape (m,).
        values: nodal densities ρ_s per snapshot and layer block, each shape (n_layers, N_θ).
        gibbs: nodal values of p_{ρ_s} ∝ exp(−Φ/λ) at the last snapshot, shape (n_layers, N_θ) (λ = 0: None).
    """

    points: Array
    s: list[float]
    values: list[Array]
    gibbs: Array | None = None


@dataclass
class TokenSeries:
    """μ_t of a few samples at a few depths, as quadrature weights with their lumped masses.

    Attributes:
        points: token quadrature nodes, shape (N_y, d), d = 1 or 2.
        mass: lumped mass m_i = ∫φ_i of each node, shape (N_y,): density = weight / mass.
        depths: depths t of the snapshots, length k (e.g. 0, T/2, T).
        weights: per sample, the weights m_i μ_t(x_i) at each depth, shape (k, N_y).
        labels, yhat: per sample, what it is (e.g. "class 7 (y = +1)") and its prediction ŷ = ∫ g dμ_T.
    """

    points: Array
    mass: Array
    depths: list[float]
    weights: list[Array] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    yhat: list[float] = field(default_factory=list)


def _refined(points: Array, values: Array, n: int = 128) -> tuple[Box, Array]:
    """The C¹ piecewise-cubic (Clough–Tocher) interpolant of nodal values on Θ, at the centres of n × n pixels.

    matplotlib's own (:class:`matplotlib.tri.CubicTriInterpolator`, the nodal gradients from the triangles'
    geometry) on the Delaunay triangulation of the nodes: no scipy.interpolate to import (0.4 s of CPU).

    Args:
        points: the Θ nodes, shape (N, 2).
        values: one field, shape (N,), or m fields, shape (N, m) (interpolated together).
        n: pixels along each side of the nodes' box.

    Returns:
        The box (x₀, x₁, y₀, y₁) and the field(s) clipped at 0, shape (n, n) or (n, n, m), rows along y
        (masked outside the nodes' hull).
    """
    from matplotlib.tri import CubicTriInterpolator, Triangulation

    lo, hi = points.min(axis=0), points.max(axis=0)
    xs, ys = (lo[i] + (hi[i] - lo[i]) * (np.arange(n) + 0.5) / n for i in (0, 1))
    X, Y = np.meshgrid(xs, ys)
    tri = Triangulation(points[:, 0], points[:, 1])
    fields = values.reshape(len(points), -1)
    v = np.ma.stack([CubicTriInterpolator(tri, f, kind="geom")(X, Y) for f in fields.T], axis=-1)
    v = v.reshape(*X.shape, *values.shape[1:])
    return (float(lo[0]), float(hi[0]), float(lo[1]), float(hi[1])), np.ma.maximum(np.ma.masked_invalid(v), 0.0)


def _theta_panel(fig: Figure, ax: Axes, cax: Axes, box: Box, v: Array, title: str, label: str) -> None:
    """One ρ (or p_ρ) on a 2-D Θ: its refined field (see :func:`_refined`) as an image, a colour bar in cax."""
    top = float(v.max()) if np.ma.count(v) and v.max() > 0 else 1.0
    im = ax.imshow(v, origin="lower", extent=box, vmin=0.0, vmax=top, cmap="viridis", interpolation="bilinear")
    cb = fig.colorbar(im, cax=cax, ticks=np.linspace(0.0, top, 5), format="%.3g")
    cb.set_label(label)
    ax.set_title(title, fontsize=9, y=1.0)


def _theta_curves(ax: Axes, series: RhoSeries, pick: list[int], k: int, blk: str) -> None:
    """ρ_s on a 1-D Θ at the picked snapshots (light to dark) and p_ρ at the last (dashed), on one axis."""
    order = np.argsort(series.points[:, 0])
    v = series.points[order, 0]
    for j, i in enumerate(pick):
        ax.plot(v, series.values[i][k][order], color=(0.1, 0.3, 0.9, 0.35 + 0.65 * (j + 1) / len(pick)),
                label=f"ρ_s, s = {series.s[i]:.3g}")
    if series.gibbs is not None:
        ax.plot(v, series.gibbs[k][order], "k--", label=f"Gibbs p_ρ ∝ exp(−Φ/λ), s = {series.s[-1]:.3g}")
    ax.set_xlabel("v")
    ax.set_ylabel("density on Θ (v)")
    ax.set_title(f"ρ_s from ρ_0 to the last{blk}", fontsize=9, y=1.0)
    ax.legend(fontsize=7)


def rho_figure(series: RhoSeries) -> Figure:
    """ρ_s on Θ at up to :data:`N_RHO_PANELS` training times from ρ_0 to the last, and p_ρ beside the last.

    One row per layer block. For p = 2 one panel per ρ_s, the cubic interpolant of the Θ nodal values
    drawn on a grid finer than the Θ cells, and p_ρ in the last column; for p = 1 all curves on one axis.

    Returns:
        The figure (p = 2: one axis per panel, plus a colour bar each; p = 1: one axis per layer block).
    """
    m = len(series.values)
    pick = sorted(set(np.linspace(0, m - 1, min(m, N_RHO_PANELS)).round().astype(int).tolist()))
    n_layers = series.values[-1].shape[0]
    if series.points.shape[1] == 1:
        fig = _figure(6.4, 3.6 * n_layers)
        for k in range(n_layers):
            ax = _place(fig, 0.85, 3.6 * (n_layers - 1 - k) + 0.55, 5.3, 2.7)
            _theta_curves(ax, series, pick, k, f" (layer block {k})" if n_layers > 1 else "")
        return fig
    ncol = len(pick) + (series.gibbs is not None)
    # inches: a panel pw × ph, then its colour bar (gap 0.1, width 0.13, 0.95 for tick labels and label);
    # 0.6 left (v tick labels and label), 0.55 below (a), 0.4 above a title (0.55 for two lines)
    pw, ph = 2.6, 2.6 * _aspect(series.points)
    top = 0.55 if n_layers > 1 else 0.4
    pitch = pw + 0.1 + 0.13 + 0.95 + 0.2
    fig = _figure(0.6 + ncol * pitch - 0.2, 0.55 + n_layers * (ph + top))
    for k in range(n_layers):
        blk = f"\n(layer block {k})" if n_layers > 1 else ""
        fields = [series.values[i][k] for i in pick] + ([series.gibbs[k]] if series.gibbs is not None else [])
        box, fine = _refined(series.points, np.stack(fields, axis=1))
        y = 0.55 + (n_layers - 1 - k) * (ph + top)
        for j in range(ncol):
            x = 0.6 + j * pitch
            ax = _place(fig, x, y, pw, ph)
            cax = _place(fig, x + pw + 0.1, y, 0.13, ph)
            _outer_ticks(ax, k == n_layers - 1, j == 0)  # all panels show the same box
            if j == 0:
                ax.set_ylabel("v")
            if k == n_layers - 1:
                ax.set_xlabel("a")
            title, label = ((f"ρ_s at s = {series.s[pick[j]]:.3g}{blk}", "density of ρ on Θ = (a, v)") if j < len(pick)
                            else (f"Gibbs p_ρ ∝ exp(−Φ/λ) at s = {series.s[-1]:.3g}{blk}", "density of p_ρ on Θ"))
            _theta_panel(fig, ax, cax, box, fine[:, :, j], title, label)
    return fig


def _nodal_density(points: Array, mass: Array, w: Array) -> tuple[Array, Array]:
    """Merge nodes at the same place (DG1 duplicates): density Σw/Σm per distinct node; shapes (M, d), (M,)."""
    key = np.round(points, 10)
    uniq, inv = np.unique(key, axis=0, return_inverse=True)
    inv = inv.ravel()
    num, den = np.zeros(len(uniq)), np.zeros(len(uniq))
    np.add.at(num, inv, w)
    np.add.at(den, inv, mass)
    return uniq, num / np.where(den > 0, den, 1.0)


def _grid(uniq: Array) -> tuple[Array, Array] | None:
    """The axes of a tensor grid of 2-D nodes (from np.unique, sorted by x then y), or None."""
    xs, ys = np.unique(uniq[:, 0]), np.unique(uniq[:, 1])
    return (xs, ys) if len(xs) * len(ys) == len(uniq) and len(xs) > 1 and len(ys) > 1 else None


def tokens_figure(series: TokenSeries) -> Figure:
    """Token densities μ_t (weight / lumped mass) of a few samples at a few depths, one colour scale per row.

    Rows are samples (titled with class, target and ŷ), columns depths t; ticks on the outer panels only.

    Returns:
        The figure: (samples × depths) axes, plus one colour bar per row for d = 2.
    """
    from matplotlib.ticker import MaxNLocator

    n, k, d = len(series.weights), len(series.depths), series.points.shape[1]
    rows = max(n, 1)
    # inches: panels pw × ph, 0.3 apart across, 0.5 down (two-line titles); 0.65 left, 0.5 below and above;
    # d = 2: right of each row its colour bar (gap 0.15, width 0.14, 0.95 for its tick labels and label)
    pw, left = (2.4, 0.65) if d == 2 else (2.9, 0.85)
    ph = pw * _aspect(series.points) if d == 2 else 2.2
    wgap, hgap, right = 0.3, 0.5, (0.15 + 0.14 + 0.95 if d == 2 else 0.2)
    fig = _figure(left + k * pw + (k - 1) * wgap + right, 0.5 + rows * ph + (rows - 1) * hgap + 0.5)
    for i in range(rows):
        dens = [_nodal_density(series.points, series.mass, series.weights[i][j]) for j in range(k)] if n else []
        top = max((float(v.max()) for _, v in dens), default=0.0) or 1.0
        y = 0.5 + (rows - 1 - i) * (ph + hgap)
        im: ScalarMappable | None = None
        for j in range(k):
            # all panels show the same box (d = 2) or x range and, along a row, density range (d = 1)
            ax = _place(fig, left + j * (pw + wgap), y, pw, ph)
            _outer_ticks(ax, i == rows - 1, j == 0, nbins=2 if d == 2 else 4)
            if i == rows - 1:
                ax.set_xlabel("x₁" if d == 2 else "x")
            if j == 0:
                ax.set_ylabel("x₂" if d == 2 else "token density μ_t")
            if not dens:
                continue
            uniq, v = dens[j]
            if d == 1:
                ax.plot(uniq[:, 0], v)
                ax.set_ylim(0.0, 1.05 * top)
            else:
                if (g := _grid(uniq)) is not None:
                    xs, ys = g
                    Z = v.reshape(len(xs), len(ys)).T
                    dx, dy = xs[1] - xs[0], ys[1] - ys[0]
                    im = ax.imshow(Z, origin="lower", vmin=0.0, vmax=top, cmap="magma",
                                   extent=(xs[0] - dx / 2, xs[-1] + dx / 2, ys[0] - dy / 2, ys[-1] + dy / 2))
                else:
                    im = ax.tripcolor(uniq[:, 0], uniq[:, 1], v, shading="gouraud", vmin=0.0, vmax=top,
                                      cmap="magma")
                    ax.set_aspect("equal")
            head = f"{series.labels[i]}, ŷ = {series.yhat[i]:+.3f}\n" if j == 0 else ""
            ax.set_title(f"{head}t = {series.depths[j]:.3g}", fontsize=9, y=1.0)
        if im is not None:
            cax = _place(fig, left + k * pw + (k - 1) * wgap + 0.15, y, 0.14, ph)
            cb = fig.colorbar(im, cax=cax, ticks=MaxNLocator(nbins=5))
            cb.set_label("token density μ_t (mass / area)")
    return fig


def save_figure(fig: Figure, path: Path, **savefig: Any) -> None:
    """Write the figure to the PNG ``path`` via a temporary file, fsync and a rename (atomic; its directory made).

    ``savefig``: matplotlib's options over the default dpi 100 (zlib level 1: level 6 costs 30 ms more). The
    figures are made outside pyplot (:func:`mfpde.plot_layout._figure`, or ``matplotlib.figure.Figure``): nothing
    to close, and pyplot (its style library read at import) is not imported.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        fig.savefig(f, format="png", **{"dpi": 100, "pil_kwargs": {"compress_level": 1}, **savefig})
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def plot_run(out: Path, history: list[dict[str, float]], rate: dict[str, Any], rho: RhoSeries | None,
             tokens: TokenSeries | None, lam: float = 0.0, certificate: bool = False,
             figures: tuple[str, ...] = FIGURES) -> None:
    """Write ``loss.png``, ``rho.png`` and ``tokens.png`` (those in ``figures``) into ``out/plots``, atomically.

    Args:
        out: the output directory.
        history: the history rows so far (see :func:`loss_figure`).
        rate: the ``rate`` block of the report (see :func:`loss_figure`).
        rho: ρ_s snapshots and the Gibbs measure of the last (None: no ``rho.png``).
        tokens: μ_t of a few samples (None: no ``tokens.png``).
        lam: λ, the entropy weight.
        certificate: whether λ KL(ρ ‖ p_ρ) bounds F − F* (theory §5.4).
        figures: which of :data:`FIGURES` to write (each by one process only).
    """
    import matplotlib

    matplotlib.use("Agg")
    d = out / "plots"
    d.mkdir(parents=True, exist_ok=True)
    draw = {"loss": lambda: loss_figure(history, rate, lam, certificate),
            "rho": lambda: rho_figure(rho) if rho is not None else None,
            "tokens": lambda: tokens_figure(tokens) if tokens is not None and tokens.weights else None}
    for name in figures:
        if (fig := draw[name]()) is not None:
            save_figure(fig, d / f"{name}.png")


def circle_title(beta: Any, coupling: Any, noise: float) -> str:
    """The title of the circle's picture: its heads (β_k, K_k) and noise τ.

    "tokens on the circle: β = 5, K = 1, no noise (τ = 0)"; two or three heads listed, more by their range and total K.
    """
    b, k = np.atleast_1d(np.asarray(beta, float)), np.atleast_1d(np.asarray(coupling, float))
    if len(b) == 1:
        heads = f"β = {b[0]:.4g}, K = {k[0]:.4g}"
    elif len(b) <= 3:
        heads = "heads (β, K) = " + ", ".join(f"({x:.3g}, {y:.3g})" for x, y in zip(b, k, strict=True))
    else:
        heads = f"{len(b)} heads, β from {b.min():.3g} to {b.max():.3g}, total K = {k.sum():.4g}"
    return f"tokens on the circle: {heads}, " + (f"noise τ = {noise:.4g}" if noise > 0 else "no noise (τ = 0)")


_PI_HALVES = {-2: "−π", -1: "−π/2", 0: "0", 1: "π/2", 2: "π", 3: "3π/2", 4: "2π"}
#: Where the angle axis of :func:`space_depth_figure` may start, in order of preference (fractions of 2π).
_CUTS = (0.0, 0.5, 0.25, 0.75, 0.125, 0.375, 0.625, 0.875)


def _cut(dens: Any) -> int:
    """The cell the angle axis starts at: the first of :data:`_CUTS` whose edge cells hold no cluster.

    The score of a cut is the greatest density over the depths in the two cells beside it; the first cut within 1.5
    times the least score is taken (θ ∈ [0, 2π) where nothing sits at 0: a cluster at θ ≈ 0 ≡ 2π was split across
    the top and bottom edges and read as two).
    """
    n = dens.shape[1]
    cuts = [int(round(f * n)) % n for f in _CUTS if abs(f * n - round(f * n)) < 1e-9]
    score = [float(np.maximum(dens[:, i - 1], dens[:, i]).max()) for i in cuts]
    best = min(score)
    return next(i for i, s in zip(cuts, score, strict=True) if s <= 1.5 * best)


def space_depth_figure(ts: Any, dens: Any, h: float, log_depth: bool = False,
                       marks: dict[str, list[float]] | None = None, title: str = "tokens on the circle") -> Figure:
    """θ against t, colour = cell-mean density on a log scale; the depth axis ends at the last output T.

    Args:
        ts: output depths (T,), the first 0.
        dens: densities (T, n) on n equal cells, the first from θ = 0.
        h: the cells' width (radians).
        log_depth: a log depth axis (the first output, t = 0, drawn from a decade below the next).
        marks: depths to mark with vertical lines, by legend label (e.g. the merges, the stiff switch).
        title: the figure's title (:func:`circle_title`).

    Each output's column spans the midpoints to its neighbours (geometric ones on a log axis), the first from its
    depth and the last to T: the axis ends at T (each column drawn from its depth to the next ran one output past T).
    The angle axis starts where no cluster sits (:func:`_cut`): [0, 2π), else [−π, π), or another eighth of the
    turn.
    """
    import matplotlib.colors

    ts = np.asarray(ts, dtype=float)
    dens = np.asarray(dens, dtype=float)
    fig = _figure(7, 4)
    ax = fig.add_subplot()
    i = _cut(dens)
    start = i * h if i * h < np.pi - 1e-9 else i * h - 2 * np.pi
    dens = np.roll(dens, -i, axis=1)
    theta = start + np.arange(dens.shape[1] + 1) * h
    log = log_depth and len(ts) > 2
    at = np.concatenate([[ts[1] / 10.0], ts[1:]]) if log else ts  # the first output, t = 0, a decade below the next
    if len(at) > 1:
        mid = np.sqrt(at[1:] * at[:-1]) if log else 0.5 * (at[1:] + at[:-1])
        tt = np.concatenate([[at[0]], mid, [at[-1]]])
    else:
        tt = np.array([at[0], at[0] + 1.0])
    pos = dens[dens > 0]
    lo = max(float(pos.min()) if pos.size else 1e-12, 1e-8 * float(dens.max()))
    im = ax.pcolormesh(tt, theta, np.maximum(dens.T, lo), norm=matplotlib.colors.LogNorm(lo, float(dens.max())),
                       cmap="magma", shading="flat")
    fig.colorbar(im, ax=ax, label="density μ_t(θ)")
    if log:
        ax.set_xscale("log")
    ax.set_xlim(tt[0], tt[-1])
    ax.set_ylim(theta[0], theta[-1])
    quarter = np.arange(np.ceil(theta[0] / (np.pi / 2) - 1e-9), np.floor(theta[-1] / (np.pi / 2) + 1e-9) + 1)
    ax.set_yticks(quarter * np.pi / 2, [_PI_HALVES.get(int(q), f"{q / 2:g}π") for q in quarter])
    styles = iter([("white", "--"), ("cyan", ":"), ("lime", "-.")])
    for label, depths in (marks or {}).items():
        if depths:
            colour, ls = next(styles)
            for j, d in enumerate(depths):
                ax.axvline(d, color=colour, ls=ls, lw=0.8, label=label if j == 0 else None)
    if any(marks.values() if marks else []):
        ax.legend(loc="upper right", fontsize=8, framealpha=0.6)
    ax.set_xlabel("depth t")
    ax.set_ylabel("angle θ (radians)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
