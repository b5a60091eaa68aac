"""Continuation of the noisy circle's stationary states (theory §10): Newton, Keller's arclength, bifurcations."""

from __future__ import annotations

import json
import math
import subprocess
import sys

from mpi4py import MPI

import numpy as np
import pytest
import scipy.special as sp
from taylor import assert_jacobian_exact

from mfpde.bifurcation import noisy_circle_branches
from mfpde.continuation import Newton, StepControl
from mfpde.tokens.circle.stationary import CircleStationary

serial = pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="serial")


def _branches(beta: float, start: float, stop: float, points: int = 41) -> dict:
    P = CircleStationary(points, beta, 1.0)
    return noisy_circle_branches(P, start, stop, StepControl(0.05, 1e-6, 0.25, min(start, stop), max(start, stop),
                                                            60), eig_solver="scipy")


def test_jacobian_is_exact():
    """∂F/∂u and ∂F/∂K against central differences (error O(ε²) ≈ 1e-9 at ε = 1e-6) at a non-uniform state."""
    P = CircleStationary(21, 3.0, 0.7)
    rng = np.random.default_rng(1)
    u, K, eps = P.uniform() * (1 + 0.3 * rng.standard_normal(P.m)), 1.3, 1e-6
    assert_jacobian_exact(P, u, K, eps)


def test_uniform_spectrum_is_the_closed_form():
    """About 1/2π: the eigenvalues K k² I_k(β)/β − τk² (theory §10), each twice (cos, sin), by SLEPc and scipy."""
    beta, tau, K = 2.5, 0.8, 1.1
    P = CircleStationary(31, beta, tau)
    k = np.arange(1, 4)
    exact = np.repeat(K * k * k * sp.iv(k, beta) / beta - tau * k * k, 2)
    for solver in ("slepc", "scipy"):
        vals, stable = P.stability(P.uniform(), K, 6, solver)
        assert np.allclose(np.sort(vals.real)[::-1], np.sort(exact)[::-1], rtol=1e-10), (solver, vals)
        assert stable == bool(exact.max() < 0)


def test_slepc_against_scipy_off_the_uniform_state():
    """On the bifurcated branch (β = 2, K = 1.6): SLEPc's leading eigenvalues equal scipy.linalg.eig's."""
    P = CircleStationary(41, 2.0, 1.0)
    with Newton(P, P.m) as nw:
        row = np.zeros(P.m + 1)
        row[-1] = 1.0
        x = nw.solve(np.concatenate([P.uniform() * (1 + 0.8 * P.mode_state(1)), [1.6]]), row, 1.6)
    assert x is not None and P.order_parameter(x[:-1]) > 0.3
    a, sa = P.stability(x[:-1], 1.6, 4, "slepc")
    b, sb = P.stability(x[:-1], 1.6, 4, "scipy")
    assert np.allclose(a, b, rtol=1e-9, atol=1e-10) and sa and sb and a[0].real < 0


@pytest.mark.parametrize("beta", [1.0, 2.0, 4.0])
def test_threshold_is_tau_beta_over_i1(beta):
    """The first branch point of the uniform branch: K_c = τβ/I_1(β) to 1e-12 relative (collocation: spectral)."""
    out = _branches(beta, 0.2, 1.3 * beta / sp.iv(1, beta))
    first = out["bifurcations"][0]
    kc = beta / sp.iv(1, beta)
    assert first["mode"] == 1 and abs(first["parameter"] - kc) < 1e-12 * kc, first


def test_supercritical_below_and_subcritical_with_a_fold_above_beta_star():
    """β = 2 < β*: c₂ > 0, stable branch; β = 4 > β*: c₂ < 0, a fold at K_f < K_c, unstable before it, stable after."""
    sup = _branches(2.0, 1.0, 1.6)
    b = sup["bifurcations"][0]
    assert b["kind"] == "supercritical" and b["curvature"] > 0
    br = sup["branches"][1]
    assert all(br["stable"][1:]) and min(br["parameter"]) >= b["parameter"] - 1e-12
    sub = _branches(4.0, 0.2, 0.6, points=63)
    kinds = [e["kind"] for e in sub["bifurcations"] if e["mode"] == 1]
    assert kinds == ["subcritical", "fold", "maxwell"], sub["bifurcations"]
    kc, fold, km = (e["parameter"] for e in sub["bifurcations"][:3])
    assert 0.3 < fold < km < kc  # the first-order transition between the fold and the threshold
    br = sub["branches"][1]
    st, r = np.array(br["stable"]), np.array(br["order_parameter"])
    rf = sub["bifurcations"][1]["order_parameter"]
    assert not st[(r > 0.05) & (r < rf - 0.05)].any() and st[r > rf + 0.05].all()
    assert not sub["branches"][0]["stable"][-1]  # the uniform state above K_c


