"""The bifurcation analysis of noisy tokens' stationary states against the coupling K (§10), below the job.

From the uniform state at ``continuation.start`` the uniform branch is continued towards ``stop``
(:mod:`mfpde.continuation` on the circle's even states or the sphere's zonal ones, by ``continuation.discretisation``:
"spectral", :class:`~mfpde.tokens.circle.spectral.CircleSpectral` /
:class:`~mfpde.tokens.sphere.spectral.SphereSpectral` (Fourier / Legendre coefficients, numpy's Newton), or
"collocation",
:class:`~mfpde.tokens.circle.stationary.CircleStationary` / :class:`~mfpde.tokens.sphere.stationary.SphereStationary`
(PETSc's SNES, SLEPc)); at each branch point on it (K_k = τβ/I_k(β)
for the mode k on the circle, τβ/i_k(β) for the degree k on the sphere) the job switches onto the bifurcating
branch and continues it in the same range. Along every branch: K, the order parameter |μ̂_1|, the free energy
E(μ), the leading eigenvalue of the linearisation and the stable flag. Each bifurcation from the uniform
state is classified by the curvature c₂ = dK/d(a²) of the bifurcating branch at the point (a = ∫ μ cos kθ dθ on
the circle, ∫ μ P_k(x_3) dσ on the sphere: the mode's amplitude), measured by four Newton solves at fixed
amplitudes ±ρ and ±2ρ (ρ = 10⁻²) and Richardson's extrapolation of the even part (error O(ρ⁴)):
c₂ > 0 "supercritical" (the branch bends to K > K_k), c₂ < 0 "subcritical"; a branch whose slope dK/da at the
point is not zero ((K(ρ) − K(−ρ))/2ρ above ``TRANSCRITICAL``: no symmetry a ↦ −a, as for the sphere's even
degrees) is "transcritical". Folds are located on every branch.

The ``continuation`` command's job (:mod:`mfpde.jobs.continuation`) validates the config, writes DIR and draws the
diagram; here is the algorithm (:func:`noisy_branches`, :func:`curvature`, :func:`slope`, :func:`maxwell_points`),
on a discrete stationary problem and numbers, with no config and no file.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from mfpde.continuation import Branch, Solver, StepControl, branch_direction, continue_branch
from mfpde.continuation_newton import brent, newton_solver

__all__ = ["Stationary", "amplitude_row", "curvature", "maxwell_points", "mode_amplitude", "noisy_branches",
           "noisy_circle_branches", "slope", "threshold"]

#: A discrete stationary problem of noisy tokens (the circle's even states or the sphere's zonal ones).
Stationary = Any  # CircleStationary, SphereStationary, a domain's own (mfpde.domains: the stationary protocol)

logger = logging.getLogger(__name__)
#: The amplitude ρ of the curvature probes (:func:`curvature`).
PROBE = 1e-2
#: A bifurcating branch with |dK/da| above this at its branch point is transcritical: a symmetric (pitchfork)
#: branch has K(ρ) = K(−ρ), its measured slope (K(ρ) − K(−ρ))/2ρ is the Newton tolerance over ρ, ≈ 1e-10.
TRANSCRITICAL = 1e-6
#: A branch point farther than this (relative) from its closed form: the collocation does not resolve the uniform
#: state (spectral collocations locate it to ≈ 1e-13), and the report warns.
THRESHOLD_TOL = 1e-8


def threshold(P: Stationary, k: int) -> float:
    """The closed-form branch point K_k of mode k (``P.threshold(k)``), ∞ where it is beyond any double.

    τβ/I_k(β) on the circle (τβ/i_k(β), τβ/λ_k(β) on the spheres): for k ≫ β (k ≳ 200 at β = 4, every k ≳ 50 at
    β = 1e-6) I_k(β) ≈ (β/2)^k/k! underflows to 0, and the quotient raised ZeroDivisionError (exit 1); such a K_k
    exceeds 1e300 τβ, far outside any range.
    """
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        try:
            K = float(P.threshold(k))
        except (ZeroDivisionError, OverflowError):
            return math.inf
    return K if not math.isnan(K) else math.inf


def mode_amplitude(P: Stationary, u: np.ndarray, k: int) -> float:
    """|∫ μ cos kθ dθ| (circle), |∫ μ P_k dσ| (sphere, S^{d−1}) of the state u: the report's amplitude.

    The continuation's linear row (:meth:`amplitude`) is this for unknowns that are densities; a problem whose
    unknowns are not (log-densities) gives the density's own by ``density_amplitude``.
    """
    own = getattr(P, "density_amplitude", None)
    return abs(float(own(u, k))) if own is not None else abs(float(P.amplitude(k) @ u))


def amplitude_row(P: Stationary, k: int) -> np.ndarray:
    """A with aᵀx = mode k's amplitude (∫ μ cos kθ dθ; on the sphere ∫ μ P_k dσ), x = (u, K), shape (m+1,)."""
    return np.concatenate([P.amplitude(k), [0.0]])


