"""Noisy tokens on the circle (theory §10): the Scharfetter–Gummel DG0 step, its orders, the free energy."""

from __future__ import annotations

import math

from mpi4py import MPI

import numpy as np
import pytest
import scipy.special as sp

from mfpde import config as C
from mfpde.fitting import fit_order
from mfpde.heads import HeadMeasure
from mfpde.tokens.circle.dg import CircleMesh, CircleTransport
from mfpde.tokens.circle.noise import NoisyCircleTransport, bernoulli, free_energy

DEMO = "demos/circle.toml"
EPS = 2.0**-52


def _mode(mesh: CircleMesh, mu: np.ndarray, k: int) -> float:
    return abs(np.sum(mesh.weights(mu)[:, 0] * np.exp(1j * k * mesh.nodes[:, 0])))


def _rate(n: int, k: int, beta: float, K: float, tau: float, cfl: float = 0.4) -> float:
    """The measured linear rate of mode k about the uniform state (USA, amplitude 1e-6, depth 0.5)."""
    m = CircleMesh(n, 0)
    mu = m.interpolate(lambda th: (1 + 1e-6 * np.cos(k * th)) / (2 * math.pi))
    rep = NoisyCircleTransport(m, tau, "unnormalised", cfl).solve(mu, HeadMeasure(np.array([beta]), np.array([K])),
                                                                 0.5, 1)
    return math.log(_mode(m, rep.mu_T, k) / _mode(m, mu, k)) / 0.5


@pytest.mark.parametrize("k", [1, 2])
def test_linear_rate_has_order_2_in_h(k):
    """The rate of mode k against K k² I_k(β)/β − τk² (theory §10): order 2 (measured 2.00; 1e-3 at n = 128)."""
    beta, K, tau = 2.0, 1.0, 1.0
    exact = K * k * k * sp.iv(k, beta) / beta - tau * k * k
    ns = [16, 32, 64]
    errs = [abs(_rate(n, k, beta, K, tau) - exact) for n in ns]
    order = fit_order([2 * math.pi / n for n in ns], errs)
    assert abs(order - 2.0) < 0.2, (order, errs)
    assert errs[-1] < 0.01 * abs(exact) * k * k, errs


def test_depth_step_has_order_3():
    """SSP-RK3 with the SG rate: the error of μ_T against a 40× finer step falls at order 3 in Δt (measured 2.9–3.0)."""
    m = CircleMesh(16, 0)
    heads = HeadMeasure(np.array([2.0]), np.array([1.0]))
    mu = m.interpolate(lambda th: (1 + 0.5 * np.cos(th)) / (2 * math.pi))

    def run(cfl: float) -> np.ndarray:
        return NoisyCircleTransport(m, 1.0, "unnormalised", cfl).solve(mu, heads, 0.5, 1).mu_T

    ref = run(0.01)
    cfls = [0.4, 0.2, 0.1]
    errs = [np.abs(run(c) - ref).max() for c in cfls]
    assert abs(fit_order(cfls, errs) - 3.0) < 0.3, errs


@pytest.mark.parametrize("attention", ["unnormalised", "softmax"])
def test_positive_mass_conserving_and_free_energy_decreasing(attention):
    """From a narrow bump, strong coupling: μ ≥ 0, mass to round-off, and (USA) E non-increasing at every output."""
    m = CircleMesh(64, 0)
    heads = HeadMeasure(np.array([4.0]), np.array([3.0]))
    mu = m.interpolate(lambda th: np.exp(8 * np.cos(th - 1.0)))
    mu /= m.mass(mu)
    E: list[float] = []
    rep = NoisyCircleTransport(m, 0.3, attention).solve(
        mu, heads, 2.0, 20, callback=lambda s, t, u: E.append(free_energy(m, u, heads, 0.3)))
    assert rep.min_density >= 0 and rep.mass_error < 4 * EPS * rep.substeps  # round-off per sub-step
    if attention == "unnormalised":
        assert np.all(np.diff(E) <= 1e-13 * abs(E[0])), np.diff(E)
        assert E[-1] < E[0] - 1e-3


def test_vanishing_noise_is_the_upwind_scheme():
    """τ → 0: the SG flux is the upwind flux (B(P) → 0 or |P|), the rates agree to O(τ)."""
    m = CircleMesh(32, 0)
    heads = HeadMeasure(np.array([3.0]), np.array([1.0]))
    mu = m.interpolate(lambda th: (1 + 0.5 * np.cos(th) + 0.2 * np.sin(3 * th)) / (2 * math.pi))
    up = CircleTransport(m, "unnormalised")
    vel = up.velocity(mu, heads)
    sg = NoisyCircleTransport(m, 1e-9, "unnormalised")
    assert np.allclose(sg.rate(mu, vel)[0], up.rate(mu, vel)[0], atol=1e-6)
    assert bernoulli(np.array([0.0]))[0] == 1.0 and bernoulli(np.array([-800.0]))[0] == 800.0


def test_free_energy_of_the_uniform_state():
    """E(1/2π) = −τ log 2π − (K/2β) I₀(β) (the double integral is (2π)²·I₀/(2π)² · 1): exact quadrature."""
    m = CircleMesh(32, 0)
    beta, K, tau = 1.5, 2.0, 0.7
    mu = np.full((32, 1), 1 / (2 * math.pi))
    E = free_energy(m, mu, HeadMeasure(np.array([beta]), np.array([K])), tau)
    assert E == pytest.approx(-tau * math.log(2 * math.pi) - K / (2 * beta) * sp.iv(0, beta), rel=1e-12)


