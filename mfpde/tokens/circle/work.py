"""The circle DG solver's work before it runs: its sub-steps bounded, a transport that cannot end refused."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from mfpde.tokens.circle.dg import CircleMesh

if TYPE_CHECKING:
    from mfpde.heads import HeadMeasure
    from mfpde.tokens.circle.config import Section

__all__ = ["QUICK_VALUES", "UNBOUNDED_SUBSTEPS", "check_dg_work", "dg_substep_estimate"]


def dg_substep_estimate(sec: Section, heads: HeadMeasure, mesh: CircleMesh) -> tuple[int, int]:
    """(at least, at most) the DG solver's sub-steps, estimated before the solve.

    At least the growth cap's T·Λ/:func:`~mfpde.tokens.circle.growth_cap` (Λ the fastest linear rate about the
    uniform state, :func:`~mfpde.tokens.circle.linear_rate_bound`); at most the CFL rule's at the velocity bound
    |u| ≤ Σ_h |c_h| (SA: |N| ≤ Z) or Σ_h |c_h| e^{β_h} (USA) (with noise τ the Scharfetter–Gummel rule's,
    h²/(2τ + 2|u|h) per cfl), if that exceeds it, plus one a depth step (each rounds its count up).
    """
    from mfpde.tokens.circle.dg import growth_cap, linear_rate_bound

    T = sec.depth.T
    lam = linear_rate_bound(heads.a, heads.c, sec.attention)
    lo = T * lam / growth_cap(heads.a, mesh.h, mesh.degree)
    if sec.attention == "softmax":
        umax = float(np.sum(np.abs(heads.c)))
    else:
        umax = float(np.sum(np.abs(heads.c) * np.exp(np.minimum(np.abs(heads.a), 700.0))))
    cfl = sec.cfl * (mesh.w_lobatto if mesh.degree else 1.0) * mesh.h
    hi = T * umax / cfl
    if sec.noise > 0:  # Scharfetter–Gummel: Δt ≥ cfl h²/(τ max(B(P) + B(−P'))), B(x) ≤ 1 + max(−x, 0)
        hi = T * (2 * sec.noise + 2 * umax * mesh.h) / (sec.cfl * mesh.h**2)
    hi = max(lo, hi) + sec.depth.steps  # every depth step rounds its count up
    big = UNBOUNDED_SUBSTEPS  # a count past this is "unbounded" (β near the overflow of e^β)

    def count(x: float) -> int:
        return int(math.ceil(x)) if math.isfinite(x) and x < big else big

    return count(lo), count(hi)


#: The count :func:`dg_substep_estimate` gives for "unbounded" (e^β near its overflow, or a growth cap below 1e-18).
UNBOUNDED_SUBSTEPS = 10**18
#: DG values (n (p + 1)) up to which the set-up and the first depth step take about a second.
QUICK_VALUES = 100_000


def check_dg_work(sec: Section, heads: HeadMeasure) -> None:
    """Refuse, before DIR or any array, a DG transport whose sub-steps cannot end (:func:`mfpde.limits.check_work`).

    The bound: the least sub-steps of :func:`dg_substep_estimate` (the growth cap's), each at the optimistic
    :data:`~mfpde.limits.SECONDS_PER_STEP` plus :data:`~mfpde.limits.SECONDS_PER_CELL` per value of the n (p + 1)
    (1048576 cells at DG6 with β = 5: at least 10¹⁸ sub-steps, which ran 53 s into the solve before its first depth
    step was refused).

    Raises:
        ConfigError: naming tokens.cells (or tokens.beta where the cells are few) and the sub-step bound.
    """
    from mfpde.limits import SECONDS_PER_CELL, SECONDS_PER_STEP, check_work

    mesh = CircleMesh(sec.cells, sec.degree)  # the reference data only: no array of n cells
    lo, _ = dg_substep_estimate(sec, heads, mesh)
    values = sec.cells * (sec.degree + 1)
    if lo >= UNBOUNDED_SUBSTEPS and values <= QUICK_VALUES:  # β near e^β's overflow on a small mesh: the first
        return  # depth step's own refusal comes within a second and names tokens.beta at the input's velocity
    key = "tokens.cells" if values > QUICK_VALUES else "tokens.beta"
    check_work(lo * (SECONDS_PER_STEP + SECONDS_PER_CELL * values), key,
               f"at least {lo:.3g} DG sub-steps (the growth cap) of {values:.3g} values, at {SECONDS_PER_STEP:g} s a "
               f"sub-step and {SECONDS_PER_CELL:g} s a value; tokens.solver = 'flow' has no CFL rule")
