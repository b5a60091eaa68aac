"""``gaps.png`` of ``mfpde twin``: the theory's power laws its title promises (dotted) are drawn for every gap with an
expected exponent, a fit or not (a single size, or gaps the fit left out, drew none), and each panel says what its y
axis measures."""

from __future__ import annotations

import math

import numpy as np

from mfpde.twin.compare import fit_gaps
from mfpde.twin.plots import gaps_figure


def _exps():
    rng = np.random.default_rng(0)

    def gaps(sizes, q):
        return np.stack([np.abs(rng.normal(0, x**q, 16)) for x in sizes])

    return {"heads": {"risk": fit_gaps([4, 16, 64], gaps([4, 16, 64], -0.5), 0.0, -0.5),
                      "yhat": fit_gaps([4, 16, 64], gaps([4, 16, 64], -0.5), math.nan, None)},  # no theory
            "tokens": {"risk": fit_gaps([8, 16], gaps([8, 16], -0.5), 1.0, -0.5)},  # below 2× the PDE: no fit
            "layers": {"risk": fit_gaps([2], gaps([2], -1.0), 0.0, -1.0)}}  # a single size: no fit


def test_gaps_figure_draws_theory_dotted_for_every_expected_exponent_and_labels_its_axes():
    exps = _exps()
    assert exps["heads"]["risk"]["slope"] is not None and exps["tokens"]["risk"]["slope"] is None
    assert exps["layers"]["risk"]["slope"] is None
    fig = gaps_figure(exps)
    panels = fig.axes
    assert len(panels) == 3
    for ax, (sweep, fits) in zip(panels, exps.items(), strict=True):
        drawn = [ln for ln in ax.get_lines() if ln.get_linestyle() == ":" and len(ln.get_xdata())]
        want = sum(f["expected"] is not None for f in fits.values())
        assert len(drawn) == want, (sweep, len(drawn), want)
        solid = [ln for ln in ax.get_lines() if ln.get_linestyle() == "-" and len(ln.get_xdata())]
        assert len(solid) == sum(f["slope"] is not None for f in fits.values()), sweep
        for ln, f in zip(drawn, [f for f in fits.values() if f["expected"] is not None], strict=True):
            x, y = (np.asarray(v, float) for v in ln.get_data())
            assert abs(np.polyfit(np.log(x), np.log(y), 1)[0] - f["expected"]) < 1e-9  # the theory's slope
        assert ax.get_ylabel() and "log" in ax.get_ylabel(), sweep
        labels = ax.get_legend_handles_labels()[1]
        assert "theory's power law (dotted)" in labels, labels
    assert "dotted" in fig._suptitle.get_text()
