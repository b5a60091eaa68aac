"""The figures of ``mfpde twin``.

The gaps against H, N, L with fitted and expected slopes; the risk of the PDE and of the twins along training;
ρ_s over the heads of the largest twin.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["twin_plots"]

_LABELS = {"risk": "|R − R(ρ)| one seed", "risk_bias": "|E R − R(ρ)| seed mean", "rho_w1": "W1(heads, ρ)",
           "yhat": "mean |ŷ − ŷ(ρ)|"}


def _save(fig: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    tmp.replace(path)


def twin_plots(out: Path, cfg: Any, sizes: list[Any], hist: dict[tuple[int, int, int], Any], pde: Any,
               exps: dict[str, Any]) -> None:
    """Write ``gaps.png``, ``risk.png`` and ``heads.png`` into ``out`` (rank 0)."""
    from matplotlib.figure import Figure

    sweeps = list(exps)
    fig = Figure(figsize=(4.2 * max(len(sweeps), 1), 3.6), layout="constrained")
    for i, sweep in enumerate(sweeps):
        ax = fig.add_subplot(1, len(sweeps), i + 1)
        for k, (name, f) in enumerate(exps[sweep].items()):
            x, y, e = np.asarray(f["sizes"], float), np.asarray(f["gaps"], float), np.asarray(f["gap_se"], float)
            ok = y > 0
            c = f"C{k}"
            ax.errorbar(x[ok], y[ok], yerr=np.where(np.isfinite(e[ok]), e[ok], 0), fmt="o", color=c, ms=4,
                        label=_LABELS.get(name, name) + (f": {f['slope']:.2f}±{f['se']:.2f}" if f["slope"] is not None
                                                         else ": no fit"))
            fit = np.asarray(f["fitted"], bool) & ok
            if f["slope"] is not None and fit.any():
                xs = x[fit]
                y0 = np.exp(np.mean(np.log(y[fit]) - f["slope"] * np.log(xs)))
                ax.plot(xs, y0 * xs ** f["slope"], "-", color=c, lw=1)
                if f["expected"] is not None:
                    ye = np.exp(np.mean(np.log(y[fit]) - f["expected"] * np.log(xs)))
                    ax.plot(xs, ye * xs ** f["expected"], ":", color=c, lw=1.5)
            if np.isfinite(f["pde_error"]) and f["pde_error"] > 0:
                ax.axhline(2 * f["pde_error"], color=c, lw=0.8, ls="--", alpha=0.5)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel({"heads": "heads H", "tokens": "tokens N", "layers": "layers L"}[sweep])
        ax.set_title(f"gaps against {sweep} (solid: fit, dotted: theory,\ndashed: 2× the PDE's own error)",
                     fontsize=8)
        ax.legend(fontsize=7)
    _save(fig, out / "gaps.png")

    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.add_subplot()
    s_pde = pde.steps * cfg.training.ds
    heads = [sz for sz in sizes if sz.sweep == "heads"]
    for k, sz in enumerate(heads):
        h = hist[sz.key]
        s = h.steps * cfg.training.ds
        m, se = h.risk.mean(0), h.risk.std(0, ddof=1) / np.sqrt(h.risk.shape[0])
        ax.plot(s, m, color=f"C{k}", lw=1, label=f"twin H = {sz.H} (mean ± SE)")
        ax.fill_between(s, m - se, m + se, color=f"C{k}", alpha=0.25)
    ax.plot(s_pde, pde.risk, "k--", lw=1.5, label="PDE R(ρ_s)")
    ax.set_xlabel("training time s")
    ax.set_ylabel("risk")
    ax.legend(fontsize=7)
    _save(fig, out / "risk.png")

    if pde.rho and heads:
        big = hist[heads[-1].key].heads[-1, 0, 0]  # seed 0, block 0, last step
        fig = Figure(figsize=(6.4, 4.0), layout="constrained")
        ax = fig.add_subplot()
        pts, r = pde.rho_points, pde.rho[-1]
        if pts.shape[1] == 1:
            o = np.argsort(pts[:, 0])
            ax.hist(big[:, 0], bins=max(10, min(60, len(big) // 8)), density=True, alpha=0.5,
                    label=f"twin heads (H = {heads[-1].H}, seed 0)")
            ax.plot(pts[o, 0], r[o], "k-", label="PDE ρ_S")
            lo, hi = np.percentile(np.concatenate([big[:, 0], pts[o, 0][r[o] > 1e-3 * r.max()]]), [0, 100])
            ax.set_xlim(lo - 0.1 * (hi - lo), hi + 0.1 * (hi - lo))
            ax.set_xlabel("θ = v" if cfg.heads.family == "value" else "θ")
            ax.set_ylabel("density")
            ax.legend(fontsize=7)
        else:
            ax.tricontourf(pts[:, 0], pts[:, 1], r, levels=12, cmap="Greys")
            ax.plot(big[:, 0], big[:, 1], ".", ms=3, color="C1", label=f"twin heads (H = {heads[-1].H}, seed 0)")
            ax.set_xlabel("a")
            ax.set_ylabel("v")
            ax.legend(fontsize=7)
        ax.set_title("ρ_S of the PDE and the heads of the largest twin at the last step", fontsize=9)
        _save(fig, out / "heads.png")
