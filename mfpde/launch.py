"""The ``mfpde`` console script: a signal while the command starts ends it with exit 4 and one line.

Python takes SIGTERM and SIGINT by its defaults until :mod:`mfpde.cli` has imported its libraries and installed its
handlers (:mod:`mfpde.signals`): a cluster's time limit or a Ctrl-C in that second ended the command with status
143 or a ``KeyboardInterrupt`` traceback and no line. :func:`main` installs :func:`starting` first; nothing has
been written when it fires, so it exits at once (status 4, the line on the first rank only: MPI has not started).
Once the command's handlers have come and gone (its work done, DIR settled, the last fraction of a second of
clean-up and MPI's end), a signal is noted, not obeyed: the command's exit status stands, and the first rank says
so in one line (it ended with 143 and no line, or said "while starting" of a finished command).
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

__all__ = ["install", "main", "starting"]

#: The environment variables by which launchers give a process its rank (MPI has not started yet).
RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")


#: The signals that came after the command's handlers (its work was done).
late: list[int] = []


def _rank() -> str:
    return next((os.environ[v] for v in RANK_VARS if v in os.environ), "0")


def starting(signum: int, frame: FrameType | None) -> None:
    """End the process with exit 4: a signal before the command's own handlers, nothing written yet.

    After them (:func:`mfpde.signals.installed`), the signal is noted in :data:`late` instead: the command's work
    is done and its exit status stands.
    """
    signals = sys.modules.get("mfpde.signals")
    if signals is not None and signals.installed():
        late.append(signum)
        return
    rank = _rank()
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

    code = cli_main()
    if late and _rank() == "0":
        sys.stderr.write(f"mfpde: {signal.Signals(late[0]).name} came after the command had ended; its exit status "
                         f"{code} stands\n")
        sys.stderr.flush()
    return code