def curvature(P: Stationary, newton: Solver, x_bp: np.ndarray, direction: np.ndarray, k: int) -> float:
    """c₂ = dK/d(a²) at the branch point x_bp of mode k (module docstring); NaN if a probe fails.

    Richardson on the even part K_e(a) = (K(a) + K(−a))/2 at ρ and 2ρ: the coefficient of a² whether or not the
    branch is symmetric (K_e = K then); a transcritical branch's linear term c₁a would otherwise enter as 14c₁/(12ρ).
    """
    a = amplitude_row(P, k)
    amp = float(a @ direction)
    Ks = []
    for rho in (PROBE, 2 * PROBE):
        pair = []
        for r in (rho, -rho):
            y = newton.solve(x_bp + (r / amp) * direction, a, float(a @ x_bp) + r)
            if y is None:
                return math.nan
            pair.append(float(y[-1]))
        Ks.append(0.5 * (pair[0] + pair[1]))
    K0 = float(x_bp[-1])
    return (16 * (Ks[0] - K0) - (Ks[1] - K0)) / (12 * PROBE**2)


def slope(P: Stationary, newton: Solver, x_bp: np.ndarray, direction: np.ndarray, k: int) -> float:
    """c₁ = dK/da at the branch point x_bp of mode k: (K(ρ) − K(−ρ))/2ρ by two Newton solves; NaN if one fails."""
    a = amplitude_row(P, k)
    amp = float(a @ direction)
    Ks = []
    for rho in (PROBE, -PROBE):
        y = newton.solve(x_bp + (rho / amp) * direction, a, float(a @ x_bp) + rho)
        if y is None:
            return math.nan
        Ks.append(float(y[-1]))
    return (Ks[0] - Ks[1]) / (2 * PROBE)


def _block(P: Stationary, br: Branch, origin: str, solver: str, k: int = 1) -> dict[str, Any]:
    """The report's block of a branch of mode k (the uniform branch: k = 1, its amplitude 0)."""
    lead, stable = [], []
    for u, K in zip(br.u, br.K, strict=True):
        vals, ok = P.stability(u, K, 2, solver)
        lead.append(float(vals[0].real))
        stable.append(ok)
    return {"origin": origin, "parameter": list(br.K), "order_parameter": [P.order_parameter(u) for u in br.u],
            "free_energy": [P.free_energy(u, K) for u, K in zip(br.u, br.K, strict=True)],
            "mode": k, "amplitude": [mode_amplitude(P, u, k) for u in br.u],
            "leading_eigenvalue": lead, "stable": stable, "stopped": br.stopped, "early": br.early}


def noisy_branches(P: Stationary, start: float, stop: float, ctl: StepControl,
                          deadline: float = math.inf, eig_solver: str = "slepc") -> dict[str, Any]:
    """The uniform branch from ``start`` towards ``stop`` and the branches bifurcating from it.

    Returns:
        {"branches": [blocks], "bifurcations": [...], "newton_iterations": int} (the report's part).
    """
    W = P.inner_weights()
    branches, bifs, warnings = [], [], []
    with newton_solver(P, atol=getattr(P, "newton_atol", 1e-12)) as newton:
        x0 = np.concatenate([P.uniform(), [start]])
        t0 = np.zeros(P.m + 1)
        t0[-1] = 1.0 if stop > start else -1.0
        with np.errstate(over="ignore"):  # λ_k(β) underflows for k ≫ β: K_k = ∞, far outside any range
            marks = np.array([threshold(P, k) for k in range(1, P.m)])  # the uniform state's branch points (§10)
        span = 1e6 * max(abs(start), abs(stop), 1.0)
        uni = continue_branch(P, newton, x0, t0, W, ctl, None, deadline, regular_start=True,
                              marks=marks[np.abs(marks) <= span])
        branches.append(_block(P, uni, "uniform", eig_solver))
        for ev in (e for e in uni.events if e.kind == "branch_point" and ctl.lo <= e.K <= ctl.hi):
            x = np.concatenate([ev.u, [ev.K]])
            d = branch_direction(P, x, ev.tangent, W)
            k = P.dominant_mode(d[: P.m])
            if amplitude_row(P, k) @ d < 0:
                d = -d
            c2, c1 = curvature(P, newton, x, d, k), slope(P, newton, x, d, k)
            kind = "transcritical" if abs(c1) > TRANSCRITICAL else ("supercritical" if c2 > 0 else "subcritical")
            bifs.append({"kind": kind, "slope": c1, "parameter": ev.K, "mode": k,
                         "closed_form": P.threshold(k), "curvature": c2,
                         "branch": len(branches)})
            if abs(ev.K - P.threshold(k)) > THRESHOLD_TOL * abs(P.threshold(k)):
                off = abs(ev.K / P.threshold(k) - 1)
                warnings.append(f"the branch point of mode {k} lies at K = {ev.K:.10g}, {off:.1e} "
                                f"from its closed form {P.threshold(k):.10g}: the collocation on {P.m} points does not "
                                "resolve the uniform state; raise continuation.points")
            # a transcritical branch is not symmetric in a: both of its halves are followed
            for sign, side in ((1.0, ""), (-1.0, ", a < 0")) if kind == "transcritical" else ((1.0, ""),):
                point = getattr(P, "resolved_point", None)  # the spectral states depend on K too
                br = continue_branch(P, newton, x, sign * d, W, ctl, None if point else P.resolved, deadline,
                                     resolved_point=point)
                for f in (e for e in br.events if e.kind == "fold"):
                    bifs.append({"kind": "fold", "parameter": f.K, "mode": k, "branch": len(branches),
                                 "order_parameter": P.order_parameter(f.u),
                                 "amplitude": mode_amplitude(P, f.u, k)})
                block = _block(P, br, f"mode {k} at K = {ev.K:.6g}{side}", eig_solver, k)
                if kind == "subcritical":  # a first-order transition: where the stable clustered part meets E(uniform)
                    bifs += maxwell_points(P, newton, br, block, k, len(branches))
                branches.append(block)
        its = newton.its
    return {"branches": branches, "bifurcations": bifs, "newton_iterations": its, "warnings": warnings}


