"""The ``mfpde`` console script: a signal while the command starts ends it with exit 4 and one line.

Python takes SIGTERM and SIGINT by its defaults until :mod:`mfpde.cli` has imported its libraries and installed its
handlers (:mod:`mfpde.signals`): a cluster's time limit or a Ctrl-C in that second ended the command with status
143 or a ``KeyboardInterrupt`` traceback and no line. :func:`main` installs :func:`starting` first; nothing has
been written when it fires, so it exits at once (status 4, the line on the first rank only: MPI has not started).
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

__all__ = ["install", "main", "starting"]

#: The environment variables by which launchers give a process its rank (MPI has not started yet).
RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")


def starting(signum: int, frame: FrameType | None) -> None:
    """End the process with exit 4: a signal before the command's own handlers, nothing written yet."""
    rank = next((os.environ[v] for v in RANK_VARS if v in os.environ), "0")
    if rank == "0":
        name = signal.Signals(signum).name
        sys.stderr.write(f"mfpde: interrupted by {name} while starting (nothing was written)\n")
        sys.stderr.flush()
    os._exit(4)


def install() -> None:
    """Install :func:`starting` for SIGTERM, SIGINT and SIGUSR1 (the signals :mod:`mfpde.signals` handles)."""
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(s, starting)


def main() -> int:
    """The console script: :func:`install`, then :func:`mfpde.cli.main` (which installs the command's handlers)."""
    install()
    from mfpde.cli import main as cli_main

    return cli_main()
