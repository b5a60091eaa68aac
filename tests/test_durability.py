"""Interrupted runs lose nothing (issues 14, 15): every ρ snapshot of ``fields/rho.bp`` survives ``--resume``,
``wall_s`` counts the runs before a resume and the final outputs, and files are fsynced before their rename.

The files are read back with the ``adios2`` wheel from PyPI (the ``[test]`` extra).
"""

from __future__ import annotations

import json
import os
import time

from mpi4py import MPI

import numpy as np
import pytest
from configs import DEEP

from mfpde import io as mio
from mfpde.cli import main

pytestmark = pytest.mark.ranks  # the rank count can change what it checks: run again under mpiexec

SMALL = ["tokens.cells=[8, 8]", "heads.cells=[8, 8]", "depth.steps=4", "data.samples=2", "data.test_samples=0",
         "training.steps=4", "output.every=1", "output.checkpoint_every=1", "output.plots=false"]


def _args(extra):
    return [a for s in SMALL + extra for a in ("--set", s)]


def _read_rho(path):
    # adios2 only after dolfinx (imported by mfpde.cli): loaded first, the wheel's libadios2 breaks
    # dolfinx's own ADIOS2 library ("undefined symbol ... HDF5Common_MPI_API")
    import adios2

    with adios2.FileReader(str(path)) as f:
        n = f.num_steps()
        return f.read("step", step_selection=[0, n]), f.read("rho", step_selection=[0, n]).reshape(n, -1)


@pytest.mark.serial  # reads the .bp of one rank's blocks
def test_resume_keeps_every_rho_snapshot(tempdir):
    """Four steps straight, and two steps then --resume to four: the same 5 snapshots (was 3 after a resume)."""
    a, b = tempdir / "a", tempdir / "b"
    assert main(["run", DEEP, "--out", str(a), "--quiet", *_args([])]) == 0
    assert main(["run", DEEP, "--out", str(b), "--quiet", *_args(["training.steps=2"])]) == 0
    assert main(["run", DEEP, "--out", str(b), "--quiet", "--resume", *_args([])]) == 0
    sa, ra = _read_rho(a / "fields" / "rho.bp")
    sb, rb = _read_rho(b / "fields" / "rho.bp")
    np.testing.assert_allclose(sb, sa, rtol=0, atol=1e-15)
    assert len(sa) == 5, sa
    np.testing.assert_allclose(rb, ra, rtol=1e-9, atol=1e-12)


@pytest.mark.serial  # times one process
def test_wall_s_counts_resumed_runs_and_final_outputs(tempdir):
    out = tempdir / "out"
    t0 = time.perf_counter()
    assert main(["run", DEEP, "--out", str(out), "--quiet", *_args(["training.steps=2", "output.plots=true"])]) == 0
    first = time.perf_counter() - t0
    wall = json.loads((out / "report.json").read_text())["wall_s"]
    assert 0.9 * first - 0.5 <= wall <= first, (wall, first)  # plots and the last evaluation included
    with np.load(out / "checkpoint" / "state.npz") as z:
        ck_wall = float(z["wall_s"])
    assert 0 < ck_wall <= wall
    t0 = time.perf_counter()
    assert main(["run", DEEP, "--out", str(out), "--quiet", "--resume", *_args([])]) == 0
    second = time.perf_counter() - t0
    wall2 = json.loads((out / "report.json").read_text())["wall_s"]
    assert ck_wall + 0.9 * second - 0.5 <= wall2 <= ck_wall + second, (wall2, ck_wall, second)


def test_atomic_writes_fsync_before_rename(tempdir, monkeypatch):
    """write_atomic and save_checkpoint flush the file to disk before renaming it into place."""
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda s, d: (events.append(f"replace {os.path.basename(d)}"),
                                                     real_replace(s, d))[1])
    mio.write_atomic(tempdir / "report.json", "{}\n")
    mio.save_checkpoint(tempdir, {"x": np.arange(3.0)})
    if MPI.COMM_WORLD.rank == 0:
        for name in ("report.json", "state.npz"):
            i = events.index(f"replace {name}")
            assert events[i - 1] == "fsync" and events[i + 1] == "fsync", events  # the file, then its directory
        assert (tempdir / "report.json").read_text() == "{}\n"
    else:
        assert events == []


