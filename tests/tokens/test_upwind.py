"""The DG0 upwind scheme by facet arrays (mfpde.tokens.box.upwind) against the UFL forms it replaces for k = 0.

The forms (the upwind-DG form of TokenTransport, its CFL outflow form, and the adjoint's transposed-Jacobian
forms) are assembled by DOLFINx from UFL; the facet arrays compute the same scheme by other operations (their
own normals, areas and midpoints from the vertex coordinates). Each entry is a sum of at most 4 facet terms of
at most ~20 rounded operations each (geometry included), so the two agree to 2 γ₆₄ Σ|terms| (Higham eq. (4.4)),
on intervals, quadrilaterals, triangles and a gmsh disk, on any number of ranks. Orientation, midpoint or
sign-convention errors are O(1) relative.
"""

from __future__ import annotations

from pathlib import Path

from mpi4py import MPI

import dolfinx.fem
import dolfinx.la
import numpy as np
import pytest
from roundoff import gamma

from mfpde.mesh import box, read_msh
from mfpde.tokens.box.adjoint import DiscreteAdjoint
from mfpde.tokens.box.transport import TokenTransport

pytestmark = pytest.mark.ranks  # the rank count can change what it checks: run again under mpiexec

MESHES = Path(__file__).resolve().parents[2] / "meshes"


def _domain(kind: str):
    comm = MPI.COMM_WORLD
    if kind == "interval":
        return box(comm, [[-1.0, 1.0]], [9])
    if kind == "disk":
        return read_msh(comm, MESHES / "disk.msh", 2)
    return box(comm, [[-1.0, 1.0], [-1.0, 0.5]], [6, 5], kind)


def _field(x: np.ndarray, shift: float) -> np.ndarray:
    """A smooth function of the coordinates (so owned and ghost copies agree), zero for x₀ < −0.3."""
    y = x[:, 1] if x.shape[1] > 1 else 0.0 * x[:, 0]
    return np.where(x[:, 0] < -0.3, 0.0, np.sin(4.0 * x[:, 0] + shift) + np.cos(3.0 * y - shift))


def _assembled(form, f: dolfinx.fem.Function) -> np.ndarray:
    f.x.array[:] = 0.0
    dolfinx.fem.assemble_vector(f.x.array, form)
    f.x.scatter_reverse(dolfinx.la.InsertMode.add)
    return f.x.array.copy()


def _reverse(values: np.ndarray, f: dolfinx.fem.Function) -> np.ndarray:
    f.x.array[:] = values
    f.x.scatter_reverse(dolfinx.la.InsertMode.add)
    return f.x.array.copy()


@pytest.mark.parametrize("kind", ["interval", "quadrilateral", "triangle", "disk"])
def test_facet_arrays_equal_the_forms(kind: str) -> None:
    tokens = TokenTransport(_domain(kind), degree=0)
    fv = tokens.fv
    assert fv is not None
    d = tokens.msh.geometry.dim
    xw = tokens.W.tabulate_dof_coordinates()[:, :d]
    xp = tokens.P.tabulate_dof_coordinates()[:, :d]
    u = 1.5 + _field(xw, 0.3)
    z = _field(xw, 1.1)
    V = np.stack([_field(xp, 0.7 * j) for j in range(d)], axis=1).ravel()
    tokens.u.x.array[:] = u
    tokens.vel.x.array[:] = V
    F = fv.normal_flux(V)
    comm = tokens.comm
    assert comm.allreduce(bool(np.any(F == 0.0)), op=MPI.LOR), "V·n should vanish somewhere (the kink sgn 0 = 0)"
    n = tokens.n_owned
    tol = 2 * gamma(64)
    work = dolfinx.fem.Function(tokens.W)

    # Σ|terms| per entry: the facet terms with their absolute values
    Fabs = fv.wq @ np.abs(F)  # F: (n_q, n_facets)
    phi_abs = Fabs * (np.abs(u[fv.left]) + np.where(fv.interior, np.abs(u[fv.right]), 0.0))
    inner = fv.interior
    scale = _reverse(np.bincount(fv.left, phi_abs, minlength=fv.n_local)
                     + np.bincount(fv.right[inner], phi_abs[inner], minlength=fv.n_local), work)[:n]

    ufl_L = _assembled(tokens.L, work)[:n]
    rhs = np.zeros_like(u)
    fv.rate(u, F, rhs)
    fv_L = _reverse(rhs, work)[:n]
    err = np.abs(fv_L - ufl_L)
    assert np.all(err <= tol * scale), f"{kind}: L(u, V) differs by {err.max():.3g}, scale {scale.max():.3g}"

    ufl_out = _assembled(tokens.cell_out, work)[:n]
    fv_out = _reverse(fv.cell_outflow(F), work)[:n]
    assert np.allclose(fv_out, ufl_out, rtol=tol, atol=tol * np.abs(F).max()), f"{kind}: CFL outflow differs"

    adj = DiscreteAdjoint(tokens)
    adj.z.x.array[:] = z
    ufl_r = _assembled(adj.JuT, work)[:n]
    xi = dolfinx.fem.Function(tokens.P)
    ufl_xi = _assembled(adj.JVT, xi)
    gu, gV = np.zeros_like(u), np.zeros_like(V)
    fv.transpose(u, z, F, gu, gV)
    fv_r = _reverse(gu, work)[:n]
    fv_xi = _reverse(gV, xi)
    zscale = comm.allreduce(float(np.abs(F).max(initial=0.0) * np.abs(z).max(initial=0.0)), op=MPI.MAX) * 8
    assert np.allclose(fv_r, ufl_r, rtol=tol, atol=tol * zscale), f"{kind}: J_uᵀz differs"
    nv = tokens.P.dofmap.index_map.size_local * d
    vscale = zscale * comm.allreduce(float(np.abs(u).max(initial=0.0)), op=MPI.MAX)
    assert np.allclose(fv_xi[:nv], ufl_xi[:nv], rtol=tol, atol=tol * vscale), f"{kind}: J_Vᵀz differs"
    # and not trivially: each is far from zero somewhere
    size = min(comm.allreduce(float(np.abs(a).max(initial=0.0)), op=MPI.MAX) for a in (ufl_L, ufl_r, ufl_xi))
    assert size > 1e3 * tol * vscale
