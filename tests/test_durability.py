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
from configs import DEEP, ROOT

from mfpde import io as mio
from mfpde.cli import main

CIRCLE = str(ROOT / "demos" / "circle.toml")
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


#: KiB of the file-size limit (``ulimit -f``) of the test below: above the shared-memory files (4 MiB) that MPICH's
#: UCX creates at start-up, below the 400 depth steps of μ on 4000 DG1 cells (about 0.4 MiB a step).
FSIZE_KIB = 16384


@pytest.mark.serial  # launches its own processes
@pytest.mark.parametrize("n", [1, 2])
def test_file_size_limit_while_writing_fields_exit_2_one_line(tempdir, n):
    """``ulimit -f`` reached by a .bp field: exit 2 and one line naming the file and the limit, on every rank (was
    exit 1 with ADIOS2's EFBIG traceback serially, a hang on 2 ranks); the steps written stay readable."""
    import subprocess
    import sys

    from test_mpi_failures import MPIEXEC, ROOT, finish

    out = tempdir / "out"
    args = ["transport", str(ROOT / "demos" / "transport_small.toml"), "--quiet", "--set", "depth.steps=400",
            "--set", "output.every=1", "--set", "tokens.cells=[4000]", "--out", str(out)]
    cmd = ["bash", "-c", f'ulimit -f {FSIZE_KIB} && exec "$@"', "bash",
           *([MPIEXEC, "-n", str(n)] if n > 1 else []), sys.executable, "-m", "mfpde", *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, text=True,
                            stderr=subprocess.PIPE, start_new_session=True)
    err = finish(proc, 180, f"ulimit -f {FSIZE_KIB}, {n} ranks")
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("mfpde[0/")]
    assert proc.returncode == 2, err
    assert len(lines) == 1 and "mu_0.bp" in lines[0] and "ulimit -f" in lines[0], err
    assert "Traceback" not in err and "ADIOS2" not in err, err
    assert not (out / "report.json").exists()
    data = out / "fields" / "mu_0.bp" / "data.0"
    assert 0 < data.stat().st_size <= FSIZE_KIB * 1024
    field = mio.read_vtx(out / "fields" / "mu_0.bp")  # every step written whole
    assert len(field.times) >= 2 and all(np.isfinite(v).all() for v in field.values)


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

    import mfpde.jobs.records as rec

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


def test_resume_of_a_depth_indexed_run_gives_the_straight_run(tempdir):
    """Two layer blocks: four steps straight, and two steps then --resume to four, end with the same ρ of every
    block (each resume test had one block: block 0's ρ restored into every block passed them)."""
    a, b = tempdir / "a", tempdir / "b"
    blocks = ["depth.model='depth-indexed'", "depth.layers=2", "output.fields=false"]
    assert main(["run", DEEP, "--out", str(a), "--quiet", *_args(blocks)]) == 0
    assert main(["run", DEEP, "--out", str(b), "--quiet", *_args([*blocks, "training.steps=2"])]) == 0
    assert main(["run", DEEP, "--out", str(b), "--quiet", "--resume", *_args(blocks)]) == 0
    MPI.COMM_WORLD.Barrier()
    fa, fb = (json.loads((d / "report.json").read_text())["final"] for d in (a, b))
    ma, mb = np.array(fa["rho_mean"]), np.array(fb["rho_mean"])
    assert ma.shape[0] == 2 and np.ptp(ma, axis=0).max() > 1e-6, ma  # the blocks' ρ differ: a mix-up is visible
    np.testing.assert_allclose(mb, ma, rtol=1e-9, atol=1e-12)
    assert fb["risk"] == pytest.approx(fa["risk"], rel=1e-9)


def test_history_csv_is_appended_at_every_output_step(tempdir, monkeypatch):
    """history.csv was written only at checkpoints and at the end (``tail -f`` showed nothing for 100 steps): each
    output row is on disk before the next training step."""
    import csv

    from mfpde.training.splitting import Splitting

    out, seen = tempdir / "out", []
    real = Splitting.step

    def spy(self, ds):
        if MPI.COMM_WORLD.rank == 0:
            seen.append([int(r["step"]) for r in csv.DictReader((out / "history.csv").open())])
        return real(self, ds)

    monkeypatch.setattr(Splitting, "step", spy)
    assert main(["run", DEEP, "--out", str(out), "--quiet",
                 *_args(["output.checkpoint_every=100", "output.every=2", "output.fields=false"])]) == 0
    if MPI.COMM_WORLD.rank == 0:
        assert seen == [[0], [0], [0, 2], [0, 2]], seen  # steps 0..3 advance ρ; rows at 0 and 2 before them


