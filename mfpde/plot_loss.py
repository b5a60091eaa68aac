"""``loss.png``: the risk and the free energy on one axis, F − F* where F* is known, and the accuracies.

Imports nothing of mfpde but the layout helpers, and no solver, as :mod:`mfpde.plots`.
"""

from __future__ import annotations

import math
import textwrap
from typing import TYPE_CHECKING, Any

import numpy as np

from mfpde.plot_layout import _col, _figure, _log_minor, _place, legend_below

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["INFORMATIVE", "informative_rate", "loss_figure"]

#: A theorem's rate c is drawn only if it predicts at least this decay exponent over the run, c (s_end − s_0).
INFORMATIVE = 0.1
#: Font sizes of every panel's title and legend (one size across the panels).
TITLE, LEGEND = 9.0, 7.5
#: Inches below a panel's axis to the top of its legend (under the tick labels and the x label).
LEGEND_DROP = 0.55


def informative_rate(c: float | None, s: np.ndarray) -> bool:
    """Whether the rate c (per unit of training time) predicts a visible decay e^{−c Δs} over the times s."""
    return c is not None and math.isfinite(c) and len(s) > 1 and c * float(s[-1] - s[0]) >= INFORMATIVE


def _objective_panel(ax: Axes, s: np.ndarray, risk: np.ndarray, F: np.ndarray, kl: np.ndarray | None,
                     rate: dict[str, Any], lam: float, certificate: bool) -> str:
    """R and F on one axis (log where both are positive), with the band that holds F* where the bound holds.

    Returns:
        What the panel's title says of F*.
    """
    log = bool(np.all(risk > 0) and np.all(F > 0))
    plot = ax.semilogy if log else ax.plot
    plot(s, risk, "o-", ms=3, color="C0", label="risk R(ρ_s)")
    plot(s, F, "s-", ms=3, color="C1", label="free energy F(ρ_s)")
    cert = lam * kl if kl is not None and lam > 0 else None
    if not certificate:
        return "F* unknown (F* is the least F); no bound on F − F* for this model"
    if rate.get("converged"):
        bound = f" ≤ {cert[-1]:.2g}" if cert is not None and math.isfinite(cert[-1]) else ""
        return f"F* (the least F) is known: F(ρ_S) − F*{bound}\nthe next panel plots the gap F(ρ_s) − F*"
    if cert is not None and math.isfinite(cert[-1]):
        lo = F[-1] - cert[-1]
        ax.axhspan(lo if lo > 0 or not log else F[-1] * 1e-3, F[-1], color="C1", alpha=0.15,
                   label="F* lies here (certificate, theory §5.4)")
        return "F* not reached (F* is the least F): F, and the band that holds F*"
    return "F* unknown (F* is the least F)"


def _gap_panel(ax: Axes, s: np.ndarray, F: np.ndarray, cert: np.ndarray, rate: dict[str, Any]) -> float | None:
    """F − F* where F − F(ρ_S) ≥ 10 λKL_S, the certificate and the fitted rate (theory §5.4).

    F* is the report's ``fitted_f_star`` (fitted with the rate), else F(ρ_S), which is F* to 10% on those rows.

    Returns:
        The first value of the certificate drawn (the anchor of a theorem's rate), or None.
    """
    win = F - F[-1] >= 10 * cert[-1]
    fit = win & (F - F[-1] > 1e-14 * max(1.0, abs(F[-1])))  # the rows the rate was fitted to (certified_fit)
    fstar = rate.get("fitted_f_star")
    gap = F - (F[-1] if fstar is None else fstar)  # F − F*, F* fitted with the rate in the certificate's bracket
    ax.semilogy(s[win], gap[win], "s-", ms=3, color="C1",
                label="F(ρ_s) − F*  (F* taken as F(ρ_S), to 10%)" if fstar is None
                else "F(ρ_s) − F*  (F* estimated from the last F)")
    good = cert > 0
    ax.semilogy(s[good], cert[good], "^-", ms=3, color="C4", label="certificate λ·KL(ρ_s ‖ p_ρs)  (≥ F − F*)")
    c = rate.get("fitted")
    if c is not None and math.isfinite(c) and fit.any():
        s0 = s[fit][0]  # the fitted line: its least-squares level for that slope, not through the first row
        level = float(np.exp(np.mean(np.log(gap[fit]) + c * (s[fit] - s0))))
        ax.semilogy(s[fit], level * np.exp(-c * (s[fit] - s0)), "--", color="C2", label=f"fitted rate: e^(−{c:.3g} s)")
    ax.set_xlabel("training time s (non-dimensional)")
    ax.set_ylabel("F − F* (non-dimensional, log)")
    ax.set_title("free-energy gap F(ρ_s) − F* and its bound λ·KL", y=1.0, fontsize=TITLE)
    ax.grid(True, which="both", alpha=0.3)
    _log_minor(ax)
    return float(cert[good][0]) if good.any() else None


