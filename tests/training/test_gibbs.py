"""The Gibbs fixed points ρ = p_ρ of entropic training and their continuation in λ (theory §4, §5.4, §6.2)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from mpi4py import MPI

import numpy as np
import pytest

from mfpde.continuation import Newton, StepControl
from mfpde.exact import shallow_fixed_point
from mfpde.jobs.gibbs import check_gibbs
from mfpde.training.gibbs import GibbsProblem, gibbs_branches
from mfpde.training.problem import CoupledProblem
from mfpde.verify.models import A_FIXED, M0, S0, gaussian_config

serial = pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="serial")
DEMO = Path(__file__).resolve().parents[2] / "demos" / "gibbs_branch.toml"


def _shallow(cells: int = 60) -> GibbsProblem:
    cfg = gaussian_config("value", 1, (1.0,), "shallow", "entropic", 0.05, 1.0, 0.5, 1, "lie", token_cells=120,
                          token_degree=1, theta_cells=cells, theta_box=3.0, mean=(0.4,), var=0.05, token_box=6.0)
    return GibbsProblem(CoupledProblem.from_config(cfg))


def _solve(P: GibbsProblem, lam: float) -> np.ndarray:
    a = np.zeros(P.m + 1)
    a[-1] = 1.0
    with Newton(P, P.m) as nw:
        x = nw.solve(np.concatenate([P.picard(P.initial(), lam, 5), [lam]]), a, lam)
    assert x is not None
    return x[:-1]


def test_the_single_layer_fixed_point_is_the_closed_form_gaussian():
    """ρ* = N(ā*, λ/λ₂) (theory §6.2): the nodal Gaussian's lumped moments are exact up to the trapezoidal rule's
    aliasing 2e^{−2π²σ²/h²} (h = 0.1, σ² = 0.05: e^{−98}), the tails beyond Θ = [−3, 3] (e^{−80}) and DG1's ŷ
    (exact to round-off on these Gaussians): 1e-11 is round-off (γ_n, n ~ 10⁴) with a margin; λ KL(ρ*‖p_ρ*) ≈ 0."""
    P = _shallow()
    lam = 0.05
    u = _solve(P, lam)
    astar, var, _ = shallow_fixed_point(lam, 1.0, A_FIXED, M0[0], S0[0], 1.0)
    mean, v = P.moments(u)
    assert abs(mean[0, 0] - astar) < 1e-11 and abs(v[0] - var) < 1e-11, (mean, astar, v, var)
    assert abs(P.certificate(u, lam)) < 1e-14
    F, _ = P.free_energy(u, lam)
    assert abs(F - shallow_fixed_point(lam, 1.0, A_FIXED, M0[0], S0[0], 1.0)[2]) < 1e-9


@pytest.mark.parametrize("model", ["shallow", "weight-tied"])
def test_jacobian_taylor(model):
    """‖F(x + εδ) − F(x) − ε(∂F/∂ρ δρ + ∂F/∂λ δλ)‖ = O(ε²): the remainder falls 100× per decade of ε (order ≥ 1.8);
    the deep model's ∂D/∂c by central differences (error ~1e-10) does not show at these ε."""
    if model == "shallow":
        P = _shallow(30)
    else:
        cfg = gaussian_config("scalar", 1, (1.0,), "weight-tied", "entropic", 0.1, 0.5, 0.5, 1, "lie",
                              token_cells=40, token_degree=1, theta_cells=4, theta_box=1.0, mean=(0.2, 0.3), var=0.1)
        P = GibbsProblem(CoupledProblem.from_config(cfg))
    lam = 0.1
    u = P.picard(P.initial(), lam, 3)
    rng = np.random.default_rng(1)
    d, dl = 0.1 * rng.standard_normal(P.m) * u.max(), 0.02
    Ju, JK = P.jacobian(u, lam)
    F0 = P.residual(u, lam)
    rem = [np.linalg.norm(P.residual(u + e * d, lam + e * dl) - F0 - e * (Ju @ d + JK * dl)) for e in (1e-2, 1e-3)]
    assert math.log10(rem[0] / rem[1]) >= 1.8, rem
    # and the first-order term is not zero: the Jacobian carries the risk's part
    assert np.linalg.norm(Ju - np.eye(P.m)) > 1e-3


