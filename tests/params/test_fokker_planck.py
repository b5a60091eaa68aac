"""Tests for mfpde.fokker_planck: EAFE P1 solver of the parameter Fokker–Planck equation (theory §4, §7).

Run serially (``pytest tests/params/test_fokker_planck.py``) and on 2 ranks
(``mpiexec -n 2 python -m mpi4py -m pytest -m ranks tests/params/test_fokker_planck.py``).
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
from roundoff import conservation, gamma, implicit_step, reordered, sum_error
from scipy import integrate

from mfpde.errors import SolverError
from mfpde.exact import ou_moments
from mfpde.fitting import fit_order
from mfpde.params.densities import gaussian_density, gibbs, lumped_mass_owned
from mfpde.params.eafe import lam_bernoulli
from mfpde.params.fokker_planck import ParameterFokkerPlanck, StepInfo

pytestmark = pytest.mark.ranks  # the rank count can change what it checks: run again under mpiexec

RECTANGLE_MSH = Path(__file__).resolve().parents[2] / "meshes" / "rectangle.msh"


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


def _sizes(V: fem.FunctionSpace) -> tuple[int, float]:
    """(global dof count, max m / min m of the lumped mass): the sizes the round-off bounds need."""
    comm, m = V.mesh.comm, lumped_mass_owned(V)
    ratio = comm.allreduce(float(m.max()), op=MPI.MAX) / comm.allreduce(float(m.min()), op=MPI.MIN)
    return V.dofmap.index_map.size_global, ratio


def _energy_scale(V: fem.FunctionSpace, rho: fem.Function, phi: fem.Function, lam: float) -> float:
    """max_i |∂F/∂(m_i ρ_i)| = max |Φ| + λ (max |log ρ| + 1): turns an m-weighted ℓ1 error of ρ into one of F."""
    n, comm = V.dofmap.index_map.size_local, V.mesh.comm
    r = rho.x.array[:n]
    logr = np.abs(np.log(r[r > 0])) if np.any(r > 0) else np.zeros(1)
    loc = float(np.max(np.abs(phi.x.array[:n]))) + lam * (float(np.max(logr)) + 1.0)
    return comm.allreduce(loc, op=MPI.MAX)


def _rate(h, err) -> float:
    return float(fit_order(h, err))


# --------------------------------------------------------------------------------------------------
# The Bernoulli rate


def test_lam_bernoulli_values_limits_and_no_overflow():
    lam = 0.3
    d = np.array([-2.0, -1e-9, 0.0, 1e-9, 0.7])
    x = d / lam
    ref = np.array([lam * xi / math.expm1(xi) if xi != 0 else lam for xi in x])
    # two evaluations of λx/expm1(x), each ≤ 5 roundings (x = d/λ, expm1 < 1 ulp = 2u, ×, /)
    assert np.allclose(lam_bernoulli(d, lam), ref, rtol=gamma(10), atol=0)
    # B(-x) = e^x B(x) (detailed balance identity); x = d/λ is rounded by |x|u, which exp, expm1 and
    # e^{−x} carry as relative errors |x|u each (three of them), plus ≤ 12 roundings of the formulas
    dd = np.linspace(-5, 5, 41)
    xmax = float(np.max(np.abs(dd))) / lam
    assert np.allclose(lam_bernoulli(-dd, lam), np.exp(dd / lam) * lam_bernoulli(dd, lam),
                       rtol=gamma(3 * xmax + 12), atol=0)
    # huge |dphi/lam|: no overflow / warnings, correct asymptotics
    big = np.array([-1e6, -800.0, 800.0, 1e6])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        v = lam_bernoulli(big, 1.0)
        v_small = lam_bernoulli(np.array([-1.0, 1.0]), 1e-300)
    # d/expm1(x) with expm1(x) = −1 to round-off: ≤ 4 roundings; e^{-800} underflows to a tiny value
    assert np.all(np.isfinite(v)) and np.allclose(v, [1e6, 800.0, 0.0, 0.0], rtol=gamma(4), atol=1e-300)
    # lam -> 0 is the upwind rate max(-dphi, 0), and lam = 0 returns it exactly
    assert np.allclose(v_small, [1.0, 0.0], rtol=gamma(4), atol=0)
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


def _steady_l1(comm, p: int, n: int) -> tuple[float, float, float, float, float]:
    """(‖ρ_∞ − p_cont‖_L1 by quadrature, Σ m_i|ρ_∞ − gibbs_h|, |Δ mass|, and round-off bounds of the last
    two: see :func:`roundoff.implicit_step`)."""
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
    n_steps, ds = 8, 1e3
    for _ in range(n_steps):  # implicit Euler with huge ds converges geometrically to the kernel of L
        info = fp.step(rho, phi, ds)
    l1 = fem.assemble_scalar(fem.form(abs(rho - p_cont) * ufl.dx(metadata={"quadrature_degree": 8})))
    l1 = comm.allreduce(l1, op=MPI.SUM)
    gh = gibbs(V, phi, LAM_SS)
    nown = V.dofmap.index_map.size_local
    m = lumped_mass_owned(V)
    dev = comm.allreduce(float(m @ np.abs(rho.x.array[:nown] - gh.x.array[:nown])), op=MPI.SUM)
    ndofs = V.dofmap.index_map.size_global
    ratio = comm.allreduce(float(m.max()), op=MPI.MAX) / comm.allreduce(float(m.min()), op=MPI.MIN)
    solve = n_steps * implicit_step(ndofs, ds, fp.stability_limit(phi), ratio)
    # Each step contracts the distance to the discrete Gibbs measure by 1/(1 + Δs·gap), gap ≥ 0.1 for
    # these wells at λ = 0.3 (Kramers: barrier 1/4, e^{−0.25/0.3} = 0.43 times the curvature 2), so after
    # 8 steps the exact-arithmetic distance is ≤ 2 (1 + 100)^{-8} ≈ 2e-16; the rest is the solves' round-off.
    truncation = 2.0 * (1.0 + 0.1 * ds) ** -n_steps
    return l1, dev, abs(info.mass - mass0), solve + truncation + 2 * sum_error(ndofs), solve + 2 * sum_error(ndofs)


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
    # the discrete steady state is exactly the nodal Gibbs density (detailed balance), and mass is kept,
    # each to the round-off of the solves (a bound derived from ε, the size and Δs, roundoff.py)
    for n, (_, dev, drift, dev_bound, drift_bound) in zip(ns, res, strict=True):
        assert dev <= dev_bound, f"p={p}, n={n}: Σ m|ρ_∞ − gibbs_h| = {dev:.3e} > {dev_bound:.3e}"
        assert drift <= drift_bound, f"p={p}, n={n}: mass drift {drift:.3e} > {drift_bound:.3e}"


@pytest.mark.parametrize("p", [1, 2])
def test_gibbs_is_a_fixed_point_of_the_step(p):
    """Detailed balance: one step from the nodal Gibbs density returns it, to the round-off of one
    well-conditioned solve (Δs = the explicit stability limit, so ‖A‖₁ ≤ 3 max m)."""
    comm = MPI.COMM_WORLD
    V = _space(comm, p, 40 if p == 1 else 16, 2.0)
    phi = _potential(V, (lambda x: _dw1(x[0])) if p == 1 else (lambda x: _dw2(x[0], x[1])))
    fp = ParameterFokkerPlanck(V, LAM_SS)
    g = gibbs(V, phi, LAM_SS)
    rho = g.copy()
    ds = fp.stability_limit(phi)
    fp.step(rho, phi, ds)
    n, m = V.dofmap.index_map.size_local, lumped_mass_owned(V)
    dev = comm.allreduce(float(m @ np.abs(rho.x.array[:n] - g.x.array[:n])), op=MPI.SUM)
    ratio = comm.allreduce(float(m.max()), op=MPI.MAX) / comm.allreduce(float(m.min()), op=MPI.MIN)
    bound = implicit_step(V.dofmap.index_map.size_global, ds, ds, ratio) + sum_error(n)
    assert dev <= bound, f"p={p}: Σ m|step(g) − g| = {dev:.3e} > {bound:.3e}"


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
    ndofs, ratio = _sizes(V)
    # gaussian_density: Σ m e (n terms), a division, Σ m ρ again: 2n + 1 roundings of positive terms
    assert abs(mass0 - 1.0) <= gamma(2 * ndofs + 1)
    drift_bound = 2 * sum_error(ndofs)
    for factor in [1.0, 10.0, 100.0]:
        for _ in range(10):
            info = fp.step(rho, phi, factor * limit)
            d = fp.diagnostics(rho, phi)
            step_err = implicit_step(ndofs, factor * limit, limit, ratio)  # Σ m|ρ̂ − ρ| of this step
            drift_bound += step_err  # |Δ mass| ≤ Σ m|ρ̂ − ρ|: conservation is exact in exact arithmetic
            assert abs(info.mass - mass0) <= drift_bound, f"mass drift {info.mass - mass0:.3e} > {drift_bound:.3e}"
            assert abs(d["mass"] - info.mass) <= reordered(ndofs), (d["mass"], info.mass)  # one sum, twice
            assert info.min_rho >= 0.0 and d["min_rho"] == info.min_rho, info
            # F(ρ^{n+1}) ≤ F(ρ^n) in exact arithmetic; the computed step moves F by ≤ scale · Σ m|ρ̂ − ρ|,
            # and each evaluation of F (n terms of ≤ 4 roundings) by γ_{n+4} · scale
            scale = _energy_scale(V, rho, phi, lam)
            f_tol = (step_err + 2 * gamma(ndofs + 4)) * scale
            assert d["free_energy"] <= f_prev + f_tol, (factor, d["free_energy"] - f_prev, f_tol)
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


@pytest.mark.parametrize("order", [1, 2])
def test_tikhonov_transport_cfl_and_characteristics(order):
    """Upwind (order 1) and MUSCL (order 2): CFL sub-steps, mass, positivity, and the mean's order in h."""
    comm = MPI.COMM_WORLD
    lam2, c, m0, v0, s_end = 1.0, 0.5, -1.0, 0.02, 1.0
    errs, hs = [], []
    # four meshes: the limited scheme's local rates between mesh pairs wander around 2 (1.7–2.4 here, the
    # limiter switching at the extremum), a least-squares fit over four is within 0.1 of the order
    for n in [100, 200, 400, 800]:
        V = _space(comm, 1, n, 3.0)
        phi = _potential(V, lambda x: 0.5 * lam2 * (x[0] - c) ** 2)
        rho = gaussian_density(V, m0, v0)
        fp = ParameterFokkerPlanck(V, 0.0, order=order)
        cfl = fp.stability_limit(phi)
        # CFL min_i m_i / sum_j w_ij max(Phi_i - Phi_j, 0), attained at the boundary node theta = -3
        # (m = h/2, w = 1/h, one downhill neighbour): (h/2) / (lam2 (3 + c - h/2))
        h = 6.0 / n
        # The difference Φ_i − Φ_j ≈ λ₂(3 + c)h of values up to λ₂(3 + c)²/2 loses (3 + c)/(2h) digits'
        # worth of u; m_i, w_ij and the formula add ≤ 20 roundings.
        assert math.isclose(cfl, 0.5 * h / (lam2 * (3.0 + c - h / 2)), rel_tol=gamma((3.0 + c) / h + 20)), cfl
        mass0 = fp.diagnostics(rho, phi)["mass"]
        n_steps, ds = 4, s_end / 4
        for k in range(n_steps):
            info: StepInfo = fp.step(rho, phi, ds)
            # MUSCL sub-steps are Δs_CFL/2 (face values ≤ 2ρ_i), upwind ones Δs_CFL
            assert info.substeps == math.ceil(ds / (cfl / order)) > 1, info
            assert info.iterations == 0
            # upwind: each value is a sum of ≤ 3 non-negative terms (2 neighbours) with ≤ 8 roundings.
            # MUSCL: the flux of an edge is one number on both sides; each value is rounded ≤ 8 times per
            # Euler stage against magnitudes ≤ 3ρ (out-faces ≤ 2ρ_i, h ≤ Δs_CFL/2), two stages and the average
            ops = 8 if order == 1 else 2 * 3 * 8 + 2
            bound = conservation((k + 1) * info.substeps, ops, n + 1, mass0)
            assert abs(info.mass - mass0) <= bound, (info.mass - mass0, bound)
            assert info.min_rho >= 0.0
        assert fp.step(rho.copy(), phi, 0.5 * cfl / order).substeps == 1
        mean = fp.diagnostics(rho, phi)["mean"][0]
        errs.append(abs(mean - (c + (m0 - c) * math.exp(-lam2 * s_end))))
        hs.append(h)
    rate = _rate(hs, errs)
    # upwind: the mean velocity is evaluated half an edge downstream, an O(h) lag; MUSCL's face value is
    # the midpoint value to O(h²) where ρ is smooth (mfpde.params.muscl), SSP-RK2 is second order in time
    assert abs(rate - order) < 0.2, f"order {order}: mean rate {rate:.3f}, errors {errs}"
    # finest error ≤ the leading term C h^order with C from the coarsest mesh (the fitted rate is the order)
    assert errs[-1] <= 1.2 * errs[0] * (hs[-1] / hs[0]) ** order, errs


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("p", [1, 2])
def test_tikhonov_positive_conservative_large_steps(p, order):
    comm = MPI.COMM_WORLD
    V = _space(comm, p, 32 if p == 1 else 16, 2.0)
    if p == 1:
        phi = _potential(V, lambda x: _dw1(x[0]))
        rho = gaussian_density(V, -0.2, 0.05)
    else:
        phi = _potential(V, lambda x: _dw2(x[0], x[1]))
        rho = gaussian_density(V, [-0.2, 0.5], 0.05 * np.eye(2))
    fp = ParameterFokkerPlanck(V, 0.0, order=order)
    cfl = fp.stability_limit(phi)
    mass0 = fp.diagnostics(rho, phi)["mass"]
    f_prev = f0 = fp.diagnostics(rho, phi)["free_energy"]
    ndofs, _ = _sizes(V)
    ops = 4 * 7  # a P1 node has ≤ 6 neighbours: a sum of ≤ 7 non-negative terms, ≤ 4 roundings each
    if order == 2:  # two Euler stages against magnitudes ≤ 3ρ (see the MUSCL test above), and the average
        ops = 2 * 3 * ops + 2
    for k in range(5):
        info = fp.step(rho, phi, 20 * cfl)
        assert info.substeps == 20 * order
        bound = conservation(info.substeps * (k + 1), ops, ndofs, mass0)
        assert abs(info.mass - mass0) <= bound and info.min_rho >= 0.0, (info, bound)
        f = fp.diagnostics(rho, phi)["free_energy"]
        # potential energy decreases under downhill transport (every edge flux c_ij ρ_{i→j} ≥ 0 goes from Φ_i to
        # Φ_j < Φ_i, upwind or MUSCL; Heun averages two such steps); the sub-steps round each m_i ρ_i by
        # γ_ops, and each F = Σ m Φ ρ by γ_{n+2}, against max |Φ|
        scale = _energy_scale(V, rho, phi, 0.0)
        assert f <= f_prev + (info.substeps * gamma(ops) + 2 * gamma(ndofs + 2)) * scale * mass0, (f - f_prev)
        f_prev = f
    # mass moved downhill: the potential energy ∫Φρ dropped by a definite amount
    assert f_prev < f0 - 0.05, (f0, f_prev)


