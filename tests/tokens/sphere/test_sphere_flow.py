"""The Lagrangian solver on S² (mfpde.tokens.sphere.flow) against references it does not produce: the closed-form
growth rates of theory §9, the rotation matrix of a solid-body rotation, the zonal symmetry, and the same solve on
other rank counts."""

from __future__ import annotations

import math

from mpi4py import MPI

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from mfpde.tokens.sphere.flow import SphereFlow, clusters, degree_powers
from mfpde.tokens.sphere.theory import growth_rate
from mfpde.tokens.sphere.velocity import DirectVelocity, RotationVelocity

EPS = 2.0**-52


def flow_rate(l: int, beta: float, attention: str, nodes: int = 11, rtol: float = 1e-13, eps: float = 1e-5,
              m: int = 0) -> float:
    """The growth rate of degree l from ±ε Y_lm starts (odd part of μ̂_l·, least squares on its log over γT = 3)."""
    g = float(growth_rate(l, beta, attention))
    ts = np.linspace(0.0, 3.0 / g, 11)
    hats = [SphereFlow(DirectVelocity(beta, attention), nodes=nodes, rtol=rtol, L=l).solve([[l, m, s * eps]], ts[-1],
                                                                                            ts).coefficients
            for s in (1.0, -1.0)]
    odd = np.linalg.norm((hats[0] - hats[1])[:, l * l:] / 2, axis=1)
    return float(np.polyfit(ts, np.log(odd), 1)[0])


@pytest.mark.parametrize("attention", ["softmax", "unnormalised"])
@pytest.mark.parametrize("l", [1, 2, 3])
def test_growth_rates_against_linear_theory(l, attention):
    """Error budget of the fitted rate over γT = 3, relative: the integrator's global error rtol per unit state
    against a perturbation of size ε (rtol/ε = 1e-8, times a few dozen steps), the cubic terms the odd part leaves
    (ε² e^{2γT} |Y|² (4π)² ≲ 1e-7), and the quadrature's Funk–Hecke tail beyond degree ≈ 2N − 2 − l
    (i_17(5)/i_0(5) ≈ 5e-10 at N = 11; at N = 8 the tail i_12/i_0 = 3e-6 shows as 2.6e-6 for l = 2):
    ≤ 1e-6 with a margin of 3."""
    beta = 5.0
    g = float(growth_rate(l, beta, attention))
    assert abs(flow_rate(l, beta, attention) / g - 1.0) < 1e-6


def test_a_broken_projection_is_caught(monkeypatch):
    """Without the tangent projection the particles leave the sphere; the rate test's threshold must see that."""
    import mfpde.tokens.sphere.velocity as V

    monkeypatch.setattr(V, "tangent", lambda x, v: v)
    assert abs(flow_rate(2, 5.0, "softmax") / float(growth_rate(2, 5.0, "softmax")) - 1.0) > 1e-6


def test_solid_body_rotation_is_exact():
    omega = np.array([0.3, -0.2, 1.0])
    f = SphereFlow(RotationVelocity(omega), nodes=6, rtol=1e-12)
    modes = [[2, 1, 0.05], [3, -2, 0.02]]
    s = f.solve(modes, 1.5, [0.0, 0.5, 1.5])
    x0, w = f.particles(modes)
    for t, x in zip(s.t, s.x, strict=True):
        R = Rotation.from_rotvec(omega * t).as_matrix()
        # DOP853's global error at rtol 1e-12 over |ω|T ≈ 1.6 radians, a few dozen steps
        assert np.max(np.abs(x - x0 @ R.T)) < 1e-10
    assert np.max(np.abs(np.linalg.norm(s.x, axis=2) - 1.0)) < 10 * EPS
    assert abs(s.w.sum() - 1.0) < 10 * EPS and s.power[0, 0] == pytest.approx(1 / (4 * math.pi), rel=1e-14)


def test_a_zonal_start_stays_zonal():
    """μ_0 depending on the colatitude alone: every μ̂_ℓm with m ≠ 0 stays 0 (the product rule's longitudes are
    equally spaced, so the particle system keeps the rotation symmetry exactly, up to round-off)."""
    s = SphereFlow(DirectVelocity(7.0, "softmax"), nodes=8, rtol=1e-9, L=8).solve([[1, 0, 0.05], [2, 0, 0.03]], 3.0,
                                                                                  3)
    m = np.array([mm for ll in range(9) for mm in range(-ll, ll + 1)])
    assert np.max(np.abs(s.coefficients[:, m != 0])) < 1e-12
    assert np.max(np.abs(s.coefficients[-1, m == 0][1:])) > 1e-2  # and the zonal part did move


