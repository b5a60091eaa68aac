"""The run's plots (issue 13): written at every output step, atomically, each figure by one rank; what each shows;
the initial accuracy in the report; a failed run keeps the plots of its last output step; log lines that
do not break the progress bar."""

from __future__ import annotations

import csv
import io
import json
import logging
import sys
from pathlib import Path

from mpi4py import MPI

import matplotlib

matplotlib.use("Agg")
import matplotlib.image
import matplotlib.pyplot as plt
import numpy as np
import pytest
from configs import DEEP

from mfpde import plots
from mfpde.cli import main
from mfpde.errors import NumericalError
from mfpde.jobs import records
from mfpde.training.splitting import Splitting

pytestmark = pytest.mark.ranks  # the rank count can change what it checks: run again under mpiexec

TINY = ["tokens.cells=[8, 8]", "depth.steps=2", "heads.cells=[6, 6]", "data.samples=4", "data.test_samples=4",
        "training.steps=2", "output.every=1", "output.fields=false"]
PNGS = ("loss.png", "rho.png", "tokens.png")


def _args(extra=()):
    return [a for s in [*TINY, *extra] for a in ("--set", s)]


class _Recorder:
    """Wraps plot_run: after each call, the step and figures drawn, the PNGs' (height, width), the axes counts."""

    def __init__(self, monkeypatch):
        self.calls: list[dict] = []
        real = records.plot_run

        def wrapped(out, history, rate, rho, tokens, lam=0.0, certificate=False, figures=plots.FIGURES):
            real(out, history, rate, rho, tokens, lam, certificate, figures)
            shapes = {}
            for name in figures:
                path = out / "plots" / f"{name}.png"
                assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
                shapes[name] = matplotlib.image.imread(path).shape[:2]
            build = {"loss": lambda: plots.loss_figure(history, rate, lam, certificate),
                     "rho": lambda: plots.rho_figure(rho), "tokens": lambda: plots.tokens_figure(tokens)}
            figs = {k: build[k]() for k in figures}
            self.calls.append({"step": int(history[-1]["step"]), "figures": tuple(figures), "shapes": shapes,
                               "rho": rho, "tokens": tokens, "axes": {k: len(f.axes) for k, f in figs.items()},
                               "loss_labels": ([ax.get_legend_handles_labels()[1] for ax in figs["loss"].axes]
                                               if "loss" in figs else None),
                               "tmp": sorted(p.name for p in (out / "plots").glob("*.tmp")  # this rank's
                                             if p.name.split(".")[0] in figures)})
            for f in figs.values():
                plt.close(f)

        monkeypatch.setattr(records, "plot_run", wrapped)