@serial
def test_time_stepping_reaches_the_continued_state_at_order_2():
    """DG0 SG from a perturbation to depth 30 (β = 2, τ = 1, K = 2): |μ̂_1| → the continued state's at order 2, the
    free energy at order 4."""
    from mfpde.fitting import fit_order
    from mfpde.heads import HeadMeasure
    from mfpde.tokens.circle.dg import CircleMesh
    from mfpde.tokens.circle.noise import NoisyCircleTransport, free_energy

    P = CircleStationary(41, 2.0, 1.0)
    row = np.zeros(P.m + 1)
    row[-1] = 1.0
    with Newton(P, P.m) as nw:
        x = nw.solve(np.concatenate([P.uniform() * (1 + 0.8 * P.mode_state(1)), [2.0]]), row, 2.0)
    r_c, E_c = P.order_parameter(x[:-1]), P.free_energy(x[:-1], 2.0)
    heads = HeadMeasure(np.array([2.0]), np.array([2.0]))
    errs, errs_E = [], []
    for n in (16, 32):
        m = CircleMesh(n, 0)
        mu = m.interpolate(lambda th: (1 + 0.5 * np.cos(th)) / (2 * math.pi))
        mu_T = NoisyCircleTransport(m, 1.0, "unnormalised").solve(mu, heads, 30.0, 3).mu_T
        errs.append(abs(abs(np.sum(m.weights(mu_T)[:, 0] * np.exp(1j * m.nodes[:, 0]))) - r_c))
        errs_E.append(abs(free_energy(m, mu_T, heads, 1.0) - E_c))
    order = fit_order([1 / 16, 1 / 32], errs)
    assert abs(order - 2.0) < 0.2 and errs[-1] < 2e-3, (order, errs)
    # E is stationary at its minimiser: its error is quadratic in the state's, order 4 (measured 4.5 at 16/32, 4.0
    # at 32/64)
    assert fit_order([1 / 16, 1 / 32], errs_E) > 3.5 and errs_E[-1] < 1e-4, errs_E


CFG = """[tokens]
domain = "circle"
attention = "unnormalised"
degree = 0
noise = 1.0
beta = 4.0

[data]
kind = "circle_modes"
modes = [[1, 0.01, 0.0]]

[continuation]
start = 0.3
stop = 0.6
points = 63
"""


def _cli(tmp_path, *sets: str) -> subprocess.CompletedProcess:
    cfg = tmp_path / "c.toml"
    cfg.write_text(CFG)
    args = [sys.executable, "-m", "mfpde", "continuation", str(cfg), "--out", str(tmp_path / "o"), "--quiet"]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


@serial
def test_cli_report_and_diagram(tmp_path):
    r = _cli(tmp_path)
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    assert rep["status"] == "ok" and rep["command"] == "continuation"
    assert [(e["kind"], e["mode"]) for e in rep["bifurcations"]][:2] == [("subcritical", 1), ("fold", 1)]
    for b in rep["branches"]:
        n = len(b["parameter"])
        assert n >= 2 and all(len(b[k]) == n for k in ("order_parameter", "free_energy", "stable"))
    assert (tmp_path / "o" / "plots" / "bifurcation.png").stat().st_size > 1000
    resolved = (tmp_path / "o" / "config.toml").read_text()
    assert "[continuation]\nparameter = \"coupling\"\nstart = 0.3\nstop = 0.6" in resolved


@serial
@pytest.mark.parametrize("override,key", [
    ("continuation.parameter='lambda'", "continuation.parameter"), ("continuation.stop=0.3", "continuation.stop"),
    ("continuation.start=-1.0", "continuation.start"), ("tokens.noise=0.0", "tokens.noise"),
    ("tokens.attention='softmax'", "tokens.attention"), ("continuation.points=64", "continuation.points"),
    ("tokens.noise=-1.0", "tokens.noise"), ("continuation.step_min=1.0", "continuation.step_min")])