@pytest.mark.ranks
def test_the_ranks_see_one_measure():
    """Each rank gives the velocity its slice; on COMM_WORLD the direct sum gathers them all in order, so the solve
    is that of COMM_SELF bit for bit, on any number of ranks."""
    modes = [[2, 1, 0.03], [1, -1, 0.02]]
    a = SphereFlow(DirectVelocity(5.0, "softmax", MPI.COMM_SELF), nodes=5, rtol=1e-8).solve(modes, 1.0, 2)
    b = SphereFlow(DirectVelocity(5.0, "softmax", MPI.COMM_WORLD), nodes=5, rtol=1e-8).solve(modes, 1.0, 2)
    assert np.array_equal(a.x, b.x)


def test_clusters_form_from_a_seeded_noise_start():
    """SA, β = 9, noise of relative amplitude 0.1 on degrees 1..8: the particles collapse into clusters that carry
    the mass (how many is not a theorem; ``fastest_degree(9)`` = 4 and this seed gives 4); the masses add to 1."""
    from mfpde.tokens.sphere.data import noise_modes

    s = SphereFlow(DirectVelocity(9.0, "softmax"), nodes=10, rtol=1e-8, L=8).solve(noise_modes(0.1, 0, 8), 30.0,
                                                                                    [15.0, 30.0])
    mass, centres = s.clusters[-1]
    assert 2 <= len(mass) <= 8 and mass.sum() > 0.9
    assert np.allclose(np.linalg.norm(centres, axis=1), 1.0)
    assert abs(s.w.sum() - 1.0) < 10 * EPS and s.power[-1, 0] == pytest.approx(1 / (4 * math.pi), rel=1e-13)
    # collapsed: the power of degrees 1..8 is that of a few point masses (Σ_ℓ (2ℓ+1)/4π Σ_ij m_i m_j P_ℓ(cos),
    # order 1), far above the start's amplitude²/4π ≈ 8e-4
    assert s.power[-1, 1:].sum() > 0.1


def test_clusters_and_powers_of_point_masses():
    x = np.array([[0, 0, 1.0], [0, 1e-4, 1.0], [1.0, 0, 0], [0, -1.0, 0], [0, -1.0, 1e-5]])
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    w = np.array([0.3, 0.2, 0.1, 0.25, 0.15])
    mass, centres = clusters(x, w)
    assert np.allclose(mass, [0.5, 0.4]) and np.allclose(centres[0], [0, 4e-5, 1], atol=1e-9)
    # a single point mass at the north pole: μ̂_ℓ0 = Y_ℓ0(N) = √((2ℓ+1)/4π), powers (2ℓ+1)/4π
    _, p = degree_powers(np.array([[0.0, 0, 1]]), np.array([1.0]), 5)
    assert np.allclose(p, (2 * np.arange(6) + 1) / (4 * math.pi), rtol=1e-13)


def test_the_stiff_switch_fires_and_agrees_with_the_explicit_solve(monkeypatch):
    """USA at β = 9: collapsed clusters contract at a rate ≈ e^β × their mass, so DOP853 is held by stability and
    the solve switches to LSODA; against DOP853 alone (switch disabled, rtol 100× tighter) the positions agree to
    100 rtol (a tolerance-controlled global error on a contracting flow)."""
    import mfpde.tokens.sphere.flow as F
    from mfpde.tokens.sphere.data import noise_modes

    modes, ts = noise_modes(0.1, 0, 6), [0.05, 0.5, 1.0]
    r = SphereFlow(DirectVelocity(9.0, "unnormalised"), nodes=6, rtol=1e-8, L=6).solve(modes, 1.0, ts)
    assert r.integrator["switch_t"] is not None and r.integrator["switch_t"] < 0.5 and r.integrator["nlu"] > 0
    monkeypatch.setattr(F, "SWITCH_STEPS", 10**9)
    q = SphereFlow(DirectVelocity(9.0, "unnormalised"), nodes=6, rtol=1e-10, L=6).solve(modes, 1.0, ts)
    assert q.integrator["switch_t"] is None
    assert np.max(np.abs(r.x - q.x)) < 100 * 1e-8
    assert len(r.clusters[-1][0]) >= 2


def test_a_stiff_phase_that_does_not_fit_in_memory_stays_explicit(monkeypatch):
    """The stiff phase holds a dense 3n × 3n Jacobian (29 GB at 20 000 particles): where it does not fit the node
    the solve steps on with DOP853 (slower, within memory) and says so, instead of failing to allocate it."""
    import mfpde.tokens.sphere.flow as F
    from mfpde.tokens.sphere.data import noise_modes

    monkeypatch.setattr(F, "stiff_room", lambda ranks=1: 0.5 * F.stiff_bytes(72))  # 72 particles at nodes = 6
    modes, ts = noise_modes(0.1, 0, 6), [0.05, 0.5, 1.0]
    r = SphereFlow(DirectVelocity(9.0, "unnormalised"), nodes=6, rtol=1e-8, L=6).solve(modes, 1.0, ts)
    assert r.integrator["switch_t"] is None and r.integrator["stiff_steps"] == 0
    assert "does not fit" in r.integrator["stiff_refused"] and len(r.x) == len(ts)


