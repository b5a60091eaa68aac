"""Signals and BaseExceptions end a job cleanly, on every rank, and ``--resume`` gives the uninterrupted result.

SIGTERM (a cluster's time limit), SIGINT and SIGUSR1, sent to the launcher or to one rank only: every rank
finishes its training step, writes the checkpoint and a report with ``"status": "interrupted"``, one line on
stderr, exit 4. A ``KeyboardInterrupt`` or ``SystemExit`` raised on one rank only ends the job instead of
leaving the others in a collective. Every launch has a timeout, so a regression fails instead of hanging.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from mpi4py import MPI  # noqa: F401  (import order)

import numpy as np
import pytest
from configs import DEEP
from test_mpi_failures import MPIEXEC, ROOT, finish, launch

from mfpde.signals import EXIT_INTERRUPTED

pytestmark = pytest.mark.ranks  # the rank count can change what it checks: run again under mpiexec

SMALL = ["tokens.cells=[8, 8]", "heads.cells=[8, 8]", "depth.steps=4", "data.samples=3", "data.test_samples=0",
         "training.steps=40", "output.every=1", "output.checkpoint_every=4", "output.plots=false",
         "tokens.outflow_tol=0.5"]
SETS = [a for s in SMALL for a in ("--set", s)]

#: each rank writes its pid (so that a test can signal one rank), then runs the CLI
PIDS = '''
import sys
from pathlib import Path
from mpi4py import MPI
Path({pids!r}, f"{{MPI.COMM_WORLD.rank}}.pid").write_text(str(__import__("os").getpid()))
from mfpde import cli
sys.exit(cli.main(["run", {DEEP!r}, "--quiet", "--out", {out!r}, *{sets!r}]))
'''


def _interrupted_run(tmp: Path, n: int, sig: int, target: str) -> tuple[Path, str]:
    """Start a run on n ranks, send sig to the launcher or to one rank once a checkpoint exists; wait (bounded)."""
    out, pids = tmp / f"int-{n}-{sig}-{target}", tmp / f"pids-{n}-{sig}-{target}"
    pids.mkdir()
    script = PIDS.format(pids=str(pids), DEEP=DEEP, out=str(out), sets=SETS)
    cmd = ([sys.executable, "-c", script] if n == 1 else [MPIEXEC, "-n", str(n), sys.executable, "-c", script])
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, text=True,
                            stderr=subprocess.PIPE, start_new_session=True)
    t0 = time.monotonic()
    while not (out / "checkpoint" / "state.npz").exists() and proc.poll() is None:
        assert time.monotonic() - t0 < 300, "no checkpoint"
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before the signal: lengthen it"
    pid = proc.pid if target == "launcher" else int((pids / f"{n - 1}.pid").read_text())
    os.kill(pid, sig)
    err = finish(proc, 240, f"after {signal.Signals(sig).name} to the {target} on {n} ranks")
    assert proc.returncode == EXIT_INTERRUPTED, err
    return out, err


def _straight(tmp: Path) -> Path:
    out = tmp / "straight"
    rc, err, _ = launch(["run", DEEP, "--quiet", "--out", str(out), *SETS], n=1)
    assert rc == 0, err
    return out


def _same_result(a: Path, b: Path) -> None:
    """history (but wall_s), the final report and every ρ snapshot of the two runs agree to round-off."""
    rows = [list(csv.DictReader((d / "history.csv").open())) for d in (a, b)]
    assert [r["step"] for r in rows[0]] == [r["step"] for r in rows[1]]
    for ra, rb in zip(*rows, strict=True):
        for k in ra:
            if k != "wall_s":
                assert float(rb[k]) == pytest.approx(float(ra[k]), rel=1e-9, abs=1e-14), (k, ra, rb)
    fa, fb = (json.loads((d / "report.json").read_text()) for d in (a, b))
    assert fb["status"] == "ok" and fb["final"]["risk"] == pytest.approx(fa["final"]["risk"], rel=1e-9)
    assert np.allclose(fb["final"]["rho_mean"], fa["final"]["rho_mean"], rtol=1e-9, atol=1e-14)
    from test_durability import _read_rho

    sa, va = _read_rho(a / "fields" / "rho.bp")
    sb, vb = _read_rho(b / "fields" / "rho.bp")
    np.testing.assert_allclose(sb, sa, rtol=0, atol=1e-15)
    np.testing.assert_allclose(vb, va, rtol=1e-9, atol=1e-12)


@pytest.mark.serial  # launches its own processes
@pytest.mark.parametrize(("n", "sig", "target"), [(1, signal.SIGTERM, "launcher"), (1, signal.SIGINT, "launcher"),
                                                  (2, signal.SIGTERM, "launcher"), (2, signal.SIGUSR1, "launcher"),
                                                  (3, signal.SIGTERM, "rank")],
                         ids=["1-TERM", "1-INT", "2-TERM", "2-USR1", "3-TERM-to-one-rank"])
def test_signal_checkpoints_then_resume_gives_the_straight_run(tmp_path, n, sig, target):
    """A signal: exit 4, one line, report "interrupted" at the step of the checkpoint; --resume (on 1 rank) then
    gives the uninterrupted history, report and ρ snapshots. On 3 ranks the signal goes to rank 2 alone."""
    out, err = _interrupted_run(tmp_path, n, sig, target)
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("[mpiexec@")]
    assert len(lines) == 1 and signal.Signals(sig).name in lines[0] and "--resume" in lines[0], err
    assert "PETSC ERROR" not in err and "Traceback" not in err, err
    rep = json.loads((out / "report.json").read_text())
    with np.load(out / "checkpoint" / "state.npz") as z:
        assert rep["status"] == "interrupted" and rep["steps_done"] == int(z["step"]) > 0, rep
    rc, err, _ = launch(["run", DEEP, "--quiet", "--resume", "--out", str(out), *SETS], n=1)
    assert rc == 0, err
    _same_result(_straight(tmp_path), out)


PLANT = '''
import sys
from mpi4py import MPI
import mfpde.tokens.box.job as job
from mfpde import cli

def planted(cfg, comm, fields, bar, setup):
    if MPI.COMM_WORLD.rank == MPI.COMM_WORLD.size - 1:
        raise {exc}
    MPI.COMM_WORLD.allreduce(1)  # the other ranks wait here for the last one, which never comes

job.solve = planted
sys.exit(cli.main(["transport", "demos/transport_small.toml", "--out", {out!r}]))
'''


@pytest.mark.serial
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("exc", ["KeyboardInterrupt", "SystemExit(5)"])
def test_base_exception_on_one_rank_ends_the_job(tmp_path, exc, n):
    """KeyboardInterrupt or sys.exit on the last rank only: the job ends (it hung in the others' allreduce); the
    KeyboardInterrupt as an interruption (exit 4, its line from that rank)."""
    rc, err, dt = launch(["-c", PLANT.format(exc=exc, out=str(tmp_path / "out"))], n=n, python=True,
                         env={"MFPDE_MPI_EXIT_TIMEOUT": "5"}, timeout=90)
    assert rc != 0 and "Traceback" not in err, err
    if exc == "KeyboardInterrupt":
        assert rc == EXIT_INTERRUPTED and "interrupted by KeyboardInterrupt" in err, err
        assert f"(rank {n - 1} of {n})" in err, err
    else:
        assert f"SystemExit(5) on rank {n - 1} of {n}" in err, err


@pytest.mark.serial
def test_signal_during_transport_exit_4(tmp_path):
    """SIGTERM to a transport (no training step to finish): exit 4 at once, one line, no report, no PETSc banner."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "mfpde", "transport", str(ROOT / "demos" / "transport_small.toml"), "--out", str(out),
           "--set", "depth.steps=20000", "--set", "output.fields=false"]
    proc = subprocess.Popen(cmd, cwd=ROOT, text=True, stderr=subprocess.PIPE)
    t0 = time.monotonic()
    while not (out / "config.toml").exists() and proc.poll() is None:
        assert time.monotonic() - t0 < 120
        time.sleep(0.02)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("mfpde[0/1]")]
    assert proc.returncode == EXIT_INTERRUPTED and len(lines) == 1 and "SIGTERM" in lines[0], err
    assert "--resume" not in lines[0], err  # transport has no checkpoint to resume from
    assert not (out / "report.json").exists()


