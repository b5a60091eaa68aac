"""The figures of ``mfpde twin``.

The gaps against H, N, L with fitted and expected slopes; the risk of the PDE and of the twins along training;
ρ_s over the heads of the largest twin.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from mfpde.twin.config import Section

__all__ = ["gaps_figure", "twin_figures"]

_LABELS = {
    "heads": {"risk": "|R_H − R(ρ_S)|, one seed", "risk_bias": "|E R_H − R(ρ_S)|, seed mean",
              "rho_w1": "W1(heads, ρ_S)", "yhat": "mean |ŷ_H − ŷ(ρ_S)|"},
    "tokens": {"risk": "|R_N − R_∞|, paired", "risk_bias": "|E R_N − R_∞|, paired seed mean",
               "yhat": "mean |ŷ_N − ŷ_∞|, paired", "yhat_bias": "|E mean (ŷ_N − ŷ_∞)|, paired seed mean"},
    "layers": {"risk": "depth error of R, paired", "yhat": "depth error of ŷ, paired"},
}
_YLABELS = {"heads": "gap to the PDE (mean-field limit), log", "tokens": "gap to the token limit N → ∞, log",
            "layers": "depth error against the next L, log"}
_MARKERS = "osD^"


def _power_line(ax: Any, x: Any, y: Any, q: float, style: str, colour: str) -> None:
    """The power law C x^q through the points (x, y), C by least squares on log axes, across their sizes.

    A single size: the line spans a factor 1.4 either side of it.
    """
    c0 = np.exp(np.mean(np.log(y) - q * np.log(x)))
    xs = np.array([x.min(), x.max()]) if x.max() > x.min() else x[0] * np.array([1 / 1.4, 1.4])
    ax.plot(xs, c0 * xs**q, style, color=colour, lw=1.2)


def _gaps_panel(ax: Any, sweep: str, fits: dict[str, Any]) -> None:
    """One sweep's gaps on log axes, with their fits.

    Points with standard errors, the fit (solid, where the report has an exponent), theory's power law (dotted,
    wherever the report has an expected exponent: through the fitted points, else through all), 2× the PDE's error
    (dashed) where it is within the axis.
    """
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, NullLocator

    lo, hi, sizes, styles = np.inf, 0.0, set(), set()
    for k, (name, f) in enumerate(fits.items()):
        x, y, e = (np.asarray(f[key], float) for key in ("sizes", "gaps", "gap_se"))
        ok = y > 0
        if not ok.any():
            continue
        sizes |= set(x[ok].tolist())
        lo, hi = min(lo, y[ok].min()), max(hi, y[ok].max())
        xs = x[ok] * 1.06 ** (k - (len(fits) - 1) / 2)  # side by side, not on top of each other
        e = np.where(np.isfinite(e[ok]), e[ok], 0.0)
        lab = _LABELS[sweep].get(name, name)
        lab += f": fit {f['slope']:.2f} ± {f['se']:.2f}" if f["slope"] is not None else ": no fit"
        if f["expected"] is not None:
            lab += f", theory {f['expected']:g}"
        ax.errorbar(xs, y[ok], yerr=[np.minimum(e, 0.9 * y[ok]), e], fmt=_MARKERS[k % 4], color=f"C{k}", ms=4,
                    capsize=2, label=lab)
        fit = np.asarray(f["fitted"], bool)[ok]
        xf, yf = (x[ok][fit], y[ok][fit]) if fit.any() else (x[ok], y[ok])
        if f["slope"] is not None and fit.any():
            _power_line(ax, xf, yf, f["slope"], "-", f"C{k}")
            styles.add("-")
        if f["expected"] is not None:
            _power_line(ax, xf, yf, f["expected"], ":", f"C{k}")
            styles.add(":")
    for style, what in (("-", "fitted power law (solid)"), (":", "theory's power law (dotted)")):
        if style in styles:
            ax.add_line(Line2D([], [], color="0.3", ls=style, lw=1.2, label=what))
    if not sizes:
        ax.text(0.5, 0.5, "no gap above zero to draw", transform=ax.transAxes, ha="center")
        ax.set_ylabel(_YLABELS[sweep])
        return
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(lo / 3, hi * 3)
    drawn: set[float] = set()
    short = {"risk": "R", "risk_bias": "R", "rho_w1": "ρ (W1)", "yhat": "ŷ"}
    for k, (name, f) in enumerate(fits.items()):
        e2 = 2 * float(f["pde_error"])
        if np.isfinite(e2) and lo / 3 < e2 < hi * 3 and e2 not in drawn:
            drawn.add(e2)
            ax.axhline(e2, color=f"C{k}", lw=0.9, ls="--", alpha=0.7,
                       label=f"2× the PDE's own error of {short.get(name, name)} ({e2:.2g})")
    ax.xaxis.set_major_locator(FixedLocator(sorted(sizes)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([f"{int(v)}" for v in sorted(sizes)])
    ax.set_xlim(min(sizes) / 1.5, max(sizes) * 1.5)
    ax.set_ylabel(_YLABELS[sweep])
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)


def gaps_figure(exps: dict[str, Any]) -> Any:
    """``gaps.png``: one panel per sweep of the report's ``exponents`` (:func:`_gaps_panel`)."""
    from matplotlib.figure import Figure

    sweeps = list(exps)
    fig = Figure(figsize=(4.6 * max(len(sweeps), 1), 5.2), layout="constrained")
    for i, sweep in enumerate(sweeps):
        ax = fig.add_subplot(1, len(sweeps), i + 1)
        _gaps_panel(ax, sweep, exps[sweep])
        ax.set_xlabel({"heads": "heads H", "tokens": "tokens N", "layers": "layers L"}[sweep])
        ax.set_title({"heads": "against the PDE", "tokens": "against the token limit",
                      "layers": "against the next L"}[sweep], fontsize=9)
    fig.suptitle("gaps of the finite network: fitted power law solid, theory's dotted, 2× the PDE's own error "
                 "dashed", fontsize=9)
    return fig


