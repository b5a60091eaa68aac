"""Tokens on the circle (theory §9): the solver against closed forms and an independent particle code.

References the code does not produce: the Bessel-function growth rates γ_k (scipy.special.iv), the pairwise
particle force (a direct sum), W1 of a point mass to the uniform measure (π/2), the Fourier coefficients of
the sampled closed-form density, round-off bounds for the mass, and the DOLFINx field's own integral.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

from mpi4py import MPI

import numpy as np
import pytest

from mfpde import config as C
from mfpde.heads import HeadMeasure
from mfpde.tokens.circle.dg import CircleMesh, CircleTransport
from mfpde.tokens.circle.diag import cdf_density, cdf_points, clusters, fourier, initial_density, w1_circle
from mfpde.tokens.circle.particles import bessel_velocity, dense_velocity, sample_modes, transport_particles
from mfpde.verify.circle import fitted_rates, gamma_k

pytestmark = pytest.mark.ranks  # the rank count can change what it checks: run again under mpiexec

DEMO = "demos/circle.toml"
EPS = 2.0**-52


@pytest.mark.parametrize("attention", ["unnormalised", "softmax"])
def test_growth_rates_against_bessel(attention):
    """DG1 on 64 cells: the rates of modes 1..12 within 1e-4 of max γ (measured 3.4e-5); DG2 at 1e-6."""
    k = np.arange(1, 13)
    ex = gamma_k(k, 5.0, attention)
    assert np.max(np.abs(fitted_rates(64, 1, 5.0, attention) - ex)) / ex.max() < 1e-4
    assert np.max(np.abs(fitted_rates(64, 2, 5.0, attention) - ex)) / ex.max() < 1e-6


def test_growth_rate_order_dg0():
    """DG0 (upwind finite volumes): the rate error falls at order 2 = 2(p+1) in h."""
    from mfpde.fitting import fit_order

    k = np.arange(1, 13)
    ex = gamma_k(k, 5.0, "unnormalised")
    ns = [64, 128]
    errs = [np.max(np.abs(fitted_rates(n, 0, 5.0, "unnormalised") - ex)) for n in ns]
    assert abs(fit_order([2 * math.pi / n for n in ns], errs) - 2.0) < 0.2


@pytest.mark.parametrize("softmax", [False, True])
def test_bessel_force_equals_the_pairwise_sum(softmax):
    th = np.random.default_rng(0).uniform(0, 2 * np.pi, 300)
    a, b = bessel_velocity(th, 5.0, softmax), dense_velocity(th, 5.0, softmax)
    assert np.max(np.abs(a - b)) < 1e-12 * max(1.0, np.max(np.abs(b)))


def test_pde_velocity_equals_the_particle_force_of_its_quadrature():
    """The FFT velocity at the nodes = the pairwise sum over the Gauss quadrature points of μ_h (weights w h μ)."""
    mesh = CircleMesh(24, 2)
    mu = initial_density(mesh, "circle_modes", [[1, 0.4, 0.3], [3, 0.2, 1.0]])
    for att in ("unnormalised", "softmax"):
        un, ue, _ = CircleTransport(mesh, att).velocity(mu, HeadMeasure(np.array([4.0]), np.array([1.0])))
        x, w = mesh.nodes.ravel(), mesh.weights(mu).ravel()
        d = x[None, :] - x[:, None]
        e = np.exp(4.0 * np.cos(d))
        ref = (e * np.sin(d)) @ w / (e @ w if att == "softmax" else 1.0)
        assert np.max(np.abs(un.ravel() - ref)) < 1e-12 * np.max(np.abs(ref))


def test_mass_and_positivity_through_clustering():
    mesh = CircleMesh(96, 1)
    op = CircleTransport(mesh, "unnormalised")
    mu = initial_density(mesh, "circle_noise", amplitude=0.1, seed=1)
    rep = op.solve(mu, HeadMeasure(np.array([5.0]), np.array([1.0])), 1.0, 10)
    assert rep.limited_cells > 0  # the limiter was needed
    assert rep.mass_error <= 8 * mesh.n * 2 * EPS * rep.substeps
    assert rep.min_density >= -8 * EPS * rep.mu_T.max()
    assert clusters(mesh, rep.mu_T)[0] >= 1


def test_w1_of_a_point_mass_to_uniform():
    M = 2**14
    uniform = (np.arange(M) + 0.5) / M
    assert w1_circle(cdf_points(np.array([1.0]), M), uniform) == pytest.approx(math.pi / 2, abs=4 * math.pi / M)
    mesh = CircleMesh(64, 2)
    mu = initial_density(mesh, "circle_modes", [[1, 0.0, 0.0]])
    assert w1_circle(cdf_density(mesh, mu, M), uniform) < 1e-12


def test_sampled_modes_have_the_fourier_coefficients():
    """|μ̂_k| = a/2 for the density (1/2π)(1 + a cos(k(θ − φ))), sampled and on the mesh."""
    modes = [[2, 0.6, 0.4]]
    th = sample_modes(200_000, modes, np.random.default_rng(3))
    assert abs(np.abs(np.exp(-2j * th).mean()) - 0.3) < 4 / math.sqrt(200_000)
    mesh = CircleMesh(64, 1)
    assert fourier(mesh, initial_density(mesh, "circle_modes", modes), 3) == pytest.approx([0, 0.3, 0], abs=1e-6)


@pytest.mark.parametrize("override,key", [
    ("tokens.attention=\"sigmoid\"", "tokens.attention"), ("tokens.cells=[4]", "tokens.cells"),
    ("data.kind=\"gaussian\"", "data.kind"), ("data.modes=[[1.5, 0.1, 0.0]]", "data.modes[0]"),
    ("data.modes=[[1, 0.7, 0.0], [2, 0.6, 0.0]]", "data.modes"), ("tokens.domain=\"torus\"", "tokens.domain"),
    ("heads.family=\"value\"", "heads.family"), ("tokens.degree=9", "tokens.degree")])
def test_bad_circle_config_is_one_line(override, key):
    with pytest.raises(C.ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        C.load(DEMO, [override])


def test_circle_config_errors_all_at_once():
    """Independent circle errors are reported together, each once (the box's cells rule is not applied too)."""
    with pytest.raises(C.ConfigErrors) as e:
        C.load(DEMO, ["tokens.degree=7", "tokens.attention='x'", "data.modes=[[1e20, 1e-4, 0.0]]"])
    keys = [m.split(":")[0] for m in e.value.messages]
    assert sorted(keys) == ["data.modes[0]", "tokens.attention", "tokens.degree"], e.value.messages
    with pytest.raises(C.ConfigError) as one:
        C.load(DEMO, ["tokens.cells=[0]"])
    assert not isinstance(one.value, C.ConfigErrors) and "on the circle" in str(one.value)


def test_circle_data_on_a_box_is_refused():
    with pytest.raises(C.ConfigError, match="data.kind"):
        C.load("demos/transport_small.toml", ["data.kind=\"circle_noise\""])


@pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="runs the CLI in a subprocess")
def test_cli_exit_2_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "mfpde", "transport", DEMO, "--out", str(tmp_path / "o"),
                        "--set", "tokens.attention=\"x\""], capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "tokens.attention" in r.stderr


@pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="serial")
def test_transport_job_on_the_circle(tmp_path):
    """The demo at a shorter depth: report keys, K = 32 modes at every output, 3 clusters (k_max(5) = 3), the
    field's integral over the polygon (chords 2 sin(h/2)) equal to the mass, and the space–depth picture."""
    from mfpde.io import read_vtx
    from mfpde.jobs.transport import transport_job

    cfg = C.load(DEMO, ["tokens.degree=1", "depth.T=1.5", "depth.steps=30", "output.every=10"])
    rep = transport_job(cfg, tmp_path)
    s = rep["samples"][0]
    assert json.loads((tmp_path / "report.json").read_text())["samples"][0]["clusters_T"] == s["clusters_T"] == 3
    assert s["fourier"]["k"] == list(range(1, 33)) and s["fourier"]["t"] == pytest.approx([0, 0.5, 1.0, 1.5])
    assert len(s["fourier"]["abs"]) == 4 and all(len(a) == 32 for a in s["fourier"]["abs"])
    assert s["mass_error"] < 1e-12 and s["min_density"] > -1e-13 and 0 < s["w1_uniform_T"] < math.pi / 2
    angles = np.array(s["cluster_angles_T"])
    assert np.allclose(np.diff(np.concatenate([angles, [angles[0] + 2 * math.pi]])), 2 * math.pi / 3, atol=0.3)
    f = read_vtx(tmp_path / "fields" / "mu_0.bp")
    n = cfg.tokens.cells[0]
    h = 2 * math.pi / n
    x, c, v = f.points[3][:, :2], f.cells[3], f.values[3]
    chords = np.linalg.norm(x[c[:, 1]] - x[c[:, 0]], axis=1)  # 2 sin(h/2); read_vtx's integral takes |Δx_1|
    assert len(f.times) == 4 and len(c) == n and chords == pytest.approx(2 * math.sin(h / 2))
    assert chords @ v[c].mean(axis=1) * h / (2 * math.sin(h / 2)) == pytest.approx(1.0, abs=1e-9)
    assert (tmp_path / "plots" / "space_depth_0.png").stat().st_size > 1000