#: each rank writes its pid, then runs ``mfpde transport`` (20000 depth steps: it runs until signalled)
TRANSPORT_PIDS = """
import sys
from pathlib import Path
from mpi4py import MPI
Path({pids!r}, f"{{MPI.COMM_WORLD.rank}}.pid").write_text(str(__import__("os").getpid()))
from mfpde import cli
sys.exit(cli.main(["transport", "demos/transport_small.toml", "--out", {out!r}, "--set", "depth.steps=20000",
                   "--set", "output.fields=false"]))
"""


@pytest.mark.serial  # launches its own processes
def test_signal_to_one_rank_of_transport_exit_4_on_every_rank(tmp_path):
    """SIGTERM to rank 1 only of a transport on 3 ranks: the job ends with exit 4 and one line from that rank, within
    the grace of the CLI (was exit 1 after the 60 s of MFPDE_MPI_EXIT_TIMEOUT: the other ranks never learnt of it)."""
    from mfpde.cli import EXIT_TIMEOUT

    out, pids = tmp_path / "out", tmp_path / "pids"
    pids.mkdir()
    script = TRANSPORT_PIDS.format(pids=str(pids), out=str(out))
    proc = subprocess.Popen([MPIEXEC, "-n", "3", sys.executable, "-c", script], cwd=ROOT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stderr=subprocess.PIPE, start_new_session=True)
    t0 = time.monotonic()
    while not (out / "config.toml").exists() and proc.poll() is None:  # set-up done: the depth loop runs
        assert time.monotonic() - t0 < 240, "transport did not start"
        time.sleep(0.02)
    time.sleep(0.5)
    assert proc.poll() is None, "transport ended before the signal: lengthen it"
    os.kill(int((pids / "1.pid").read_text()), signal.SIGTERM)
    t1 = time.monotonic()
    err = finish(proc, 240, "SIGTERM to rank 1 of 3")
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("mfpde[0/3]")]
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert len(lines) == 1 and "SIGTERM" in lines[0] and "rank 1 of 3" in lines[0], err
    assert "--resume" not in lines[0] and "Traceback" not in err, err
    assert time.monotonic() - t1 < EXIT_TIMEOUT, "ended by the exit timeout, not as an interruption"


