"""Output: atomic reports, history, ParaView fields (VTX ``.bp``) and checkpoints.

File formats (all under the command's DIR):

* ``report.json``, ``config.toml``, ``history.csv``: written by rank 0 to a temporary name, fsynced and
  renamed (then the directory fsynced), so a reader never sees a half-written or, after a node crash,
  empty file.
* ``history.csv``: one row per output step (``run``).
* ``fields/*.bp``: VTX (ADIOS2) files, one per field, readable by ParaView (open the ``.bp`` folder
  with the "ADIOS2VTXReader"). Time is the depth t (token fields) or training time s (ρ). Each rank writes
  its owned cells only (:class:`mfpde.fields.FieldWriter`): every cell once, on any number of ranks.
* ``checkpoint/state.npz``: the nodal values of ρ (global, in the rank-independent coordinate order of
  :class:`mfpde.params.theta.ThetaSpace`), the step and training time; written atomically and durably
  (fsync before the rename) by rank 0. ``checkpoint/history.f8`` and ``checkpoint/snapshots.f8``: the
  history rows and ρ snapshots, appended (:func:`append_records`); ``state.npz`` says how many are valid.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpi4py import MPI

import numpy as np

from mfpde.bp5 import Layout, check_bp5, check_data_extent
from mfpde.errors import ConfigError

logger = logging.getLogger(__name__)


def _fsync_dir(d: Path) -> None:
    """Make a rename in directory d durable (the directory entry is flushed too)."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:  # pragma: no cover - a file system that cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some file systems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def _replace_durably(tmp: Path, path: Path) -> None:
    """Flush the finished temporary file to disk (fsync), rename it over path and fsync the directory.

    Without the fsync a node crash after the rename can leave an empty file under the final name.
    """
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _agree(err: str, comm: MPI.Comm) -> None:
    """Share rank 0's write error with every rank and raise it everywhere (a hang otherwise)."""
    err = comm.bcast(err, root=0)
    if err:
        raise ConfigError(err)


def write_atomic(path: Path, text: str, comm: MPI.Comm = MPI.COMM_WORLD) -> None:
    """Write text to path on rank 0 via a temporary file, fsync and a rename (atomic and durable on POSIX).

    Raises:
        ConfigError: on every rank, if rank 0 could not write (a full disk, a file in the way).
    """
    err = ""
    if comm.rank == 0:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(text)
            _replace_durably(tmp, path)
        except OSError as e:
            err = f"cannot write {str(path)!r}: {e.strerror or e}"
    _agree(err, comm)


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, np.floating | float):
        return float(x) if np.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def write_report(out: Path, report: dict[str, Any], comm: MPI.Comm = MPI.COMM_WORLD) -> None:
    """Write ``report.json`` (non-finite numbers become null)."""
    write_atomic(out / "report.json", json.dumps(_jsonable(report), indent=2) + "\n", comm)


def save_checkpoint(out: Path, arrays: dict[str, np.ndarray], comm: MPI.Comm = MPI.COMM_WORLD) -> None:
    """Save global arrays (identical on all ranks) to ``checkpoint/state.npz`` atomically and durably.

    Raises:
        ConfigError: on every rank, if rank 0 could not write the checkpoint.
    """
    err = ""
    if comm.rank == 0:
        d = out / "checkpoint"
        try:
            d.mkdir(parents=True, exist_ok=True)
            tmp = d / "state.tmp.npz"
            np.savez(tmp, **arrays)  # type: ignore[arg-type]
            _replace_durably(tmp, d / "state.npz")
        except OSError as e:
            err = f"cannot write the checkpoint {str(d / 'state.npz')!r}: {e.strerror or e}"
    _agree(err, comm)


def append_records(path: Path, rows: np.ndarray, start: int) -> None:
    """Make the float64 file ``path`` hold ``start`` records of ``rows.shape[1]`` values, then ``rows``, durably.

    Rank 0 only. Records beyond ``start`` (a torn append of a killed job, or rows a resumed run computes again)
    are cut off, the new ones appended and the file fsynced: checkpoints write each history row and ρ snapshot
    once (the checkpoint stays O(size of ρ)), and ``checkpoint/state.npz``, renamed into place afterwards,
    says how many records are valid.

    Raises:
        OSError: the file cannot be written (a full disk).
    """
    size = rows.shape[1] * 8 if rows.ndim == 2 else 0
    with open(path, "ab+") as f:
        f.truncate(start * size)
        f.seek(0, os.SEEK_END)
        f.write(np.ascontiguousarray(rows, dtype="<f8").tobytes())
        f.flush()
        os.fsync(f.fileno())


