"""The CFL sub-step counts of the token solver against the count the CFL rule fixes (theory §1.3 (F), §6.1).

* ``token_cfl_substeps``: one depth step of Δt on a uniform interval mesh, Gaussian μ₀ = N(m₀, σ₀²), one head
  (a, c) with the flow to the right everywhere on Ω = [−L, L]: the velocity is the affine field of theory §6.1,
  u(x) = c (m + a σ² x), so the largest outflow per unit length of any cell is the boundary cell's, u(L)/h,
  and the rule Δt_sub · outflow/|cell| ≤ CFL (CFL = ``cfl`` for DG0, half of it for DG1, the Zhang–Shu
  condition for P1) fixes the count at n = ⌈Δt u(L) / (CFL h)⌉. Both the count and the margin that makes it
  unambiguous come from the closed form, not from the solver.

The count is fixed by the velocity at the start of the step when no sub-step has to be redone: the closed
form's u_t(L) over the step grows by less than ⌈x⌉/x (x = Δt u₀(L)/(CFL h)), which the check asserts of its
own parameters. A solver velocity off by more than the distance of x to the nearest integer (relative: about
8% here; the DG0/DG1 velocity error at h = 0.01 is far below that) would change the count, so a wrong CFL
factor, a DG1 limit not halved, or the sub-step count taken from a stale or wrong velocity fails.

A third case takes the batched DG0 solver (:mod:`mfpde.tokens.box.batch`, d = 2, rows advanced together) on two
samples whose counts the rule fixes differently: row A (x = 3.1, ⌈x⌉/x = 1.29) keeps its 4 sub-steps, row B
(x = 3.8, ⌈x⌉/x = 1.053) must redo its step with 8, because its velocity, checked before each later sub-step,
grows past the bound (by 1.091 before its last sub-step). u(L) = c(m + aσ²L) per axis and the largest outflow
per unit area is the corner cell's, (u₁(L) + u₂(L))/h. DG0's numerical diffusion (at most |u| h/2 per axis)
only widens μ, so it can only raise the growth: the premises are the closed form's growth for B and that growth
plus the diffusion's largest share for A. Redoing every row when one needs it, or none, fails.

A fourth case resolves the tolerance of that redo: the d = 1 DG0 step of the first case with Δt = TIGHT_DT
(x = 3.96, 4 sub-steps by the rule at the start) has a velocity before its last sub-step 1.0008 times the bound
by the closed form (1.0010 with DG0's diffusion at its largest): the step must be redone with 8. A redo that
lets a sub-step exceed its bound by more than 0.1% keeps 4 (the batched row B, 9% over, cannot tell tolerances
under 9% apart).

A fifth case sees the boundary cell's outflow in the DG1 bound: on BOUNDARY_CELLS = 100 cells (h = 0.08) the
cell at L has the largest outflow u(L)/h, and its neighbour's u(L − h)/h is δ = 0.75% smaller; Δt = BOUNDARY_DT
puts x = Δt u₀(L)/(CFL_1 h) = 3.01 just above an integer (4 sub-steps), and x(1 − δ) = 2.987 below it (3): a
bound that misses the outflow through ∂Ω counts 3.
"""

from __future__ import annotations

import math

from mpi4py import MPI

import numpy as np

from mfpde.exact import gaussian_transport
from mfpde.heads import HeadMeasure
from mfpde.mesh import box
from mfpde.tokens.box.transport import TokenTransport
from mfpde.verify.conservation import _mu0
from mfpde.verify.registry import Outcome, register

__all__ = ["expected_substeps"]

#: Ω = [−L, L] with cells of h = 2L/n; μ₀ = N(M0, S0); one head (a, c) = (A_HEAD, C_HEAD): u(x) = c(m + aσ²x) > 0
#: on all of Ω (0.2 at −L, 0.8 at L at t = 0), so the boundary cell at L has the largest outflow.
L, CELLS, M0, S0, A_HEAD, C_HEAD, CFL = 4.0, 800, 0.5, 0.25, 0.3, 1.0, 0.4
#: the depth step: x = Δt u₀(L)/(CFL h) = 3.7 for DG0 and 7.4 for DG1.
DT = 0.0185


def _law(m: float, t: float) -> tuple[float, float]:
    """(m_t, σ_t²) per axis of theory §6.1 for μ₀ = N(m, S0), one head (a, c) = (A_HEAD, C_HEAD): ā = c, b̄ = ca."""
    mean, cov = gaussian_transport(m, S0, C_HEAD, C_HEAD * A_HEAD, t)
    return float(mean[0]), float(cov[0, 0])


def _velocity_at_l(t: float) -> float:
    """u_t(L) = c (m_t + a σ_t² L) of the d = 1 case."""
    mean, var = _law(M0, t)
    return C_HEAD * (mean + A_HEAD * var * L)


