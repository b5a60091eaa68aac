"""ParaView fields (VTX ``.bp``) that hold every cell once, whatever the number of ranks.

The token mesh is ghosted (the upwind DG facet integrals need the neighbour across a partition boundary), and
``dolfinx.io.VTXWriter`` writes each rank's local cells, ghosts included, with no cell ghost marker (its
``vtkGhostType`` marks points): a DG0 density on 256 cells written from 2 ranks held 288 cell values, and
ParaView's integrals summed its mass to 1.61 instead of 1 (issue 14). :class:`FieldWriter` writes instead a copy
of the fields on the submesh of the owned cells (``dolfinx.mesh.create_submesh``, no ghosts), interpolated cell
by cell (the same element: an exact copy of the dofs) before each write.
"""

from __future__ import annotations

import weakref
from pathlib import Path
from types import TracebackType

from mpi4py import MPI

import dolfinx.fem
import dolfinx.io
import dolfinx.mesh
import numpy as np
import numpy.typing as npt

__all__ = ["FieldWriter"]

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
        self._writer = dolfinx.io.VTXWriter(comm, path, [g for _, g in self._pairs])

    def write(self, t: float) -> None:
        """Copy the fields onto the owned cells and write them at time t."""
        for f, g in self._pairs:
            g.interpolate(f, cells0=self._cells0, cells1=self._cells1)
            g.x.scatter_forward()
        self._writer.write(t)

    def close(self) -> None:
        """Close the file."""
        self._writer.close()

    def __enter__(self) -> FieldWriter:
        """The writer itself."""
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Close the file."""
        self.close()