@pytest.mark.parametrize("every,steps", [(0, (2,)), (1, (0, 1, 2))])
def test_tiny_run_writes_every_plot_once_or_every_k_steps(tempdir, monkeypatch, every, steps):
    """Each figure once, at the end (output.plots_every = 0), or at every k-th output step too; each figure is
    drawn by one rank: figure k by rank k mod size."""
    rec = _Recorder(monkeypatch)
    assert main(["run", DEEP, "--out", str(tempdir), "--quiet", *_args([f"output.plots_every={every}"])]) == 0
    comm = MPI.COMM_WORLD
    drawn = [(c["step"], f, r) for r, calls in enumerate(comm.allgather(rec.calls)) for c in calls
             for f in c["figures"]]
    expected = [(step, f, k % comm.size) for step in steps for k, f in enumerate(plots.FIGURES)]
    assert sorted(drawn) == sorted(expected), drawn
    for c in rec.calls:
        assert c["tmp"] == [], c["tmp"]  # written through a temporary file, renamed into place
        assert all(h > 200 and w > 400 for h, w in c["shapes"].values()), c["shapes"]
        if "loss" in c["figures"]:
            # loss: the R and F panel (one axis; the deep model's F* is unknown: no gap panel) + risk/accuracy panel
            # + its twin (digits); no theory line (deep model: report rate.theory is null)
            assert c["axes"]["loss"] == 3, c["axes"]
            labels = {lab for ax in c["loss_labels"] for lab in ax}
            assert "free energy F(ρ_s)" in labels and not any("F*" in lab for lab in labels), labels
            assert not any(lab.startswith("theorem") for lab in labels), labels
            assert {"test accuracy", "train accuracy", "test risk"} <= labels
        if "rho" in c["figures"]:
            # rho: one panel per snapshot so far (≤ 4) + the Gibbs measure, each with its colour bar
            n_snap = min(c["step"] + 1, plots.N_RHO_PANELS)
            assert c["axes"]["rho"] == 2 * (n_snap + 1), (c["axes"], n_snap)
            if c["step"] == 2:
                assert c["rho"].s == [0.0, 0.2, 0.4]
        if "tokens" in c["figures"]:
            # tokens: 2 samples per class (4 training samples, 2 per digit) × depths 0, T/2, T, a colour bar per row
            tok = c["tokens"]
            assert tok.depths == [0.0, 0.5, 1.0] and len(tok.weights) == 4, (tok.depths, len(tok.weights))
            assert c["axes"]["tokens"] == 4 * 3 + 4, c["axes"]
            assert sorted(lab.split(" (")[0] for lab in tok.labels) == ["class 6"] * 2 + ["class 7"] * 2, tok.labels
            for w in tok.weights:  # μ_0 of mass 1; mass through depth only lost by outflow, a little in this box
                m = w.sum(axis=1)
                assert w.shape == (3, len(tok.mass)) and abs(m[0] - 1) < 1e-12 and np.all(np.diff(m) <= 1e-14), m
                assert m[-1] > 0.99 and np.all(w >= 0), m
    if comm.rank != 0:
        return
    report = json.loads((tempdir / "report.json").read_text())
    first = next(csv.DictReader((tempdir / "history.csv").open()))
    init = report["accuracy"]["initial"]
    assert set(init) == {"train", "test"}, report["accuracy"]
    assert init["train"] == pytest.approx(float(first["train_accuracy"]))
    assert init["test"] == pytest.approx(float(first["test_accuracy"]))
    assert sorted(p.name for p in (tempdir / "plots").iterdir()) == sorted(PNGS)


def test_failed_run_keeps_the_plots_of_its_last_output_step(tempdir, monkeypatch):
    """The second training step fails: exit 3, and the plots of output step 1 are there."""
    rec = _Recorder(monkeypatch)
    real, n = Splitting.step, []

    def failing(self, ds):
        n.append(1)
        if len(n) == 2:
            raise NumericalError("injected failure")
        return real(self, ds)

    monkeypatch.setattr(Splitting, "step", failing)
    assert main(["run", DEEP, "--out", str(tempdir), "--quiet", *_args(["training.steps=3"])]) == 3
    assert json.loads((tempdir / "report.json").read_text())["status"] == "failed"
    comm = MPI.COMM_WORLD
    drawn = sorted((c["step"], f) for calls in comm.allgather(rec.calls) for c in calls for f in c["figures"])
    assert drawn == sorted((1, f) for f in plots.FIGURES), drawn  # once, from the last output step
    comm.barrier()
    if comm.rank == 0:
        for name in PNGS:
            assert matplotlib.image.imread(tempdir / "plots" / name).shape[0] > 200, name


def test_a_failed_figure_is_logged_by_rank_0(tempdir, monkeypatch):
    """rho.png fails to draw (on rank 1 mod size): the run goes on (exit 0, the other figures written) and rank 0
    logs the failure of that rank at every output step; the other ranks log nothing."""
    def failing(rho):
        raise RuntimeError("injected plot failure")

    monkeypatch.setattr(plots, "rho_figure", failing)
    warned: list[str] = []
    monkeypatch.setattr(records.logger, "warning", lambda msg, *args: warned.append(msg % args))
    assert main(["run", DEEP, "--out", str(tempdir), "--quiet", *_args(["training.steps=1"])]) == 0
    comm = MPI.COMM_WORLD
    comm.barrier()
    if comm.rank != 0:
        assert warned == [], warned
        return
    rank = plots.FIGURES.index("rho") % comm.size
    figs = ", ".join(f for k, f in enumerate(plots.FIGURES) if k % comm.size == rank)  # what that rank draws
    assert warned == [f"plots not written at step 1: {figs} on rank {rank}: RuntimeError: injected plot failure"
                      ], warned  # drawn once, at the end
    assert (tempdir / "plots" / "loss.png").exists()  # drawn before rho.png, or on another rank
    assert not (tempdir / "plots" / "rho.png").exists()