def expected_substeps(degree: int) -> tuple[int, float, float]:
    """The sub-step count the CFL rule fixes for one depth step, its x, and the margin ⌈x⌉/x over the growth.

    Returns:
        (n = ⌈x⌉, x = Δt u₀(L)/(CFL_k h), the ratio (⌈x⌉/x) / (u_Δt(L)/u₀(L)); above 1: no sub-step is redone).
    """
    h = 2 * L / CELLS
    cfl = CFL * (1.0 if degree == 0 else 0.5)
    x = DT * _velocity_at_l(0.0) / (cfl * h)
    n = math.ceil(x)
    return n, x, (n / x) / (_velocity_at_l(DT) / _velocity_at_l(0.0))


#: The tight redo case: the d = 1 DG0 step of Δt = TIGHT_DT; its velocity exceeds the bound by at most
#: TIGHT_OVER (with DG0's diffusion at its largest) before the last sub-step: a redo tolerance above it is seen.
TIGHT_DT, TIGHT_OVER = 0.0198, 2e-3


def tight_expected() -> tuple[int, float, float, bool]:
    """(the count the rule fixes for the tight case: 2⌈x⌉, x, the closed-form overshoot, whether the premises hold).

    The overshoot is u_t(L)/u_bound − 1 before the last sub-step (t = (n − 1)Δt/n, u_bound = u₀(L)⌈x⌉/x); it
    must be above round-off (1e-6) without diffusion and below TIGHT_OVER with DG0's diffusion at its largest.
    """
    h = 2 * L / CELLS

    def u_l(t: float, spread: float = 0.0) -> float:
        mt, var = _law(M0, t)
        return C_HEAD * (mt + A_HEAD * (var + spread) * L)

    u0 = u_l(0.0)
    x = TIGHT_DT * u0 / (CFL * h)
    n = math.ceil(x)
    before_last, bound = (n - 1) / n * TIGHT_DT, u0 * n / x
    clean, diffused = u_l(before_last) / bound - 1, u_l(before_last, u_l(TIGHT_DT) * h * before_last) / bound - 1
    return 2 * n, x, clean, 1e-6 < clean and diffused < TIGHT_OVER and u_l(TIGHT_DT, u_l(TIGHT_DT) * h) / u0 < 2 * n / x


#: The DG1 boundary case: Ω = [−L, L] in BOUNDARY_CELLS cells, one depth step of BOUNDARY_DT.
BOUNDARY_CELLS, BOUNDARY_DT = 100, 0.0602


def boundary_expected() -> tuple[int, float, float, bool]:
    """The count ⌈x⌉ of the DG1 boundary case, x, δ = 1 − u₀(L − h)/u₀(L), and whether the premises hold.

    The premises: x and x(1 − δ) lie on either side of ⌊x⌋ by more than 0.1% of x, and the growth of u(L) over
    the step stays below ⌈x⌉/x (no sub-step is redone).
    """
    h = 2 * L / BOUNDARY_CELLS
    mean, var = _law(M0, 0.0)

    def u0(y: float) -> float:
        return C_HEAD * (mean + A_HEAD * var * y)

    x = BOUNDARY_DT * u0(L) / (0.5 * CFL * h)
    delta = 1 - u0(L - h) / u0(L)
    n = math.ceil(x)
    premise = min(x - (n - 1), (n - 1) - x * (1 - delta)) > 1e-3 * x
    return n, x, delta, premise and _velocity_at_l(BOUNDARY_DT) / u0(L) < n / x


#: The batched case: Ω = [−L, L]², 50 × 50 DG0 cells, Δt = 0.16, rows μ₀ = N((m, m), σ² I) for m in BATCH_M.
BATCH_CELLS, BATCH_DT, BATCH_M = 50, 0.16, (0.32, 0.46)


def batched_expected(m: float) -> tuple[int, bool, bool]:
    """(the count the rule fixes for the row of mean (m, m), whether it is a redone step, whether the premises hold).

    n = ⌈x⌉ if the velocity before the last sub-step stays within n/x (with DG0's diffusion at its largest),
    2⌈x⌉ if it exceeds n/x even without that diffusion and stays within 2n/x at the end of the step.
    """
    h = 2 * L / BATCH_CELLS

    def u_l(t: float, spread: float = 0.0) -> float:
        mt, var = _law(m, t)
        return C_HEAD * (mt + A_HEAD * (var + spread) * L)

    u0 = u_l(0.0)
    x = BATCH_DT * 2 * u0 / (CFL * h)
    n = math.ceil(x)
    before_last = (n - 1) / n * BATCH_DT
    diffused = u_l(before_last, u_l(BATCH_DT) * h * before_last) / u0  # variance + |u| h t: at most
    if diffused < n / x:
        return n, False, True
    clean = u_l(before_last) / u0
    return 2 * n, True, clean > n / x and u_l(BATCH_DT, u_l(BATCH_DT) * h * BATCH_DT) / u0 < 2 * n / x


