"""The job's environment on clusters and in containers: checked or fixed before anything runs.

Called by :mod:`mfpde.cli` only (the library never changes the process environment):

* :func:`check_launcher`: a launcher that started N > 1 tasks (``PMI_SIZE``, ``OMPI_COMM_WORLD_SIZE``,
  ``SLURM_STEP_NUM_TASKS``) while MPI sees one rank means the launcher and mfpde's MPI do not match (``srun``
  without ``--mpi=pmi2``, another MPI's ``mpiexec``): N serial copies would write one DIR. Exit 2 with
  the fix, unless ``MFPDE_ALLOW_SINGLETON=1``. ``SLURM_NTASKS`` alone is not a sign: it is also set in the
  batch script of a multi-task job, where a serial run is legitimate.
* :func:`private_caches`: FFCx's JIT cache (``$XDG_CACHE_HOME/fenics``) and matplotlib's config dir need a
  writable directory; with a read-only home they go to ``$TMPDIR/mfpde-cache-<uid>`` (one log line). Must
  run before ``dolfinx`` and ``matplotlib`` are imported (they read the variables at import).
* :func:`blas_threads`: one BLAS thread per rank, serially and under MPI (threadpoolctl), unless the user set
  ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS`` or ``MFPDE_BLAS_THREADS``.
* :func:`keep_freed_memory`: glibc's malloc keeps freed blocks up to 256 MiB for reuse instead of returning
  them to the kernel, unless the user set ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_``.
* the FFCx JIT cache's repair and diagnosis: :mod:`mfpde.jit_cache`.
* :class:`OutputLock`: one job per DIR: rank 0 holds ``fcntl.flock`` on ``DIR/.mfpde.lock`` while the job runs;
  the kernel releases it when the holder dies however it dies (SIGKILL, a node's container as PID 1), so a lock
  file nobody holds, such as the pid files of older versions or an empty file, is taken over.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import math
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from mpi4py import MPI

from mfpde.errors import ConfigError
from mfpde.outdir import NOT_A_FOLDER

__all__ = ["OutputLock", "blas_threads", "check_launcher", "exit_timeout", "keep_freed_memory", "private_caches",
           "sht_choice", "sht_threads"]

logger = logging.getLogger(__name__)

#: Variables by which launchers announce the number of tasks they started.
LAUNCHER_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS")
#: Variables by which the user chooses the number of BLAS threads (mfpde then leaves it alone).
THREAD_VARS = ("MFPDE_BLAS_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def check_launcher(comm: MPI.Comm = MPI.COMM_WORLD, env: dict[str, str] | None = None) -> None:
    """Refuse to run as one of N serial copies when the launcher started N > 1 tasks.

    Raises:
        ConfigError: the launcher announces N > 1 tasks and ``comm`` has one rank (the message names the fix).
    """
    env = dict(os.environ) if env is None else env
    if comm.size > 1 or env.get("MFPDE_ALLOW_SINGLETON", "") not in ("", "0"):
        return
    for var in LAUNCHER_SIZE_VARS:
        try:
            n = int(env.get(var, "1"))
        except ValueError:
            continue
        if n > 1:
            raise ConfigError(
                f"the launcher started {n} tasks ({var}={n}) but MPI sees 1 rank: the launcher does not match "
                "mfpde's MPI (MPICH); use the venv's mpiexec, or srun --mpi=pmi2, or a site MPICH-ABI MPI "
                "(docs: user guide, Clusters); MFPDE_ALLOW_SINGLETON=1 runs independent serial copies anyway")


def _writable(d: Path) -> bool:
    """Whether files can be created in d (created if missing)."""
    try:
        d.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=d):
            pass
        return True
    except OSError:
        return False


def private_caches(env: os._Environ[str] | dict[str, str] | None = None) -> Path | None:
    """Point ``XDG_CACHE_HOME`` and ``MPLCONFIGDIR`` to a private temporary directory if theirs is not writable.

    Returns:
        The directory now used, or None if nothing was changed.
    """
    env = os.environ if env is None else env
    home = Path(env.get("HOME") or "~").expanduser()
    cache = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else home / ".cache"
    mpl = Path(env["MPLCONFIGDIR"]) if env.get("MPLCONFIGDIR") else \
        (Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else home / ".config") / "matplotlib"
    bad_cache, bad_mpl = not _writable(cache / "fenics"), not _writable(mpl)
    if not (bad_cache or bad_mpl):
        return None
    uid = os.getuid() if hasattr(os, "getuid") else 0
    private = Path(tempfile.gettempdir()) / f"mfpde-cache-{uid}"
    private.mkdir(mode=0o700, exist_ok=True)
    if bad_cache:
        env["XDG_CACHE_HOME"] = str(private)
        logger.info("the cache directory %s is not writable: FFCx compiles into %s (XDG_CACHE_HOME)", cache, private)
    if bad_mpl:
        env["MPLCONFIGDIR"] = str(private / "matplotlib")
        logger.info("matplotlib's config directory %s is not writable: using %s (MPLCONFIGDIR)", mpl,
                    private / "matplotlib")
    return private


#: The range of ``MFPDE_MPI_EXIT_TIMEOUT`` in seconds (its default 60: :data:`mfpde.cli.EXIT_TIMEOUT`).
EXIT_TIMEOUT_RANGE = (0.1, 86400.0)


def exit_timeout(default: float, env: dict[str, str] | None = None) -> float:
    """The seconds of ``MFPDE_MPI_EXIT_TIMEOUT`` (``default`` unset or empty): how long a rank that ended waits.

    Raises:
        ConfigError: not a number in :data:`EXIT_TIMEOUT_RANGE` (it was read only at the end of a job, and a bad
            value silently taken as the default).
    """
    env = dict(os.environ) if env is None else env
    text = env.get("MFPDE_MPI_EXIT_TIMEOUT", "").strip()
    if not text:
        return default
    lo, hi = EXIT_TIMEOUT_RANGE
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not lo <= value <= hi:
        raise ConfigError(f"MFPDE_MPI_EXIT_TIMEOUT: must be a number of seconds in [{lo:g}, {hi:g}] (how long a rank "
                          f"that ended waits for the others before it aborts the MPI job), got {text!r}")
    return value


#: The values of ``MFPDE_SHT``: the sphere's harmonic transforms by ducc0 where installed ("auto", or unset), by
#: ducc0 or by numpy (the reference); and the range of ``MFPDE_SHT_THREADS`` (ducc0's threads per rank, default 1).
SHT_CHOICES = ("auto", "ducc0", "numpy")
SHT_THREADS_RANGE = (1, 1024)


def sht_choice(env: dict[str, str] | os._Environ[str] | None = None) -> str:
    """The backend ``MFPDE_SHT`` asks for: "auto" (unset or empty), "ducc0" or "numpy".

    Raises:
        ConfigError: another value, or "ducc0" where ducc0 is not installed (checked at a command's start: exit 2).
    """
    env = os.environ if env is None else env
    choice = env.get("MFPDE_SHT", "").strip().lower() or "auto"
    if choice not in SHT_CHOICES:
        raise ConfigError(f"MFPDE_SHT: must be one of {', '.join(SHT_CHOICES)} (the sphere's harmonic transforms), "
                          f"got {env.get('MFPDE_SHT')!r}")
    if choice == "ducc0":
        import importlib.util

        if importlib.util.find_spec("ducc0") is None:
            raise ConfigError("MFPDE_SHT: ducc0 is asked for but not installed (pip install mfpde[ducc], "
                              "GPL-2.0-or-later; or MFPDE_SHT=numpy)")
    return choice


def sht_threads(env: dict[str, str] | os._Environ[str] | None = None) -> int:
    """ducc0's threads per rank, ``MFPDE_SHT_THREADS`` (default 1).

    Raises:
        ConfigError: not an integer in :data:`SHT_THREADS_RANGE`.
    """
    env = os.environ if env is None else env
    text = env.get("MFPDE_SHT_THREADS", "").strip()
    if not text:
        return 1
    lo, hi = SHT_THREADS_RANGE
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not lo <= value <= hi:
        raise ConfigError(f"MFPDE_SHT_THREADS: must be an integer in {lo}..{hi} (ducc0's threads per rank), "
                          f"got {text!r}")
    return value


@contextlib.contextmanager
def blas_threads(comm: MPI.Comm = MPI.COMM_WORLD, env: dict[str, str] | None = None) -> Iterator[int | None]:
    """Limit BLAS to one thread per rank (serially too) while the block runs (threadpoolctl).

    Measured (``bench/bench_threads.py``, docs: benchmarks): OpenBLAS's default of one thread per core made a
    serial ``mfpde run`` 1.1-5x slower on 2 cores, and far slower when another process used a core; the
    products mfpde makes are too small for a second thread to pay. numpy's and scipy's BLAS are loaded first,
    so that both are limited (a library loaded later, inside the block, would keep its default).

    Args:
        comm: the ranks (every rank limits its own process).
        env: the environment to read (default ``os.environ``).

    Yields:
        The limit set (1, or N from ``MFPDE_BLAS_THREADS=N``), or None when the user chose the thread count
        with ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` or ``MKL_NUM_THREADS``, or ``MFPDE_BLAS_THREADS=default``
        (then left alone).

    Raises:
        ConfigError: ``MFPDE_BLAS_THREADS`` is set to anything but a positive integer or ``default`` (it was
            ignored).
    """
    env = dict(os.environ) if env is None else env
    if env.get("MFPDE_BLAS_THREADS", "").strip():  # set and not empty (empty: BLAS left alone, below)
        text = env["MFPDE_BLAS_THREADS"].strip()
        cores = os.cpu_count() or 1
        if not (text.isdigit() and 1 <= int(text) <= 4 * cores or text == "default"):
            raise ConfigError(f"MFPDE_BLAS_THREADS: must be an integer in 1..{4 * cores} (BLAS threads per rank, at "
                              f"most four per core of the {cores} of this node) or 'default' (BLAS's own count), got "
                              f"{text!r}")
        limit: int | None = int(text) if text.isdigit() else None
    elif not any(v in env for v in THREAD_VARS):
        limit = 1
    else:
        limit = None
    if limit is None:
        yield None
        return
    import numpy  # noqa: F401  (load the BLAS libraries mfpde uses, so that threadpoolctl sees them)
    import scipy.linalg  # noqa: F401
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=limit, user_api="blas"):
        yield limit


#: glibc's mallopt parameters (malloc.h) and the values :func:`keep_freed_memory` sets, in bytes.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
KEEP_FREED = {M_MMAP_THRESHOLD: 64 * 2**20, M_TRIM_THRESHOLD: 256 * 2**20}


def keep_freed_memory(env: dict[str, str] | None = None) -> bool:
    """Let glibc's malloc reuse freed memory up to 256 MiB instead of giving it back to the kernel (mallopt).

    numpy's temporaries of a few MB (the attention kernels of a batch of samples, :mod:`mfpde.tokens.box.batch`) are
    above glibc's mmap threshold or, once it has adapted, trimmed off the heap top when freed together: the
    kernel then zeroes fresh pages for them at every stage. Measured on ``demos/digits_deep.toml`` (one core):
    7·10⁶ page faults and 15 s of system time in a 52 s run; with these limits 1.1·10⁵ faults, 0.7 s and 35 s.
    The same as ``MALLOC_MMAP_THRESHOLD_=67108864 MALLOC_TRIM_THRESHOLD_=268435456``; a user who set either
    variable keeps glibc's reading of them. Nothing happens where the C library has no ``mallopt``.

    Returns:
        Whether the limits were set.
    """
    env = dict(os.environ) if env is None else env
    if any(v in env for v in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): their allocators differ, leave them
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(k, v) == 1 for k, v in KEEP_FREED.items())


class OutputLock:
    """One job per output directory: rank 0 holds ``fcntl.flock`` on ``DIR/.mfpde.lock``; removed on exit.

    The file holds the pid and host of the holder, for the message only: whether the lock is held is the
    kernel's answer (released when the holder's process ends, however it ends), never a pid check.

    Args:
        out: the output directory (created if missing).
        comm: the ranks of the job; rank 0 takes the lock, every rank learns the outcome.

    Raises:
        ConfigError: on every rank, if another job holds the lock, or DIR cannot be created.
    """

    NAME = ".mfpde.lock"

    def __init__(self, out: Path, comm: MPI.Comm = MPI.COMM_WORLD) -> None:
        self.path, self.comm, self.held = Path(out) / self.NAME, comm, False
        self._made_dir, self._fd = False, -1

    def __enter__(self) -> OutputLock:
        """Take the lock (rank 0) and agree on the outcome (every rank)."""
        err = ""
        if self.comm.rank == 0:
            try:
                if self.path.parent.exists() and not self.path.parent.is_dir():
                    raise NotADirectoryError(errno.ENOTDIR, NOT_A_FOLDER)
                self._made_dir = not self.path.parent.exists()
                self.path.parent.mkdir(parents=True, exist_ok=True)
                err = self._take()
            except OSError as e:
                err = f"--out {str(self.path.parent)!r}: {e.strerror or e}"
        err = self.comm.bcast(err, root=0)
        if err:
            raise ConfigError(err)
        self.held = True
        return self

    def _take(self) -> str:
        for _ in range(10):
            fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = os.read(fd, 200).decode(errors="replace").strip() or "?"
                os.close(fd)
                return (f"--out {str(self.path.parent)!r} is in use by another mfpde job (pid and host: {owner}); "
                        "it ends when that job ends")
            try:  # the holder before us may have removed the file after we opened it: lock the file in place
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
            self._fd = fd
            return ""
        return f"--out {str(self.path.parent)!r}: could not take the lock {str(self.path)!r}"

    def __exit__(self, tp: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        """Settle DIR's result, remove the lock (rank 0), and DIR if the lock created it and it is still empty.

        Settling (:func:`mfpde.outdir.settle_output_dir`): an input refused after the start restores the
        previous result.
        """
        if self.held and self.comm.rank == 0:
            from mfpde.outdir import settle_output_dir

            settle_output_dir(self.path.parent, exc)
        if self.held and self.comm.rank == 0 and self._fd >= 0:
            self.path.unlink(missing_ok=True)  # while still held: a job that opened it retries (samestat)
            os.close(self._fd)
            self._fd = -1
            if self._made_dir:  # leave no empty DIR behind an input error
                with contextlib.suppress(OSError):
                    self.path.parent.rmdir()
        self.held = False
