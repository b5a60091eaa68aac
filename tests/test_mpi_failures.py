"""Failures under ``mpiexec -n 2`` end the job, on every rank, instead of hanging (issue 14).

Each case launches the wheel's ``mpiexec -n 2`` in a subprocess under a timeout (a hang fails the test
instead of the suite): an unexpected exception on one rank, an input error raised on one rank only, a rank
that owns no Θ node, a truncated or empty checkpoint with ``--resume``, a file named ``checkpoint`` in
DIR and a DIR that cannot be created.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mpi4py import MPI  # noqa: F401  (import order)

import pytest
from configs import DEEP
from roundoff import gamma

pytestmark = pytest.mark.ranks  # the rank count can change what it checks: run again under mpiexec

ROOT = Path(__file__).resolve().parent.parent
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")
SMALL = ["tokens.cells=[8, 8]", "heads.cells=[8, 8]", "depth.steps=4", "data.samples=2", "data.test_samples=0",
         "training.steps=2", "output.plots=false", "output.fields=false", "output.checkpoint_every=1"]
#: value heads on a Θ mesh of two cells (three vertices): with 3 ranks one rank owns no Θ node (a wide ρ₀, σ = 1:
#: one narrower than the Θ cells resolve is refused at the door)
ONE_CELL = ["heads.family='value'", "heads.box=[[-2.0, 2.0]]", "heads.cells=[2]",
            "heads.init={kind = 'gaussian', mean = [0.5], cov = [[1.0]]}", "training.steps=0",
            "tokens.outflow_tol=0.5", "data.test_samples=0", "output.plots=false"]


def _sets(overrides: list[str]) -> list[str]:
    return [a for s in overrides for a in ("--set", s)]


def finish(proc: subprocess.Popen, timeout: float, what: str) -> str:
    """Wait for ``proc`` (started with ``start_new_session``) and return its stderr; if it does not end within
    ``timeout`` seconds, kill its whole process group (mpiexec and every rank) and fail the test as hung."""
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"hung: {what} (killed after {timeout:g} s)")


def launch(args: list[str], n: int = 2, timeout: float = 240, env: dict[str, str] | None = None,
           python: bool = False) -> tuple[int, str, float]:
    """Run ``mpiexec -n n`` (python -c ... or ``-m mfpde``) with a timeout; (exit status, stderr, seconds).

    A run that does not end in time is killed with its whole process group and fails the test.
    """
    cmd = [MPIEXEC, "-n", str(n), sys.executable, *(args if python else ["-m", "mfpde", *args])]
    e = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=e, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    err = finish(proc, timeout, " ".join(args))
    return proc.returncode, err, time.monotonic() - t0


PLANT = '''
import sys
from mpi4py import MPI
import mfpde.tokens.box.job as job
from mfpde import cli
from mfpde.errors import ConfigError

def planted(cfg, comm, fields, bar, setup):
    if MPI.COMM_WORLD.rank == 1:
        raise {exc}("planted on rank 1")
    MPI.COMM_WORLD.allreduce(1)  # rank 0 waits here for rank 1, which never comes

job.solve = planted
sys.exit(cli.main(["transport", "demos/transport_small.toml", "--out", {out!r}]))
'''


@pytest.mark.serial
@pytest.mark.parametrize(("exc", "code"), [("RuntimeError", 1), ("ConfigError", 2)])
def test_one_rank_exception_ends_the_job(tmp_path, exc, code):
    """A bug on one rank aborts at once with its traceback; an input error on one rank alone aborts after
    ``MFPDE_MPI_EXIT_TIMEOUT`` instead of leaving rank 0 in its allreduce for ever."""
    rc, err, dt = launch(["-c", PLANT.format(exc=exc, out=str(tmp_path / "out"))], python=True,
                         env={"MFPDE_MPI_EXIT_TIMEOUT": "3"})
    assert rc != 0, err
    assert dt < 120, f"took {dt:.0f} s: {err}"
    if exc == "RuntimeError":
        assert "unexpected RuntimeError on rank 1 of 2: planted on rank 1" in err, err
        assert "Traceback" in err, err
    else:
        assert "rank 1 ended with exit status 2" in err and "MFPDE_MPI_EXIT_TIMEOUT" in err, err


PLANT_RUN = '''
import sys
from mpi4py import MPI
from mfpde import cli
from mfpde.training.objective import Objective

gradient = Objective.gradient
calls = [0]

def planted(self, *args, **kwargs):
    calls[0] += 1
    if calls[0] == 2 and MPI.COMM_WORLD.rank == 0:
        raise RuntimeError("planted on rank 0")
    return gradient(self, *args, **kwargs)

Objective.gradient = planted
sys.exit(cli.main(["run", {DEEP!r}, "--quiet", "--out", {out!r}, *{sets!r}]))
'''


@pytest.mark.serial
def test_one_rank_exception_in_a_run_with_fields_ends_the_job(tmp_path):
    """A bug on rank 0 in the second training step, ``output.fields`` on: the driver closed the VTX file of ρ in its
    ``finally`` (collective: rank 0 gathers the metadata) while the other rank waited in the forward solve, and
    the job hung."""
    sets = _sets([s for s in SMALL if not s.startswith("output.fields")] + ["output.fields=true"])
    rc, err, dt = launch(["-c", PLANT_RUN.format(out=str(tmp_path / "out"), sets=sets, DEEP=DEEP)], python=True,
                         env={"MFPDE_MPI_EXIT_TIMEOUT": "3"}, timeout=120)
    assert rc != 0, err
    assert "unexpected RuntimeError on rank 0 of 2: planted on rank 0" in err, err


@pytest.mark.serial
def test_rank_without_theta_node_gives_the_serial_result(tmp_path):
    results = {}
    for n in (1, 3):
        out = tmp_path / f"n{n}"
        rc, err, _ = launch(["run", DEEP, "--quiet", "--out", str(out), *_sets(ONE_CELL)], n=n)
        assert rc == 0, err
        results[n] = json.loads((out / "report.json").read_text())["final"]
    for key in ("risk", "free_energy", "mass_rho", "min_rho"):
        assert results[3][key] == pytest.approx(results[1][key], rel=1e-12, abs=1e-14), key


#: d = 1, DG1 on 2 token cells and value heads on 2 Θ cells: with 3 ranks one rank owns no token cell or Θ node
#: (a wide sample, σ = 4, and a wide ρ₀, σ = 1: narrower ones are refused at the door)
FEW_CELLS = ["tokens.dim=1", "tokens.box=[[-4.0, 4.0]]", "tokens.cells=[2]", "tokens.degree=1",
             "tokens.outflow_tol=1.0", "data.kind='gaussian'", "data.mean=[[0.3]]", "data.cov=[[[16.0]]]",
             "data.target=[1.0]",
             "loss.readout='mean'", "heads.family='value'", "heads.box=[[-2.0, 2.0]]", "heads.cells=[2]",
             "heads.init={kind = 'gaussian', mean = [0.5], cov = [[1.0]]}", "training.steps=2", "output.plots=false"]


@pytest.mark.serial
@pytest.mark.parametrize("degree", [0, 1])
def test_more_ranks_than_token_cells_gives_the_serial_result(tmp_path, degree):
    """3 ranks, 2 token cells (issue 14): a rank without a token vertex raised on max() of an empty array in the
    d = 1 velocity while the others waited in a collective (DG1), and a rank without a token cell raised in the
    DG0 facet arrays (reshape of an empty cell-vertex list: MPI_Abort); now both give the serial result (and
    write fields)."""
    results = {}
    for n in (1, 3):
        out = tmp_path / f"n{n}"
        rc, err, _ = launch(["run", DEEP, "--quiet", "--out", str(out),
                             *_sets([*FEW_CELLS, f"tokens.degree={degree}"])], n=n)
        assert rc == 0, err
        results[n] = json.loads((out / "report.json").read_text())["final"]
    # the same operations in another reduction order: 2 training steps of forward + adjoint through ≤ 40 CFL
    # sub-steps of 3 stages, ≤ 50 roundings a dof each, summed over the cells: ≤ 2e4 roundings per value
    for key in ("risk", "free_energy", "mass_rho", "min_rho"):
        assert abs(results[3][key] - results[1][key]) <= gamma(2e4) * abs(results[1][key]), key


@pytest.mark.serial
@pytest.mark.parametrize("damage", ["truncated", "empty"])
def test_damaged_checkpoint_resume_exit_2_on_every_rank(tmp_path, damage):
    out = tmp_path / "out"
    rc, err, _ = launch(["run", DEEP, "--quiet", "--out", str(out), *_sets(SMALL)])
    assert rc == 0, err
    f = out / "checkpoint" / "state.npz"
    f.write_bytes(f.read_bytes()[:100] if damage == "truncated" else b"")
    rc, err, _ = launch(["run", DEEP, "--quiet", "--resume", "--out", str(out), *_sets(SMALL)])
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and str(f) in lines[0] and "Traceback" not in err, err


@pytest.mark.serial
@pytest.mark.parametrize("case", ["checkpoint_file", "out_under_a_file"])
def test_bad_output_dir_exit_2_on_every_rank(tmp_path, case):
    if case == "checkpoint_file":
        out = tmp_path / "out"
        out.mkdir()
        (out / "checkpoint").write_text("not a directory")
        names = str(out / "checkpoint")
    else:
        (tmp_path / "file").write_text("")
        out = tmp_path / "file" / "out"
        names = str(out)
    rc, err, _ = launch(["run", DEEP, "--quiet", "--out", str(out), *_sets(SMALL)])
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and names in lines[0] and "Traceback" not in err, err


PLANT_VERIFY = '''
import dataclasses, sys
from mpi4py import MPI
from mfpde import cli
from mfpde.jobs import verify as job
from mfpde.verify.registry import CHECKS, Outcome

job._load_checks()

def planted(quick):
    if MPI.COMM_WORLD.rank == 1:
        raise ValueError("planted on rank 1")
    MPI.COMM_WORLD.allreduce(1)  # rank 0 waits here for rank 1, which never comes
    return Outcome(1.0, 1.0, "= 1", True, "")

CHECKS["gaussian_exact_d1"] = dataclasses.replace(CHECKS["gaussian_exact_d1"], run=planted)
sys.exit(cli.main(["verify", "--quick", "--only", "gaussian_exact_d1", "--out", {out!r}]))
'''


@pytest.mark.serial
def test_verify_check_raising_on_one_rank_inside_a_collective_ends_the_job(tmp_path):
    """A check raising on one rank while the others wait in its collective: verify cannot record it as the check's
    failure (agreeing would hang), so the job ends with the bug's exit 1 after MFPDE_MPI_EXIT_TIMEOUT."""
    rc, err, dt = launch(["-c", PLANT_VERIFY.format(out=str(tmp_path / "out"))], python=True,
                         env={"MFPDE_MPI_EXIT_TIMEOUT": "3"})
    assert rc != 0 and "unexpected ValueError on rank 1 of 2: planted on rank 1" in err, err
    assert dt < 120, f"took {dt:.0f} s: {err}"
