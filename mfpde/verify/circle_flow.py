"""Check of the Lagrangian circle solver (theory §9, :mod:`mfpde.tokens.circle_flow`).

Against references it does not produce.

``circle_flow_map``: (1) the growth of modes k = 1..8 from ±10⁻⁶ (odd part, fitted in the linear regime) against
the closed form γ_k (scipy.special.iv), SA and USA at β = 5, M = 48 labels: the trapezoidal rule is spectral, so
the error is the integrator's and the cubic terms' (ε² e^{2γT} ≈ 3·10⁻⁹), asserted ≤ 10⁻⁶ of max γ; (2) W1 on the
circle of μ_0.5 (USA, β = 5, clusters forming) against the Eulerian DG2 solver on 256 cells: the flow map's CDF
is linear between labels, so the W1 difference falls like M^{-2} (|q + 2| < 0.25, M = 48, 96; full: 48..192)
while the DG reference's own error, by Richardson against 128 cells, stays below a tenth of the finest
difference.
"""

from __future__ import annotations

import math

import numpy as np

from mfpde.fitting import fit_order, fit_rate, richardson_bound
from mfpde.tokens.attention import HeadMeasure
from mfpde.tokens.circle import CircleMesh, CircleTransport
from mfpde.tokens.circle_diag import _grid, cdf_density, initial_density, w1_circle
from mfpde.tokens.circle_flow import FlowMap, modes_cdf, modes_density
from mfpde.verify.circle import BUDGET_S, _Budget, gamma_k
from mfpde.verify.registry import Outcome, Series, register

__all__ = ["flow_rates"]

#: The W1 problem (the side-by-side benchmark's): five small modes, USA, β = 5, t = 0.5.
W1_MODES = [[1, 2e-4, 0.0], [2, 1e-4, 1.3], [3, 1e-4, 1.0], [4, 1e-4, 2.5], [5, 5e-5, 2.0]]


def flow_rates(M: int, beta: float, attention: str, K: int = 8, eps: float = 1e-6) -> np.ndarray:
    """The growth rates of modes 1..K of the flow map on M labels, from ±ε starts (odd part), shape (K,)."""
    k = np.arange(1, K + 1)
    ts = np.linspace(0.0, 4.0 / float(gamma_k(k, beta, attention).max()), 21)
    ph = np.random.default_rng(0).uniform(0, 2 * math.pi, K)
    hats = {}
    for s in (1.0, -1.0):
        fm = FlowMap(modes_density([[float(kk), s * eps, p] for kk, p in zip(k, ph, strict=True)]), M, beta, attention)
        hats[s] = np.array([fm.fourier(x, K) for x in fm.solve(ts, rtol=1e-13, atol=1e-15).X])
    odd = np.abs(hats[1.0] - hats[-1.0]) / 2
    return np.array([-fit_rate(ts, odd[:, j]) for j in range(K)])


def _dg_cdf(n: int, Mg: int) -> np.ndarray:
    mesh = CircleMesh(n, 2)
    op = CircleTransport(mesh, "unnormalised", max_dt=0.025 / 18.6)  # a quarter of the default cap (Λ = 18.6)
    rep = op.solve(initial_density(mesh, "circle_modes", W1_MODES), HeadMeasure(np.array([5.0]), np.array([1.0])),
                   0.5, 10)
    return cdf_density(mesh, rep.mu_T, Mg)


@register("circle_flow_map", "§9 (Lagrangian form)",
          "closed form γ_k (scipy.special.iv); the Eulerian DG2 solver", kind="slope", budget_s=BUDGET_S[False],
          distributed=False)
def check_circle_flow_map(quick: bool) -> Outcome:
    """Flow map: rates of modes 1..8 within 1e-6 of max γ_k (SA, USA); W1 to DG2 falling like M^{-2}, |q + 2| < 0.25."""
    budget = _Budget(quick)
    lines, ok = [], True
    for att in ("unnormalised", "softmax"):
        ex = gamma_k(np.arange(1, 9), 5.0, att)
        err = float(np.max(np.abs(flow_rates(48, 5.0, att) - ex)) / ex.max())
        ok &= err <= 1e-6
        lines.append(f"{'SA' if att == 'softmax' else 'USA'} rates: error {err:.1e} (≤ 1e-6)")
    Mg = 2**14
    ref = _dg_cdf(256, Mg)
    ref_err = float(richardson_bound([0.0], [w1_circle(ref, _dg_cdf(128, Mg))], 3.0)[0])
    Ms = [48, 96] if quick else [48, 96, 192]
    errs = []
    for M in Ms:
        fm = FlowMap(modes_density(W1_MODES), M, 5.0)
        X = fm.solve(np.array([0.0, 0.5]), rtol=1e-10, atol=1e-12).X[-1]
        errs.append(w1_circle(fm.cdf(X, modes_cdf(W1_MODES), _grid(Mg)), ref))
        if budget.spent():
            return Outcome(math.nan, None, "budget", False, f"budget of {budget.limit:.0f} s exceeded")
    q = fit_order(Ms, errs)
    ok &= abs(q + 2.0) < 0.25 and ref_err <= 0.1 * errs[-1]
    lines.append(f"W1 to DG2 (n = 256, its error ≤ {ref_err:.0e}): {', '.join(f'{e:.2e}' for e in errs)} at M = {Ms}, "
                 f"order {q:.2f}")
    return Outcome(q, -2.0, "< 0.25 (W1 order in M); rates ≤ 1e-6 of max γ", ok, "; ".join(lines),
                   [Series(Ms, errs, "labels M", -2.0, q, "W1(flow map, DG2)")], tolerance=0.25)
