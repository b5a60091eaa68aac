"""Zonal token transport on S^{d−1} (:mod:`mfpde.tokens.hypersphere.transport`): the label flow and the finite volumes.

Checked: the analytic Φ' of the azimuthal kernel (centred differences at order 2, the closed forms of d = 2, 3,
Funk–Hecke), the linear growth e^{γ_ℓ t} of degree ℓ about the uniform state (theory §11; the flow to 1e-6, the
finite volumes at their order), the flow against direct particle simulations on S¹ and S², the noisy decay rates
K ℓ(ℓ+d−2) λ_ℓ/β − τ ℓ(ℓ+d−2) and the noisy stationary state ν ∝ exp(κΦ) at order h², mass and positivity.

The amplitudes about the uniform state are taken ODD in the perturbation, (μ̂_ℓ(+ε) − μ̂_ℓ(−ε))/2: it removes the
O(ε²) of the nonlinearity and whatever the discrete uniform state does by itself (the finite volumes' uniform
state is stationary only to O(h²)), leaving the linear response to O(ε³).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.integrate
import scipy.special as sp
from roundoff import U, conservation, gamma

from mfpde.fitting import fit_order
from mfpde.tokens.hypersphere import transport as T
from mfpde.tokens.hypersphere.theory import critical_coupling, eigenvalue, growth_rate
from mfpde.tokens.hypersphere.zonal import gauss_rule, orthonormal_basis

ATT = ("unnormalised", "softmax")


def _p(ell: int, d: int):
    """z ↦ p_ℓ(z) (orthonormal in σ̄) and ‖p_ℓ‖_∞ = |p_ℓ(1)|."""
    return (lambda z: orthonormal_basis(np.asarray(z, float), ell, d)[:, ell]), \
        float(abs(orthonormal_basis(np.ones(1), ell, d)[0, ell]))


def _rng_measure(d: int, n: int = 9):
    rng = np.random.default_rng(1000 + d)
    return rng.uniform(-0.99, 0.99, n), rng.uniform(0.1, 1.0, n)


# -- Φ and Φ' -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("d", [2, 3, 5, 16])
def test_potential_derivative_centred_difference(d: int) -> None:
    """(Φ(z+h) − Φ(z−h))/2h − Φ'(z) = h² Φ'''/6 + O(h⁴): the error falls at order 2 (round-off u Φ/h ≈ 1e-13 is
    far below h² Φ'''/6 at these h)."""
    nodes, m = _rng_measure(d)
    z = np.linspace(-0.9, 0.9, 13)
    dphi = T.potential(z, nodes, m, 2.5, d)[1]
    hs = np.array([4e-2, 2e-2, 1e-2])
    err = [np.abs((T.potential(z + h, nodes, m, 2.5, d)[0] - T.potential(z - h, nodes, m, 2.5, d)[0]) / (2 * h)
                  - dphi).max() for h in hs]
    assert fit_order(hs, err) == pytest.approx(2.0, abs=0.05)


@pytest.mark.parametrize("d", [2, 3])
def test_potential_closed_forms(d: int) -> None:
    """d = 2: B_0 = cosh (Φ' = β e^{βzz'}[z' cosh − (z/s) s' sinh]); d = 3: B_0 = I_0 (B_0' = I_1)."""
    nodes, m = _rng_measure(d)
    z = np.linspace(-0.95, 0.95, 11)
    beta = 3.0
    s, sk = np.sqrt(1 - z * z)[:, None], np.sqrt(1 - nodes * nodes)[None, :]
    e = np.exp(beta * np.outer(z, nodes))
    b0, b1 = (np.cosh, np.sinh) if d == 2 else (sp.i0, sp.i1)
    phi = (e * b0(beta * s * sk)) @ m
    dphi = (beta * e * (nodes[None, :] * b0(beta * s * sk) - (z[:, None] / s) * sk * b1(beta * s * sk))) @ m
    got = T.potential(z, nodes, m, beta, d)
    # each term to a few ulps (exp, cosh/I_0 and ₀F₁ alike), summed over 9 terms: 1e-13 relative is ample
    np.testing.assert_allclose(got[0], phi, rtol=1e-13)
    np.testing.assert_allclose(got[1], dphi, rtol=1e-12, atol=1e-13 * np.abs(phi).max())


@pytest.mark.parametrize("d", [2, 3, 5, 16])
def test_potential_funk_hecke(d: int) -> None:
    """The masses q p_ℓ of the Gauss rule (exact for the entire kernel to round-off at 40 nodes) give
    Φ = λ_ℓ(β) p_ℓ and Φ' = λ_ℓ(β) p_ℓ' (theory.eigenvalue; p_ℓ' of the fitted degree-ℓ polynomial)."""
    zg, q = gauss_rule(40, d)
    z = np.linspace(-0.97, 0.97, 9)
    beta = 2.0
    for ell in range(5):
        p = _p(ell, d)[0]
        poly = np.polynomial.Polynomial.fit(np.cos(np.linspace(0, np.pi, 12)), p(np.cos(np.linspace(0, np.pi, 12))),
                                            ell)
        phi, dphi = T.potential(z, zg, q * p(zg), beta, d)
        lam = float(eigenvalue(ell, beta, d))
        scale = T.potential(z, zg, q * np.abs(p(zg)), beta, d)[0].max()  # Σ|m K|: the round-off's scale
        np.testing.assert_allclose(phi, lam * p(z), rtol=0, atol=1e-13 * scale)
        np.testing.assert_allclose(dphi, lam * poly.deriv()(z), rtol=0, atol=1e-12 * beta * scale)


# -- linear growth about the uniform state ------------------------------------------------------------------
def _odd_amplitude(solve, ell: int, d: int, eps: float):
    """(μ̂_ℓ(+ε) − μ̂_ℓ(−ε))/2 at the depths of ``solve(nu0) -> (z, masses)``."""
    p = _p(ell, d)[0]
    amps = [T.degree_amplitudes(*solve(lambda z, s=s: 1 + s * eps * p(z)), d, ell)[..., ell] for s in (1, -1)]
    return (amps[0] - amps[1]) / 2


@pytest.mark.parametrize("attention", ATT)
@pytest.mark.parametrize("d", [3, 5, 16])
def test_flow_linear_growth(d: int, attention: str) -> None:
    """ν0 = 1 ± ε p_ℓ, ℓ = 1..4: μ̂_ℓ(t) = ε e^{γ_ℓ t}. Budget of the relative error of γ_ℓ (≤ 1e-6): the odd
    nonlinearity (ε‖p_ℓ‖∞)² = 1e-8; DOP853 at rtol 1e-11 of the displacement; the Gauss labels' quadrature
    (spectral, the kernel is entire); round-off u Σ|m p_ℓ|/(ε γ t) ≲ 1e-8. The depth is 1/max γ, so no other
    degree grows by more than e."""
    beta = 2.0
    t = 1.0 / float(growth_rate(np.arange(1, 30), beta, d, attention).max())
    for ell in range(1, 5):
        eps = 1e-4 / _p(ell, d)[1]
        a = _odd_amplitude(lambda nu0: T.flow(nu0, (beta, 1.0), d, attention, [0.0, t], 24, rtol=1e-11), ell, d, eps)
        assert a[0] == pytest.approx(eps, rel=1e-8)  # Gauss is exact for p_ℓ²; round-off M u Σ|q p_ℓ|/ε ≤ 2e-9
        gamma_l = float(growth_rate(ell, beta, d, attention))
        assert math.log(a[1] / a[0]) / t == pytest.approx(gamma_l, rel=1e-6), ell


@pytest.mark.parametrize("attention", ATT)
@pytest.mark.parametrize("d", [2, 3, 5, 16])
def test_finite_volume_linear_growth(d: int, attention: str) -> None:
    """The same growth rates from the noise-free finite volumes at three resolutions: the error of γ_ℓ falls at the
    scheme's order, 1 (upwind) to 2 (midpoint velocity). d = 2: the discrete uniform state has no drift at all
    (equispaced atoms on the circle), the odd response sees the central part of the upwind flux only: order 2.
    d ≥ 3: the midpoint quadrature leaves the uniform state an O(h²) drift (≈ 1e-4 at 64 cells), larger than the
    perturbation's, which fixes the upwind side: order 1. ε‖p‖∞ = 1e-4 keeps the nonlinearity at 1e-8."""
    beta = 2.0
    t = 1.0 / float(growth_rate(np.arange(1, 30), beta, d, attention).max())
    ns = np.array([32, 64, 128]) * (2 if d == 16 else 1)  # d = 16: the density sin^14 θ is narrow, ≈ 1/√d
    for ell in range(1, 5):
        eps = 1e-4 / _p(ell, d)[1]
        gamma_l = float(growth_rate(ell, beta, d, attention))

        def rate(n: int, ell: int = ell, eps: float = eps) -> float:
            def solve(nu0):
                r = T.finite_volume(nu0, (beta, 1.0), d, attention, 0.0, n, [0.0, t])
                return np.cos(r.theta), r.masses
            a = _odd_amplitude(solve, ell, d, eps)
            return math.log(a[1] / a[0]) / t

        err = [abs(rate(n) - gamma_l) for n in ns]
        assert 0.8 <= fit_order(1.0 / ns, err) <= 2.3, (ell, err)
        assert err[-1] < 0.1 * gamma_l, (ell, err)


# -- the flow against particles on S¹ and S² ----------------------------------------------------------------
HEADS = [[2.0, 1.0, 0.7], [0.5, -0.4, 0.3]]  # an attracting and a repelling head


def _nu0(z):
    return 1 + 0.3 * z + 0.2 * z * z


def _circle(phi0: np.ndarray, w: np.ndarray, attention: str, t: float) -> np.ndarray:
    """Particles on S¹: dφ_i/dt = Σ_h w_h c_h Σ_k w_k e^{β cos(φ_i−φ_k)} sin(φ_k − φ_i) [SA: ÷ Σ_k w_k e^{β cos}]."""
    def rhs(_t, phi):
        dp = phi[None, :] - phi[:, None]
        v = np.zeros_like(phi)
        for beta, c, wh in HEADS:
            e = w[None, :] * np.exp(beta * (np.cos(dp) - 1))
            v += wh * c * ((e * np.sin(dp)).sum(1) / (e.sum(1) if attention == "softmax" else math.exp(-beta)))
        return v
    return scipy.integrate.solve_ivp(rhs, (0, t), phi0, method="DOP853", rtol=1e-12, atol=1e-15).y[:, -1]


def _sphere(x0: np.ndarray, w: np.ndarray, attention: str, t: float) -> np.ndarray:
    """Particles on S², as vectors: dx_i/dt = Σ_h w_h c_h Σ_k w_k e^{β x_i·x_k}(x_k − (x_i·x_k) x_i) [SA: ÷ Σ_k ..]."""
    n = x0.shape[0]

    def rhs(_t, y):
        x = y.reshape(n, 3)
        g = x @ x.T
        v = np.zeros_like(x)
        for beta, c, wh in HEADS:
            e = w[None, :] * np.exp(beta * (g - 1))
            tang = e @ x - (e * g).sum(1)[:, None] * x
            v += wh * c * tang / (e.sum(1) if attention == "softmax" else np.full(n, math.exp(-beta)))[:, None]
        return v.ravel()
    return scipy.integrate.solve_ivp(rhs, (0, t), x0.ravel(), method="DOP853", rtol=1e-12, atol=1e-15).y[:, -1]


@pytest.mark.parametrize("attention", ATT)
def test_flow_matches_circle_particles(attention: str) -> None:
    """d = 2: a ring at z is the two points ±θ (B_0 = cosh is their average); 2M particles with the masses m_j/2
    from the same labels. Both integrations at rtol 1e-11/1e-12 over a depth where the map is O(1) deformed
    (γ_max t ≈ 2): 1e-8 leaves room for the global error's e^{Lt}·(steps) growth of the local 1e-12."""
    t, M = 1.5, 16
    f = T.flow(_nu0, HEADS, 2, attention, [t], M, rtol=1e-11)
    th0 = np.arccos(gauss_rule(M, 2)[0])
    phi = _circle(np.concatenate([th0, -th0]), np.concatenate([f.masses, f.masses]) / 2, attention, t)
    np.testing.assert_allclose(f.z[0], np.cos(phi[:M]), rtol=0, atol=1e-8)
    np.testing.assert_allclose(np.cos(phi[M:]), np.cos(phi[:M]), rtol=0, atol=1e-10)  # the mirror stays a mirror
    assert np.abs(f.z[0] - gauss_rule(M, 2)[0]).max() > 0.05  # and the map did move


@pytest.mark.parametrize("attention", ATT)
def test_flow_matches_sphere_particles(attention: str) -> None:
    """d = 3: each ring is P = 24 points equally spread in azimuth (the trapezoidal ring average errs by
    ≈ I_P(β)/I_0(β) < 1e-20 at β = 2), masses m_j/P, in R³; the meridian of azimuth 0 against the flow, 1e-8
    as on the circle."""
    t, M, P = 1.5, 12, 24
    f = T.flow(_nu0, HEADS, 3, attention, [t], M, rtol=1e-11)
    th0 = np.arccos(gauss_rule(M, 3)[0])
    az = 2 * np.pi * np.arange(P) / P
    x0 = np.stack([np.outer(np.sin(th0), np.cos(az)), np.outer(np.sin(th0), np.sin(az)),
                   np.outer(np.cos(th0), np.ones(P))], axis=-1).reshape(-1, 3)
    x = _sphere(x0, np.repeat(f.masses / P, P), attention, t).reshape(M, P, 3)
    np.testing.assert_allclose(f.z[0], x[:, 0, 2], rtol=0, atol=1e-8)
    np.testing.assert_allclose(np.linalg.norm(x, axis=-1), 1.0, atol=1e-8)  # DOP853 leaves the sphere by its tol
    assert np.abs(f.z[0] - gauss_rule(M, 3)[0]).max() > 0.05


def test_finite_volume_matches_flow() -> None:
    """Noise-free and nonlinear (the map O(1) deformed, still smooth): the finite volumes' degrees 1..4 converge
    to the flow's (converged in the labels: 32 and 64 agree to 1e-12) at order ≈ 1 (upwind)."""
    d, beta, t = 3, 2.0, 1.0
    f = T.flow(_nu0, (beta, 1.0), d, "unnormalised", [t], 32, rtol=1e-11)
    ref = T.degree_amplitudes(f.z, f.masses, d, 4)[0]
    g = T.flow(_nu0, (beta, 1.0), d, "unnormalised", [t], 64, rtol=1e-11)
    assert np.abs(T.degree_amplitudes(g.z, g.masses, d, 4)[0] - ref).max() < 1e-10
    ns = np.array([50, 100, 200])
    err = []
    for n in ns:
        r = T.finite_volume(_nu0, (beta, 1.0), d, "unnormalised", 0.0, n, [t])
        err.append(np.abs(T.degree_amplitudes(np.cos(r.theta), r.masses[0], d, 4) - ref)[1:].max())
    assert 0.8 <= fit_order(1.0 / ns, err) <= 2.3, err


# -- noise: decay about the uniform state, the stationary state, mass and positivity ------------------------
@pytest.mark.parametrize("attention", ATT)
@pytest.mark.parametrize("d", [2, 3, 5])
def test_noisy_decay_rate(d: int, attention: str) -> None:
    """Below K_c (β = 2, K = c = 1, τ = 1) degree ℓ decays at K γ_ℓ(β) − τ ℓ(ℓ+d−2) (theory §11; SA: γ_ℓ has the
    ÷ λ_0). Scharfetter–Gummel with midpoint velocities is second order: the error falls at order 2 ± 0.4 over
    16, 32, 64 cells (pre-asymptotic at 16 cells for d = 3, whose first cells hold O(h²) of the mass)."""
    beta, tau = 2.0, 1.0
    ns = np.array([16, 32, 64])
    for ell in (1, 2):
        rate = float(growth_rate(ell, beta, d, attention)) - tau * ell * (ell + d - 2)
        assert rate < 0
        t = 0.5 / abs(rate)
        eps = 1e-4 / _p(ell, d)[1]
        err = []
        for n in ns:
            def solve(nu0, n=n, t=t):
                r = T.finite_volume(nu0, (beta, 1.0), d, attention, tau, n, [0.0, t])
                return np.cos(r.theta), r.masses
            a = _odd_amplitude(solve, ell, d, eps)
            err.append(abs(math.log(a[1] / a[0]) / t - rate))
        assert 1.6 <= fit_order(1.0 / ns, err) <= 2.4, (ell, err)
        assert err[-1] < 0.02 * abs(rate), (ell, err)


def _gibbs_reference(beta: float, kappa: float, d: int, nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ν = e^{κΦ[ν]}/∫e^{κΦ[ν]}dσ̄ at the Gauss nodes, by Picard's iteration from a north-heavy guess (it converges
    at a stable zonal state: its derivative κ Cov_ν(K) has eigenvalues in [0, 1) there, the kernel being positive
    definite); returns (z, q, ν)."""
    z, q = gauss_rule(nodes, d)
    nu = 1 + 0.5 * z
    for _ in range(2000):
        phi = T.potential(z, z, q * nu, beta, d)[0]
        g = np.exp(kappa * (phi - phi.max()))
        new, nu = nu, g / (q @ g)
        if np.abs(new - nu).max() < 1e-14 * nu.max():
            return z, q, nu
    raise AssertionError("Picard did not converge")


def test_noisy_stationary_state() -> None:
    """Above K_c (d = 5, β = 2, τ = 1, K = 1.3 K_c: a cluster about the north pole, ν from 1.5e-4 to 324) the finite
    volumes relax (the last unit of depth changes the masses by ≪ the discretisation error) to the cell masses of
    ν ∝ exp((K/τβ)Φ[ν]), an independent Gauss–node fixed point (48 nodes; 64 agree to 1e-10): the L1 error falls
    at order 2 ± 0.4 (SG is exact for the zero-flux states at the faces' drift; the midpoint Φ is O(h²)). Every
    output is positive and keeps its mass to the round-off bound of its steps (tests/roundoff.py)."""
    d, beta, tau = 5, 2.0, 1.0
    K = 1.3 * critical_coupling(beta, tau, d)
    kappa = K / (tau * beta)
    ref = {}
    for nodes in (48, 64):
        z, q, nu = _gibbs_reference(beta, kappa, d, nodes)
        top = T.potential(np.ones(1), z, q * nu, beta, d)[0][0]  # Φ is largest at the cluster's pole
        ref[nodes] = (lambda zz, z=z, q=q, nu=nu, top=top:
                      np.exp(kappa * (T.potential(zz, z, q * nu, beta, d)[0] - top)))
    ns = np.array([16, 32, 64])
    err = []
    for n in ns:
        target = [T.cell_masses(ref[k], d, n, points=12) for k in (48, 64)]
        target = [m / m.sum() for m in target]
        assert np.abs(target[0] - target[1]).sum() < 1e-10
        r = T.finite_volume(lambda zz: 1 + 0.5 * zz, (beta, K), d, "unnormalised", tau, n, [0.0, 1.0, 2.0, 3.0, 4.0])
        assert np.all(r.masses > 0)
        assert np.abs(r.masses.sum(axis=1) - r.masses[0].sum()).max() <= conservation(r.steps, 30, n)
        err.append(np.abs(r.masses[-1] - target[0]).sum())
        assert np.abs(r.masses[-1] - r.masses[-2]).sum() < 0.05 * err[-1]
    assert 1.6 <= fit_order(1.0 / ns, err) <= 2.4, err


def test_noise_free_clusters_positive_and_conservative() -> None:
    """USA, d = 3, β = 4, noise-free: the labels gather at both poles by depth 2 (two clusters, gap 0.02 below
    their initial spacing), the finite volumes' cells above 1e-3 of the largest do too; the cell masses stay
    ≥ 0 (each Euler stage checked) and keep their total to the round-off bound of their steps."""
    d, beta, depths = 3, 4.0, [0.5, 1.0, 2.0, 4.0]
    f = T.flow(_nu0, (beta, 1.0), d, "unnormalised", depths, 48, rtol=1e-10)
    r = T.finite_volume(_nu0, (beta, 1.0), d, "unnormalised", 0.0, 100, depths)
    n_flow = [T.clusters(np.arccos(z), f.masses, d, 8) for z in f.z]
    n_fv = [T.clusters(r.theta, m, d, 100) for m in r.masses]
    assert n_flow[2:] == [2, 2] and n_fv[2:] == [2, 2], (n_flow, n_fv)
    assert np.all(r.masses >= 0)
    assert np.abs(r.masses.sum(axis=1) - 1.0).max() <= conservation(r.steps, 30, 100)


# -- the pieces -------------------------------------------------------------------------------------------
def test_bernoulli() -> None:
    """B(x) = x/(e^x − 1): equal to the naive formula where that is finite and x ≠ 0 (to a few ulps: expm1 and
    one division), B(0) = 1, B(−x) − B(x) = x, finite and ≥ 0 for |x| up to 1e4 (the upwind limits)."""
    x = np.concatenate([-np.logspace(-12, 2.5, 40), np.logspace(-12, 2.5, 40)])
    np.testing.assert_allclose(T.bernoulli(x), x / np.expm1(x), rtol=gamma(4))
    assert T.bernoulli(0.0) == 1.0
    np.testing.assert_allclose(T.bernoulli(-x) - T.bernoulli(x), x, rtol=gamma(4), atol=4 * U)
    big = T.bernoulli(np.array([-1e4, 1e4]))
    assert big[0] == 1e4 and big[1] == 0.0


def test_clusters() -> None:
    """Runs of bins above twice the uniform state's mass: none for the uniform state (cells of σ̄'s masses, any d),
    a cap, a ring and a cap at the other pole; a run below the least mass is not a cluster."""
    from scipy.special import betainc

    for d in (2, 3, 16, 512):
        edges = np.linspace(0, np.pi, 65)
        m = np.diff(betainc((d - 1) / 2, (d - 1) / 2, (1 - np.cos(edges)) / 2))
        assert T.clusters((edges[1:] + edges[:-1]) / 2, m, d, 64) == 0
    th = np.array([0.01, 0.02, 1.5, 1.52, 3.1, 2.0])
    m = np.array([0.3, 0.3, 0.2, 0.1, 0.1, 1e-9])
    assert T.clusters(th, m, 3, 64) == 3
    assert T.clusters(th, m, 3, 64, least=0.15) == 2
    with pytest.raises(ValueError):
        T.clusters(th, m, 3, 0)


def test_degree_power_of_the_labels() -> None:
    """The Gauss labels of ν0 = 1 + ε p_ℓ have μ̂ = (1, 0, .., ε, .., 0) exactly (degree ≤ 2M − 1): power (1, .., ε²)."""
    d, ell, eps = 5, 3, 0.01
    f = T.flow(lambda z: 1 + eps * _p(ell, d)[0](z), (1.0, 1.0), d, "softmax", [0.0], 16)
    want = np.zeros(6)
    want[0], want[ell] = 1.0, eps**2
    np.testing.assert_allclose(T.degree_power(f.z[0], f.masses, d, 5), want, rtol=0, atol=1e-15)


def test_bad_input() -> None:
    one = (1.0, 1.0)
    with pytest.raises(ValueError, match="attention"):
        T.flow(_nu0, one, 3, "linear", [1.0], 8)
    with pytest.raises(ValueError, match="d must"):
        T.finite_volume(_nu0, one, 1, "softmax", 0.0, 8, [1.0])
    with pytest.raises(ValueError, match="heads"):
        T.heads([[0.0, 1.0]])
    with pytest.raises(ValueError, match="nu0"):
        T.flow(lambda z: z, one, 3, "softmax", [1.0], 8)
    with pytest.raises(ValueError, match="depths"):
        T.flow(_nu0, one, 3, "softmax", [1.0, 0.5], 8)
    with pytest.raises(ValueError, match="noise"):
        T.finite_volume(_nu0, one, 3, "softmax", -1.0, 8, [1.0])
    with pytest.raises(ValueError, match="cell masses"):
        T.finite_volume(np.ones(7), one, 3, "softmax", 0.0, 8, [1.0])
    np.testing.assert_array_equal(T.heads((2.0, 0.5)), [[2.0, 0.5, 1.0]])