def _history(m, classification=True):
    s = 0.5 * np.arange(m)
    rows = [{"step": k, "s": s[k], "risk": 0.2 * np.exp(-s[k]) + 0.01, "free_energy": 1 + np.exp(-0.5 * s[k]),
             "kl_gibbs": 3 * np.exp(-0.5 * s[k])} for k in range(m)]
    if classification:
        for r in rows:
            r.update(train_accuracy=0.6, test_accuracy=0.55, test_risk=0.3)
    return rows


def _labels(fig):
    return [lab for ax in fig.axes for lab in ax.get_legend_handles_labels()[1]]


def _renderer(fig):
    """The Agg renderer of a figure made outside pyplot (mfpde.plot_layout._figure: no canvas of its own)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    return FigureCanvasAgg(fig).get_renderer()


def _titles(fig):
    return " ".join(ax.get_title() for ax in fig.axes)


def test_loss_figure_draws_the_theory_rate_only_where_given_and_informative():
    """A theorem's rate is drawn (on the F − F* panel) where it predicts a visible decay; a vacuous one (3e-81)
    is neither drawn nor quoted in a title (it was: "theorem's rate 2.8e-81 not drawn")."""
    rate = {"fitted": None, "converged": True, "theory": 0.2, "theory_kind": "2 λ₂"}
    fig = plots.loss_figure(_history(6), rate, lam=0.01, certificate=True)
    labels = _labels(fig)
    assert any(lab.startswith("theorem's rate") for lab in labels) and any("certificate" in lab for lab in labels)
    assert "training time s" in fig.axes[0].get_xlabel() and fig.axes[0].get_yscale() == "log"
    plt.close(fig)
    fig = plots.loss_figure(_history(6), {**rate, "theory": 3e-81}, lam=0.01, certificate=True)
    assert not any(lab.startswith("theorem's rate") for lab in _labels(fig)), _labels(fig)
    assert "e-81" not in _titles(fig) and "theorem" not in _titles(fig), _titles(fig)
    plt.close(fig)
    fig = plots.loss_figure(_history(6, classification=False), {"fitted": None, "theory": None})
    labels = _labels(fig)
    assert not any(lab.startswith("theorem") for lab in labels), labels
    assert not any("KL" in lab for lab in labels), labels  # λ = 0: no certificate
    plt.close(fig)


def test_loss_figure_draws_r_and_f_on_one_axis_and_the_gap_on_its_own_panel():
    """R and F were on two y-axes (F drawn below R although F ≥ R): now one axis, and F − F* on a panel of its own
    only where F* is known (the certificate a bound and converged)."""
    h = _history(6, classification=False)
    fig = plots.loss_figure(h, {"fitted": None, "theory": None}, lam=0.05, certificate=False)
    assert len(fig.axes) == 1, fig.axes  # no twin axis
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert {"risk R(ρ_s)", "free energy F(ρ_s)"} <= set(labels) and not any("F*" in lab for lab in labels), labels
    assert "F* unknown" in fig.axes[0].get_title()
    (line,) = [ln for ln in fig.axes[0].get_lines() if ln.get_label() == "free energy F(ρ_s)"]
    np.testing.assert_array_equal(line.get_ydata(), [r["free_energy"] for r in h])  # F itself, not a gap
    plt.close(fig)
    # the certificate a bound but not converged: F and the band [F_S - λ KL_S, F_S] that holds F*, one panel
    fig = plots.loss_figure(h, {"fitted": None, "converged": False, "theory": None}, lam=0.05, certificate=True)
    assert any("F* lies here" in lab for lab in _labels(fig)) and "F* not reached" in fig.axes[0].get_title()
    assert len(fig.axes) == 1
    plt.close(fig)
    # converged: F − F(ρ_S) on its own panel, on the rows where it exceeds 10 λ KL_S (F − F* to within 10 %)
    fig = plots.loss_figure(h, {"fitted": 0.5, "converged": True, "theory": None}, lam=0.05, certificate=True)
    assert len(fig.axes) == 2
    (gap,) = [ln for ln in fig.axes[1].get_lines() if ln.get_label().startswith("F(ρ_s) − F*")]
    F = np.array([r["free_energy"] for r in h])
    cert = 0.05 * np.array([r["kl_gibbs"] for r in h])
    np.testing.assert_allclose(gap.get_ydata(), (F - F[-1])[F - F[-1] >= 10 * cert[-1]])
    plt.close(fig)
    # converged but the certificate not a bound (scalar heads on digits): F* unknown, no gap panel, no band
    fig = plots.loss_figure(h, {"fitted": None, "converged": False, "theory": None}, lam=0.05, certificate=False)
    assert len(fig.axes) == 1 and not any("F*" in lab for lab in _labels(fig)), _labels(fig)
    plt.close(fig)


def test_loss_figure_panels_share_font_sizes_and_legends_lie_below_the_data():
    """The left and middle titles were 8 pt, the right 12; the gap panel's legend lay over the fitted-rate and
    certificate curves; "F* known to 10% (certificate)" said nothing plain. Now: one title size, every legend below
    its axis (outside the data), and the title says that F* is the least F and how close F(ρ_S) is to it."""
    h = _history(6)
    fig = plots.loss_figure(h, {"fitted": 0.5, "converged": True, "theory": 0.2, "theory_kind": "2 λ₂"}, lam=0.05,
                            certificate=True)
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert len(panels) == 3 and len({ax.title.get_fontsize() for ax in panels}) == 1
    r = _renderer(fig)
    legends = [ax.get_legend() for ax in panels]
    assert all(leg is not None for leg in legends)
    for ax, leg in zip(panels, legends, strict=True):
        assert leg.get_window_extent(r).y1 < ax.get_window_extent(r).y0, ax.get_title()  # below the axis
        assert len({t.get_fontsize() for t in leg.get_texts()}) == 1
    assert len({t.get_fontsize() for leg in legends for t in leg.get_texts()}) == 1
    cert = 0.05 * h[-1]["kl_gibbs"]
    assert f"F(ρ_S) − F* ≤ {cert:.2g}" in panels[0].get_title() and "least F" in panels[0].get_title()
    assert "10%" not in panels[0].get_title()
    plt.close(fig)


def test_rho_figure_is_finer_than_the_cells_and_labelled():
    g = np.linspace(-2, 2, 5)
    pts = np.array([[a, v] for a in g for v in g])
    vals = [np.exp(-((pts - c) ** 2).sum(axis=1))[None, :] for c in (0.0, 0.5, 1.0)]
    fig = plots.rho_figure(plots.RhoSeries(pts, [0.0, 1.0, 2.0], vals, gibbs=vals[-1]))
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title().split(" at")[0] for ax in panels] == ["ρ_s"] * 3 + ["Gibbs p_ρ ∝ exp(−Φ/λ)"]
    bars = [ax.get_ylabel() for ax in fig.axes if not ax.get_title()]
    assert bars == ["density of ρ on Θ = (a, v)"] * 3 + ["density of p_ρ on Θ"], bars
    box, fine = plots._refined(pts, vals[0][0])
    assert box == (-2.0, 2.0, -2.0, 2.0) and fine.size > 16 * len(pts), (box, fine.shape)  # beyond the Θ nodes
    # each panel an image of the refined field, interpolating the nodal values (here at the box's centre)
    assert all(ax.images and ax.images[0].get_array().shape == fine.shape for ax in panels)
    assert fine[fine.shape[0] // 2 - 1:fine.shape[0] // 2 + 1, fine.shape[1] // 2 - 1:fine.shape[1] // 2 + 1].mean() \
        == pytest.approx(1.0, abs=0.02)
    plt.close(fig)


def test_tokens_figure_shows_densities_on_a_shared_scale_per_row():
    """Weights m_i μ_i in, μ_i out: the image is the density, the same colour limits along a row."""
    h = 0.25
    c = np.arange(-1 + h / 2, 1, h)
    pts = np.array([[x, y] for x in c for y in c])
    mass = np.full(len(pts), h * h)
    rng = np.random.default_rng(0)
    dens = [rng.random((3, len(pts))) for _ in range(2)]
    series = plots.TokenSeries(pts, mass, [0.0, 0.5, 1.0], [d * mass for d in dens],
                               ["class 6 (y = -1)", "class 7 (y = +1)"], [-0.3, 0.4])
    fig = plots.tokens_figure(series)
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == 6
    for row in range(2):
        clims = {images[3 * row + j].get_clim() for j in range(3)}
        assert clims == {(0.0, dens[row].max())}, clims
        for j in range(3):  # image row = x₂ index, column = x₁ index; x₁ varies slowest in pts
            np.testing.assert_allclose(np.asarray(images[3 * row + j].get_array()).T.ravel(), dens[row][j])
    titles = [ax.get_title() for ax in fig.axes if ax.images]
    assert titles[0].startswith("class 6 (y = -1), ŷ = -0.300") and titles[3].startswith("class 7"), titles
    plt.close(fig)


class _Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.serial  # the bar is rank 0's
def test_progress_bar_has_an_eta_and_log_lines_do_not_break_it(monkeypatch):
    from mfpde.io import setup_logging
    from mfpde.progress import progress

    root = logging.getLogger("mfpde")
    saved = root.handlers[:], root.level
    fake = _Tty()
    monkeypatch.setattr(sys, "stderr", fake)
    try:
        setup_logging()
        factory = progress(quiet=False)
        assert factory is not None
        bar = factory(4, 0)
        bar.update(1)
        logging.getLogger("mfpde.jobs.run").info("step 1 s=0.2")
        bar.update(1)
        bar.close()
        assert isinstance(root.handlers[0], logging.StreamHandler) and root.handlers[0].stream is fake
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    text = fake.getvalue()
    assert "ETA" in text, text
    # the log line is a line of its own (tqdm.write clears the bar first), not glued to the bar
    lines = [seg for ln in text.split("\n") for seg in ln.split("\r")]
    assert "mfpde[0/1] step 1 s=0.2" in lines, lines


def test_rho_figure_one_dimensional_heads_on_one_axis():
    pts = np.linspace(-2, 2, 9)[:, None]
    vals = [np.exp(-((pts[:, 0] - c) ** 2))[None, :] for c in (0.0, 0.3, 0.6, 0.9, 1.2)]
    fig = plots.rho_figure(plots.RhoSeries(pts, [0.0, 1.0, 2.0, 3.0, 4.0], vals, gibbs=vals[-1]))
    assert len(fig.axes) == 1
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert labels == ["ρ_s, s = 0", "ρ_s, s = 1", "ρ_s, s = 3", "ρ_s, s = 4", "Gibbs p_ρ ∝ exp(−Φ/λ), s = 4"], labels
    plt.close(fig)


def test_log_axis_labels_are_plain_text_powers_of_ten():
    """A log axis of the run's figures labels its decades 10⁻³ … in plain text (no mathtext to lay out)."""
    from mfpde.plot_layout import _figure, _log_minor, _place

    fig = _figure(4.0, 3.0)
    ax = _place(fig, 0.8, 0.5, 3.0, 2.2)
    ax.semilogy([0.0, 1.0], [1e-4, 1.0])
    _log_minor(ax)
    fig.canvas.draw()
    lo, hi = ax.get_ylim()
    shown = [t.get_text() for t, v in zip(ax.yaxis.get_majorticklabels(), ax.yaxis.get_majorticklocs(), strict=True)
             if lo <= v <= hi]
    sup = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")
    assert shown == ["10" + str(k).translate(sup) for k in range(-4, 1)]
    assert not any("$" in t.get_text() for t in ax.yaxis.get_minorticklabels())