def twin_figures(sec: Section, sizes: list[Any], hist: dict[tuple[int, int, int], Any], pde: Any,
                 exps: dict[str, Any]) -> dict[str, Any]:
    """The figures by file name, which the job saves (rank 0).

    ``gaps.png`` (:func:`gaps_figure`), ``risk.png`` and, where the PDE kept ρ_s, ``heads.png``.
    """
    from matplotlib.figure import Figure

    figures = {"gaps.png": gaps_figure(exps)}

    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.add_subplot()
    s_pde = pde.steps * sec.training.ds
    heads = [sz for sz in sizes if sz.sweep == "heads"]
    for k, sz in enumerate(heads):
        h = hist[sz.key]
        s = h.steps * sec.training.ds
        m, se = h.risk.mean(0), h.risk.std(0, ddof=1) / np.sqrt(h.risk.shape[0])
        ax.plot(s, m, color=f"C{k}", lw=1, label=f"twin H = {sz.H} (mean ± SE)")
        ax.fill_between(s, m - se, m + se, color=f"C{k}", alpha=0.25)
    ax.plot(s_pde, pde.risk, "k--", lw=1.5, label="PDE R(ρ_s)")
    ax.set_xlabel("training time s")
    ax.set_ylabel("risk")
    ax.legend(fontsize=7)
    figures["risk.png"] = fig

    if pde.rho and heads:
        big = hist[heads[-1].key].heads[-1, 0, 0]  # seed 0, block 0, last step
        fig = Figure(figsize=(6.4, 4.0), layout="constrained")
        ax = fig.add_subplot()
        pts, r = pde.rho_points, pde.rho[-1]
        if pts.shape[1] == 1:
            o = np.argsort(pts[:, 0])
            ax.hist(big[:, 0], bins="auto", density=True, alpha=0.5,
                    label=f"twin heads (H = {heads[-1].H}, seed 0)")
            ax.plot(pts[o, 0], r[o], "k-", label="PDE ρ_S")
            lo, hi = np.percentile(np.concatenate([big[:, 0], pts[o, 0][r[o] > 1e-3 * r.max()]]), [0, 100])
            ax.set_xlim(lo - 0.1 * (hi - lo), hi + 0.1 * (hi - lo))
            ax.set_xlabel("θ = v" if sec.heads.family == "value" else "θ")
            ax.set_ylabel("density")
            ax.legend(fontsize=7)
        else:
            from matplotlib.patches import Patch

            ax.tricontourf(pts[:, 0], pts[:, 1], r, levels=12, cmap="Greys")
            ax.plot(big[:, 0], big[:, 1], ".", ms=3, color="C1", label=f"twin heads (H = {heads[-1].H}, seed 0)")
            ax.add_artist(ax.legend(handles=[Patch(color="0.5", label="PDE ρ_S")], fontsize=7, loc="lower left"))
            ax.set_xlabel("a")
            ax.set_ylabel("v")
            ax.legend(fontsize=7)
        ax.set_title("ρ_S of the PDE and the heads of the largest twin at the last step", fontsize=9)
        figures["heads.png"] = fig
    return figures
