"""The one scaffold of every job: the output directory as a transaction, the resolved config and the report.

:class:`JobDir` is entered once the input is validated (a refused input writes nothing): it prepares DIR
(:func:`mfpde.outdir.prepare_output_dir`: the previous result set aside until the job ends), writes the resolved
``config.toml`` and starts the wall clock; :meth:`JobDir.failed` writes the report of a failed solve (``status``
"failed", the samples computed, the error) and :meth:`JobDir.finish` the report of a finished one. Every report
begins with the same head: ``status``, ``command``, ``version``, the job's own head fields (``domain``, ...),
``comm_size``; it ends with ``wall_s``. Reports are written by rank 0, atomically (:func:`mfpde.io.write_report`).
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

from mpi4py import MPI

from mfpde import __version__
from mfpde.config.keys import to_toml
from mfpde.errors import ConfigError
from mfpde.io import write_atomic, write_report
from mfpde.outdir import prepare_output_dir

__all__ = ["JobDir", "refuse_finished"]


class JobDir:
    """DIR of one job, prepared, with the resolved config written, and the head of its report.

    Args:
        cfg: the validated config (written as ``config.toml``; None: no config, e.g. ``verify``).
        out: DIR.
        comm: the ranks (rank 0 writes).
        command: the command (``"transport"``, ``"continuation"``, ...).
        keep: keep DIR's checkpoint (a resumed run).
        head: the job's own fields of the report's head (``domain``, ``dim``, ...), after ``command`` and
            ``version``.
    """

    def __init__(self, cfg: Any, out: Path, comm: MPI.Comm, command: str, keep: bool = False,
                 **head: Any) -> None:
        self.out, self.comm = out, comm
        prepare_output_dir(out, comm, keep=keep)
        if cfg is not None:
            write_atomic(out / "config.toml", to_toml(cfg), comm)
        self.head: dict[str, Any] = {"command": command, "version": __version__, **head, "comm_size": comm.size}
        self.t0 = time.perf_counter()

    @classmethod
    def existing(cls, out: Path, comm: MPI.Comm, command: str, **head: Any) -> JobDir:
        """The scaffold of a DIR prepared already (or by the caller, as a test does): nothing moved or written."""
        job = cls.__new__(cls)
        job.out, job.comm = out, comm
        job.head = {"command": command, "version": __version__, **head, "comm_size": comm.size}
        job.t0 = time.perf_counter()
        return job

    def add_head(self, **fields: Any) -> None:
        """Head fields known only once the job has started (before ``comm_size``, as those given at the start)."""
        size = self.head.pop("comm_size")
        self.head.update(fields, comm_size=size)

    def report(self, status: str, **fields: Any) -> dict[str, Any]:
        """The report: ``status``, the head, ``fields`` and ``wall_s`` (not written)."""
        return {"status": status, **self.head, **fields, "wall_s": time.perf_counter() - self.t0}

    def failed(self, error: str, samples: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
        """Write the report of a failed solve: ``status`` "failed", the samples computed, the error (one line)."""
        report = self.report("failed", samples=samples, **fields, error=error)
        write_report(self.out, report, self.comm)
        return report

    def finish(self, status: str = "ok", **fields: Any) -> dict[str, Any]:
        """Write the report of the finished job (``status`` "ok" unless told) and return it."""
        return self.write(self.report(status, **fields))

    def write(self, report: dict[str, Any]) -> dict[str, Any]:
        """Write a report made by :meth:`report` (drawn from before it is written), its ``wall_s`` brought up to now."""
        report["wall_s"] = time.perf_counter() - self.t0
        write_report(self.out, report, self.comm)
        return report


def refuse_finished(out: Path, comm: MPI.Comm) -> None:
    """Raise if ``out`` holds a finished run (``report.json`` of status "ok"), on every rank.

    Raises:
        ConfigError: naming ``--resume`` and ``--overwrite``.
    """
    done = False
    if comm.rank == 0:
        with contextlib.suppress(OSError, ValueError):
            done = json.loads((out / "report.json").read_text()).get("status") == "ok"
    if comm.bcast(done, root=0):
        raise ConfigError(f"--out {str(out)!r} holds a finished run (report.json, status ok): --resume to continue "
                          "it, --overwrite to replace it, or another --out")
