"""Meshes of the token domain Ω ⊂ R^d and of the parameter domain Θ ⊂ R^p.

Boxes are built by DOLFINx (intervals, quadrilaterals or right-diagonal triangles); other domains come
from gmsh ``.msh`` files read by ``dolfinx.io.gmsh.read_from_msh`` on rank 0 and distributed.
A box remembers its vertex axes: the attention kernel uses the tensor-product structure (see
:mod:`mfpde.tokens.attention`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from mpi4py import MPI

import dolfinx.cpp
import dolfinx.io.gmsh
import dolfinx.mesh
import numpy as np
import numpy.typing as npt

from mfpde.errors import MeshError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Domain:
    """A mesh and, for boxes, the coordinates of its vertex grid along each axis.

    Attributes:
        mesh: the (distributed) DOLFINx mesh.
        axes: for a box, one array of vertex coordinates per axis, shape (n_j + 1,); else None.
    """

    mesh: dolfinx.mesh.Mesh
    axes: tuple[npt.NDArray[np.float64], ...] | None = None

    @property
    def dim(self) -> int:
        """The geometric dimension of the mesh."""
        return self.mesh.geometry.dim


def box(comm: MPI.Comm, bounds: list[list[float]], cells: list[int], cell: str = "quadrilateral") -> Domain:
    """A box mesh: an interval (d = 1) or a rectangle of quadrilaterals or right triangles (d = 2).

    Args:
        comm: communicator over which the mesh is distributed.
        bounds: per-axis [lo, hi], length d.
        cells: cells per axis, length d.
        cell: ``"quadrilateral"`` or ``"triangle"`` (d = 2 only).
    """
    d = len(bounds)
    axes = tuple(np.linspace(lo, hi, n + 1) for (lo, hi), n in zip(bounds, cells, strict=True))
    if d == 1:
        msh = dolfinx.mesh.create_interval(comm, cells[0], bounds[0])
    elif d == 2:
        ct = dolfinx.mesh.CellType.quadrilateral if cell == "quadrilateral" else dolfinx.mesh.CellType.triangle
        lo = [b[0] for b in bounds]
        hi = [b[1] for b in bounds]
        msh = dolfinx.mesh.create_rectangle(comm, [lo, hi], cells, cell_type=ct)
    else:
        raise MeshError(f"box of dimension {d}: only 1 and 2 are supported")
    return Domain(msh, axes)


def read_msh(comm: MPI.Comm, path: str | Path, gdim: int) -> Domain:
    """Read a gmsh ``.msh`` file (physical groups required) as a mesh of geometric dimension gdim.

    Raises:
        MeshError: the file is missing or cannot be read, or its cells are not of dimension gdim.
    """
    import gmsh

    path = Path(path)
    if not path.is_file():
        raise MeshError(f"mesh file {str(path)!r} not found")
    # Validate with the reader that loads (DOLFINx's, through gmsh): rank 0 reads the file alone first and
    # every rank agrees on the outcome, since read_from_msh is collective and an exception on rank 0 alone
    # would leave the other ranks waiting for ever. (meshio, used before, accepted files DOLFINx rejects
    # and refused MSH 4.0 files it reads.)
    err = ""
    if comm.rank == 0:
        err = _claims_past_memory(path)  # gmsh would try to allocate them, and fail with an empty message
        try:
            if not err:
                _quiet_gmsh()
                tdim = dolfinx.io.gmsh.read_from_msh(path, MPI.COMM_SELF, 0, gdim=gdim).mesh.topology.dim
                if tdim != gdim:
                    err = f"has cells of dimension {tdim}, expected {gdim}"
        except Exception as e:  # gmsh and DOLFINx raise Exception, RuntimeError, ValueError, ... on bad files
            why = str(e).strip() or ("gmsh gave no reason (a file it cannot parse, or sizes it cannot allocate: "
                                     "check its $Nodes and $Elements headers)")
            err = f"could not be read: {type(e).__name__}: {why}"
            if gmsh.isInitialized():
                gmsh.finalize()
    err = comm.bcast(err, root=0)
    if err:
        raise MeshError(f"mesh file {str(path)!r} {err}")
    # Ghost cells across shared facets, as the built-in meshes do: DG interior-facet integrals need them.
    part = dolfinx.cpp.mesh.create_cell_partitioner(dolfinx.mesh.GhostMode.shared_facet, 2)
    if comm.rank == 0:
        _quiet_gmsh()
    msh = dolfinx.io.gmsh.read_from_msh(path, comm, 0, gdim=gdim, partitioner=part).mesh
    return Domain(msh, None)


#: Bytes a gmsh reader takes at least per node (three float64 coordinates and a tag) and per element (a tag, a type
#: and four node tags): a lower bound to compare a file's headers with the memory of this node.
BYTES_PER_NODE, BYTES_PER_ELEMENT = 32, 40
#: How far into a file the headers of $Nodes and $Elements are looked for (a header past it is left to gmsh).
HEADER_SCAN_BYTES = 1 << 26


def _claims_past_memory(path: Path) -> str:
    """Why an ASCII ``.msh`` file cannot be read here: its $Nodes or $Elements header claims more than memory.

    gmsh's reader fails on such a file with an empty message (``Exception: ``). MSH 4: ``numEntityBlocks numNodes
    minNodeTag maxNodeTag`` (the largest count or tag taken); MSH 2: ``numNodes``. A binary file, or one whose
    headers do not parse, gives ``""`` (gmsh decides).
    """
    from mfpde.limits import node_memory_bytes

    counts: dict[str, int] = {}
    try:
        with open(path, "rb") as f:
            read = 0
            section = ""
            while raw := f.readline(4096):  # bounded lines: a binary file's "line" may be gigabytes
                read += len(raw)
                line = raw.strip()
                if line in (b"$Nodes", b"$Elements"):
                    section = line.decode()[1:].lower()
                    continue
                if section:
                    fields = line.split()
                    counts[section] = max(int(x) for x in (fields[1:] if len(fields) >= 4 else fields[:1]))
                    section = ""
                    if len(counts) == 2:
                        break
                if read > HEADER_SCAN_BYTES:
                    break
    except (OSError, ValueError):  # unreadable, binary or not numbers: gmsh says what it says
        return ""
    need = counts.get("nodes", 0) * BYTES_PER_NODE + counts.get("elements", 0) * BYTES_PER_ELEMENT
    have = node_memory_bytes()
    if need <= have:
        return ""
    what = " and ".join(f"{counts[k]:.3g} {k}" if counts[k] >= 10**6 else f"{counts[k]} {k}"
                        for k in ("nodes", "elements") if k in counts)
    return (f"claims {what} in its headers: at least {need / 1e9:.3g} GB to read, more than the {have / 1e9:.3g} GB "
            "of this node")


def _quiet_gmsh() -> None:
    """Initialise gmsh without its "Info: Reading ..." lines on the terminal (read_from_msh finalises it)."""
    import gmsh

    if not gmsh.isInitialized():
        gmsh.initialize()
    gmsh.option.setNumber("General.Terminal", 0)


def make_domain(comm: MPI.Comm, dim: int, mesh_file: str, bounds: list[list[float]], cells: list[int],
                cell: str = "quadrilateral") -> Domain:
    """The domain of a config section: a gmsh file if ``mesh_file`` is set, else a box."""
    if mesh_file:
        return read_msh(comm, mesh_file, dim)
    return box(comm, bounds, cells, cell)


def measure(msh: dolfinx.mesh.Mesh) -> float:
    """The measure (length, area) of the mesh domain, summed over ranks."""
    import dolfinx.fem
    import ufl

    one = dolfinx.fem.form(dolfinx.fem.Constant(msh, 1.0) * ufl.dx(domain=msh))
    return msh.comm.allreduce(dolfinx.fem.assemble_scalar(one), op=MPI.SUM)