def test_the_fitted_rate_line_is_the_least_squares_fit():
    """The gap panel's dashed line is the fit the report's rate comes from (slope and level by least squares on
    log(F − F(ρ_S)) over the fitted rows), not a line of that slope through the first row: a transient at s = 0
    (a faster first decay) would otherwise put the line above every later point."""
    from mfpde.plot_loss import loss_figure
    from mfpde.training.theory import certified_fit

    s = np.arange(12.0)
    F = 1.0 + np.where(s == 0, 1.0, 0.05) * np.exp(-0.5 * s)  # the row s = 0 off the exponential
    lam, kl = 0.1, np.full(12, 1e-9)
    rate_c, conv, _, fstar = certified_fit(s, F, lam * kl[-1])
    assert conv and rate_c is not None and fstar is not None
    history = [{"s": float(a), "step": int(a), "risk": float(f), "free_energy": float(f), "kl_gibbs": float(k)}
               for a, f, k in zip(s, F, kl, strict=True)]
    fig = loss_figure(history, {"fitted": rate_c, "converged": True, "fitted_f_star": fstar}, lam, certificate=True)
    (line,) = [ln for ax in fig.axes for ln in ax.get_lines() if ln.get_label().startswith("fitted rate")]
    x, y = (np.asarray(v, float) for v in line.get_data())
    win = (F - F[-1] >= 10 * lam * kl[-1]) & (F - F[-1] > 1e-14)
    gap = F - fstar
    slope, level = np.polyfit(s[win], np.log(gap[win]), 1)
    np.testing.assert_allclose(np.log(y), level + slope * x, rtol=0, atol=1e-12)


