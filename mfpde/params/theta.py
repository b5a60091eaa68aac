"""The head distribution ρ on Θ: a P1 density with mass lumping, or finitely many weighted Dirac heads.

The token solver needs ρ only through the reduced :class:`~mfpde.heads.HeadMeasure`; this module
builds it from either representation, gathering the (small) Θ data on every rank in an order fixed by
the coordinates, so that results do not depend on the number of ranks.
"""

from __future__ import annotations

from mpi4py import MPI

import dolfinx.fem
import numpy as np
import numpy.typing as npt

from mfpde.errors import ConfigError
from mfpde.heads import HeadMeasure
from mfpde.limits import check_gaussian_inside
from mfpde.mesh import Domain, make_domain
from mfpde.params.densities import gaussian_density
from mfpde.params.family import HeadFamily
from mfpde.spaces import lumped_mass

Array = npt.NDArray[np.float64]


class ThetaSpace:
    """P1 densities on the parameter mesh Θ and their lumped-mass quadrature (theory §4).

    Args:
        domain: the Θ mesh (distributed).
        family: the head family (its p must equal the mesh dimension).

    Raises:
        ValueError: the mesh dimension is not the family's p.
    """

    def __init__(self, domain: Domain, family: HeadFamily):
        msh = domain.mesh
        if msh.geometry.dim != family.p:
            raise ValueError(f"Θ mesh has dimension {msh.geometry.dim}, head family {family.name!r} needs {family.p}")
        self.domain, self.family, self.comm = domain, family, msh.comm
        self.V = dolfinx.fem.functionspace(msh, ("Lagrange", 1))
        self.m = lumped_mass(self.V)
        self.n_owned = self.V.dofmap.index_map.size_local
        p = family.p
        self.x = self.V.tabulate_dof_coordinates()[:, :p]  # local dofs (owned + ghost)
        own = self.x[: self.n_owned]
        self.counts = np.array(self.comm.allgather(self.n_owned))
        pts = np.stack([self._allgather(own[:, j]) for j in range(p)], axis=1)
        # Sort on rounded coordinates: the same vertex can differ by round-off between partitions.
        self.order = np.lexsort(np.round(pts, 10).T[::-1])
        self.points = pts[self.order]  # global dof coordinates, shape (N_θ, p), rank-independent order
        inv = np.empty_like(self.order)
        inv[self.order] = np.arange(len(self.order))
        self.owned_pos = inv[int(self.counts[: self.comm.rank].sum()) + np.arange(self.n_owned)]

    def _allgather(self, a: Array) -> Array:
        out = np.empty(int(self.counts.sum()))
        self.comm.Allgatherv(np.ascontiguousarray(a, dtype=np.float64), (out, self.counts))
        return out

    def gather(self, rho: dolfinx.fem.Function) -> Array:
        """The global quadrature weights m_i ρ_i, shape (N_θ,), in the order of ``points``."""
        n = self.n_owned
        return self._allgather(self.m[:n] * rho.x.array[:n])[self.order]

    def gather_values(self, f: dolfinx.fem.Function) -> Array:
        """The global nodal values of f, shape (N_θ,), in the order of ``points`` (for checkpoints)."""
        return self._allgather(f.x.array[: self.n_owned])[self.order]

    def set_values(self, f: dolfinx.fem.Function, values: Array) -> None:
        """Set f from global nodal values in the order of ``points`` (inverse of :meth:`gather_values`)."""
        f.x.array[: self.n_owned] = values[self.owned_pos]
        f.x.scatter_forward()

    def head_measure(self, rho: dolfinx.fem.Function) -> HeadMeasure:
        """The reduced head distribution of the P1 density ρ (theory §1.3: V is linear in ρ)."""
        return HeadMeasure.from_heads(self.family, self.points, self.gather(rho))

    def mass(self, rho: dolfinx.fem.Function) -> float:
        """∫ ρ dθ (exact with the lumped mass)."""
        n = self.n_owned
        return self.comm.allreduce(float(self.m[:n] @ rho.x.array[:n]), op=MPI.SUM)

    def gaussian(self, mean: list[float], cov: list[list[float]]) -> dolfinx.fem.Function:
        """The Gaussian density N(mean, cov) interpolated at the P1 nodes, renormalised to mass 1.

        Raises:
            ConfigError: the Gaussian has (numerically) no mass on Θ, or less than half of it in the bounding
                box of Θ (it would be truncated and renormalised into another density).
        """
        lo, hi = self.points.min(axis=0), self.points.max(axis=0)
        check_gaussian_inside("heads.init", mean, cov, np.stack([lo, hi], axis=1).tolist(), "Θ (heads.mesh)")
        with np.errstate(all="ignore"):
            rho = gaussian_density(self.V, mean, cov)
        if not np.all(np.isfinite(rho.x.array)):
            raise ConfigError("heads.init: the initial head Gaussian has no mass on Θ (mean far outside heads.box?)")
        return rho


def theta_space(comm, heads, family: HeadFamily) -> ThetaSpace:
    """The Θ space of the ``[heads]`` section ``heads`` (a box of right triangles, or ``heads.mesh``).

    Raises:
        ConfigError, MeshError: the mesh does not fit the head family.
    """
    try:
        return ThetaSpace(make_domain(comm, family.p, heads.mesh, heads.box, heads.cells, "triangle"), family)
    except ValueError as e:
        if type(e) is not ValueError:  # ConfigError, MeshError: already an input error
            raise
        raise ConfigError(f"heads.mesh: {e}") from None


def first_variation_values(family: HeadFamily, heads: HeadMeasure, D: Array, theta: Array) -> Array:
    """δR/δρ(θ) = v(θ) D(a(θ)) at points θ of shape (N, p) whose a(θ) are among ``heads.a``.

    Raises:
        KeyError: some a(θ) is not an a-value of the head measure.
    """
    a = np.round(family.a(theta), 12)
    lookup = {float(ak): k for k, ak in enumerate(np.round(heads.a, 12))}
    idx = np.array([lookup[float(x)] for x in a], dtype=np.int64) if len(a) else np.zeros(0, np.int64)
    return family.v(theta) * D[idx]
