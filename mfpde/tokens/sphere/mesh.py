"""The icosahedral surface mesh of the unit sphere S² (theory §9): gdim 3, tdim 2, built in code.

The icosahedron's 20 faces are refined r times by splitting every triangle into four at its edge midpoints,
the new vertices projected onto the unit sphere: 20·4^r triangles, 10·4^r + 2 vertices, all on S², faces
oriented with the outward normal. ``order = 2`` adds the edge midpoints (projected onto S²) as the nodes of a
quadratic geometry (dolfinx's 6-node triangle: vertices, then the edges opposite vertex 0, 1, 2). The mesh is
built with numpy on rank 0 and distributed by :func:`dolfinx.mesh.create_mesh` with the cells sharing a facet
with a rank's cells as its ghosts (the DG fluxes read the neighbour's values); it is not read from XDMF
(dolfinx #2389: manifold meshes from XDMF).

Geometric error (measured): the faceted sphere's area falls short of 4π by a relative 1.9e-2, 4.8e-3, 1.2e-3
at r = 2, 3, 4 (order 2 in the edge length), the quadratic geometry's by 9.5e-5, 6.0e-6, 3.8e-7 (order 4). On
the faceted mesh the DG solution of solid-body rotation converges at order 2 for every degree (the geometry
dominates DG2 and DG3); on the quadratic one DG2 at order 3 and DG3 at order 4 (:func:`geometry_order`).
"""

from __future__ import annotations

import math

from mpi4py import MPI

import basix.ufl
import dolfinx.cpp
import dolfinx.mesh
import numpy as np
import numpy.typing as npt

__all__ = ["cell_count", "edge_lengths", "geometry_order", "icosahedron", "icosphere", "refine_sphere", "sphere_area"]

Array = npt.NDArray[np.float64]
Cells = npt.NDArray[np.int64]


def icosahedron() -> tuple[Array, Cells]:
    """The regular icosahedron inscribed in S²: vertices (12, 3) and outward-oriented faces (20, 3)."""
    g = (1.0 + math.sqrt(5.0)) / 2.0
    v = np.array([[-1, g, 0], [1, g, 0], [-1, -g, 0], [1, -g, 0], [0, -1, g], [0, 1, g], [0, -1, -g], [0, 1, -g],
                  [g, 0, -1], [g, 0, 1], [-g, 0, -1], [-g, 0, 1]], dtype=float)
    f = np.array([[0, 11, 5], [0, 5, 1], [0, 1, 7], [0, 7, 10], [0, 10, 11], [1, 5, 9], [5, 11, 4], [11, 10, 2],
                  [10, 7, 6], [7, 1, 8], [3, 9, 4], [3, 4, 2], [3, 2, 6], [3, 6, 8], [3, 8, 9], [4, 9, 5],
                  [2, 4, 11], [6, 2, 10], [8, 6, 7], [9, 8, 1]], dtype=np.int64)
    return v / np.linalg.norm(v, axis=1, keepdims=True), f


def _edges(f: Cells) -> tuple[Cells, Cells]:
    """The unique edges (E, 2) of the faces and, per face, the edge opposite each vertex (F, 3)."""
    e = np.stack([f[:, [1, 2]], f[:, [0, 2]], f[:, [0, 1]]], axis=1).reshape(-1, 2)  # opposite vertex 0, 1, 2
    e.sort(axis=1)
    uniq, inv = np.unique(e, axis=0, return_inverse=True)
    return uniq, inv.reshape(-1, 3)


def refine_sphere(v: Array, f: Cells) -> tuple[Array, Cells]:
    """One 1-to-4 refinement of the faces f of the vertices v, the midpoints projected onto S²."""
    e, opp = _edges(f)
    mid = v[e].sum(axis=1)
    mid /= np.linalg.norm(mid, axis=1, keepdims=True)
    m = opp + len(v)  # m[:, i]: the midpoint of the edge opposite vertex i
    a, b, c = f[:, 0], f[:, 1], f[:, 2]
    new = np.concatenate([np.stack([a, m[:, 2], m[:, 1]], 1), np.stack([m[:, 2], b, m[:, 0]], 1),
                          np.stack([m[:, 1], m[:, 0], c], 1), np.stack([m[:, 0], m[:, 1], m[:, 2]], 1)])
    return np.concatenate([v, mid]), new


