"""The flow-map solver on the circle (theory §9) against references it does not produce: the independent particle
code's pairwise force, finite differences, the closed-form growth rates and CDF, the Eulerian DG solver, the
two-Dirac ODE; and as ``mfpde transport``'s ``tokens.solver = "flow"``: config, report, CLI, Python API."""

from __future__ import annotations

import json
import math
import subprocess
import sys

from mpi4py import MPI

import numpy as np
import pytest

from mfpde import config as C
from mfpde.tokens.circle.diag import clusters_cdf, w1_circle
from mfpde.tokens.circle.flow import (
    CDF_POINTS,
    FlowMap,
    FourierForce,
    cdf_from_map,
    cdf_linear,
    cdf_local_hermite,
    cluster_masses,
    modes_cdf,
    modes_labels,
    noise_labels,
    series_length,
)
from mfpde.tokens.circle.particles import dense_velocity, dense_velocity_derivative
from mfpde.tokens.resolution import merge_times
from mfpde.verify.circle import gamma_k
from mfpde.verify.circle_flow import flow_rates, two_cluster_merge

EPS = 2.0**-52
DEMO = "demos/circle.toml"
MODES = [[1, 2e-4, 0.0], [2, 1e-4, 1.3], [3, 1e-4, 1.0], [4, 1e-4, 2.5], [5, 5e-5, 2.0]]
ANGLES = 2 * math.pi * np.arange(CDF_POINTS) / CDF_POINTS


@pytest.mark.parametrize("attention", ["unnormalised", "softmax"])
@pytest.mark.parametrize("beta", [0.0, 0.5, 5.0, 12.0])
def test_series_force_equals_the_pairwise_sum(attention, beta):
    """Series cut below round-off: |series − direct| ≤ 64 K ε Σ|a_k| (K terms, each rounded)."""
    X = np.sort(np.random.default_rng(1).uniform(0, 2 * math.pi, 150))
    f = FourierForce(np.array([beta]), np.array([1.0]), attention, len(X))
    err = np.max(np.abs(f.velocity(X) - dense_velocity(X, beta, attention == "softmax")))
    assert err <= 64 * f.K * EPS * np.abs(f.A[:, 0]).sum()


def test_a_mixture_of_heads_is_the_weighted_sum():
    X = np.sort(np.random.default_rng(2).uniform(0, 2 * math.pi, 60))
    for att in ("unnormalised", "softmax"):
        for b in ([3.0, 7.0], [0.0, 7.0]):  # β = 0: Z ≡ 1, the k = 1 sine alone
            f = FourierForce(np.array(b), np.array([0.3, 0.7]), att, len(X))
            ref = 0.3 * dense_velocity(X, b[0], att == "softmax") + 0.7 * dense_velocity(X, b[1], att == "softmax")
            assert np.max(np.abs(f.velocity(X) - ref)) < 1e-12 * np.max(np.abs(ref))
            J, eye, h = f.jacobian(X), np.eye(len(X)), 1e-6  # central differences: 1e-8 of the scale
            Jn = np.array([(f.velocity(X + h * e) - f.velocity(X - h * e)) / (2 * h) for e in eye]).T
            assert np.max(np.abs(J - Jn)) < 1e-8 * np.max(np.abs(J))
            _, du = f.field(X, derivative=True)  # u' against the pairwise sum of the derivative
            dref = 0.3 * dense_velocity_derivative(X, b[0], att == "softmax") + 0.7 * dense_velocity_derivative(
                X, b[1], att == "softmax")
            assert np.max(np.abs(du - dref)) < 1e-12 * np.max(np.abs(dref))


def test_series_length_from_the_bessel_decay():
    import scipy.special

    for b in (1.0, 5.0, 20.0):
        K = series_length(b)
        assert scipy.special.ive(K, b) < 1e-17 * scipy.special.ive(0, b) <= scipy.special.ive(K - 1, b)