# --------------------------------------------------------------------------------------------------
# MPI: the same numbers on 1 and 2 ranks


def _short_run(comm, lam: float, use_gmsh: bool) -> tuple[tuple[float, float, float], float]:
    """(F, cov_01, mean_1) after 5 steps, and a bound on their round-off (see the test)."""
    if use_gmsh:
        msh = dolfinx.io.gmsh.read_from_msh(str(RECTANGLE_MSH), comm, 0, gdim=2).mesh
        V = fem.functionspace(msh, ("Lagrange", 1))
    else:
        V = _space(comm, 2, 12, 2.0)
    phi = _potential(V, lambda x: _dw2(x[0], x[1]) + 0.2 * np.sin(2 * x[1]))
    rho = gaussian_density(V, [0.3, -0.4], [[0.1, 0.02], [0.02, 0.05]])
    # order 1 for λ = 0: the error propagation below needs a linear positive scheme (MUSCL is nonlinear;
    # its MPI run is checked for mass and positivity in test_tikhonov_positive_conservative_large_steps)
    fp = ParameterFokkerPlanck(V, lam, order=1)
    ds = 0.05 if lam > 0 else 0.02
    ndofs, ratio = _sizes(V)
    limit = fp.stability_limit(phi)
    err = 0.0  # Σ m|ρ̂ − ρ| accumulated: both steps are ℓ1 non-expansive on m-weighted differences
    for _ in range(5):
        info = fp.step(rho, phi, ds)
        err += implicit_step(ndofs, ds, limit, ratio) if lam > 0 else conservation(info.substeps, 28, 1, 1.0)
    d = fp.diagnostics(rho, phi)
    # F, mean and covariance are Σ m_i ρ_i f_i with |f_i| ≤ scale: each moves by ≤ scale·err, and each sum
    # of n terms adds γ_{n+4}·scale
    scale = max(_energy_scale(V, rho, phi, lam), 4.0 * 2.0**2, 1.0)
    return (d["free_energy"], float(d["cov"][0, 1]), float(d["mean"][1])), (err + gamma(ndofs + 4)) * scale


