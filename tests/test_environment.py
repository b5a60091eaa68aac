"""Cluster and container hygiene (issue 15): launcher mismatch, one job per DIR, read-only home, BLAS threads.

The launcher mismatch and the read-only home are simulated with environment variables: ``HOME`` is a
directory nobody can write, even root (``/sys/kernel``; a directory without write permission does not stop
root), or, for the unit test, a path below a regular file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mpi4py import MPI

import pytest
from configs import DEEP
from test_mpi_failures import MPIEXEC, ROOT, launch

from mfpde.cli import main
from mfpde.environment import OutputLock, check_launcher, private_caches
from mfpde.errors import ConfigError

pytestmark = pytest.mark.ranks  # the rank count can change what it checks: run again under mpiexec

DEMO = str(ROOT / "demos" / "transport_small.toml")


@pytest.mark.parametrize("var", ["PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS"])
def test_check_launcher(var):
    with pytest.raises(ConfigError, match=f"{var}=4.*srun --mpi=pmi2") if MPI.COMM_WORLD.size == 1 else \
            _nothing():
        check_launcher(MPI.COMM_WORLD, {var: "4", "SLURM_NTASKS": "4"})
    check_launcher(MPI.COMM_WORLD, {var: "4", "MFPDE_ALLOW_SINGLETON": "1"})  # overridden
    check_launcher(MPI.COMM_WORLD, {"SLURM_NTASKS": "4"})  # a batch script's serial step
    check_launcher(MPI.COMM_WORLD, {var: "1"})


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.serial
def test_launcher_mismatch_exit_2(tmp_path):
    """What srun with a mismatched PMI gives: SLURM_NTASKS=4, SLURM_PROCID, PMI_SIZE=4 and one rank."""
    env = {**os.environ, "SLURM_NTASKS": "4", "SLURM_PROCID": "1", "PMI_SIZE": "4", "PMI_RANK": "1"}
    r = subprocess.run([sys.executable, "-m", "mfpde", "transport", DEMO, "--out", str(tmp_path / "out")], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and "PMI_SIZE=4" in lines[0] and "srun --mpi=pmi2" in lines[0], r.stderr
    assert not (tmp_path / "out").exists()


def _lock(out: Path, text: str) -> None:
    if MPI.COMM_WORLD.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / OutputLock.NAME).write_text(text)
    MPI.COMM_WORLD.Barrier()


def _hold(path: Path):
    """Hold the DIR lock as a running job does (flock on a file of its own open), on rank 0."""
    import fcntl

    if MPI.COMM_WORLD.rank != 0:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    f = path.open("a+")
    fcntl.flock(f, fcntl.LOCK_EX)
    f.write("4242 otherhost\n")
    f.flush()
    return f


def test_output_dir_locked_by_a_running_job(tempdir, capfd):
    """A second job on a DIR in use: exit 2 on every rank naming DIR; the first job's lock and files stay."""
    out = tempdir / "out"
    held = _hold(out / OutputLock.NAME)
    MPI.COMM_WORLD.Barrier()
    code = main(["transport", DEMO, "--out", str(out)])
    err = capfd.readouterr().err
    assert MPI.COMM_WORLD.allgather(code) == [2] * MPI.COMM_WORLD.size, err
    if MPI.COMM_WORLD.rank == 0:
        assert "in use by another mfpde job" in err and str(out) in err and "4242 otherhost" in err, err
        held.close()
    assert (out / OutputLock.NAME).exists() and not (out / "report.json").exists()


@pytest.mark.parametrize("left", ["dead_pid", "pid_1", "other_host", "empty"])
def test_stale_lock_is_taken_over(tempdir, left):
    """A lock file nobody holds is taken over and removed at the end: a killed job's pid file (as older versions
    wrote), one of PID 1 (a job killed in a container: PID 1 is alive, so it was never taken over), of another
    host, or an empty file (both refused for ever before)."""
    import socket

    out = tempdir / "out"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    _lock(out, {"dead_pid": f"{dead.pid} {host}\n", "pid_1": f"1 {host}\n", "other_host": "77 elsewhere\n",
                "empty": ""}[left])
    assert main(["transport", DEMO, "--out", str(out), "--set", "output.fields=false"]) == 0
    MPI.COMM_WORLD.Barrier()
    assert (out / "report.json").exists() and not (out / OutputLock.NAME).exists()