@pytest.mark.serial  # launches its own process
def test_signal_during_setup_exit_4_without_checkpoint(tmp_path):
    """SIGTERM while a run sets up (meshes, spaces, forms): exit 4 at once, one line saying that no checkpoint exists
    yet (was: the signal deferred to the end of the set-up, then a checkpoint of step 0 and "continue with
    --resume")."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "mfpde", "run", "--out", str(out), "--set", "tokens.cells=[600, 600]",
           "--set", "training.steps=1"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, text=True,
                            stderr=subprocess.PIPE, start_new_session=True)
    assert proc.stderr is not None
    seen: list[str] = []
    started = threading.Event()

    def read(stream=proc.stderr) -> None:  # the set-up line comes before the meshes are built
        for line in stream:
            seen.append(line)
            if "set-up:" in line:
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    if not started.wait(120) or proc.poll() is not None:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"no set-up line within 120 s: {''.join(seen)}")
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("SIGTERM during set-up: not ended within 120 s")
    reader.join(10)
    err = "".join(seen)
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("mfpde[0/1]")]
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert len(lines) == 1 and "during set-up" in lines[0] and "no checkpoint exists yet" in lines[0], err
    assert not (out / "checkpoint").exists() and not (out / "report.json").exists()


def _interrupt(*args, **kwargs):
    from mfpde.signals import Interrupted

    raise Interrupted(signal.SIGTERM)


@pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="serial")
@pytest.mark.parametrize("job", ["sphere", "circle", "continuation"])
def test_a_signal_during_the_picture_leaves_no_report(tmp_path, monkeypatch, job):
    """The picture was drawn after report.json was written: a signal during it (seen: SIGINT to `mpiexec -n 3 mfpde
    transport` on the sphere) ended the command with exit 4 and "no report written" beside a report of status "ok".
    The report is the last file written."""
    from mfpde import config as C
    from mfpde.signals import Interrupted

    small = ["output.fields=false"]
    if job == "sphere":
        from mfpde.jobs.transport import domain_transport as transport_job

        monkeypatch.setattr("mfpde.tokens.sphere.job.sphere_figure", _interrupt)
        cfg = C.load(ROOT / "demos/sphere.toml", [*small, "tokens.refine=1", "depth.T=1.0", "depth.steps=2"])
    elif job == "circle":
        from mfpde.jobs.transport import domain_transport as transport_job

        monkeypatch.setattr("mfpde.plots.space_depth_figure", _interrupt)
        cfg = C.load(ROOT / "demos/circle.toml", [*small, "tokens.cells=[64]", "depth.T=1.0", "depth.steps=2"])
    else:
        from mfpde.jobs.continuation import continuation_job as transport_job

        monkeypatch.setattr("mfpde.jobs.continuation.bifurcation_plot", _interrupt)
        cfg = C.load(ROOT / "demos/noisy_circle.toml", ["continuation.points=33", "continuation.stop=0.5"])
    with pytest.raises(Interrupted):
        transport_job(cfg, tmp_path)
    assert not (tmp_path / "report.json").exists()


#: each rank writes its pid, then runs ``mfpde transport`` of a domain with its fields on (long: until signalled)
FIELDS_PIDS = """
import sys
from pathlib import Path
from mpi4py import MPI
Path({pids!r}, f"{{MPI.COMM_WORLD.rank}}.pid").write_text(str(__import__("os").getpid()))
from mfpde import cli
sys.exit(cli.main(["transport", {cfg!r}, "--quiet", "--out", {out!r}, "--set", "output.fields=true",
                   "--set", "depth.steps=20000"]))
