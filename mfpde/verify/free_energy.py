"""The exact free-energy curve of entropic training: its rate and its discretisation floor (theory §4, §5.4, §6.2).

The problem of :mod:`mfpde.verify.training`: shallow model, value heads θ = v (a = 0.5), one Gaussian sample
N(0.3, 0.25), target 1, λ = 0.1, λ₂ = 1, Θ = [−3, 3]; F* and ρ* = N(ā*, v*), v* = λ/λ₂, in closed form
(:func:`mfpde.exact.shallow_fixed_point`).

* ``free_energy_exact``: F(ρ_s) − F*_exact over many decades: (i) its fitted rate against the same fit of the
  exact Lie law (:func:`mfpde.exact.shallow_lie_law`), (ii) on a fine Θ mesh it falls to round-off, and (iii)
  on coarse Θ meshes it stops at the floor the theory predicts, which does not depend on Δs.

The floor. The Lie step is backward Euler with the potential frozen, and the Scharfetter–Gummel flux vanishes
on ρ_i ∝ e^{−Φ_i/λ}, so its fixed point, for every Δs, is the minimiser of the lumped free energy
F_h(ρ) = R(ā_h) + Σ_i m_i(λ₂x_i²/2 ρ_i + λ ρ_i log ρ_i), ā_h = Σ m_i x_i ρ_i. The lumped weights of P1 on a
uniform mesh are the trapezoidal rule. By duality F* = max_β D(β), D(β) = −R*(β) − λ log Z(β), with
Z(β) = ∫ e^{−(βv + λ₂v²/2)/λ} dv (and F_h* with the trapezoidal Z_h). For the Gaussian integrand the Poisson
summation formula gives Z_h/Z = 1 + δ(β), δ = 2 Σ_{k≥1} e^{−2π²k²v*/h²} cos(2πk(μ − x₀)/h), μ = −β/λ₂ the
Gaussian's mean, x₀ = −3 the first node. The envelope theorem gives the floor to first order in δ:

    F_h* − F* = −λ δ(β*) + r,   μ(β*) = ā*,                                                     (P)

so the floor shrinks like e^{−2π²v*/h²} (spectral accuracy of the lumped quadrature on a Gaussian), not at a
power of h. The remainder: D is quadratic with D'' = −(1/k² + 1/λ₂), so max(D + e) − D(β*) − e(β*) =
e'²/(2|D''|) to second order, e = −λ log(1 + δ); with |δ'| ≤ 2 Σ_k e^{−2π²k²v*/h²} 2πk/(hλ₂):
|r| ≤ λ²δ'² λ₂k²/(2(λ₂ + k²)) + λδ²/2, doubled for the cubic terms (δ < 1e-4 on the meshes used), plus the
Gaussian's mass outside Θ (e^{−(3 − |ā*|)²/(2v*)} < 1e-16) and the terms k ≥ 3 of δ in (P), kept in it.
"""

from __future__ import annotations

import math

import numpy as np

from mfpde.exact import shallow_gap, shallow_lie_law
from mfpde.fitting import fit_order, richardson_bound
from mfpde.verify.models import A_FIXED, M0, S0
from mfpde.verify.registry import Outcome, Series, register
from mfpde.verify.training import (
    K_SHALLOW,
    LAM,
    LAM2,
    RHO0_MEAN,
    RHO0_VAR,
    THETA_ORDER_MIN,
    _fstar,
    _rate_fit,
    _roundoff,
    trajectory,
)

__all__ = ["poisson_floor"]

#: Θ = [−B, B] of :func:`mfpde.verify.training.trajectory`.
THETA_BOX = 3.0
#: The long run: Δs, steps, the fine Θ mesh and its half (Richardson of the rate); the fit window of gap/gap₀.
LONG_DS, LONG_STEPS, LONG_CELLS, WINDOW = 0.1, 160, (150, 75), (1e-2, 1e-7)
#: The floor runs: coarse Θ meshes (cells on [−3, 3]), Δs and steps (converged: (1/1.5)^steps ≪ ε).
FLOOR_CELLS, FLOOR_DS, FLOOR_STEPS = (16, 20), 0.5, 80


