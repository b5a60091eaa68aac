"""PNG plots of a run (matplotlib, Agg backend): loss.png, rho.png, tokens.png (interface.md, issue 13).

Plots take arrays and never solve: the run driver hands in what it computed at an output step. Each
figure is built by a function returning the :class:`matplotlib.figure.Figure` (``loss_figure``,
``rho_figure``, ``tokens_figure``, for tests and notebooks) and written by :func:`plot_run` through a
temporary file and a rename, so a reader (or a run that fails later) never sees a half-written PNG.
Call on one rank. All quantities are non-dimensional.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["RhoSeries", "TokenSeries", "loss_figure", "plot_run", "rho_figure", "tokens_figure"]

Array = npt.NDArray[np.float64]
#: How many ρ_s (from ρ_0 to the last) rho.png shows per layer block, besides the Gibbs measure.
N_RHO_PANELS = 4


@dataclass
class RhoSeries:
    """ρ_s on Θ at the output steps so far, and the Gibbs measure of the last.

    Attributes:
        points: Θ node coordinates, shape (N_θ, p), p = 1 or 2 (θ = v, or θ = (a, v)).
        s: training times of the snapshots, shape (m,).
        values: nodal densities ρ_s per snapshot and layer block, each shape (n_layers, N_θ).
        gibbs: nodal values of p_{ρ_s} ∝ exp(−Φ/λ) at the last snapshot, shape (n_layers, N_θ);
            None for λ = 0.
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
        labels: per sample, what it is (e.g. "class 7 (y = +1)").
        yhat: per sample, the prediction ŷ = ∫ g dμ_T.
    """

    points: Array
    mass: Array
    depths: list[float]
    weights: list[Array] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    yhat: list[float] = field(default_factory=list)


def _col(history: list[dict[str, float]], key: str) -> Array | None:
    return np.array([h[key] for h in history], dtype=float) if history and key in history[0] else None


def loss_figure(history: list[dict[str, float]], rate: dict[str, Any], lam: float = 0.0,
                certificate: bool = False) -> Figure:
    """Risk, F − F* and λ KL(ρ_s ‖ p_ρ_s) on a log scale, and (classification) risks and accuracies.

    The gap is F(ρ_s) − min_s F(ρ_s): F* ≤ min F, so it is a lower bound of F − F*; λ KL is an upper bound
    where the certificate of theory §5.4 holds (single-layer entropic model). The theoretical rate line
    is drawn only where ``rate["theory"]`` is not None, from λ KL(ρ_0 ‖ p_ρ_0) (or the first gap).

    Args:
        history: the history rows (``s``, ``risk``, ``free_energy``; optional ``kl_gibbs``,
            ``train_accuracy``, ``test_accuracy``, ``test_risk``).
        rate: the report's ``rate`` block (``fitted``, ``theory``, ``theory_kind``).
        lam: λ, the entropy weight.
        certificate: whether λ KL bounds F − F* (theory §5.4 applies).

    Returns:
        The figure: one axis, or two (plus a twin) with the classification columns.
    """
    import matplotlib.pyplot as plt

    s = _col(history, "s")
    assert s is not None
    acc = _col(history, "train_accuracy")
    fig, axes = plt.subplots(1, 2 if acc is not None else 1, figsize=(13 if acc is not None else 7, 4.6),
                             squeeze=False)
    ax = axes[0][0]
    risk, F, kl = _col(history, "risk"), _col(history, "free_energy"), _col(history, "kl_gibbs")
    assert risk is not None and F is not None
    ax.semilogy(s, np.maximum(risk, 1e-300), "o-", ms=3, label="risk R(ρ_s)")
    gap = F - F.min()
    ok = gap > 0
    if ok.any():
        ax.semilogy(s[ok], gap[ok], "s-", ms=3, label="F(ρ_s) − min_s F  (≤ F − F*)")
    anchor = gap[ok][0] if ok.any() else math.nan
    if kl is not None and lam > 0:
        cert = lam * kl
        what = "certificate λ·KL(ρ_s ‖ p_ρs)  (≥ F − F*, theory §5.4)" if certificate else "λ·KL(ρ_s ‖ p_ρs)"
        good = cert > 0
        ax.semilogy(s[good], cert[good], "^-", ms=3, label=what)
        if certificate and good.any():
            anchor = cert[good][0]
    s0 = s[ok][0] if ok.any() else s[0]
    c = rate.get("fitted")
    if c is not None and math.isfinite(c) and ok.any():
        ax.semilogy(s, gap[ok][0] * np.exp(-c * (s - s0)), "--", label=f"fitted rate: e^(−{c:.3g} s)")
    c = rate.get("theory")
    if c is not None and math.isfinite(c) and math.isfinite(anchor):
        kind = str(rate.get("theory_kind", "theory"))
        ax.semilogy(s, anchor * np.exp(-c * (s - s0)), ":", lw=2,
                    label=f"theory: e^(−{c:.3g} s)\n({kind[:60]})")
    ax.set_xlabel("training time s (non-dimensional)")
    ax.set_ylabel("risk, free-energy gap (non-dimensional, log)")
    ax.set_title(f"training to s = {s[-1]:.3g} (step {int(history[-1]['step'])})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    if acc is not None:
        ax = axes[0][1]
        test_risk, test_acc = _col(history, "test_risk"), _col(history, "test_accuracy")
        ax.semilogy(s, np.maximum(risk, 1e-300), "o-", ms=3, color="C0", label="train risk")
        if test_risk is not None:
            ax.semilogy(s, np.maximum(test_risk, 1e-300), "o--", ms=3, color="C1", label="test risk")
        ax.set_xlabel("training time s (non-dimensional)")
        ax.set_ylabel("risk ½(ŷ − y)² (mean, log)")
        ax2 = ax.twinx()
        ax2.plot(s, acc, "s-", ms=3, color="C2", label="train accuracy")
        if test_acc is not None:
            ax2.plot(s, test_acc, "s--", ms=3, color="C3", label="test accuracy")
        ax2.axhline(0.5, color="grey", lw=0.8, ls=":")
        ax2.set_ylim(0.0, 1.02)
        ax2.set_ylabel("accuracy (fraction, chance 0.5)")
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=4)
        ax.set_title("held-out and training risk, accuracy")
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def _refined(points: Array, values: Array) -> tuple[Any, Array]:
    """A finer triangulation of the Θ nodes and the field on it (cubic C¹ interpolant, clipped at 0)."""
    import matplotlib.tri as mtri

    tri = mtri.Triangulation(points[:, 0], points[:, 1])
    subdiv = int(np.clip(math.ceil(math.log2(max(128.0 / math.sqrt(len(points)), 1.0))), 0, 3))
    if subdiv == 0:
        return tri, values
    fine, v = mtri.UniformTriRefiner(tri).refine_field(values, subdiv=subdiv)
    return fine, np.maximum(np.asarray(v, dtype=float), 0.0)


def _theta_panel(fig: Figure, ax: Axes, points: Array, values: Array, title: str, label: str) -> None:
    """One ρ (or p_ρ) on a 2-D Θ: filled contours on the refined triangulation, with a labelled colour bar."""
    tri, v = _refined(points, values)
    top = float(v.max()) if v.size and v.max() > 0 else 1.0
    tc = ax.tricontourf(tri, v, levels=np.linspace(0.0, top, 41), cmap="viridis", extend="max")
    cb = fig.colorbar(tc, ax=ax, ticks=np.linspace(0.0, top, 5), format="%.3g")
    cb.set_label(label)
    ax.set_xlabel("a")
    ax.set_ylabel("v")
    ax.set_aspect("equal")
    ax.set_title(title, fontsize=9)


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
    ax.set_title(f"ρ_s from ρ_0 to the last{blk}", fontsize=9)
    ax.legend(fontsize=7)


def rho_figure(series: RhoSeries) -> Figure:
    """ρ_s on Θ at up to :data:`N_RHO_PANELS` training times from ρ_0 to the last, and p_ρ beside the last.

    One row per layer block. For p = 2 one panel per ρ_s, drawn on a refined triangulation of the Θ
    nodes, and p_ρ in the last column; for p = 1 all curves on one axis.

    Returns:
        The figure (p = 2: one axis per panel, plus a colour bar each; p = 1: one axis per layer block).
    """
    import matplotlib.pyplot as plt

    m = len(series.values)
    pick = sorted(set(np.linspace(0, m - 1, min(m, N_RHO_PANELS)).round().astype(int).tolist()))
    n_layers = series.values[-1].shape[0]
    ncol = len(pick) + (series.gibbs is not None) if series.points.shape[1] == 2 else 1
    fig, axes = plt.subplots(n_layers, ncol, figsize=(4.2 * ncol + 2.0 * (ncol == 1), 3.6 * n_layers),
                             squeeze=False, layout="constrained")
    for k in range(n_layers):
        blk = f" (layer block {k})" if n_layers > 1 else ""
        if ncol == 1:
            _theta_curves(axes[k][0], series, pick, k, blk)
            continue
        for j, i in enumerate(pick):
            _theta_panel(fig, axes[k][j], series.points, series.values[i][k],
                         f"ρ_s at s = {series.s[i]:.3g}{blk}", "density of ρ on Θ = (a, v)")
        if series.gibbs is not None:
            _theta_panel(fig, axes[k][-1], series.points, series.gibbs[k],
                         f"Gibbs p_ρ ∝ exp(−Φ/λ) at s = {series.s[-1]:.3g}{blk}", "density of p_ρ on Θ")
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

    Rows are samples (titled with class, target and ŷ), columns depths t.

    Returns:
        The figure: (samples × depths) axes, plus one colour bar per row for d = 2.
    """
    import matplotlib.pyplot as plt

    n, k, d = len(series.weights), len(series.depths), series.points.shape[1]
    fig, axes = plt.subplots(max(n, 1), k, figsize=(3.0 * k + 1.4, 3.0 * max(n, 1)), squeeze=False,
                             layout="constrained")
    for i in range(n):
        dens = [_nodal_density(series.points, series.mass, series.weights[i][j]) for j in range(k)]
        top = max(float(v.max()) for _, v in dens) or 1.0
        im = None
        for j, (uniq, v) in enumerate(dens):
            ax = axes[i][j]
            if d == 1:
                ax.plot(uniq[:, 0], v)
                ax.set_ylim(0.0, 1.05 * top)
                ax.set_xlabel("x")
                ax.set_ylabel("token density μ_t")
            else:
                g = _grid(uniq)
                if g is not None:
                    xs, ys = g
                    Z = v.reshape(len(xs), len(ys)).T
                    dx, dy = xs[1] - xs[0], ys[1] - ys[0]
                    im = ax.imshow(Z, origin="lower", vmin=0.0, vmax=top, cmap="magma",
                                   extent=(xs[0] - dx / 2, xs[-1] + dx / 2, ys[0] - dy / 2, ys[-1] + dy / 2))
                else:
                    im = ax.tripcolor(uniq[:, 0], uniq[:, 1], v, shading="gouraud", vmin=0.0, vmax=top,
                                      cmap="magma")
                ax.set_aspect("equal")
                if i == n - 1:
                    ax.set_xlabel("x₁")
                if j == 0:
                    ax.set_ylabel("x₂")
            head = f"{series.labels[i]}, ŷ = {series.yhat[i]:+.3f}\n" if j == 0 else ""
            ax.set_title(f"{head}t = {series.depths[j]:.3g}", fontsize=9)
        if im is not None:
            cb = fig.colorbar(im, ax=list(axes[i]), shrink=0.9)
            cb.set_label("token density μ_t (mass / area)")
    return fig