def test_single_layer_spectrum_and_slepc_against_scipy():
    """−∂F/∂ρ of the single layer: −1 on every direction that does not move ā, −(1 + k²Var_p(v)/λ) on the one that
    does (module docstring of mfpde.training.gibbs); SLEPc's leading pair equals scipy's."""
    P = _shallow(30)
    lam = 0.05
    u = _solve(P, lam)
    ev = np.sort(np.linalg.eigvals(-P.jacobian(u, lam)[0]).real)
    k = M0[0] * (1 + A_FIXED * S0[0])
    var = P.moments(u)[1][0]
    assert np.allclose(ev[1:], -1.0, atol=1e-10) and abs(ev[0] + 1 + k * k * var / lam) < 1e-9, ev[:3]
    a, ok_a = P.stability(u, lam, 2, "slepc")
    b, ok_b = P.stability(u, lam, 2, "scipy")
    assert ok_a and ok_b and abs(a[0] - b[0]) < 1e-9


def test_branch_follows_the_closed_form_and_reports_no_fold():
    P = _shallow(60)
    out = gibbs_branches(P, 0.2, 0.02, StepControl(0.05, 1e-6, 0.5, 0.02, 0.2, 100), "scipy")
    (b,) = out["branches"]
    assert not out["bifurcations"] and not b["early"] and all(b["stable"])
    for lam, v, c in zip(b["parameter"], b["variance"], b["certificate"], strict=True):
        assert abs(v[0] - lam) < 1e-9 * max(1.0, lam / 0.02) and abs(c) < 1e-12  # λ₂ = 1: V = λ
    assert np.all(np.diff(b["parameter"]) < 0)


class _FailsBelow(GibbsProblem):
    """F is NaN for λ < 0.08: Newton fails there (a singular Jacobian, a diverging iteration, ...)."""

    def residual(self, u, K):  # noqa: D102
        return super().residual(u, K) + (math.nan if K < 0.08 else 0.0)


def test_a_newton_failure_ends_the_branch_at_its_last_converged_point():
    P0 = _shallow(30)
    P = _FailsBelow(P0.cp)
    out = gibbs_branches(P, 0.2, 0.02, StepControl(0.05, 1e-4, 0.5, 0.02, 0.2, 100), "scipy")
    (b,) = out["branches"]
    assert b["early"] and "Newton failed" in b["stopped"] and len(b["parameter"]) >= 2
    assert min(b["parameter"]) >= 0.08


def test_a_failing_token_solve_is_a_newton_failure_not_an_exit(monkeypatch):
    """From the 100th forward + adjoint pass on every token solve fails (NumericalError, as tokens leaving Ω): the
    branch keeps its converged points and ends early with that reason, where the error used to end the job. (A
    Jacobian of the 30-cell Θ grid takes about 30 passes: the start's and a few steps' go first.)"""
    from mfpde.errors import NumericalError

    P = _shallow(30)
    real = P.cp.objective.gradient
    calls = [0]

    def gradient(heads, *args, **kw):
        calls[0] += 1
        if calls[0] >= 100:
            raise NumericalError("mass leaving the token domain (planted)")
        return real(heads, *args, **kw)

    monkeypatch.setattr(P.cp.objective, "gradient", gradient)
    out = gibbs_branches(P, 0.2, 0.02, StepControl(0.02, 1e-3, 0.02, 0.02, 0.2, 100), "scipy")
    (b,) = out["branches"]
    assert b["early"] and "planted" in b["stopped"] and len(b["parameter"]) >= 2, b["stopped"]
    assert all(math.isfinite(v[0]) for v in b["variance"])


def _cli(tmp_path: Path, *sets: str, env: dict | None = None) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "mfpde", "continuation", str(DEMO), "--out", str(tmp_path / "o"), "--quiet"]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)


