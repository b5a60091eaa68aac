"""mfpde.fitting.fit_power against an exact power law and against scipy.stats.linregress (an independent fit);
slope_tolerance against the slopes of every extreme perturbation (numpy's polyfit)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.stats

from mfpde.fitting import fit_power, slope_tolerance


def test_exact_law_and_its_inverse():
    x = np.array([10.0, 100.0, 1000.0])
    law = fit_power(x, 3.0 * x**-0.7)
    assert law.q == pytest.approx(-0.7, abs=1e-12) and law.se_q < 1e-12
    assert law(50.0) == pytest.approx(3.0 * 50.0**-0.7, rel=1e-12)
    x_at, rel = law.solve(1e-3)
    assert x_at == pytest.approx((1e-3 / 3.0) ** (1 / -0.7), rel=1e-10) and rel < 1e-10


def test_standard_errors_equal_linregress():
    rng = np.random.default_rng(0)
    x = np.geomspace(1e2, 1e5, 6)
    y = 2.0 * x**-0.5 * np.exp(0.1 * rng.standard_normal(6))
    law, ref = fit_power(x, y), scipy.stats.linregress(np.log(x), np.log(y))
    assert law.q == pytest.approx(ref.slope, rel=1e-12)
    assert law.se_q == pytest.approx(ref.stderr, rel=1e-10)
    assert law.se_logc == pytest.approx(ref.intercept_stderr, rel=1e-10)


@pytest.mark.parametrize("rel", [0.02, 0.3])
def test_slope_tolerance_bounds_every_perturbation_and_is_attained(rel):
    """|slope(v*) − slope(v)| over every v* with |v_i − v*_i| ≤ b_i (the corners of the box: the slope of log v* is
    monotone in each v*_i), fitted by numpy's polyfit: never above slope_tolerance(x, v, b), and with equal relative
    bounds E within the asymmetry of the logarithm of it: the worst corner moves log v_i by −log(1 − E) where
    w_i > 0 and by log(1 + E) where w_i < 0 (Σ w_i = 0 splits Σ|w_i| in halves), the bound by −log(1 − E) for all."""
    rng = np.random.default_rng(1)
    x = np.geomspace(10.0, 1e4, 5)
    v = 2.0 * x**-0.8 * np.exp(0.2 * rng.standard_normal(5))

    def worst(b):
        q = np.polyfit(np.log(x), np.log(v), 1)[0]
        return max(abs(np.polyfit(np.log(x), np.log(v + np.array(s) * b), 1)[0] - q)
                   for s in itertools.product((-1.0, 1.0), repeat=len(x)))

    uneven = rel * v * rng.uniform(0.2, 1.0, 5)
    assert worst(uneven) <= slope_tolerance(x, v, uneven) * (1 + 1e-12)
    attained = (np.log1p(rel) - np.log1p(-rel)) / (-2 * np.log1p(-rel))
    assert worst(rel * v) == pytest.approx(attained * slope_tolerance(x, v, rel * v), rel=1e-9)
