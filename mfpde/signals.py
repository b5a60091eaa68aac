"""Interruption by a signal: SIGTERM (a cluster's time limit), SIGINT (Ctrl-C) and SIGUSR1 (interface.md).

The CLI installs :func:`handlers` for the three signals while a command runs. The training loop of ``mfpde run``
runs :func:`deferred`: the first signal only sets a flag, which every rank reads once per training step through
one reduction (:func:`requested`), so that all ranks stop after the same step, even when one rank alone got the
signal; the run then writes its checkpoint, ``history.csv`` and a report with ``"status": "interrupted"`` and the
CLI exits with :data:`EXIT_INTERRUPTED`. Outside that loop (the set-up of a run or ``transport``, ``transport``,
``verify``, the final outputs of a run), or at a second signal, the handler raises :class:`Interrupted` at once
(at the next Python instruction: a long call into DOLFINx or PETSc finishes first). Where only some ranks got
the signal, the others are in a collective and never learn of it: the CLI then ends the job with
:data:`EXIT_INTERRUPTED` after :data:`mfpde.cli.INTERRUPT_GRACE` seconds (``MPI_Abort``).

PETSc's own handler (it printed a 6-line banner and ended the job with exit 59) is switched off by
:func:`quiet_petsc`, which passes ``-no_signal_handler`` to PETSc before petsc4py is first imported.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from mpi4py import MPI

__all__ = ["EXIT_INTERRUPTED", "SIGNALS", "Interrupted", "current_stage", "deferred", "handlers", "installed", "name",
           "pending", "quiet_petsc", "requested", "stage"]

#: The exit status of an interrupted command (0 done, 1 a bug, 2 invalid input, 3 numerical failure).
EXIT_INTERRUPTED = 4
#: The signals that interrupt a command cleanly.
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)

_state: dict[str, Any] = {"signal": 0, "deferred": 0, "stage": "", "installed": False}


class Interrupted(BaseException):  # noqa: N818  not an Exception: no ``except Exception`` may swallow it
    """A signal ended the command where it could not wait for the end of a training step.

    Attributes:
        signum: the signal.
        stage: what the command was doing (:func:`stage`: ``"set-up"``), or ``""``.
    """

    def __init__(self, signum: int, stage: str = "") -> None:
        super().__init__(name(signum))
        self.signum, self.stage = signum, stage


def name(signum: int) -> str:
    """``"SIGTERM"`` for 15, and so on."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _handler(signum: int, frame: FrameType | None) -> None:
    first = _state["signal"] == 0
    _state["signal"] = _state["signal"] or signum
    if _state["deferred"] and first:
        return  # the training loop stops at the end of the current step
    raise Interrupted(signum, str(_state["stage"]))


@contextlib.contextmanager
def handlers() -> Iterator[None]:
    """Install the handler for :data:`SIGNALS` while the block runs (main thread only); restore the old ones.

    ``SIGXFSZ`` is ignored meanwhile (as CPython does at start-up), so a write past the file-size limit
    (``ulimit -f``) fails with ``EFBIG`` instead of killing the process (:mod:`mfpde.fields` checks the limit).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _state["signal"] = 0
    _state["installed"] = True
    old: dict[int, Any] = {s: signal.signal(s, _handler) for s in SIGNALS}
    old[signal.SIGXFSZ] = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past ulimit -f: EFBIG, not death
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def installed() -> bool:
    """Whether :func:`handlers` has been entered in this process (the command has begun its work)."""
    return bool(_state["installed"])


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """While the block runs, a first signal sets a flag (read by :func:`requested`) instead of raising."""
    _state["deferred"] += 1
    try:
        yield
    finally:
        _state["deferred"] -= 1


@contextlib.contextmanager
def stage(what: str) -> Iterator[None]:
    """Name what the command does while the block runs (``"set-up"``), for the line an interruption prints."""
    before, _state["stage"] = _state["stage"], what
    try:
        yield
    finally:
        _state["stage"] = before


def current_stage() -> str:
    """The stage :func:`stage` named (``""`` outside any)."""
    return str(_state["stage"])


def pending() -> int:
    """The signal this process got under :func:`deferred` (0 if none): a local poll, no communication."""
    return int(_state["signal"])


def requested(comm: MPI.Comm) -> int:
    """The signal some rank of ``comm`` got (the largest number), or 0. Collective: call it on every rank."""
    return int(comm.allreduce(_state["signal"], op=MPI.MAX))


def quiet_petsc() -> None:
    """Start PETSc without its signal handler (``-no_signal_handler``), if petsc4py is not imported yet."""
    if "petsc4py.PETSc" in sys.modules:
        return
    import petsc4py

    petsc4py.init(["-no_signal_handler"])