def _save(fig: Figure, path: Path) -> None:
    """Write the figure to path via a temporary file, fsync and a rename (atomic), then close it."""
    import matplotlib.pyplot as plt

    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            fig.savefig(f, format="png", dpi=100)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        plt.close(fig)


def plot_run(out: Path, history: list[dict[str, float]], rate: dict[str, Any], rho: RhoSeries,
             tokens: TokenSeries | None, lam: float = 0.0, certificate: bool = False) -> None:
    """Write ``loss.png``, ``rho.png`` and ``tokens.png`` into ``out/plots``, each atomically (call on one rank).

    Arrays in, figures out: nothing is solved here.

    Args:
        out: the output directory.
        history: the history rows so far (see :func:`loss_figure`).
        rate: the ``rate`` block of the report (see :func:`loss_figure`).
        rho: ρ_s snapshots and the Gibbs measure of the last.
        tokens: μ_t of a few samples (None: no ``tokens.png``).
        lam: λ, the entropy weight.
        certificate: whether λ KL(ρ ‖ p_ρ) bounds F − F* (theory §5.4).
    """
    import matplotlib

    matplotlib.use("Agg")
    d = out / "plots"
    d.mkdir(parents=True, exist_ok=True)
    _save(loss_figure(history, rate, lam, certificate), d / "loss.png")
    _save(rho_figure(rho), d / "rho.png")
    if tokens is not None and tokens.weights:
        _save(tokens_figure(tokens), d / "tokens.png")
