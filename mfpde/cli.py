"""The command line: ``mfpde run | transport | continuation | twin | verify | --version`` (interface.md).

The CLI parses, chooses the output directory, shows progress, and turns errors into one line on stderr
and an exit status; the jobs (:mod:`mfpde.jobs.transport`, :mod:`mfpde.jobs.run`) solve and write.

Exit status: 0 done; 2 invalid input (one line on stderr naming the key or file); 3 numerical failure
(one line naming the step; last good state checkpointed, ``report.json`` has status "failed"); 4 interrupted
by SIGTERM, SIGINT or SIGUSR1 (:mod:`mfpde.signals`; ``run`` checkpoints the step reached, ``report.json`` has
status "interrupted"); 1 a bug.
"""

from __future__ import annotations

import argparse
import errno
import gc
import logging
import os
import signal
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from mpi4py import MPI

from mfpde import __version__, config, signals
from mfpde.environment import (
    OutputLock,
    blas_threads,
    check_launcher,
    exit_timeout,
    keep_freed_memory,
    private_caches,
    sht_choice,
    sht_threads,
)
from mfpde.errors import ConfigError, NumericalError
from mfpde.io import setup_logging
from mfpde.jit_cache import jit_cache_problem, repair_jit_cache
from mfpde.limits import check_resolved
from mfpde.outdir import reserved
from mfpde.petsc_start import start_petsc
from mfpde.progress import Bar, bar_wanted, progress

if TYPE_CHECKING:
    pass

logger = logging.getLogger("mfpde")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mfpde", description="Finite elements for the mean-field transformer: token transport in depth, "
        "adjoint, and training of the head distribution (see README.md and docs/user-guide.md).")
    p.add_argument("--version", action="version", version=f"mfpde {__version__}")
    sub = p.add_subparsers(dest="command")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--out", type=str, default=None, help="output directory (default out/<command>-<stem>)")
    common.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, TOML value syntax (repeatable); every key, its default and "
                        "the embedded default's value: docs/config.md")
    r = sub.add_parser("run", parents=[common], help="coupled training (the main job)")
    r.add_argument("config", nargs="?", default=None,
                   help="config TOML (default: the embedded digits problem, mfpde/config/defaults/run.toml)")
    once = r.add_mutually_exclusive_group()  # continue a run or replace it, not both
    once.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    once.add_argument("--overwrite", action="store_true", help="replace a finished run in --out (refused otherwise)")
    r.add_argument("--quiet", action="store_true", help="no progress output")
    t = sub.add_parser("transport", parents=[common], help="forward token transport for the initial ρ")
    t.add_argument("config", help="config TOML")
    t.add_argument("--quiet", action="store_true", help="no progress output")
    c = sub.add_parser("continuation", parents=[common], help="stationary states and their branches against a "
                       "parameter (noisy tokens on the circle, the sphere or S^(d-1); Gibbs fixed points of training "
                       "in λ)")
    c.add_argument("config", help="config TOML with a [continuation] section")
    c.add_argument("--quiet", action="store_true", help="no progress output")
    w = sub.add_parser("twin", parents=[common], help="finite transformers (JAX) of H heads, N tokens, L layers "
                       "trained beside the PDE: the gaps and their fitted rates")
    w.add_argument("config", nargs="?", default=None,
                   help="config TOML; its [twin] section, if any, sets the sizes (default: the embedded digits "
                   "problem)")
    w.add_argument("--pde", type=str, default=None, metavar="DIR",
                   help="compare with this finished `mfpde run` of the same problem instead of running the PDE (the "
                   "refined PDE of the error estimate still runs, unless DIR's sibling pde-refined/ holds it)")
    w.add_argument("--overwrite", action="store_true", help="replace a finished twin in --out (refused otherwise)")
    w.add_argument("--quiet", action="store_true", help="no progress output")
    v = sub.add_parser("verify", help="the numerical verification suite (a table of checks, report.json)")
    v.add_argument("--quick", action="store_true", help="reduced sizes (a few minutes on 2 cores)")
    v.add_argument("--only", nargs="+", default=None, metavar="NAME", help="run only these checks")
    v.add_argument("--out", type=str, default=None, help="output directory (default out/verify)")
    v.add_argument("--quiet", action="store_true", help="no progress output")
    return p