class _Broken:
    """A velocity that turns non-finite after a while (a numerical failure inside the solve)."""

    def __init__(self) -> None:
        self.calls = 0

    def update(self, x, w):
        self.calls += 1

    def velocity(self, x):
        return np.cross([0.0, 0.0, 1.0], x) * (np.nan if self.calls > 100 else 1.0)


def test_a_failure_keeps_the_outputs_reached():
    from mfpde.errors import NumericalError

    with pytest.raises(NumericalError, match="explicit integrator failed") as e:
        SphereFlow(_Broken(), nodes=3, rtol=1e-10).solve([[1, 0, 0.05]], 40.0, 40)
    part = e.value.partial
    assert 1 <= len(part.t) < 40 and np.all(np.isfinite(part.x)) and part.power.shape == (len(part.t), 17)


def test_the_deadline_stops_the_solve():
    from mfpde.errors import NumericalError

    with pytest.raises(NumericalError, match="budget"):
        SphereFlow(DirectVelocity(5.0, "softmax"), nodes=4).solve([[1, 0, 0.05]], 50.0, 5, deadline=0.0)


def test_the_stall_guard_tells_a_stall_from_small_steps():
    """Small steps that grow again pass; so do steps that shrink (a collapse) with more than STALL_STEPS "left" at
    their size, and steps held with fewer than STALL_STEPS left; steps held with more than STALL_STEPS left stall,
    seen once the windows are full."""
    from mfpde.tokens.adaptive import STALL_STEPS, Stall

    growing, t, h = Stall(1.0), 0.0, 1e-12
    for _ in range(3 * growing.size):  # a collapse: tiny steps, then each 1% longer (back to 1e-3 in ~2000 steps)
        t, h = t + h, min(1.01 * h, 1e-3)
        assert growing.check(t) is None
    shrinking, t, h = Stall(1.0), 0.0, 1e-6
    for _ in range(3 * shrinking.size):  # steps halving every 1500 steps, far more than STALL_STEPS at their size
        t, h = t + h, h * 0.5 ** (1 / 1500)
        assert shrinking.check(t) is None
    few = Stall(1.0)
    h = 2.0 / STALL_STEPS  # held, but STALL_STEPS / 2 steps reach the end
    assert all(few.check(k * h) is None for k in range(1, 2 * few.size))
    held = Stall(1.0)
    h = 1.0 / (4 * STALL_STEPS)  # held, 4·STALL_STEPS steps to the end
    said = [held.check(k * h) for k in range(1, held.size + 1)]
    assert said[:-1] == [None] * (held.size - 1) and said[-1] is not None and "rtol" in said[-1]


def test_a_velocity_below_its_round_off_stalls_instead_of_running_without_end():
    """Unnormalised attention at β = 30: |v| ≈ e^β, so round-off in v holds LSODA's steps near 6.6e-8 at rtol 1e-10
    (1.5·10⁸ of them to T = 10, hours): the solve ends with NumericalError within seconds, the outputs reached
    kept."""
    from mfpde.errors import NumericalError

    with pytest.raises(NumericalError, match="stalls") as e:
        SphereFlow(DirectVelocity(30.0, "unnormalised"), nodes=4, rtol=1e-10).solve([[1, 0, 0.05], [2, 1, 0.03]],
                                                                                    10.0, 10)
    part = e.value.partial
    assert len(part.t) < 10 and np.all(np.isfinite(part.x))


@pytest.mark.ranks
def test_the_ranks_agree_through_the_stiff_phase():
    """The stiff phase's exact Jacobian is computed from the replicated particles on every rank: the solve that
    switches (USA β = 9, as below) is that of COMM_SELF bit for bit on any number of ranks."""
    from mfpde.tokens.sphere.data import noise_modes

    modes = noise_modes(0.1, 0, 6)
    a, b = (SphereFlow(DirectVelocity(9.0, "unnormalised", comm), nodes=6, rtol=1e-8, L=6).solve(modes, 0.5, 2)
            for comm in (MPI.COMM_SELF, MPI.COMM_WORLD))
    assert a.integrator["switch_t"] is not None and a.integrator["njev"] > 0
    assert np.array_equal(a.x, b.x)


