"""Tests for mfpde.mesh on the gmsh files of meshes/, and a token solve on an unstructured mesh (theory §7.1).

Run serially and under ``mpiexec -n 2 python -m mpi4py -m pytest -m ranks``.
"""

from __future__ import annotations

import math
from pathlib import Path

from mpi4py import MPI

import dolfinx.fem
import numpy as np
import pytest
from roundoff import conservation, gamma

from mfpde.heads import HeadMeasure
from mfpde.mesh import MeshError, box, measure, read_msh
from mfpde.tokens.box.data import Sample, fill_density
from mfpde.tokens.box.transport import TokenTransport

pytestmark = pytest.mark.ranks  # the rank count can change what it checks: run again under mpiexec

MESHES = Path(__file__).resolve().parent.parent / "meshes"


@pytest.mark.parametrize(
    ("name", "gdim", "exact", "rtol", "ncells"),
    # exact vertices (multiples of 1/4 in the files): the measure is a sum of ncells cell volumes of ≤ 8 roundings
    [("interval", 1, 8.0, gamma(200 + 8), 200), ("rectangle", 2, 16.0, gamma(2048 + 8), 2048),
     ("disk", 2, 9.0 * math.pi, 1e-2, None)],
)
def test_read_msh_measure(name, gdim, exact, rtol, ncells):
    dom = read_msh(MPI.COMM_WORLD, MESHES / f"{name}.msh", gdim)
    msh = dom.mesh
    assert dom.axes is None  # gmsh meshes never take the tensor path
    assert msh.topology.dim == gdim and msh.geometry.dim == gdim
    nglob = msh.topology.index_map(gdim).size_global
    if ncells is not None:
        assert nglob == ncells
    area = measure(msh)
    assert abs(area - exact) / exact <= rtol, f"{name}: measure {area!r}, expected {exact!r}"
    if name == "disk":
        # inscribed polygon of radius 3 with h = 0.2: area below 9π by O(h²) (~ 2πR h²/(12 R)·...)
        assert 0 < exact - area < 0.05, exact - area
        x = msh.geometry.x[:, :2]
        # boundary vertices lie on the circle; "%.16g" in the file and hypot round by ≤ 4u of 3
        assert np.max(np.hypot(x[:, 0], x[:, 1])) <= 3.0 * (1 + gamma(4))


def test_measure_box():
    # a sum of the cell volumes (7 and 24 cells), vertex coordinates rounded once, ≤ 8 roundings per cell
    assert measure(box(MPI.COMM_WORLD, [[-1.0, 2.5]], [7]).mesh) == pytest.approx(3.5, rel=gamma(7 + 8))
    assert measure(box(MPI.COMM_WORLD, [[0.0, 2.0], [-1.0, 0.5]], [4, 3], "triangle").mesh) == pytest.approx(
        3.0, rel=gamma(24 + 8))


def test_missing_msh_raises(tempdir):
    with pytest.raises(MeshError, match="not found"):
        read_msh(MPI.COMM_WORLD, tempdir / "no_such_mesh.msh", 2)


def test_wrong_dimension_raises():
    with pytest.raises(MeshError, match="dimension"):
        read_msh(MPI.COMM_WORLD, MESHES / "interval.msh", 2)


def test_unreadable_msh_raises(tempdir):
    """Every rank raises (an error on rank 0 alone would leave the others waiting in read_from_msh)."""
    bad = tempdir / "bad.msh"
    if MPI.COMM_WORLD.rank == 0:
        bad.write_text("this is not a gmsh file\n")
    MPI.COMM_WORLD.Barrier()
    with pytest.raises(MeshError, match="could not be read"):
        read_msh(MPI.COMM_WORLD, bad, 2)