def test_a_flat_risk_gets_a_readable_log_axis():
    """A risk constant to round-off (0.5 and its predecessor): matplotlib's log axis spanned about one ulp, with no
    readable tick and the held-out risk 0.5 outside it. Now both lines lie inside a decade around them."""
    from mfpde.plot_loss import loss_figure

    hist = [dict(step=0, s=0.0, risk=0.5, free_energy=0.5003, kl_gibbs=0.05, train_accuracy=0.51,
                 test_accuracy=0.43, test_risk=0.5),
            dict(step=2, s=2.0, risk=np.nextafter(0.5, 0.0), free_energy=0.5002, kl_gibbs=0.048,
                 train_accuracy=0.51, test_accuracy=0.43, test_risk=0.5)]
    fig = loss_figure(hist, {"fitted": None, "converged": False, "theory": 0.02}, lam=0.001, certificate=True)
    for ax in fig.axes:
        if ax.get_yscale() == "log":
            lo, hi = ax.get_ylim()
            assert hi / lo >= 2 and lo < np.nextafter(0.5, 0.0) and 0.5 < hi, (lo, hi)


def test_sphere_panel_titles_count_the_reports_clusters(tempdir, monkeypatch):
    """The flow solver's picture: each panel's title states the report's count at its depth (clusters_t) and says
    that it counts collapsed clusters (it said "3 clusters" over 7 bumps); the rings mark them all, groups about to
    merge one ring labelled with their number."""
    import re

    import mfpde.tokens.sphere.job as job
    from mfpde.tokens.sphere.picture import sphere_figure

    seen = {}
    monkeypatch.setattr(job, "sphere_figure", lambda *a, **k: seen.update(args=a, kw=k))
    out = tempdir / "flow"
    demo = str(Path(__file__).resolve().parent.parent / "demos" / "sphere.toml")
    assert main(["transport", demo, "--out", str(out), "--set", "tokens.solver=\"flow\"",
                 "--set", "tokens.labels=512", "--set", "output.fields=false"]) == 0
    if MPI.COMM_WORLD.rank != 0:
        return  # rank 0 draws the picture
    block = json.loads((out / "report.json").read_text())["samples"][0]
    fig = sphere_figure(*seen["args"], **seen["kw"])
    titles = [ax.get_title() for ax in fig.axes if ax.name == "mollweide"]
    ts = seen["args"][0]
    assert ts[-1] == block["t"][-1] and block["clusters_T"] > 0
    for t, title in zip(ts, titles, strict=True):
        want = block["clusters_t"][block["t"].index(t)]
        got = re.search(r", (\d+|none) collapsed", title)
        assert (t == 0 and not want and got is None) or (got and int(got[1].replace("none", "0")) == want), title
    last = [ax for ax in fig.axes if ax.name == "mollweide"][-1]
    rings = sum(len(ln.get_xdata()) for ln in last.get_lines() if ln.get_marker() == "o")
    extra = sum(int(a.get_text()[1:]) - 1 for a in last.texts if a.get_text().startswith("×"))
    assert rings + extra == block["clusters_T"]
    assert "collapsed" in fig.axes[-1].get_xlabel()  # the colour bar's caption says what is circled
    plt.close(fig)