def test_cli_bad_input_is_exit_2_naming_the_key(tmp_path, override, key):
    r = _cli(tmp_path, override)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and key in r.stderr, r.stderr


def test_the_demo_is_a_valid_continuation_config():
    from mfpde import config as C
    from mfpde.jobs.continuation import check_continuation

    assert check_continuation(C.load("demos/noisy_circle.toml")) == (4.0, 1.0)


@pytest.mark.parametrize("demo", ["noisy_circle", "noisy_sphere"])
@pytest.mark.parametrize("override,key", [
    ("tokens.beta=700.0", "continuation.stop"), ("tokens.noise=1e-300", "continuation.stop"),
    ("continuation.start=1e300", "continuation.start")])
def test_a_stationary_density_beyond_the_double_range_is_refused(demo, override, key):
    """K (e^β − e^−β)/(τβ) > 708: the Gibbs density underflows on part of the domain. These ended "ok" with the
    order parameter 1 on the "uniform" branch (circle) or in a traceback of scipy's eigh (sphere, β = 700)."""
    from mfpde import config as C
    from mfpde.errors import ConfigError
    from mfpde.jobs.continuation import check_continuation

    with pytest.raises(ConfigError, match=f"^{key}: .*underflow"):
        check_continuation(C.load(f"demos/{demo}.toml", [override]))


@pytest.mark.parametrize("override,key", [
    ("tokens.beta=700.0", "continuation.stop"), ("tokens.noise=1e-300", "continuation.stop"),
    ("continuation.start=1e300", "continuation.start")])
def test_a_gibbs_exponent_beyond_its_digits_is_refused_on_the_hypersphere(override, key):
    """Log-density unknowns take any span of the density (d = 512 reaches K_c ≈ 2d sinh β/β past the circle's
    bound), but an exponent K e^β/(τβ) past 1e10 loses its digits: refused, naming the key."""
    from mfpde import config as C
    from mfpde.errors import ConfigError
    from mfpde.jobs.continuation import check_continuation

    with pytest.raises(ConfigError, match=f"^{key}: .*round-off"):
        check_continuation(C.load("demos/noisy_hypersphere.toml", [override]))
    assert check_continuation(C.load("demos/noisy_hypersphere.toml", ["tokens.dim=512", "tokens.beta=1.0",
                                                                      "continuation.stop=600"]))[0] == 1.0


