"""Checks of every output of the continuation of noisy tokens (theory §10) against references it does not produce.

The reference for the states is :class:`ZonalReference`, written here from the definitions: the stationary
equation μ = e^{κ G∗μ}/∫e^{κ G∗μ} (κ = K/(τβ)) in the coefficients a_ℓ = ∫ μ φ_ℓ dσ of the zonal basis (cos ℓθ on
the circle's even states, P_ℓ(cos ϑ) on the sphere's zonal ones), where the kernel is diagonal, G∗φ_ℓ = λ_ℓ φ_ℓ
(λ_ℓ = 2π I_ℓ(β), 4π i_ℓ(β): scipy.special), parameterised by the amplitude a_k of the branch's mode and solved
by Newton (exact Jacobian from covariances; the trapezoidal rule on 512 angles, Gauss–Legendre on 128 nodes: exact
for the basis products, spectral for the Gibbs factor). No code of mfpde is used for it. The continuation under
test is :func:`mfpde.bifurcation.noisy_branches` (Keller's pseudo-arclength) and, for the arclength and the
landing, :func:`mfpde.continuation.continue_branch` itself, each in both discretisations of the circle and the
sphere (:data:`DISCRETISATIONS`, :func:`problem`): the spectral one, the default of ``continuation.discretisation``
(:class:`~mfpde.tokens.circle.spectral.CircleSpectral`, :class:`~mfpde.tokens.sphere.spectral.SphereSpectral`:
the coefficients of the kernel's eigenfunctions, numpy's Newton) and the collocation, the cross-check
(:class:`~mfpde.tokens.circle.stationary.CircleStationary`, :class:`~mfpde.tokens.sphere.stationary.SphereStationary`:
values at the points, PETSc's SNES), on the same points N, against the same references and bounds: each bound
below is the continuation's Newton tolerance (the same 1e-12 in both) plus the discretisation's error, which is
the tail of the continued states in both (the spectral one drops only the kernel's eigenvalues below 1e-18 λ_0
and the trapezoidal aliases I_{N−k}(β), far below it). Each record's detail starts with each one's worst figure.

* ``continuation_fold``: each fold of the report (circle β = 4, N = 81; sphere β = 3, N = 48) against the
  reference's extreme parameter K_f = min_a K(a) (scipy's bounded Brent over the amplitude, xatol 1e-9), to 1e-8
  relative; on S^15 (β = 2, N = 96) against the independent Gegenbauer solve of
  :mod:`mfpde.verify.hypersphere_reference` (its root of dK/da). The continuation locates t_K = 0 to
  |Δs| ≤ 1e-13 of the step and K is stationary there, so its own error is the Newton tolerance (≈ 1e-12
  relative); the discretisation's is spectral, below the continued states' tail (≤ 1e-9 of the mean where the branch
  is continued); 1e-8 keeps a decade over both. The fold must also be
  a point of its branch and the branch's least K (to 4 ulps: the located point, not the step's start), and its
  amplitude (and |μ̂₁|) must be a_f to the resolution K(a) gives a at its minimum, √(8εK_f/|K''|) + xatol.
* ``continuation_curvature``: c₂ = dK/d(a²) and c₁ = dK/da of every bifurcation from the uniform state (circle
  β = 4 modes 1 and 2, sphere β = 3 degrees 1 and 2) against (i) the same definitions evaluated by the reference
  (Richardson on the even part (K(a) + K(−a))/2 at ρ, 2ρ; (K(ρ) − K(−ρ))/2ρ; ρ = 10⁻²), to 1e-7 in c₂ and 1e-8
  in c₁, times max(1, K_k) (the continuation's Newton tolerance, 10⁻¹² relative in K, over ρ² times Richardson's
  17/12, and over ρ, with a factor 5–10 to spare: the derivation of ``noisy_tricritical``), plus the reference's
  own round-off carried through the definitions; (ii) closed forms
  from the weakly nonlinear expansion
  (derived in :func:`closed_c2`, :func:`closed_c1`): c₂ = K_k (1 − 2r)/(2(1 − r)), r = I_{2k}(β)/I_k(β) (circle,
  mode k), c₂ = K_1 (3/5)(1 − 3r)/(1 − r), r = i_2(β)/i_1(β) (sphere, degree 1), c₁ = 0 for these and
  c₁ = −(5/7) K_2 (sphere, degree 2, transcritical; its c₂ against the reference's fit), and on S^15
  (β = 2, against :mod:`mfpde.verify.hypersphere_reference`) c₂ = K_1 d(1 − dr)/((d + 2)(1 − r)), r = λ_2/λ_1. The
  continuation's values carry the probes' truncation (c₂: −4c₆ρ⁴, c₁: c₃ρ²), which the reference measures by a fit
  of K(a) at ±ρ, ±2ρ, ±3ρ; the threshold is twice that term plus (i)'s. The reference's own fit at ρ/2 must meet
  the closed forms to its round-off (n ε K_c/|a| per probe through the fit) plus twice its Richardson estimate.

The stability labels, the arclength condition and a step landing on K_c: :mod:`mfpde.verify.continuation_branches`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from mfpde.verify.registry import Outcome, register
from mfpde.verify.zonal_reference import (
    FOLD_XATOL,
    ZonalReference,
    closed_c1,
    closed_c2,
)

Array = npt.NDArray[np.float64]
EPS = float(np.finfo(float).eps)
#: The probes' amplitude of the continuation's c₂, c₁ (the docs' definition).
RHO = 1e-2
#: CPU budgets (full; quick: half) of each check.
BUDGET_S = 60.0
#: Bound on |c₂ − the same definition by the reference| and on |c₁ − ...| (module docstring).
C2_TOL, C1_TOL = 1e-7, 1e-8
FOLD_TOL = 1e-8


#: The discretisations under test: the default (spectral: Fourier / Legendre coefficients, numpy's Newton) first,
#: then the collocation (values at the points, PETSc's SNES), the cross-check; the same references and bounds.
DISCRETISATIONS = ("spectral", "collocation")


def problem(domain: str, points: int, beta: float, tau: float, discretisation: str = "spectral") -> Any:
    """The stationary problem of the circle or the sphere in ``discretisation`` (the continuation's under test)."""
    if discretisation == "spectral":
        from mfpde.tokens.circle.spectral import CircleSpectral
        from mfpde.tokens.sphere.spectral import SphereSpectral

        return (SphereSpectral if domain == "sphere" else CircleSpectral)(points, beta, tau)
    from mfpde.tokens.circle.stationary import CircleStationary
    from mfpde.tokens.sphere.stationary import SphereStationary

    return (SphereStationary if domain == "sphere" else CircleStationary)(points, beta, tau)


def solver(P: Any) -> Any:
    """The continuation's own Newton solver of P (numpy's for the spectral problems, PETSc's SNES otherwise)."""
    from mfpde.continuation_newton import newton_solver

    return newton_solver(P)


def worst_line(worst: dict[str, float]) -> str:
    """The detail's "worst: spectral …, collocation …": each discretisation's worst figure."""
    return "worst: " + ", ".join(f"{d} {w:.2e}" for d, w in worst.items())


def continued(P: Any, lo: float, hi: float, step: float, max_points: int = 400) -> dict[str, Any]:
    """The report's part of the continuation in K ∈ [lo, hi] (dense eigenvalues)."""
    from mfpde.bifurcation import noisy_branches
    from mfpde.continuation import StepControl

    return noisy_branches(P, lo, hi, StepControl(step, 1e-9, 5 * step, lo, hi, max_points), eig_solver="scipy")


#: The fold cases: (domain, β, collocation points, the range of K); τ = 1.
FOLD_CASES = (("circle", 4.0, 81, (0.38, 0.415)), ("sphere", 3.0, 48, (1.18, 1.36)))
#: The hypersphere's fold case: (d, β, collocation points, the reference's Gauss–Jacobi nodes); τ = 1.
HYPERSPHERE_FOLD = (16, 2.0, 96, 80)


def _hypersphere_fold() -> tuple[Any, float, float, float, float, float]:
    """(the problem, lo, hi, K_f, a_f, K''(a_f)) on S^{d−1} by :mod:`mfpde.verify.hypersphere_reference`."""
    from mfpde.tokens.hypersphere.stationary import HypersphereStationary
    from mfpde.verify.hypersphere_reference import fold_maxwell_point, solve_state

    d, beta, n, nodes = HYPERSPHERE_FOLD
    ref = fold_maxwell_point(beta, 1.0, d, nodes)
    h = 1e-3
    Kpp = sum(c * solve_state(ref.a_f + j * h, beta, 1.0, d, nodes).K for j, c in ((-1, 1), (0, -2), (1, 1))) / h**2
    lo, hi = ref.K_f - 0.3 * (ref.K_c - ref.K_f), ref.K_c + 0.1 * (ref.K_c - ref.K_f)
    return HypersphereStationary(n, beta, 1.0, d), lo, hi, ref.K_f, ref.a_f, Kpp


@register("continuation_fold", "§10 (folds of the bifurcating branches)",
          "K_f = min_a K(a) of an independent Newton solve in zonal coefficients (Fourier; Legendre), scipy Brent",
          kind="relative error", budget_s=BUDGET_S, distributed=False)
def check_continuation_fold(quick: bool) -> Outcome:
    """Each reported fold within 1e-8 of the reference's K_f; the fold is its branch's least K and one of its points."""
    rows, worst, ok = [], 0.0, True
    per = dict.fromkeys(DISCRETISATIONS, 0.0)
    cases = [(disc, *c) for disc in DISCRETISATIONS for c in FOLD_CASES]
    for disc, domain, beta, n, (lo, hi) in (*cases, ("collocation", "hypersphere", HYPERSPHERE_FOLD[1],
                                                     HYPERSPHERE_FOLD[2], (0, 0))):
        if domain == "hypersphere":
            P, lo, hi, K_f, a_f, Kpp = _hypersphere_fold()
            domain = f"S^{HYPERSPHERE_FOLD[0] - 1}"
        else:
            P = problem(domain, n, beta, 1.0, disc)
            ref = ZonalReference(domain, beta, 1.0, 1)
            K_f, a_f = ref.fold()
            Kpp = ref.curvature_in_a(a_f)
        res = continued(P, lo, hi, 0.04 * (hi - lo))
        # the fold's amplitude: K is flat there, so K(a) resolves a only to √(2 · 4ε K_f/|K''|) (4ε: K's round-off),
        # plus Brent's tolerance; the continuation's own (t_K = 0 to the Newton tolerance) is far below
        tol_a = FOLD_XATOL + math.sqrt(8 * EPS * K_f / abs(Kpp))
        folds = [e for e in res["bifurcations"] if e["kind"] == "fold"]
        if len(folds) != 1:
            return Outcome(math.inf, 0.0, f"≤ {FOLD_TOL:g}", False, f"{disc} {domain} β = {beta:g}: {len(folds)} folds "
                           f"reported in [{lo:g}, {hi:g}], the reference has one at K = {K_f:.12g}")
        f = folds[0]
        Ks = np.asarray(res["branches"][f["branch"]]["parameter"])
        err = abs(f["parameter"] - K_f) / K_f
        ulp = 4 * EPS * abs(f["parameter"])
        on_branch = float(np.min(np.abs(Ks - f["parameter"])))
        least = float(f["parameter"] - Ks.min())
        err_a = max(abs(f["amplitude"] - a_f), abs(f["order_parameter"] - a_f))  # mode 1: |μ̂₁| is the amplitude
        ok &= err <= FOLD_TOL and on_branch <= ulp and abs(least) <= ulp and err_a <= tol_a
        worst = max(worst, err)
        per[disc] = max(per[disc], err)
        rows.append(f"{disc} {domain} β = {beta:g} (N = {n}): K_f {f['parameter']:.13g} vs {K_f:.13g} ({err:.1e}), "
                    f"amplitude {f['amplitude']:.10f} vs {a_f:.10f} ({err_a:.1e} ≤ {tol_a:.1e}); nearest point "
                    f"{on_branch:.1e}, above the branch's least K by {least:.1e}")
    return Outcome(worst, 0.0, f"≤ {FOLD_TOL:g}; the fold a point of its branch and its least K (4 ulps); its "
                   "amplitude within K(a)'s resolution of a_f", ok, worst_line(per) + "; " + "; ".join(rows),
                   tolerance=FOLD_TOL)


#: The curvature cases: (domain, β, collocation points, the bifurcations' modes); τ = 1; the full check adds the
#: supercritical side of β*.
CURVATURE_CASES = (("circle", 4.0, 41, (1, 2)), ("sphere", 3.0, 32, (1, 2)))
CURVATURE_FULL = (("circle", 2.0, 41, (1, 2, 3)), ("sphere", 1.0, 32, (1, 2, 3)))


def _fitted_derivatives(probes: dict[float, float], K_c: float,
                        nodes: int) -> tuple[float, float, float, float, float, float]:
    """(c₁, c₂, c₃, c₆, δc₁, δc₂): K(a) − K_c = Σ_{j=1..6} c_j a^j through the six probes ±ρ, ±2ρ, ±3ρ.

    δc: the probes' round-off carried through the fit, Σ_i |V⁻¹_ji| δK_i with δK_i = n ε K_c/|a_i|: the reference's
    residual a_k − ∫φ_k p is a sum of n terms of total size ≤ 1 (exact to n ε), and ∂F_k/∂κ ≈ −a/κ_k vanishes like
    a, so K = τβκ carries n ε K_c/|a|.
    """
    a = np.array(sorted(probes))
    Vi = np.linalg.inv(np.vander(a, 7, increasing=True)[:, 1:])
    c = Vi @ (np.array([probes[x] for x in a]) - K_c)
    dc = np.abs(Vi) @ (nodes * EPS * abs(K_c) / np.abs(a))
    return float(c[0]), float(c[1]), float(c[2]), float(c[5]), float(dc[0]), float(dc[1])


@register("continuation_curvature", "§10 (super-, subcritical and transcritical bifurcations)",
          "c₂, c₁ by an independent Newton solve at small amplitudes; closed forms of the weakly nonlinear expansion",
          kind="error/tolerance", budget_s=BUDGET_S, distributed=False)
def check_continuation_curvature(quick: bool) -> Outcome:
    """c₂ and c₁ of every bifurcation against the reference's probes and the closed forms (module docstring)."""
    rows, ok, worst = [], True, 0.0
    per = dict.fromkeys(DISCRETISATIONS, 0.0)
    cases = [(disc, *c) for disc in DISCRETISATIONS for c in CURVATURE_CASES + (() if quick else CURVATURE_FULL)]
    for disc, domain, beta, n, modes in cases:
        P = problem(domain, n, beta, 1.0, disc)
        for k in modes:
            Kk = P.threshold(k)
            res = continued(P, 0.97 * Kk, 1.03 * Kk, 0.02 * Kk, 60)
            bif = [e for e in res["bifurcations"] if "curvature" in e and e["mode"] == k]
            if len(bif) != 1:
                return Outcome(math.inf, 0.0, "one bifurcation", False, f"{disc} {domain} β = {beta:g}: {len(bif)} "
                               f"bifurcations of mode {k} in [{0.97 * Kk:.6g}, {1.03 * Kk:.6g}]")
            c2, c1 = float(bif[0]["curvature"]), float(bif[0]["slope"])
            ref = ZonalReference(domain, beta, 1.0, k)
            pr = ref.probes(RHO)
            K0 = ref.K_c
            even = {j: 0.5 * (pr[j * RHO] + pr[-j * RHO]) for j in (1, 2)}  # K's even part (the code's definition)
            d2 = (16 * (even[1] - K0) - (even[2] - K0)) / (12 * RHO**2)  # the definition, by the reference
            d1 = (pr[RHO] - pr[-RHO]) / (2 * RHO)
            f1, f2, f3, f6, _, _ = _fitted_derivatives(pr, K0, len(ref.w))
            # the fit at ρ/2: its truncation is ≈ Δ/63 (ρ⁶)
            h1, h2, _, _, dh1, dh2 = _fitted_derivatives(ref.probes(RHO / 2), K0, len(ref.w))
            # the sphere's c₂ of degrees ≥ 2 has no closed form here: the reference's own (its fit at ρ/2) instead
            closed = domain == "circle" or k == 1
            want2 = closed_c2(domain, beta, 1.0, k) if closed else h2
            want1 = closed_c1(domain, beta, 1.0, k)
            # the probes' truncation: Richardson on the even part leaves −4c₆ρ⁴, the central difference c₃ρ² (the
            # fit's c₆, c₃; twice them for the higher orders the fit leaves out); the Newton tolerance bounds K to
            # a relative precision: the bounds of (i) scale with max(1, K_k)
            t2, t1 = C2_TOL * max(1.0, Kk), C1_TOL * max(1.0, Kk)
            tol2 = t2 + 8 * abs(f6) * RHO**4
            tol1 = t1 + 2 * abs(f3) * RHO**2
            # the reference's round-off in the definitions: δK(a) = n ε K_c/|a| (:func:`_fitted_derivatives`) through
            # (16 δK_e(ρ) + δK_e(2ρ))/12ρ² and (δK(ρ) + δK(−ρ))/2ρ
            r2, r1 = 16.5 / 12 * len(ref.w) * EPS * K0 / RHO**3, len(ref.w) * EPS * K0 / RHO**2
            # the reference's own c₂, c₁ (the fit at ρ/2) against the closed forms: the fit's round-off (δc) plus
            # twice its truncation estimated by Richardson from the fit at ρ (the expansion's check)
            ref2 = dh2 + 2 * abs(f2 - h2) / 63
            ref1 = dh1 + 2 * abs(f1 - h1) / 63
            if not closed:  # compared with the reference's fit: its bound too
                tol2 += ref2
            errs = (abs(c2 - d2), abs(c1 - d1), abs(c2 - want2), abs(c1 - want1),
                    abs(h2 - want2) if closed else 0.0, abs(h1 - want1))
            tols = (t2 + r2, t1 + r1, tol2, tol1, ref2, ref1)
            ok &= all(e <= t for e, t in zip(errs, tols, strict=True))
            worst = max(worst, max(e / t for e, t in zip(errs, tols, strict=True)))
            per[disc] = max(per[disc], max(e / t for e, t in zip(errs, tols, strict=True)))
            rows.append(f"{disc} {domain} β = {beta:g} mode {k}: c₂ {c2:.10g} (definition {d2:.10g}, "
                        f"{'closed form' if closed else 'the reference fit'} "
                        f"{want2:.10g}), c₁ {c1:.4g} (definition {d1:.4g}, closed form {want1:.6g}); errors "
                        + ", ".join(f"{e:.1e}/{t:.1e}" for e, t in zip(errs, tols, strict=True)))
    e, line = _hypersphere_curvature()
    ok &= e <= 1.0
    worst = max(worst, e)
    per["collocation"] = max(per["collocation"], e)
    rows.append(line)
    return Outcome(worst, None, "≤ 1 (error / tolerance: c₂ vs its definition 1e-7 max(1, K_k), c₁ 1e-8 "
                   "max(1, K_k); vs the closed forms those plus the probes' truncation)", ok,
                   worst_line(per) + "; " + "; ".join(rows),
                   tolerance=1.0)


#: The hypersphere's curvature case: (d, β, collocation points, the reference's Gauss–Jacobi nodes); τ = 1.
HYPERSPHERE_CURVATURE = (16, 2.0, 32, 80)


def _hypersphere_curvature() -> tuple[float, str]:
    """(the largest error/tolerance, a line) of c₂, c₁ on S^{d−1} against :mod:`mfpde.verify.hypersphere_reference`.

    The reference's states are those of a > 0 (the branch is symmetric in a): K(a) − K_c = c₂a² + c₄a⁴ + c₆a⁶
    through ρ, 2ρ, 3ρ, and again through ρ/2, ρ, 3ρ/2 for its Richardson estimate; c₁ = 0 by the symmetry.
    """
    from mfpde.tokens.hypersphere.stationary import HypersphereStationary
    from mfpde.verify.hypersphere_reference import solve_state
    from mfpde.verify.hypersphere_special import k_c

    d, beta, n, nodes = HYPERSPHERE_CURVATURE
    P = HypersphereStationary(n, beta, 1.0, d, rule="gauss")  # exact for the uniform state's polynomials
    Kk = P.threshold(1)
    res = continued(P, 0.97 * Kk, 1.03 * Kk, 0.02 * Kk, 60)
    bif = [e for e in res["bifurcations"] if "curvature" in e and e["mode"] == 1]
    if len(bif) != 1:
        return math.inf, f"S^{d - 1} β = {beta:g}: {len(bif)} bifurcations of degree 1"
    c2, c1 = float(bif[0]["curvature"]), float(bif[0]["slope"])
    K0 = k_c(beta, 1.0, d)
    fits = []
    for rho in (RHO, RHO / 2):
        a = rho * np.arange(1, 4)
        K = np.array([solve_state(float(x), beta, 1.0, d, nodes).K for x in a])
        Vi = np.linalg.inv(np.column_stack([a**2, a**4, a**6]))
        # the probes' round-off carried through the fit: n ε K_c/a per probe (as in :func:`_fitted_derivatives`)
        fits.append((Vi @ (K - K0), float((np.abs(Vi) @ (nodes * EPS * K0 / a))[0]), K))
    (f, _, K), (h, dh2, _) = fits
    d2 = (16 * (K[0] - K0) - (K[1] - K0)) / (12 * RHO**2)  # the definition, by the reference
    want2 = closed_c2("hypersphere", beta, 1.0, 1, d)
    t2, t1 = C2_TOL * max(1.0, Kk), C1_TOL * max(1.0, Kk)
    errs = (abs(c2 - d2), abs(c1), abs(c2 - want2), abs(h[0] - want2))
    r2 = 16.5 / 12 * nodes * EPS * K0 / RHO**3  # the reference's round-off in the definition
    tols = (t2 + r2, t1, t2 + 8 * abs(f[2]) * RHO**4, dh2 + 2 * abs(f[0] - h[0]) / 63)
    line = (f"S^{d - 1} β = {beta:g} degree 1: c₂ {c2:.10g} (definition {d2:.10g}, closed form {want2:.10g}), c₁ "
            f"{c1:.4g} (closed form 0); errors "
            + ", ".join(f"{e:.1e}/{t:.1e}" for e, t in zip(errs, tols, strict=True)))
    return max(e / t for e, t in zip(errs, tols, strict=True)), line