def _batched_counts() -> list[int]:
    """The sub-steps of each row of one batched depth step (each rank alone: the batched path's mesh)."""
    from mfpde.tokens.box.batch import BatchTransport

    tt = TokenTransport(box(MPI.COMM_SELF, [[-L, L]] * 2, [BATCH_CELLS] * 2), 0, CFL)
    rows = [_mu0(tt, np.array([m, m]), S0 * np.eye(2)).x.array.copy() for m in BATCH_M]
    reps = BatchTransport(tt).solve(np.stack(rows), [HeadMeasure(np.array([A_HEAD]), np.array([C_HEAD]))], BATCH_DT, 1)
    return [r.substeps for r in reps]


def _one_step(cells: int, degree: int, dt: float, heads: HeadMeasure) -> int:
    """The sub-steps of one depth step of the d = 1 case on ``cells`` cells (μ₀ = N(M0, S0))."""
    tt = TokenTransport(box(MPI.COMM_WORLD, [[-L, L]], [cells]), degree, CFL)
    return tt.solve(_mu0(tt, np.array([M0]), np.array([[S0]])), heads, dt, 1).substeps


@register("token_cfl_substeps", "§1.3 (F) CFL; §6.1 affine velocity",
          "the count ⌈Δt u(L)/(CFL h)⌉ of the closed-form velocity", kind="sub-steps", steps=1000)
def check_token_cfl_substeps(quick: bool) -> Outcome:
    """Sub-steps of one depth step, DG0 and DG1, against the CFL rule's count (the row: the largest |n − n_CFL|)."""
    heads = HeadMeasure(np.array([A_HEAD]), np.array([C_HEAD]))
    worst, parts, ok = 0, [], True
    row = (-1, math.nan, math.nan)  # (|n − n_CFL|, n, n_CFL) of the row shown
    for degree in (0, 1):
        n_cfl, x, margin = expected_substeps(degree)
        ok &= margin > 1.0 and min(x - math.floor(x), math.ceil(x) - x) > 0.2  # the check's own premises
        tt = TokenTransport(box(MPI.COMM_WORLD, [[-L, L]], [CELLS]), degree, CFL)
        rep = tt.solve(_mu0(tt, np.array([M0]), np.array([[S0]])), heads, DT, 1)
        worst = max(worst, abs(rep.substeps - n_cfl))
        if abs(rep.substeps - n_cfl) > row[0]:
            row = (abs(rep.substeps - n_cfl), float(rep.substeps), float(n_cfl))
        parts.append(f"DG{degree}: {rep.substeps} sub-steps, rule {n_cfl} (x = {x:.3f}, margin {margin:.3f})")
    expected = [batched_expected(m) for m in BATCH_M]
    got = _batched_counts()
    ok &= all(premise for *_, premise in expected) and [redo for _, redo, _ in expected] == [False, True]
    worst = max(worst, *(abs(g - e) for g, (e, *_) in zip(got, expected, strict=True)))
    for g, (e, *_) in zip(got, expected, strict=True):
        if abs(g - e) > row[0]:
            row = (abs(g - e), float(g), float(e))
    parts.append(f"batched rows: {got} sub-steps, rule {[e for e, *_ in expected]} (row B redone with twice as many)")
    n_tight, x_tight, over, tight_ok = tight_expected()
    n_bnd, x_bnd, delta, bnd_ok = boundary_expected()
    ok &= tight_ok and bnd_ok
    for (cells, degree, dt), n_rule in (((CELLS, 0, TIGHT_DT), n_tight), ((BOUNDARY_CELLS, 1, BOUNDARY_DT), n_bnd)):
        n = _one_step(cells, degree, dt, heads)
        worst = max(worst, abs(n - n_rule))
        if abs(n - n_rule) > row[0]:
            row = (abs(n - n_rule), float(n), float(n_rule))
        parts.append(f"tight redo: {n} sub-steps, rule {n_rule} (x = {x_tight:.3f}, {100 * over:.2f}% over the "
                     f"bound before the last of {n_rule // 2}: redone)" if degree == 0 else
                     f"DG1 boundary cell: {n} sub-steps, rule {n_rule} (x = {x_bnd:.4f}; without ∂Ω's outflow "
                     f"{x_bnd * (1 - delta):.4f})")
    return Outcome(row[1], row[2], "= 0 (n = ⌈Δt u(L)/(CFL h)⌉ exactly, every row)", ok and worst == 0,
                   "; ".join(parts), tolerance=0.0)