def test_a_near_uniform_sphere_field_gets_a_linear_scale_that_shows_it():
    """μ within 3% of the uniform density (noise, small modes): the log scale from 1/40π up drew one flat colour;
    now a linear scale centred on 1/4π as wide as the deviation, so the field spans most of the colour map."""
    from mfpde.tokens.sphere.picture import sphere_figure

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    u = 1 / (4 * np.pi)
    fig = sphere_figure([0.0, 1.0], [(x, u * (1 + 0.03 * x[:, 2])), (x, u * (1 + 0.01 * x[:, 2]))], [[], []], "μ")
    first = [ax for ax in fig.axes if ax.name == "mollweide"][0]
    (mesh,) = first.collections
    shown = mesh.norm(np.asarray(mesh.get_array()))
    assert shown.max() - shown.min() > 0.9, (shown.min(), shown.max())  # the field spans the colour map
    assert mesh.norm.vmin + mesh.norm.vmax == pytest.approx(2 * u)  # centred on the uniform density
    assert "linear" in fig.axes[-1].get_xlabel()
    plt.close(fig)


@pytest.mark.parametrize("log_depth", [False, True])
def test_space_depth_axis_ends_at_the_last_depth(log_depth):
    """The circle's θ–t picture: the depth axis ends at T (each output's column ran to the next output, one past T)
    and starts at 0 (a log axis: a decade below the first positive output, where t = 0 is drawn)."""
    from mfpde.plots import space_depth_figure

    ts = np.array([0.0, 0.5, 1.0, 1.5]) if not log_depth else np.array([0.0, 1e-3, 1e-2, 1e-1, 1.5])
    dens = np.full((len(ts), 16), 1 / (2 * np.pi)) + np.linspace(0, 1, len(ts))[:, None] * np.cos(np.arange(16))
    fig = space_depth_figure(ts, np.abs(dens), 2 * np.pi / 16, log_depth, {"merge": [1.0]})
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    assert hi == pytest.approx(ts[-1]) and lo == pytest.approx(ts[1] / 10 if log_depth else 0.0)
    lo, hi = ax.get_ylim()
    assert hi - lo == pytest.approx(2 * np.pi) and any(lo == pytest.approx(c) for c in (0.0, -np.pi, np.pi / 2))
    (mesh,) = ax.collections
    assert np.asarray(mesh.get_array()).size == len(ts) * 16  # every output drawn


