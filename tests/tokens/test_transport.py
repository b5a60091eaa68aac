"""Tests for mfpde.transport (upwind DG / SSP-RK3 token McKean–Vlasov solver), mfpde.data and the transport CLI.

Checks of theory §7: 1 (mass and positivity), 2 (Gaussian exactness, §6.1, with convergence orders),
9 (finite-N particles vs the PDE, rate N^{-1/2}), plus rank-count independence (interface.md).

Run serially (``pytest tests/tokens/test_transport.py``) and on 2 ranks
(``mpiexec -n 2 python -m mpi4py -m pytest -m ranks tests/tokens/test_transport.py``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from mpi4py import MPI

import dolfinx.fem
import numpy as np
import pytest
import ufl
from roundoff import conservation, gamma, reordered

from mfpde.cli import main
from mfpde.config import ConfigError
from mfpde.exact import gaussian_transport
from mfpde.fitting import fit_order
from mfpde.heads import HeadMeasure
from mfpde.mesh import box
from mfpde.tokens.box.data import Sample, _deposit, fill_density
from mfpde.tokens.box.particles import transport_particles
from mfpde.tokens.box.readout import readout_function
from mfpde.tokens.box.transport import SampleOperator, TokenTransport

pytestmark = pytest.mark.ranks  # the rank count can change what it checks: run again under mpiexec

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "demos" / "transport_small.toml"

# Head distributions (A = aI, V = vI), reduced: c_k = ∫_{a = a_k} v dρ.  ā = Σ c, b̄ = Σ a c (theory §6.1).
CONTRACTING = HeadMeasure(np.array([-0.5, 0.3]), np.array([0.5, 0.25]))  # ā = 0.75, b̄ = -0.175
EXPANDING = HeadMeasure(np.array([0.4, 0.8]), np.array([0.5, 0.5]))  # ā = 1, b̄ = 0.6: t* = 3.3 T for σ0² = 1/4
EXPANDING_2D = HeadMeasure(np.array([0.2, 0.4]), np.array([0.25, 0.25]))  # ā = 0.5, b̄ = 0.15
INWARD = HeadMeasure(np.array([-1.0, -0.5]), np.array([0.5, 0.5]))  # every head contracting: V·n < 0 on ∂Ω

M0_2D = np.array([0.2, -0.1])
S0_2D = np.array([[0.25, 0.1], [0.1, 0.16]])  # non-diagonal


def _mu0(tt: TokenTransport, mean, cov) -> dolfinx.fem.Function:
    u = dolfinx.fem.Function(tt.W, name="mu")
    fill_density(Sample("gaussian", {"mean": np.atleast_1d(np.asarray(mean, float)),
                                     "cov": np.atleast_2d(np.asarray(cov, float))}, 0.0), u, tt.mass)
    return u


def _transport(comm, bounds, cells, degree, mean, cov, heads, T, steps, cell="quadrilateral", g=None,
               callback=None):
    tt = TokenTransport(box(comm, bounds, cells, cell), degree)
    u = _mu0(tt, mean, cov)
    return tt, u, tt.solve(u, heads, T, steps, g, callback)


def _closed_form(m0, S0, heads: HeadMeasure, T: float) -> tuple[np.ndarray, np.ndarray]:
    """Theory §6.1 for A = aI, V = vI: Σ(T) = Σ0 (I − 2b̄TΣ0)⁻¹, m(T) = e^{āT} (I − 2b̄TΣ0)^{-1/2} m0."""
    return gaussian_transport(m0, S0, heads.abar, heads.bbar, T)


def _ndofs(tt: TokenTransport) -> int:
    """Global number of DG dofs: the length of every sum over μ_h (mass, moments)."""
    return tt.W.dofmap.index_map.size_global * tt.W.dofmap.index_map_bs


def _ops(tt: TokenTransport) -> int:
    """Roundings one SSP-RK3 sub-step applies to a dof, counted generously: 3 stages, each assembling a
    cell's volume and facet terms ((2d + 1) integrals of (k + 2)^d quadrature points, ≤ 4 roundings each),
    the per-cell mass solve (2 (k + 1)^d), the update and the limiter (≤ 10)."""
    d, k = tt.msh.geometry.dim, tt.degree
    return 3 * (4 * (2 * d + 1) * (k + 2) ** d + 2 * (k + 1) ** d + 10)


def _mass_roundoff(tt: TokenTransport, rep) -> float:
    """|mass_T + outflow − mass_0| in floating point: every sub-step is conservative in exact arithmetic
    (the outflow is integrated with the same stage weights), roundoff.conservation of its operations."""
    return conservation(rep.substeps, _ops(tt), _ndofs(tt), rep.mass_0)


def _rate(h, err) -> float:
    return float(fit_order(h, err))


def _fmt(xs) -> str:
    return ", ".join(f"{x:.2e}" for x in xs)


# --------------------------------------------------------------------------------------------------
# §7.1: mass and positivity


@pytest.mark.parametrize("degree", [0, 1])
@pytest.mark.parametrize(("bounds", "cells", "cell", "mean", "cov", "steps"), [
    ([[-4.0, 4.0]], [80], "quadrilateral", [0.2], [[0.25]], 20),
    ([[-4.0, 4.0]] * 2, [16, 16], "quadrilateral", M0_2D, S0_2D, 8),
    ([[-4.0, 4.0]] * 2, [12, 12], "triangle", M0_2D, S0_2D, 6),
], ids=["d1", "d2-quad", "d2-tri"])
def test_mass_conserved_and_positive(degree, bounds, cells, cell, mean, cov, steps):
    """Contracting heads, Gaussian well inside the box: nothing leaves Ω, so the mass is constant to round-off
    at every depth step, the outflow accounting closes, and μ_h ≥ 0 at every step."""
    tt = TokenTransport(box(MPI.COMM_WORLD, bounds, cells, cell), degree)
    masses, mins = [], []

    def cb(k, t, u):
        masses.append(tt.mass(u))
        mins.append(tt.min_density(u))

    u = _mu0(tt, mean, cov)
    N = _ndofs(tt)
    assert tt.mass(u) == pytest.approx(1.0, abs=gamma(2 * N + 1))  # Σ, a division, Σ again
    assert tt.min_density(u) >= 0.0
    rep = tt.solve(u, INWARD, 1.0, steps, callback=cb)
    assert len(masses) == steps
    bound = _mass_roundoff(tt, rep)
    drift = max(abs(m - rep.mass_0) for m in masses)
    assert drift <= bound, f"mass drift {drift:.2e} > round-off bound {bound:.2e}"
    assert rep.mass_error * rep.mass_0 <= bound, rep.mass_error
    assert abs(rep.mass_T + rep.outflow - rep.mass_0) <= bound
    # nothing reaches ∂Ω: the outflow is the round-off of a sum of the Gaussian tail (≈ e^{-60}) rates
    assert rep.outflow <= bound
    assert min(mins) >= 0.0 and rep.min_density >= 0.0, f"min density {min(mins):.3e}"
    assert rep.substeps >= steps
    # the heads really move μ: the mean goes at least half-way to the exact m_T (ā = 1, b̄ = -0.75)
    m_ex = _closed_form(mean, cov, INWARD, 1.0)[0]
    assert np.linalg.norm(rep.mean_T - m_ex) < 0.5 * np.linalg.norm(m_ex - np.asarray(mean)), (rep.mean_T, m_ex)


@pytest.mark.parametrize("degree", [0, 1])
@pytest.mark.parametrize(("bounds", "cells", "mean", "cov"), [
    ([[-4.0, 4.0]], [80], [0.2], [[0.25]]), ([[-4.0, 4.0]] * 2, [16, 16], M0_2D, S0_2D)], ids=["d1", "d2"])
def test_ssp_schemes_positive_at_their_larger_step(degree, bounds, cells, mean, cov):
    """depth.scheme: SSP(4,3) and SSP(10,4) take C = 2 and 6 times the positive Euler step (two depth steps, so
    that the CFL bound sets the sub-steps) and keep μ_h ≥ 0 (the limiter's guarantee for DG1) and the mass."""
    from mfpde.tokens import rk

    subs = {}
    for name in rk.DEPTH_SCHEMES:
        tt = TokenTransport(box(MPI.COMM_WORLD, bounds, cells), degree)
        tt.scheme = rk.SCHEMES[name]
        mins = []
        u = _mu0(tt, mean, cov)
        rep = tt.solve(u, INWARD, 1.0, 2, callback=lambda k, t, u, tt=tt, mins=mins: mins.append(tt.min_density(u)))
        assert min(mins) >= 0.0 and rep.min_density >= 0.0, (name, min(mins))
        assert abs(rep.mass_T + rep.outflow - rep.mass_0) <= _mass_roundoff(tt, rep), name
        subs[name] = rep.substeps
    # ⌈dt/(C Δt)⌉ per depth step: at most ⌈n/C⌉ + 1 where SSP-RK3 takes n (the velocity differs slightly)
    assert subs["ssp_rk3"] >= 6, subs
    assert subs["ssp_rk3_4"] <= subs["ssp_rk3"] / 2 + 2 and subs["ssp_rk4_10"] <= subs["ssp_rk3"] / 6 + 2, subs


@pytest.mark.parametrize("degree", [0, 1])
@pytest.mark.parametrize("d", [1, 2])
def test_outflow_accounting(degree, d):
    """Expanding heads push a Gaussian near the boundary out of Ω: mass_T + outflow = mass_0 to round-off."""
    tt = TokenTransport(box(MPI.COMM_WORLD, [[-2.0, 2.0]] * d, [40] if d == 1 else [12, 12]), degree)
    u = _mu0(tt, [1.0] * d, 0.25 * np.eye(d))
    mins = []
    rep = tt.solve(u, EXPANDING, 1.0, 10, callback=lambda k, t, u: mins.append(tt.min_density(u)))
    assert rep.outflow > 0.05, f"the test needs real outflow, got {rep.outflow:.3e}"
    bound = _mass_roundoff(tt, rep)
    assert abs(rep.mass_T + rep.outflow - rep.mass_0) <= bound, (rep.mass_T + rep.outflow - rep.mass_0, bound)
    assert rep.mass_error == pytest.approx(rep.outflow / rep.mass_0, abs=bound / rep.mass_0)
    assert min(mins) >= 0.0


# --------------------------------------------------------------------------------------------------
# §7.2: Gaussian inputs stay Gaussian (theory §6.1), with the convergence order


# d = 1 on [-5, 5], joint refinement h ∝ Δt (steps = cells/4), T = 1, m0 = 0.3, σ0² = 1/4.
# Measured error max(|Δm|, |Δσ²|) for cells 60, 120, 240:
#   contracting DG0 4.7e-2, 2.4e-2, 1.2e-2 (rate 0.99); DG1 3.3e-4, 8.7e-5, 2.2e-5 (1.96; the mean alone 2.44)
#   expanding   DG0 2.0e-1, 8.7e-2, 4.2e-2 (1.13);      DG1 2.5e-3, 6.1e-4, 1.5e-4 (2.02)
@pytest.mark.parametrize(("degree", "heads", "tol", "finest"), [
    (0, CONTRACTING, 0.15, 1.5e-2),
    (0, EXPANDING, 0.2, 5e-2),
    (1, CONTRACTING, 0.2, 3e-5),
    (1, EXPANDING, 0.2, 2e-4),
], ids=["dg0-contracting", "dg0-expanding", "dg1-contracting", "dg1-expanding"])
def test_gaussian_exact_d1(degree, heads, tol, finest):
    m0, s0, T = 0.3, 0.25, 1.0
    m_ex, S_ex = _closed_form(m0, s0, heads, T)
    assert (S_ex[0, 0] < s0) == (heads.bbar < 0)
    hs, em, es = [], [], []
    for n in (60, 120, 240):
        tt, _, rep = _transport(MPI.COMM_WORLD, [[-5.0, 5.0]], [n], degree, m0, s0, heads, T, n // 4)
        hs.append(10.0 / n)
        em.append(abs(rep.mean_T[0] - m_ex[0]))
        es.append(abs(rep.cov_T[0][0] - S_ex[0, 0]))
        assert abs(rep.mass_T + rep.outflow - rep.mass_0) <= _mass_roundoff(tt, rep) and rep.outflow < 1e-4
    err = np.maximum(em, es)
    rate = _rate(hs, err)
    msg = f"DG{degree} d=1: rate {rate:.3f}, errors {_fmt(err)} (mean {_fmt(em)}, var {_fmt(es)})"
    assert abs(rate - (degree + 1)) <= tol, msg
    assert err[-1] <= finest, msg
    assert np.all(np.diff(err) < 0), msg


# d = 2 on [-4, 4]², non-diagonal Σ0, cells 16, 24, 32 per axis, steps = cells/2, T = 1.
# Measured max(|Δm|, |ΔΣ|) at 16, 24, 32:
#   DG0 contracting 8.8e-2, 6.1e-2, 4.6e-2 (rate 0.93); expanding 8.6e-2, 5.5e-2, 4.0e-2 (1.10)
#   DG1 (positivity limiter on) contracting 1.1e-2, 2.2e-3, 4.0e-4 (4.7); expanding 1.0e-2, 2.5e-3, 1.1e-3 (3.3):
#       pre-asymptotic: on these meshes the Zhang–Shu limiter clips the undershoots of the coarse Gaussian
#       tails and its error decays fast; the asymptotic O(h²) regime starts near h ≈ 0.4σ (48–64 cells).
#   DG1 with the limiter off: contracting 3.3e-3, 1.3e-3, 7.5e-4 (2.16); expanding 5.2e-3, 2.0e-3, 1.0e-3 (2.37).
@pytest.mark.parametrize(("degree", "heads", "limiter", "bounds_rate", "finest"), [
    (0, CONTRACTING, True, (0.85, 1.15), 6e-2),
    (0, EXPANDING_2D, True, (0.85, 1.15), 5e-2),
    (1, CONTRACTING, True, (1.8, None), 8e-4),
    (1, EXPANDING_2D, True, (1.8, None), 2e-3),
    (1, CONTRACTING, False, (1.8, None), 1.2e-3),
    (1, EXPANDING_2D, False, (1.8, None), 1.5e-3),
], ids=["dg0-contracting", "dg0-expanding", "dg1-contracting", "dg1-expanding", "dg1-nolimiter-contracting",
        "dg1-nolimiter-expanding"])
def test_gaussian_exact_d2(degree, heads, limiter, bounds_rate, finest, monkeypatch):
    T = 1.0
    m_ex, S_ex = _closed_form(M0_2D, S0_2D, heads, T)
    if not limiter:
        monkeypatch.setattr(SampleOperator, "limit", lambda self, u: None)
    hs, em, es = [], [], []
    for n in (16, 24, 32):
        tt, _, rep = _transport(MPI.COMM_WORLD, [[-4.0, 4.0]] * 2, [n, n], degree, M0_2D, S0_2D, heads, T, n // 2)
        assert tt.vgrid is not None  # tensor kernel path
        hs.append(8.0 / n)
        em.append(np.abs(np.array(rep.mean_T) - m_ex).max())
        es.append(np.abs(np.array(rep.cov_T) - S_ex).max())
        assert abs(rep.mass_T + rep.outflow - rep.mass_0) <= _mass_roundoff(tt, rep) and rep.outflow < 1e-4
        # (xc w)ᵀ xc: entries (i, j) and (j, i) are one dot product of N terms in two orders at most
        assert np.allclose(rep.cov_T, np.transpose(rep.cov_T), rtol=0, atol=reordered(_ndofs(tt), 16.0))
    err = np.maximum(em, es)
    rate = _rate(hs, err)
    msg = (f"DG{degree} d=2 (limiter {'on' if limiter else 'off'}): rate {rate:.3f}, errors {_fmt(err)} "
           f"(mean {_fmt(em)}, cov {_fmt(es)})")
    lo, hi = bounds_rate
    assert rate >= lo, msg
    assert hi is None or rate <= hi, msg
    assert err[-1] <= finest, msg
    assert np.all(np.diff(err) < 0), msg


# --------------------------------------------------------------------------------------------------
# §7.9: N particles vs the PDE, rate N^{-1/2}

PARTICLE_HEADS = HeadMeasure(np.array([-0.5]), np.array([0.75]))  # one distinct a: one softmax per evaluation


def _particle_yhat(N: int, seed, m0: float, s0: float, T: float, steps: int) -> float:
    """ŷ_N = mean of X_T for N iid tokens from N(m0, s0), dX/dt = V[μ^N; ρ](X) by RK4 in depth."""
    X = np.random.default_rng(seed).normal(m0, math.sqrt(s0), size=(N, 1))
    return float(transport_particles(X, np.full(N, 1.0 / N), PARTICLE_HEADS, T, steps)[:, 0].mean())


def test_particles_agree_with_pde_at_rate_half():
    m0, s0, T = 0.3, 0.25, 1.0
    # fine PDE reference: DG1, 400 cells, 100 depth steps, readout g(x) = x
    _, _, rep = _transport(MPI.COMM_WORLD, [[-5.0, 5.0]], [400], 1, m0, s0, PARTICLE_HEADS, T, 100,
                           g=readout_function("mean"))
    y_pde = rep.yhat
    y_exact = _closed_form(m0, s0, PARTICLE_HEADS, T)[0][0]
    assert abs(y_pde - y_exact) < 1e-5, (y_pde, y_exact)
    # RK4 with 4 depth steps is converged far below the sampling error (|Δ| ~ 1e-6 against 40 steps)
    assert abs(_particle_yhat(200, 0, m0, s0, T, 4) - _particle_yhat(200, 0, m0, s0, T, 40)) < 1e-5
    Ns = np.array([50, 100, 200, 400, 800])
    comm = MPI.COMM_WORLD
    errs = []
    for N in Ns:
        seeds = max(40, 16000 // N)  # more seeds where they are cheap; split over the ranks, same set on any count
        local = sum(abs(_particle_yhat(int(N), (2024, int(N), s), m0, s0, T, 4) - y_pde)
                    for s in range(comm.rank, seeds, comm.size))
        errs.append(comm.allreduce(local, op=MPI.SUM) / seeds)
    slope = _rate(Ns, errs)
    msg = f"slope {slope:.3f}, E|ŷ_N − ŷ_PDE| = {_fmt(errs)} for N = {Ns.tolist()}"
    assert abs(slope + 0.5) <= 0.15, msg
    # the constant: E|ŷ_N − ŷ| ≈ sqrt(2/π) |∂ŷ/∂m0| σ0 / √N to leading order, ∂ŷ/∂m0 = m_T/m0
    c_pred = math.sqrt(2 / math.pi) * (y_exact / m0) * math.sqrt(s0)
    assert 0.5 * c_pred / math.sqrt(Ns[-1]) < errs[-1] < 2.0 * c_pred / math.sqrt(Ns[-1]), (msg, c_pred)


# --------------------------------------------------------------------------------------------------
# Rank-count independence: COMM_WORLD vs COMM_SELF (each rank a full serial solve)


@pytest.mark.parametrize(("bounds", "cells", "cell", "degree", "mean", "cov"), [
    ([[-4.0, 4.0]], [64], "quadrilateral", 1, [0.3], [[0.25]]),
    ([[-4.0, 4.0]] * 2, [12, 12], "quadrilateral", 1, M0_2D, S0_2D),
    ([[-4.0, 4.0]] * 2, [10, 10], "triangle", 0, M0_2D, S0_2D),  # direct kernel path
], ids=["d1-dg1", "d2-quad-dg1", "d2-tri-dg0"])
def test_same_result_on_any_number_of_ranks(bounds, cells, cell, degree, mean, cov):
    d = len(bounds)
    g = readout_function("linear", [1.0, -0.5][:d], 0.25)
    out = {}
    for name, comm in (("world", MPI.COMM_WORLD), ("self", MPI.COMM_SELF)):
        tt, _, rep = _transport(comm, bounds, cells, degree, mean, cov, CONTRACTING, 0.5, 6, cell=cell, g=g)
        if cell == "triangle":
            assert tt.vgrid is None
        out[name] = rep
    w, s = out["world"], out["self"]
    assert w.substeps == s.substeps
    # Each run is its exact-arithmetic result plus round-off: every sub-step perturbs μ by a relative
    # ε_run = γ_ops (roundoff.conservation), which the flow to T amplifies by at most its condition number
    # κ. κ is estimated by finite differences (Higham §15.1): the same solve from μ_0 (1 + δ ξ), ξ = ±1.
    delta = 1e-7
    tt1 = TokenTransport(box(MPI.COMM_SELF, bounds, cells, cell), degree)
    u1 = _mu0(tt1, mean, cov)
    xi = np.where(np.arange(u1.x.array.size) % 2 == 0, 1.0, -1.0)
    u1.x.array[:] *= 1.0 + delta * xi
    p = tt1.solve(u1, CONTRACTING, 0.5, 6, g)
    outs = lambda r: np.concatenate([[r.yhat, r.mass_T], r.mean_T, np.ravel(r.cov_T)])  # noqa: E731
    kappa = max(1.0, float(np.max(np.abs(outs(p) - outs(s)))) / delta)
    eps_run = conservation(s.substeps, _ops(tt1), _ndofs(tt1), 1.0)
    bound = 2 * kappa * eps_run  # both runs
    diff = np.abs(outs(w) - outs(s))
    assert np.all(diff <= bound), (diff, bound, kappa, MPI.COMM_WORLD.size)
    # every rank computed the same serial answer
    assert MPI.COMM_WORLD.allreduce(s.yhat, op=MPI.MAX) == MPI.COMM_WORLD.allreduce(s.yhat, op=MPI.MIN)


# --------------------------------------------------------------------------------------------------
# Solver arguments and readouts


def test_solver_arguments_and_readouts():
    dom = box(MPI.COMM_WORLD, [[-1.0, 1.0]], [4])
    with pytest.raises(ValueError):
        TokenTransport(dom, 2)
    x = np.array([[1.0, 2.0], [-3.0, 0.5]])
    assert np.array_equal(readout_function("mean")(x), [1.0, -3.0])
    assert np.array_equal(readout_function("second_moment")(x), [5.0, 9.25])
    assert np.allclose(readout_function("linear", [2.0, -1.0], 0.5)(x), [0.5, -6.0])
    with pytest.raises(ValueError):
        readout_function("median")


# --------------------------------------------------------------------------------------------------
# data: input measures


def _integral(u: dolfinx.fem.Function) -> float:
    """∫ u dx by quadrature, independent of the solver's lumped mass."""
    return u.function_space.mesh.comm.allreduce(dolfinx.fem.assemble_scalar(dolfinx.fem.form(u * ufl.dx)),
                                                op=MPI.SUM)


def _cell_integrals(u: dolfinx.fem.Function) -> tuple[np.ndarray, np.ndarray]:
    """(midpoints, ∫_K u) of the owned cells."""
    msh = u.function_space.mesh
    Q = dolfinx.fem.functionspace(msh, ("DG", 0))
    b = dolfinx.fem.Function(Q)
    dolfinx.fem.assemble_vector(b.x.array, dolfinx.fem.form(u * ufl.TestFunction(Q) * ufl.dx))
    n = Q.dofmap.index_map.size_local
    return Q.tabulate_dof_coordinates()[:n], b.x.array[:n].copy()


@pytest.mark.parametrize("degree", [0, 1])
@pytest.mark.parametrize("d", [1, 2])
def test_gaussian_input_interpolated_and_normalised(degree, d):
    bounds = [[-3.0, 3.0]] * d
    tt = TokenTransport(box(MPI.COMM_WORLD, bounds, [30] if d == 1 else [16, 12]), degree)
    mean = np.array([0.4, -0.3][:d])
    cov = np.array([[0.5, 0.2], [0.2, 0.4]])[:d, :d]
    u = _mu0(tt, mean, cov)
    N = _ndofs(tt)
    # ∫u by quadrature (≤ (k + 2)^d points per cell, 4 roundings each) of a function of mass 1 (2N + 1)
    assert _integral(u) == pytest.approx(1.0, abs=gamma(2 * N + 1 + 4 * N * (degree + 2) ** d))
    assert tt.mass(u) == pytest.approx(1.0, abs=gamma(2 * N + 1))
    x = tt.W.tabulate_dof_coordinates()[:, :d] - mean
    q = 0.5 * np.einsum("ni,ij,nj->n", x, np.linalg.inv(cov), x)
    g = np.exp(-q)
    ratio = u.x.array / g  # interpolation at the DG nodes, then one global scale
    # two evaluations of e^{−q}: q (≤ 3d² roundings, also in the inverse) is off by γ_{3d²+4} q, which exp
    # turns into a relative error; the scale, exp and the division add ≤ 4 roundings
    qmax = MPI.COMM_WORLD.allreduce(float(q.max()), op=MPI.MAX)
    assert np.allclose(ratio, ratio[0], rtol=2 * gamma(3 * d * d + 4) * qmax + gamma(8), atol=0)
    scale = MPI.COMM_WORLD.allreduce(ratio[0], op=MPI.MAX)
    assert scale == pytest.approx(MPI.COMM_WORLD.allreduce(ratio[0], op=MPI.MIN),
                                  rel=2 * gamma(3 * d * d + 4) * qmax + gamma(8))
    norm = 1.0 / math.sqrt((2 * math.pi) ** d * np.linalg.det(cov))  # the scale is 1/∫(interpolant) ≈ this
    assert scale == pytest.approx(norm, rel=0.05 if degree == 0 else 0.02)


@pytest.mark.parametrize("degree", [0, 1])
def test_digits_image_input(degree):
    """An 8×8 digit on the unit square with 16×16 cells: mass 1, values ∝ pixels, row 0 at the top."""
    from sklearn.datasets import load_digits

    img = load_digits().images[0]
    tt = TokenTransport(box(MPI.COMM_WORLD, [[0.0, 1.0], [0.0, 1.0]], [16, 16]), degree)
    u = dolfinx.fem.Function(tt.W)
    fill_density(Sample("image", {"image": img}, 1.0), u, tt.mass)
    N = _ndofs(tt)
    # the image is set cell-wise and normalised by the lumped mass (2N + 1 roundings); quadrature ≤ 4N (k+2)²
    tol = gamma(2 * N + 1 + 4 * N * (degree + 2) ** 2)
    assert _integral(u) == pytest.approx(1.0, abs=tol)
    mid, integ = _cell_integrals(u)
    j = np.floor(8 * mid[:, 0]).astype(int)
    i = 7 - np.floor(8 * mid[:, 1]).astype(int)  # pixel (i, j) covers y in [1 − (i+1)/8, 1 − i/8]
    expect = img[i, j] / img.sum()  # the pixel's share of the mass, spread over its 2×2 cells
    assert np.allclose(integ, expect / 4.0, rtol=tol, atol=0)
    # piecewise constant: the value on each cell is 64 img[i, j] / Σ img
    dofs = tt.W.dofmap.list[: len(mid)]
    vals = u.x.array[dofs]
    assert np.allclose(vals, (64.0 * img[i, j] / img.sum())[:, None], rtol=tol, atol=0)
    per_pixel = np.zeros((8, 8))
    np.add.at(per_pixel, (i, j), integ)
    per_pixel = MPI.COMM_WORLD.allreduce(per_pixel, op=MPI.SUM)
    assert np.allclose(per_pixel, img / img.sum(), rtol=tol + gamma(4), atol=0)
    assert per_pixel[0, 0] == 0.0 and per_pixel[0, 3] > 0  # top row: [0, 0, 5, 13, ...]


def _owned_mass_dg0(u0: dolfinx.fem.Function) -> float:
    Q = u0.function_space
    n = Q.dofmap.index_map.size_local
    vol = dolfinx.fem.Function(Q)
    dolfinx.fem.assemble_vector(vol.x.array, dolfinx.fem.form(ufl.TestFunction(Q) * ufl.dx))
    return Q.mesh.comm.allreduce(float(vol.x.array[:n] @ u0.x.array[:n]), op=MPI.SUM)


@pytest.mark.parametrize(("d", "cell"), [(1, "quadrilateral"), (2, "quadrilateral"), (2, "triangle")])
def test_deposit_preserves_mass_exactly(d, cell):
    """Σ_K |K| u0_K = Σ w to round-off; points on vertices, edges and corners (also rank boundaries) count once."""
    msh = box(MPI.COMM_WORLD, [[0.0, 1.0]] * d, [8] * d, cell).mesh
    Q = dolfinx.fem.functionspace(msh, ("DG", 0))
    rng = np.random.default_rng(5)
    grid = np.array([0.0, 0.125, 0.5, 0.625, 1.0])  # cell boundaries (h = 1/8), including ∂Ω
    special = np.stack(np.meshgrid(*[grid] * d, indexing="ij"), axis=-1).reshape(-1, d)
    inner = rng.uniform(0, 1, size=(300, d))
    for pts in (special, inner, np.concatenate([inner, special])):
        w = rng.uniform(0.1, 2.0, size=len(pts))
        u0 = dolfinx.fem.Function(Q)
        _deposit(u0, pts, w)
        total = _owned_mass_dg0(u0)
        # per cell Σ w / |K| · |K| (n points, 2 roundings each), then Σ over 8^d cells, and Σ w itself
        assert abs(total - w.sum()) <= gamma(2 * len(pts) + 8**d + 4) * w.sum(), (total, w.sum(), len(pts))
        assert np.all(u0.x.array >= 0)
    if cell == "quadrilateral":
        # points inside a cell land in that cell: per-cell masses exactly
        w = rng.uniform(0.1, 2.0, size=len(inner))
        u0 = dolfinx.fem.Function(Q)
        _deposit(u0, inner, w)
        n = Q.dofmap.index_map.size_local
        mid = Q.tabulate_dof_coordinates()[:n, :d]

        def key(x):
            return np.ravel_multi_index(tuple(np.floor(8 * x[:, k]).astype(int) for k in range(d)), (8,) * d)

        expect = np.bincount(key(inner), weights=w, minlength=8**d)
        assert np.allclose(u0.x.array[:n] / 8**d, expect[key(mid)], rtol=gamma(2 * len(inner) + 4), atol=0)


def test_points_fill_density_and_outside_point():
    tt = TokenTransport(box(MPI.COMM_WORLD, [[-1.0, 1.0], [-1.0, 1.0]], [6, 6]), 1)
    pts = np.array([[0.1, 0.2], [-0.9, 0.95], [1.0, -1.0], [0.0, 0.0]])
    w = np.array([1.0, 2.0, 0.5, 0.25])
    u = dolfinx.fem.Function(tt.W)
    fill_density(Sample("points", {"points": pts, "weights": w}, 0.0), u, tt.mass)
    N = _ndofs(tt)
    tol = gamma(2 * N + 1 + 4 * N * 9 + 2 * len(pts))  # deposit, normalisation, quadrature (9 points)
    assert _integral(u) == pytest.approx(1.0, abs=tol)
    assert tt.min_density(u) >= 0
    # piecewise constant on every cell (DG0 deposit interpolated into DG1): one value, ≤ 4 roundings apart
    ncell = tt.msh.topology.index_map(2).size_local
    vals = u.x.array[tt.W.dofmap.list[:ncell]]
    assert np.allclose(vals, vals[:, :1], rtol=gamma(4), atol=0)
    # the cell holding (0.1, 0.2) has mass w0/Σw
    mid, integ = _cell_integrals(u)
    hit = (np.abs(mid[:, 0] - (1 / 6)) < 1e-9) & (np.abs(mid[:, 1] - (1 / 6)) < 1e-9)
    got = MPI.COMM_WORLD.allreduce(float(integ[hit].sum()), op=MPI.SUM)
    assert got == pytest.approx(w[0] / w.sum(), rel=tol)
    bad = np.concatenate([pts, [[1.2, 0.0]]])
    with pytest.raises(ConfigError, match="outside"):
        fill_density(Sample("points", {"points": bad, "weights": np.ones(len(bad))}, 0.0), u, tt.mass)
    with pytest.raises(ConfigError, match="outside"):
        _deposit(dolfinx.fem.Function(tt.Q), np.array([[0.0, -1.0 - 1e-6]]), np.ones(1))


# --------------------------------------------------------------------------------------------------
# CLI


def _write(path: Path, text: str) -> None:
    if MPI.COMM_WORLD.rank == 0:
        path.write_text(text)
    MPI.COMM_WORLD.Barrier()


def test_cli_transport_report(tempdir):
    assert main(["transport", str(DEMO), "--out", str(tempdir)]) == 0
    report = json.loads((tempdir / "report.json").read_text())
    assert report["status"] == "ok" and report["command"] == "transport"
    assert report["comm_size"] == MPI.COMM_WORLD.size
    for key in ("version", "wall_s"):
        assert key in report
    (s,) = report["samples"]
    for key in ("mass_T", "mass_error", "min_density", "outflow", "mean_T", "cov_T", "yhat"):
        assert key in s, key
    assert len(s["mean_T"]) == 1 and np.shape(s["cov_T"]) == (1, 1)
    # demos/transport_small.toml: 200 DG1 cells in d = 1; the sub-steps are in the report
    tt = TokenTransport(box(MPI.COMM_SELF, [[-4.0, 4.0]], [200]), 1)
    mass_bound = conservation(s["substeps"], _ops(tt), _ndofs(tt), 1.0)
    assert s["min_density"] >= 0 and s["mass_error"] <= mass_bound
    assert abs(s["mass_T"] + s["outflow"] - 1.0) <= mass_bound
    # demo: heads (a, v) = (-0.5, 1), (0.3, 0.5) with weights 1/2; μ0 = N(0.3, 0.25); readout mean; T = 1
    heads = HeadMeasure(np.array([-0.5, 0.3]), np.array([0.5, 0.25]))
    m_ex, S_ex = _closed_form(0.3, 0.25, heads, 1.0)
    assert abs(s["mean_T"][0] - m_ex[0]) < 2e-4 and abs(s["cov_T"][0][0] - S_ex[0, 0]) < 5e-4, (s, m_ex, S_ex)
    # ŷ = Σ w x and mean · mass = (Σ w x / Σ w) · Σ w: two orders of N-term sums of |x| ≤ 4
    assert s["yhat"] == pytest.approx(s["mean_T"][0] * s["mass_T"], abs=reordered(_ndofs(tt), 4.0) + gamma(4))
    assert (tempdir / "config.toml").is_file()


def test_cli_invalid_input_exit_2(tempdir):
    bad = tempdir / "bad.toml"
    _write(bad, DEMO.read_text() + "\n[loss]\nreadout = \"mean\"\nfoo = 1\n")
    assert main(["transport", str(bad), "--out", str(tempdir / "a")]) == 2
    assert main(["transport", str(tempdir / "missing.toml"), "--out", str(tempdir / "b")]) == 2
    assert main(["transport", str(DEMO), "--out", str(tempdir / "c"), "--set", "tokens.degree=7"]) == 2
    assert main(["transport", str(DEMO), "--out", str(tempdir / "d"), "--set", "tokens.nonsense=1"]) == 2
    assert not (tempdir / "a" / "report.json").exists() and not (tempdir / "c" / "report.json").exists()
