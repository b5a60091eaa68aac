"""The precomputed cell and edge tables of DG on a surface mesh of S² (what :mod:`.dg` assembles from).

Everything the upwind DG form of ∂_t μ + ∇_S·(μ v) = 0 needs, computed once from the mesh's coordinate map
(flat or quadratic triangles) with numpy, so a stage is a few array contractions and no form is compiled:

* per local cell (owned first, then the ghosts): the DG dofs; per owned cell at the volume quadrature points
  (basix, degree 2p+2): the points x̂ = x/|x| on S², the weights ω|J| (|J| = √det JᵀJ), the weighted surface
  gradients ω|J| ∇φ_i = ω|J| J (JᵀJ)⁻¹ ∇̂φ̂_i (in the cell's tangent plane), the inverse mass matrices;
* per edge with an owned cell (every edge of an owned cell): its two cells, ordered by their input index
  (the same on any partition); the p+2 Gauss–Legendre points run from the edge's end of smaller input node index
  to the other, so both cells see the same physical points; the basis on each side, the weights ω ds, each
  side's outward in-plane conormal n± = J G⁻¹ n̂/|J G⁻¹ n̂| (n̂ the reference facet normal), and x̂.

On a faceted (or piecewise quadratic) surface n⁺ ≠ −n⁻ at an edge (theory §9): the DG operator uses one normal
velocity per edge point, ½(v·n⁺ − v·n⁻), for both cells, so the edge fluxes cancel in the sum over cells.
"""

from __future__ import annotations

from dataclasses import dataclass

import basix
import dolfinx.fem
import dolfinx.mesh
import numpy as np
import numpy.typing as npt

__all__ = ["SurfaceTables", "lattice", "surface_tables"]

Array = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]

#: Reference vertices of the triangle and, per local facet i (opposite vertex i), its two vertices and normal.
_VERTS = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
_FACET_VERTS = ((1, 2), (0, 2), (0, 1))
_FACET_NORMALS = np.array([[1.0, 1.0], [-1.0, 0.0], [0.0, -1.0]]) / np.array([[np.sqrt(2.0)], [1.0], [1.0]])


@dataclass(frozen=True)
class SurfaceTables:
    """The arrays of :func:`surface_tables` (shapes: C owned cells, F edges, k dofs a cell, Q/E points)."""

    dofs: npt.NDArray[np.int32]  # (cells incl. ghosts, k)
    n_owned: int
    phi: Array  # (Q, k) basis at the volume points
    xq: Array  # (C, Q, 3) volume points on S²
    wq: Array  # (C, Q) ω|J|
    grad: Array  # (C, Q, k, 3) ω|J|∇φ
    minv: Array  # (C, k, k)
    area: Array  # (C,) cell areas
    cells: Ints  # (F, 2) the two cells of each edge
    phi_e: Array  # (F, 2, E, k) the basis of each side at the edge points
    we: Array  # (F, E) ω ds
    ne: Array  # (F, 2, E, 3) each side's outward conormal
    xe: Array  # (F, E, 3) edge points on S²
    cell_edges: Ints  # (C, 3) the edges of each owned cell
    cell_sides: Ints  # (C, 3) which side (0, 1) of that edge the cell is
    lim: Array  # (P, k) the basis at the limiter's points
    ref_q: Array  # (Q, 2) the volume points on the reference triangle
    ref_e: Array  # (F, E, 2) the edge points on side 0's reference triangle


def lattice(n: int) -> Array:
    """The points (i/n, j/n), i + j ≤ n, of the reference triangle, shape ((n+1)(n+2)/2, 2)."""
    return np.array([[i / n, j / n] for i in range(n + 1) for j in range(n + 1 - i)])


def _geometry(cmap: basix.finite_element.FiniteElement, nodes: Array, pts: Array) -> tuple[Array, Array]:
    """X (c, q, 3) and J (c, q, 3, 2) of the cells with geometry nodes ``nodes`` (c, N, 3) at reference pts (q, 2)."""
    tab = _tab(cmap, 1, pts)  # (3, q, N, 1)
    x = np.einsum("qn,cnd->cqd", tab[0, :, :, 0], nodes)
    J = np.einsum("rqn,cnd->cqdr", tab[1:3, :, :, 0], nodes)
    return x, J


def _metric(J: Array) -> tuple[Array, Array]:
    """(|J| (…), J G⁻¹ (…, 3, 2)) with G = JᵀJ."""
    G = np.einsum("...dr,...ds->...rs", J, J)
    det = G[..., 0, 0] * G[..., 1, 1] - G[..., 0, 1] * G[..., 1, 0]
    Ginv = np.stack([np.stack([G[..., 1, 1], -G[..., 0, 1]], -1), np.stack([-G[..., 1, 0], G[..., 0, 0]], -1)], -2)
    return np.sqrt(det), np.einsum("...dr,...rs->...ds", J, Ginv / det[..., None, None])


def _tab(element: basix.finite_element.FiniteElement, n: int, pts: Array) -> Array:
    """element.tabulate(n, pts) as a float array, shape (derivatives, points, dofs, 1)."""
    return np.asarray(element.tabulate(n, pts), dtype=float)


