"""mfpde.fitting.fit_power against an exact power law and against scipy.stats.linregress (an independent fit)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats

from mfpde.fitting import fit_power


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