def poisson_floor(h: float, astar: float, lam: float = LAM, lam2: float = LAM2, k: float = K_SHALLOW,
                  x0: float = -THETA_BOX, terms: int = 4) -> tuple[float, float]:
    """The predicted floor F_h* − F* of the lumped Θ quadrature and the bound on its remainder (module doc, (P)).

    Args:
        h: Θ cell size.
        astar: the minimiser's mean ā*.
        lam: λ.
        lam2: λ₂ (v* = λ/λ₂).
        k: the gain of the shallow model (ŷ = m₀ + kā).
        x0: the first node of the uniform mesh.
        terms: how many Poisson terms k = 1.. are summed.

    Returns:
        (−λ δ(β*), the bound on |r|).
    """
    v = lam / lam2
    j = np.arange(1, terms + 1)
    e = np.exp(-2 * math.pi**2 * j**2 * v / h**2)
    delta = float(2 * np.sum(e * np.cos(2 * math.pi * j * (astar - x0) / h)))
    dprime = float(2 * np.sum(e * 2 * math.pi * j / h)) / lam2
    r = 2 * (lam**2 * dprime**2 * lam2 * k * k / (2 * (lam2 + k * k)) + lam * delta**2 / 2)
    tails = 2 * math.exp(-((THETA_BOX - abs(astar)) ** 2) / (2 * v))
    return -lam * delta, r + lam * tails


def _floor(cells: int, ds: float, steps: int, fstar: float) -> tuple[float, float]:
    """(F_S − F*, the a-posteriori bound on F_S − F_∞ plus round-off) of a run to the Lie fixed point.

    F − F_∞ is quadratic in the distance to the fixed point, which the Lie step contracts by
    q = 1/(1 + min(λ₂ + k², 2λ₂)Δs) (as ``gibbs_fixed_point``), so |F_S − F_∞| ≤ q/(1 − q)|F_S − F_{S−Δs}|;
    round-off of F: γ_n(|F| + 1), n = 100 (N_Θ + 1).
    """
    F = trajectory(ds, steps, cells)["F"]
    q = 1 / (1 + min(LAM2 + K_SHALLOW**2, 2 * LAM2) * ds)
    rnd = _roundoff(100 * (cells + 1)) * (abs(F[-1]) + 1.0)
    return float(F[-1] - fstar), q / (1 - q) * abs(F[-1] - F[-2]) + 2 * rnd


@register("free_energy_exact", "§4; §5.4; §6.2", "closed-form F*; exact Lie law; Poisson summation of the Θ "
          "quadrature", kind="rate", unit="1/s", budget_s=60.0)