@pytest.mark.serial  # launches its own processes
def test_sigkill_then_resume_gives_the_straight_run(tempdir):
    """SIGKILL a run as soon as its first checkpoint exists (step 2 of 16), then --resume: the history (but
    wall_s), the final report values and every ρ snapshot of rho.bp equal those of an uninterrupted run.

    (A kill at a fixed delay after it was tried: on an idle machine the run had ended by then.)
    """
    import csv
    import signal
    import subprocess
    import sys

    from test_mpi_failures import ROOT

    args = [a for s in [*SMALL, "training.steps=16", "output.checkpoint_every=2"] for a in ("--set", s)]
    straight, killed = tempdir / "straight", tempdir / "killed"
    assert main(["run", DEEP, "--out", str(straight), "--quiet", *args]) == 0
    proc = subprocess.Popen([sys.executable, "-m", "mfpde", "run", DEEP, "--out", str(killed), "--quiet", *args],
                            cwd=ROOT, stderr=subprocess.DEVNULL)
    t0 = time.monotonic()
    while not (killed / "checkpoint" / "state.npz").exists() and proc.poll() is None:
        assert time.monotonic() - t0 < 300, "no checkpoint"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run ended before the kill: lengthen it"
    assert main(["run", DEEP, "--out", str(killed), "--quiet", "--resume", *args]) == 0
    rows = [list(csv.DictReader((d / "history.csv").open())) for d in (straight, killed)]
    assert [r["step"] for r in rows[0]] == [r["step"] for r in rows[1]]
    for a, b in zip(*rows, strict=True):
        for k in a:
            if k != "wall_s":
                assert float(a[k]) == pytest.approx(float(b[k]), rel=1e-9, abs=1e-14), (k, a, b)
    fa, fb = (json.loads((d / "report.json").read_text())["final"] for d in (straight, killed))
    assert fb["risk"] == pytest.approx(fa["risk"], rel=1e-9) and fb["rho_mean"] == pytest.approx(fa["rho_mean"])
    sa, ra = _read_rho(straight / "fields" / "rho.bp")
    sb, rb = _read_rho(killed / "fields" / "rho.bp")
    np.testing.assert_allclose(sb, sa, rtol=0, atol=1e-15)
    np.testing.assert_allclose(rb, ra, rtol=1e-9, atol=1e-12)


FULL = '''
mkdir -p "$MNT" && mount -t tmpfs -o size={size} tmpfs "$MNT" || exit 97
exec "$@"
'''


def _on_full_disk(tmp, size: str, args: list[str], n: int) -> tuple[int, str]:
    """Run mfpde (on n ranks) with DIR on a tmpfs of ``size`` in a private mount namespace (unshare -m); bounded."""
    import shutil
    import subprocess
    import sys

    from test_mpi_failures import MPIEXEC, ROOT, finish

    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to mount a small file system")
    mnt = tmp / "mnt"
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", FULL.format(size=size), "sh",
           *([MPIEXEC, "-n", str(n)] if n > 1 else []), sys.executable, "-m", "mfpde", *args, "--out", str(mnt / "out")]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "MNT": str(mnt), "OMP_NUM_THREADS": "1"}, text=True,
                            stderr=subprocess.PIPE, start_new_session=True)
    err = finish(proc, 240, f"on a full disk: {args}")
    if proc.returncode == 97:
        pytest.skip("cannot mount a tmpfs here (unprivileged)")
    return proc.returncode, err


