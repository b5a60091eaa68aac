"""Checks of the continuation's stability labels, its arclength condition and a step landing on a branch point.

The references (:mod:`mfpde.verify.zonal_reference`) are written from the definitions, apart from the continuation.
Each check runs on both discretisations (:data:`~mfpde.verify.continuation_checks.DISCRETISATIONS`: the spectral
default, then the collocation), with the continuation's own Newton solver of each, the same cases and bounds.

* ``continuation_stability``: the ``stable`` flag of every point of every branch (circle β = 4: the uniform branch,
  mode 1 through its fold, mode 2; sphere β = 3: the uniform branch, degree 1 through its fold) against the sign
  of the least eigenvalue of the free energy's second variation, δ²E[ν] = τ ∫ν²/μ − (K/β)∬ e^{β x·y} ν ν on the
  mass-zero perturbations in the metric ∫ν²/μ (numpy eigvalsh; the translation μ′, on S² the rotations s μ′ of the
  azimuthal order 1, left out; S²: the azimuthal orders m = 0..8, as the code's definition of stable), assembled
  here at the reference's state of the point's amplitude: for this gradient flow its sign is the linearisation's
  (Sylvester's law of inertia). Points within δ = 1e-8 max μ/min μ of 0 are not compared: the code calls a leading
  eigenvalue below 1e-9 stable (its eigensolver's round-off), and a marginal mode's eigenvalues of the two differ by
  the mobility ∫μ|∇(ν/μ)|²/∫ν²/μ ≥ min μ/max μ (Poincaré). At a compared stable point the reported leading
  eigenvalue must also be below −1e-9 (δ carried back by the same bound): a zero mode left in the spectrum (the
  translation) would stand at the top. At every point also: K against the reference's K(a)
  (bifurcating branches; their first point against τβ/I_k, τβ/i_k), the free energy E and the order parameter by
  the reference's quadrature, to 1e-7 relative (the collocation's tail ≤ 1e-9 where continued, times a sensitivity
  ≤ 100); on the uniform branch the leading eigenvalue against max_k k²(K I_k/β − τ) (sphere: ℓ(ℓ+1)(K i_ℓ/β − τ)),
  to 1e4 ε ‖L‖ (‖L‖ ≈ τ(N/2)², τN²: the round-off of the dense eigenvalues; the spectral blocks' degrees stop at
  N/2 and N − 1, so their ‖L‖ is at most that).
* ``continuation_arclength``: on the circle (β = 4, N = 81), the uniform branch over [0.38, 0.66] and the mode-1
  branch from K_c through its fold (clustered states, steps grown by 1.5 and halved): every point j satisfies
  Keller's condition ⟨t_b, x_j − x_b⟩_W = Δs_j for the point b it was predicted from (the branch's ``tangents``,
  ``bases``, ``steps``), to the Newton tolerance 1e-12 on the bordered residual (the condition is its last row) plus
  4(m+1)ε times the sums' terms; and every stored tangent (except at branch points, where the null space is
  two-dimensional) is the unit (in W) null vector of [∂F/∂u ∂F/∂K] computed here by an SVD, to 20 ε σ_1/σ_m.
* ``continuation_landing``: on the circle's uniform branch (N = 41, β = 1 and 2) steps of a fixed dyadic Δs ≈ K_c/8
  land on K_c exactly and 3·10⁻¹⁴ before and after it. The landing is inside the continuation's singular band
  (|det| ≤ 1e-12 |det before|; here ≈ 8 · 3·10⁻¹⁴) and outside the round-off of det (≈ 1e-16 relative), so each
  case has a known side. The run must find exactly the branch points K_c, at the landing point (within its offset
  + 8 ε of τβ/I_1(β)), and K_2 = τβ/I_2(β) within 1e-10 (the sign of det carried past the landing), as a run
  whose steps do not land on K_c does.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import scipy.special

from mfpde.verify.continuation_checks import (
    BUDGET_S,
    DISCRETISATIONS,
    EPS,
    Array,
    continued,
    problem,
    solver,
    worst_line,
)
from mfpde.verify.registry import Outcome, register
from mfpde.verify.zonal_reference import (
    ZonalReference,
    azimuthal_kernels,
    circle_state,
    second_variation_least,
    sphere_second_variation_least,
    sphere_state,
)


class _Domain:
    """A domain's reference quantities at a state of the reference (circle: 256 angles; sphere: 64 Gauss nodes)."""

    def __init__(self, domain: str, beta: float, tau: float):
        self.domain, self.beta, self.tau = domain, beta, tau
        if domain == "circle":
            self.x = 2 * math.pi * np.arange(FINE) / FINE
            self.w = np.full(FINE, 2 * math.pi / FINE)
            self.G = np.exp(beta * np.cos(self.x[:, None] - self.x[None, :]))  # ∬ e^{β cos} = Σ w w G
            self.first = np.cos(self.x)
        else:
            t, wz = np.polynomial.legendre.leggauss(FINE // 4)
            self.x, self.w = t, 2 * math.pi * wz
            s = np.sqrt(1 - t**2)
            ss = beta * np.outer(s, s)
            # ∬_{S²×S²} e^{β x·y} μ μ = Σ w_i w_j μ_i μ_j I_0(β s s′) e^{β t t′}: the azimuths give 2π · 2π / (2π)²
            self.G = scipy.special.ive(0, ss) * np.exp(ss + beta * np.outer(t, t))
            self.first = t
            self.kernels = azimuthal_kernels(t, beta)

    def state(self, ref: ZonalReference, a: float) -> tuple[Array, Array | None, float]:
        """(μ, μ′, K) of the reference's state of amplitude a."""
        return circle_state(ref, a, FINE) if self.domain == "circle" else sphere_state(ref, a, self.x)

    def threshold(self, k: int) -> float:
        """τβ/I_k(β), τβ/i_k(β)."""
        f = scipy.special.iv if self.domain == "circle" else scipy.special.spherical_in
        return self.tau * self.beta / float(f(k, self.beta))

    def free_energy(self, mu: Array, K: float) -> float:
        """E(μ) = τ∫μ log μ − (K/2β)∬ e^{β x·y} μ μ by the reference's quadrature."""
        wm = self.w * mu
        return self.tau * float(wm @ np.log(mu)) - K / (2 * self.beta) * float(wm @ self.G @ wm)

    def order_parameter(self, mu: Array) -> float:
        """|∫ μ cos θ dθ|, |∫ μ x_3 dσ|."""
        return abs(float((self.w * mu) @ self.first))

    def uniform_leading(self, K: float, n: int) -> float:
        """The uniform state's leading eigenvalue: max_k k²(K I_k(β)/β − τ), max_ℓ ℓ(ℓ+1)(K i_ℓ(β)/β − τ) (§10)."""
        if self.domain == "circle":
            k = np.arange(1, n // 2 + 1)
            return float(np.max(k**2 * (K * scipy.special.iv(k, self.beta) / self.beta - self.tau)))
        ell = np.arange(1, n - 1)
        return float(np.max(ell * (ell + 1) * (K * scipy.special.spherical_in(ell, self.beta) / self.beta - self.tau)))

    def least(self, mu: Array, dmu: Array | None, K: float) -> float:
        """The least eigenvalue of δ²E (:func:`second_variation_least`, :func:`sphere_second_variation_least`)."""
        if self.domain == "circle":
            return second_variation_least(mu, dmu, K, self.beta, self.tau)
        return sphere_second_variation_least(self.x, self.w / (2 * math.pi), mu, dmu, K, self.beta, self.tau,
                                             self.kernels)


#: The stability cases: (domain, β, collocation points, the range of K); τ = 1: the circle's uniform branch, mode 1
#: through its fold, mode 2; the sphere's uniform branch and degree 1 through its fold.
STABILITY_CASES = (("circle", 4.0, 81, (0.38, 0.66)), ("sphere", 3.0, 48, (1.18, 1.40)))
#: The code's stable band (1e-9 on the linearisation's leading eigenvalue) times 10, carried to δ²E by the mobility's
#: least Rayleigh quotient ∫μ|∇(ν/μ)|²/∫ν²/μ ≥ min μ/max μ (Poincaré on the circle and S², mean-zero ν/μ under μ):
#: δ = 1e-8 max μ/min μ.
STABILITY_BAND = 1e-8
FINE = 256
#: The code's stable band on the leading eigenvalue of L: at the points compared where δ²E's least is > δ, the
#: leading eigenvalue must lie below −1e-9.
LEAD_BAND = 1e-9
#: Bound on the relative error of a point's K, E and order parameter against the reference's state of its amplitude:
#: the collocation's tail (≤ 1e-9 where the branch is continued) times a sensitivity ≤ 100 (module docstring).
POINT_TOL = 1e-7


@register("continuation_stability", "§10 (stability of the stationary states)",
          "the sign of the least eigenvalue of the free energy's second variation at an independent state (eigvalsh)",
          kind="mismatches", budget_s=BUDGET_S, distributed=False)
def check_continuation_stability(quick: bool) -> Outcome:
    """Every point's ``stable`` against δ²E's least eigenvalue; its K, E, |μ̂₁|, λ_lead against the reference."""
    tau = 1.0
    bad, compared, skipped, rows, worst = 0, 0, 0, [], 0.0
    per = dict.fromkeys(DISCRETISATIONS, 0.0)
    for disc, domain, beta, n, (lo, hi) in [(d, *c) for d in DISCRETISATIONS for c in STABILITY_CASES]:
        P = problem(domain, n, beta, tau, disc)
        D = _Domain(domain, beta, tau)
        res = continued(P, lo, hi, 0.04 * (hi - lo))
        # the collocation linearisation's round-off: 1e4 ε ‖L‖, ‖L‖ ≈ τ (N/2)² (circle), τ N² (sphere)
        lead_tol = 1e4 * EPS * tau * ((n / 2) ** 2 if domain == "circle" else n**2)
        refs: dict[int, ZonalReference] = {}
        for b in res["branches"]:
            uniform = b["origin"] == "uniform"
            ref = refs.setdefault(b["mode"], ZonalReference(domain, beta, tau, b["mode"]))
            mism = []
            for K, amp, r, E, st, lead in zip(b["parameter"], b["amplitude"], b["order_parameter"], b["free_energy"],
                                              b["stable"], b["leading_eigenvalue"], strict=True):
                # a branch's first point is its branch point: the uniform state (amplitude 0 to round-off), at K_k
                flat = uniform or amp <= 1e-8
                mu, dmu, K_ref = D.state(ref, 0.0 if flat else amp)
                K_k = D.threshold(b["mode"])
                errs = [abs(K_ref - K) / K if not flat else (0.0 if uniform else abs(K - K_k) / K_k),
                        abs(D.free_energy(mu, K) - E) / max(1.0, abs(E)), abs(r - D.order_parameter(mu))]
                if uniform:
                    errs.append(abs(lead - D.uniform_leading(K, n)) / lead_tol * POINT_TOL)
                worst = max(worst, *errs)
                per[disc] = max(per[disc], *errs)
                if max(errs) > POINT_TOL:
                    mism.append(f"K = {K:.8g}: errors of K, E, order parameter, λ {[f'{e:.1e}' for e in errs]}")
                lam = D.least(mu, dmu, K)
                if abs(lam) <= STABILITY_BAND * float(mu.max() / mu.min()):
                    skipped += 1
                    continue
                compared += 1
                # a stable point's leading eigenvalue below the code's band −1e-9 (δ is ten times it through the
                # mobility): a zero mode left in (the translation) would stand at the top (on S² the leading
                # eigenvalue is the zonal block's, so only this side: an unstable state may be so off it)
                if (lam > 0) != bool(st) or (lam > 0 and lead >= -LEAD_BAND):
                    mism.append(f"K = {K:.8g}: δ²E's least {lam:.3g}, stable = {st}, λ_lead {lead:.3g}")
            bad += len(mism)
            rows.append(f"{disc} {domain} β = {beta:g} {b['origin']}: {len(b['stable'])} points, "
                        f"{sum(b['stable'])} stable"
                        + (f", mismatches {mism[:3]}" if mism else ""))
    return Outcome(float(bad), 0.0, f"0 mismatches ({compared} points compared, {skipped} within {STABILITY_BAND:g} "
                   f"max μ/min μ of marginal; K, E, order parameter within {POINT_TOL:g}, λ_lead on the uniform "
                   "branch within 1e4 ε ‖L‖)", bad == 0 and compared > 0,
                   f"{worst_line(per)} (K, E, order parameter, λ_lead); " + "; ".join(rows),
                   tolerance=0.0)


def null_tangent(P: Any, x: Array, W: Array) -> tuple[Array, float]:
    """(the unit (in W) null vector of [∂F/∂u ∂F/∂K] at x by an SVD, σ_1/σ_m: the condition of that null space)."""
    m = len(x) - 1
    Ju, JK = P.jacobian(x[:m], float(x[m]))
    s = np.sqrt(W)
    _, sv, Vt = np.linalg.svd(np.column_stack([Ju, JK]) / s[None, :])
    v = Vt[-1] / s
    return v / math.sqrt(float(np.sum(W * v * v))), float(sv[0] / sv[-1])


#: The arclength case: circle β = 4, τ = 1, N = 81; the uniform branch over [0.38, 0.66] and the mode-1 branch from
#: K_c through its fold to K = 0.38; steps from 2e-3 (grown by 1.5, halved) to 0.02.
ARCLENGTH_CASE = (4.0, 81, (0.38, 0.66))
#: The Newton tolerance of the continuation (:class:`mfpde.continuation.Newton`'s default ``atol``).
NEWTON_ATOL = 1e-12
#: A point whose [∂F/∂u ∂F/∂K] has σ_m/σ_1 below this is a branch point (a two-dimensional null space): no tangent.
SINGULAR_NULL = 1e-8


@register("continuation_arclength", "§10 (pseudo-arclength continuation)",
          "Keller's condition ⟨t_b, x_j − x_b⟩_W = Δs_j and the null vector of [∂F/∂u ∂F/∂K] by an SVD",
          kind="error/tolerance", budget_s=BUDGET_S, distributed=False)
def check_continuation_arclength(quick: bool) -> Outcome:
    """Max over the branches' points of |⟨t_b, x_j − x_b⟩_W − Δs_j| and ‖t_j − null vector‖_W over their bounds."""
    beta, n, (lo, hi) = ARCLENGTH_CASE
    worst, rows, ok = 0.0, [], True
    per = dict.fromkeys(DISCRETISATIONS, 0.0)
    for disc in DISCRETISATIONS:
        e, line = _arclength(problem("circle", n, beta, 1.0, disc), lo, hi)
        worst, ok = max(worst, e), ok and e <= 1.0
        per[disc] = e
        rows.append(f"{disc}: {line}")
    return Outcome(worst, None, "≤ 1 (|⟨t_b, x_j − x_b⟩_W − Δs_j| ≤ 1e-12 + 4(m+1)ε Σ|terms|; ‖t_j − null "
                   "vector‖_W ≤ 20 ε σ_1/σ_m)", ok, worst_line(per) + "; " + "; ".join(rows), tolerance=1.0)


def _arclength(P: Any, lo: float, hi: float) -> tuple[float, str]:
    """(the largest error/bound, a line) of the arclength condition and the tangents of one discretisation."""
    from mfpde.continuation import StepControl, branch_direction, continue_branch

    W = P.inner_weights()
    m = P.m
    ctl = StepControl(2e-3, 1e-9, 0.02, lo, hi, 400)
    e_K = np.zeros(m + 1)
    e_K[m] = 1.0
    with solver(P) as nw:
        uni = continue_branch(P, nw, np.concatenate([P.uniform(), [lo]]), e_K, W, ctl, regular_start=True)
        bp = next((e for e in uni.events if e.kind == "branch_point"), None)
        if bp is None:
            return math.inf, "no branch point on the uniform branch"
        x_bp = np.concatenate([bp.u, [bp.K]])
        d = branch_direction(P, x_bp, bp.tangent, W)
        if float(P.amplitude(1) @ d[:m]) < 0:
            d = -d
        clustered = continue_branch(P, nw, x_bp, d, W, ctl, P.resolved)
    worst, rows, ok = 0.0, [], True
    for name, br in (("uniform", uni), ("mode 1", clustered)):
        X = [np.concatenate([u, [K]]) for u, K in zip(br.u, br.K, strict=True)]
        if not (len(br.tangents) == len(br.bases) == len(br.steps) == len(X)):
            return math.inf, (f"{name}: {len(X)} points but {len(br.tangents)} tangents, {len(br.bases)} bases, "
                              f"{len(br.steps)} steps")
        arc, tan, skipped = 0.0, 0.0, 0
        for j in range(1, len(X)):
            b, t = br.bases[j], br.tangents[br.bases[j]]
            prod = W * t * (X[j] - X[b])
            # the Newton tolerance on the bordered residual (its last row is the condition) plus the round-off of
            # the sums: (m+1) ε over the terms' magnitudes, and ⟨t, t⟩_W = 1 to (m+1) ε
            terms = float(np.sum(np.abs(W * t * X[j])) + np.sum(np.abs(W * t * X[b])))
            bound = NEWTON_ATOL + 4 * (m + 1) * EPS * (terms + abs(br.steps[j]))
            arc = max(arc, abs(float(prod.sum()) - br.steps[j]) / bound)
        for j, x in enumerate(X):
            v, cond = null_tangent(P, x, W)
            if 1 / cond < SINGULAR_NULL:
                skipped += 1
                continue
            t = br.tangents[j]
            v = v if float(np.sum(W * v * t)) > 0 else -v
            # the null vector's round-off: ε σ_1/σ_m for each of the two solves, a factor 10 for the operation count
            tan = max(tan, math.sqrt(float(np.sum(W * (t - v) ** 2))) / (20 * EPS * cond))
        worst = max(worst, arc, tan)
        ok &= arc <= 1.0 and tan <= 1.0
        rows.append(f"{name}: {len(X)} points, K in [{min(br.K):.6g}, {max(br.K):.6g}], Δs in "
                    f"[{min(br.steps[1:]):.2e}, {max(br.steps[1:]):.2e}], {len(br.events)} events; arclength "
                    f"error/bound {arc:.2g}, tangent error/bound {tan:.2g} ({skipped} branch points skipped)")
    return (worst if ok else math.inf if math.isnan(worst) else max(worst, math.nextafter(1.0, 2.0))), "; ".join(rows)


#: The landing cases: circle, τ = 1, N = 41, β = 1 and 2 (full: also 0.5 and 4); where the third step lands: K_c,
#: K_c(1 ± 3e-14).
LANDING_BETAS = {True: (1.0, 2.0), False: (0.5, 1.0, 2.0, 4.0)}
LANDING_OFFSETS = (0.0, 3e-14, -3e-14)


def _dyadic_step(K: float) -> float:
    """The power of 2 nearest below K/8: steps of it from K − 3Δs reach K exactly in floating point."""
    return 2.0 ** math.floor(math.log2(K / 8))


@register("continuation_landing", "§10 (branch points on a step)",
          "K_c = τβ/I_1(β) (scipy) and the same branch continued with steps that do not land on it",
          kind="rel. error", budget_s=BUDGET_S, distributed=False)
def check_continuation_landing(quick: bool) -> Outcome:
    """Steps landing on K_c (exactly, and 3e-14 before and after it): the branch points K_c and K_2, nothing else."""
    from mfpde.continuation import StepControl, continue_branch

    worst, rows, ok = 0.0, [], True
    per = dict.fromkeys(DISCRETISATIONS, 0.0)
    for disc, beta in [(d, b) for d in DISCRETISATIONS for b in LANDING_BETAS[quick]]:
        P = problem("circle", 41, beta, 1.0, disc)
        W = P.inner_weights()
        m = P.m
        e_K = np.zeros(m + 1)
        e_K[m] = 1.0
        Kc = float(1.0 * beta / scipy.special.iv(1, beta))
        K2 = float(1.0 * beta / scipy.special.iv(2, beta))
        runs = []
        with solver(P) as nw:
            for off in (*LANDING_OFFSETS, None):
                if off is None:  # not landing: steps of an irrational size from an unrelated start
                    ds, lo = math.sqrt(2) * Kc / 11, 0.5 * Kc * math.sqrt(1.1)
                else:
                    target = Kc * (1 + off)
                    ds = _dyadic_step(target)
                    lo = target - 3 * ds
                hi = K2 + 2 * ds
                br = continue_branch(P, nw, np.concatenate([P.uniform(), [lo]]), e_K, W,
                                     StepControl(ds, ds, ds, lo, hi, 200), regular_start=True)
                bps = [e.K for e in br.events if e.kind == "branch_point"]
                landed = off is not None and any(K == target for K in br.K)
                runs.append((off, bps, landed))
        ref = runs[-1][1]
        for off, bps, landed in runs:
            tol_c = (abs(off) if off else 0.0) + 8 * EPS if off is not None else 1e-10
            good = len(bps) == 2 and (off is None or landed)
            if good:
                e_c, e_2 = abs(bps[0] - Kc) / Kc, abs(bps[1] - K2) / K2
                e_ref = max(abs(a - b) / b for a, b in zip(bps, ref, strict=True)) if len(ref) == 2 else math.inf
                good = e_c <= tol_c and e_2 <= 1e-10 and e_ref <= max(tol_c, 1e-10)
                worst = max(worst, e_c)
                per[disc] = max(per[disc], e_c)
            ok &= good
            rows.append(f"{disc} β = {beta:g}, {'no landing' if off is None else f'landing at K_c(1 + {off:g})'}: "
                        f"{'landed, ' if landed else ''}branch points {[f'{k:.16g}' for k in bps]}"
                        + ("" if good else " WRONG"))
    return Outcome(worst, 0.0, "one branch point at K_c within the landing's offset + 8 ε and K_2 within 1e-10, "
                   "in every run (1e-10 where not landing)", ok, worst_line(per) + "; " + "; ".join(rows))