def _err(msg: str) -> None:
    if MPI.COMM_WORLD.rank == 0:
        print(f"mfpde: error: {msg}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``mfpde`` console script; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.command is None:
        _parser().print_help()
        return 2
    setup_logging(getattr(args, "quiet", False))
    # numpy's RuntimeWarnings (overflow in a discarded branch, ...) are not actionable for users and would
    # break the one-line error contract; failures are detected and reported by the solvers themselves.
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    comm = MPI.COMM_WORLD
    interrupted = ""
    try:
        with signals.handlers():
            check_launcher(comm)
            exit_timeout(EXIT_TIMEOUT)  # read at the end of the job: a bad value is refused now
            sht_choice(), sht_threads()  # read by the sphere's transforms mid-solve: refused now
            private_caches()  # before dolfinx and matplotlib are imported (in _dispatch)
            if args.command != "continuation":  # it starts PETSc (and FFCx's cache) where a solver needs them
                # before petsc4py is imported: PETSc's signal handler off; PETSC_OPTIONS it cannot read: one line
                start_petsc(signals.quiet_petsc)
                repair_jit_cache()
            keep_freed_memory()
            with blas_threads(comm):
                code = _dispatch(args)
    except (signals.Interrupted, KeyboardInterrupt) as e:  # every rank got it, or _join ends the job in time
        interrupted = _interrupted_line(args, e)
        _err(interrupted)
        code = signals.EXIT_INTERRUPTED
    except SystemExit as e:  # a library's sys.exit: under MPI the other ranks would wait for ever
        if comm.size == 1:
            raise
        _abort(comm, f"SystemExit({e.code!r}) on rank {comm.rank} of {comm.size}")
    except ConfigError as e:  # MeshError included
        _err(str(e))
        code = 2
    except NumericalError as e:
        if comm.rank == 0:
            print(f"mfpde: numerical failure: {e}", file=sys.stderr)
        code = 3
    except Exception as e:  # a bug (exit 1): under MPI the other ranks may wait in a collective for ever
        if isinstance(e, OSError) and e.errno in NO_ROOM:
            # A full disk, a quota, the file-size limit or a read-only file system while a file of DIR was written
            # (a plot, ...): not a bug, exit 2. DIR was settled on the way out (mfpde.outdir): no report of its own.
            line = f"cannot write {str(e.filename or '')!r}: {e.strerror or e} (free space or name another --out)"
            if comm.size > 1:  # raised on this rank alone (rank 0 draws the plots): the others wait in a collective
                _end_alone(comm, line, 2)
            _err(line)
            return 2
        jit = jit_cache_problem(e) or _petsc_options_problem(e)
        if jit:  # not a bug: the environment's FFCx cache, or PETSC_OPTIONS that PETSc rejected
            _err(jit)
            _join(comm, 2)
            return 2
        if comm.size == 1:
            raise
        _abort(comm, f"unexpected {type(e).__name__} on rank {comm.rank} of {comm.size}: {e}", tb=True)
    if code == 0 and "petsc4py.PETSc" in sys.modules:  # every rank got here: free the PETSc objects of this
        # command's solvers (see mfpde.petsc); a continuation of the spectral discretisation did not start PETSc
        from mfpde.petsc import collect_garbage  # after private_caches (petsc4py is imported in _dispatch)

        collect_garbage()
    _join(comm, code, interrupted)
    fields = sys.modules.get("mfpde.fields")
    if fields is not None and fields.abandoned():  # a VTX file refused for a full disk: closing it could abort
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


#: The errors of a write that has no room: a full disk, a quota, the file-size limit, a read-only file system (exit 2).
NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})


def _end_alone(comm: MPI.Comm, line: str, code: int) -> None:
    """Say ``line`` on this rank (its number where it is not rank 0), then end every rank with exit status code."""
    suffix = f" (rank {comm.rank} of {comm.size})" if comm.rank else ""
    sys.stderr.write(f"mfpde: error: {line}{suffix}\n")
    sys.stderr.flush()
    time.sleep(1.0)  # the launcher forwards stderr through a pipe: give the line time (see _abort)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)  # MPICH's own "Abort(2) on node ..." line: the line above says it
    comm.Abort(code)
    os._exit(code)


#: PETSc's error codes of an option it cannot take: a wrong argument, one out of range, an unknown type.
PETSC_OPTION_ERRORS = frozenset({62, 63, 86})


