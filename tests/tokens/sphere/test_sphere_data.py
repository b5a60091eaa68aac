"""Initial data on S² (mfpde.tokens.sphere.data) against references it does not use: the product quadrature's
exactness, a brute-force dense grid for the minimum, the noise's distribution."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mfpde.tokens.sphere.data import (
    NOISE_FLOOR,
    fibonacci_points,
    modes_density,
    modes_minimum,
    noise_modes,
    product_quadrature,
)
from mfpde.tokens.sphere.harmonics import real_harmonics

EPS = 2.0**-52
MODES = [[1, 0, 0.05], [2, -1, 0.03], [3, 2, -0.04], [5, 5, 0.02]]


def _grid(n: int) -> np.ndarray:
    """A colatitude × longitude grid of n × 2n unit vectors including both poles."""
    th, ph = np.meshgrid(np.linspace(0, math.pi, n), np.linspace(0, 2 * math.pi, 2 * n, endpoint=False), indexing="ij")
    return np.stack([np.sin(th) * np.cos(ph), np.sin(th) * np.sin(ph), np.cos(th)], axis=-1).reshape(-1, 3)


@pytest.mark.parametrize("N", [1, 4, 9])
def test_product_quadrature_is_exact_to_degree_2N_minus_1(N):
    x, w = product_quadrature(N)
    G = real_harmonics(2 * N - 1, x).T @ w  # ∫ Y_ℓm = √(4π) δ_ℓ0
    ref = np.zeros_like(G)
    ref[0] = math.sqrt(4 * math.pi)
    assert np.max(np.abs(G - ref)) < 100 * EPS
    # and not beyond: Y_{2N,0} is integrated wrongly
    assert abs(real_harmonics(2 * N, x)[:, 4 * N * N + 2 * N] @ w) > 1e-6


def test_modes_density_has_mass_one_to_roundoff():
    x, w = product_quadrature(8)  # degree 15 ≥ 5
    mu = modes_density(MODES, x)
    assert abs(mu @ w - 1.0) < 50 * EPS
    # the value itself: Y_10 = √(3/4π) z
    z = np.array([[0.0, 0.0, 1.0]])
    assert abs(modes_density([[1, 0, 0.1]], z)[0] - (1 / (4 * math.pi) + 0.1 * math.sqrt(3 / (4 * math.pi)))) < 1e-15


@pytest.mark.parametrize("bad", [[[0, 0, 0.1]], [[2, 3, 0.1]], [[1.5, 0, 0.1]], [[2, 0]]])
def test_bad_modes_are_refused(bad):
    with pytest.raises(ValueError, match="mode"):
        modes_density(bad, np.array([[0.0, 0.0, 1.0]]))


@pytest.mark.parametrize("modes", [MODES, [[1, 1, 0.1]], [[4, 2, 0.1], [4, -3, 0.05], [6, 0, 0.03]]])
def test_minimum_against_a_dense_grid(modes):
    m = modes_minimum(modes)
    brute = float(modes_density(modes, _grid(400)).min())
    # the grid (spacing h = π/400) is above the true minimum by ≤ ½|Hess| h² ≤ ½ Σ|a| ℓ(ℓ+1) max|Y| h²
    L = max(int(mo[0]) for mo in modes)
    bound = 0.5 * sum(abs(a) for _, _, a in modes) * L * (L + 1) * math.sqrt((2 * L + 1) / (4 * math.pi)) \
        * (math.pi / 400) ** 2
    assert m <= brute + 1e-14
    assert m >= brute - bound - 1e-14
    # it is a value of μ_0 somewhere (not below the function): no lattice point below it
    assert m <= float(modes_density(modes, fibonacci_points(20000)).min()) + 1e-14


def test_a_single_mode_minimum_in_closed_form():
    a = 0.1  # 1/4π + a Y_10: minimum at the south pole, 1/4π − a √(3/4π)
    assert abs(modes_minimum([[1, 0, a]]) - (1 / (4 * math.pi) - a * math.sqrt(3 / (4 * math.pi)))) < 1e-13


def test_noise_is_seeded_and_scaled():
    a = noise_modes(0.1, 3, 6)
    assert a == noise_modes(0.1, 3, 6)
    assert a != noise_modes(0.1, 4, 6)
    assert [(m[0], m[1]) for m in a] == [(ll, m) for ll in range(1, 7) for m in range(-ll, ll + 1)]
    # unit pointwise variance of ξ: (4π)² Σ a² / 4π = amplitude² on average over seeds (48 coefficients, 200 seeds:
    # the mean of χ²_48/48 has sd √(2/48)/√200 ≈ 0.014)
    v = np.mean([sum(m[2] ** 2 for m in noise_modes(0.1, s, 6)) * 4 * math.pi / 0.01 for s in range(200)])
    assert abs(v - 1.0) < 0.06


def test_a_large_noise_is_scaled_to_the_floor():
    modes = noise_modes(5.0, 1, 4)
    assert abs(modes_minimum(modes) - NOISE_FLOOR / (4 * math.pi)) < 1e-12
    x, w = product_quadrature(6)
    assert abs(modes_density(modes, x) @ w - 1.0) < 100 * EPS


def test_modes_minimum_and_density_need_memory_linear_in_the_points():
    """A mode of degree L = 32: the lattice of 64 L² points must not be evaluated as the matrix of its (L+1)²
    harmonics (571 MB here; 8.8 GB at L = 64, the highest degree a config may give): O(n) memory, a few doubles per
    lattice point and per block of the recurrence."""
    import tracemalloc

    L = 32
    n = 64 * L * L
    tracemalloc.start()
    try:
        low = modes_minimum([[L, L, 1e-3]])
        modes_density([[L, L, 1e-3]], fibonacci_points(n))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 * 8 * n  # the matrix: (L+1)² = 1089 doubles per point
    y = real_harmonics(L, fibonacci_points(4000))[:, L * L + 2 * L]  # Y_LL, |Y_LL| at most its equator value
    assert low < 1 / (4 * math.pi) - 1e-3 * np.max(np.abs(y)) + 1e-12
