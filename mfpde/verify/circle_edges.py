"""The circle's edge cases against hand counts.

* ``circle_edge_cases``: ``max_stable_dt`` of DG0 on a divergent cell (and of DG1, DG2) against the rule on
  hand-made edge velocities, and ``cluster_masses`` of unequal weights against a hand count.
"""

from __future__ import annotations

import math

import numpy as np

from mfpde.tokens.circle.dg import CircleMesh, CircleTransport
from mfpde.verify.registry import Outcome, register

EPS = 2.0**-52


def _gamma(n: int) -> float:
    return n * EPS / 2 / (1 - n * EPS / 2)


#: Edge velocities (at the left edges θ_j = jh of 12 cells) of the DG0 bound's cases: a divergent cell (outflow
#: through both faces, cell 4: 0.7 left, 1.3 right), a convergent one (cell 8: none), a flow-through, and the
#: cell whose two outflows are largest elsewhere (cell 10: 0.5 + 0.9 < 2.0); expected ratio max (u⁺_{j+1} + u⁻_j) = 2.
DG0_EDGES = np.array([0.2, 0.3, 0.4, 0.5, -0.7, 1.3, 0.8, 0.1, -0.6, 0.4, -0.5, 0.9])


def _hand_masses() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Labels in three groups (one across θ = 0) with unequal weights, shuffled, and the groups' masses by hand.

    Groups: {6.1, 6.2, 0.05, 0.1} (weights 0.11, 0.07, 0.23, 0.02: 0.43), {1.5, 1.6} (0.19, 0.05: 0.24),
    {3.0, 3.05, 3.2} (0.13, 0.17, 0.03: 0.33); gaps between groups ≥ 1.3, within ≤ 0.23; cut at 0.5.
    The expected order is cyclic from the first cut: the group after the largest angle's gap first is not
    fixed, so the masses are compared as a sorted multiset.
    """
    X = np.array([6.1, 6.2, 0.05, 0.1, 1.5, 1.6, 3.0, 3.05, 3.2])
    w = np.array([0.11, 0.07, 0.23, 0.02, 0.19, 0.05, 0.13, 0.17, 0.03])
    order = np.random.default_rng(11).permutation(len(X))
    return X[order] + 2 * np.pi * np.array([0, 1, -1, 0, 2, 0, 0, 1, 0])[order], w[order], np.array([0.43, 0.24, 0.33])


@register("circle_edge_cases", "§9 (CFL of DG0; cluster masses)",
          "the upwind DG0 rule on hand-made edge velocities; cluster masses counted by hand", kind="ratio to bound",
          budget_s=20.0, distributed=False)
def check_circle_edge_cases(quick: bool) -> Outcome:
    """DG0..DG2's ``max_stable_dt`` (a divergent cell) and ``cluster_masses`` (unequal weights) against hand counts.

    DG0's bound on a divergent cell = cfl·h/(u⁺_right + u⁻_left), DG1/DG2's = cfl ŵ₁ h/max|u|; ``cluster_masses``
    of unequal weights = the hand count. Relative errors over their round-off bounds (≤ 1).

    Rules: DG0 Δt (max_j u⁺_{j+1/2} + u⁻_{j−1/2})/h ≤ cfl (a divergent cell loses mass through both faces), DG_p
    Δt max|u_edge|/h ≤ cfl ŵ₁ (ŵ₁ of :func:`mfpde.verify.sphere_dg.lobatto_first_weight`); a handful of
    operations each, bound 2γ_8. Masses: sums of ≤ 9 weights, bound γ_9 times the total.
    """
    from mfpde.tokens.circle.map import cluster_masses
    from mfpde.verify.sphere_dg import lobatto_first_weight

    lines, worst = [], 0.0
    ue = DG0_EDGES
    for p in (0, 1, 2):
        mesh = CircleMesh(len(ue), p)
        op = CircleTransport(mesh, "unnormalised")
        got = float(op.max_stable_dt((np.zeros((len(ue), p + 1)), ue, math.inf))[0])
        h = 2 * math.pi / len(ue)
        if p == 0:
            out = [max(ue[(j + 1) % len(ue)], 0.0) + max(-ue[j], 0.0) for j in range(len(ue))]
            rule = op.cfl * h / max(out)
        else:
            rule = op.cfl * lobatto_first_weight(p) * h / float(np.abs(ue).max())
        r = abs(got - rule) / rule / (2 * _gamma(8))
        worst = max(worst, r)
        lines.append(f"DG{p}: max_stable_dt {got:.15g}, rule {rule:.15g} ({r:.2g} of the bound)")
    X, w, hand = _hand_masses()
    got_m = np.sort(cluster_masses(X, w, 0.5))
    if len(got_m) != len(hand):
        r = math.inf
    else:
        r = float(np.max(np.abs(got_m - np.sort(hand)))) / (_gamma(len(w)) * float(w.sum()))
    worst = max(worst, r)
    lines.append(f"cluster_masses {', '.join(f'{m:.15g}' for m in got_m)}, by hand "
                 f"{', '.join(f'{m:g}' for m in np.sort(hand))} ({r:.2g} of the bound)")
    return Outcome(worst, None, "≤ 1 (relative error over the round-off of a few operations)", worst <= 1.0,
                   "; ".join(lines), tolerance=1.0)