def _petsc_options_problem(e: BaseException) -> str:
    """The line for a PETSc error that ``PETSC_OPTIONS`` caused, where no solver said so itself ("" otherwise).

    The solvers with options of their own name them (:class:`mfpde.petsc.LinearSolver`,
    :func:`mfpde.continuation_newton.newton_solver`); any other SNES or KSP reading the variable (the λ continuation's,
    ``-mfpde_cont_snes_type bogus``) raised PETSc's error 86 with its stack (exit 1). Classified by PETSc's error
    code, with the variable set.
    """
    petsc = sys.modules.get("petsc4py.PETSc")
    given = os.environ.get("PETSC_OPTIONS", "").strip()
    if petsc is None or not given or not isinstance(e, petsc.Error) or getattr(e, "ierr", 0) not in PETSC_OPTION_ERRORS:
        return ""
    lines = [ln.split("] ", 1)[-1].strip() for ln in str(e).splitlines() if ln.strip()]
    return f"PETSC_OPTIONS: PETSc rejected {given!r}: {lines[-1] if lines else f'error {e.ierr}'}"


#: Seconds a rank that ends waits for the others before it aborts the MPI job (``MFPDE_MPI_EXIT_TIMEOUT``).
EXIT_TIMEOUT = 60.0


def _interrupted_line(args: argparse.Namespace, e: BaseException) -> str:
    """The line that says what a signal stopped and what is left (exit status 4)."""
    what = signals.name(e.signum) if isinstance(e, signals.Interrupted) else "KeyboardInterrupt"
    setup = isinstance(e, signals.Interrupted) and e.stage == "set-up"
    if args.command == "run" and setup:
        return (f"interrupted by {what} during set-up, before training step 0: "
                + ("the checkpoint is unchanged, no report written (continue with --resume)" if args.resume else
                   "no checkpoint exists yet, no report written (run the command again)"))
    if args.command == "run":
        return (f"interrupted by {what} outside a training step: no report written (a run continues from its last "
                "checkpoint with --resume)")
    if args.command == "transport":  # no checkpoint: DIR is settled as before the command (mfpde.outdir)
        return (f"interrupted by {what} during set-up: transport stopped, nothing computed, no report written (run "
                "the command again)" if setup else f"interrupted by {what}: transport stopped, no report written, "
                "its fields removed and DIR's previous result kept (run the command again to redo it)")
    return f"interrupted by {what}: {args.command} stopped, no report written"


#: Seconds an interrupted rank waits for the others before it ends the MPI job with exit status 4: a signal
#: that reached some ranks only leaves the others in a collective, where they never learn of it.
INTERRUPT_GRACE = 3.0


def _abort(comm: MPI.Comm, msg: str, tb: bool = False) -> None:
    """Say why on this rank (whatever its number), then end every rank of the job with exit status 1."""
    sys.stderr.write(f"mfpde: error: {msg}; aborting the MPI job\n")
    if tb:
        traceback.print_exc(file=sys.stderr)
    sys.stderr.flush()
    # The launcher forwards a rank's stderr through a pipe; MPI_Abort kills the ranks and their proxies, and a
    # line still in the pipe is lost (seen: the reason missing from a job's log under load). Give it a second.
    time.sleep(1.0)
    comm.Abort(1)
    os._exit(1)  # not reached: seen once returning while another rank's abort was under way


def _join(comm: MPI.Comm, code: int, interrupted: str = "") -> None:
    """Wait (non-blocking barrier, bounded) for every rank to end; abort the job if some never come.

    All ranks normally end together. A rank that raised alone (its error not agreed on) leaves the others
    in a collective: rather than hang until the allocation runs out, it aborts the job after
    ``MFPDE_MPI_EXIT_TIMEOUT`` seconds. A rank interrupted by a signal (``interrupted``: its line) that the
    others did not get waits :data:`INTERRUPT_GRACE` seconds, then says so (rank 0 did already) and ends the
    job with exit status 4 (``MPI_Abort``).
    """
    if comm.size == 1:
        return
    try:
        timeout = exit_timeout(EXIT_TIMEOUT)
    except ConfigError:  # refused at the start (exit 2); here the default, to end the job anyway
        timeout = EXIT_TIMEOUT
    if code == signals.EXIT_INTERRUPTED and interrupted:
        timeout = min(timeout, INTERRUPT_GRACE)
    req = comm.Ibarrier()
    t0 = time.monotonic()
    while not req.Test():
        if time.monotonic() - t0 > timeout:
            if code == signals.EXIT_INTERRUPTED and interrupted:
                _end_interrupted(comm, interrupted)
            _abort(comm, f"rank {comm.rank} ended with exit status {code}, the other ranks did not end within "
                   f"{timeout:g} s (MFPDE_MPI_EXIT_TIMEOUT)")
        time.sleep(0.01)