# DG1 on the disk (47 s on 2 ranks) in the serial pass only: the distributed disk path runs as DG0 under MPI
@pytest.mark.parametrize(("degree", "tol"), [(0, 1.5e-2), pytest.param(1, 2e-3, marks=pytest.mark.serial)])
def test_transport_on_disk_conserves_mass(degree, tol):
    """Unstructured triangles (direct kernel path): a contracting head, Gaussian well inside the disk of radius 3.

    Nothing reaches ∂Ω, so ∫μ_T = ∫μ_0 to round-off, and mass_T + outflow = mass_0 holds in any case; the
    moments follow theory §6.1 to discretisation accuracy (measured: |ΔΣ| 4.6e-3 (DG0), 6.6e-4 (DG1)).
    """
    dom = read_msh(MPI.COMM_WORLD, MESHES / "disk.msh", 2)
    tt = TokenTransport(dom, degree)
    assert tt.vgrid is None and tt.quad.grid_axes is None  # the direct path
    u = dolfinx.fem.Function(tt.W)
    m0, S0 = np.array([0.2, -0.1]), np.array([[0.2, 0.05], [0.05, 0.15]])
    fill_density(Sample("gaussian", {"mean": m0, "cov": S0}, 0.0), u, tt.mass)
    N = tt.W.dofmap.index_map.size_global
    assert tt.mass(u) == pytest.approx(1.0, abs=gamma(2 * N + 1))  # Σ, a division, Σ again
    heads = HeadMeasure(np.array([-1.0]), np.array([1.0]))
    T, steps = 0.25, 2
    mins = []
    rep = tt.solve(u, heads, T, steps, callback=lambda k, t, u: mins.append(tt.min_density(u)))
    assert len(mins) == steps and min(mins) >= 0.0
    # conservative in exact arithmetic: 3 stages per sub-step of ≤ 4·7·(k+2)² + 2(k+1)² + 10 roundings a dof
    bound = conservation(rep.substeps, 3 * (4 * 7 * (degree + 2) ** 2 + 2 * (degree + 1) ** 2 + 10), N, rep.mass_0)
    assert rep.mass_error * rep.mass_0 <= bound, (rep.mass_error, bound)
    assert abs(rep.mass_T + rep.outflow - rep.mass_0) <= bound
    assert 0.0 <= rep.outflow <= bound
    S = S0 @ np.linalg.inv(np.eye(2) - 2 * heads.bbar * T * S0)  # b̄ = -1: the covariance shrinks
    assert np.trace(rep.cov_T) < np.trace(S0) - 0.02
    err = np.abs(np.array(rep.cov_T) - S).max()
    assert err < tol, f"DG{degree}: covariance error {err:.3e}"
    # the same result from a serial solve on every rank (unstructured mesh distributed by read_msh)
    tt1 = TokenTransport(read_msh(MPI.COMM_SELF, MESHES / "disk.msh", 2), degree)
    u1 = dolfinx.fem.Function(tt1.W)
    fill_density(Sample("gaussian", {"mean": m0, "cov": S0}, 0.0), u1, tt1.mass)
    rep1 = tt1.solve(u1, heads, T, steps)
    # each run: its exact-arithmetic result plus the sub-steps' relative round-off (bound / mass, above),
    # amplified by the flow's condition number κ, estimated by finite differences (Higham §15.1):
    # the serial solve again from μ_0 (1 + δ ξ), ξ = ±1 alternating over the dofs
    delta = 1e-7
    u2 = dolfinx.fem.Function(tt1.W)
    fill_density(Sample("gaussian", {"mean": m0, "cov": S0}, 0.0), u2, tt1.mass)
    u2.x.array[:] *= 1.0 + delta * np.where(np.arange(u2.x.array.size) % 2 == 0, 1.0, -1.0)
    rep2 = tt1.solve(u2, heads, T, steps)

    def outs(r):
        return np.concatenate([r.mean_T, np.ravel(r.cov_T)])

    kappa = max(1.0, float(np.max(np.abs(outs(rep2) - outs(rep1)))) / delta)
    tol = 2 * kappa * bound / rep.mass_0
    assert np.all(np.abs(outs(rep) - outs(rep1)) <= tol), (outs(rep) - outs(rep1), tol, kappa)


def _write_rectangle(path: Path, version: float, physical: bool, save_all: bool) -> None:
    """The rectangle [-2, 2]² meshed by gmsh and saved as MSH ``version`` (on rank 0; all ranks wait)."""
    if MPI.COMM_WORLD.rank == 0:
        import gmsh

        gmsh.initialize()
        gmsh.option.setNumber("General.Terminal", 0)
        gmsh.model.add("rectangle")
        s = gmsh.model.occ.addRectangle(-2, -2, 0, 4, 4)
        gmsh.model.occ.synchronize()
        if physical:
            gmsh.model.addPhysicalGroup(2, [s], 1)
        gmsh.option.setNumber("Mesh.MeshSizeMax", 1.0)
        gmsh.model.mesh.generate(2)
        gmsh.option.setNumber("Mesh.MshFileVersion", version)
        gmsh.option.setNumber("Mesh.SaveAll", 1 if save_all else 0)
        gmsh.write(str(path))
        gmsh.finalize()
    MPI.COMM_WORLD.Barrier()


def test_msh_checked_by_the_reader_that_loads_it(tempdir):
    """Issue 15: the meshio check passed an MSH 2.2 file saved with Mesh.SaveAll=1 (no physical groups), which
    DOLFINx's reader then refused with a traceback, and refused an MSH 4.0 file DOLFINx reads (OverflowError)."""
    save_all, v40 = tempdir / "saveall22.msh", tempdir / "v40.msh"
    _write_rectangle(save_all, 2.2, physical=False, save_all=True)
    _write_rectangle(v40, 4.0, physical=True, save_all=False)
    with pytest.raises(MeshError, match="could not be read.*physical groups"):
        read_msh(MPI.COMM_WORLD, save_all, 2)
    msh = read_msh(MPI.COMM_WORLD, v40, 2).mesh
    assert measure(msh) == pytest.approx(16.0, rel=gamma(msh.topology.index_map(2).size_global + 8))
