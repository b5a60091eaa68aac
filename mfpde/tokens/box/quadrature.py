"""The lumped-mass quadrature of a DG token density, gathered on every rank in a rank-independent order.

The nonlocal attention integrals need all of μ on every rank: the nodes x_i (dof coordinates) and
weights m_i = ∫ φ_i are fixed at set-up, the weights m_i μ_i are gathered per evaluation in a global
order fixed by the original cell index, so sums are the same on any number of ranks (theory §1.3).
The gather-free velocity (:mod:`mfpde.tokens.box.reduced`) takes each rank's own part instead
(:attr:`TokenQuadrature.local_points`, :meth:`TokenQuadrature.local_weights`).
"""

from __future__ import annotations

import dolfinx.fem
import numpy as np
import numpy.typing as npt

from mfpde.mesh import Domain
from mfpde.spaces import lumped_mass
from mfpde.tokens.attention import TensorGrid

__all__ = ["TokenQuadrature"]

Array = npt.NDArray[np.float64]


class TokenQuadrature:
    """The lumped-mass quadrature of a DG density, gathered on every rank in a rank-independent order.

    The nodes x_i (dof coordinates) and weights m_i = ∫ φ_i are fixed at construction; :meth:`gather`
    returns the global weights m_i μ_i of the current density. On a box the nodes lie on a tensor grid
    and :meth:`grid` returns the weights as an array over it.
    """

    def __init__(self, W: dolfinx.fem.FunctionSpace, domain: Domain):
        msh = W.mesh
        self.comm = msh.comm
        tdim = msh.topology.dim
        gdim = msh.geometry.dim
        ncells = msh.topology.index_map(tdim).size_local
        dofs = W.dofmap.list[:ncells]  # (ncells, nd): DG dofs of owned cells are owned
        nd = dofs.shape[1]
        self.local_dofs = dofs.ravel()
        self.local_m = lumped_mass(W)[self.local_dofs]
        orig = np.asarray(msh.topology.original_cell_index[:ncells], dtype=np.int64)
        keys = (orig[:, None] * nd + np.arange(nd)[None, :]).ravel()
        xyz = W.tabulate_dof_coordinates()[self.local_dofs, :gdim]
        self.local_points = np.ascontiguousarray(xyz, dtype=np.float64)  # this rank's nodes, shape (N_local, d)
        self.counts = np.array(self.comm.allgather(len(keys)))
        all_keys = self._allgather(keys.astype(np.float64))
        self.order = np.argsort(all_keys, kind="stable")
        self.points = np.stack([self._allgather(np.ascontiguousarray(xyz[:, j]))
                                for j in range(gdim)], axis=1)[self.order]
        self.grid_axes: TensorGrid | None = None
        if domain.axes is not None:
            # DG0 nodes are the cell midpoints, DG1 nodes the vertices: both tensor grids.
            axes = domain.axes if W.element.basix_element.degree == 1 else tuple(
                0.5 * (a[1:] + a[:-1]) for a in domain.axes)
            idx = [np.rint((self.points[:, j] - axes[j][0]) / (axes[j][1] - axes[j][0])).astype(np.int64)
                   for j in range(gdim)]
            shape = tuple(len(a) for a in axes)
            if all(np.allclose(axes[j][idx[j]], self.points[:, j], atol=1e-9) for j in range(gdim)) and all(
                    (i >= 0).all() and (i < n).all() for i, n in zip(idx, shape, strict=True)):
                self.grid_axes = TensorGrid(tuple(axes))
                self.flat_index = np.ravel_multi_index(tuple(idx), shape)

    def _allgather(self, a: Array) -> Array:
        out = np.empty(int(self.counts.sum()), dtype=np.float64)
        self.comm.Allgatherv(np.ascontiguousarray(a, dtype=np.float64), (out, self.counts))
        return out

    def local_weights(self, u: dolfinx.fem.Function) -> Array:
        """This rank's quadrature weights m_i μ_i of u at :attr:`local_points`, shape (N_local,); no communication."""
        return np.asarray(self.local_m * u.x.array[self.local_dofs], dtype=np.float64)

    def gather(self, u: dolfinx.fem.Function) -> Array:
        """The global quadrature weights m_i μ_i of the density u, shape (N_y,), same on every rank."""
        return self._allgather(self.local_m * u.x.array[self.local_dofs])[self.order]

    def grid(self, weights: Array) -> Array:
        """Weights summed onto the tensor grid (shape of the grid); requires ``grid_axes``."""
        assert self.grid_axes is not None
        W = np.zeros(int(np.prod(self.grid_axes.shape)))
        np.add.at(W, self.flat_index, weights)
        return W.reshape(self.grid_axes.shape)
