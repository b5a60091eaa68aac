"""The DG0 upwind scheme (finite volumes) of the token continuity equation by facet arrays, with its transposes.

For k = 0 the upwind-DG form of :mod:`mfpde.tokens.box.transport` is a finite-volume scheme whose facet fluxes
are Gauss rules along the facets (``FACET_QUADRATURE_DEGREE``: two points on the segments of d = 2, the point
itself in d = 1):

    L(u, V)_c = − Σ_{f ∋ c} φ_f(c),   φ_f = F_f⁺ u_{L(f)} + F_f⁻ u_{R(f)},
    F_f^± = |f| Σ_q w_q (V(x_q)·n_f)^±,

with n_f the unit normal of facet f from its cell L(f) to R(f) (outward on ∂Ω, where there is no R and no
inflow: φ_f = F_f⁺ u_L), (·)⁺ = max(·, 0), (·)⁻ = min(·, 0), x_q the Gauss points of f (weights w_q,
Σ w_q = 1) and V the P1 velocity there. Evaluating it by arrays over the facets instead of assembling the UFL
form costs O(N_facets) numpy operations with no form-assembly overhead; the two agree to round-off
(``tests/tokens/test_upwind.py``), and the UFL form stays the definition for k = 1.

Transposed Jacobians, for the discrete adjoint (:mod:`mfpde.tokens.box.adjoint`), with z the adjoint weights and
Δz_f = z_R − z_L (−z_L on ∂Ω):

    (J_uᵀ z)_L += F_f⁺ Δz_f,  (J_uᵀ z)_R += F_f⁻ Δz_f,
    (J_Vᵀ z)_v += Δz_f |f| n_f Σ_q w_q λ_{q,v} (½(1 + sgn F_q) u_L + ½(1 − sgn F_q) u_R),

with λ_{q,v} the P1 basis of vertex v at x_q and sgn 0 = 0, as UFL differentiates |·|, so both paths return
the same one-sided average at a kink.

Under MPI every rank evaluates the facets it owns; contributions to ghost cells and ghost vertices are added
to their owners by the caller's reverse scatter, as DOLFINx's assembler does (shared-facet ghosting puts both
cells of an owned facet on the rank).
"""

from __future__ import annotations

from typing import Any

import dolfinx.fem
import dolfinx.mesh
import numpy as np
import numpy.typing as npt

__all__ = ["FACET_QUADRATURE_DEGREE", "UpwindFiniteVolume"]

Array = npt.NDArray[np.floating[Any]]  # float64, or DOLFINx's arrays typed as floating
Index = npt.NDArray[np.int64]
#: Degree of the Gauss rule on the facets, the same in the UFL forms of k = 0 (``TokenTransport``): exact for
#: the P1 velocity's normal component where it keeps its sign (two points, degree 3, on segments).
FACET_QUADRATURE_DEGREE = 2


