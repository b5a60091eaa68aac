"""The Docker image, built and run for real: `.ci/docker-smoke` with rootful podman (see the script for why each step).

The script builds the image from the Dockerfile on a Debian trixie stand-in base, then runs a small
`mfpde run` (the main job, shrunk) in it serially and under `mpiexec -n 2`, and checks each report.json.
Its full output goes to out/docker-smoke.log.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from mpi4py import MPI

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "docker-smoke"
LOG = ROOT / "out" / "docker-smoke.log"
TIMEOUT = 40 * 60  # a cold run (apt, debootstrap, pip install of DOLFINx) takes a few minutes


@pytest.mark.container
@pytest.mark.serial
def test_docker_image_builds_and_runs_serial_and_mpi():
    if MPI.COMM_WORLD.size > 1:
        pytest.skip("builds the image once: run on one rank")
    if os.geteuid() != 0:
        pytest.skip("needs root: rootful podman, apt-get and debootstrap")

    LOG.parent.mkdir(parents=True, exist_ok=True)
    with LOG.open("w") as log:
        # Own session, so that a timeout ends podman and everything else the script started.
        proc = subprocess.Popen(
            ["bash", str(SCRIPT)],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
    out = LOG.read_text(errors="replace")
    tail = out[-6000:]
    assert rc is not None, f"docker-smoke timed out after {TIMEOUT} s; end of {LOG}:\n{tail}"
    assert rc == 0, f"docker-smoke exited {rc}; end of {LOG}:\n{tail}"
    lines = out.splitlines()
    assert "smoke: serial ok" in lines, f"serial report not checked; end of {LOG}:\n{tail}"
    assert "smoke: mpi ok" in lines, f"MPI report not checked; end of {LOG}:\n{tail}"
