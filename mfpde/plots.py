"""PNG plots of a run (matplotlib, Agg backend): loss.png, rho.png, tokens.png (interface.md)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import dolfinx.fem
import numpy as np

if TYPE_CHECKING:
    from mfpde.coupling import CoupledProblem


def plot_run(pb: CoupledProblem, out: Path, history: list[dict], report: dict, heads: list) -> None:
    """Write the plots of ``run`` into ``out/plots``. Collective (data is gathered), rank 0 draws."""
    from mfpde.data import fill_density

    rho_vals = [pb.theta.gather_values(r) for r in pb.rhos]
    samples = (pb.train + pb.test)[:3]
    tok = []
    for s in samples:  # μ_0 and μ_T of a few samples, gathered at the quadrature nodes
        u = dolfinx.fem.Function(pb.tt.W)
        fill_density(s, u, pb.tt.mass)
        w0 = pb.tt.quad.gather(u)
        pb.tt.solve(u, heads, pb.cfg.depth.T, pb.cfg.depth.steps, pb.g, shallow=pb.shallow)
        tok.append((w0, pb.tt.quad.gather(u)))
    if pb.comm.rank != 0:
        return
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
    rate = report.get("rate", {})
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
    pts = pb.theta.points
    fig, axes = plt.subplots(1, len(rho_vals), figsize=(5 * len(rho_vals), 4), squeeze=False)
    for k, (ax, v) in enumerate(zip(axes[0], rho_vals, strict=True)):
        if pts.shape[1] == 1:
            ax.plot(pts[:, 0], v)
            ax.set_xlabel("v")
        else:
            tc = ax.tricontourf(pts[:, 0], pts[:, 1], v, levels=30)
            fig.colorbar(tc, ax=ax)
            ax.set_xlabel("a")
            ax.set_ylabel("v")
        ax.set_title(f"ρ (layer {k}) at s = {s[-1]:.3g}" if len(rho_vals) > 1 else f"ρ at s = {s[-1]:.3g}")
    fig.tight_layout()
    fig.savefig(d / "rho.png", dpi=100)
    plt.close(fig)
    y = pb.tt.quad.points
    fig, axes = plt.subplots(len(tok), 2, figsize=(8, 3.5 * len(tok)), squeeze=False)
    for i, (w0, wT) in enumerate(tok):
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