def read_records(path: Path, n: int, width: int) -> np.ndarray:
    """The first ``n`` records of ``width`` float64 values of a file written by :func:`append_records`.

    Raises:
        ConfigError: the file is missing or shorter than n records.
    """
    try:
        data = np.fromfile(path, dtype="<f8", count=n * width) if n else np.zeros(0)
    except OSError as e:
        raise ConfigError(f"--resume: {str(path)!r} cannot be read: {e.strerror or e}") from None
    if data.size != n * width:
        raise ConfigError(f"--resume: {str(path)!r} holds fewer than the {n} records of the checkpoint")
    return data.reshape(n, width)


def load_checkpoint(out: Path) -> dict[str, np.ndarray] | None:
    """The arrays of ``checkpoint/state.npz``, or None if there is none.

    Raises:
        ConfigError: the file exists but cannot be read.
    """
    f = out / "checkpoint" / "state.npz"
    if not f.is_file():
        return None
    try:
        with np.load(f, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, TypeError, AttributeError, EOFError, KeyError, zipfile.BadZipFile) as e:
        raise ConfigError(f"--resume: checkpoint {str(f)!r} cannot be read ({type(e).__name__}: {e})") from None


def npz_array_sizes(path: str | Path) -> dict[str, tuple[tuple[int, ...], int]]:
    """The shape and the bytes per element of each array of an ``.npz`` file, from the headers alone (nothing loaded).

    Returns:
        ``{name: (shape, itemsize)}`` of the members whose header reads (``{}`` for a file that is no zip archive:
        the loader says what is wrong with it).
    """
    from numpy.lib import format as npformat

    out: dict[str, tuple[tuple[int, ...], int]] = {}
    try:
        with zipfile.ZipFile(path) as z:
            for name in z.namelist():
                if not name.endswith(".npy"):
                    continue
                with z.open(name) as f:
                    try:
                        version = npformat.read_magic(f)
                        read = (npformat.read_array_header_1_0 if version == (1, 0) else
                                npformat.read_array_header_2_0)
                        shape, _, dtype = read(f, max_header_size=10_000)
                    except (ValueError, TypeError, SyntaxError, EOFError):
                        continue
                out[name[: -len(".npy")]] = (tuple(int(n) for n in shape), int(dtype.itemsize))
    except (OSError, zipfile.BadZipFile, ValueError, EOFError):
        return {}
    return out


class RankFilter(logging.Filter):
    """Let only rank 0 log (house style: only rank 0 prints)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """True on rank 0 of ``COMM_WORLD`` only."""
        return MPI.COMM_WORLD.rank == 0


def setup_logging(quiet: bool = False) -> None:
    """Log to stderr from rank 0 only, tagged with ``rank/size``."""
    h = logging.StreamHandler(sys.stderr)
    h.addFilter(RankFilter())
    size = MPI.COMM_WORLD.size
    h.setFormatter(logging.Formatter(f"mfpde[0/{size}] %(message)s"))
    root = logging.getLogger("mfpde")
    root.handlers[:] = [h]
    root.setLevel(logging.WARNING if quiet else logging.INFO)


#: VTK cell types of the VTX files (Lagrange interval, triangle, quadrilateral) and their vertex counts.
_VTK_CELLS = frozenset({68, 69, 70})  # VTK's Lagrange curve, triangle and quadrilateral: the cells mfpde writes


def _newton_cotes(n: int) -> np.ndarray:
    """The weights (summing to 1) of n equispaced nodes on [0, 1] in VTK's order (end points, then interior)."""
    t = np.concatenate([[0.0, 1.0], np.arange(1, n - 1) / (n - 1)]) if n > 1 else np.array([0.5])
    V = np.vander(t, n, increasing=True).T  # Σ_j w_j t_j^i = 1/(i + 1)
    return np.linalg.solve(V, 1.0 / np.arange(1, n + 1))