@pytest.mark.serial
def test_lock_of_a_killed_holder_is_released(tmp_path):
    """A job holding the lock is SIGKILLed: the kernel releases it, and the next job runs (no pid check)."""
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
from mpi4py import MPI
from pathlib import Path
from mfpde.environment import OutputLock
with OutputLock(Path({str(out)!r})):
    print("held", flush=True)
    time.sleep(600)
"""], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    with pytest.raises(ConfigError, match="in use by another mfpde job"):
        with OutputLock(out, MPI.COMM_SELF):
            pass
    holder.kill()
    holder.wait()
    with OutputLock(out, MPI.COMM_SELF) as lock:
        assert lock.held and (out / OutputLock.NAME).exists()
    assert not (out / OutputLock.NAME).exists()


def test_private_caches_when_home_is_read_only(tmp_path):
    (tmp_path / "file").write_text("")
    env = {"HOME": str(tmp_path / "file" / "home")}
    private = private_caches(env)
    assert private is not None and env["XDG_CACHE_HOME"] == str(private)
    assert env["MPLCONFIGDIR"] == str(private / "matplotlib")
    ok = {"HOME": str(tmp_path / "home")}
    assert private_caches(ok) is None and "XDG_CACHE_HOME" not in ok


@pytest.mark.serial
def test_run_with_read_only_home(tmp_path):
    """No XDG_CACHE_HOME, HOME not writable: the FFCx cache and matplotlib go to a private directory (was a
    traceback, exit 1), with one log line each and no matplotlib warning."""
    home = Path("/sys/kernel")
    try:
        (home / ".cache").mkdir()
        pytest.skip("no read-only directory to stand in for a read-only home")
    except OSError:
        pass
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "MPLCONFIGDIR", "XDG_CONFIG_HOME")}
    env["HOME"] = str(home)
    small = ["tokens.cells=[8, 8]", "heads.cells=[6, 6]", "depth.steps=2", "data.samples=2", "data.test_samples=0",
             "training.steps=1", "output.fields=false"]
    r = subprocess.run([sys.executable, "-m", "mfpde", "run", DEEP, "--out", str(tmp_path / "out"),
                        *[a for s in small for a in ("--set", s)]], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    assert "(XDG_CACHE_HOME)" in r.stderr and "(MPLCONFIGDIR)" in r.stderr, r.stderr
    assert "Matplotlib" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert (tmp_path / "out" / "plots" / "loss.png").is_file()


THREADS = '''
import json, sys
from mpi4py import MPI
import mfpde.tokens.box.job as job
from mfpde import cli

def record(cfg, comm, fields, bar, setup):
    from threadpoolctl import threadpool_info
    n = max((p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"), default=0)
    with open({record!r} + f"-{{MPI.COMM_WORLD.rank}}.json", "w") as f:  # not stdout: mpiexec mixes the ranks' lines
        json.dump({{"rank": MPI.COMM_WORLD.rank, "blas_threads": n}}, f)
    return [], None

job.solve = record
sys.exit(cli.main(["transport", "demos/transport_small.toml", "--out", {out!r}]))
'''


@pytest.mark.serial
@pytest.mark.parametrize(("env", "expected"), [({}, 1), ({"OPENBLAS_NUM_THREADS": "2"}, 2),
                                               ({"MFPDE_BLAS_THREADS": "2"}, 2)])
def test_one_blas_thread_per_rank_under_mpi(tmp_path, env, expected):
    """mpiexec -n 2 on 2 cores: each rank's OpenBLAS used 2 threads (4 on 2 cores); now 1, unless the user
    chose (OPENBLAS_NUM_THREADS, OMP_NUM_THREADS, MKL_NUM_THREADS, MFPDE_BLAS_THREADS)."""
    # Not under make test-coretypes' emulation either: its LD_PRELOAD loads a second OpenBLAS into the process
    # (numpy's symbols resolve to it), which threadpoolctl reports beside numpy's own; a user's run has one.
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                               "MKL_NUM_THREADS", "MFPDE_BLAS_THREADS",
                                                               "LD_PRELOAD", "OPENBLAS_CORETYPE")}
    cmd = [MPIEXEC, "-n", "2", sys.executable, "-c",
           THREADS.format(out=str(tmp_path / "out"), record=str(tmp_path / "threads"))]
    r = subprocess.run(cmd, cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    seen = [json.loads(f.read_text()) for f in sorted(tmp_path.glob("threads-*.json"))]
    assert sorted(s["rank"] for s in seen) == [0, 1], r.stdout
    assert all(s["blas_threads"] == expected for s in seen), seen


THREADS_SERIAL = THREADS.replace("    from threadpoolctl import threadpool_info\n",
                                 "    import scipy.linalg  # noqa: F401  (every BLAS a run loads)\n"
                                 "    from threadpoolctl import threadpool_info\n")


@pytest.mark.serial
@pytest.mark.parametrize(("env", "expected"), [({}, 1), ({"OPENBLAS_NUM_THREADS": "2"}, 2),
                                               ({"OMP_NUM_THREADS": "2"}, 2), ({"MFPDE_BLAS_THREADS": "2"}, 2)])
def test_one_blas_thread_serially_unless_the_user_chose(tmp_path, env, expected):
    """A single-rank run left OpenBLAS at one thread per core (2 here), 1.1-5x slower than one thread
    (bench/bench_threads.py); now 1, unless the user chose. Every BLAS library the run loaded counts."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: OpenBLAS's default is already one thread")
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                               "MKL_NUM_THREADS", "MFPDE_BLAS_THREADS",
                                                               "LD_PRELOAD", "OPENBLAS_CORETYPE")}
    cmd = [sys.executable, "-c", THREADS_SERIAL.format(out=str(tmp_path / "out"), record=str(tmp_path / "threads"))]
    r = subprocess.run(cmd, cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (seen,) = [json.loads(f.read_text()) for f in tmp_path.glob("threads-*.json")]
    assert seen["blas_threads"] == expected, seen


@pytest.mark.serial
@pytest.mark.parametrize("n", [2, 3])
def test_lock_is_agreed_under_mpi(tmp_path, n):
    """Under mpiexec -n 2 and 3, a DIR locked by a live job is exit 2 on every rank (rank 0 decides, all agree)."""
    out = tmp_path / "out"
    held = _hold(out / OutputLock.NAME)
    rc, err, _ = launch(["transport", DEMO, "--out", str(out)], n=n)
    assert rc == 2 and "in use by another mfpde job" in err, err
    held.close()


@pytest.mark.serial
def test_damaged_jit_cache_is_compiled_again(tmp_path):
    """A truncated compiled module (serially, on 2 and on 3 ranks) and a .c left by a killed compile (two jobs
    sharing the cache at once): the entries are moved to <cache>/fenics/damaged/, compiled again, and the job
    gives the result of a clean cache (was exit 2, "the FFCx JIT cache is damaged", until removed by hand)."""
    cache = tmp_path / "cache"
    env = {"XDG_CACHE_HOME": str(cache)}
    args = ["transport", DEMO, "--set", "output.fields=false"]

    def yhat(d: Path) -> float:
        return json.loads((d / "report.json").read_text())["samples"][0]["yhat"]

    rc, err, _ = launch([*args, "--out", str(tmp_path / "fill")], n=1, env=env)
    assert rc == 0, err
    fenics = cache / "fenics"
    modules = sorted(fenics.glob("*.so"))
    assert modules
    for n in (1, 2, 3):
        for m in sorted(fenics.glob("*.so")):
            m.write_bytes(m.read_bytes()[:100])
        rc, err, _ = launch([*args, "--out", str(tmp_path / f"trunc{n}")], n=n, env=env)
        assert rc == 0 and "Traceback" not in err, err
        assert yhat(tmp_path / f"trunc{n}") == pytest.approx(yhat(tmp_path / "fill"), rel=1e-12)  # ranks: round-off
    assert len(list((fenics / "damaged").glob("*.so.*"))) >= 3 * len(modules)
    for m in sorted(fenics.glob("*.so")):  # a killed compile: the .c exists, the module and its ready mark do not
        m.unlink()
        m.with_name(m.name.split(".")[0] + ".c.cached").unlink()
    cmds = [[MPIEXEC, "-n", "1", sys.executable, "-m", "mfpde", *args, "--out", str(tmp_path / f"left{k}")]
            for k in range(2)]
    procs = [subprocess.Popen(c, cwd=ROOT, env={**os.environ, **env}, stderr=subprocess.PIPE, text=True) for c in cmds]
    for k, p in enumerate(procs):
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0 and "Traceback" not in err, err
        assert yhat(tmp_path / f"left{k}") == yhat(tmp_path / "fill")
    assert len(sorted(fenics.glob("*.so"))) == len(modules)


_FAULTS = """
import resource, sys
import numpy as np
if sys.argv[1] == "keep":
    from mfpde.environment import keep_freed_memory
    assert keep_freed_memory()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(200):  # a stage's 4 MiB temporaries, freed together (the heap top is trimmed beyond 2 × 4 MiB)
    a, b, c = np.ones(1 << 19), np.ones(1 << 19), np.ones(1 << 19)
    del a, b, c
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_keep_freed_memory_stops_the_page_faults_of_temporaries():
    """With keep_freed_memory, 200 rounds of three 4 MiB temporaries reuse the same heap: page faults fall from one
    per page per round (glibc trims the freed heap top, 200 × 3 × 1024) to those of the first round; a user's
    MALLOC_* variable wins (nothing set)."""
    # a plain process: no MALLOC_* of the user, and not a rank of this test's MPI job (a singleton MPI_Init)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "PMI_", "PMIX_", "HYDRA", "MPI"))}
    faults = {}
    for mode in ("plain", "keep"):
        r = subprocess.run([sys.executable, "-c", _FAULTS, mode], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        faults[mode] = int(r.stdout.split()[-1])
    assert faults["plain"] >= 100 * 1024, faults  # each temporary mapped and faulted in afresh
    assert faults["keep"] <= 0.05 * faults["plain"], faults
    from mfpde.environment import keep_freed_memory

    assert keep_freed_memory({"MALLOC_TRIM_THRESHOLD_": "0"}) is False


@pytest.mark.serial
def test_no_compiler_warnings_on_a_cold_jit_cache(tmp_path):
    """An empty FFCx cache (XDG_CACHE_HOME, which DOLFINx's jit options read for ``cache_dir``): the forms of a
    check are compiled with the job's flags and gcc says nothing (was -Wunused-variable warnings on stderr)."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "mfpde", "verify", "--quick", "--only", "token_mass", "--out",
                        str(tmp_path / "out")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert list((tmp_path / "cache" / "fenics").glob("*.so")), "nothing compiled: the cache was not cold"
    warned = [line for line in (r.stderr + r.stdout).splitlines() if "warning:" in line]
    assert not warned, "\n".join(warned[:5])


@pytest.mark.parametrize("value", ["abc", "0", "-2", "1.5"])
def test_a_bad_blas_thread_count_is_refused(value):
    """``MFPDE_BLAS_THREADS=abc`` was ignored silently (BLAS then ran at one thread, not what was asked): exit 2
    naming the variable. ``default`` and a positive integer are accepted (an empty value leaves BLAS alone, as
    before)."""
    from mfpde.environment import blas_threads
    from mfpde.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"MFPDE_BLAS_THREADS: .*got '{value}'"), \
            blas_threads(env={"MFPDE_BLAS_THREADS": value}):
        pass
    for ok, limit in (("default", None), ("3", 3), ("", None)):
        with blas_threads(env={"MFPDE_BLAS_THREADS": ok}) as got:
            assert got == limit, ok


@pytest.mark.serial
def test_start_up_leaves_heavy_modules_unimported():
    """What ``mfpde run`` imports before its set-up leaves out the modules only some paths need (each a tenth of a
    second or more of every run's start-up): scipy.stats (:mod:`mfpde.limits`, Gaussian box masses), scipy.fft and
    scipy.special (:func:`mfpde.tokens.attention.chebyshev_coefficients` beyond 64 nodes), scipy.interpolate and
    matplotlib (the plots, drawn at the end), scikit-learn (the digits are read from its data file)."""
    heavy = ["scipy.stats", "scipy.fft", "scipy.special", "scipy.interpolate", "matplotlib", "sklearn"]
    code = ("import sys, mfpde.cli, mfpde.jobs.run, mfpde.jobs.transport; "
            f"print([m for m in {heavy!r} if m in sys.modules])")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, check=True)
    assert out.stdout.strip() == "[]", out.stdout
