"""The two solvers on S² against each other (theory §9 (iv)): DG on cells and the flow map on particles.

* ``sphere_dg_flow``: from a smooth start (SA, β = 5, degrees 2 and 3) to T = 1, where the degrees have grown
  and interact but the flow map is still smooth, the degree powers Σ_m μ̂_ℓm² (ℓ ≤ 8) of DG1 on the flat
  icosphere, refine 1..3, against those of the flow solver with N = 28 Gauss–Legendre nodes (1568 particles) at
  rtol 1e-12, spectral in N while the map is smooth: its change to N = 36 is measured and must be below 1% of
  DG's error on the finest mesh. (By T = 2 the map has steepened: there N = 20..44 still differ by 3e-3, as much
  as DG's error, and the flow solver converges only algebraically in N; a comparison there would test nothing.)
  Both use the
  harmonic kernel; nothing else is shared (the DG solver projects μ_0 on cells and steps SSP-RK3 with a CFL rule;
  the flow solver carries the exact quadrature of μ_0 along characteristics with DOP853). The DG error must fall
  at order ≥ 2 − 0.5 in the longest edge (DG1 and the flat geometry are second order) and be below 5% of the
  largest ℓ ≥ 1 power on the finest mesh (quick: refine 2, 3; full: 1..3, and DG2 on the quadratic geometry at
  order ≥ 3 − 0.5).

Runs on the ranks of ``COMM_WORLD`` (the DG mesh distributed; the flow solver replicated).
"""

from __future__ import annotations

import time

from mpi4py import MPI

import numpy as np

from mfpde.fitting import fit_order
from mfpde.tokens.sphere.data import modes_density
from mfpde.tokens.sphere.dg import SphereDG, growth_step_cap
from mfpde.tokens.sphere.diag import measure_power
from mfpde.tokens.sphere.flow import SphereFlow
from mfpde.tokens.sphere.kernel import sphere_velocity
from mfpde.tokens.sphere.mesh import edge_lengths, icosphere
from mfpde.verify.registry import Outcome, Series, register

__all__ = ["dg_powers", "dg_powers_of", "flow_powers"]

#: CPU budget of the check (seconds): quick, full.
BUDGET_S = {True: 120.0, False: 600.0}
BETA, ATTENTION, T, LMAX = 5.0, "softmax", 1.0, 8
MODES = [[2, 0, 0.06], [3, 1, 0.05], [3, -2, 0.03]]
#: DG1's error on the finest mesh must be below this fraction of the largest ℓ ≥ 1 power.
AT_FINEST = 0.05


def flow_powers(comm: MPI.Comm, nodes: int = 28) -> np.ndarray:
    """The degree powers ℓ = 0..LMAX at T by the flow solver (N nodes, rtol 1e-12), the reference."""
    flow = SphereFlow(sphere_velocity(BETA, ATTENTION, comm), nodes=nodes, rtol=1e-12, L=LMAX)
    return np.asarray(flow.solve(MODES, T, [T]).power[-1])


def dg_powers_of(comm: MPI.Comm, modes: list[list[float]], beta: float, attention: str, T: float, L: int,
                 refine: int, degree: int, order: int, deadline: float) -> tuple[np.ndarray, float]:
    """(the degree powers ℓ = 0..L at T by DG from ``sphere_modes`` data, the longest edge) on ``comm``."""
    op = SphereDG(icosphere(comm, refine, order), degree, sphere_velocity(beta, attention, comm),
                  max_dt=growth_step_cap(beta, attention))
    mu = op.project(lambda x: modes_density(modes, x))
    mu.x.array[:] /= op.mass(mu)
    rep = op.solve(mu, T, 4, deadline=deadline)
    x, w = op.quadrature(rep.mu_T)
    return measure_power(x, w, L, comm), edge_lengths(op.mesh)[1]


def dg_powers(comm: MPI.Comm, refine: int, degree: int, order: int, deadline: float) -> tuple[np.ndarray, float]:
    """(the degree powers at T by DG, the longest edge) on ``comm``, for this check's data."""
    return dg_powers_of(comm, MODES, BETA, ATTENTION, T, LMAX, refine, degree, order, deadline)


@register("sphere_dg_flow", "§9 (iv) two solvers", "the flow solver's degree powers (spectral in its particles)",
          kind="relative error", budget_s=BUDGET_S[False])
def check_sphere_dg_flow(quick: bool) -> Outcome:
    """DG1's degree powers converge to the flow solver's at order ≥ 1.5, within 5% on the finest mesh."""
    comm = MPI.COMM_WORLD
    deadline = time.process_time() + BUDGET_S[quick]
    ref = flow_powers(comm)
    scale = float(ref[1:].max())
    ref_change = float(np.abs(flow_powers(comm, 36) - ref)[1:].max()) / scale  # the reference's own error
    runs = [(1, 1, 2.0)] + ([] if quick else [(2, 2, 3.0)])
    ok, lines, series = True, [], []
    for p, order, expected in runs:
        errs, hs, cells = [], [], []
        for r in (2, 3) if quick else (1, 2, 3):
            pw, h = dg_powers(comm, r, p, order, deadline)
            errs.append(float(np.abs(pw[1:] - ref[1:]).max()) / scale)
            cells.append(20 * 4**r)
            hs.append(h)
        q = fit_order(hs, errs)
        good = q >= expected - 0.5 and (p != 1 or errs[-1] <= AT_FINEST) and ref_change <= 0.01 * errs[-1]
        ok &= good
        lines.append(f"DG{p} (geometry {order}): errors {', '.join(f'{e:.2e}' for e in errs)} at "
                     f"{', '.join(str(c) for c in cells)} cells, order {q:.2f} "
                     f"(≥ {expected - 0.5:g})")
        series.append(Series(hs, errs, "longest edge h", expected, q, f"DG{p}"))
    return Outcome(series[0].err[-1], None, f"≤ {AT_FINEST:g} on the finest mesh; order ≥ p+1 − 0.5", ok,
                   "; ".join(lines) + f"; the reference's change from N = 28 to 36 {ref_change:.1e} (≤ 1% of DG's); "
                   f"the largest ℓ ≥ 1 power at T = {T:g}: {scale:.3e}", series, AT_FINEST)