@serial
def test_cli_on_the_demo_writes_the_branch_and_the_diagram(tmp_path):
    r = _cli(tmp_path, "continuation.start=0.2", "continuation.stop=0.05")
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    assert rep["status"] == "ok" and rep["parameter"] == "lambda" and rep["bifurcations"] == []
    (b,) = rep["branches"]
    n = len(b["parameter"])
    assert n >= 3 and all(len(b[k]) == n for k in ("certificate", "risk", "free_energy", "mean", "variance",
                                                   "leading_eigenvalue", "stable"))
    assert max(abs(c) for c in b["certificate"]) < 1e-12
    assert (tmp_path / "o" / "plots" / "bifurcation.png").stat().st_size > 1000
    assert 'parameter = "lambda"' in (tmp_path / "o" / "config.toml").read_text()


def test_the_deep_demo_is_a_valid_lambda_continuation_config():
    from mfpde.api import load_config

    cfg = load_config(DEMO.parent / "gibbs_deep.toml")
    check_gibbs(cfg)
    assert cfg.depth.model == "weight-tied" and cfg.heads.family == "scalar"


@pytest.mark.parametrize("sets,key", [
    (("continuation.start=-0.1",), "continuation.start"), (("continuation.stop=-0.1",), "continuation.stop"),
    (("continuation.stop=1.0",), "continuation.stop"), (("training.regularization='tikhonov'",),
                                                          "training.regularization"),
    (("continuation.step=1.0",), "continuation.step"), (("continuation.max_points=1",), "continuation.max_points"),
    # ends beyond the λ training accepts: 1e300 overflowed (exit 1), 1e-10 stepped to λ < 0 and 1e-20 ended "ok"
    # with one point (the Gibbs density underflows on Θ)
    (("continuation.start=1e300",), "continuation.start: .* entropy decides"),
    (("continuation.start=1e-10",), "continuation.start: .* underflows"),
    (("continuation.stop=1e-20",), "continuation.stop: .* underflows")])
def test_bad_input_names_the_key(sets, key):
    from mfpde.api import load_config
    from mfpde.errors import ConfigError

    with pytest.raises(ConfigError, match=key):
        check_gibbs(load_config(DEMO, list(sets)))


@serial
def test_cli_bad_input_is_exit_2_naming_the_key(tmp_path):
    r = _cli(tmp_path, "continuation.stop=-0.5")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "continuation.stop" in r.stderr, r.stderr
    circle = tmp_path / "c.toml"
    circle.write_text((DEMO.parent / "noisy_circle.toml").read_text())
    r = subprocess.run([sys.executable, "-m", "mfpde", "continuation", str(circle), "--out", str(tmp_path / "c"),
                        "--quiet", "--set", "continuation.parameter='lambda'"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "continuation.parameter" in r.stderr and "training problem" in r.stderr, r.stderr


@serial
def test_cli_newton_failures_exit_0_with_a_point_and_3_without(tmp_path):
    """SNES allowed no iteration: the damped fixed-point steps reach the start to round-off (a point: exit 0, the
    branch ends there with the reason); with an unreachable tolerance as well no point converges: exit 3."""
    env = {**os.environ, "PETSC_OPTIONS": "-mfpde_cont_snes_max_it 0"}
    r = _cli(tmp_path, "continuation.start=0.2", "continuation.stop=0.05", "continuation.step_min=0.01", env=env)
    assert r.returncode == 0, r.stderr
    (b,) = json.loads((tmp_path / "o" / "report.json").read_text())["branches"]
    assert b["early"] and "Newton failed" in b["stopped"] and b["parameter"] == [0.2], b
    env["PETSC_OPTIONS"] += " -mfpde_cont_snes_atol 1e-300"
    r = _cli(tmp_path, "continuation.start=0.2", "continuation.stop=0.05", env=env)
    assert r.returncode == 3 and "no fixed point" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert json.loads((tmp_path / "o" / "report.json").read_text())["status"] == "failed"


@pytest.mark.ranks
def test_ranks_compute_the_same_branch():
    P = _shallow(30)
    out = gibbs_branches(P, 0.2, 0.05, StepControl(0.05, 1e-6, 0.5, 0.05, 0.2, 100), "scipy")
    mine = [(b["parameter"], b["variance"]) for b in out["branches"]]
    assert mine and all(other == mine for other in MPI.COMM_WORLD.allgather(mine))