@pytest.mark.parametrize("p", [0, 1, 2, 3, 5])
def test_cell_minima_are_the_exact_minima(p):
    """The exact minimum of each cell's polynomial: never above a dense sample (to round-off), and within the
    dense sample's own error (the minimum's curvature × half the spacing², ≤ max|μ''| (1e-4)²/8) below it."""
    from mfpde.verify.circle import dense_minimum

    mesh = CircleMesh(40, p)
    mu = np.random.default_rng(p).normal(size=(40, p + 1))
    ex = mesh.cell_minima(mu)
    dense = mesh.evaluate(mu, np.linspace(0.0, 1.0, 10_001)).min(axis=1)
    assert np.all(ex <= dense + 1e-12 * np.abs(mu).max())
    assert np.all(dense - ex <= 1e-6 * np.abs(mu).max())
    assert dense_minimum(mu, 10_001) == pytest.approx(dense.min(), abs=1e-12 * np.abs(mu).max())


@pytest.mark.parametrize("p,att", [(0, "unnormalised"), (1, "softmax"), (2, "unnormalised"), (4, "softmax")])
def test_substeps_follow_the_independent_cfl_rule(p, att):
    """The sub-step count of a depth step at a clustered state = verify's CFL rule (direct sums, closed-form Λ)."""
    from mfpde.tokens import rk
    from mfpde.tokens.circle.dg import DEPTH_BALANCE, GROWTH_CAP
    from mfpde.verify.circle import cfl_substeps

    mesh = CircleMesh(48, p)
    op = CircleTransport(mesh, att)
    mu = initial_density(mesh, "circle_modes", [[2, 0.8, 0.3], [3, 0.15, 1.0]])
    heads = HeadMeasure(np.array([6.0]), np.array([1.0]))
    for dt in (0.01, 0.3):
        need, _ = cfl_substeps(mu, 6.0, att, dt, op.cfl, GROWTH_CAP, DEPTH_BALANCE)
        _, _, ns = rk.depth_step(rk.SSP_RK3, op, mu, dt, heads, 0, 0.0)
        assert int(ns[0]) in {need * 2**j for j in range(4)} and int(ns[0]) >= need


