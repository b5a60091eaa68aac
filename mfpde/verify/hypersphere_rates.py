"""Noise-free growth rates on S^{d−1} (theory §11): the flow map's measured γ_ℓ against the Funk–Hecke closed form.

``hypersphere_rates``: from ν_0 = 1 ± ε p_ℓ, ε‖p_ℓ‖ = 1e-4 at the labels (the odd part of the two responses
removes the O(ε²) terms), the flow map (:func:`mfpde.tokens.hypersphere.transport.flow`, 24 Gauss labels, DOP853
at rtol 1e-11) measures the growth rate of each degree ℓ = 1..8 (1..4 at d = 64) over the depth 1/max γ; the
reference is γ_ℓ = ℓ(ℓ+d−2) λ_ℓ(β)/β with λ_ℓ = Γ(d/2)(2/β)^{d/2−1} I_{ℓ+d/2−1}(β) from
:mod:`mfpde.verify.hypersphere_special` (scipy's Bessel functions: no code of the solver), to 1e-6 relative (the
budget: (ε‖p_ℓ‖)² = 1e-8 of the odd nonlinearity, the integrator's tolerance, the labels' spectral quadrature)
for every degree that grows by e^{γ_ℓ t} ≥ e^{1e-3} over the depth; a degree that hardly grows there
(γ_ℓ ≪ max γ) is held to its log-amplitude instead, |γ_ℓ − γ_ref| t ≤ 1e-7 (DOP853 at rtol 1e-11 of the labels'
displacement, its global error accumulated over ≲ 1e4 steps). In every cell of d × β the measured fastest degree
must be the reference's (near-ties included: d = 4, β = 36 has degrees 8 and 7 0.17 % apart, far above 1e-6).
Softmax attention (÷ λ_0) is measured on one cell.
"""

from __future__ import annotations

import functools
import math
import time

import numpy as np

from mfpde.verify.registry import Outcome, register

__all__ = ["measured_rates"]

BUDGET_S = {True: 60.0, False: 300.0}
GRID = {True: ((3, 1.0), (4, 36.0), (16, 9.0)),
        False: tuple((d, b) for d in (3, 4, 8, 16, 64) for b in (1.0, 4.0, 9.0, 16.0, 36.0))}
DEGREES, LABELS, TOL = 8, 24, 1e-6
#: the degrees measured at d = 64: from degree 5 on the perturbation's amplitude, ε ∫ p_ℓ² with ε‖p_ℓ‖ = 1e-4 at the
#: labels, sinks towards the integrator's noise (its error fell as 1/ε, not as ε²), and the closed form's fastest
#: degree there is 1 at every β of the grid, degree 2 the runner-up
DEGREES_LARGE_D = 4
#: the log-amplitude bound of the degrees that grow by less than e^{GROWS} over the depth
LOG_AMPLITUDE_TOL, GROWS = 1e-7, 1e-3


def measured_rates(d: int, beta: float, attention: str = "unnormalised", degrees: int = DEGREES) -> np.ndarray:
    """γ_ℓ, ℓ = 1..degrees, measured by the flow map from ν_0 = 1 ± ε P_ℓ (module docstring)."""
    from mfpde.tokens.hypersphere import transport as tr
    from mfpde.tokens.hypersphere.zonal import gauss_rule, orthonormal_basis
    from mfpde.verify.hypersphere_special import lam

    ll = np.arange(1, degrees + 1)
    ref = ll * (ll + d - 2) * lam(ll, beta, d) / beta
    if attention == "softmax":
        ref = ref / lam(0, beta, d)
    t = 1.0 / float(np.max(ref))
    out = np.zeros(degrees)
    for i, ell in enumerate(ll):
        # ε against the largest |p_ℓ| at the labels (the flow sees ν_0 there only): against p_ℓ(1) ≈ d^{ℓ/2} the
        # amplitude sank to 1e-12 at d = 64 and round-off decided the rate
        z0 = gauss_rule(LABELS, d)[0]
        eps = 1e-4 / float(np.max(np.abs(orthonormal_basis(z0, int(ell), d)[:, ell])))

        def nu0(z: np.ndarray, s: float, ell: int = int(ell), eps: float = eps) -> np.ndarray:
            return 1.0 + s * eps * orthonormal_basis(np.asarray(z, float).ravel(), ell, d)[:, ell].reshape(np.shape(z))

        amps = []
        for s in (1.0, -1.0):
            f = tr.flow(functools.partial(nu0, s=s), (beta, 1.0), d, attention, [0.0, t], LABELS, rtol=1e-11)
            amps.append(tr.degree_amplitudes(f.z, f.masses, d, int(ell))[..., int(ell)])
        a = (amps[0] - amps[1]) / 2
        out[i] = math.log(a[1] / a[0]) / t
    return out


@register("hypersphere_rates", "§11 growth rates γ_ℓ on S^{d−1}", "ℓ(ℓ+d−2) λ_ℓ(β)/β with scipy's Bessel functions",
          kind="relative error", budget_s=BUDGET_S[False], distributed=False)
def check_hypersphere_rates(quick: bool) -> Outcome:
    """γ_1..γ_8 within 1e-6 of the closed form and the fastest degree right in every cell of d × β."""
    from mfpde.verify.hypersphere_special import lam

    deadline = time.process_time() + BUDGET_S[quick]
    worst, rows, wrong = 0.0, [], []
    cells = [(d, b, "unnormalised") for d, b in GRID[quick]] + [(16, 4.0, "softmax")]
    for d, beta, att in cells:
        degrees = DEGREES if d < 64 else DEGREES_LARGE_D
        ll = np.arange(1, degrees + 1)
        if time.process_time() > deadline:
            return Outcome(math.inf, 0.0, f"≤ {TOL:g}", False, f"CPU budget exhausted at d = {d}, β = {beta:g}")
        ref = ll * (ll + d - 2) * lam(ll, beta, d) / beta / (lam(0, beta, d) if att == "softmax" else 1.0)
        got = measured_rates(d, beta, att, degrees)
        t = 1.0 / float(np.max(ref))  # the depth of the measurement
        grows = ref * t >= GROWS
        err = float(np.max(np.abs(got - ref)[grows] / ref[grows]))
        log_err = float(np.max(np.abs(got - ref) * t))
        worst = max(worst, err if math.isfinite(err) else math.inf)
        if not log_err <= LOG_AMPLITUDE_TOL:
            wrong.append(f"d = {d}, β = {beta:g}: |Δγ| t = {log_err:.1e} > {LOG_AMPLITUDE_TOL:g}")
        top_ref = int(ll[np.argmax(ref)]) if np.argmax(ref) < degrees - 1 else None  # a maximum inside 1..degrees
        if top_ref is not None and int(ll[np.argmax(got)]) != top_ref:
            wrong.append(f"d = {d}, β = {beta:g}: the fastest degree")
        rows.append(f"d = {d}, β = {beta:g}{' SA' if att == 'softmax' else ''}: {err:.1e}, fastest "
                    f"{int(ll[np.argmax(got)])}")
    ok = worst <= TOL and not wrong
    detail = "; ".join(rows) + (f"; wrong: {', '.join(wrong)}" if wrong else "")
    return Outcome(worst, 0.0, f"≤ {TOL:g}; |Δγ| t ≤ {LOG_AMPLITUDE_TOL:g}; fastest degree", ok, detail,
                   tolerance=TOL)