def _unit(x: Array) -> Array:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def surface_tables(V: dolfinx.fem.FunctionSpace, degree: int) -> SurfaceTables:
    """Build the tables for the DG space V (degree p on a triangle surface mesh with facet-sharing ghosts)."""
    msh = V.mesh
    top, geo = msh.topology, msh.geometry
    element = V.element.basix_element
    n_owned = top.index_map(2).size_local
    n_all = n_owned + top.index_map(2).num_ghosts
    dofs = V.dofmap.list[:n_all]
    cm = geo.cmaps[0]
    cmap = basix.create_element(basix.ElementFamily.P, basix.CellType.triangle, cm.degree,
                                basix.LagrangeVariant(cm.variant))
    gdm = geo.dofmaps[0]
    gnodes = geo.x[gdm[:n_all]]  # (cells, N, 3)
    # volume
    pts, wts = (np.asarray(a, dtype=float) for a in basix.make_quadrature(basix.CellType.triangle, 2 * degree + 2))
    tab = _tab(element, 1, pts)  # (3, Q, k, 1)
    phi, dphi = tab[0, :, :, 0], tab[1:3, :, :, 0]
    x, J = _geometry(cmap, gnodes[:n_owned], pts)
    detJ, K = _metric(J)
    wq = detJ * wts[None, :]
    grad = np.einsum("cqdr,rqk->cqkd", K, dphi) * wq[..., None, None]
    M = np.einsum("cq,qi,qj->cij", wq, phi, phi)
    # edges: the owned cells' facets, sides ordered by the input cell index
    c2f = top.connectivity(2, 1)
    f2c = top.connectivity(1, 2)
    orig = np.asarray(top.original_cell_index)
    c2f_all = np.asarray(c2f.array).reshape(-1, 3)  # a triangle's three facets, in local facet order
    facets = np.unique(c2f_all[:n_owned])
    off = np.asarray(f2c.offsets)
    if np.any(off[facets + 1] - off[facets] != 2):
        raise ValueError("the surface mesh is not closed: an edge of an owned cell has no second cell")
    cells = np.asarray(f2c.array)[off[facets][:, None] + np.arange(2)[None, :]].astype(np.int64)
    swap = orig[cells[:, 0]] > orig[cells[:, 1]]
    cells[swap] = cells[swap, ::-1]
    inp = np.asarray(geo.input_global_indices)
    s, ws = np.polynomial.legendre.leggauss(degree + 2)
    s, ws = 0.5 * (s + 1.0), 0.5 * ws
    nE, k = len(s), dofs.shape[1]
    phi_e = np.empty((len(facets), 2, nE, k))
    ne = np.empty((len(facets), 2, nE, 3))
    we = np.empty((len(facets), nE))
    xe = np.empty((len(facets), nE, 3))
    ref_e = np.empty((len(facets), nE, 2))
    for side in (0, 1):
        c = cells[:, side]
        fl = np.argmax(c2f_all[c] == facets[:, None], axis=1)  # the local index of the edge in the cell
        for i in range(3):
            a, b = _FACET_VERTS[i]
            for o in (0, 1):
                ga, gb = inp[gdm[c, a]], inp[gdm[c, b]]
                sel = np.flatnonzero((fl == i) & ((ga > gb) == bool(o)))
                if not len(sel):
                    continue
                va, vb = (_VERTS[a], _VERTS[b]) if o == 0 else (_VERTS[b], _VERTS[a])
                ep = (1.0 - s)[:, None] * va[None, :] + s[:, None] * vb[None, :]
                phi_e[sel, side] = _tab(element, 0, ep)[0, :, :, 0][None]
                xs, Js = _geometry(cmap, gnodes[c[sel]], ep)
                _, Ks = _metric(Js)
                ne[sel, side] = _unit(np.einsum("fqdr,r->fqd", Ks, _FACET_NORMALS[i]))
                if side == 0:
                    tang = np.einsum("fqdr,r->fqd", Js, vb - va)
                    we[sel] = np.linalg.norm(tang, axis=-1) * ws[None, :]
                    xe[sel] = _unit(xs)
                    ref_e[sel] = ep
    # each owned cell's three edges and its side on each
    cell_edges = np.searchsorted(facets, c2f_all[:n_owned]).astype(np.int64)
    cell_sides = (cells[cell_edges, 1] == np.arange(n_owned)[:, None]).astype(np.int64)
    lpts = np.concatenate([_VERTS, lattice(3 * degree) if degree >= 2 else np.zeros((0, 2)), pts])
    if degree >= 2:  # the edge points of the three facets too (the points of the cell-mean positivity argument)
        lpts = np.concatenate([lpts] + [(1 - s)[:, None] * _VERTS[a] + s[:, None] * _VERTS[b]
                                        for a, b in _FACET_VERTS])
    lim = _tab(element, 0, lpts)[0, :, :, 0] if degree >= 1 else np.ones((1, 1))
    return SurfaceTables(dofs, n_owned, phi, _unit(x), wq, grad, np.linalg.inv(M), wq.sum(axis=1), cells, phi_e,
                         we, ne, xe, cell_edges, cell_sides, lim, pts, ref_e)
