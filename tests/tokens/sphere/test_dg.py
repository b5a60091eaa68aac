"""DG transport on the icosahedral mesh of S² (theory §9): rotation, conservation, positivity, growth rates, ranks.

Small meshes (refine ≤ 3, DG1 on the flat mesh unless stated): the suite's time budget.
"""

from __future__ import annotations

import math

from mpi4py import MPI

import numpy as np
import pytest
from roundoff import conservation, gamma, reordered
from scipy.spatial.transform import Rotation

from mfpde.fitting import fit_order
from mfpde.tokens.sphere.dg import SphereDG, growth_step_cap
from mfpde.tokens.sphere.harmonics import real_harmonics
from mfpde.tokens.sphere.mesh import cell_count, edge_lengths, icosphere, sphere_area
from mfpde.tokens.sphere.theory import growth_rate
from mfpde.tokens.sphere.velocity import DirectVelocity, RotationVelocity

pytestmark = pytest.mark.ranks  # the rank count can change what it checks: run again under mpiexec

OMEGA = np.array([1.0, 0.0, 0.0])
POLE = np.array([0.0, 0.0, 1.0])


def cap(x: np.ndarray) -> np.ndarray:
    """A smooth Gaussian cap around the north pole (width ~ 1/4 rad)."""
    return np.exp(-8.0 * (1.0 - x @ POLE))


def rotation_error(refine: int, degree: int, order: int = 1, T: float = math.pi / 2
                   ) -> tuple[float, float, SphereDG, object]:
    """(relative L2 error at T against the exactly rotated cap, h_max, the operator, the report)."""
    op = SphereDG(icosphere(MPI.COMM_WORLD, refine, order), degree, RotationVelocity(OMEGA))
    rep = op.solve(op.project(cap), T, 2)
    back = Rotation.from_rotvec(OMEGA * T).inv()
    err = op.l2_error(rep.mu_T, lambda x: cap(back.apply(x))) / op.l2_error(rep.mu_T)
    return err, edge_lengths(op.mesh)[1], op, rep


def test_icosphere_counts_vertices_on_the_sphere_and_area_converges_at_order_2_and_4():
    areas = {}
    for order in (1, 2):
        errs, hs = [], []
        for r in (1, 2, 3):
            m = icosphere(MPI.COMM_WORLD, r, order)
            assert m.topology.index_map(2).size_global == cell_count(r) == 20 * 4**r
            assert m.geometry.dim == 3 and m.topology.dim == 2
            assert np.allclose(np.linalg.norm(m.geometry.x, axis=1), 1.0, atol=1e-15)
            errs.append(1.0 - sphere_area(m) / (4 * math.pi))
            hs.append(edge_lengths(m)[1])
        assert min(errs) > 0  # inscribed
        areas[order] = fit_order(hs, errs)
    # flat: 1 − area ∝ h², quadratic: ∝ h⁴ (0.25: the house's order tolerance)
    assert abs(areas[1] - 2.0) < 0.25 and abs(areas[2] - 4.0) < 0.25, areas


def test_solid_body_rotation_below_gusto_at_1280_cells_and_at_order_2():
    errs, hs = [], []
    for r in (1, 2, 3):
        e, h, _, rep = rotation_error(r, 1)
        errs.append(e)
        hs.append(h)
    q = fit_order(hs, errs)
    # DG1 and the flat geometry are both O(h²): the error falls at least at order 2 (0.25: the house's tolerance)
    assert q > 2.0 - 0.25, (q, errs)
    assert errs[-1] < 2.5e-2, errs  # Gusto's DG bound at 1280 cells, T = π/2
    assert rep.min_density >= 0.0  # a positive start stays positive under the limiter


def test_dg2_on_the_quadratic_geometry_beats_the_flat_one():
    """On the flat mesh the O(h²) geometry caps DG2 at order 2; the quadratic geometry lifts it (order 3)."""
    flat = [rotation_error(r, 2, 1, math.pi / 8)[0] for r in (1, 2)]
    curved = [rotation_error(r, 2, 2, math.pi / 8)[0] for r in (1, 2)]
    assert curved[1] < flat[1] / 3, (flat, curved)
    assert math.log2(curved[0] / curved[1]) > 3.0 - 0.25 > math.log2(flat[0] / flat[1]), (flat, curved)


def _mass_bound(op: SphereDG, substeps: int, mass: float) -> float:
    """roundoff.conservation for SSP-RK3 sub-steps: 3 stages, each dof from k(Q(k+3) + 3E(k+1)) operations."""
    t = op.t
    k, Q, E = t.phi.shape[1], t.phi.shape[0], t.we.shape[1]
    ndofs = op.V.dofmap.index_map.size_global * k
    return conservation(3 * substeps, k * (Q * (k + 3) + 3 * E * (k + 1)) + 10, ndofs, mass)