def _icosphere_arrays(refine: int, order: int) -> tuple[Array, Cells]:
    """The nodes and cells (P1: (F, 3); P2: (F, 6) in dolfinx's order) of the refined icosahedron."""
    v, f = icosahedron()
    for _ in range(refine):
        v, f = refine_sphere(v, f)
    if order == 1:
        return v, f
    e, opp = _edges(f)
    mid = v[e].sum(axis=1)
    mid /= np.linalg.norm(mid, axis=1, keepdims=True)
    return np.concatenate([v, mid]), np.concatenate([f, opp + len(v)], axis=1)


def cell_count(refine: int) -> int:
    """20·4^r: the cells of :func:`icosphere` with ``refine = r``."""
    return 20 * 4**refine


def geometry_order(degree: int) -> int:
    """The geometry order for DG of ``degree``: 1 (flat) for p ≤ 1, 2 (quadratic) for p ≥ 2 (order p+1 needs it)."""
    return 1 if degree <= 1 else 2


def icosphere(comm: MPI.Comm, refine: int, order: int = 1) -> dolfinx.mesh.Mesh:
    """The icosahedral mesh of S² refined ``refine`` times, distributed over ``comm`` with facet-sharing ghosts.

    Args:
        comm: the communicator (the arrays are built on its rank 0).
        refine: r ≥ 0 refinements (20·4^r cells).
        order: 1 (flat triangles, vertices on S²) or 2 (quadratic triangles, edge midpoints on S² too).

    Returns:
        The mesh (gdim 3, tdim 2), its facet and cell-to-facet connectivities created.

    Raises:
        ValueError: r < 0 or an order other than 1, 2.
    """
    if refine < 0 or order not in (1, 2):
        raise ValueError(f"icosphere needs refine >= 0 and order 1 or 2, got {refine}, {order}")
    if comm.rank == 0:
        x, cells = _icosphere_arrays(refine, order)
    else:
        x, cells = np.zeros((0, 3)), np.zeros((0, 3 * order), dtype=np.int64)
    element = basix.ufl.element("Lagrange", "triangle", order, shape=(3,))
    part = dolfinx.cpp.mesh.create_cell_partitioner(dolfinx.mesh.GhostMode.shared_facet, 2)
    msh = dolfinx.mesh.create_mesh(comm, cells, element, x, partitioner=part)  # type: ignore[arg-type]
    msh.topology.create_connectivity(1, 2)
    msh.topology.create_connectivity(2, 1)
    msh.topology.create_connectivity(2, 0)
    return msh


def sphere_area(msh: dolfinx.mesh.Mesh, degree: int = 6) -> float:
    """The area of the mesh's surface (the faceted or quadratic sphere; S² has 4π), summed over all ranks."""
    import dolfinx.fem
    import ufl

    form = dolfinx.fem.form(1.0 * ufl.dx(domain=msh, metadata={"quadrature_degree": degree}))
    return float(msh.comm.allreduce(dolfinx.fem.assemble_scalar(form), op=MPI.SUM))


def edge_lengths(msh: dolfinx.mesh.Mesh) -> tuple[float, float]:
    """The shortest and longest chord between the vertices of a cell (over all ranks): (h_min, h_max)."""
    x = msh.geometry.x[msh.geometry.dofmaps[0][:, :3]]  # (cells, 3 vertices, 3)
    d = np.linalg.norm(x - np.roll(x, 1, axis=1), axis=2)
    lo = float(d.min()) if d.size else math.inf
    hi = float(d.max()) if d.size else 0.0
    return msh.comm.allreduce(lo, op=MPI.MIN), msh.comm.allreduce(hi, op=MPI.MAX)
