"""`mfpde verify`, the one harness of the checks: each registered check runs once here (quick sizes), and the
verdict machinery (budgets, non-finite values, exit status) is tested by planting what it must catch.

The checks compare with references the code does not produce (closed forms, finite differences, particle codes,
Richardson estimates); the tests that used to repeat some of them (the Taylor cases, the splitting orders, the
shallow ŷ, the Gaussian first variation, the certificate and the NTK rate) are these parametrised runs now.
"""

from __future__ import annotations

import dataclasses
import json
import time

from mpi4py import MPI

import numpy as np
import pytest

from mfpde.cli import main
from mfpde.jobs.verify import _load_checks, run_check
from mfpde.verify.registry import CHECKS

pytestmark = pytest.mark.ranks  # the rank count can change what it checks: run again under mpiexec

_load_checks()


def _report(out):
    MPI.COMM_WORLD.Barrier()
    return json.loads((out / "report.json").read_text())


@pytest.mark.parametrize("name", list(CHECKS))
def test_check(name):
    """The check passes at its quick sizes, within its budgets, with a finite value and every record field.

    Under MPI only the distributed checks run: the others compute the same on every rank alone.
    """
    if MPI.COMM_WORLD.size > 1 and not CHECKS[name].distributed:
        pytest.skip("not distributed: each rank computes the same alone (run by the serial pass)")
    rec = run_check(CHECKS[name], quick=True)
    fields = {"name", "kind", "unit", "measured", "value", "reference_value", "error", "tolerance", "threshold",
              "passed", "detail", "reference", "theory", "wall_s", "cpu_s", "steps"}
    assert fields <= set(rec)
    assert rec["reference"] and rec["theory"] and rec["threshold"] and rec["kind"] == CHECKS[name].kind
    assert rec["passed"] is True, f"{name}: {rec['detail']}"
    assert np.isfinite(rec["measured"]) and rec["value"] == rec["measured"] and rec["steps"] <= rec["step_budget"]
    if rec["kind"] in ("slope", "rate"):  # an order or a rate has a reference: the scheme's, the theorem's
        assert rec["reference_value"] is not None
    if rec["reference_value"] is None:
        assert rec["error"] is None
    else:  # the error is |measured − reference|, within the threshold's bound when it is one number
        assert rec["error"] == abs(rec["measured"] - rec["reference_value"])
        assert rec["tolerance"] is None or rec["error"] <= rec["tolerance"], rec


def test_verify_cli(tempdir):
    """`mfpde verify --quick --only A B`: exit 0, the checks in the given order in report.json, their plots."""
    names = ["stability_w1_data", "gaussian_exact_d1"]
    assert main(["verify", "--quick", "--only", *names, "--out", str(tempdir)]) == 0
    rep = _report(tempdir)
    assert rep["command"] == "verify" and rep["passed"] is True and rep["comm_size"] == MPI.COMM_WORLD.size
    assert [c["name"] for c in rep["checks"]] == names
    comm = MPI.COMM_WORLD
    plots = tempdir / "plots"
    missing = [c["name"] for c in rep["checks"] if c["series"] and not (plots / f"{c['name']}.png").exists()]
    missing = comm.bcast(missing if comm.rank == 0 else None, root=0)
    assert not missing, f"plots missing: {missing}"