@pytest.mark.parametrize(("degree", "refine"), [(0, 1), (1, 1), (2, 0)])
def test_mass_to_roundoff_and_positivity_through_cluster_formation(degree, refine):
    """From a start of degrees 2 and 3, SA at β = 8 forms clusters (a cell mean > 3× uniform) by T = 2.5."""
    comm = MPI.COMM_WORLD
    op = SphereDG(icosphere(comm, refine, 1 if degree < 2 else 2), degree, DirectVelocity(8.0, "softmax", comm))
    Y = lambda x: real_harmonics(3, x)  # noqa: E731
    mu = op.project(lambda x: 1 / (4 * math.pi) + 0.06 * Y(x)[:, 6] + 0.05 * Y(x)[:, 12] + 0.03 * Y(x)[:, 14])
    mins, tops = [], []

    def watch(k, t, m):
        if k:
            mins.append(op.min_density(m))
            tops.append(comm.allreduce(float(np.abs(m.x.array).max()), op=MPI.MAX))

    rep = op.solve(mu, 2.5, 5, callback=watch)
    assert rep.mass_error * rep.mass_0 <= _mass_bound(op, rep.substeps, rep.mass_0), rep
    peak = comm.allreduce(float(op.cell_means(rep.mu_T).max(initial=0.0)), op=MPI.MAX)
    assert peak > 3 / (4 * math.pi), peak  # clusters formed
    if degree > 0:
        assert rep.limited_cells > 0
    # μ_h ≥ 0 at the limiter points (DG1: the vertices, the exact minimum) up to the round-off of the scaling
    # u = v̄ + θ(v − v̄) at the minimum point (a k-term evaluation and 4 operations on values ≤ max|μ_h|)
    k = op.t.phi.shape[1]
    assert min(mins) >= -gamma(2 * k + 8) * max(tops), (mins, tops)


def linear_rates(refine: int, beta: float, eps: float = 1e-6) -> np.ndarray:
    """The growth rates of Y_10, Y_20, Y_30 from ±ε runs (the odd part: quadratic terms and the O(h²) drift of
    the discrete uniform state cancel), DG1, SA, T = 1/2, sub-steps ≤ growth_step_cap (RK3's relative error of
    a rate (γΔt)³/24 ≤ 4e-5)."""
    comm = MPI.COMM_WORLD
    op = SphereDG(icosphere(comm, refine), 1, DirectVelocity(beta, "softmax", comm),
                   max_dt=growth_step_cap(beta, "softmax"))
    cols = [2, 6, 12]  # ℓ² + ℓ for ℓ = 1, 2, 3

    def coeffs(mu):
        x, w = op.quadrature(mu)
        return comm.allreduce(real_harmonics(3, x)[:, cols].T @ w, op=MPI.SUM)

    a = {}
    for s in (1.0, -1.0):
        mu = op.project(lambda x, s=s: 1 / (4 * math.pi) + s * eps * real_harmonics(3, x)[:, cols].sum(axis=1))
        a[s] = (coeffs(mu), coeffs(op.solve(mu, 0.5, 1).mu_T))
    return np.log((a[1.0][1] - a[-1.0][1]) / (a[1.0][0] - a[-1.0][0])) / 0.5


def test_growth_rates_of_degrees_1_to_3_converge_to_theory():
    beta = 5.0
    exact = growth_rate(np.array([1, 2, 3]), beta, "softmax")
    errs = [np.abs(linear_rates(r, beta) - exact).max() / exact.max() for r in (1, 2)]
    # DG1 on the flat mesh: O(h²) (h halves): the error falls by 4; asserted: at least by 2^(2 − 0.5), and
    # the finer error below 5% of the fastest rate
    assert errs[0] / errs[1] > 2 ** 1.5 and errs[1] < 5e-2, errs


def test_one_rank_and_all_ranks_agree():
    """COMM_WORLD against COMM_SELF (a full serial solve on each rank): run under mpiexec -n 2 by ``make test``.

    The DG data of an edge are the same on any partition (edges ordered by the input indices); only the
    velocity's sums and the reductions run in another order: the harmonic coefficients of μ_T agree to that
    round-off, amplified at most by the growth of the cluster instability over the run (e^{γT}, γ ≤ 1).
    """
    out = {}
    for name, comm in (("world", MPI.COMM_WORLD), ("self", MPI.COMM_SELF)):
        op = SphereDG(icosphere(comm, 1), 1, DirectVelocity(5.0, "softmax", comm))
        mu = op.project(lambda x: 1 / (4 * math.pi) + 0.05 * real_harmonics(3, x)[:, 12])
        rep = op.solve(mu, 2.0, 2)
        x, w = op.quadrature(rep.mu_T)
        out[name] = (comm.allreduce(real_harmonics(4, x).T @ w, op=MPI.SUM), rep.substeps, rep.mass_T)
    (cw, sw, mw), (cs, ss, ms) = out["world"], out["self"]
    n = op.t.wq.size
    assert sw == ss
    assert abs(mw - ms) <= reordered(n, mw)
    assert np.abs(cw - cs).max() <= math.e**2 * 3 * sw * reordered(n, np.abs(cs).max()), np.abs(cw - cs).max()