@pytest.mark.parametrize("attention", ["unnormalised", "softmax"])
def test_field_derivative_and_jacobian_against_finite_differences(attention):
    """Central differences of step 1e-6: truncation 1e-12 |u'''|, round-off ε|u|/1e-6: 1e-8 of the scale."""
    M, h = 40, 1e-6
    X = np.sort(np.random.default_rng(4).uniform(0, 2 * math.pi, M))
    f = FourierForce(np.array([5.0]), np.array([1.0]), attention, M)
    J, eye = f.jacobian(X), np.eye(M)
    Jn = np.array([(f.velocity(X + h * eye[k]) - f.velocity(X - h * eye[k])) / (2 * h) for k in range(M)]).T
    assert np.max(np.abs(J - Jn)) < 1e-8 * np.max(np.abs(J))
    # u'(θ) at the labels (the labels fixed), against the independent pairwise sum of the derivative
    _, du = f.field(X, derivative=True)
    ref = dense_velocity_derivative(X, 5.0, attention == "softmax")
    assert np.max(np.abs(du - ref)) < 1e-12 * np.max(np.abs(ref))


def test_quantile_labels_are_the_quantiles():
    L = modes_labels([[2, 0.6, 0.4], [1, 0.2, 1.0]], 50)
    v = (np.arange(50) + 0.5) / 50
    assert np.max(np.abs(modes_cdf([[2, 0.6, 0.4], [1, 0.2, 1.0]])(L.X0) - v)) < 1e-14
    cells = np.random.default_rng(0).uniform(0.5, 1.5, 16)
    cells /= cells.sum() * 2 * math.pi / 16
    N = noise_labels(cells, 64)
    F = np.concatenate([[0.0], np.cumsum(cells * 2 * math.pi / 16)])
    assert np.max(np.abs(np.interp(N.X0, np.arange(17) * 2 * math.pi / 16, F) - v.repeat(1)[:0].sum() -
                         (np.arange(64) + 0.5) / 64)) < 1e-14
    assert not N.smooth and L.smooth


def test_hermite_reconstruction_of_the_initial_data_is_spectral():
    """At t = 0 the map is the closed-form quantile map: the reconstructed CDF against F_0 (no dynamics)."""
    modes = [[2, 0.3, 0.0], [1, 0.05, 0.4]]
    F0 = modes_cdf(modes)(ANGLES)
    errs = []
    for M in (16, 32, 64):
        L = modes_labels(modes, M)
        got = cdf_from_map(L.X0, L.L0)
        assert got is not None
        errs.append(w1_circle(got[0], F0))
    lin = w1_circle(cdf_linear(modes_labels(modes, 64).X0), F0)
    assert errs[-1] < 1e-12 and errs[1] < 1e-3 * errs[0] and lin > 1e4 * errs[-1]


def test_local_hermite_reconstruction_is_fourth_order_and_monotone():
    """At t = 0 against the closed-form F_0: the piecewise-cubic map with exact derivatives converges at order 4
    (linear: 2); on a staircase map (two collapsed clusters) it stays increasing: the bin masses are ≥ 0."""
    modes = [[2, 0.3, 0.0], [1, 0.05, 0.4]]
    F0 = modes_cdf(modes)(ANGLES)
    Ms = [16, 32, 64]
    errs = [w1_circle(cdf_local_hermite(L.X0, L.L0), F0) for L in (modes_labels(modes, M) for M in Ms)]
    q = np.polyfit(np.log(Ms), np.log(errs), 1)[0]
    assert abs(q + 4) < 0.3, (q, errs)
    X = np.concatenate([np.full(8, 1.0), np.linspace(1.2, 4.0, 4), np.full(8, 4.2)]) + 1e-9 * np.arange(20)
    F = cdf_local_hermite(X, np.log(np.full(20, 1e-6)))
    assert np.all(np.diff(np.concatenate([F, [F[0] + 1.0]])) >= -1e-15)


