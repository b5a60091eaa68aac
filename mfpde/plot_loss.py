"""``loss.png``: the risk, the free energy against what is known of its minimum F*, and the accuracies.

Imports nothing of mfpde but the layout helpers, and no solver, as :mod:`mfpde.plots`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from mfpde.plot_layout import _col, _figure, _log_minor, _place

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["INFORMATIVE", "informative_rate", "loss_figure"]

#: A theorem's rate c is drawn only if it predicts at least this decay exponent over the run, c (s_end − s_0).
INFORMATIVE = 0.1


def informative_rate(c: float | None, s: np.ndarray) -> bool:
    """Whether the rate c (per unit of training time) predicts a visible decay e^{−c Δs} over the times s."""
    return c is not None and math.isfinite(c) and len(s) > 1 and c * float(s[-1] - s[0]) >= INFORMATIVE


def _free_energy(ax: Axes, s: np.ndarray, F: np.ndarray, kl: np.ndarray | None, rate: dict[str, Any], lam: float,
                 certificate: bool) -> tuple[str, float | None]:
    """Draw F against F* where F* is known (on the risk's log axis), else F itself (linear twin axis).

    Returns:
        What the panel's title says of F*, and the first value of the drawn bound of F − F* (None: none drawn).
    """
    cert = lam * kl if kl is not None and lam > 0 else None
    if certificate and cert is not None and rate.get("converged"):
        # F(ρ_S) − λKL_S ≤ F* ≤ F(ρ_S): where F − F(ρ_S) ≥ 10 λKL_S it is F − F* to within 10% (theory §5.4)
        gap = F - F[-1]
        win = gap >= 10 * cert[-1]
        ax.semilogy(s[win], gap[win], "s-", ms=3, label="F(ρ_s) − F*  (F* = F(ρ_S) to 10%)")
        good = cert > 0
        ax.semilogy(s[good], cert[good], "^-", ms=3, label="certificate λ·KL(ρ_s ‖ p_ρs)  (≥ F − F*)")
        c = rate.get("fitted")
        if c is not None and math.isfinite(c) and win.any():
            s0 = s[win][0]
            ax.semilogy(s[win], gap[win][0] * np.exp(-c * (s[win] - s0)), "--", label=f"fitted rate: e^(−{c:.3g} s)")
        return "F* known to 10% (certificate)", float(cert[good][0]) if good.any() else None
    ax2 = ax.twinx()
    ax2.plot(s, F, "s-", ms=3, color="C1", label="free energy F(ρ_s)")
    what = "F* unknown: F itself"
    if certificate and cert is not None and math.isfinite(cert[-1]):
        ax2.axhspan(F[-1] - cert[-1], F[-1], color="C1", alpha=0.15, label="F* lies here (certificate, theory §5.4)")
        what = "F* not reached: F and the band holding F*"
    ax2.set_ylabel("free energy F (non-dimensional)")
    return what, None


def loss_figure(history: list[dict[str, float]], rate: dict[str, Any], lam: float = 0.0,
                certificate: bool = False) -> Figure:
    """The risk and the free energy against training time, and (classification) risks and accuracies.

    The free energy F is drawn against F* only where F* is known independently of the run: single-layer
    entropic runs whose certificate F − F* ≤ λ KL(ρ ‖ p_ρ) (theory §5.4) has converged (``rate["converged"]``);
    there F − F(ρ_S) is F − F* to within 10% on the rows drawn. Elsewhere F* is unknown and F itself is drawn
    (on a linear axis), with the band [F(ρ_S) − λKL, F(ρ_S)] that holds F* where the certificate applies.
    A theorem's rate ``rate["theory"]`` is drawn only where it is informative (:func:`informative_rate`);
    otherwise the title says it was not drawn.

    Args:
        history: the history rows (``s``, ``risk``, ``free_energy``; optional ``kl_gibbs``,
            ``train_accuracy``, ``test_accuracy``, ``test_risk``).
        rate: the report's ``rate`` block (``fitted``, ``converged``, ``theory``, ``theory_kind``).
        lam: λ, the entropy weight.
        certificate: whether λ KL bounds F − F* (theory §5.4 applies).

    Returns:
        The figure: one panel (plus a twin axis), or two with the classification columns.
    """
    s = _col(history, "s")
    assert s is not None
    acc = _col(history, "train_accuracy")
    # inches: 1.0 left of each panel, 0.6 below (0.9 with the second panel's legend), 0.35 above, 0.8 right
    w, bottom = 5.0, 0.9 if acc is not None else 0.6
    h = 4.6 - bottom - 0.55  # three title lines
    fig = _figure(13.6 if acc is not None else 7.0, 4.6)
    ax = _place(fig, 1.0, bottom, w, h)
    risk, F, kl = _col(history, "risk"), _col(history, "free_energy"), _col(history, "kl_gibbs")
    assert risk is not None and F is not None
    ax.semilogy(s, np.maximum(risk, 1e-300), "o-", ms=3, label="risk R(ρ_s)")
    what, anchor = _free_energy(ax, s, F, kl, rate, lam, certificate)
    if lam == 0 and not certificate:  # the deep unregularised model: its theorem's rate is the rate of R
        anchor = float(risk[0])
    c = rate.get("theory")
    if c is not None and informative_rate(c, s) and anchor is not None:
        kind = str(rate.get("theory_kind", "theory"))
        ax.semilogy(s, anchor * np.exp(-c * (s - s[0])), ":", lw=2, label=f"theorem's rate: e^(−{c:.3g} s)\n"
                    f"({kind[:60]})")
    elif c is not None:
        why = "uninformative" if not informative_rate(c, s) else "F* unknown"
        what += f"\ntheorem's rate {c:.2g} not drawn ({why} over s ≤ {s[-1]:.3g})"
    ax.set_xlabel("training time s (non-dimensional)")
    ax.set_ylabel("risk (non-dimensional, log)")
    ax.set_title(f"training to s = {s[-1]:.3g} (step {int(history[-1]['step'])})\n{what}", y=1.0, fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    _log_minor(ax)
    handles: list[Any] = []
    labels: list[str] = []
    for a in fig.axes:
        hh, ll = a.get_legend_handles_labels()
        handles, labels = handles + hh, labels + ll
    ax.legend(handles, labels, fontsize=7, loc="best")
    if acc is not None:
        _accuracy_panel(fig, s, risk, acc, history, bottom, w, h)
    return fig


def _accuracy_panel(fig: Figure, s: np.ndarray, risk: np.ndarray, acc: np.ndarray, history: list[dict[str, float]],
                    bottom: float, w: float, h: float) -> None:
    """The second panel: train and test risk (log, left axis), train and test accuracy (right axis)."""
    ax = _place(fig, 7.8, bottom, w, h)
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
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.52 / h), ncol=4)
    ax.set_title("held-out and training risk, accuracy", y=1.0)
    ax.grid(True, alpha=0.3)
