"""PNG plots of a run (matplotlib, Agg backend): loss.png, rho.png, tokens.png (interface.md).

Plots take arrays and never solve: the run driver hands in what it computed once.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["plot_run"]

Array = npt.NDArray[np.float64]


def plot_run(out: Path, history: list[dict[str, float]], rate: dict[str, Any], theta_points: Array,
             rho_values: list[Array], token_points: Array, snapshots: list[tuple[Array, Array]]) -> None:
    """Write ``loss.png``, ``rho.png`` and ``tokens.png`` into ``out/plots`` (call on one rank).

    Arrays in, figures out: nothing is solved here.

    Args:
        out: the output directory.
        history: the history rows (``s``, ``risk``, ``free_energy``).
        rate: the report's ``rate`` block (``fitted``, ``theory``).
        theta_points: Θ dof coordinates, shape (N_θ, p).
        rho_values: ρ per layer block at them, each shape (N_θ,).
        token_points: the token quadrature nodes, shape (N_y, d).
        snapshots: (μ_0, μ_T) of a few samples as quadrature weights (mass per node), each shape (N_y,).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = out / "plots"
    d.mkdir(parents=True, exist_ok=True)
    s = np.array([h["s"] for h in history])
    risk = np.array([h["risk"] for h in history])
    F = np.array([h["free_energy"] for h in history])
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.semilogy(s, np.maximum(risk, 1e-300), label="risk R(ρ_s)")
    gap = F - F.min()
    ok = gap > 0
    ax.semilogy(s[ok], gap[ok], label="F(ρ_s) − F*  (F* = min over the run)")
    for key, style in (("fitted", "--"), ("theory", ":")):
        c = rate.get(key)
        if ok.any() and c is not None and math.isfinite(c):
            note = " (lower bound)" if key == "theory" else ""
            ax.semilogy(s, gap[ok][0] * np.exp(-c * (s - s[ok][0])), style, label=f"{key} rate e^(-{c:.3g} s){note}")
    ax.set_xlabel("training time s")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(d / "loss.png", dpi=100)
    plt.close(fig)
    pts = theta_points
    fig, axes = plt.subplots(1, len(rho_values), figsize=(5 * len(rho_values), 4), squeeze=False)
    for k, (ax, v) in enumerate(zip(axes[0], rho_values, strict=True)):
        if pts.shape[1] == 1:
            ax.plot(pts[:, 0], v)
            ax.set_xlabel("v")
        else:
            tc = ax.tricontourf(pts[:, 0], pts[:, 1], v, levels=30)
            fig.colorbar(tc, ax=ax)
            ax.set_xlabel("a")
            ax.set_ylabel("v")
        ax.set_title(f"ρ (layer {k}) at s = {s[-1]:.3g}" if len(rho_values) > 1 else f"ρ at s = {s[-1]:.3g}")
    fig.tight_layout()
    fig.savefig(d / "rho.png", dpi=100)
    plt.close(fig)
    y = token_points
    fig, axes = plt.subplots(len(snapshots), 2, figsize=(8, 3.5 * len(snapshots)), squeeze=False)
    for i, (w0, wT) in enumerate(snapshots):
        for j, (w, name) in enumerate(((w0, "μ_0"), (wT, "μ_T"))):
            ax = axes[i][j]
            if y.shape[1] == 1:
                ax.plot(y[:, 0], w)
            else:
                tc = ax.tripcolor(y[:, 0], y[:, 1], w, shading="gouraud")
                fig.colorbar(tc, ax=ax)
                ax.set_aspect("equal")
            ax.set_title(f"sample {i}: {name} (mass per node)")
    fig.tight_layout()
    fig.savefig(d / "tokens.png", dpi=100)
    plt.close(fig)