def test_w1_of_two_point_clouds_against_an_optimal_assignment():
    """W1 on the circle between two asymmetric clouds of N equal masses against the optimal matching of their
    points under the arc distance (scipy's assignment: no CDF, no shift), to the CDF grid's 2π/M per measure."""
    from scipy.optimize import linear_sum_assignment

    M, N = 2**14, 40
    for seed in range(5):
        rng = np.random.default_rng(seed)
        a = np.mod(rng.normal(0.5, 0.3, N), 2 * math.pi)  # one tight cluster
        b = np.mod(np.concatenate([rng.normal(2.0, 0.2, N // 4), rng.uniform(0, 2 * math.pi, N - N // 4)]),
                   2 * math.pi)  # a smaller cluster and a uniform rest
        d = np.abs(a[:, None] - b[None, :])
        d = np.minimum(d, 2 * math.pi - d)
        rows, cols = linear_sum_assignment(d)
        exact = d[rows, cols].sum() / N
        assert w1_circle(cdf_points(a, M), cdf_points(b, M)) == pytest.approx(exact, abs=2 * 2 * math.pi / M), seed


def test_particle_rk4_has_order_4_against_an_adaptive_reference():
    """The circle particle code's RK4 (every stage) against scipy's DOP853 at rtol 1e-13 on the same Bessel-series
    force: the error at T falls as Δt⁴ (circle_particles fits only the N^{-1/2} of sampling, which RK4 with a
    wrong stage still passes)."""
    from scipy.integrate import solve_ivp

    beta, T = 3.0, 0.5
    th0 = sample_modes(50, [[1, 0.3, 0.5], [2, 0.2, 1.0]], np.random.default_rng(2))
    ref = solve_ivp(lambda t, th: bessel_velocity(th, beta, False), (0.0, T), th0, method="DOP853", rtol=1e-13,
                    atol=1e-13).y[:, -1]
    steps = np.array([4, 8, 16, 32])
    errs = [np.max(np.abs(transport_particles(th0, beta, False, T, int(n)) - ref)) for n in steps]
    rate = -np.polyfit(np.log(steps), np.log(errs), 1)[0]
    assert abs(rate - 4) < 0.2, (rate, errs)
    assert errs[-1] > 1e3 * 1e-13  # the finest error still above the reference's


def test_the_section_and_its_coarser_section():
    """The job reads the circle's section of the config: its keys of [tokens] and [data], the [heads], [depth] and
    [output] sections; the resolution check's coarser config is a section too (half the cells, the noise drawn on
    the job's cells; half the labels), and there is none below 8 cells or labels or where a mode would alias."""
    import dataclasses

    from mfpde.tokens.circle.config import Section, coarser, section
    from mfpde.tokens.depths import kept_outputs, output_depths

    cfg = C.load(DEMO, ["tokens.cells=[64]", "depth.steps=30"])
    sec = section(cfg)
    assert (sec.cells, sec.degree, sec.attention, sec.kind, sec.modes) == (64, 2, "unnormalised", "circle_modes",
                                                                           cfg.data.modes)
    assert sec.heads is cfg.heads and sec.depth is cfg.depth and sec.output is cfg.output
    assert np.array_equal(output_depths(sec), output_depths(cfg)) and kept_outputs(sec) == kept_outputs(cfg)
    half = coarser(sec)
    assert half is not None and half.config == dataclasses.replace(sec, cells=32) and half.key == "tokens.cells"
    assert (half.at, half.here, half.options) == ("32 cells", "64 cells", {"data_cells": 64})
    assert coarser(dataclasses.replace(sec, cells=16)) is None  # mode 8 aliases on 8 cells
    noise = dataclasses.replace(sec, kind="circle_noise", modes=[])
    assert coarser(dataclasses.replace(noise, cells=15)) is None and coarser(dataclasses.replace(noise, cells=16))
    flow = dataclasses.replace(sec, solver="flow", labels=32)
    half = coarser(flow)
    assert half is not None and isinstance(half.config, Section) and half.config.labels == 16 and half.at == "16 labels"
    assert coarser(dataclasses.replace(flow, labels=15)) is None


@pytest.mark.parametrize("solver", ["dg", "flow"])
def test_a_head_of_zero_coupling_leaves_mu_where_it_is(tmp_path, solver):
    """tokens.coupling = 0: the one head has c = 0, the velocity is zero and μ_T = μ_0: the Fourier moduli at T are
    those at 0 to round-off (DG: the SSP-RK3 stages' convex combinations of μ with itself round, three per sub-step,
    each by ε of μ, whose mass is 1; the flow map's labels do not move). The flow map stopped with a traceback
    (exit 1): it was given no head at all."""
    from mfpde.jobs.transport import transport_job

    cfg = C.load(DEMO, ["tokens.coupling=0.0", f"tokens.solver='{solver}'", "tokens.cells=[64]", "tokens.labels=128",
                        "depth.steps=8", "output.fields=false", "output.plots=false"])
    rep = transport_job(cfg, tmp_path / solver, MPI.COMM_SELF)["samples"][0]
    from roundoff import gamma

    a = np.array(rep["fourier"]["abs"])
    assert rep["clusters_T"] == 0 and np.abs(a[-1] - a[0]).max() <= gamma(3 * max(rep["substeps"], 1)), a[[0, -1]]