def test_interface_check_names_are_registered():
    """The check names docs/interface.md lists under ``verify`` are exactly the registered checks."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "interface.md").read_text()
    block = text[text.index("Check names (more may be added)"):text.index("Each check also records")]
    names = re.findall(r"`([a-z0-9_]+)`", block)
    assert set(names) == set(CHECKS), (sorted(set(names) - set(CHECKS)), sorted(set(CHECKS) - set(names)))


def test_verify_unknown_check_is_input_error(tempdir, capfd):
    assert main(["verify", "--only", "no_such_check", "--out", str(tempdir)]) == 2
    assert main(["verify", "--only", "token_mas", "--out", str(tempdir)]) == 2
    assert "did you mean 'token_mass'?" in capfd.readouterr().err or MPI.COMM_WORLD.rank > 0


def test_verify_every_unknown_check_is_named(tempdir, capfd):
    """``--only a b c`` named only ``a``: every unknown name is in the one line, a known one is not blamed."""
    assert main(["verify", "--only", "bork_a", "token_mass", "bork_b", "token_mas", "--out", str(tempdir)]) == 2
    err = capfd.readouterr().err
    if MPI.COMM_WORLD.rank == 0:
        (line,) = err.strip().splitlines()
        head = line.split("(known:")[0]
        assert all(f"'{n}'" in head for n in ("bork_a", "bork_b", "token_mas")), line
        assert "'token_mass' (" not in head and "did you mean 'token_mass'?" in head, line


def test_verify_planted_bug_exits_3(tempdir, monkeypatch):
    """The shallow layer taking 2T instead of T: the check fails, exit 3."""
    import mfpde.training.objective as obj

    orig = obj.solve_shallow

    def twice(tokens, u, heads, T, g=None, tape=None):
        return orig(tokens, u, heads, 2 * T, g, tape)

    monkeypatch.setattr(obj, "solve_shallow", twice)
    assert main(["verify", "--quick", "--only", "shallow_yhat_exact", "--out", str(tempdir)]) == 3
    rep = _report(tempdir)
    assert rep["passed"] is False and rep["checks"][0]["passed"] is False


@pytest.mark.serial
def test_stalled_check_fails_within_its_step_budget(monkeypatch):
    """The DG1 limiter removed: token_positivity's 2-D solve loses positivity and its CFL loop stalls; the check
    ends with a fail that names the budget, within a step budget of 2000 (not after 2^16 sub-steps a depth step)."""
    from mfpde.tokens.box.transport import SampleOperator

    monkeypatch.setattr(SampleOperator, "limit", lambda self, state: None)
    rec = run_check(dataclasses.replace(CHECKS["token_positivity"], steps=2000), quick=True)
    assert rec["passed"] is False and "step budget spent" in rec["detail"] and rec["steps"] == 2001, rec


def test_slow_or_non_finite_check_fails():
    """A check over its time budget fails and says so; one whose value is not finite fails even if it said pass.

    The check over budget spins in Python: a real check's timer can fire on one rank before a collective that the
    others have entered, and then the job ends instead of agreeing on a verdict (``_others_arrive``), which is
    what the run's MPI abort is for, not what this test is about.
    """
    from mfpde.verify.registry import Outcome

    def spin(quick):  # no collective inside: every rank's timer stops it, so the ranks agree on the verdict
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60.0:
            pass
        raise AssertionError("the timers did not stop the check")

    rec = run_check(dataclasses.replace(CHECKS["gaussian_exact_d1"], budget_s=0.0, run=spin), quick=True)
    assert rec["passed"] is False and "over its time budget" in rec["detail"]
    nan = dataclasses.replace(CHECKS["gaussian_exact_d1"], run=lambda quick: Outcome(float("nan"), 1.0, "t", True, "d"))
    rec = run_check(nan, quick=True)
    assert rec["passed"] is False and "non-finite value" in rec["detail"]
    bad_ref = dataclasses.replace(nan, run=lambda quick: Outcome(1.0, float("nan"), "t", True, "d"))
    rec = run_check(bad_ref, quick=True)
    assert rec["passed"] is False and "non-finite value" in rec["detail"]


def _run_report(tempdir, name, cfg):
    from mfpde.jobs.run import run_training

    out = tempdir / name
    assert run_training(cfg, out, comm=MPI.COMM_WORLD) == 0
    return _report(out)


def test_report_rates_say_what_applies(tempdir):
    """rate.theory only where a theorem applies, rate.fitted only against an F* known independently (issue 11)."""
    from mfpde.verify.models import gaussian_config

    lam, lam2 = 0.1, 1.0
    # single-layer, entropic, value heads: theory §5.4 gives exactly 2λ₂; F* bracketed by the certificate
    shallow = _run_report(tempdir, "shallow", gaussian_config("value", 1, (1.0,), "shallow", "entropic", lam, lam2,
                                                              0.05, 80, token_cells=40))
    rate = shallow["rate"]
    assert rate["theory"] == 2 * lam2 and "§5.4" in rate["theory_kind"]
    assert rate["converged"] is True and rate["fitted"] >= rate["theory"], rate
    assert "certificate" in rate["fitted_reference"]
    # the deep model, entropic: no theorem gives a rate, and no independent F*
    deep = _run_report(tempdir, "deep", gaussian_config("value", 1, (1.0,), "weight-tied", "entropic", lam, lam2,
                                                        0.05, 6, token_cells=40))
    rate = deep["rate"]
    assert rate["theory"] is None and "not convex" in rate["theory_reason"], rate
    assert rate["fitted"] is None and rate["converged"] is False
    # the deep model, λ = λ₂ = 0, two samples, θ = v: the NTK is rank 1, so §5.5 does not apply, and it says so
    ctrl = _run_report(tempdir, "ctrl", gaussian_config("value", 2, (1.0, 0.0), "weight-tied", "tikhonov", 0.0, 0.0,
                                                        0.1, 4, token_cells=40))
    ntk = ctrl["final"]["ntk"]
    assert ntk["degenerate"] is True and ntk["numerical_rank"] == 1 and "§5.5" in ntk["warning"], ntk
    assert len(ntk["eigenvalues"]) == 2 and ctrl["rate"]["theory"] is None
    assert "§5.5 does not apply" in ctrl["rate"]["theory_reason"]
    rows = (tempdir / "shallow" / "history.csv").read_text().splitlines()
    assert rows[0].split(",")[-2:] == ["kl_gibbs", "gibbs_residual_l1"]


def test_a_check_that_raises_fails_and_the_rest_run(tempdir, monkeypatch, capfd):
    """A check raising something other than NumericalError (a fit on NaN errors, a log of a negative gap) is that
    check's failure, with the exception's type and message in report.json and the table; the checks after it
    run, and the job ends with exit 3 (was exit 1, no report.json, the rest not run)."""
    def broken(quick):
        raise ValueError("math domain error in a planted fit")

    monkeypatch.setitem(CHECKS, "stability_w1_data", dataclasses.replace(CHECKS["stability_w1_data"], run=broken))
    names = ["stability_w1_data", "gaussian_exact_d1"]
    assert main(["verify", "--quick", "--only", *names, "--out", str(tempdir)]) == 3
    rep = _report(tempdir)
    assert [c["name"] for c in rep["checks"]] == names and rep["passed"] is False
    bad, good = rep["checks"]
    assert bad["passed"] is False and bad["exception"]["type"] == "ValueError", bad
    assert "math domain error in a planted fit" in bad["exception"]["message"] and "ValueError" in bad["detail"]
    assert good["passed"] is True and good["exception"] is None
    out = capfd.readouterr()
    if MPI.COMM_WORLD.rank == 0:
        assert "raised ValueError: math domain error" in out.out, out.out
        assert "[1/2] stability_w1_data ... FAILED" in out.err and "[2/2] gaussian_exact_d1 ... passed (" in out.err



def test_an_exception_on_one_rank_fails_the_check_on_every_rank():
    """A check raising on the last rank only (the others reach their verdict): every rank records the failure,
    with the rank named under MPI, and the next collective still matches."""
    from mfpde.verify.registry import Outcome

    comm = MPI.COMM_WORLD

    def last_rank_raises(quick):
        if comm.rank == comm.size - 1:
            raise ZeroDivisionError("a planted division")
        return Outcome(1.0, 1.0, "= 1", True, "fine")

    rec = run_check(dataclasses.replace(CHECKS["gaussian_exact_d1"], run=last_rank_raises), quick=True)
    assert rec["passed"] is False and rec["exception"]["type"] == "ZeroDivisionError", rec
    assert rec["threshold"].startswith("raised ZeroDivisionError: a planted division")
    if comm.size > 1:
        assert f"(rank {comm.size - 1} of {comm.size})" in rec["detail"], rec["detail"]
    assert comm.allreduce(1) == comm.size


def test_one_log_line_per_check_and_no_repeated_solver_lines(tempdir, capfd):
    """Each check logs one line with a counter; the training problems the checks build do not repeat their
    "linear solvers" line (was one per problem: 43 in a quick run)."""
    names = ["gibbs_fixed_point", "free_energy_certificate"]
    assert main(["verify", "--quick", "--only", *names, "--out", str(tempdir)]) == 0
    err = capfd.readouterr().err
    if MPI.COMM_WORLD.rank == 0:
        assert "linear solvers" not in err, err
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 2 and "[1/2] gibbs_fixed_point ... passed (" in lines[0], lines
        assert "[2/2] free_energy_certificate ... passed (" in lines[1], lines


@pytest.mark.serial  # the bar is rank 0's
@pytest.mark.parametrize("quiet", [False, True])
def test_verify_progress_bar_on_a_terminal(tempdir, monkeypatch, quiet):
    """On a terminal verify shows a tqdm bar counting checks (with the running check's name), off with --quiet."""
    import io
    import logging
    import sys

    class Tty(io.StringIO):
        def isatty(self):
            return True

    root = logging.getLogger("mfpde")
    saved = root.handlers[:], root.level
    fake = Tty()
    monkeypatch.setattr(sys, "stderr", fake)
    try:
        code = main(["verify", "--quick", "--only", "gaussian_exact_d1", "--out", str(tempdir),
                     *(["--quiet"] if quiet else [])])
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    assert code == 0
    text = fake.getvalue()
    if quiet:
        assert text == "", text
    else:
        assert "mfpde verify" in text and "1/1 checks" in text and "ETA" in text and "gaussian_exact_d1" in text, text
        assert "[1/1] gaussian_exact_d1 ... passed (" in text, text