def test_resume_repairs_a_torn_history_and_logs_the_new_step_count(tempdir, capfd):
    """A killed job can leave history.csv cut mid-line; --resume rewrites it from the checkpoint. A resume with
    another training.steps (the original's --set left out) continued silently: it is a warning line and the
    report's ``resumed`` block."""
    a, b = tempdir / "a", tempdir / "b"
    assert main(["run", DEEP, "--out", str(a), "--quiet", *_args([])]) == 0
    assert main(["run", DEEP, "--out", str(b), "--quiet", *_args(["training.steps=2"])]) == 0
    comm = MPI.COMM_WORLD
    if comm.rank == 0:
        text = (b / "history.csv").read_text()
        (b / "history.csv").write_text(text[: len(text) - 17])  # the last row cut mid-line
    comm.barrier()
    capfd.readouterr()
    assert main(["run", DEEP, "--out", str(b), "--resume", *_args([])]) == 0
    err = capfd.readouterr().err
    if comm.rank != 0:
        return
    assert "training.steps = 4 differs from the checkpoint's run (2)" in err, err
    report = json.loads((b / "report.json").read_text())
    assert report["resumed"] == {"from_step": 2, "previous_steps": 2, "steps": 4}, report["resumed"]
    assert any("training.steps = 4" in w for w in report["warnings"]), report["warnings"]
    import csv

    rows = [list(csv.DictReader((d / "history.csv").open())) for d in (a, b)]
    assert [r["step"] for r in rows[1]] == ["0", "1", "2", "3", "4"], rows[1]
    for ra, rb in zip(*rows, strict=True):
        assert {k: v for k, v in ra.items() if k != "wall_s"} == {k: v for k, v in rb.items() if k != "wall_s"}
    # ŷ of ρ₀ (kept from step 0 by a straight run, solved again after a resume) and of ρ_S: the same
    pa, pb = (np.loadtxt(d / "predictions.csv", delimiter=",", skiprows=1, usecols=(0, 2, 3, 4)) for d in (a, b))
    np.testing.assert_allclose(pb, pa, rtol=1e-12, atol=1e-14)


def test_a_finished_out_is_refused_without_resume_or_overwrite(tempdir, capfd):
    """Running into a finished --out silently overwrote it: exit 2 with one line naming --resume and --overwrite."""
    out = tempdir / "out"
    args = ["run", DEEP, "--out", str(out), "--quiet", *_args(["training.steps=1", "output.fields=false"])]
    assert main(args) == 0
    before = (out / "report.json").read_text() if MPI.COMM_WORLD.rank == 0 else ""
    capfd.readouterr()
    assert main(args) == 2
    err = capfd.readouterr().err
    if MPI.COMM_WORLD.rank == 0:
        (line,) = err.strip().splitlines()
        assert "finished run" in line and "--resume" in line and "--overwrite" in line, line
        assert (out / "report.json").read_text() == before  # nothing touched
    assert main([*args, "--overwrite"]) == 0


def test_resume_on_other_token_cells_is_refused(tempdir, capfd):
    """DIR/config.toml edited to other token cells and resumed from: the checkpoint of an 8×8 run continued on
    10×10 cells (Θ was fingerprinted in the checkpoint, Ω not). Now exit 2 naming the token space, nothing
    changed in DIR; resuming with the unedited file still works."""
    out = tempdir / "out"
    assert main(["run", DEEP, "--out", str(out), "--quiet", *_args(["training.steps=2"])]) == 0
    cfg = out / "config.toml"
    text = cfg.read_text()
    assert "cells = [8, 8]" in text
    MPI.COMM_WORLD.Barrier()  # every rank has read it before rank 0 edits it (a rank read the edit: hung at 600 s)
    if MPI.COMM_WORLD.rank == 0:  # the first cells are the tokens' ([tokens] comes first); the resumed config is the
        cfg.write_text(text.replace("cells = [8, 8]\n", "cells = [10, 10]\n", 1))  # file: no difference to it
    MPI.COMM_WORLD.Barrier()
    before = (out / "checkpoint" / "state.npz").read_bytes()
    capfd.readouterr()  # the first run's lines (a warning on its heads box, say)
    assert main(["run", str(cfg), "--out", str(out), "--quiet", "--resume", "--set", "training.steps=4"]) == 2
    err = capfd.readouterr().err
    if MPI.COMM_WORLD.rank == 0:
        assert "token space Ω" in err and len(err.strip().splitlines()) == 1, err
    assert (out / "checkpoint" / "state.npz").read_bytes() == before
    if MPI.COMM_WORLD.rank == 0:
        cfg.write_text(text)
    MPI.COMM_WORLD.Barrier()
    assert main(["run", str(cfg), "--out", str(out), "--quiet", "--resume", "--set", "training.steps=4"]) == 0