@serial
def test_a_newton_failure_ends_its_branch_with_a_reason(tmp_path):
    """SNES allowed no iteration: the uniform branch (exact at every K) is computed, the bifurcating ones stop at their
    first points (a predictor within the tolerance needs no iteration) with the reason; exit 0 and the report says which
    stopped early; branch points beyond the range (the uniform branch's last step overshoots it) are not followed."""
    import os

    cfg = tmp_path / "c.toml"
    cfg.write_text(CFG)
    env = {**os.environ, "PETSC_OPTIONS": "-mfpde_cont_snes_max_it 0"}
    r = subprocess.run([sys.executable, "-m", "mfpde", "continuation", str(cfg), "--out", str(tmp_path / "o"),
                        "--quiet"], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    uni, *others = rep["branches"]
    assert not uni["early"] and len(uni["parameter"]) > 2 and others
    assert others and all(b["early"] and "Newton failed" in b["stopped"] for b in others), others


@pytest.mark.ranks
def test_ranks_compute_the_same_branches():
    """Replicated on every rank (COMM_SELF solvers): the branches agree bit for bit between ranks."""
    out = _branches(4.0, 0.3, 0.5, points=63)
    comm = MPI.COMM_WORLD
    mine = [(b["parameter"], b["stable"]) for b in out["branches"]]
    assert all(other == mine for other in comm.allgather(mine))
    assert [e["kind"] for e in out["bifurcations"]] == ["subcritical", "fold", "maxwell"]


class _Interrupting:
    """The circle's stationary problem whose residual is interrupted by a signal at its second call."""

    def __init__(self, P: CircleStationary) -> None:
        self.P, self.calls = P, 0

    def residual(self, u, K):
        from mfpde.signals import Interrupted

        self.calls += 1
        if self.calls == 2:
            raise Interrupted(15)
        return self.P.residual(u, K)

    def jacobian(self, u, K):
        return self.P.jacobian(u, K)


def test_a_signal_inside_newton_is_the_interruption_not_a_petsc_error():
    """A SIGTERM whose handler raises inside SNES's Python callback: PETSc wrapped it as "error code 101" and the CLI
    printed a traceback with exit 1 (seen at ~1 in 6 signals during `mfpde continuation`); it must come out as
    mfpde.signals.Interrupted (exit 4)."""
    from mfpde.signals import Interrupted

    P = CircleStationary(33, 4.0, 1.0)
    prob = _Interrupting(P)
    with Newton(prob, P.m) as nw:
        x0 = np.concatenate([P.uniform() * 1.01, [0.3]])
        a = np.zeros(P.m + 1)
        a[-1] = 1.0
        with pytest.raises(Interrupted):
            nw.solve(x0, a, 0.3)


class _Singular:
    """F(u, K) = 1 with the zero Jacobian: the bordered matrix has one non-zero row, LU meets a zero pivot."""

    def residual(self, u, K):
        return np.ones_like(u)

    def jacobian(self, u, K):
        return np.zeros((len(u), len(u))), np.zeros(len(u))


def test_a_zero_pivot_is_a_newton_failure_not_a_traceback():
    """β = 300 in demos/noisy_circle.toml: PETSc's LU raised "error code 71" (zero pivot) out of SNES, a traceback
    with exit 1; it is a Newton failure (None), which ends the branch with its reason (exit 3 if no branch moved)."""
    m = 5
    a = np.zeros(m + 1)
    a[-1] = 1.0
    with Newton(_Singular(), m) as nw:
        assert nw.solve(np.ones(m + 1), a, 1.0) is None


def test_a_linearisation_that_overflowed_is_a_numerical_error():
    """A non-finite linearisation reached SLEPc (SystemError from EPS.destroy) or scipy's eig (ValueError): exit 1.
    Now a NumericalError (exit 3); SLEPc's non-convergence falls back to the dense reference."""
    from mfpde.errors import NumericalError
    from mfpde.stability import leading_eigenpairs

    L = -np.eye(5)
    L[1, 2] = np.inf
    for solver in ("slepc", "scipy"):
        with pytest.raises(NumericalError, match="not finite"):
            leading_eigenpairs(L, 2, solver)


def test_a_branch_that_reaches_the_range_end_ends_on_it():
    """The last point of a branch leaving [start, stop] is the state at the end itself (the parameter held there),
    not the overshooting step: the uniform branch, density 1/2π, sits at K = stop exactly."""
    res = _branches(1.0, 0.5, 2.5)
    uniform = [b for b in res["branches"] if b["origin"] == "uniform"]
    assert uniform and all(min(b["parameter"]) >= 0.5 and max(b["parameter"]) <= 2.5 for b in res["branches"])
    ends = [b for b in res["branches"] if "reached the end" in b["stopped"]]
    assert ends, [b["stopped"] for b in res["branches"]]
    for b in ends:
        assert b["parameter"][-1] in (0.5, 2.5), b["parameter"][-3:]
    assert any(b["parameter"][-1] == 2.5 and b["order_parameter"][-1] < 1e-10 for b in uniform)


def test_each_branch_carries_the_amplitude_of_its_own_mode():
    """A mode-2 branch has |μ̂₁| = 0 (two antipodal clusters) but a growing |∫ μ cos 2θ dθ|: the amplitude the
    diagram draws; on a mode-1 branch of even states the amplitude is the order parameter |μ̂₁|."""
    res = _branches(4.0, 0.2, 1.0)
    by_mode = {b["mode"]: b for b in res["branches"] if b["origin"] != "uniform"}
    assert set(by_mode) >= {1, 2}
    one, two = by_mode[1], by_mode[2]
    np.testing.assert_allclose(one["amplitude"], one["order_parameter"], rtol=1e-12, atol=1e-14)
    assert max(two["order_parameter"]) < 1e-10 and max(two["amplitude"]) > 0.1  # off the axis
    uniform = next(b for b in res["branches"] if b["origin"] == "uniform")
    assert max(uniform["amplitude"]) < 1e-12


def test_a_branch_point_in_the_first_step_is_found():
    """K_c = τβ/I_1(β) = 0.40986 (β = 4) inside the first step 0.39 → 0.44 of the uniform branch: the first step was
    not watched (a branch's first step may start at a branch point, the uniform branch's does not), and the mode-1
    bifurcation was missed; the step leaving the range crossed the mode-2 point 0.6228 and kept it as a point."""
    res = _branches(4.0, 0.39, 0.6)
    kc = 4.0 / sp.iv(1, 4.0)
    found = [b for b in res["bifurcations"] if b["mode"] == 1 and b["kind"] not in ("fold", "maxwell")]
    assert len(found) == 1 and abs(found[0]["parameter"] - kc) <= 1e-10, res["bifurcations"]
    uniform = next(b for b in res["branches"] if b["origin"] == "uniform")
    assert max(uniform["parameter"]) == 0.6 and not any(b["mode"] == 2 for b in res["bifurcations"])


def test_steps_that_would_cross_several_branch_points_are_shortened():
    """The thresholds τβ/I_k(β) of modes 1..6 (β = 4, τ = 0.01: 0.0041 … 0.26) packed into the first steps of 0.05 in
    K: det ∂F/∂u keeps its sign across an even number of them, and modes 1..4 were missed; each step now crosses at
    most one."""
    P = CircleStationary(127, 4.0, 0.01)
    res = noisy_circle_branches(P, 0.001, 0.5, StepControl(0.05, 1e-6, 0.25, 0.001, 0.5, 400), eig_solver="scipy")
    found = {b["mode"]: b["parameter"] for b in res["bifurcations"] if b["kind"] not in ("fold", "maxwell")}
    assert set(found) >= set(range(1, 7)), sorted(found)
    for k in range(1, 7):
        assert abs(found[k] - P.threshold(k)) <= 1e-8 * P.threshold(k), (k, found[k], P.threshold(k))


def test_each_point_records_the_step_that_reached_it():
    """Keller's condition ⟨t_b, x_j − x_b⟩_W = Δs_j from the branch's own record (tangents, bases, steps), events
    included (β = 4: two branch points on the uniform branch; the mode-1 branch's fold), and unit tangents in W."""
    from mfpde.continuation import branch_direction, continue_branch

    P = CircleStationary(81, 4.0, 1.0)  # 41 points do not resolve the clustered states down to the fold
    W = P.inner_weights()
    e_K = np.eye(P.m + 1)[P.m]
    ctl = StepControl(2e-3, 1e-9, 0.02, 0.38, 0.66, 300)
    with Newton(P, P.m) as nw:
        uni = continue_branch(P, nw, np.concatenate([P.uniform(), [0.38]]), e_K, W, ctl, regular_start=True)
        bp = uni.events[0]
        x = np.concatenate([bp.u, [bp.K]])
        clustered = continue_branch(P, nw, x, branch_direction(P, x, bp.tangent, W), W, ctl, P.resolved)
    assert [e.kind for e in uni.events] == ["branch_point", "branch_point"]
    assert [e.kind for e in clustered.events] == ["fold"]
    for br in (uni, clustered):
        X = [np.concatenate([u, [K]]) for u, K in zip(br.u, br.K, strict=True)]
        assert len(br.tangents) == len(br.bases) == len(br.steps) == len(X) and br.bases[0] == -1
        assert all(0 <= br.bases[j] < j for j in range(1, len(X)))
        for j in range(1, len(X)):
            t = br.tangents[br.bases[j]]
            assert abs(float(np.sum(W * t * (X[j] - X[br.bases[j]]))) - br.steps[j]) <= 1e-11, j
        assert all(abs(float(np.sum(W * t * t)) - 1) <= 1e-13 for t in br.tangents)


def test_brent_is_scipys_brentq():
    """The continuation's Brent (no scipy import) finds scipy.optimize.brentq's roots, to its tolerance."""
    import math

    from scipy.optimize import brentq

    from mfpde.continuation_newton import brent

    cases = [(lambda x: x**3 - 2 * x - 5, 2.0, 3.0), (lambda x: math.cos(x) - x, 0.0, 1.0),
             (lambda x: math.exp(x) - 1e6, 0.0, 20.0), (lambda x: (x - 0.3) ** 3, 0.0, 1.0),
             (lambda x: math.tanh(50 * (x - 0.7)), -1.0, 2.0)]
    for f, a, b in cases:
        want = brentq(f, a, b, xtol=1e-14, rtol=1e-15, maxiter=500)
        got = brent(f, a, b, xtol=1e-14, rtol=1e-15, maxiter=500)
        assert abs(got - want) <= 2e-14 + 2e-15 * abs(want), (got, want)
    import pytest

    with pytest.raises(ValueError):
        brent(lambda x: x * x + 1, -1.0, 1.0, 1e-12, 1e-15)
