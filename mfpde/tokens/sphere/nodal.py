"""The DG solver's velocity as a continuous Lagrange field: evaluated at its nodes, interpolated to the points.

The attention velocity on S² is smooth and band-limited (theory §9), and the harmonic kernel costs O((L+1)²)
per point. :class:`NodalVelocity` evaluates it once per stage at the nodes of the continuous Lagrange space P_q
of the mesh (q = max(2, p + 1) for DG_p; nodes mapped onto S² by x/|x|): ≈ 2, 4.5, 8 nodes per cell for P2, P3,
P4 instead of the Q volume and 3E/2 edge points per cell (6 + 4.5 for DG1, 12 + 6 for DG2, 16 + 7.5 for DG3).
The field Σ_n v(x_n) ψ_n is then interpolated to the volume and edge points (precomputed tables) and projected
onto the tangent planes there. (q = p would do for the order, but on the coarsest meshes, where a cell is as
wide as a cluster, P2 under-resolves DG2's velocity: the cluster test of DG2 on 20 cells fails with it.)

The interpolant is continuous, so both cells of an edge see one velocity at each edge point and the upwind
flux stays single-valued (½(v·n⁺ − v·n⁻), :mod:`.dg`): mass is conserved exactly as before. Its error
O(h^{q+1}) is below DG_p's O(h^{p+1}) for p ≤ q (the measured orders of :mod:`.dg` hold).

MPI: the nodes are the local (owned and ghost) dofs of P_q that an owned cell or an owned cell's edge uses;
every rank evaluates the velocity at its own nodes (no communication beyond the kernel's ``update``).
"""

from __future__ import annotations

import dolfinx.fem
import numpy as np
import numpy.typing as npt
import scipy.sparse

from mfpde.tokens.sphere.geometry import SurfaceTables

__all__ = ["NodalVelocity", "nodal_degree"]

Array = npt.NDArray[np.float64]


def nodal_degree(degree: int) -> int:
    """The degree q of the continuous velocity field for DG of ``degree``: max(2, p + 1)."""
    return max(2, degree + 1)


def _sparse(values: Array, columns: npt.NDArray[np.int64], n: int) -> scipy.sparse.csr_array:
    """The (A·B, n) matrix whose row a·B + b holds values[a, b, :] in the columns columns[a, 0, :]."""
    a, b, k = values.shape
    cols = np.broadcast_to(columns, (a, b, k)).ravel()
    return scipy.sparse.csr_array((np.ascontiguousarray(values).ravel(), cols, np.arange(0, a * b * k + 1, k)),
                                  shape=(a * b, n))


def _tangent(x: Array, v: Array) -> Array:
    return v - np.einsum("...d,...d->...", x, v)[..., None] * x


class NodalVelocity:
    """The tables that interpolate a velocity from the P_q nodes to the DG tables' volume and edge points.

    Args:
        mesh: the DG solver's mesh.
        degree: the DG degree p (sets q by :func:`nodal_degree`).
        t: the DG solver's :class:`~mfpde.tokens.sphere.geometry.SurfaceTables`.

    Attributes:
        x: the nodes on S², shape (N, 3).
    """

    def __init__(self, mesh: dolfinx.mesh.Mesh, degree: int, t: SurfaceTables) -> None:
        W = dolfinx.fem.functionspace(mesh, ("Lagrange", nodal_degree(degree)))
        element = W.element.basix_element
        n_all = len(t.dofs)
        cdofs = np.asarray(W.dofmap.list[:n_all], dtype=np.int64)
        cq, ce = cdofs[:t.n_owned], cdofs[t.cells[:, 0]]  # the owned cells' nodes, each edge's side-0 nodes
        used, inv = np.unique(np.concatenate([cq.ravel(), ce.ravel()]), return_inverse=True)
        xn = W.tabulate_dof_coordinates()[used]
        self.x = xn / np.linalg.norm(xn, axis=1, keepdims=True)
        bq = np.asarray(element.tabulate(0, t.ref_q), dtype=float)[0, :, :, 0]  # (Q, nq)
        be = np.asarray(element.tabulate(0, t.ref_e.reshape(-1, 2)), dtype=float)[0, :, :, 0]  # (F·E, nq)
        nc, nq = cq.shape
        nf, ne = t.ref_e.shape[:2]
        self._iq = _sparse(np.broadcast_to(bq, (nc,) + bq.shape), inv[:cq.size].reshape(nc, 1, nq), len(self.x))
        self._iqt = self._iq.T.tocsr()
        self._ie = _sparse(be.reshape(nf, ne, nq), inv[cq.size:].reshape(nf, 1, nq), len(self.x))
        self._xq, self._xe = t.xq, t.xe

    def masses(self, w: Array) -> Array:
        """The node masses w_n = Σ_K ∫_K μ_h ψ_n of the volume points' masses w (C·Q,) = μ_h ω|J|: shape (N,).

        The measure Σ_n w_n δ_{x_n} integrates the interpolant I_q f as μ_h does: Σ_n w_n f(x_n) = ∫ μ_h I_q f
        (with the volume rule), so its total is ∫ μ_h and its harmonic coefficients err by O(h^{q+1}) like the
        velocity. The w_n may be negative (P2's vertex functions have zero mean).
        """
        return np.asarray(self._iqt @ np.asarray(w, dtype=float).ravel())

    def interpolate(self, vn: Array) -> tuple[Array, Array]:
        """The field of the node values vn (N, 3) at the volume points (C, Q, 3) and the edge points (F, E, 3).

        Each projected onto the tangent plane of S² at its point.
        """
        vq = (self._iq @ vn).reshape(self._xq.shape)
        ve = (self._ie @ vn).reshape(self._xe.shape)
        return _tangent(self._xq, vq), _tangent(self._xe, ve)