def _end_interrupted(comm: MPI.Comm, line: str) -> None:
    """End the MPI job with exit status 4 from a rank that got a signal the others did not (one line on stderr).

    Rank 0, which waits in a collective, would be killed with DIR unsettled: this rank settles it first
    (:func:`mfpde.outdir.settle_for_rank0`). Where rank 0 had settled DIR, it got the signal too and printed the
    line: this rank prints nothing more.
    """
    from mfpde.outdir import settle_for_rank0

    settled = settle_for_rank0(signals.Interrupted(signal.SIGTERM)) if comm.rank != 0 else False
    if comm.rank != 0 and settled is not False:  # rank 0 printed it already if it got the signal
        sys.stderr.write(f"mfpde: error: {line} (rank {comm.rank} of {comm.size})\n")
    sys.stderr.flush()
    time.sleep(1.0)  # the launcher forwards stderr through a pipe: give the line time (see _abort)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)  # MPICH's own "Abort(4) on node ..." line: the line above says it
    comm.Abort(signals.EXIT_INTERRUPTED)
    os._exit(signals.EXIT_INTERRUPTED)


def _check_out(out: Path) -> Path:
    """Refuse as DIR a file system's root, the home directory or a system directory (``--out /`` wrote into /).

    mfpde writes report.json, config.toml and history.csv into DIR and removes DIR's ``fields/``, ``plots/`` and
    ``checkpoint/`` first: in such a directory they are someone else's. A DIR that is not writable is refused when
    it is locked (:class:`~mfpde.environment.OutputLock`).

    Raises:
        ConfigError: naming --out and what the directory is.
    """
    try:
        real = out.expanduser().resolve()
        home = Path.home().resolve()
    except (OSError, RuntimeError):  # a loop of links, no home: the lock reports what is wrong with DIR
        return out
    what = reserved(real, home)  # /, $HOME, /tmp, /usr/lib and below, /etc/x, /var/lib/y, ...
    if what:
        raise ConfigError(f"--out {str(out)!r} is {what}: mfpde writes its files there and clears fields/, plots/ "
                          "and checkpoint/ in it; name a directory of its own (e.g. --out out/run1)")
    return out


def _out_dir(args: argparse.Namespace) -> Path:
    if args.out is not None:
        if not str(args.out).strip():
            raise ConfigError("--out: an empty directory name (it would write into the working directory)")
        return _check_out(Path(args.out))
    if args.command == "verify":
        return Path("out") / "verify"
    stem = Path(args.config).stem if getattr(args, "config", None) else "default"
    return Path("out") / f"{args.command}-{stem}"


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "continuation":  # neither dolfinx nor the training (a second of start-up)
        from mfpde.jobs.continuation import continuation_job
    else:
        from mfpde.jobs.run import run_job
        from mfpde.jobs.transport import transport_job  # imports dolfinx: after private_caches

    gc.freeze()  # the modules imported so far live for the whole job: the cycle collector skips them from now on
    comm = MPI.COMM_WORLD
    out = _out_dir(args)
    if args.command == "verify":
        from mfpde.jobs.verify import verify_job  # the checks import scipy and gmsh: only when asked

        with OutputLock(out, comm):
            return verify_job(out, quick=args.quick, only=args.only, comm=comm,
                              progress=(lambda n: Bar(n, 0, "mfpde verify", "check")) if bar_wanted(args.quiet)
                              else None)
    said: list[str] = []  # the line on keys not used: once the input passed the door (a refusal is one line)
    cfg = config.load(args.config, args.overrides, command=args.command, warn=said.append)
    check_resolved(cfg)
    for line in said:
        logger.warning("%s", line)
    if args.command == "transport":
        with OutputLock(out, comm):
            transport_job(cfg, out, comm, progress=progress(args.quiet, "mfpde transport"))
        return 0
    if args.command == "twin":
        from mfpde.jobs.twin import twin_job

        with OutputLock(out, comm):
            return twin_job(cfg, out, comm, pde_dir=Path(args.pde) if args.pde else None, overwrite=args.overwrite)
    if args.command == "continuation":
        with OutputLock(out, comm):
            continuation_job(cfg, out, comm)
        return 0
    if args.command == "run":
        with OutputLock(out, comm):
            result = run_job(cfg, out, resume=args.resume, comm=comm, progress=progress(args.quiet),
                             overwrite=args.overwrite)
        if result.status == "interrupted":
            if comm.rank == 0:
                print(f"mfpde: interrupted by {result.error}: checkpoint and report.json written to {out}; "
                      "continue with --resume", file=sys.stderr)
            return signals.EXIT_INTERRUPTED
        if result.status == "failed":
            if comm.rank == 0:
                print(f"mfpde: numerical failure: {result.error}; last good state in {out / 'checkpoint'}",
                      file=sys.stderr)
            return 3
        return 0
    raise AssertionError(args.command)
