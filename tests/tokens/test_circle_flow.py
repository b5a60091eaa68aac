"""The Lagrangian flow-map solver on the circle (theory §9) against the closed-form growth rates, finite
differences and the Eulerian DG solver (a different discretisation of the same continuity equation)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mfpde.fitting import fit_order, fit_rate
from mfpde.tokens.attention import HeadMeasure
from mfpde.tokens.circle import CircleMesh, CircleTransport
from mfpde.tokens.circle_diag import _grid, cdf_density, initial_density, w1_circle
from mfpde.tokens.circle_flow import FlowMap, cluster_masses, modes_cdf, modes_density
from mfpde.verify.circle import gamma_k


@pytest.mark.parametrize("attention", ["unnormalised", "softmax"])
def test_jacobian_against_finite_differences(attention):
    """Central differences of step 1e-6: error O(1e-12 |u'''|) + round-off ε|u|/1e-6 ≈ 1e-10 relative."""
    fm = FlowMap(modes_density([[2, 0.3, 0.1]]), 30, 5.0, attention)
    X = fm.xi + 0.1 * np.sin(3 * fm.xi)
    J, h, eye = fm.jacobian(0.0, X), 1e-6, np.eye(30)
    Jn = np.array([(fm.velocity(0.0, X + h * eye[k]) - fm.velocity(0.0, X - h * eye[k])) / (2 * h)
                   for k in range(30)]).T
    assert np.max(np.abs(J - Jn)) < 1e-8 * np.max(np.abs(J))


@pytest.mark.parametrize("attention", ["unnormalised", "softmax"])
def test_growth_rates_against_bessel(attention):
    """Modes 1..8 from ±1e-6 (odd part): the trapezoidal rule is spectral, so at M = 48 the rates are within 1e-6
    of max γ (cubic terms ε² e^{2γT} ≈ 3e-9, integrator rtol 1e-13 on displacements of 1e-6)."""
    beta, K = 5.0, 8
    k = np.arange(1, K + 1)
    ex = gamma_k(k, beta, attention)
    ts = np.linspace(0.0, 4.0 / ex.max(), 21)
    ph = np.random.default_rng(0).uniform(0, 2 * math.pi, K)
    hats = {}
    for s in (1.0, -1.0):
        fm = FlowMap(modes_density([[kk, s * 1e-6, p] for kk, p in zip(k, ph, strict=True)]), 48, beta, attention)
        hats[s] = np.array([fm.fourier(x, K) for x in fm.solve(ts, rtol=1e-13, atol=1e-15).X])
    odd = np.abs(hats[1.0] - hats[-1.0]) / 2
    lam = np.array([-fit_rate(ts, odd[:, j]) for j in range(K)])
    assert np.max(np.abs(lam - ex)) / ex.max() < 1e-6


def test_w1_against_the_dg_solver_converges_at_order_two():
    """Clusters forming (USA, β = 5, t = 0.5): W1(flow map, DG2 on 256 cells) falls like M^{-2} (the linear
    interpolation of the transported CDF), while the DG reference's own error (W1 to 128 cells / 3, a quarter of
    the default growth cap in depth) is ≤ 1e-6, below the flow map's 1e-3..1e-4."""
    modes = [[1, 2e-4, 0.0], [2, 1e-4, 1.3], [3, 1e-4, 1.0], [4, 1e-4, 2.5], [5, 5e-5, 2.0]]
    Mg = 2**14

    def dg(n):
        mesh = CircleMesh(n, 2)
        op = CircleTransport(mesh, "unnormalised", max_dt=0.025 / 18.6)
        rep = op.solve(initial_density(mesh, "circle_modes", modes), HeadMeasure(np.array([5.0]), np.array([1.0])), 0.5,
                       10)
        assert rep.mu_T.max() > 4 / (2 * math.pi)  # clusters forming
        return cdf_density(mesh, rep.mu_T, Mg)

    ref = dg(256)
    assert w1_circle(ref, dg(128)) / 3 < 1e-6
    errs = []
    for M in (48, 96):
        fm = FlowMap(modes_density(modes), M, 5.0)
        X = fm.solve(np.array([0.0, 0.5]), rtol=1e-10, atol=1e-12).X[-1]
        errs.append(w1_circle(fm.cdf(X, modes_cdf(modes), _grid(Mg)), ref))
    assert abs(fit_order([48, 96], errs) + 2.0) < 0.25


def test_cluster_masses_across_the_cut():
    X = np.array([0.1, 0.11, 0.12, 2.0, 2.01, 6.2, 6.25])
    assert sorted(cluster_masses(X, np.ones(7), 0.2)) == [2.0, 5.0]
    assert cluster_masses(X, np.ones(7), 10.0).tolist() == [7.0]
