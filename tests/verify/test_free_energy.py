"""The floor formula of ``free_energy_exact`` and the helpers of bench/bench_free_energy.py, against references
they do not use: a direct minimisation of the lumped free energy, Gaussian entropies, and a convexity test."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from mpi4py import MPI  # noqa: F401  (before dolfinx, imported by the bench module)

import numpy as np
import pytest

from mfpde.verify.free_energy import THETA_BOX, poisson_floor
from mfpde.verify.training import K_SHALLOW, LAM, LAM2, _fstar

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_free_energy as bfe  # noqa: E402


def _lumped_minimum(cells: int) -> float:
    """min F_h over nodal densities on the uniform mesh of [−3, 3] (trapezoidal weights), by the Gibbs iteration.

    F_h(ρ) = ½(m₀ + kā − y)² + Σ m_i(λ₂x_i²/2 ρ_i + λρ_i log ρ_i), ā = Σ m_i x_i ρ_i: the minimiser is
    ρ_i ∝ e^{−(g(ā)x_i + λ₂x_i²/2)/λ}, g = k(m₀ + kā − y), iterated to its fixed point (a contraction:
    dā_new/dā = −k²/λ₂ ≈ −0.11). Written from the definition, not from the code's assembly.
    """
    x = np.linspace(-THETA_BOX, THETA_BOX, cells + 1)
    m = np.full_like(x, 2 * THETA_BOX / cells)
    m[[0, -1]] /= 2
    m0, y, abar = 0.3, 1.0, 0.0
    for _ in range(200):
        g = K_SHALLOW * (m0 + K_SHALLOW * abar - y)
        e = -(g * x + 0.5 * LAM2 * x * x) / LAM
        rho = np.exp(e - e.max())
        rho /= m @ rho
        abar = float(m @ (x * rho))
    return float(0.5 * (m0 + K_SHALLOW * abar - y) ** 2 + m @ (0.5 * LAM2 * x * x * rho + LAM * rho * np.log(rho)))


@pytest.mark.parametrize("cells", [12, 16, 20])
def test_poisson_floor_matches_the_lumped_minimum(cells):
    """(P) with its remainder bound contains the floor of a direct minimisation (to round-off, 1e-14)."""
    astar, _, fstar = _fstar()
    pred, bound = poisson_floor(2 * THETA_BOX / cells, astar)
    floor = _lumped_minimum(cells) - fstar
    assert abs(floor - pred) <= bound + 1e-14, (floor, pred, bound)
    assert abs(pred) > 10 * (bound + 1e-14)  # the prediction is resolved, not inside its own slack


def test_knn_entropy_of_a_gaussian():
    """Kozachenko–Leonenko on 20 000 normal samples: ∫ρ log ρ = −½ log(2πeσ²) in p = 1 and −log(2πeσ²) in p = 2,
    within 5 standard errors (the estimator's per-sample spread, ~1.3/√H, bounds its error here)."""
    rng = np.random.default_rng(3)
    for p in (1, 2):
        th = 0.3 * rng.standard_normal((20000, p))
        exact = -0.5 * p * math.log(2 * math.pi * math.e * 0.09)
        assert abs(bfe.negentropy_knn(th) - exact) < 5 * 1.3 * p / math.sqrt(20000)


def test_fixed_points_are_minima():
    """F* of both families is below F of perturbed Gaussians (F computed here from R, the moments, and the
    Gaussian entropy), and the value-head minimiser with one sample is the closed form of mfpde.exact."""
    fp = bfe.fixed_point("value")
    k = bfe.M * (1 + bfe.A_FIXED * bfe.SIG2)

    def F_value(a: float, v: float) -> float:
        return float(np.mean(0.5 * (bfe.M + k * a - bfe.TGT) ** 2) + 0.5 * LAM2 * (a * a + v)
                     - 0.5 * LAM * math.log(2 * math.pi * math.e * v))

    a, v = fp["mean"][0], LAM / LAM2
    assert abs(F_value(a, v) - fp["F"]) < 1e-14
    for da, dv in ((1e-3, 0.0), (-1e-3, 0.0), (0.0, 1e-3), (0.0, -1e-3)):
        assert F_value(a + da, v + dv) > fp["F"]
    sc = bfe.fixed_point("scalar")
    assert sc["F"] > fp["F"] - 1.0 and np.isfinite(sc["rate"]) and sc["rate"] > 0


def test_reach_time_needs_the_gap_to_stay_below():
    """A gap that dips below the tolerance and comes back does not count until it stays."""
    gap, wall = [1.0, 1e-4, 1e-2, 1e-4, 1e-6], [0.0, 1.0, 2.0, 3.0, 4.0]
    assert bfe.reach_time(gap, wall, 1e-3) == 3.0
    assert bfe.reach_time(gap, wall, 1e-5) == 4.0
    assert math.isnan(bfe.reach_time(gap, wall, 1e-8))


def test_particles_are_near_the_pde_after_training():
    """Value heads, H = 4096, 30 steps of the exact OU step: |F_H − F*| with the k-NN entropy is below 1e-2, the
    PDE's gap (60 Θ cells) is below its certificate at every step and below 1e-3 at s = 3, with the token solve
    and with the closed-form δR/δρ alike (the same Fokker–Planck step on the same drift: equal to round-off)."""
    part = bfe.particles("value", 4096, 0, 0.1, 30, [0, 30])
    assert abs(part["knn"][-1]) < 1e-2 and abs(part["kde"][-1]) < 1e-2
    assert len(part["dyn"]) == len(part["knn_s"]) == 31 and math.isnan(part["kde"][1])
    runs = [bfe.pde("value", 60, 0.1, 30, kind) for kind in ("token", "closed")]
    for run in runs:
        assert all(c >= g - 1e-12 for c, g in zip(run["cert"], run["gap"], strict=True))
        assert 0 < run["gap"][-1] < 1e-3
    # the gaps are O(1e-1 … 1e-6) sums of O(1) terms over 61 nodes: round-off ≤ γ_{2·61}·(|F| + 1) < 1e-13
    assert np.max(np.abs(np.subtract(runs[0]["gap"], runs[1]["gap"]))) < 1e-13


@pytest.mark.parametrize("family", ["value", "scalar"])
def test_token_drift_is_the_closed_form(family):
    """mfpde's first variation at the heads as a weighted point set (the token solve) is the closed-form drift.

    The discrete single layer is exact for these Gaussian moments (the PDE's gap reaches round-off), so the two
    agree to round-off for value heads; for scalar heads ∂_a D is a central difference of step ε = 1e-5, exact
    for the affine D up to its round-off ε_mach·|D|/ε ≈ 1e-11 (bound 1e-9).
    """
    from fe_runs import token_drift_probe

    probe = token_drift_probe(family, 64, repeats=1)
    assert probe["dev"] < (1e-13 if family == "value" else 1e-9), probe


def test_particle_times_stop_at_the_floor():
    """Synthetic runs: gap 10^{−k} decaying onto ±1e-3 noise, unit costs. The floor is the noise's RMS, tolerances
    below it are never reached, and the time to a tolerance above it counts every step's estimate (k-NN at every
    step), only those at the given rows, or none (dynamics only)."""
    from fe_report import particle_times

    n = 40
    noise = 1e-3 * np.where(np.arange(n) % 2 == 0, 1.0, -1.0)  # RMS exactly 1e-3
    gap = np.maximum(10.0 ** -(np.arange(n) / 2.0), 0.0) + noise
    runs = [{"knn": gap.tolist(), "dyn": [1.0] * n, "knn_s": [10.0] * n} for _ in range(2)]
    pt = particle_times(runs, (1e-2, 8e-4), rows=[0, 2, 4, 8, 16, 32])
    assert abs(pt["floor"] - 1e-3) < 1e-12
    assert np.min(np.abs(gap)) < 8e-4  # step 7 dips below 8e-4 ...
    assert math.isnan(pt["every"][1]) and math.isnan(pt["dyn"][1])  # ... but 8e-4 < floor: never seen
    k = int(np.nonzero(np.abs(gap) <= 1e-2)[0][0])  # first crossing of 1e-2
    assert pt["every"][0] == 11.0 * (k + 1) and pt["dyn"][0] == float(k + 1)
    r = 8  # the first row at or after the crossing (k = 5: rows 0, 2, 4 are above 1e-2, row 8 below)
    assert pt["rows"][0] == (r + 1) + 10.0 * 4  # dynamics of steps 0..8, estimates at rows 0, 2, 4, 8