class UpwindFiniteVolume:
    """The k = 0 upwind operator L(u, V) and its transposed Jacobians, by arrays over the owned facets.

    Args:
        W: the DG0 space of the token density.
        P: the vector P1 space of the velocity (block size d).

    Attributes:
        left, right: DG0 dofs of each owned facet's cells, shape (n_facets,) (``right`` is −1 on ∂Ω).
        verts: P1 vertex (block) dofs of each facet, shape (n_facets, 2) (d = 2) or (n_facets, 1) (d = 1).
        nA: |f| n_f, shape (n_facets, d).
        lam, wq: the P1 basis at the facet Gauss points, shape (n_q, vertices of f), and the weights (n_q,).

    Raises:
        ValueError: W is not DG0, or an owned interior facet lacks one of its cells on this rank (a mesh
            without shared-facet ghosting).
    """

    def __init__(self, W: dolfinx.fem.FunctionSpace, P: dolfinx.fem.FunctionSpace) -> None:
        if W.element.basix_element.degree != 0:
            raise ValueError("UpwindFiniteVolume needs the DG0 space")
        msh = W.mesh
        top, tdim, d = msh.topology, msh.topology.dim, msh.geometry.dim
        fdim = tdim - 1
        for dims in ((fdim, tdim), (fdim, 0), (tdim, 0)):
            top.create_connectivity(*dims)
        f2c, f2v, c2v = (top.connectivity(*dims) for dims in ((fdim, tdim), (fdim, 0), (tdim, 0)))
        nf = top.index_map(fdim).size_local
        ncell = top.index_map(tdim).size_local + top.index_map(tdim).num_ghosts
        exterior = np.zeros(nf, bool)
        ext = dolfinx.mesh.exterior_facet_indices(top)
        exterior[ext[ext < nf]] = True
        off = f2c.offsets[: nf + 1]
        ncf = np.diff(off)
        if np.any(ncf[~exterior] != 2) or np.any(ncf[exterior] != 1):
            raise ValueError("an owned facet lacks a cell on this rank: the mesh needs shared-facet ghosting")
        cells_l = f2c.array[off[:-1]]
        cells_r = np.where(exterior, -1, f2c.array[np.minimum(off[:-1] + 1, len(f2c.array) - 1)])
        # vertex → P1 block dof, through the cells (P1 dofs are listed in the cells' reference vertex order)
        pdofs = P.dofmap.list[:ncell]
        v2dof = np.full(top.index_map(0).size_local + top.index_map(0).num_ghosts, -1, np.int64)
        v2dof[c2v.array.reshape(-1, pdofs.shape[1])] = pdofs  # not reshape(ncell, -1): a rank may have no cell
        fv = f2v.array.reshape(-1, 1 if tdim == 1 else 2)[:nf]
        self.verts: Index = v2dof[fv]
        xv = P.tabulate_dof_coordinates()[:, :d]
        xc = dolfinx.mesh.compute_midpoints(msh, tdim, np.arange(ncell, dtype=np.int32))[:, :d]
        dg = W.dofmap.list[:ncell, 0]
        if d == 1:
            normal, area = np.sign(xv[self.verts[:, 0]] - xc[cells_l]), np.ones(nf)
        else:
            t = xv[self.verts[:, 1]] - xv[self.verts[:, 0]]
            area = np.linalg.norm(t, axis=1)
            normal = np.stack([t[:, 1], -t[:, 0]], axis=1) / area[:, None]
            mid = 0.5 * (xv[self.verts[:, 0]] + xv[self.verts[:, 1]])
            normal *= np.sign(np.einsum("fj,fj->f", normal, mid - xc[cells_l]))[:, None]
        self.nA: Array = normal * area[:, None]
        if d == 1:
            self.lam, self.wq = np.ones((1, 1)), np.ones(1)
        else:
            xi, w = np.polynomial.legendre.leggauss(FACET_QUADRATURE_DEGREE // 2 + 1)
            xi = 0.5 * (1.0 + xi)
            self.lam, self.wq = np.stack([1.0 - xi, xi], axis=1), 0.5 * w
        self.left: Index = dg[cells_l].astype(np.int64)
        self.right: Index = np.where(exterior, -1, dg[cells_r]).astype(np.int64)
        self.interior = ~exterior
        self.d = d
        self.n_local = ncell
        self.n_vertices = len(v2dof)
        inner = np.flatnonzero(self.interior)
        nvf = self.verts.shape[1]
        #: Where each entry of a facet array is added: "left"/"right" (cells of all / the interior facets' values),
        #: "vertices" (the blocked P1 dofs of (vertex of f, component, f)); and the batch's flat indices per size.
        vdofs = self.verts.T[:, None, :] * d + np.arange(d)[None, :, None]  # (vertices of f, d, n_facets)
        self._targets: dict[str, tuple[Index, Index | None, int]] = {
            "left": (self.left, None, ncell), "right": (self.right[inner], inner, ncell),
            "vertices": (vdofs.ravel(), None, self.n_vertices * d)}
        self._flat: dict[tuple[str, int], Index] = {}
        #: λ_{q,v} |f| n_{f,j}, shape (n_q, vertices of f × d, n_facets): the normal flux's weights
        self._w = (self.lam[:, :, None, None] * self.nA.T[None, None, :, :]).reshape(len(self.wq), nvf * d, nf)
        self._vdofs = vdofs.reshape(nvf * d, nf)
        self._right_or_left = np.where(self.interior, self.right, self.left)  # a valid index on ∂Ω (masked)
        self._inner = self.interior.astype(float)

    def _add_at(self, target: str, vals: Array) -> Array:
        """out[..., idx[m]] += vals[..., m] for the indices of ``target``, shape ((S,) n): one ``np.bincount``."""
        idx, pick, n = self._targets[target]
        if pick is not None:
            vals = vals[..., pick]
        if vals.ndim == 1:
            return np.bincount(idx, vals, minlength=n)
        S = len(vals)
        flat = self._flat.get((target, S))
        if flat is None:  # a batch size's indices, made once (a run has a few batch sizes)
            if len(self._flat) > 16:
                self._flat.clear()
            flat = self._flat[target, S] = (np.arange(S)[:, None] * n + idx[None, :]).ravel()
        return np.bincount(flat, vals.reshape(S, -1).ravel(), minlength=S * n).reshape(S, n)

    def _to_cells(self, left: Array, right: Array) -> Array:
        """Σ over facets f of left_f into the cell L(f) plus right_f into R(f) (interior f), shape ((S,) n_local)."""
        return self._add_at("left", left) + self._add_at("right", right)

    def normal_flux(self, V: Array) -> Array:
        """|f| V(x_q)·n_f at every facet Gauss point for the P1 velocity V (blocked, shape ((S,) n_vertices d)).

        Returns:
            shape ((S,) n_q, n_facets): the facets last, so that every product below runs along them.
        """
        return np.einsum("...kf,qkf->...qf", V[..., self._vdofs], self._w)

    def _to_vertices(self, y: Array) -> Array:
        """The transpose of :meth:`normal_flux`: y ((S,) n_q, n_facets) at the Gauss points → ((S,) n_vertices d)."""
        z = np.einsum("...qf,qkf->...kf", y, self._w)  # ((S,) vertices of f × d, n_facets)
        return self._add_at("vertices", z.reshape(*z.shape[:-2], -1))

    def _split(self, F: Array) -> tuple[Array, Array]:
        """(F_f⁺, F_f⁻): the Gauss sums of the positive and negative parts, shape ((S,) n_facets) each."""
        Fp = sum(w * np.maximum(F[..., q, :], 0.0) for q, w in enumerate(self.wq))
        Fm = sum(w * np.minimum(F[..., q, :], 0.0) for q, w in enumerate(self.wq))
        return np.asarray(Fp), np.asarray(Fm)

    def rate(self, u: Array, F: Array, out: Array) -> Any:
        """Add L(u, V) to ``out`` (local dofs, shape ((S,) n_local)); return the outflow rate Σ_{∂Ω} F⁺ u_L (owned).

        ``u`` holds the DG0 values of the local cells, ghosts up to date, shape ((S,) n_local); F from
        :meth:`normal_flux`. The outflow is a float, or shape (S,) for a batch.
        """
        Fp, Fm = self._split(F)
        inner = self.interior
        phi = Fp * u[..., self.left] + np.where(inner, Fm * u[..., self.right], 0.0)
        out += self._to_cells(-phi, phi)
        rate = phi[..., ~inner].sum(axis=-1)
        return float(rate) if u.ndim == 1 else rate

    def cell_outflow(self, F: Array) -> Array:
        """Σ over each local cell's facets of the flux leaving it, shape ((S,) n_local) (ghost cells: partial sums)."""
        Fp, Fm = self._split(F)
        return self._to_cells(Fp, -Fm)

    def transpose(self, u: Array, z: Array, F: Array, gu: Array | None, gV: Array) -> None:
        """Add J_uᵀ z to ``gu`` (shape ((S,) n_local)) and J_Vᵀ z to ``gV`` (shape ((S,) n_vertices d)).

        ``gu`` None: J_uᵀ z is not formed (a caller that needs J_Vᵀ z only). ``u`` and ``z`` hold the values of
        the local cells, ghosts up to date; F from :meth:`normal_flux`.
        """
        right, inner = self._right_or_left, self._inner
        zl, ul = z[..., self.left], u[..., self.left]
        dz = z[..., right] * inner - zl  # −z_L on ∂Ω
        if gu is not None:
            Fp, Fm = self._split(F)
            gu += self._to_cells(Fp * dz, Fm * dz)
        ur = u[..., right] * inner  # u_R, 0 on ∂Ω
        # ½(1 + sgn F) u_L + ½(1 − sgn F) u_R at each Gauss point, times w_q Δz
        y = np.empty(F.shape)  # C order: einsum is several times slower on a strided operand
        for q, w in enumerate(self.wq):
            y[..., q, :] = (ur + 0.5 * (1.0 + np.sign(F[..., q, :])) * (ul - ur)) * (w * dz)
        gV += self._to_vertices(y)