def loss_figure(history: list[dict[str, float]], rate: dict[str, Any], lam: float = 0.0,
                certificate: bool = False) -> Figure:
    """The risk and the free energy against training time, F − F* where known, and (classification) accuracies.

    The first panel draws R and F on one axis (log where both are positive). F − F* gets a panel of its own
    only where F* is known independently of the run: where the certificate F − F* ≤ λ KL(ρ ‖ p_ρ) of theory
    §5.4 is a bound (``certificate``) and has converged (``rate["converged"]``); there F − F(ρ_S) is F − F* to
    within 10% on the rows drawn. Where the bound holds but has not converged, the first panel shades the band
    [F(ρ_S) − λKL, F(ρ_S)] that holds F*. A theorem's rate ``rate["theory"]`` is drawn (and named) only where
    it is informative (:func:`informative_rate`) and anchored: on the gap panel, or on R for the deep model
    without regularisation (theory §5.5); otherwise it is not mentioned.

    Args:
        history: the history rows (``s``, ``risk``, ``free_energy``; optional ``kl_gibbs``,
            ``train_accuracy``, ``test_accuracy``, ``test_risk``).
        rate: the report's ``rate`` block (``fitted``, ``converged``, ``theory``, ``theory_kind``).
        lam: λ, the entropy weight.
        certificate: whether λ KL bounds F − F* (the report's ``rate.certificate_bound``).

    Returns:
        The figure: the R and F panel, the F − F* panel where F* is known, the risk and accuracy panel
        (with its twin axis) for classification data.
    """
    s = _col(history, "s")
    assert s is not None
    acc = _col(history, "train_accuracy")
    risk, F, kl = _col(history, "risk"), _col(history, "free_energy"), _col(history, "kl_gibbs")
    assert risk is not None and F is not None
    cert = lam * kl if kl is not None and lam > 0 else None
    gap_panel = bool(certificate and cert is not None and rate.get("converged"))
    n_panels = 1 + gap_panel + (acc is not None)
    # inches: 1.0 left of each panel, 1.45 below (the x label, then the legend: outside the data, it hides none),
    # 0.75 above (three title lines), 0.8 right
    w, bottom, top = 5.0, 1.45, 0.75
    h = 5.2 - bottom - top
    fig = _figure(7.0 + 6.8 * (n_panels - 1), 5.2)
    ax = _place(fig, 1.0, bottom, w, h)
    what = _objective_panel(ax, s, risk, F, kl, rate, lam, certificate)
    anchor, target = (float(risk[0]), ax) if lam == 0 and not certificate else (None, None)  # deep, §5.5: R's rate
    gax = None
    if gap_panel:
        assert cert is not None
        gax = _place(fig, 7.8, bottom, w, h)
        anchor, target = _gap_panel(gax, s, F, cert, rate), gax
    c = rate.get("theory")
    if c is not None and informative_rate(c, s) and anchor is not None and target is not None:
        kind = str(rate.get("theory_kind", "theory"))
        target.semilogy(s, anchor * np.exp(-c * (s - s[0])), ":", lw=2, color="C3",
                        label=f"theorem's rate: e^(−{c:.3g} s)\n" + textwrap.fill(f"({kind})", 48))
    ax.set_xlabel("training time s (non-dimensional)")
    ax.set_ylabel("risk R and free energy F (non-dimensional" + (", log)" if ax.get_yscale() == "log" else ")"))
    ax.set_title(f"training to s = {s[-1]:.3g} (step {int(history[-1]['step'])})\n{what}", y=1.0, fontsize=TITLE)
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_yscale() == "log":
        _log_minor(ax)
    for a in (ax, gax):
        if a is not None:
            legend_below(a, ncol=2, fontsize=LEGEND, drop=LEGEND_DROP / h)
    if acc is not None:
        _accuracy_panel(fig, s, risk, acc, history, bottom, w, h, 1.0 + 6.8 * (n_panels - 1))
    return fig


def _accuracy_panel(fig: Figure, s: np.ndarray, risk: np.ndarray, acc: np.ndarray, history: list[dict[str, float]],
                    bottom: float, w: float, h: float, x: float) -> None:
    """The last panel (at x inches): train and test risk (log, left axis), train and test accuracy (right axis)."""
    ax = _place(fig, x, bottom, w, h)
    test_risk, test_acc = _col(history, "test_risk"), _col(history, "test_accuracy")
    ax.semilogy(s, np.maximum(risk, 1e-300), "o-", ms=3, color="C0", label="train risk")
    if test_risk is not None:
        ax.semilogy(s, np.maximum(test_risk, 1e-300), "o--", ms=3, color="C1", label="test risk")
    _log_minor(ax)
    ax.set_xlabel("training time s (non-dimensional)")
    ax.set_ylabel("risk ½(ŷ − y)² (mean, log)")
    ax2 = ax.twinx()
    ax2.plot(s, acc, "s-", ms=3, color="C2", label="train accuracy")
    if test_acc is not None:
        ax2.plot(s, test_acc, "s--", ms=3, color="C3", label="test accuracy")
    ax2.axhline(0.5, color="grey", lw=0.8, ls=":")
    ax2.set_ylim(0.0, 1.02)
    ax2.set_ylabel("accuracy (fraction, chance 0.5)")
    legend_below(ax, ax2, ncol=2, fontsize=LEGEND, drop=LEGEND_DROP / h)
    ax.set_title("training and held-out risk, accuracy", y=1.0, fontsize=TITLE)
    ax.grid(True, alpha=0.3)