def test_cubic_inversion_converges_to_roundoff_on_a_steep_map():
    """The CDF is the inverse of a cubic Hermite map: on coarse cells of a steep map (X' from 0.6 to 12) x(F(θ)) = θ to
    round-off, the cubic evaluated independently in the Hermite basis (three Newton steps left 2e-11 here)."""
    from mfpde.tokens.circle.map import _invert

    U = 12
    v = np.arange(U) / U
    X, D = 2 * math.pi * v + 0.9 * np.sin(2 * math.pi * v), 2 * math.pi * (1 + 0.9 * np.cos(2 * math.pi * v))
    theta = np.linspace(0.0, 2 * math.pi, 997, endpoint=False)
    F = _invert(X, D, 0.0, theta)
    i = np.floor(F * U).astype(int)
    s = F * U - i
    xa, xb = X[i % U] + 2 * math.pi * (i // U), X[(i + 1) % U] + 2 * math.pi * ((i + 1) // U)
    da, db = D[i % U] / U, D[(i + 1) % U] / U
    x = ((2 * s**3 - 3 * s**2 + 1) * xa + (s**3 - 2 * s**2 + s) * da + (3 * s**2 - 2 * s**3) * xb
         + (s**3 - s**2) * db)
    assert np.max(np.abs(x - theta)) < 64 * EPS * 2 * math.pi


@pytest.mark.parametrize("attention", ["unnormalised", "softmax"])
@pytest.mark.parametrize(("beta", "c"), [([9.0], [0.7]), ([3.0, 7.0], [0.3, 0.7])])
def test_right_hand_side_of_the_map_and_its_derivative(attention, beta, c):
    """d(X, L)/dt = (u(X), u'(X)) against the independent pairwise sums (one head: its own fused path)."""
    X = np.sort(np.random.default_rng(5).uniform(0, 2 * math.pi, 70))
    f = FourierForce(np.array(beta), np.array(c), attention, len(X))
    got = f.rhs(0.0, np.concatenate([X, np.zeros(len(X))]))
    sa = attention == "softmax"
    u = sum(ch * dense_velocity(X, b, sa) for b, ch in zip(beta, c, strict=True))
    du = sum(ch * dense_velocity_derivative(X, b, sa) for b, ch in zip(beta, c, strict=True))
    assert np.max(np.abs(got[:70] - u)) < 1e-12 * np.max(np.abs(u))
    assert np.max(np.abs(got[70:] - du)) < 1e-12 * np.max(np.abs(du))


def test_step_control_on_the_positions_alone_and_uniform_around_the_circle():
    """``controlled``: components past it ride along (a wild one changes no step); ``absolute``: the error scale is
    atol alone, so a rotation of every angle by 100 changes no step (it does with the relative scale)."""
    from mfpde.tokens.adaptive import DOP853PI

    def times(fun, y0, **kw):
        s = DOP853PI(fun, 0.0, np.asarray(y0, float), 5.0, rtol=1e-6, atol=1e-6, first_step=0.1, **kw)
        out = []
        while s.status == "running":
            s.step()
            out.append(s.t)
        return out

    def pair(_t, y):
        return np.array([np.sin(y[0]) - 0.3 * y[0], 50 * np.cos(40 * _t)])

    def one(_t, y):
        return np.array([np.sin(y[0]) - 0.3 * y[0]])

    def same(a, b, rtol=1e-9):  # the same steps, up to rounding (of the sums; of angles near 100: 1e-4)
        return len(a) == len(b) and np.allclose(a, b, rtol=rtol, atol=0)

    assert same(times(pair, [1.0, 0.0], controlled=1), times(one, [1.0]))
    assert len(times(pair, [1.0, 0.0])) > len(times(one, [1.0]))  # the wild component drives the steps otherwise
    assert same(times(lambda t, y: np.cos(y + t), [1.0, 2.0], absolute=True),
                times(lambda t, y: np.cos(y - 100.0 + t), [101.0, 102.0], absolute=True), rtol=1e-4)
    assert not same(times(lambda t, y: np.cos(y + t), [1.0, 2.0]),
                    times(lambda t, y: np.cos(y - 100.0 + t), [101.0, 102.0]), rtol=1e-4)
    # f(t + h, y_new) is evaluated once a step is accepted: the error estimate never reads its (stale) row
    s = DOP853PI(one, 0.0, np.array([1.0]), 5.0, rtol=1e-6, atol=1e-6)
    s.K[-1] = np.nan
    assert s.step() is None and s.status == "running" and np.isfinite(s.y).all() and np.isfinite(s.K[-1]).all()


@pytest.mark.parametrize("attention", ["unnormalised", "softmax"])
def test_growth_rates_against_bessel(attention):
    """Modes 1..8 from ±1e-6 (odd part): spectral quadrature, so within 1e-6 of max γ at M = 48."""
    ex = gamma_k(np.arange(1, 9), 5.0, attention)
    assert np.max(np.abs(flow_rates(48, 5.0, attention) - ex)) / ex.max() < 1e-6


def test_w1_against_the_dg_solver_converges_spectrally():
    """USA β = 5, t = 0.5 (clusters forming): W1 to DG2 (n = 256, an eighth of the default cap; its own error ≈ 2e-7)
    falls faster than order 6 from M = 32 to 48 (a local reconstruction here is of order 2 or 4)."""
    from mfpde.verify.circle_flow import _dg_cdf

    ref = _dg_cdf(256)
    errs = [w1_circle(FlowMap(modes_labels(MODES, M), np.array([5.0]), np.array([1.0]), "unnormalised")
                      .solve(np.array([0.5]), 1e-12).cdf[-1], ref) for M in (32, 48)]
    assert errs[1] / errs[0] < (32 / 48) ** 6 and errs[1] > 2e-6  # above 10× the reference's error


def test_merge_time_and_gap_against_the_two_dirac_ode_with_the_stiff_switch():
    t_flow, t_red, stats, (gap, bound, _) = two_cluster_merge(5.0)
    assert t_red <= t_flow * (1 + 1e-9) <= t_red * 10 ** (1 / 20)
    assert stats["switch_t"] is not None and stats["stiff_steps"] > 0 and stats["njev"] > 0
    assert gap <= bound  # the outputs inside the stiff steps, to the integrators' tolerances


def test_a_failed_stiff_solve_keeps_the_last_good_output():
    from mfpde.errors import NumericalError

    fm = FlowMap(modes_labels([[2, 0.3, 0.0], [1, 0.05, 0.4]], 32), np.array([5.0]), np.array([1.0]), "softmax")
    fm.force.jacobian = lambda X: np.full((len(X), len(X)), np.nan)  # the stiff phase cannot step
    with pytest.raises(NumericalError) as e:
        fm.solve(np.logspace(-2, 9, 45), 1e-8)
    part = e.value.partial
    assert part is not None and 0 < len(part.t) < 45 and np.all(np.isfinite(part.cdf))
    assert "stiff integrator" in str(e.value)


def test_the_stiff_phase_agrees_with_the_explicit_solve_between_its_steps(monkeypatch):
    """USA β = 5 switches to LSODA at t ≈ 1.38; at outputs inside its steps (5 outputs, 29 steps to t = 2.5) the
    positions agree with DOP853 alone (switch disabled) to 100 rtol (measured 1.4e-9 at rtol 1e-10; the state at the
    end of the step that reaches an output instead of its dense output there is off by 2e-5)."""
    import mfpde.tokens.circle.flow as F

    ts = np.linspace(1.5, 2.5, 5)

    def solve():
        return FlowMap(modes_labels([[2, 0.3, 0.0], [1, 0.05, 0.4]], 32), np.array([5.0]), np.array([1.0]),
                       "unnormalised").solve(ts, 1e-10)

    r = solve()
    assert r.stats["switch_t"] is not None and r.stats["switch_t"] < ts[0] and r.stats["stiff_steps"] > 10
    monkeypatch.setattr(F, "SWITCH_STEPS", 10**9)
    q = solve()
    assert q.stats["switch_t"] is None
    assert np.max(np.abs(r.X - q.X)) < 100 * 1e-10


def test_the_deadline_stops_the_stiff_phase(monkeypatch):
    """A CPU deadline already past when the solve hands over to LSODA stops the stiff phase after its first step
    (the explicit phase is given no deadline here), the outputs reached kept."""
    import mfpde.tokens.circle.flow as F
    from mfpde.errors import NumericalError

    explicit = F.explicit_phase
    monkeypatch.setattr(F, "explicit_phase", lambda *a: explicit(*a[:8], math.inf, *a[9:]))
    fm = FlowMap(modes_labels([[2, 0.3, 0.0], [1, 0.05, 0.4]], 32), np.array([5.0]), np.array([1.0]), "softmax")
    with pytest.raises(NumericalError, match="flow map: CPU-time budget exceeded at t = ") as e:
        fm.solve(np.logspace(-2, 9, 45), 1e-8, deadline=0.0)
    part = e.value.partial
    assert part.stats["switch_t"] is not None and part.stats["stiff_steps"] == 1
    assert 0 < len(part.t) < 45 and part.t[-1] <= part.stats["switch_t"] * 10 ** (11 / 44) and part.X.shape[1] == 32
    F = np.zeros(CDF_POINTS)
    F[100:] += 0.5  # two point masses, at bins 99 and 699
    F[700:] += 0.5
    n, ang = clusters_cdf(F)
    assert n == 2 and ang == pytest.approx([99.5 * 2 * math.pi / CDF_POINTS, 699.5 * 2 * math.pi / CDF_POINTS])
    assert clusters_cdf(ANGLES / (2 * math.pi))[0] == 0
    # one peak whose flank dips below the threshold for 3 bins is one cluster; two peaks 0.5 rad apart are two
    dens = np.ones(CDF_POINTS)
    dens[300:340] = dens[343:360] = 10.0
    dens[600:620] = 10.0
    G = np.concatenate([[0.0], np.cumsum(dens)[:-1]]) / dens.sum()
    assert clusters_cdf(G)[0] == 2
    dens[1000:1024] = dens[0:10] = 10.0  # a third, across θ = 0
    G = np.concatenate([[0.0], np.cumsum(dens)[:-1]]) / dens.sum()
    n3, a3 = clusters_cdf(G)
    assert n3 == 3 and any(abs(math.remainder(a - 1017 * 2 * math.pi / CDF_POINTS, 2 * math.pi)) < 0.01 for a in a3)
    assert merge_times(np.array([1.0, 2.0, 3.0, 4.0]), [0, 2, 2, 1]) == [4.0]


def test_cluster_masses_across_the_cut():
    X = np.array([0.1, 0.11, 0.12, 2.0, 2.01, 6.2, 6.25])
    assert sorted(cluster_masses(X, np.ones(7), 0.2)) == [2.0, 5.0]
    assert cluster_masses(X, np.ones(7), 10.0).tolist() == [7.0]


# -- as a solver of mfpde transport ---------------------------------------------------------------------------------


@pytest.mark.parametrize("override,key", [
    ("tokens.solver='fem'", "tokens.solver"), ("tokens.labels=4", "tokens.labels"),
    ("tokens.labels=100000", "tokens.labels"), ("tokens.rtol=0.5", "tokens.rtol"), ("tokens.rtol=1e-13", "tokens.rtol"),
    ("depth.T=1e11", "depth.T"), ("data.modes=[[1, 1.0, 0.0]]", "data.modes"), ("tokens.beta=800.0", "tokens.beta"),
    ("depth.steps=10000000", "depth.steps"),
    ("depth.spacing='cubic'", "depth.spacing"), ("depth.decades=0", "depth.decades"),
    ("tokens.beta=-1.0", "tokens.beta"),
    ("heads.init={kind='diracs', points=[[4.0, 1.0]], weights=[1.0]}\ntokens.beta=3.0", "tokens.beta")])
def test_bad_flow_config_names_the_key(override, key):
    over = [*override.split("\n"), "tokens.solver='flow'"] if key != "tokens.solver" else [override]
    if key == "depth.decades":
        over.append("depth.spacing='log'")
    with pytest.raises(C.ConfigError, match=key):  # heads.init and tokens.beta both by --set: two sources of β
        C.load(DEMO, over)


def test_flow_on_a_box_is_refused():
    with pytest.raises(C.ConfigError, match="tokens.solver"):
        C.load("demos/transport_small.toml", ["tokens.solver='flow'"])


def test_beta_shortcut_is_the_single_head(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[tokens]\ndomain = "circle"\ncells = [64]\nbeta = 7.5\n[data]\nkind = "circle_modes"\n'
                    'modes = [[1, 1e-3, 0.0]]\n')
    cfg = C.load(str(path))
    assert cfg.heads.init == {"kind": "diracs", "points": [[7.5, 1.0]], "weights": [1.0]}
    from mfpde.config.keys import to_toml

    assert "beta" not in to_toml(cfg).split("[heads]")[0]  # written once, as heads.init: the file loads back


@pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="serial")
def test_transport_flow_report_and_both_solvers_agree(tmp_path):
    """The demo by both solvers before collapse (t = 0.5): report keys, W1 between their CDFs below DG2's own error
    bound at n = 256 plus the flow map's at M = 128; log spacing reaching t = 1e9 with the merge recorded."""
    import mfpde

    over = ["depth.T=0.5", "depth.steps=10", "output.every=5"]
    flow = mfpde.transport(C.load(DEMO, over + ["tokens.solver='flow'"])).report
    dg = mfpde.transport(C.load(DEMO, over)).report
    for s in (flow, dg):
        assert len(s["cdf_T"]) == 1024 and s["t"] == pytest.approx([0.0, 0.25, 0.5]) and s["solve_cpu_s"] > 0
        assert len(s["clusters_t"]) == 3 and s["merge_times"] == []
    assert flow["solver"] == "flow" and flow["reconstruction_T"] == "hermite" and flow["integrator"]["switch_t"] is None
    # DG's own depth error at its default step cap (Richardson against half the cap, SSP-RK3: order 3), with a
    # factor 2 for the estimate; the flow map's error at M = 128 is far below (spectral: 1e-7 at M = 64)
    from mfpde.heads import HeadMeasure
    from mfpde.tokens.circle.dg import GROWTH_CAP, CircleMesh, CircleTransport, linear_rate_bound
    from mfpde.tokens.circle.diag import cdf_at, initial_density

    cfg = C.load(DEMO, over)
    mesh, heads = CircleMesh(cfg.tokens.cells[0], cfg.tokens.degree), HeadMeasure(np.array([5.0]), np.array([1.0]))
    cap = GROWTH_CAP / linear_rate_bound(heads.a, heads.c, "unnormalised")
    half = CircleTransport(mesh, "unnormalised", max_dt=cap / 2).solve(
        initial_density(mesh, "circle_modes", cfg.data.modes), heads, 0.5, 10).mu_T
    e_dg = w1_circle(np.array(dg["cdf_T"]), cdf_at(mesh, half, ANGLES)) * 8 / 7
    assert w1_circle(np.array(flow["cdf_T"]), np.array(dg["cdf_T"])) <= 2 * e_dg
    from mfpde.jobs.transport import transport_job

    cfg = C.load(DEMO, ["tokens.solver='flow'", "tokens.labels=48", "depth.T=1e9", "depth.spacing='log'",
                        "depth.decades=10", "depth.steps=200", "output.every=1", "tokens.attention='softmax'",
                        "data.modes=[[2, 0.3, 0.0], [1, 0.05, 0.4]]", "output.fields=false"])
    s = transport_job(cfg, tmp_path / "long")["samples"][0]
    assert s["t"][1] == pytest.approx(0.1) and s["t"][-1] == pytest.approx(1e9) and s["clusters_T"] == 1
    assert len(s["merge_times"]) == 1 and 1e4 < s["merge_times"][0] < 1e5  # SA β = 5: 3.16e4 (docs/circle.md)
    assert s["integrator"]["switch_t"] is not None
    rep = json.loads((tmp_path / "long" / "report.json").read_text())
    assert rep["samples"][0]["merge_times"] == s["merge_times"]


@pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="runs the CLI in a subprocess")
def test_cli_flow_writes_fields_and_picture(tmp_path):
    r = subprocess.run([sys.executable, "-m", "mfpde", "transport", DEMO, "--out", str(tmp_path / "o"), "--set",
                        "tokens.solver='flow'", "--set", "depth.T=0.6", "--set", "depth.steps=12"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    from mfpde.io import read_vtx

    f = read_vtx(tmp_path / "o" / "fields" / "mu_0.bp")
    assert len(f.times) == 4 and f.integral(3) == pytest.approx(1.0, abs=1e-9)
    assert (tmp_path / "o" / "plots" / "space_depth_0.png").stat().st_size > 1000
