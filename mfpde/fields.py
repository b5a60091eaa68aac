"""ParaView fields (VTX ``.bp``) that hold every cell once, whatever the number of ranks.

The token mesh is ghosted (the upwind DG facet integrals need the neighbour across a partition boundary), and
``dolfinx.io.VTXWriter`` writes each rank's local cells, ghosts included, with no cell ghost marker (its
``vtkGhostType`` marks points): a DG0 density on 256 cells written from 2 ranks held 288 cell values, and
ParaView's integrals summed its mass to 1.61 instead of 1 (issue 14). :class:`FieldWriter` writes instead a copy
of the fields on the submesh of the owned cells (``dolfinx.mesh.create_submesh``, no ghosts), interpolated cell
by cell (the same element: an exact copy of the dofs) before each write.

A full disk: ADIOS2 raised from ``VTXWriter.write`` on the rank that failed (the others hung in the write), and
the writer's close then ended the process in ``std::terminate`` (exit 134). So before creating the file and
before each write, rank 0 reserves (``posix_fallocate``) twice the bytes the write adds, plus
:data:`RESERVE_BYTES`, next to the file, and every rank learns the outcome: where there is no room every rank
raises :class:`~mfpde.errors.ConfigError` naming the file, before ADIOS2 is called. The writer is then abandoned
(:func:`abandoned`): never closed, since its close could fail the same way; the CLI ends the process without
destroying it. A disk that another process fills between the reservation and the write is not covered.

A file-size limit (``ulimit -f``, ``RLIMIT_FSIZE``, common on batch systems) is the same fault per file: ADIOS2
raised ``EFBIG`` on the rank that wrote ``data.0`` and the others hung. The smallest limit of the ranks is agreed
once per reservation, and a write after which the largest file of the ``.bp`` directory could exceed it is
refused like a full disk (``SIGXFSZ``, which would kill the process instead, is ignored by the CLI:
:func:`mfpde.signals.handlers`).

A job that ends with an exception while a writer is open (:func:`ended`, around every job that writes fields):
the writer was destroyed with the traceback, after the CLI had removed DIR's ``fields/`` (ADIOS2's close then
ended the process in ``std::terminate``, exit 134), or, under MPI, on a rank that got a signal alone while the
others waited in a collective of the solve (ADIOS2's close is collective: every rank spun at 100 % for ever). So
on the way out of the job each open writer is closed where every rank ends the same way (one rank; an
:class:`~mfpde.errors.ConfigError` or :class:`~mfpde.errors.NumericalError`, which are raised on every rank), and
abandoned otherwise (a signal, a bug: the CLI ends the job without destroying it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from mpi4py import MPI

import dolfinx.fem
import dolfinx.io
import dolfinx.mesh
import numpy as np
import numpy.typing as npt

from mfpde.errors import ConfigError, NumericalError

__all__ = ["FieldFiles", "FieldWriter", "abandoned", "end_open", "ended"]

#: Bytes reserved beyond the estimate of a write (ADIOS2's metadata, the file's close).
RESERVE_BYTES = 1 << 20
#: Writers abandoned after a refused write: kept alive so that their destructor (a close) never runs.
_ABANDONED: list[FieldWriter] = []
#: The writers not closed yet.
_OPEN: weakref.WeakSet[FieldWriter] = weakref.WeakSet()


def abandoned() -> bool:
    """Whether a writer was abandoned (the process must then end by ``os._exit``: its close could abort)."""
    return bool(_ABANDONED)


def _agreed(exc: BaseException | None) -> bool:
    """Whether every rank ends with ``exc``: none, or the errors raised on every rank (input, numerical)."""
    return exc is None or isinstance(exc, ConfigError | NumericalError)


def end_open(exc: BaseException | None) -> None:
    """Close every open writer if every rank ends the same way (one rank, or :func:`_agreed`); abandon it otherwise.

    A writer's close is collective: on a rank that ends alone (a signal that reached it only, a bug) it waited for
    ever for the others, which wait in a collective of the solve. An abandoned writer is never destroyed: the CLI
    ends the process by ``os._exit`` (:func:`abandoned`).
    """
    for w in list(_OPEN):
        w.end(exc)


@contextlib.contextmanager
def ended() -> Iterator[None]:
    """Around a job: if it raises, its open writers are closed or abandoned (:func:`end_open`) before DIR is settled.

    Without it a writer was destroyed with the traceback, after the CLI had removed ``fields/`` (exit 134), or
    collectively on a rank interrupted alone (a hang).
    """
    try:
        yield
    except BaseException as e:
        end_open(e)
        raise


def _size_limit(comm: MPI.Comm) -> int:
    """The smallest file-size limit (``RLIMIT_FSIZE``, bytes) of the ranks of comm, -1 for none. Collective."""
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    limit = comm.allreduce(soft if soft != resource.RLIM_INFINITY and soft >= 0 else 1 << 62, op=MPI.MIN)
    return -1 if limit == 1 << 62 else int(limit)


def _largest_file(path: Path) -> int:
    """The size in bytes of the largest file of the directory path (0 if there is none)."""
    try:
        return max((f.stat().st_size for f in path.iterdir() if f.is_file()), default=0)
    except OSError:
        return 0


def _room(path: Path, nbytes: int, comm: MPI.Comm) -> None:
    """Reserve nbytes beside path on rank 0 and give it back; every rank raises if there is no room. Collective.

    Also refuses when the largest file of the directory path plus nbytes exceeds the smallest file-size limit
    (``ulimit -f``) of the ranks.

    Raises:
        ConfigError: the reservation failed (no space left, a quota, a file in the way, the file-size limit).
    """
    limit = _size_limit(comm)
    err = ""
    if comm.rank == 0:
        mib = f"needs about {nbytes / 2**20:.3g} MiB"
        ulimit = f"the file-size limit (ulimit -f) is {limit / 2**20:.3g} MiB"
        probe = path.parent / f".mfpde-room-{os.getpid()}"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
            try:
                os.posix_fallocate(fd, 0, nbytes)
            finally:
                os.close(fd)
                probe.unlink(missing_ok=True)
        except OSError as e:
            hint = f"; {ulimit}" if e.errno == errno.EFBIG and limit >= 0 else ""
            err = f"cannot write {str(path)!r}: {e.strerror or e} ({mib}{hint})"
        if not err and limit >= 0 and _largest_file(path) + nbytes > limit:
            err = (f"cannot write {str(path)!r}: {os.strerror(errno.EFBIG)} ({ulimit}: the file holds "
                   f"{_largest_file(path) / 2**20:.3g} MiB and the next write {mib})")
    err = comm.bcast(err, root=0)
    if err:
        raise ConfigError(err)

#: The owned-cells submesh of a mesh, and the matching cells of both (built once per mesh: it is collective).
_OWNED: weakref.WeakKeyDictionary[dolfinx.mesh.Mesh, tuple[dolfinx.mesh.Mesh, npt.NDArray[np.int32],
                                                           npt.NDArray[np.int32]]] = weakref.WeakKeyDictionary()


def _owned_submesh(msh: dolfinx.mesh.Mesh) -> tuple[dolfinx.mesh.Mesh, npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """(submesh of the owned cells, their indices in ``msh``, the same cells' indices in the submesh). Collective."""
    if msh not in _OWNED:
        tdim = msh.topology.dim
        cells = np.arange(msh.topology.index_map(tdim).size_local, dtype=np.int32)
        sub, emap, _, _ = dolfinx.mesh.create_submesh(msh, tdim, cells)
        sub_cells = np.asarray(emap.sub_topology_to_topology(cells, inverse=True), dtype=np.int32)
        _OWNED[msh] = (sub, cells, sub_cells)
    return _OWNED[msh]


class FieldFiles:
    """The fields a job writes into its DIR: :meth:`open` names a field, the job's directory holds its file.

    The jobs floor makes it (:mod:`mfpde.jobs`); the solvers it hands it to name their fields (``mu_0``) and never
    a path.
    """

    def __init__(self, out: Path) -> None:
        self.out = Path(out)

    def open(self, name: str, functions: list[dolfinx.fem.Function]) -> FieldWriter:
        """A :class:`FieldWriter` of ``DIR/fields/<name>.bp`` for ``functions`` (collective over their mesh's ranks)."""
        return FieldWriter(functions[0].function_space.mesh.comm, self.out / "fields" / f"{name}.bp", functions)


class FieldWriter:
    """A ``VTXWriter`` for Functions on one (ghosted) mesh that writes each cell once, on its owning rank.

    Args:
        comm: the mesh's communicator.
        path: the ``.bp`` output.
        functions: the fields, on one mesh (their names are kept).

    Collective: construction, :meth:`write` and :meth:`close`.
    """

    def __init__(self, comm: MPI.Comm, path: Path, functions: list[dolfinx.fem.Function]) -> None:
        sub, self._cells0, self._cells1 = _owned_submesh(functions[0].function_space.mesh)
        self._pairs = []
        for f in functions:
            V = dolfinx.fem.functionspace(sub, f.function_space.ufl_element())
            self._pairs.append((f, dolfinx.fem.Function(V, name=f.name)))
        self.comm, self.path, self.closed = comm, Path(path), False
        x, tdim = sub.geometry.x, sub.topology.dim
        cells = sub.topology.index_map(tdim).size_local
        local = 8 * (sum(g.x.array.size for _, g in self._pairs) + 4 * x.shape[0] + cells * (tdim + 3))
        self._bytes = 2 * int(comm.allreduce(local, op=MPI.SUM)) + RESERVE_BYTES  # values, geometry, cells
        _room(self.path, RESERVE_BYTES, comm)
        self._writer = dolfinx.io.VTXWriter(comm, path, [g for _, g in self._pairs])
        self._reserved = 0  # writes whose room :meth:`reserve` checked at once
        _OPEN.add(self)

    def reserve(self, writes: int) -> None:
        """Check the room for the next ``writes`` writes at once (a burst: one probe instead of one per write).

        Raises:
            ConfigError: on every rank, there is no room for them (the writer is then abandoned).
        """
        self._check(writes * self._bytes)
        self._reserved = writes

    def _check(self, nbytes: int) -> None:
        try:
            _room(self.path, nbytes, self.comm)
        except Exception:
            self._abandon()
            raise

    def _abandon(self) -> None:
        self.closed = True
        _OPEN.discard(self)
        _ABANDONED.append(self)

    def write(self, t: float) -> None:
        """Copy the fields onto the owned cells and write them at time t.

        Raises:
            ConfigError: on every rank, there is no room for the write (the writer is then abandoned).
        """
        for f, g in self._pairs:
            g.interpolate(f, cells0=self._cells0, cells1=self._cells1)
            g.x.scatter_forward()
        if self._reserved:
            self._reserved -= 1
        else:
            self._check(self._bytes)
        self._writer.write(t)

    def close(self) -> None:
        """Close the file (nothing if it was abandoned).

        Called while an exception propagates (a ``finally`` clause), it closes or abandons the file as :meth:`end`
        decides for that exception: a collective close on a rank that a signal reached alone would wait for ever.
        """
        exc = sys.exception()
        if exc is not None and not self.closed and not (self.comm.size == 1 or _agreed(exc)):
            self._abandon()
            return
        if not self.closed:
            self.closed = True
            _OPEN.discard(self)
            self._writer.close()

    def end(self, exc: BaseException | None) -> None:
        """Close the file if every rank ends with ``exc`` (or there is one rank), else abandon it (:func:`end_open`)."""
        if self.closed:
            return
        if self.comm.size == 1 or _agreed(exc):
            try:
                self.close()
            except Exception:  # noqa: BLE001  the job's own error is the one to report
                _ABANDONED.append(self)
        else:
            self._abandon()

    def __del__(self) -> None:
        """A writer freed while open (a job that raised past it): abandoned, never closed here.

        Its close is collective and came from the garbage collector at any point: after DIR's ``fields/`` was
        removed (exit 134 in ADIOS2), or on a rank that a signal reached alone (a hang). The CLI ends the
        process without destroying it (:func:`abandoned`).
        """
        if not getattr(self, "closed", True):
            self._abandon()  # kept alive in _ABANDONED: the VTXWriter's destructor never runs

    def __enter__(self) -> FieldWriter:
        """The writer itself."""
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Close the file, or abandon it if the block ended with an exception on this rank alone (:meth:`end`)."""
        self.end(exc)