def _taylor_slopes(V, J, X, seed=0):
    """The observed orders of |V(X ± h d) − V(X) ∓ ... − h J d| as h halves (central and forward differences)."""
    d = np.random.default_rng(seed).normal(size=X.size)
    hs = 0.02 * 0.5 ** np.arange(5)
    central = [np.linalg.norm((V(X + h * d) - V(X - h * d)) / (2 * h) - J @ d) for h in hs]
    forward = [np.linalg.norm((V(X + h * d) - V(X)) / h - J @ d) for h in hs]
    return [np.polyfit(np.log(hs), np.log(e), 1)[0] for e in (central, forward)]


@pytest.mark.parametrize("attention", ["softmax", "unnormalised"])
def test_the_jacobian_is_exact(attention):
    """Taylor test of :func:`attention_jacobian` against the flow's own velocity V(X) = v(X/|X|) (two heads, points
    off the sphere): the finite-difference error of an exact Jacobian falls at order 2 (central) and 1 (forward),
    while J + δ (any error δ) leaves a floor |δ d| and the fitted order falls towards 0. The orders are fitted over
    h = 0.02 … 0.00125, where round-off (ε |V| / h ≈ 1e-13) is far below the truncation error (≈ 1e-5)."""
    from mfpde.tokens.sphere.jacobian import attention_heads, attention_jacobian
    from mfpde.tokens.sphere.job import _HeadSum
    from mfpde.tokens.sphere.kernel import LogDomainVelocity

    rng = np.random.default_rng(3)
    n = 30
    X = rng.normal(size=(n, 3))
    X *= (1 + 0.2 * rng.random(n))[:, None] / np.linalg.norm(X, axis=1, keepdims=True)
    m = rng.random(n) / n
    vel = _HeadSum([LogDomainVelocity(6.0, attention, c=0.7), LogDomainVelocity(2.0, attention, c=-0.4)])
    flow = SphereFlow(vel, nodes=2)
    heads = attention_heads(vel)
    assert heads == [(6.0, attention, 0.7), (2.0, attention, -0.4)]
    J = attention_jacobian(X, m, heads)

    def V(y):
        return flow.field(y.reshape(n, 3), m).ravel()

    central, forward = _taylor_slopes(V, J, X.ravel())
    assert 1.9 < central < 2.1 and 0.9 < forward < 1.1
    wrong = J + 1e-3 * np.abs(J).max() * rng.normal(size=J.shape)
    assert _taylor_slopes(V, wrong, X.ravel())[0] < 0.5


def test_the_direct_jacobian_serves_the_harmonic_kernel():
    """For the harmonic kernel the stiff phase takes the direct sum's Jacobian: the series differs from the direct
    sum by its Bessel tail (≤ 1e-14 relative), so the Taylor test against the kernel's own velocity still shows
    order 2. A prescribed rotation is not attention: no heads (finite differences)."""
    from mfpde.tokens.sphere.jacobian import attention_heads, attention_jacobian
    from mfpde.tokens.sphere.kernel import HarmonicVelocity

    vel = HarmonicVelocity(5.0, "unnormalised")
    flow = SphereFlow(vel, nodes=4)
    X, m = flow.particles([[2, 1, 0.05], [3, 0, 0.03]])
    J = attention_jacobian(X, m, attention_heads(vel))
    central, _ = _taylor_slopes(lambda y: flow.field(y.reshape(-1, 3), m).ravel(), J, X.ravel())
    assert 1.9 < central < 2.1
    assert attention_heads(RotationVelocity([0, 0, 1.0])) is None


@pytest.mark.parametrize(("pattern", "switches"), [((1.2, 0.8), True), ((1.2,) * 14 + (0.8,) * 6, False)])
def test_a_hovering_step_switches(monkeypatch, pattern, switches):
    """Hairer's count: a step size hovering at DOP853's boundary (h ρ = 1.2 and 0.8 times 6.1 in turn) switches
    after 15 stiff steps (the 29th step), since only 6 non-stiff steps in a row reset the count; 14 stiff steps
    followed by 6 non-stiff ones, again and again, never switch."""
    import itertools

    import mfpde.tokens.sphere.flow as F

    ratio = itertools.cycle(pattern)
    monkeypatch.setattr(F, "_lipschitz", lambda s: next(ratio) * F.SWITCH_H_RHO / s.step_size)
    s = SphereFlow(RotationVelocity([0.0, 0.0, 1.0]), nodes=3, rtol=1e-10).solve([[1, 0, 0.05]], 20.0, [20.0])
    if switches:
        assert s.integrator["switch_t"] is not None and s.integrator["explicit_steps"] == 2 * F.SWITCH_STEPS - 1
    else:
        assert s.integrator["switch_t"] is None
