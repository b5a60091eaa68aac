"""The command line: ``mfpde run | transport | verify | --version`` (interface.md).

The CLI parses, chooses the output directory, shows progress, and turns errors into one line on stderr
and an exit status; the jobs (:mod:`mfpde.tokens.job`, :mod:`mfpde.training.driver`) solve and write.

Exit status: 0 done; 2 invalid input (one line on stderr naming the key or file); 3 numerical failure
(one line naming the step; last good state checkpointed, ``report.json`` has status "failed"); 1 a bug.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from pathlib import Path

from mpi4py import MPI

from mfpde import __version__, config
from mfpde.errors import ConfigError, NumericalError
from mfpde.io import setup_logging
from mfpde.tokens.job import transport_job
from mfpde.training.driver import ProgressFactory, run_job

logger = logging.getLogger("mfpde")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mfpde", description="Finite elements for the mean-field transformer: token transport in depth, "
        "adjoint, and training of the head distribution (see README.md and docs/interface.md).")
    p.add_argument("--version", action="version", version=f"mfpde {__version__}")
    sub = p.add_subparsers(dest="command")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--out", type=Path, default=None, help="output directory (default out/<command>-<stem>)")
    common.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, TOML value syntax (repeatable)")
    r = sub.add_parser("run", parents=[common], help="coupled training (the main job)")
    r.add_argument("config", nargs="?", default=None, help="config TOML (default: the embedded digits problem)")
    r.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    r.add_argument("--quiet", action="store_true", help="no progress output")
    t = sub.add_parser("transport", parents=[common], help="forward token transport for the initial ρ")
    t.add_argument("config", help="config TOML")
    v = sub.add_parser("verify", help="the numerical verification suite (a table of checks, report.json)")
    v.add_argument("--quick", action="store_true", help="reduced sizes (a few minutes on 2 cores)")
    v.add_argument("--only", nargs="+", default=None, metavar="NAME", help="run only these checks")
    v.add_argument("--out", type=Path, default=None, help="output directory (default out/verify)")
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
    try:
        return _dispatch(args)
    except ConfigError as e:  # MeshError included
        _err(str(e))
        return 2
    except NumericalError as e:
        if MPI.COMM_WORLD.rank == 0:
            print(f"mfpde: numerical failure: {e}", file=sys.stderr)
        return 3


def _out_dir(args: argparse.Namespace) -> Path:
    if args.out is not None:
        return Path(args.out)
    if args.command == "verify":
        return Path("out") / "verify"
    stem = Path(args.config).stem if getattr(args, "config", None) else "default"
    return Path("out") / f"{args.command}-{stem}"


def _progress(quiet: bool) -> ProgressFactory | None:
    """A tqdm bar on a terminal (rank 0 only), else None (a log line per output step is printed instead)."""
    if quiet or MPI.COMM_WORLD.rank != 0 or not sys.stderr.isatty():
        return None
    from tqdm import tqdm  # only on a terminal

    return lambda total, initial: tqdm(total=total, initial=initial, desc="mfpde run", file=sys.stderr)


def _dispatch(args: argparse.Namespace) -> int:
    comm = MPI.COMM_WORLD
    out = _out_dir(args)
    if args.command == "verify":
        from mfpde.verify.job import verify_job  # the checks import scipy and gmsh: only when asked

        return verify_job(out, quick=args.quick, only=args.only, comm=comm)
    cfg = config.load(args.config, args.overrides)
    if args.command == "transport":
        transport_job(cfg, out, comm)
        return 0
    if args.command == "run":
        result = run_job(cfg, out, resume=args.resume, comm=comm, progress=_progress(args.quiet))
        if result.status == "failed":
            if comm.rank == 0:
                print(f"mfpde: numerical failure: {result.error}; last good state in {out / 'checkpoint'}",
                      file=sys.stderr)
            return 3
        return 0
    raise AssertionError(args.command)
