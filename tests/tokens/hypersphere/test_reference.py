"""The independent spectral reference :mod:`mfpde.verify.hypersphere_reference` (zonal states on S^{d-1}).

Checked against published/known values (β*, K_c, K_f, K_M for τ = 1), against scipy's own Bessel, Gegenbauer
and adaptive quadrature (Funk–Hecke, harmonic dimensions), against a direct surface integral of the kernel on
S¹ and S² (stationarity of the computed states), the envelope identity dE/dK = −(1/2β)∬e^{βx·y}μμ along the
branch, and for self-convergence in the number n of Gauss–Jacobi nodes (n against 2n).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.integrate
import scipy.special as sp

from mfpde.verify import hypersphere_reference as H

TAU = 1.0
# (d, β) -> (K_c, K_f, K_M) at τ = 1, known to 10 digits
KNOWN = {
    (2, 3.0): (0.7588462084, 0.7502601061, 0.7521877664),
    (3, 2.5): (1.6836342486, 1.6128270512, 1.6280872952),
}


def _p(ell: int, z: np.ndarray | float, d: int) -> np.ndarray | float:
    """P_ℓ normalised to P_ℓ(1) = 1, from scipy (Chebyshev T for d = 2, Gegenbauer otherwise)."""
    if d == 2:
        return sp.eval_chebyt(ell, z)
    lam = 0.5 * (d - 2)
    return sp.eval_gegenbauer(ell, lam, z) / sp.eval_gegenbauer(ell, lam, 1.0)


def _nu_integral(f, d: int) -> float:
    """∫ f(z) dν, dν = (1 − z²)^α dz / B, by QUADPACK's algebraic-weight rule (no Gauss–Jacobi nodes)."""
    alpha = 0.5 * (d - 3)
    num = scipy.integrate.quad(f, -1, 1, weight="alg", wvar=(alpha, alpha), epsabs=1e-14, epsrel=1e-11, limit=200)[0]
    return num / (2 ** (2 * alpha + 1) * sp.beta(alpha + 1, alpha + 1))


@pytest.mark.parametrize("d, value", [(2, 2.446918), (3, 1.816155), (4, 1.575257), (64, 1.031494)])
def test_beta_star(d: int, value: float) -> None:
    b = H.beta_star(d)
    assert b == pytest.approx(value, abs=1e-6)
    assert sp.iv(d / 2 + 1, b) / sp.iv(d / 2, b) == pytest.approx(1.0 / d, rel=1e-12)


def test_lam_special_cases() -> None:
    ell = np.arange(12)
    for beta in (0.3, 3.0, 11.0):
        np.testing.assert_allclose(H.lam(ell, beta, 2), sp.iv(ell, beta), rtol=1e-13)
        np.testing.assert_allclose(H.lam(ell, beta, 3), sp.spherical_in(ell, beta), rtol=1e-13)
    # no underflow for ν ≫ β: finite, positive, log-consistent with the series' leading term
    big = H.lam(np.array([0, 1, 200]), 1.2, 512)
    assert np.all(np.isfinite(big)) and np.all(big[:2] > 0)
    lb = H.log_bessel_i(np.array([400.0, 2000.0]), 1.5)
    lead = np.array([400.0, 2000.0]) * math.log(0.75) - sp.gammaln(np.array([401.0, 2001.0]))
    np.testing.assert_allclose(lb, lead, rtol=1e-6)


@pytest.mark.parametrize("d", [2, 3, 5, 16])
def test_funk_hecke_and_norms(d: int) -> None:
    """∫ e^{βz} P_ℓ(z) dν = λ_ℓ(β) (Funk–Hecke at x = e) and ∫ P_ℓ² dν = 1/N(d, ℓ), by adaptive quadrature."""
    beta = 2.0
    for ell in range(6):
        fh = _nu_integral(lambda z, k=ell: math.exp(beta * z) * _p(k, z, d), d)
        assert fh == pytest.approx(H.lam(ell, beta, d), rel=1e-10, abs=1e-14)
        norm = _nu_integral(lambda z, k=ell: _p(k, z, d) ** 2, d)
        assert norm == pytest.approx(1.0 / H.harmonic_dimension(ell, d)[0], rel=1e-10)
    z = np.linspace(-1, 1, 7)
    P = H.gegenbauer(5, z, d)
    for ell in range(6):
        np.testing.assert_allclose(P[:, ell], _p(ell, z, d), atol=1e-13)


@pytest.mark.parametrize("key", sorted(KNOWN))
def test_known_values(key: tuple[int, float]) -> None:
    d, beta = key
    kc, kf, km = KNOWN[key]
    r = H.fold_maxwell_point(beta, TAU, d, 40)
    assert H.k_c(beta, TAU, d) == pytest.approx(kc, rel=1e-9)
    assert r.K_c == pytest.approx(kc, rel=1e-9)
    assert r.K_f == pytest.approx(kf, rel=1e-8)
    assert r.K_M == pytest.approx(km, rel=1e-8)
    assert (r.K_f, r.K_M) == H.fold_and_maxwell(beta, TAU, d, 40)
    assert abs(r.K_f_golden - r.K_f) <= 1e-12 * r.K_f  # Brent minimisation of K(a) agrees with dK/da = 0
    assert r.K_f < r.K_M < r.K_c and r.a_f < r.a_M


@pytest.mark.parametrize("d, beta, n", [(2, 3.0, 40), (3, 2.5, 40), (4, 2.0, 40), (16, 2.0, 40), (64, 1.2, 40)])
def test_n_convergence(d: int, beta: float, n: int) -> None:
    """n and 2n Gauss–Jacobi nodes (and L = n/2, n Gegenbauer modes) agree to ~1e-12."""
    a = H.fold_maxwell_point(beta, TAU, d, n)
    b = H.fold_maxwell_point(beta, TAU, d, 2 * n)
    for x, y in zip(a[:3], b[:3], strict=True):
        assert math.isfinite(x) and x == pytest.approx(y, rel=1e-11)
    assert a.K_f < a.K_M < a.K_c