def maxwell_points(P: Stationary, newton: Solver, br: Branch, block: dict[str, Any], k: int,
                   index: int) -> list[dict[str, Any]]:
    """The Maxwell points on a bifurcating branch: where its STABLE part's free energy equals the uniform state's.

    ΔE(K) = E(μ_K) − E(uniform, K) changes sign between two consecutive stable points of the branch; the root is
    located by Brent's method in K (:func:`brent`), each trial a Newton solve at fixed K from the states'
    linear interpolation, to |ΔK| ≤ 1e-13 K (the first-order transition of noisy tokens: theory §10, §11). A
    branch with no such sign change on its stable part gives ``{"kind": "maxwell", "found": False, "why": ...}``
    (its stable part does not reach the uniform state's free energy in the range, or it has no stable part).

    Returns:
        The report's entries: {"kind": "maxwell", "found": True, "parameter": K_M, "mode", "branch", "free_energy",
        "order_parameter", "amplitude", "stable"} per root, or the one entry saying none was found.
    """
    m = P.m
    K = np.asarray(block["parameter"])
    dE = np.array([e - P.free_energy(P.uniform(), kk) for e, kk in zip(block["free_energy"], K, strict=True)])
    st = np.asarray(block["stable"], dtype=bool)
    out: list[dict[str, Any]] = []
    row = np.eye(m + 1)[m]

    class _Failed(Exception):
        pass

    for i in range(len(K) - 1):
        if not (st[i] and st[i + 1]) or (dE[i] > 0) == (dE[i + 1] > 0) or dE[i] == 0:
            continue
        ends = np.concatenate([br.u[i], [K[i]]]), np.concatenate([br.u[i + 1], [K[i + 1]]])
        last = {"y": ends[0]}

        def gap(K1: float, ends: tuple[np.ndarray, np.ndarray] = ends, last: dict = last) -> float:
            """ΔE at K1 by a Newton solve at fixed K1 from the states' linear interpolation between the ends."""
            w = (K1 - ends[0][m]) / (ends[1][m] - ends[0][m])
            y = newton.solve((1 - w) * ends[0] + w * ends[1], row, K1)
            if y is None:
                raise _Failed
            last["y"] = y
            return P.free_energy(y[:m], K1) - P.free_energy(P.uniform(), K1)

        try:
            km = brent(gap, float(K[i]), float(K[i + 1]), xtol=1e-13 * abs(float(K[i])), rtol=1e-15)
            y = last["y"] if last["y"][m] == km else newton.solve(last["y"], row, km)
            if y is None:
                raise _Failed
        except _Failed:
            out.append({"kind": "maxwell", "found": False, "mode": k, "branch": index,
                        "why": f"Newton failed at fixed K between {K[i]:.10g} and {K[i + 1]:.10g}"})
            continue
        out.append({"kind": "maxwell", "found": True, "parameter": float(km), "mode": k, "branch": index,
                    "free_energy": P.free_energy(y[:m], float(km)), "order_parameter": P.order_parameter(y[:m]),
                    "amplitude": mode_amplitude(P, y[:m], k), "stable": P.stability(y[:m], float(km))[1]})
    if not out:
        why = ("the branch has no stable point in the range" if not st.any() else "the stable part's free energy "
               "does not cross the uniform state's in the range")
        out.append({"kind": "maxwell", "found": False, "mode": k, "branch": index, "why": why})
    return out


#: The circle's name of :func:`noisy_branches`.
noisy_circle_branches = noisy_branches