def test_space_depth_keeps_a_cluster_at_zero_in_one_piece_and_titles_its_parameters():
    """A single cluster at θ ≈ 0 ≡ 2π was split across the top and bottom edges of [0, 2π) and read as two; the angle
    axis now starts where no cluster sits ([−π, π) here), and the title gives β, K and the noise τ."""
    from mfpde.plots import circle_title, space_depth_figure

    n, h = 64, 2 * np.pi / 64
    theta = (np.arange(n) + 0.5) * h
    ts = np.array([0.0, 1.0, 2.0])
    dens = np.stack([np.exp(c * np.cos(theta)) for c in (0.0, 2.0, 8.0)])
    dens /= dens.sum(axis=1, keepdims=True) * h
    fig = space_depth_figure(ts, dens, h, title=circle_title([4.0], [1.0], 1.0))
    ax = fig.axes[0]
    assert ax.get_ylim() == pytest.approx((-np.pi, np.pi))
    (mesh,) = ax.collections
    shown = np.asarray(mesh.get_array()).reshape(n, len(ts))  # rows along θ from the axis' start
    assert 0 < np.argmax(shown[:, -1]) < n - 1 and shown[[0, -1], -1].max() < 1e-3 * shown[:, -1].max()
    np.testing.assert_allclose(np.sort(shown[:, -1]), np.sort(dens[-1]))  # the same cells, rolled
    assert ax.get_title() == "tokens on the circle: β = 4, K = 1, noise τ = 1"
    assert circle_title([5.0], [1.0], 0.0) == "tokens on the circle: β = 5, K = 1, no noise (τ = 0)"
    fig = space_depth_figure(ts, np.roll(dens, n // 2, axis=1), h)  # the cluster at π: [0, 2π) as before
    assert fig.axes[0].get_ylim() == pytest.approx((0.0, 2 * np.pi))


def test_a_branch_that_stopped_early_ends_in_a_mark_with_its_reason():
    """A continuation branch that ended before its range (max_points, a failed Newton step, the CPU budget) just
    ended, like one that reached the range's end; now its last point is marked and the reason written beside it."""
    from mfpde.plot_continuation import bifurcation_figure, stop_label

    def branch(origin, K, stopped, early):
        return {"origin": origin, "parameter": K, "amplitude": [0.1 * k for k in range(len(K))],
                "stable": [True] * len(K), "stopped": stopped, "early": early}

    report = {"domain": "circle", "beta": 3.0, "noise": 1.0, "bifurcations": [], "branches": [
        branch("uniform", [0.8, 1.4, 2.0], "K reached the end 2 of the range", False),
        branch("mode 1", [1.3, 1.2, 1.1], "Newton failed at step size 1e-06 < continuation.step_min after K = 1.1",
               True),
        branch("mode 2", [1.6, 1.5], "continuation.max_points = 2 reached", False)]}
    assert [stop_label(b) for b in report["branches"]] == [None, "Newton failed", "continuation.max_points reached"]
    fig = bifurcation_figure(report)
    ax = fig.axes[0]
    marks = [ln for ln in ax.get_lines() if ln.get_gid() == "stopped"]
    assert [(float(ln.get_xdata()[0]), float(ln.get_ydata()[0])) for ln in marks] == [(1.1, pytest.approx(0.2)),
                                                                                        (1.5, 0.1)]
    texts = sorted(t.get_text() for t in ax.texts)
    assert texts == ["stopped: Newton failed", "stopped: continuation.max_points reached"]
    assert "branch stopped early (reason beside it)" in [t.get_text() for t in ax.get_legend().get_texts()]
    # the legend below the axis, off the branches; the y label says whose amplitude it is
    r = _renderer(fig)
    assert ax.get_legend().get_window_extent(r).y1 < ax.get_window_extent(r).y0
    assert "own-mode amplitude" in ax.get_ylabel()


def test_legend_below_covers_no_curve_and_tick_labels_do_not_overlap():
    """The digits demo's legends ("lower left", "lower right") lay over the risk and accuracy curves, and the MPI
    demo's category ticks (free_energy, neg_entropy, ...) ran into each other; the helpers the demos now use put one
    legend below the panel, outside its data area, and rotate tick labels that overlap."""
    from mfpde.plot_layout import legend_below, spread_tick_labels

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    s = np.linspace(0.0, 300.0, 16)
    ax.semilogy(s, 0.45 + 0.3 * np.exp(-s / 5), label="risk R(ρ_s)")
    ax.semilogy(s, 0.455 + 0.3 * np.exp(-s / 5), label="free energy")
    tw = ax.twinx()
    tw.plot(s, np.full(16, 0.7), "g--", label="train accuracy")
    tw.legend(loc="lower right")
    leg = legend_below(ax, tw)
    keys = ["risk", "free_energy", "neg_entropy", "mass_rho", "grad_norm", "kl_gibbs", "final"]
    bx.semilogy(keys, np.full(len(keys), 1e-17), "o")
    r = fig.canvas.get_renderer()
    flat = [t.get_window_extent(r) for t in bx.get_xticklabels() if t.get_text()]
    assert any(a.overlaps(b) for i, a in enumerate(flat) for b in flat[i + 1:])  # the demo's overlap
    angle = spread_tick_labels(bx)
    fig.tight_layout()
    assert tw.get_legend() is None and len(leg.get_texts()) == 3
    assert not leg.get_window_extent(r).overlaps(ax.get_window_extent(r))  # outside the panel's data area
    ticks = [t for t in bx.get_xticklabels() if t.get_text()]
    assert len(ticks) == len(keys) and {t.get_rotation() for t in ticks} == {angle} and angle > 0
    x = np.sort([bx.transData.transform((k, 1e-17))[0] for k in range(len(keys))])
    height = max(b.height for b in flat)  # a flat label's height
    assert np.diff(x).min() * np.sin(np.radians(angle)) >= height  # parallel rotated labels: apart by Δx sin θ
    short = plt.figure().add_subplot()
    short.plot(["a", "b"], [1, 2])
    assert spread_tick_labels(short) == 0.0  # short labels stay flat
    plt.close("all")
