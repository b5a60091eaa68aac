"""μ_T of every sample of a split in one ``.bp`` file: ``fields/mu_T_<split>.bp``, the sample index as its "time".

One writer and one function space for all the samples of a split (a file and a writer per sample cost more than
the single-layer model's training). ParaView's time slider then steps through the samples; :func:`mfpde.read_vtx`
gives ``values[i]`` for sample i (``times[i] == i``).

Samples are solved by groups of ranks (:class:`mfpde.tokens.box.problem.SampleGroups`), each on its own copy of the
token mesh (partitioned over that group's ranks). The file is written by the first group (the one world rank 0 is
in) on its mesh: every rank sends the values of its owned cells, keyed by the cells' original (input) index, which every
partition agrees on, and the ranks of the first group place the values of the cells they own. Each cell is written
once (:class:`mfpde.fields.FieldWriter`), whatever the number of ranks and groups.
"""

from __future__ import annotations

from mpi4py import MPI  # noqa: F401  (before dolfinx)

import dolfinx.fem
import numpy as np
import numpy.typing as npt

from mfpde.fields import FieldFiles
from mfpde.tokens.box.problem import SampleGroups

__all__ = ["write_sample_fields"]

Array = npt.NDArray[np.float64]


def _owned_cells(V: dolfinx.fem.FunctionSpace) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]:
    """(original cell index, dofs, shape (n_owned_cells, dofs per cell)) of this rank's owned cells."""
    msh = V.mesh
    n = msh.topology.index_map(msh.topology.dim).size_local
    orig = np.asarray(msh.topology.original_cell_index, dtype=np.int64)[:n]
    return orig, np.asarray(V.dofmap.list[:n])


def write_sample_fields(groups: SampleGroups, V: dolfinx.fem.FunctionSpace, fields: FieldFiles, file: str, n: int,
                        values: dict[int, Array], name: str = "mu_T") -> None:
    """Write the fields of samples 0..n−1 into one VTX file, sample i at "time" i. Collective over ``groups.comm``.

    Args:
        groups: the split of the samples over rank groups.
        V: the (DG) space of this rank's group the values live in.
        fields: the job's fields.
        file: the output's name (``fields/<file>.bp``).
        n: the number of samples of the split (each group holds :meth:`SampleGroups.mine` of them).
        values: this group's samples' local dof values (owned and ghost), keyed by sample index.
        name: the field's name.

    Raises:
        ConfigError: no room for the file (:class:`~mfpde.fields.FieldWriter`), on the ranks of the first group
            only: call it inside :meth:`SampleGroups.collective_failure` so that every rank raises.
    """
    u = dolfinx.fem.Function(V, name=name)
    first = groups.color == 0
    if groups.n_groups == 1:  # every sample is on this mesh already
        rows = values
    else:
        orig, dofs = _owned_cells(V)
        mine = {i: v[dofs] for i, v in values.items()}  # shape (n_owned_cells, dofs per cell) per sample
        comm = groups.comm
        rows = {}
        for root in range(0, comm.size, groups.n_groups):  # the world ranks of the first group
            parts = comm.gather((orig, mine), root=root)
            if comm.rank == root:
                assert parts is not None
                rows = _place(parts, orig, dofs, len(u.x.array))
    if not first:
        return
    with fields.open(file, [u]) as w:  # on the first group's mesh: its ranks, groups.tcomm
        w.reserve(n)
        for i in range(n):
            u.x.array[:] = rows[i]
            w.write(float(i))


def _place(parts: list[tuple[npt.NDArray[np.int64], dict[int, Array]]], orig: npt.NDArray[np.int64],
           dofs: npt.NDArray[np.int32], n_local: int) -> dict[int, Array]:
    """The local dof values of every sample on this rank's owned cells (ghosts zero) from every rank's cells."""
    order = np.argsort(orig)
    out: dict[int, Array] = {}
    for cells, per_sample in parts:
        pos = np.searchsorted(orig, cells, sorter=order)
        hit = pos < len(orig)
        hit[hit] = orig[order[pos[hit]]] == cells[hit]  # the cells of that rank this rank owns too
        local = order[pos[hit]]
        for i, v in per_sample.items():
            row = out.setdefault(i, np.zeros(n_local))
            row[dofs[local]] = v[hit]
    return out
