"""The MPI test run ends, instead of hanging, when a test fails on one rank before a collective (issue 14)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mpi4py import MPI  # noqa: F401  (import order)

import pytest

pytestmark = pytest.mark.ranks  # the rank count can change what it checks: run again under mpiexec

ROOT = Path(__file__).resolve().parent.parent
ONE_RANK_FAILS = '''
from mpi4py import MPI

import pytest

pytestmark = pytest.mark.ranks  # under MPI the conftest runs only tests marked ranks


def test_fails_on_rank_1_before_a_collective():
    comm = MPI.COMM_WORLD
    assert comm.rank != 1, "planted failure on rank 1"
    comm.allreduce(1)  # rank 0 waits here for rank 1, which never comes


def test_never_reached():
    pass
'''


@pytest.mark.serial
def test_one_rank_failure_aborts_instead_of_hanging(tmp_path):
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "test_planted.py").write_text(ONE_RANK_FAILS)
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = {**os.environ, "MFPDE_TEST_MPI_TIMEOUT": "5", "OMP_NUM_THREADS": "1"}
    t0 = time.monotonic()
    proc = subprocess.Popen([str(mpiexec), "-n", "2", sys.executable, "-m", "mpi4py", "-m", "pytest", "-q",
                             "-p", "no:cacheprovider", str(tmp_path)], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # mpiexec and both ranks
        proc.communicate()
        pytest.fail("the MPI test run hung on a one-rank failure (killed after 300 s)")
    elapsed = time.monotonic() - t0
    out = stdout + stderr
    assert proc.returncode != 0, out
    assert "did not finish" in out and "test_fails_on_rank_1_before_a_collective" in out, out
    assert elapsed < 120, f"took {elapsed:.0f} s"