def test_supercritical_has_no_fold() -> None:
    with pytest.raises(ValueError, match="supercritical"):
        H.fold_and_maxwell(2.0, TAU, 2, 40)


def _mu_and_phi(state: H.State, beta: float, d: int):
    """μ(z) = e^{κΦ(z)}/∫e^{κΦ}dσ and Φ(z) = Σ_ℓ N_ℓ λ_ℓ m_ℓ P_ℓ(z) from the state's moments m_ℓ = ∫ μ P_ℓ dσ."""
    L = state.moments.size - 1
    ell = np.arange(L + 1)
    coef = H.harmonic_dimension(ell, d) * H.lam(ell, beta, d) * state.moments

    def phi(z):
        return sum(c * _p(int(k), z, d) for k, c in zip(ell, coef, strict=True))

    log_area = H.log_sphere_area(d - 1)
    zq, wq = sp.roots_legendre(200) if d == 3 else (None, None)
    if d == 2:
        th = np.linspace(0, 2 * np.pi, 512, endpoint=False)
        norm = np.sum(np.exp(state.kappa * phi(np.cos(th)))) * (2 * np.pi / th.size)
    else:  # d = 3: dσ = dz dφ
        norm = 2 * np.pi * np.sum(wq * np.exp(state.kappa * phi(zq)))
    assert math.log(norm) > -log_area - 50  # sane

    def mu(z):
        return np.exp(state.kappa * phi(z)) / norm

    return mu, phi


@pytest.mark.parametrize("d, beta", [(2, 3.0), (3, 2.5)])
def test_stationarity_by_direct_surface_integral(d: int, beta: float) -> None:
    """Φ(x) = ∫ e^{β x·y} μ(y) dσ(y) computed on the surface itself (trapezoid in angles, Gauss–Legendre in z),
    without Funk–Hecke, equals the spectral Φ, and μ = e^{κΦ}/∫e^{κΦ}dσ has mass 1 and first moment a."""
    st = H.solve_state(0.6, beta, TAU, d, 40)
    mu, phi = _mu_and_phi(st, beta, d)
    xs = np.linspace(-1, 1, 9)
    if d == 2:
        th = np.linspace(0, 2 * np.pi, 512, endpoint=False)
        dth = 2 * np.pi / th.size
        muy = mu(np.cos(th))
        assert np.sum(muy) * dth == pytest.approx(1.0, rel=1e-13)
        assert np.sum(muy * np.cos(th)) * dth == pytest.approx(st.a, rel=1e-12)
        for x in xs:
            tx = math.acos(x)
            direct = np.sum(np.exp(beta * np.cos(th - tx)) * muy) * dth
            assert direct == pytest.approx(phi(x), rel=1e-12)
    else:
        zq, wq = sp.roots_legendre(120)
        ph = np.linspace(0, 2 * np.pi, 256, endpoint=False)
        dph = 2 * np.pi / ph.size
        muy = mu(zq)
        assert 2 * np.pi * np.sum(wq * muy) == pytest.approx(1.0, rel=1e-13)
        assert 2 * np.pi * np.sum(wq * muy * zq) == pytest.approx(st.a, rel=1e-12)
        for x in xs:
            sx = math.sqrt(max(0.0, 1 - x * x))
            dot = x * zq[:, None] + sx * np.sqrt(1 - zq[:, None] ** 2) * np.cos(ph[None, :])
            direct = np.sum(wq[:, None] * np.exp(beta * dot) * muy[:, None]) * dph
            assert direct == pytest.approx(phi(x), rel=1e-12)


@pytest.mark.parametrize("d, beta", [(2, 3.0), (3, 2.5), (16, 2.0)])
def test_branch_energy(d: int, beta: float) -> None:
    """E − E_uniform matches the stored difference; K(a) → K_c as a → 0; and the envelope identity
    dE/dK = −(1/2β) ∬ e^{βx·y} μμ dσdσ = −(1/2β) Σ_ℓ N_ℓ λ_ℓ m_ℓ² holds along the branch (central differences)."""
    h = 1e-4
    centres = np.array([0.2, 0.8])
    amps = np.sort(np.concatenate([[1e-3], centres - h, centres, centres + h]))
    br = H.branch(beta, TAU, d, amps, 40)
    np.testing.assert_allclose(br.E - br.E_uniform, br.dE, atol=1e-12)
    kc = H.k_c(beta, TAU, d)
    assert br.K[0] == pytest.approx(kc, rel=1e-5)
    e0 = -TAU * H.log_sphere_area(d - 1) - br.K * H.lam(0, beta, d) / (2 * beta)
    np.testing.assert_allclose(br.E_uniform, e0, rtol=1e-14)
    for c in centres:
        i = int(np.argmin(np.abs(br.a - c)))
        s = br.states[i]
        ell = np.arange(s.moments.size)
        interaction = np.sum(H.harmonic_dimension(ell, d) * H.lam(ell, beta, d) * s.moments**2)
        dEdK = (br.E[i + 1] - br.E[i - 1]) / (br.K[i + 1] - br.K[i - 1])
        assert dEdK == pytest.approx(-interaction / (2 * beta), rel=1e-6)
        dKda = (br.K[i + 1] - br.K[i - 1]) / (2 * h)
        assert s.dK_da == pytest.approx(dKda, rel=1e-6, abs=1e-8)