@pytest.mark.parametrize("override,match", [
    (["tokens.noise=-0.1"], "tokens.noise: must be >= 0"),
    (["tokens.noise=0.1", "tokens.degree=1"], "tokens.noise: 0.1 > 0 needs"),
    (["tokens.noise=0.1", "tokens.solver='flow'"], "tokens.noise: 0.1 > 0 needs")])
def test_bad_noise_names_the_key(override, match):
    with pytest.raises(C.ConfigError, match=match):
        C.load(DEMO, override)


def test_noise_on_a_box_is_refused():
    with pytest.raises(C.ConfigError, match="tokens.noise: 0.1 needs tokens.domain = 'circle'"):
        C.load("demos/transport_small.toml", ["tokens.noise=0.1"])


@pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="serial")
def test_transport_job_reports_the_free_energy(tmp_path):
    from mfpde.jobs.transport import transport_job

    cfg = C.load(DEMO, ["tokens.degree=0", "tokens.noise=0.5", "tokens.attention='unnormalised'", "depth.T=0.5",
                        "depth.steps=4", "output.every=1", "output.fields=false", "output.plots=false"])
    s = transport_job(cfg, tmp_path)["samples"][0]
    assert s["noise"] == 0.5 and len(s["free_energy_t"]) == len(s["t"]) == 5
    assert np.all(np.diff(s["free_energy_t"]) <= 0) and s["min_density"] >= 0


@pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="serial")
def test_a_first_step_too_long_for_the_noise_names_tokens_noise(tmp_path):
    """τ = 1e300: the diffusion alone needs ~1e302 sub-steps; the error (exit 2) named tokens.beta ("lower β")."""
    from mfpde.jobs.transport import transport_job
    from mfpde.tokens.stepping import StepTooLong

    cfg = C.load("demos/noisy_circle.toml", ["tokens.noise=1e300", "output.fields=false", "output.plots=false"])
    with pytest.raises(StepTooLong, match=r"^tokens\.noise: depth step 1"):
        transport_job(cfg, tmp_path)
    cfg = C.load("demos/noisy_circle.toml", ["tokens.beta=300.0", "output.fields=false", "output.plots=false"])
    with pytest.raises(StepTooLong, match=r"^tokens\.beta: depth step 1"):  # the drift's: still β
        transport_job(cfg, tmp_path / "b")


@pytest.mark.parametrize("ratio", [0.5, 0.8])
def test_fixed_point_reference_contracts_at_k_over_kc(ratio):
    """The verify reference (Picard on μ = exp(κG∗μ)/Z, numpy FFT) about the uniform state contracts at exactly
    κ I_1(β) = K/K_c, K_c = τβ/I_1(β) (theory §10): it reproduces the threshold, and converges to 1/2π below it."""
    from mfpde.verify.noise_energy import stationary_fixed_point

    beta, tau = 1.7, 0.6
    kc = tau * beta / sp.iv(1, beta)
    mu, its, rho = stationary_fixed_point(63, beta, ratio * kc, tau, tol=1e-14)
    assert np.abs(mu - 1 / (2 * math.pi)).max() < 1e-13
    # the rate is a ratio of successive changes ≥ 1e4 ε max μ, each with round-off ≈ ε max μ: relative 2e-4
    assert rho == pytest.approx(ratio, rel=2e-4), (rho, its)


def test_fixed_point_reference_above_kc_is_a_cluster_with_lower_free_energy():
    """Above K_c the reference's state is not uniform (|μ̂₁| > 0) and its free energy is below the uniform state's."""
    from mfpde.verify.noise_energy import reference_free_energy, stationary_fixed_point

    beta, tau = 2.0, 1.0
    kc = tau * beta / sp.iv(1, beta)
    mu, _, rho = stationary_fixed_point(63, beta, 1.5 * kc, tau)
    th = 2 * math.pi * np.arange(63) / 63
    assert abs(np.mean(mu * np.exp(1j * th))) * 2 * math.pi > 0.3 and 0 < rho < 1
    uniform = np.full(63, 1 / (2 * math.pi))
    assert reference_free_energy(mu, beta, 1.5 * kc, tau)[0] < reference_free_energy(uniform, beta, 1.5 * kc, tau)[0]


@pytest.mark.parametrize("noise", [0.0, 5.0])
def test_the_logged_substep_bounds_hold(tmp_path, noise):
    """The DG run's up-front estimate says "at most N sub-steps": N held for noise-free runs but not with noise (the
    Scharfetter–Gummel step, h²/(2τ + 2|u|h) per cfl, is smaller than the CFL rule's) nor with the rounding up of
    every depth step's count (57 618 sub-steps against a logged "at most 55 614")."""
    from mfpde.jobs.transport import transport_job
    from mfpde.tokens.circle.config import section
    from mfpde.tokens.circle.job import circle_heads
    from mfpde.tokens.circle.work import dg_substep_estimate

    cfg = C.load("demos/noisy_circle.toml", [f"tokens.noise={noise}", "tokens.cells=[64]", "depth.T=2.0",
                                             "depth.steps=20", "output.fields=false", "output.plots=false"])
    s = transport_job(cfg, tmp_path / "o")["samples"][0]
    sec = section(cfg)
    lo, hi = dg_substep_estimate(sec, circle_heads(sec, MPI.COMM_SELF), CircleMesh(sec.cells, sec.degree))
    assert lo <= s["substeps"] <= hi, (lo, s["substeps"], hi)