"""


@pytest.mark.serial  # launches its own processes
@pytest.mark.parametrize("demo,rank,sig", [("transport_small", 0, signal.SIGTERM), ("sphere", 0, signal.SIGINT),
                                           ("circle", 2, signal.SIGTERM)])
def test_signal_to_one_rank_of_a_transport_writing_fields_ends_every_rank(tmp_path, demo, rank, sig):
    """A signal to one rank of a 3-rank transport that writes fields/mu_0.bp: exit 4 within seconds, one line, and DIR
    as before the command: no lock, no config.toml, no fields/ (was: to rank 0, every rank spun at 100 % for ever:
    the interrupted rank destroyed its VTX writer, whose close is collective, while the others waited in the solve;
    to rank 2, the lock, config.toml and fields/ were left behind and the line said fields/ held the depths)."""
    out, pids = tmp_path / "out", tmp_path / "pids"
    pids.mkdir()
    script = FIELDS_PIDS.format(pids=str(pids), out=str(out), cfg=str(ROOT / "demos" / f"{demo}.toml"))
    proc = subprocess.Popen([MPIEXEC, "-n", "3", sys.executable, "-c", script], cwd=ROOT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stderr=subprocess.PIPE, start_new_session=True)
    t0 = time.monotonic()
    while not (out / "fields" / "mu_0.bp").exists() and proc.poll() is None:  # fields written: the depth loop runs
        assert time.monotonic() - t0 < 120, "transport did not start"
        time.sleep(0.02)
    time.sleep(0.5)
    assert proc.poll() is None, "transport ended before the signal: lengthen it"
    os.kill(int((pids / f"{rank}.pid").read_text()), sig)
    t1 = time.monotonic()
    err = finish(proc, 60, f"{signal.Signals(sig).name} to rank {rank} of 3")
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("[mpiexec@")]
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert len(lines) == 1 and signal.Signals(sig).name in lines[0] and "Traceback" not in err, err
    assert "fields/ holds" not in lines[0], err
    assert time.monotonic() - t1 < 15, "not ended as an interruption"
    assert not out.exists() or not list(out.iterdir()), sorted(p.name for p in out.iterdir())


@pytest.mark.serial  # launches its own process
def test_signal_to_a_serial_transport_writing_fields_exit_4(tmp_path):
    """SIGTERM to a 1-rank box transport with fields on: exit 4 and one line (was exit 134, SIGABRT: the VTX writer
    was destroyed after DIR's fields/ was removed, and ADIOS2 ended the process in std::terminate)."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "mfpde", "transport", str(ROOT / "demos" / "transport_small.toml"), "--quiet",
           "--out", str(out), "--set", "depth.steps=20000", "--set", "output.fields=true"]
    proc = subprocess.Popen(cmd, cwd=ROOT, text=True, stderr=subprocess.PIPE, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    t0 = time.monotonic()
    while not (out / "fields" / "mu_0.bp").exists() and proc.poll() is None:
        assert time.monotonic() - t0 < 120
        time.sleep(0.02)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    err = finish(proc, 60, "SIGTERM to a serial transport")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == EXIT_INTERRUPTED and len(lines) == 1 and "SIGTERM" in lines[0], err
    assert not out.exists() or not list(out.iterdir())


@pytest.mark.serial
def test_a_signal_while_the_command_starts_is_exit_4_with_one_line():
    """Before mfpde.cli's handlers (its imports take a second) SIGTERM ended the command with 143 and no line."""
    code = ("import os, signal, time\nfrom mfpde import launch\nlaunch.install()\n"
            "os.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(10)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK",
                                                             "SLURM_PROCID")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 4, (r.returncode, r.stderr)
    assert r.stderr.strip().splitlines() == ["mfpde: interrupted by SIGTERM while starting (nothing was written)"]


@pytest.mark.serial
def test_a_signal_after_the_command_ended_leaves_its_exit_status():
    """After the command's handlers (its report written), SIGTERM ended the process with 143 and no line, or with
    the false line "while starting"; it is noted and the command's own status stands."""
    code = ("import os, signal, sys, time\nfrom mfpde import launch, signals\nlaunch.install()\n"
            "with signals.handlers():\n    pass\n"
            "os.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(0.2)\nassert launch.late == [signal.SIGTERM]\n"
            "print('done')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK",
                                                             "SLURM_PROCID")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "done" and "starting" not in r.stderr, (r.returncode, r.stderr)
