"""``plots/bifurcation.png`` of ``mfpde continuation``: each branch's amplitude against K, and why a branch ended.

Imports nothing of mfpde and no solver, as the other plots.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["bifurcation_figure", "stop_label"]

#: The short names of the reasons a branch ends before its range does (:func:`mfpde.continuation.continue_branch`).
STOPS = (("CPU budget", "CPU budget exhausted"), ("Newton failed", "Newton failed"),
         ("not resolved", "not resolved by the collocation"), ("max_points", "continuation.max_points reached"))


def stop_label(branch: dict[str, Any]) -> str | None:
    """Why ``branch`` (a report's branch) ended before its range, in a few words; None where it ran to the range's end.

    A branch ends early on a CPU budget, a failed Newton step, a state the collocation does not resolve
    (``early``), or at ``continuation.max_points``; it ends naturally at the end of the range or leaving it.
    """
    stopped = str(branch.get("stopped", ""))
    for key, short in STOPS:
        if key in stopped:
            return short
    return stopped.split(" at ")[0][:40] if branch.get("early") else None


def bifurcation_figure(report: dict[str, Any]) -> Figure:
    """Each branch's own-mode amplitude against K: stable solid, unstable dashed, folds (×), bifurcations (○).

    The amplitude of a branch of mode k is |∫ μ cos kθ dθ| on the circle (k = 1: the order parameter |μ̂₁|),
    |∫ μ P_k dσ| on the sphere (k = 1: |∫ x dμ|): a mode-2 branch does not lie on the uniform branch's axis. A branch
    that stopped before its range's end (:func:`stop_label`) ends in a filled square of its colour, the reason
    beside it (it just ended, like one that ran out of range). The legend lies below the axis, off the branches.
    """
    from mfpde.plot_layout import _figure, _place, legend_below

    # inches: 0.95 left (tick labels and a two-line y label), 1.3 below (the x label, then the legend: outside the
    # data, where it hides no branch), 0.45 above (the title)
    height, bottom, top = 5.2, 1.3, 0.45
    fig = _figure(6.6, height)
    ax = _place(fig, 0.95, bottom, 5.45, height - bottom - top)
    stops = False
    for i, b in enumerate(report["branches"]):
        K, r, st = np.array(b["parameter"]), np.array(b["amplitude"]), np.array(b["stable"])
        colour = f"C{i}"
        for j in range(len(K) - 1):
            ax.plot(K[j : j + 2], r[j : j + 2], color=colour, ls="-" if st[j] and st[j + 1] else "--")
        ax.plot([], [], color=colour, label=b["origin"])
        why = stop_label(b)
        if why is not None and len(K):
            ax.plot(K[-1], r[-1], "s", color=colour, ms=6, zorder=5, gid="stopped")
            ax.annotate(f"stopped: {why}", (K[-1], r[-1]), xytext=(6, -12), textcoords="offset points",
                        fontsize=7, color=colour, annotation_clip=False)
            stops = True
    maxwell = False
    for e in report["bifurcations"]:
        if e["kind"] == "maxwell":
            if e.get("found"):  # the first-order transition: a vertical line at K_M
                ax.axvline(e["parameter"], color="0.4", ls=":", lw=1.2)
                ax.plot(e["parameter"], e["amplitude"], "s", color="k", ms=6, mfc="none")
                maxwell = True
            continue
        r = e.get("amplitude", 0.0)
        ax.plot(e["parameter"], r, "x" if e["kind"] == "fold" else "o", color="k", ms=7, mfc="none")
    ax.plot([], [], "o", color="k", mfc="none", label="bifurcation")
    ax.plot([], [], "x", color="k", label="fold")
    if maxwell:
        ax.plot([], [], "s:", color="k", mfc="none", label="Maxwell point (equal free energy)")
    if stops:
        ax.plot([], [], "s", color="k", ms=6, label="branch stopped early (reason beside it)")
    ax.plot([], [], "k-", label="stable")
    ax.plot([], [], "k--", label="unstable")
    ax.set_xlabel("coupling K")
    sphere = report["domain"] != "circle"
    ax.set_ylabel("each branch's own-mode amplitude\n|∫ μ Pₖ dσ|, k the branch's degree" if sphere
                  else "each branch's own-mode amplitude\n|∫ μ cos kθ dθ|, k the branch's mode")
    where = report.get("label", report["domain"])
    ax.set_title(f"noisy tokens on the {where}: β = {report['beta']:g}, noise τ = {report['noise']:g}", fontsize=10)
    legend_below(ax, ncol=3, fontsize=8, drop=0.5 / (height - bottom - top))
    return fig
