"""Check of the Lagrangian sphere solver (theory §9 (iv), :mod:`mfpde.tokens.sphere.flow`) against the closed form.

``sphere_flow_rates``: the growth rates of the degrees ℓ = 1..8 about the uniform density, from the flow solver's
particle measure, against γ_ℓ = ℓ(ℓ+1) i_ℓ(β)/β (USA) and ÷ i_0(β) (SA) (scipy.special.spherical_in), at β = 5 and
9. The start is 1/4π ± ε Σ_ℓ Y_ℓm_ℓ (one seeded order m_ℓ per degree, ε = 10⁻⁶); the odd part of the two solves'
μ̂_ℓ· (which cancels the quadratic terms) is fitted by least squares on its log over γ_max T = 3, with the
direct-sum velocity (:class:`~mfpde.tokens.sphere.velocity.DirectVelocity`) at rtol 10⁻¹³.

The particle system's linearisation differs from the continuum's by the quadrature's Funk–Hecke tail beyond
degree ≈ 2N − 2 − ℓ (i_k(β)/i_0(β), falling faster than geometrically): the error falls spectrally in N down to
the floor of the integrator and the cubic terms (rtol/ε, ε² e^{2γT}: ≈ 10⁻⁸ of max γ). Verdict: at the finest N
(quick 16, full 20) the error is ≤ 10⁻⁶ of max γ, and it has fallen by at least 100 from N = 8 (the tail predicts
i_6/i_0 → i_22/i_0 there, a fall of ≥ 10⁶: a rate that does not move with N is not the quadrature's). The full
run also halves and doubles the tolerance's exponent (rtol 10⁻⁹, 10⁻¹¹ at the finest N) and reports the change.

Plant a bug (``bench/plant_bugs.py``): the direct sum's velocity without the projection onto the tangent plane.
"""

from __future__ import annotations

import math

import numpy as np

from mfpde.tokens.sphere.flow import SphereFlow
from mfpde.tokens.sphere.theory import growth_rate
from mfpde.tokens.sphere.velocity import DirectVelocity
from mfpde.verify.circle import BUDGET_S, _Budget
from mfpde.verify.registry import Outcome, Series, register

__all__ = ["sphere_flow_rates"]

DEGREES = np.arange(1, 9)
BETAS = (5.0, 9.0)


def sphere_flow_rates(nodes: int, beta: float, attention: str, rtol: float = 1e-13, eps: float = 1e-6,
                      degrees: np.ndarray = DEGREES) -> np.ndarray:
    """The fitted growth rates of ``degrees`` from the flow solver on 2N² particles (see the module), shape (K,)."""
    g = growth_rate(degrees, beta, attention)
    ts = np.linspace(0.0, 3.0 / float(g.max()), 13)
    rng = np.random.default_rng(0)
    orders = [int(rng.integers(-ll, ll + 1)) for ll in degrees]
    L = int(degrees.max())
    hats = []
    for s in (1.0, -1.0):
        modes = [[int(ll), m, s * eps] for ll, m in zip(degrees, orders, strict=True)]
        flow = SphereFlow(DirectVelocity(beta, attention), nodes=nodes, rtol=rtol, L=L)
        hats.append(flow.solve(modes, float(ts[-1]), ts).coefficients)
    odd = (hats[0] - hats[1]) / 2
    out = []
    for ll in degrees:
        amp = np.linalg.norm(odd[:, ll * ll:(ll + 1) ** 2], axis=1)
        out.append(float(np.polyfit(ts, np.log(amp), 1)[0]) if np.all(amp > 0) else math.nan)
    return np.array(out)


@register("sphere_flow_rates", "§9 (Lagrangian form on S²)",
          "closed form γ_ℓ = ℓ(ℓ+1) i_ℓ(β)/β, ÷ i_0 for SA (scipy.special.spherical_in)", kind="rate",
          budget_s=BUDGET_S[False], distributed=False)
def check_sphere_flow_rates(quick: bool) -> Outcome:
    """Rates of ℓ = 1..8, SA and USA, β = 5 and 9: ≤ 1e-6 of max γ at the finest N, falling ≥ 100× from N = 8."""
    budget = _Budget(quick)
    Ns = [8, 12, 16] if quick else [8, 12, 16, 20]
    ok, lines, series = True, [], []
    worst = (-1.0, math.nan, math.nan, math.nan)  # (relative error, fitted, exact, max γ) at the finest N
    for beta in BETAS:
        for att in ("softmax", "unnormalised"):
            ex = growth_rate(DEGREES, beta, att)
            errs, fits = [], []
            for N in Ns:
                fit = sphere_flow_rates(N, beta, att)
                fits.append(fit)
                errs.append(float(np.max(np.abs(fit - ex)) / ex.max()))  # NaN (no rate) stays NaN and fails
                if budget.spent():
                    return Outcome(math.nan, None, "budget", False, f"budget of {budget.limit:.0f} s exceeded")
            tag = f"β={beta:g} {'SA' if att == 'softmax' else 'USA'}"
            fine = errs[-1]
            ok &= bool(fine <= 1e-6 and errs[0] >= 100 * fine)
            lines.append(f"{tag}: max|γ_h − γ|/max γ {', '.join(f'{e:.1e}' for e in errs)} at N = {Ns}")
            series.append(Series(Ns, errs, "quadrature nodes N (2N² particles)", None,
                                 float(np.polyfit(Ns, np.log(np.maximum(errs, 1e-300)), 1)[0]), f"flow {tag}"))
            if not fine <= worst[0]:
                j = int(np.nanargmax(np.abs(fits[-1] - ex))) if np.all(np.isfinite(fits[-1])) else 0
                worst = (fine, float(fits[-1][j]), float(ex[j]), float(ex.max()))
            if not quick:
                tol = [float(np.max(np.abs(sphere_flow_rates(Ns[-1], beta, att, rtol=r) - ex)) / ex.max())
                       for r in (1e-9, 1e-11)]
                lines.append(f"{tag}: at N = {Ns[-1]}, rtol 1e-9, 1e-11, 1e-13: {tol[0]:.1e}, {tol[1]:.1e}, "
                             f"{fine:.1e}")
    return Outcome(worst[1], worst[2], f"≤ 1e-6 max γ at N = {Ns[-1]}; fallen ≥ 100× from N = 8", ok,
                   "; ".join(lines), series, 1e-6 * worst[3])