@pytest.mark.parametrize("lam", [0.1, 0.0])
@pytest.mark.parametrize("use_gmsh", [False, True])
def test_parallel_matches_serial(lam, use_gmsh):
    world, bw = _short_run(MPI.COMM_WORLD, lam, use_gmsh)
    local, bl = _short_run(MPI.COMM_SELF, lam, use_gmsh)
    # each result is within its round-off bound of the exact-arithmetic value, so they differ by ≤ the sum
    for a, b in zip(world, local, strict=True):
        assert abs(a - b) <= bw + bl, (world, local, bw + bl, MPI.COMM_WORLD.size)


# --------------------------------------------------------------------------------------------------
# Meshes, helpers, argument checks


def test_gmsh_rectangle_mesh():
    comm = MPI.COMM_WORLD
    msh = dolfinx.io.gmsh.read_from_msh(str(RECTANGLE_MSH), comm, 0, gdim=2).mesh
    V = fem.functionspace(msh, ("Lagrange", 1))
    m = lumped_mass_owned(V)
    ndofs, ratio = _sizes(V)
    # Σ m_i of n positive terms, each assembled from ≤ 6 cells of ≤ 4 roundings (vertices exact in the file)
    assert math.isclose(comm.allreduce(float(m.sum()), op=MPI.SUM), 16.0, rel_tol=gamma(ndofs + 24))
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
    ds, n_big = 1e3, 4
    limit = fp.stability_limit(phi)
    for _ in range(n_big):
        fp.step(rho, phi, ds)
    d = fp.diagnostics(rho, phi)
    # Exact arithmetic: each step contracts the distance to the discrete Gibbs measure by 1/(1 + Δs·gap);
    # the Ornstein–Uhlenbeck generator of Φ = |θ − c|²/2 has gap 1 for every λ (≥ 1/2 on this mesh and
    # box), so 4 steps leave ≤ 2 (1 + 500)^{-4} ≈ 3e-11. Round-off: 4 solves, roundoff.implicit_step.
    l1_bound = 2.0 * (1.0 + 0.5 * ds) ** -n_big + n_big * implicit_step(ndofs, ds, limit, ratio)
    l1_bound += 2 * sum_error(ndofs)
    assert d["l1_gibbs"] <= l1_bound, (d["l1_gibbs"], l1_bound)
    # KL(ρ‖p) = Σ m ρ log(ρ/p) ≤ Σ m |ρ − p| max(1, ρ/p) (|log x| ≤ |x − 1| max(1, 1/x)); evaluated, each term
    # also carries ρ·u from rounding ρ/p, and the sums γ_{N+4} of their magnitudes: KL is second order
    # only in exact arithmetic, so it is checked against ℓ1 and the mass (1) times γ_{N+4}.
    ratio_rp = comm.allreduce(float(np.max(rho.x.array[: V.dofmap.index_map.size_local] / d["gibbs"])), op=MPI.MAX)
    kl_bound = d["l1_gibbs"] * max(1.0, ratio_rp) * (1 + 2 * gamma(ndofs + 4)) + 2 * gamma(ndofs + 4)
    assert abs(d["kl"]) <= kl_bound, (d["kl"], kl_bound)
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
    N, _ = _sizes(V)
    # a sum of N positive lumped masses, each from ≤ 6 cells of ≤ 4 roundings
    assert np.all(m > 0) and math.isclose(comm.allreduce(float(m.sum()), op=MPI.SUM), 16.0, rel_tol=gamma(N + 24))
    rho = gaussian_density(V, [0.1, -0.2], [[0.2, 0.05], [0.05, 0.1]])
    # normalised by Σ m e (N terms), then Σ m ρ again: 2N + 1 roundings of positive terms
    assert math.isclose(comm.allreduce(float(m @ rho.x.array[:n]), op=MPI.SUM), 1.0, rel_tol=gamma(2 * N + 1))
    phi = _potential(V, lambda x: 2.0 * x[0] ** 2 + 0.5 * x[1] ** 2)
    g = gibbs(V, phi, 0.5)
    assert math.isclose(comm.allreduce(float(m @ g.x.array[:n]), op=MPI.SUM), 1.0, rel_tol=gamma(2 * N + 1))
    fp = ParameterFokkerPlanck(V, 0.5)
    d = fp.diagnostics(g, phi)
    # diagnostics recompute p ∝ e^{−Φ/λ} by the formula of gibbs(): p and g agree to γ_{2N+4} each way,
    # so |log(g/p)| ≤ 2γ_{2N+4} and KL, ℓ1 (sums of N terms of mass 1) are below 2γ_{2N+4} + γ_N
    tol = 2 * gamma(2 * N + 4) + gamma(N)
    assert abs(d["kl"]) <= tol and d["l1_gibbs"] <= tol, (d["kl"], d["l1_gibbs"], tol)
    # D = ½ Σ J_ij (ξ_i − ξ_j): at g every flux J_ij and every Δξ vanish in exact arithmetic. |J| ≤ γ_8 times
    # the rates out of ρ (Σ ≤ mass / stability limit); ξ = Φ + λ log g is constant, so |Δξ| ≤ γ_6 (2 max|Φ| +
    # 2λ max|log g|): D is a product of two round-off errors.
    flux = 2 * gamma(8) / fp.stability_limit(phi)
    dxi = gamma(6) * 2 * _energy_scale(V, g, phi, 0.5)
    assert abs(d["dissipation"]) <= flux * dxi, (d["dissipation"], flux * dxi)
    assert np.allclose(d["gibbs"], g.x.array[:n], rtol=2 * gamma(2 * N + 4), atol=0)
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
    ksp_rtol = 1e-13
    opts = {"ksp_type": "gmres", "pc_type": "jacobi", "ksp_rtol": ksp_rtol, "ksp_atol": 1e-16}
    fp_it = ParameterFokkerPlanck(V, 0.2, petsc_options=opts, prefix="test_fp_it_")
    info = fp_it.step(rho_it, phi, 0.05)
    assert info.iterations > 1
    # Both solve A ρ = b, b = M_L ρ⁰. The M-matrix turns a residual r into Σ m|error| ≤ ‖r‖₁ (roundoff.py).
    # GMRES stops at ‖D⁻¹r‖₂ ≤ rtol ‖D⁻¹b‖₂ (left Jacobi, D = diag A ∈ [min m, max m (1 + 2Δs/Δs_stab)]), so
    # ‖r‖₁ ≤ √N ‖r‖₂ ≤ √N rtol κ_D ‖b‖₂ ≤ √N rtol κ_D Σ|b|; LU adds roundoff.implicit_step.
    N, ratio = _sizes(V)
    limit = fp_it.stability_limit(phi)
    kappa_d = ratio * (1 + 2 * 0.05 / limit)
    n = V.dofmap.index_map.size_local
    m = lumped_mass_owned(V)
    diff = comm.allreduce(float(m @ np.abs(rho_it.x.array[:n] - rho_lu.x.array[:n])), op=MPI.SUM)
    bound = math.sqrt(N) * ksp_rtol * kappa_d + implicit_step(N, 0.05, limit, ratio)
    assert diff <= bound, (diff, bound)
    bad = {"ksp_type": "gmres", "pc_type": "none", "ksp_max_it": 1, "ksp_rtol": 1e-14}
    fp = ParameterFokkerPlanck(V, 0.2, petsc_options=bad, prefix="test_fp_bad_")
    with pytest.raises(SolverError, match="did not converge"):
        fp.step(rho_it, phi, 0.05)