@pytest.mark.serial  # launches its own processes
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("command", ["transport", "run"])
def test_full_disk_while_writing_fields_exit_2_one_line(tempdir, command, n):
    """The .bp fields fill the disk: exit 2 and one line naming the file (was exit 134, ADIOS2's terminate, serially
    and a hang in VTXWriter.write on 2 ranks); a run has checkpointed ρ of the step whose field was refused."""
    from test_mpi_failures import ROOT

    if command == "transport":
        args = ["transport", str(ROOT / "demos" / "transport_small.toml"), "--set", "depth.steps=400",
                "--set", "output.every=1", "--set", "tokens.cells=[400]"]
        size = "300k"
    else:
        args = ["run", DEEP, "--quiet", *_args(["training.steps=200", "output.checkpoint_every=1000",
                                                 "tokens.outflow_tol=0.5"])]
        size = "1200k"
    rc, err = _on_full_disk(tempdir, size, args, n)
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("mfpde[0/")]
    assert rc == 2, err
    assert len(lines) == 1 and ".bp" in lines[0] and "No space left on device" in lines[0], err
    assert "Traceback" not in err and "terminate" not in err, err


def test_checkpoint_writes_each_record_once(tempdir):
    """Checkpoints at every step: the bytes written per checkpoint do not grow with the run (they did: every ρ
    snapshot and the whole history, rewritten each time), and --resume reads the appended records back."""
    out = tempdir / "out"
    sizes: list[int] = []
    real = mio.save_checkpoint

    def spy(o, arrays, comm=MPI.COMM_WORLD):
        real(o, arrays, comm)
        if comm.rank == 0:
            sizes.append((o / "checkpoint" / "state.npz").stat().st_size)

    import mfpde.training.records as rec

    rec.save_checkpoint = spy  # type: ignore[assignment]
    try:
        assert main(["run", DEEP, "--out", str(out), "--quiet", *_args(["training.steps=12"])]) == 0
    finally:
        rec.save_checkpoint = real  # type: ignore[assignment]
    if MPI.COMM_WORLD.rank == 0:
        assert len(sizes) == 12 and max(sizes) == min(sizes), sizes  # O(size of ρ), whatever the step
        with np.load(out / "checkpoint" / "state.npz") as z:
            assert int(z["n_history"]) == 13 and int(z["n_snapshots"]) == 13 and "snap_rho" not in z.files
        width = 1 + 81  # the step and ρ on the 9 × 9 Θ vertices
        assert (out / "checkpoint" / "snapshots.f8").stat().st_size == 13 * width * 8


def test_resume_on_other_token_cells_is_refused(tempdir, capfd):
    """DIR/config.toml edited to other token cells and resumed from: the checkpoint of an 8×8 run continued on
    10×10 cells (Θ was fingerprinted in the checkpoint, Ω not). Now exit 2 naming the token space, nothing
    changed in DIR; resuming with the unedited file still works."""
    out = tempdir / "out"
    assert main(["run", DEEP, "--out", str(out), "--quiet", *_args(["training.steps=2"])]) == 0
    cfg = out / "config.toml"
    text = cfg.read_text()
    assert "cells = [8, 8]" in text
    if MPI.COMM_WORLD.rank == 0:  # the first cells are the tokens' ([tokens] comes first); the resumed config is the
        cfg.write_text(text.replace("cells = [8, 8]\n", "cells = [10, 10]\n", 1))  # file: no difference to it
    MPI.COMM_WORLD.Barrier()
    before = (out / "checkpoint" / "state.npz").read_bytes()
    assert main(["run", str(cfg), "--out", str(out), "--quiet", "--resume", "--set", "training.steps=4"]) == 2
    err = capfd.readouterr().err
    if MPI.COMM_WORLD.rank == 0:
        assert "token space Ω" in err and len(err.strip().splitlines()) == 1, err
    assert (out / "checkpoint" / "state.npz").read_bytes() == before
    if MPI.COMM_WORLD.rank == 0:
        cfg.write_text(text)
    MPI.COMM_WORLD.Barrier()
    assert main(["run", str(cfg), "--out", str(out), "--quiet", "--resume", "--set", "training.steps=4"]) == 0
