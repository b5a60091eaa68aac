"""Tests for mfpde.fokker_planck: EAFE P1 solver of the parameter Fokker–Planck equation (theory §4, §7).

Run serially (``pytest tests/test_fokker_planck.py``) and on 2 ranks
(``mpiexec -n 2 python -m mpi4py -m pytest -m "not serial" tests/test_fokker_planck.py``).
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

from mpi4py import MPI

import dolfinx.io.gmsh
import numpy as np
import pytest
import ufl
from dolfinx import fem, mesh
from scipy import integrate

from mfpde.errors import SolverError
from mfpde.exact import ou_moments
from mfpde.params.densities import gaussian_density, gibbs, lumped_mass_owned
from mfpde.params.eafe import lam_bernoulli
from mfpde.params.fokker_planck import ParameterFokkerPlanck, StepInfo

RECTANGLE_MSH = Path(__file__).resolve().parent.parent / "meshes" / "rectangle.msh"


def _space(comm: MPI.Comm, p: int, n: int, half: float) -> fem.FunctionSpace:
    """P1 space on [-half, half]^p with n cells per direction (right triangles for p = 2)."""
    if p == 1:
        msh = mesh.create_interval(comm, n, [-half, half])
    else:
        msh = mesh.create_rectangle(comm, [[-half, -half], [half, half]], [n, n])
    return fem.functionspace(msh, ("Lagrange", 1))


def _potential(V: fem.FunctionSpace, f) -> fem.Function:
    phi = fem.Function(V, name="phi")
    phi.interpolate(f)
    return phi


def _rate(h, err) -> float:
    return float(np.polyfit(np.log(h), np.log(err), 1)[0])


# --------------------------------------------------------------------------------------------------
# The Bernoulli rate


def test_lam_bernoulli_values_limits_and_no_overflow():
    lam = 0.3
    d = np.array([-2.0, -1e-9, 0.0, 1e-9, 0.7])
    x = d / lam
    ref = np.array([lam * xi / math.expm1(xi) if xi != 0 else lam for xi in x])
    assert np.allclose(lam_bernoulli(d, lam), ref, rtol=1e-14, atol=0)
    # B(-x) = e^x B(x) (detailed balance identity)
    dd = np.linspace(-5, 5, 41)
    assert np.allclose(lam_bernoulli(-dd, lam), np.exp(dd / lam) * lam_bernoulli(dd, lam), rtol=1e-12)
    # huge |dphi/lam|: no overflow / warnings, correct asymptotics
    big = np.array([-1e6, -800.0, 800.0, 1e6])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        v = lam_bernoulli(big, 1.0)
        v_small = lam_bernoulli(np.array([-1.0, 1.0]), 1e-300)
    assert np.all(np.isfinite(v)) and np.allclose(v, [1e6, 800.0, 0.0, 0.0], rtol=1e-14, atol=1e-300)
    # lam -> 0 is the upwind rate max(-dphi, 0), and lam = 0 returns it exactly
    assert np.allclose(v_small, [1.0, 0.0], rtol=1e-14, atol=0)
    assert np.array_equal(lam_bernoulli(dd, 0.0), np.maximum(-dd, 0.0))
    assert np.allclose(lam_bernoulli(dd, 1e-4), np.maximum(-dd, 0.0), atol=2e-4)
    with pytest.raises(ValueError):
        lam_bernoulli(dd, -1.0)


# --------------------------------------------------------------------------------------------------
# Ornstein–Uhlenbeck: Phi = (lam2/2)|theta - c|^2, Gaussians stay Gaussian (theory §6.2)

OU = {"lam": 0.1, "lam2": 1.0}
OU_CASES = {
    1: {"c": [0.3], "m0": [-0.5], "v0": [0.05], "half": 3.0},
    2: {"c": [0.3, -0.2], "m0": [-0.4, 0.3], "v0": [0.05, 0.08], "half": 2.5},
}


def _ou_error(comm, p: int, n: int, ds: float, s_end: float) -> np.ndarray:
    """Errors of (mean, diag cov, off-diag cov) at s_end against the closed form."""
    case = OU_CASES[p]
    lam, lam2 = OU["lam"], OU["lam2"]
    c, m0, v0 = (np.array(case[k]) for k in ("c", "m0", "v0"))
    V = _space(comm, p, n, case["half"])
    phi = _potential(V, lambda x: 0.5 * lam2 * sum((x[i] - c[i]) ** 2 for i in range(p)))
    rho = gaussian_density(V, m0, np.diag(v0))
    fp = ParameterFokkerPlanck(V, lam)
    for _ in range(round(s_end / ds)):
        fp.step(rho, phi, ds)
    d = fp.diagnostics(rho, phi)
    mean_ex, var_ex = ou_moments(s_end, c, m0, v0, lam, lam2)
    return np.concatenate([d["mean"] - mean_ex, np.diag(d["cov"]) - var_ex, d["cov"][np.triu_indices(p, 1)]])


@pytest.mark.parametrize("p", [1, 2])
def test_ou_moments_converge_second_order_in_h(p):
    """Mean and variance vs closed form; time error removed by Richardson (2 u_{ds/2} - u_ds, O(ds^2))."""
    comm = MPI.COMM_WORLD
    ns, ds, s_end = ([20, 40, 80, 160], 1e-3, 0.5) if p == 1 else ([10, 20, 40, 80], 1e-3, 0.25)
    errs = []
    for n in ns:
        e = 2 * _ou_error(comm, p, n, ds / 2, s_end) - _ou_error(comm, p, n, ds, s_end)
        errs.append(np.max(np.abs(e)))
    h = 2 * OU_CASES[p]["half"] / np.array(ns)
    rate = _rate(h, errs)
    assert abs(rate - 2.0) < 0.25, f"p={p}: h-rate {rate:.3f}, errors {errs}"
    assert errs[-1] < (2e-3 if p == 1 else 2e-3), f"p={p}: finest error {errs[-1]:.3e}"


def test_ou_first_order_in_ds():
    comm = MPI.COMM_WORLD
    dss = np.array([0.1, 0.05, 0.025, 0.0125])
    errs = [np.max(np.abs(_ou_error(comm, 1, 800, ds, 0.5))) for ds in dss]
    rate = _rate(dss, errs)
    assert abs(rate - 1.0) < 0.2, f"ds-rate {rate:.3f}, errors {errs}"
    assert errs[-1] < 3e-3, f"finest error {errs[-1]:.3e}"


# --------------------------------------------------------------------------------------------------
# Steady state = Gibbs measure for non-quadratic potentials (theory §7 item 7)

LAM_SS = 0.3


def _dw1(x):
    return x**4 / 4 - x**2 / 2


def _dw2(x, y):
    return (x**2 - 1) ** 2 / 4 + y**2 / 2 + 0.3 * x * y


def _steady_l1(comm, p: int, n: int) -> tuple[float, float, float]:
    """(‖ρ_∞ − p_cont‖_L1 by quadrature, max|ρ_∞ − gibbs_h|, relative mass drift)."""
    half = 2.5 if p == 1 else 2.0
    V = _space(comm, p, n, half)
    x = ufl.SpatialCoordinate(V.mesh)
    if p == 1:
        z = integrate.quad(lambda t: np.exp(-_dw1(t) / LAM_SS), -half, half, epsabs=1e-14, epsrel=1e-13)[0]
        phi = _potential(V, lambda y: _dw1(y[0]))
        p_cont = ufl.exp(-_dw1(x[0]) / LAM_SS) / z
        rho = gaussian_density(V, 0.5, 0.2)
    else:
        g, wg = np.polynomial.legendre.leggauss(300)
        gx, gy = np.meshgrid(half * g, half * g, indexing="ij")
        z = half**2 * float(np.sum(np.outer(wg, wg) * np.exp(-_dw2(gx, gy) / LAM_SS)))
        phi = _potential(V, lambda y: _dw2(y[0], y[1]))
        p_cont = ufl.exp(-_dw2(x[0], x[1]) / LAM_SS) / z
        rho = gaussian_density(V, [0.5, 0.0], 0.2 * np.eye(2))
    fp = ParameterFokkerPlanck(V, LAM_SS)
    mass0 = fp.diagnostics(rho, phi)["mass"]
    for _ in range(8):  # implicit Euler with huge ds converges geometrically to the kernel of L
        info = fp.step(rho, phi, 1e3)
    l1 = fem.assemble_scalar(fem.form(abs(rho - p_cont) * ufl.dx(metadata={"quadrature_degree": 8})))
    l1 = comm.allreduce(l1, op=MPI.SUM)
    gh = gibbs(V, phi, LAM_SS)
    nown = V.dofmap.index_map.size_local
    dev = comm.allreduce(float(np.max(np.abs(rho.x.array[:nown] - gh.x.array[:nown]))), op=MPI.MAX)
    return l1, dev, abs(info.mass - mass0) / mass0


@pytest.mark.parametrize("p", [1, 2])
def test_steady_state_is_gibbs(p):
    comm = MPI.COMM_WORLD
    ns = [20, 40, 80, 160] if p == 1 else [8, 16, 32, 64]
    res = [_steady_l1(comm, p, n) for n in ns]
    l1 = [r[0] for r in res]
    h = 1.0 / np.array(ns)
    rate = _rate(h, l1)
    assert abs(rate - 2.0) < 0.2, f"p={p}: L1 rate {rate:.3f}, errors {l1}"
    assert l1[-1] < 5e-3, f"p={p}: finest L1 error {l1[-1]:.3e}"
    # the discrete steady state is exactly the nodal Gibbs density (detailed balance)
    assert max(r[1] for r in res) < 1e-8, [r[1] for r in res]
    assert max(r[2] for r in res) < 1e-8, [r[2] for r in res]


# --------------------------------------------------------------------------------------------------
# Structure: mass, positivity, free energy for large steps (theory §7 items 1 and 5)


@pytest.mark.parametrize("p", [1, 2])
def test_conservation_positivity_free_energy_large_steps(p):
    comm = MPI.COMM_WORLD
    lam = 0.05
    V = _space(comm, p, 40 if p == 1 else 24, 2.0)
    if p == 1:
        phi = _potential(V, lambda x: _dw1(x[0]) + 0.3 * np.sin(3 * x[0]))
        rho = gaussian_density(V, -1.2, 0.01)
    else:
        phi = _potential(V, lambda x: _dw2(x[0], x[1]) + 0.3 * np.sin(3 * x[0]) * np.cos(2 * x[1]))
        rho = gaussian_density(V, [-1.2, 1.0], 0.01 * np.eye(2))
    fp = ParameterFokkerPlanck(V, lam)
    limit = fp.stability_limit(phi)
    assert 0 < limit < 1e-2, limit
    d0 = fp.diagnostics(rho, phi)
    mass0, f_prev = d0["mass"], d0["free_energy"]
    assert abs(mass0 - 1.0) < 1e-14
    for factor in [1.0, 10.0, 100.0]:
        for _ in range(10):
            info = fp.step(rho, phi, factor * limit)
            d = fp.diagnostics(rho, phi)
            assert abs(info.mass - mass0) / mass0 <= 1e-12, f"mass drift {info.mass - mass0:.3e}"
            assert abs(d["mass"] - info.mass) < 1e-15
            assert info.min_rho >= 0.0 and d["min_rho"] == info.min_rho, info
            assert d["free_energy"] <= f_prev + 1e-13, (factor, d["free_energy"] - f_prev)
            # F = lam KL(rho || p) + const: both decrease together
            f_prev = d["free_energy"]
    assert d["free_energy"] < d0["free_energy"] - 0.1  # the flow did something
    assert d["kl"] < d0["kl"]


def test_energy_dissipation_identity():
    """F(ρ¹) − F(ρ⁰) = −Δs D(ρ⁰) + O(Δs²) with D the discrete Fisher information (theory §7 item 5)."""
    comm = MPI.COMM_WORLD
    V = _space(comm, 1, 60, 2.0)
    phi = _potential(V, lambda x: _dw1(x[0]))
    fp = ParameterFokkerPlanck(V, 0.2)
    rho0 = gaussian_density(V, 0.4, 0.1)
    d0 = fp.diagnostics(rho0, phi)
    assert d0["dissipation"] > 0
    dss = np.array([4e-3, 2e-3, 1e-3, 5e-4])
    res = []
    for ds in dss:
        rho = rho0.copy()
        fp.step(rho, phi, ds)
        res.append(abs(fp.diagnostics(rho, phi)["free_energy"] - d0["free_energy"] + ds * d0["dissipation"]))
    rate = _rate(dss, res)
    assert abs(rate - 2.0) < 0.2, f"energy-identity rate {rate:.3f}, residuals {res}"


# --------------------------------------------------------------------------------------------------
# Tikhonov lam = 0: explicit upwind transport with CFL sub-stepping (theory §4 (WGF))


def test_tikhonov_transport_cfl_and_characteristics():
    comm = MPI.COMM_WORLD
    lam2, c, m0, v0, s_end = 1.0, 0.5, -1.0, 0.02, 1.0
    errs, hs = [], []
    for n in [100, 200, 400]:
        V = _space(comm, 1, n, 3.0)
        phi = _potential(V, lambda x: 0.5 * lam2 * (x[0] - c) ** 2)
        rho = gaussian_density(V, m0, v0)
        fp = ParameterFokkerPlanck(V, 0.0)
        cfl = fp.stability_limit(phi)
        # CFL min_i m_i / sum_j w_ij max(Phi_i - Phi_j, 0), attained at the boundary node theta = -3
        # (m = h/2, w = 1/h, one downhill neighbour): (h/2) / (lam2 (3 + c - h/2))
        h = 6.0 / n
        assert math.isclose(cfl, 0.5 * h / (lam2 * (3.0 + c - h / 2)), rel_tol=1e-10), cfl
        mass0 = fp.diagnostics(rho, phi)["mass"]
        n_steps, ds = 4, s_end / 4
        for _ in range(n_steps):
            info: StepInfo = fp.step(rho, phi, ds)
            assert info.substeps == math.ceil(ds / cfl) > 1, info
            assert info.iterations == 0
            assert abs(info.mass - mass0) <= 1e-12 * mass0, info.mass - mass0
            assert info.min_rho >= 0.0
        assert fp.step(rho.copy(), phi, 0.5 * cfl).substeps == 1
        mean = fp.diagnostics(rho, phi)["mean"][0]
        errs.append(abs(mean - (c + (m0 - c) * math.exp(-lam2 * s_end))))
        hs.append(h)
    rate = _rate(hs, errs)
    # upwind: the mean velocity is evaluated half an edge downstream, an O(h) lag
    assert abs(rate - 1.0) < 0.2, f"upwind mean rate {rate:.3f}, errors {errs}"
    assert errs[-1] < 0.02, errs


@pytest.mark.parametrize("p", [1, 2])
def test_tikhonov_positive_conservative_large_steps(p):
    comm = MPI.COMM_WORLD
    V = _space(comm, p, 32 if p == 1 else 16, 2.0)
    if p == 1:
        phi = _potential(V, lambda x: _dw1(x[0]))
        rho = gaussian_density(V, -0.2, 0.05)
    else:
        phi = _potential(V, lambda x: _dw2(x[0], x[1]))
        rho = gaussian_density(V, [-0.2, 0.5], 0.05 * np.eye(2))
    fp = ParameterFokkerPlanck(V, 0.0)
    cfl = fp.stability_limit(phi)
    mass0 = fp.diagnostics(rho, phi)["mass"]
    f_prev = f0 = fp.diagnostics(rho, phi)["free_energy"]
    for _ in range(5):
        info = fp.step(rho, phi, 20 * cfl)
        assert info.substeps == 20
        assert abs(info.mass - mass0) <= 1e-12 * mass0 and info.min_rho >= 0.0, info
        f = fp.diagnostics(rho, phi)["free_energy"]
        assert f <= f_prev + 1e-14  # potential energy decreases under downhill upwind transport
        f_prev = f
    # mass moved downhill: the potential energy ∫Φρ dropped by a definite amount
    assert f_prev < f0 - 0.05, (f0, f_prev)


# --------------------------------------------------------------------------------------------------
# MPI: the same numbers on 1 and 2 ranks


def _short_run(comm, lam: float, use_gmsh: bool) -> tuple[float, float, float]:
    if use_gmsh:
        msh = dolfinx.io.gmsh.read_from_msh(str(RECTANGLE_MSH), comm, 0, gdim=2).mesh
        V = fem.functionspace(msh, ("Lagrange", 1))
    else:
        V = _space(comm, 2, 12, 2.0)
    phi = _potential(V, lambda x: _dw2(x[0], x[1]) + 0.2 * np.sin(2 * x[1]))
    rho = gaussian_density(V, [0.3, -0.4], [[0.1, 0.02], [0.02, 0.05]])
    fp = ParameterFokkerPlanck(V, lam)
    ds = 0.05 if lam > 0 else 0.02
    for _ in range(5):
        fp.step(rho, phi, ds)
    d = fp.diagnostics(rho, phi)
    return d["free_energy"], float(d["cov"][0, 1]), float(d["mean"][1])


@pytest.mark.parametrize("lam", [0.1, 0.0])
@pytest.mark.parametrize("use_gmsh", [False, True])
def test_parallel_matches_serial(lam, use_gmsh):
    world = _short_run(MPI.COMM_WORLD, lam, use_gmsh)
    local = _short_run(MPI.COMM_SELF, lam, use_gmsh)
    for a, b in zip(world, local, strict=True):
        assert abs(a - b) <= 1e-12 * max(1.0, abs(b)), (world, local, MPI.COMM_WORLD.size)


# --------------------------------------------------------------------------------------------------
# Meshes, helpers, argument checks


def test_gmsh_rectangle_mesh():
    comm = MPI.COMM_WORLD
    msh = dolfinx.io.gmsh.read_from_msh(str(RECTANGLE_MSH), comm, 0, gdim=2).mesh
    V = fem.functionspace(msh, ("Lagrange", 1))
    m = lumped_mass_owned(V)
    assert math.isclose(comm.allreduce(float(m.sum()), op=MPI.SUM), 16.0, rel_tol=1e-13)
    assert V.dofmap.index_map.size_global == 33 * 33
    lam = 0.25
    phi = _potential(V, lambda x: 0.5 * ((x[0] - 0.2) ** 2 + x[1] ** 2))
    rho = gaussian_density(V, [-0.5, 0.5], 0.1 * np.eye(2))
    fp = ParameterFokkerPlanck(V, lam)
    kl_prev = fp.diagnostics(rho, phi)["kl"]
    for _ in range(4):
        fp.step(rho, phi, 0.5)
        d = fp.diagnostics(rho, phi)
        assert d["kl"] < kl_prev
        kl_prev = d["kl"]
    for _ in range(4):
        fp.step(rho, phi, 1e3)
    d = fp.diagnostics(rho, phi)
    assert d["l1_gibbs"] < 1e-9 and d["kl"] < 1e-12, (d["l1_gibbs"], d["kl"])
    assert np.allclose(d["mean"], [0.2, 0.0], atol=2e-3) and np.allclose(d["cov"], lam * np.eye(2), atol=5e-3)


def test_obtuse_mesh_raises():
    msh = mesh.create_rectangle(MPI.COMM_WORLD, [[0.0, 0.0], [1.0, 1.0]], [4, 4])
    msh.geometry.x[:, 0] += 0.8 * msh.geometry.x[:, 1]  # shear: the diagonals become the long edges
    V = fem.functionspace(msh, ("Lagrange", 1))
    with pytest.raises(ValueError, match="obtuse"):
        ParameterFokkerPlanck(V, 0.1)


def test_gaussian_density_gibbs_and_arguments():
    comm = MPI.COMM_WORLD
    V = _space(comm, 2, 16, 2.0)
    m = lumped_mass_owned(V)
    n = V.dofmap.index_map.size_local
    assert np.all(m > 0) and math.isclose(comm.allreduce(float(m.sum()), op=MPI.SUM), 16.0, rel_tol=1e-13)
    rho = gaussian_density(V, [0.1, -0.2], [[0.2, 0.05], [0.05, 0.1]])
    assert math.isclose(comm.allreduce(float(m @ rho.x.array[:n]), op=MPI.SUM), 1.0, rel_tol=1e-14)
    phi = _potential(V, lambda x: 2.0 * x[0] ** 2 + 0.5 * x[1] ** 2)
    g = gibbs(V, phi, 0.5)
    assert math.isclose(comm.allreduce(float(m @ g.x.array[:n]), op=MPI.SUM), 1.0, rel_tol=1e-14)
    fp = ParameterFokkerPlanck(V, 0.5)
    d = fp.diagnostics(g, phi)
    assert abs(d["kl"]) < 1e-14 and d["l1_gibbs"] < 1e-14 and abs(d["dissipation"]) < 1e-12
    assert np.allclose(d["gibbs"], g.x.array[:n], rtol=1e-13)
    assert np.allclose(d["cov"], np.diag([0.5 / 4.0, 0.5 / 1.0]), rtol=0.05)
    with pytest.raises(ValueError):
        gibbs(V, phi, 0.0)
    with pytest.raises(ValueError):
        fp.step(g, phi, 0.0)
    with pytest.raises(ValueError):
        ParameterFokkerPlanck(V, -0.1)
    with pytest.raises(ValueError):
        ParameterFokkerPlanck(fem.functionspace(V.mesh, ("Lagrange", 2)), 0.1)


def test_petsc_options_iterative_and_solver_error():
    comm = MPI.COMM_WORLD
    V = _space(comm, 2, 16, 2.0)
    phi = _potential(V, lambda x: _dw2(x[0], x[1]))
    rho_lu = gaussian_density(V, [0.2, 0.1], 0.1 * np.eye(2))
    rho_it = rho_lu.copy()
    ParameterFokkerPlanck(V, 0.2).step(rho_lu, phi, 0.05)
    opts = {"ksp_type": "gmres", "pc_type": "jacobi", "ksp_rtol": 1e-13, "ksp_atol": 1e-16}
    info = ParameterFokkerPlanck(V, 0.2, petsc_options=opts, prefix="test_fp_it_").step(rho_it, phi, 0.05)
    assert info.iterations > 1
    assert np.allclose(rho_it.x.array, rho_lu.x.array, rtol=1e-9, atol=1e-12)
    bad = {"ksp_type": "gmres", "pc_type": "none", "ksp_max_it": 1, "ksp_rtol": 1e-14}
    fp = ParameterFokkerPlanck(V, 0.2, petsc_options=bad, prefix="test_fp_bad_")
    with pytest.raises(SolverError, match="did not converge"):
        fp.step(rho_it, phi, 0.05)