def check_free_energy_exact(quick: bool) -> Outcome:
    """F(ρ_s) − F*_exact: rate against the exact Lie law, to round-off on a fine mesh, the coarse floors as (P).

    The value is the fitted rate c of the long run (Δs = 0.1, 150 Θ cells). Asserted:

    * |c − c_ref| ≤ Richardson(150, 75 cells, order ≥ :data:`THETA_ORDER_MIN`) + round-off of the slope,
      c_ref the same fit of the exact Lie law's F − F* on the same rows (window 1e-2 > gap/gap₀ > 1e-7;
      as ``shallow_exponential_rate``, at a 5× larger Δs and over five decades instead of three);
    * the last gap of the fine run (its floor, (P): < 1e-50) is within round-off and the iteration's
      remainder of 0 (≈ 4e-12, ten decades below the first gap; measured: ~1e-15);
    * at 16 and 20 Θ cells (h = 0.375, 0.3) the converged gap equals the floor (P) within its remainder
      bound + round-off + iteration remainder: the floor is predicted, and shrinks between the two meshes by
      the predicted factor (~1e4, the spectral e^{−2π²v*/h²}, not a power of h);
    * the floor does not depend on Δs: at 16 cells, Δs = 0.5 and 0.25 give the same gap within round-off.

    Planted bugs (measured): the entropy counted with 1.01 λ in F moves every floor by 1e-2 λ ∫ρ* log ρ* ≈
    −2.7e-4 and the gap turns negative (rate and floors fail); the diffusion 1.01 λ in the Scharfetter–Gummel
    flux only moves the fixed point's variance by 1%, a floor of λ(0.01)²/4 ≈ 2.5e-6 (floors fail by 10⁶ times
    their bound, and the fitted rate collapses to 0.16); an F* off by 1e-9 fails the fine floor and the rate.
    """
    astar, var, fstar = _fstar()
    law = shallow_lie_law(LONG_STEPS, LONG_DS, RHO0_MEAN, RHO0_VAR, LAM, LAM2, A_FIXED, M0[0], S0[0], 1.0)
    model = shallow_gap(law[:, 0], law[:, 1], LAM, LAM2, A_FIXED, M0[0], S0[0], 1.0)
    rates, rows = [], np.zeros(0, bool)
    for cells in LONG_CELLS:
        tr = trajectory(LONG_DS, LONG_STEPS, cells)
        gap = tr["F"] - fstar
        if cells == LONG_CELLS[0]:
            rows = (gap < WINDOW[0] * gap[0]) & (gap > WINDOW[1] * gap[0])
            s, gap_h, F_h = tr["s"], gap, tr["F"]
        rates.append(_rate_fit(tr["s"], gap, rows))  # NaN (a fail) if the window is empty or the gap ≤ 0
    c, c2 = rates
    c_ref = _rate_fit(s, model, rows)
    mesh = float(richardson_bound([c], [c2], THETA_ORDER_MIN)[0])
    gam = _roundoff(100 * (LONG_CELLS[0] + 1))
    if rows.sum() >= 3:
        dev = np.abs(s[rows] - s[rows].mean())
        slope_rnd = float(dev.sum() * np.max(gam * (np.abs(F_h[rows]) + 1) / gap_h[rows]) / (dev**2).sum())
    else:
        slope_rnd = math.nan
    rate_ok = abs(c - c_ref) <= mesh + slope_rnd
    q = 1 / (1 + min(LAM2 + K_SHALLOW**2, 2 * LAM2) * LONG_DS)
    fine_tol = q / (1 - q) * abs(F_h[-1] - F_h[-2]) + 2 * gam * (abs(F_h[-1]) + 1)
    decades = math.log10(gap_h[0] / max(abs(gap_h[-1]), 1e-300))
    fine_ok = abs(gap_h[-1]) <= fine_tol

    floors, preds, tols, its = [], [], [], []
    for cells in FLOOR_CELLS:
        f, it = _floor(cells, FLOOR_DS, FLOOR_STEPS, fstar)
        p, r = poisson_floor(2 * THETA_BOX / cells, astar)
        floors.append(f)
        preds.append(p)
        its.append(it)
        tols.append(r + it)
    floor_ok = all(abs(f - p) <= t for f, p, t in zip(floors, preds, tols, strict=True))
    f_half, it_half = _floor(FLOOR_CELLS[0], FLOOR_DS / 2, 2 * FLOOR_STEPS, fstar)
    ds_dev, ds_tol = abs(f_half - floors[0]), it_half + its[0]  # the same discrete minimum: no (P) remainder
    ds_ok = ds_dev <= ds_tol
    ok = bool(rate_ok and fine_ok and floor_ok and ds_ok)
    hs = [2 * THETA_BOX / n for n in FLOOR_CELLS]
    return Outcome(c, c_ref, f"≤ {mesh + slope_rnd:.2g}; fine floor ≤ {fine_tol:.1e}; coarse floors = (P) ± bound; "
                      "floor independent of Δs", ok,
                   f"rate {c:.6f} ({LONG_CELLS[0]} cells; {c2:.6f} on {LONG_CELLS[1]}), exact Lie law {c_ref:.6f} "
                   f"(Δs → 0: {2 * (LAM2 + K_SHALLOW**2):.4f}, theorem ≥ {2 * LAM2}), |Δ| {abs(c - c_ref):.1e} ≤ "
                   f"{mesh:.1e} + {slope_rnd:.1e}; gap {gap_h[0]:.2e} → {gap_h[-1]:.1e} ({decades:.1f} decades, "
                   f"≤ {fine_tol:.1e}); floors at h = {hs}: "
                   + ", ".join(f"{f:.6e} vs (P) {p:.6e} (±{t:.1e})" for f, p, t in zip(floors, preds, tols,
                                                                                          strict=True))
                   + f"; ratio {floors[0] / floors[1]:.4g} vs {preds[0] / preds[1]:.4g}; Δs/2: |Δ floor| "
                     f"{ds_dev:.1e} ≤ {ds_tol:.1e}",
                   [Series(hs, [abs(f) + 1e-300 for f in floors], "Θ cell size h", None,
                           fit_order(hs, [abs(f) + 1e-300 for f in floors]), "|F_h* − F*| (spectral, (P))")],
                   mesh + slope_rnd)