@dataclass
class VTXField:
    """A field read back from a VTX (``.bp``) file: one snapshot per written time, all ranks' blocks joined.

    Attributes:
        name: the field's name (``"mu"``, ``"mu_T"``, ``"rho"``).
        times: the written times (depth t or training time s), shape (n,).
        values: per snapshot the nodal values (point data: P1, DG1) or cell values (cell data: DG0).
        cell_data: whether the values are per cell.
        points: per snapshot the node coordinates, shape (N, 3).
        cells: per snapshot the nodes of each cell (indices into ``points``), shape (C, k): k = 2 for
            intervals, 3 for triangles, 4 for quadrilaterals; on curves of Lagrange degree p ≥ 2 (the circle's
            DG2 and higher) the p + 1 nodes in VTK's order, the two end points first, then the interior nodes
            along the segment; a ghost cell that several ranks wrote appears once.
        curve: whether the cells are segments (an interval, or the circle's closed polygon).
    """

    name: str
    times: np.ndarray
    values: list[np.ndarray]
    cell_data: bool
    points: list[np.ndarray]
    cells: list[np.ndarray]
    curve: bool = False

    def integral(self, k: int) -> float:
        """∫ of snapshot k: Σ_cells ``|K|`` × (the cell value, or the mean of its nodal values); see :meth:`_cells`."""
        size, mean = self._cells(k)
        return float(size @ mean)

    def cell_integrals(self, k: int) -> np.ndarray:
        """∫ over each cell of snapshot k, shape (cells,): ``|K|`` × its value (:meth:`_cells`)."""
        size, mean = self._cells(k)
        return np.asarray(size * mean)

    def _cells(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(``|K|``, the cell value or the mean of its nodal values) per cell of snapshot k.

        On a curve of Lagrange degree p the mean is the Newton–Cotes rule of its p + 1 equispaced nodes.
        Exact for DG0, for P1/DG1 on intervals and triangles (flat cells of a surface in R³ too: the sphere's
        facets), for bilinear fields on parallelograms (box meshes), and for DG degree p on the segments of an
        interval or of the circle (there ``|K|`` is the arc of the unit circle that a segment of its inscribed
        polygon spans: the density is per unit angle).
        """
        x, c, v = self.points[k], self.cells[k], self.values[k]
        if self.curve:
            size = np.linalg.norm(x[c[:, 1]] - x[c[:, 0]], axis=1)
            if np.any(x[:, 1] != 0.0):  # the circle's polygon, inscribed in a circle of radius R: the arc
                radius = np.linalg.norm(x[c[:, 0]], axis=1)
                size = 2.0 * radius * np.arcsin(np.minimum(size / (2.0 * radius), 1.0))
            return size, (v if self.cell_data else v[c] @ _newton_cotes(c.shape[1]))
        # the vector area ½|Σ_i x_i × x_{i+1}| of each planar polygon (VTK's vertex order around the cell): the
        # shoelace formula in the plane, and the true area of a flat cell of a surface in R³ (the sphere's facets)
        p = x[c]
        size = 0.5 * np.linalg.norm(np.sum(np.cross(p, np.roll(p, -1, axis=1)), axis=1), axis=1)
        return size, (v if self.cell_data else v[c].mean(axis=1))


def read_vtx(path: str | Path, name: str | None = None) -> VTXField:
    """Read a field of an mfpde ``.bp`` file (``fields/rho.bp``, ``fields/mu_<i>.bp``, ...) into numpy.

    Needs the ``adios2`` wheel (a dependency of mfpde); DOLFINx is imported first,
    because the wheel's ADIOS2 library loaded before DOLFINx's breaks the latter. Serial: call it on one rank.

    Args:
        path: the ``.bp`` directory.
        name: the field (default: the one data array that is not geometry or VTK bookkeeping).

    Returns:
        The snapshots, blocks of every writing rank joined (cell indices shifted accordingly).

    Raises:
        ConfigError: the file is missing, damaged (a file of the directory missing, cut short or not matching
            the others: checked before ADIOS2 reads it, :func:`mfpde.bp5.check_bp5`) or holds no such field.
    """
    importlib.import_module("dolfinx.io")  # before adios2 (it loads dolfinx's own ADIOS2 library), see above
    import adios2

    if not Path(path).is_dir():
        raise ConfigError(f"{str(path)!r}: no such .bp directory")
    layout = check_bp5(Path(path))  # ADIOS2 hangs or crashes on a damaged file: check it first
    try:
        with adios2.FileReader(str(path)) as f:
            return _read(f, Path(path), layout, name)
    except ConfigError:
        raise
    except (RuntimeError, IndexError, ValueError, KeyError, TypeError) as e:  # ADIOS2's, with ANSI colours
        lines = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip().splitlines()
        why = lines[0] if lines else type(e).__name__  # ADIOS2's KeyError() has no message
        raise ConfigError(f"{str(path)!r}: cannot be read as a field written by mfpde ({why})") from None


#: Bytes of the element types of VTX arrays (ADIOS2's names).
_TYPE_BYTES = {"double": 8, "float": 4, "int64_t": 8, "uint64_t": 8, "int32_t": 4, "uint32_t": 4, "uint8_t": 1,
               "int8_t": 1, "char": 1}


def _read(f: Any, path: Path, layout: Layout, name: str | None) -> VTXField:
    """The field ``name`` of the open ADIOS2 reader f of the checked directory path (see :func:`read_vtx`)."""
    skip = {"NumberOfEntities", "NumberOfCells", "NumberOfNodes", "connectivity", "geometry", "step", "types",
            "vtkGhostType", "vtkOriginalPointIds"}
    avail = f.available_variables()
    n = f.num_steps()
    if n != len(layout.positions):
        raise ConfigError(f"{str(path)!r}: damaged .bp file (ADIOS2 reads {n} steps, the index lists "
                          f"{len(layout.positions)}); write it again")
    nbytes: list[dict[int, int]] = [{} for _ in range(n)]  # per step and writer: 8-byte arrays, then the others
    small: list[dict[int, int]] = [{} for _ in range(n)]
    for var, info in avail.items():  # the local arrays' bytes: the data ADIOS2 will read (mfpde.bp5)
        if info.get("Shape", "") or info.get("SingleValue") == "true":
            continue  # VTK's global counts and single values are not in data.<subfile>
        size = _TYPE_BYTES.get(info["Type"], 1)
        for k, blocks in enumerate(f.all_blocks_info(var)[:n]):
            for b in blocks:
                items = int(np.prod([int(c) for c in str(b["Count"]).split(",") if c], dtype=np.int64))
                to = nbytes if size == 8 else small
                to[k][int(b["WriterID"])] = to[k].get(int(b["WriterID"]), 0) + items * size
    for big, rest in zip(nbytes, small, strict=True):  # the byte arrays padded to the next 8-byte array
        for w, m in rest.items():
            big[w] = big.get(w, 0) + -(-m // 8) * 8
    check_data_extent(path, layout, nbytes)
    names = [k for k in avail if k not in skip]
    name = name if name is not None else (names[0] if len(names) == 1 else None)
    if name is None or name not in avail:
        raise ConfigError(f"{str(path)!r}: field {name!r} not found (fields: {', '.join(names)})")
    missing = sorted({"vtk.xml"} - set(f.available_attributes()) | {"step", "types", "geometry", "connectivity",
                                                                      "vtkOriginalPointIds"} - set(avail))
    if missing:  # a plain ADIOS2 file (not VTX): ADIOS2's KeyError had no message (an IndexError building ours)
        raise ConfigError(f"{str(path)!r}: not a VTX field file written by mfpde (an ADIOS2 .bp file without "
                          f"{', '.join(missing)}; its variables: {', '.join(avail) or 'none'})")
    xml = f.read_attribute_string("vtk.xml")
    xml = xml if isinstance(xml, str) else xml[0]
    cell_data = "<CellData>" in xml and f'Name="{name}"' in xml.split("<CellData>", 1)[1]
    times, values, points, cells = [], [], [], []
    for k in range(n):
        times.append(float(f.read("step", step_selection=[k, 1]).ravel()[0]))
        kind = int(f.read("types", step_selection=[k, 1]).ravel()[0])
        if kind not in _VTK_CELLS:
            raise ConfigError(f"{str(path)!r}: VTK cell type {kind} is not one mfpde writes")
        blocks = range(len(f.all_blocks_info("geometry")[k]))
        x = [f.read("geometry", block_id=b, step_selection=[k, 1]).reshape(-1, 3) for b in blocks]
        count = "NumberOfEntities" if "NumberOfEntities" in avail else "NumberOfCells"
        ncell = [int(f.read(count, block_id=b, step_selection=[k, 1]).ravel()[0]) for b in blocks]
        # each row: the node count, then the nodes (more than the vertices on higher-degree Lagrange cells)
        conn = [f.read("connectivity", block_id=b, step_selection=[k, 1]).reshape(nc, -1)[:, 1:]
                for b, nc in zip(blocks, ncell, strict=True)]
        shift = np.cumsum([0] + [len(p) for p in x[:-1]])
        gid = np.concatenate([f.read("vtkOriginalPointIds", block_id=b, step_selection=[k, 1]).ravel()
                              for b in blocks])
        c = np.concatenate([c + s for c, s in zip(conn, shift, strict=True)])
        # a rank also writes its ghost cells: keep each cell once, by the global ids of its nodes
        keep = np.sort(np.unique(np.sort(gid[c], axis=1), axis=0, return_index=True)[1])
        points.append(np.concatenate(x))
        cells.append(c[keep])
        v = np.concatenate([f.read(name, block_id=b, step_selection=[k, 1]).ravel() for b in blocks])
        values.append(v[keep] if cell_data else v)
    return VTXField(name, np.array(times), values, cell_data, points, cells, curve=kind == 68)