def _tree(d):
    """{relative path: bytes} of every file under d (rank 0), or {} if d does not exist."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()} if d.exists() else {}


def test_a_refused_first_step_loses_nothing(tempdir, capfd):
    """A run refused at its first depth step (exit 2: the input's own velocity needs more CFL sub-steps than
    allowed) had already cleared DIR's previous result and left its own config.toml and fields/mu_0.bp: now DIR is
    as it was, byte for byte, and a DIR the refused run created is gone; a run that succeeds leaves no trace of the
    previous result."""
    comm = MPI.COMM_WORLD
    out, fresh = tempdir / "out", tempdir / "fresh"
    ok = ["transport", CIRCLE, "--out", str(out), "--quiet", "--set", "depth.T=0.1", "--set", "output.plots=false"]
    refused = ["--set", "tokens.beta=400"]  # USA: the velocity grows like e^β
    assert main(ok) == 0
    before = _tree(out) if comm.rank == 0 else {}
    assert "report.json" in before or comm.rank != 0
    capfd.readouterr()
    assert main([*ok, *refused]) == 2
    err = capfd.readouterr().err
    assert main(["transport", CIRCLE, "--out", str(fresh), "--quiet", *refused]) == 2
    if comm.rank == 0:
        assert "tokens.beta: depth step 1" in err, err
        assert _tree(out) == before
        assert not (out / ".mfpde-previous").exists() and not fresh.exists()
    comm.Barrier()
    assert main([*ok, "--set", "depth.T=0.05"]) == 0
    if comm.rank == 0:
        assert not (out / ".mfpde-previous").exists()
        assert json.loads((out / "report.json").read_text())["samples"][0]["t"][-1] == pytest.approx(0.05)


@pytest.mark.serial  # the file operations of rank 0 alone
def test_output_dir_transaction(tempdir):
    """mfpde.outdir: a job that ends without a result of its own (a signal or a crash before its report or first
    checkpoint) puts the previous result back; one with a report replaces it; after a job killed outright (its
    partial output in DIR, the result before it in .mfpde-previous/) the next job keeps the older result."""
    from mfpde.errors import ConfigError, InputRefused
    from mfpde.outdir import PREVIOUS, prepare_output_dir, settle_output_dir

    out = tempdir / "out"
    (out / "fields").mkdir(parents=True)
    (out / "report.json").write_text("old")
    (out / "predictions.csv").write_text("old")
    (out / "fields" / "mu.bp").write_text("old")
    before = _tree(out)
    prepare_output_dir(out, MPI.COMM_SELF)
    assert _tree(out) == {f"{PREVIOUS}/{k}": v for k, v in before.items()}
    (out / "config.toml").write_text("new")  # a job interrupted before its report
    (out / "plots").mkdir()
    settle_output_dir(out, KeyboardInterrupt())
    assert _tree(out) == before and not (out / PREVIOUS).exists()
    prepare_output_dir(out, MPI.COMM_SELF)  # a job that writes its report
    (out / "report.json").write_text("new")
    settle_output_dir(out, None)
    assert _tree(out) == {"report.json": b"new"}
    prepare_output_dir(out, MPI.COMM_SELF)  # killed outright after writing some fields: nothing settles
    (out / "fields").mkdir()
    (out / "fields" / "partial.bp").write_text("partial")
    prepare_output_dir(out, MPI.COMM_SELF)  # the next job (refused)
    settle_output_dir(out, InputRefused("refused"))
    assert _tree(out) == {"report.json": b"new"}
    prepare_output_dir(out, MPI.COMM_SELF)  # a full disk (ConfigError) with no report: the steps written stay
    (out / "fields").mkdir()
    (out / "fields" / "steps.bp").write_text("written")
    settle_output_dir(out, ConfigError("full disk"))
    assert _tree(out) == {"fields/steps.bp": b"written"}


@pytest.mark.parametrize("demo,refused,key", [
    (None, "tokens.cfl=1e-9", "tokens.cfl"),
    # the checkpoints of value_heads' first depth solve (9 sub-steps of 1600-byte states) need 16 627 bytes
    (ROOT / "demos" / "value_heads.toml", "training.tape_memory=12000", "training.tape_memory")])
def test_a_refused_overwrite_keeps_the_finished_run(tempdir, capfd, demo, refused, key):
    """``run --overwrite`` refused in its first evaluation: tokens.cfl too small (more CFL sub-steps than allowed
    at the input's own velocity), or a tape budget that cannot hold the checkpoints of the first depth solve. The
    refusal crossed the rank groups as a plain ConfigError, so the finished run in DIR was deleted and a
    header-only history.csv and an empty fields/rho.bp were left. Now DIR is as it was."""
    comm = MPI.COMM_WORLD
    out = tempdir / "out"
    args = (["run", DEEP, "--out", str(out), "--quiet", *_args(["training.steps=1"])] if demo is None else
            ["run", str(demo), "--out", str(out), "--quiet", "--set", "training.steps=1"])
    assert main(args) == 0
    before = _tree(out) if comm.rank == 0 else {}
    capfd.readouterr()
    assert main([*args, "--overwrite", "--set", refused]) == 2
    err = capfd.readouterr().err
    if comm.rank == 0:
        assert key in err, err
        assert _tree(out) == before and not (out / ".mfpde-previous").exists()


def test_resume_with_another_tape_budget(tempdir):
    """A run refused mid-way by its tape budget could not be continued with a larger one (--resume refused every key
    but training.steps and output.*): the budget changes memory, not results, and may now change."""
    out = tempdir / "out"
    first = ["training.steps=2", "training.tape_memory='64MiB'"]
    assert main(["run", DEEP, "--out", str(out), "--quiet", *_args(first)]) == 0
    assert main(["run", DEEP, "--out", str(out), "--quiet", "--resume",
                 *_args(["training.tape_memory='128MiB'"])]) == 0


@pytest.mark.serial  # launches its own process
@pytest.mark.parametrize("refused", ["tokens.cfl=1e-7", "depth.T=999999"])
def test_a_refused_box_transport_writing_fields_exit_2(tempdir, refused):
    """A box transport with fields on, refused at its first depth step: exit 2 and one line (was exit 134 after the
    line: the VTX writer of fields/mu_0.bp was destroyed after DIR's fields/ was removed, and ADIOS2 ended the process
    in std::terminate). The writer is closed before DIR is settled."""
    import subprocess
    import sys

    out = tempdir / "out"
    cmd = [sys.executable, "-m", "mfpde", "transport", str(ROOT / "demos" / "transport_small.toml"), "--quiet",
           "--out", str(out), "--set", "output.fields=true", "--set", refused]
    proc = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "depth step 1" in lines[0], proc.stderr
    assert not out.exists()


@pytest.mark.serial  # one process: the plot is drawn on rank 0
def test_a_full_disk_while_continuation_draws_its_plot_exit_2(tempdir, capfd, monkeypatch):
    """No room for plots/bifurcation.png (ENOSPC injected at matplotlib's write): exit 2, one line naming the file and
    the cause, and DIR as before the command: the previous result kept, nothing of the failed job (was a traceback,
    exit 1)."""
    import errno

    import matplotlib.figure

    out = tempdir / "out"
    args = ["continuation", str(ROOT / "demos" / "noisy_circle.toml"), "--out", str(out), "--quiet",
            "--set", "continuation.points=33", "--set", "continuation.stop=0.5"]
    assert main(args) == 0
    before = _tree(out)

    def full(self, path, *a, **k):
        with open(path, "wb") as f:  # a torn file, as a real full disk leaves it
            f.write(b"\x89PNG")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full)
    capfd.readouterr()
    assert main([*args, "--set", "continuation.stop=0.4"]) == 2
    lines = [ln for ln in capfd.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "bifurcation.png" in lines[0] and "No space left on device" in lines[0], lines
    assert _tree(out) == before