class _NanLater(RotationVelocity):
    """The rotation, but NaN on the last rank from its 20th evaluation on (after the first depth step)."""

    def __init__(self) -> None:
        super().__init__(OMEGA)
        self.calls = 0

    def velocity(self, x: np.ndarray) -> np.ndarray:
        self.calls += 1
        v = super().velocity(x)
        last = MPI.COMM_WORLD.rank == MPI.COMM_WORLD.size - 1
        return v * math.nan if last and self.calls >= 20 else v


def test_a_nan_velocity_on_one_rank_stops_every_rank_with_a_numerical_error():
    """The step size is reduced on every rank whatever one rank's velocity holds (no rank left in a collective)."""
    from mfpde.errors import NumericalError

    op = SphereDG(icosphere(MPI.COMM_WORLD, 1), 1, _NanLater())
    with pytest.raises(NumericalError):
        op.solve(op.project(cap), 1.0, 4)


def test_the_nodal_velocity_matches_the_pointwise_one_at_order_3_and_keeps_the_mass():
    """v at the P2 nodes interpolated to the points (and the measure moved to the nodes) against v at every
    volume and edge point (the harmonic kernel, SA, β = 5): the interpolation errs by O(h³) (h halves: by 8;
    asserted by at least 2^(3 − 0.5)); the node masses sum to ∫μ_h up to the round-off of the sums."""
    from mfpde.tokens.sphere.kernel import HarmonicVelocity

    comm = MPI.COMM_WORLD
    errs = []
    for r in (2, 3):
        mesh = icosphere(comm, r)
        ops = [SphereDG(mesh, 1, HarmonicVelocity(5.0, "softmax", comm), nodal=n) for n in (True, False)]
        mu = ops[0].project(lambda x: 1 / (4 * math.pi) + 0.05 * real_harmonics(3, x)[:, [6, 12]].sum(axis=1))
        u = np.asarray(mu.x.array)
        w = ops[0].quadrature(u)[1]
        node_mass = comm.allreduce(float(ops[0].nodes.masses(w).sum()), op=MPI.SUM)
        assert abs(node_mass - ops[0].mass(u)) <= reordered(2 * w.size, ops[0].mass(u))
        a, b = (op.velocity(u) for op in ops)
        scale = comm.allreduce(float(np.abs(b.vq).max()), op=MPI.MAX)
        errs.append(comm.allreduce(max(float(np.abs(a.vq - b.vq).max()), float(np.abs(a.un - b.un).max())),
                                   op=MPI.MAX) / scale)
        assert np.array_equal(a.un[:, 1], -a.un[:, 0])  # one normal velocity per edge point
    assert errs[0] / errs[1] > 2 ** 2.5 and errs[1] < 1e-2, errs


def test_a_first_step_too_long_under_usa_names_beta():
    """USA at β = 50: the velocity of the input grows like e^β, so the first depth step needs ~1e20 sub-steps; the
    error (exit 2) names tokens.beta, as on the circle, not depth.T (which would need ~1e15 more depth steps)."""
    from mfpde.tokens.sphere.kernel import HarmonicVelocity
    from mfpde.tokens.stepping import StepTooLong

    op = SphereDG(icosphere(MPI.COMM_WORLD, 1), 0, HarmonicVelocity(50.0, "unnormalised", MPI.COMM_WORLD))
    with pytest.raises(StepTooLong, match=r"^tokens\.beta: depth step 1"):
        op.solve(op.project(lambda x: 1 / (4 * math.pi) + 1e-3 * x[:, 2]), 1.0, 1)


def test_a_non_finite_first_step_count_is_said_in_words():
    """USA at β = 700 on the sphere: the velocity overflows and the message read "needs nan CFL sub-steps"."""
    from mfpde.tokens.stepping import first_step_error

    for need in (math.nan, math.inf):
        msg = str(first_step_error(need, 0.5, 0.4, "unnormalised"))
        assert msg.startswith("tokens.beta: depth step 1 (Δt = 0.5) needs unboundedly many CFL sub-steps at t = 0")
        assert ("the velocity is not finite" in msg) is math.isnan(need) and "nan" not in msg and "inf " not in msg
