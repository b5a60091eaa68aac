"""Check of the Lagrangian circle solver (theory §9, :mod:`mfpde.tokens.circle.flow`).

Against references it does not produce.

``circle_flow_map``:

1. **The force**: the Fourier-series velocity against the direct pairwise sum of the independent particle code
   (:func:`mfpde.tokens.circle.particles.dense_velocity`), SA and USA at β = 5 and 12, on scattered labels: the
   series is cut below round-off, so the difference is round-off, ≤ 64 K ε times the series' scale Σ_k |a_k|; its
   derivative u' against the direct sum of the derivative (≤ 64 K² ε relative), both also as the integrator's
   right-hand side computes them;
   the exact Jacobian (the stiff phase's) against central differences of that velocity, ≤ 10⁻⁷ of its size.
2. **Growth rates** of modes k = 1..8 from ±10⁻⁶ (odd part, fitted in the linear regime) against the closed form
   γ_k (scipy.special.iv), SA and USA at β = 5, M = 48: the midpoint rule is spectral, so the error is the
   integrator's and the cubic terms' (ε² e^{2γT} ≈ 3·10⁻⁹); ≤ 10⁻⁶ of max γ.
3. **Spectral convergence in M** of W1(μ_0.5) against the Eulerian DG solver (USA, β = 5, the benchmark's five
   small modes, clusters forming; DG2 on 256 cells at an eighth of the default step cap, its own error bounded by
   Richardson against 128 cells and against twice the step cap): the errors at M = 32, 40, 48 (above 10× the
   reference's error) fit log W1 = a − bM, and they must fall faster than order 6 over that range
   (W1(48)/W1(32) < (32/48)^6; a local reconstruction between labels here is of order 2 (linear) or 4 (cubic)).
4. **The merge time** of two clusters (SA, β = 5, μ_0 ∝ 1 + 0.3 cos 2θ + 0.05 cos(θ − 0.4), output depths 20 per
   decade): the flow map's first depth with one cluster, against the reduced two-Dirac ODE started from the flow
   map's clusters at t = 100 (masses and angles; scipy's LSODA with an event at distance 10⁻³), independent of the
   labels and of the stiff integrator; the flow map's must be the first output at or after the ODE's (within a
   factor 10^{1/20}). The stiffness switch must have fired (the collapsed phase is integrated by the implicit
   solver), and by the depth the contraction rate σ = −min u′ (direct sums) sets (:func:`stiff_switch`); the merge
   is only run once it has (without the switch, the explicit integrator would step to 10⁹ for hours).
   **The gap** between the two clusters at every output from t = 100 to the merge against that ODE's, within the
   local errors the integrators allow carried by the reduced flow's exact variational factor
   (:func:`two_cluster_merge`): the outputs inside the stiff integrator's steps.

The row: each part as a ratio to its bound, the first that failed (else the largest).

Plant a bug (``bench/plant_bugs.py``): labels at the uniform angles instead of the quantiles, a sign of the
Jacobian, a series cut at K/2, the switch's σ read from the velocity instead of u′.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.integrate

from mfpde.fitting import fit_rate, richardson_bound
from mfpde.heads import HeadMeasure
from mfpde.tokens.circle.dg import CircleMesh, CircleTransport
from mfpde.tokens.circle.diag import cdf_at, clusters_cdf, initial_density, moments, w1_circle
from mfpde.tokens.circle.flow import FlowMap, FourierForce, cluster_masses, modes_labels
from mfpde.tokens.circle.particles import dense_velocity, dense_velocity_derivative
from mfpde.verify.circle import _Budget, gamma_k
from mfpde.verify.registry import Outcome, Series, register

__all__ = ["flow_rates", "two_cluster_merge"]

#: The W1 problem (the side-by-side benchmark's): five small modes, USA, β = 5, t = 0.5.
W1_MODES = [[1, 2e-4, 0.0], [2, 1e-4, 1.3], [3, 1e-4, 1.0], [4, 1e-4, 2.5], [5, 5e-5, 2.0]]
#: The two-cluster problem of the atlas.
TWO_MODES = [[2, 0.3, 0.0], [1, 0.05, 0.4]]
_ANGLES = 2 * math.pi * np.arange(1024) / 1024
#: The DG reference's sub-step cap: an eighth of the default 0.1/Λ (Λ = γ_3(5) = 18.6).
REF_CAP = 0.0125 / 18.6


def _flow(modes: list[list[float]], M: int, beta: float, attention: str) -> FlowMap:
    return FlowMap(modes_labels(modes, M), np.array([beta]), np.array([1.0]), attention)


def flow_rates(M: int, beta: float, attention: str, K: int = 8, eps: float = 1e-6) -> np.ndarray:
    """The growth rates of modes 1..K of the flow map on M labels, from ±ε starts (odd part), shape (K,)."""
    k = np.arange(1, K + 1)
    ts = np.linspace(0.0, 4.0 / float(gamma_k(k, beta, attention).max()), 21)
    ph = np.random.default_rng(0).uniform(0, 2 * math.pi, K)
    hats = {}
    for s in (1.0, -1.0):
        fm = _flow([[float(kk), s * eps, p] for kk, p in zip(k, ph, strict=True)], M, beta, attention)
        X = fm.solve(ts, rtol=1e-13).X
        hats[s] = np.array([moments(x, 1.0 / M, K) for x in X])
    # μ̂_k of μ_t from the labels (midpoint rule), odd part of the two starts
    odd = np.abs(hats[1.0] - hats[-1.0]) / 2

    def rate(j: int) -> float:
        try:
            return -fit_rate(ts, odd[:, j])
        except ValueError:  # no growth to fit (e.g. both starts gave the same labels): no rate, the check fails
            return math.nan

    return np.array([rate(j) for j in range(K)])


def _dg_cdf(n: int, cap: float = REF_CAP) -> np.ndarray:
    mesh = CircleMesh(n, 2)
    op = CircleTransport(mesh, "unnormalised", max_dt=cap)
    rep = op.solve(initial_density(mesh, "circle_modes", W1_MODES), HeadMeasure(np.array([5.0]), np.array([1.0])),
                   0.5, 10)
    return cdf_at(mesh, rep.mu_T, _ANGLES)


def _force_error() -> tuple[float, str]:
    """The force's and the Jacobian's errors over their bounds (≤ 1 passes), largest over SA/USA and β = 5, 12.

    Force: |series − direct| / (64 K ε Σ|a_k|); its θ-derivative u' (which the map's derivative needs) against the
    direct sum of the derivative, relative, over 64 K² ε; both as :meth:`FourierForce.field` gives them and as the
    integrator's right-hand side ``rhs`` computes them (its own fused path). Jacobian: its error against central
    differences of the velocity (step 10⁻⁶: O(10⁻¹²|u‴|) + ε|u|/10⁻⁶, ≈ 10⁻¹⁰ of |J|) over 10⁻⁷|J|.
    """
    X = np.sort(np.random.default_rng(3).uniform(0, 2 * math.pi, 200))
    worst, parts = 0.0, []
    for att in ("unnormalised", "softmax"):
        for beta in (5.0, 12.0):
            f = FourierForce(np.array([beta]), np.array([1.0]), att, len(X))
            scale = float(np.abs(f.A[:, 0]).sum())
            u, du = f.field(X, derivative=True)
            ode = f.rhs(0.0, np.concatenate([X, np.zeros(len(X))]))  # (u, u') as the integrator steps them (fused)
            ref_u = dense_velocity(X, beta, att == "softmax")
            err = float(max(np.max(np.abs(u - ref_u)), np.max(np.abs(ode[: len(X)] - ref_u))))
            ref_du = dense_velocity_derivative(X, beta, att == "softmax")  # the derivative the map's Hermite needs
            assert du is not None
            derr = float(max(np.max(np.abs(du - ref_du)), np.max(np.abs(ode[len(X):] - ref_du)))
                         / np.max(np.abs(ref_du)))  # terms weighted by k ≤ K: ≤ 64K²ε
            r = max(err / (64 * f.K * np.finfo(float).eps * scale), derr / (64 * f.K**2 * np.finfo(float).eps))
            J, h, cols = f.jacobian(X), 1e-6, range(0, len(X), 7)
            fd = np.array([(f.velocity(X + h * np.eye(len(X))[c]) - f.velocity(X - h * np.eye(len(X))[c])) / (2 * h)
                           for c in cols]).T
            jerr = float(np.max(np.abs(J[:, list(cols)] - fd)) / np.max(np.abs(J)))
            worst = max(worst, r, jerr / 1e-7)
            parts.append(f"{'SA' if att == 'softmax' else 'USA'} β={beta:g}: {err / scale:.1e} (u' {derr:.0e}, "
                         f"Jacobian {jerr:.0e})")
    return worst, ", ".join(parts)


def two_cluster_merge(beta: float, M: int = 64, rtol: float = 1e-9,
                      deadline: float = math.inf) -> tuple[float, float, dict[str, object], tuple[float, float, str]]:
    """(the flow map's merge depth, the reduced two-Dirac ODE's, the flow map's integrator stats, the gap's), SA.

    The flow map runs to 10⁹ with 20 output depths per decade; its merge depth is the first output with one
    cluster after two. The reduced ODE starts from the flow map's two label groups at t = 100 (their masses and
    circular-mean angles): dθ_a/dt = m_b e^{β cos d} sin d / (m_a e^β + m_b e^{β cos d}), d = θ_b − θ_a, and its merge
    depth is where |d| < 10⁻³.

    The gap's: (the largest |d_flow − d_ODE| at the outputs from t = 100 to the ODE's merge, its bound, a line),
    d_flow from the circular means of the two label groups, d_ODE from the ODE's dense output (LSODA at 10⁻¹²). The
    bound sums the local errors the integrators allow and carries each to the output by the reduced flow's exact
    variational factor: for the autonomous d′ = f(d), a perturbation at s reaches T as f(d(T))/f(d(s)) = G. It is
    (N_flow rtol (1 + max|X|) + N_ODE 10⁻¹²(1 + π) + spread) · max G, with N the steps each took (after its switch
    the flow map's stiff ones too, each with an RMS error within the tolerance rtol·|X| + rtol), spread the groups'
    largest distance from their means at t = 100 (the Diracs' model error, ≈ 10⁻¹³). An output recorded at a step's
    end instead of its depth misses by the distance the gap moves within the step: 10³ times the bound here.
    """
    ts = np.logspace(-2, 9, 221)
    fm = _flow(TWO_MODES, M, beta, "softmax")
    sol = fm.solve(ts, rtol, deadline=deadline)
    counts = [clusters_cdf(F)[0] for F in sol.cdf]
    two = [i for i, c in enumerate(counts) if c == 2]
    t_flow = next((float(ts[i]) for i in range(two[0] if two else len(ts), len(ts)) if counts[i] == 1), math.inf)
    i100 = int(np.searchsorted(ts, 100.0))
    X = np.mod(sol.X[i100], 2 * math.pi)
    w = np.full(M, 1.0 / M)
    masses = cluster_masses(X, w, 0.5)
    if len(masses) != 2:
        return t_flow, math.nan, sol.stats, (math.nan, 1.0, f"{len(masses)} clusters at t = 100, not 2: no gap")
    order = np.argsort(X)
    gaps = np.diff(np.concatenate([X[order], [X[order][0] + 2 * math.pi]]))
    cut = int(np.argmax(gaps))
    rolled = np.roll(order, -(cut + 1))
    split = int(np.argmax(np.diff(X[rolled]))) + 1
    idx = [rolled[:split], rolled[split:]]  # the labels of each cluster

    def mean_angle(Xj: np.ndarray, g: np.ndarray) -> float:
        return float(np.angle(np.exp(1j * Xj[g]).mean()))

    ang = [mean_angle(X, g) for g in idx]
    m = [len(g) / M for g in idx]

    def rhs(_t: float, y: np.ndarray) -> np.ndarray:
        d = y[1] - y[0]
        e = np.exp(beta * (math.cos(d) - 1.0))
        return np.array([m[1] * e * math.sin(d) / (m[0] + m[1] * e), -m[0] * e * math.sin(d) / (m[1] + m[0] * e)])

    def close(_t: float, y: np.ndarray) -> float:
        return float(abs(math.remainder(y[1] - y[0], 2 * math.pi)) - 1e-3)

    close.terminal = True  # type: ignore[attr-defined]
    r = scipy.integrate.solve_ivp(rhs, (float(ts[i100]), 1e10), np.array(ang), method="LSODA", rtol=1e-12,
                                  atol=1e-14, events=close, dense_output=True)
    t_red = float(r.t_events[0][0]) if len(r.t_events[0]) else math.inf

    def f(y: np.ndarray) -> float:
        dy = rhs(0.0, y)
        return float(dy[1] - dy[0])

    err, bound, at = 0.0, math.inf, math.nan
    f_steps = np.array([abs(f(y)) for y in r.y.T])
    spread = max(float(np.max(np.abs(np.angle(np.exp(1j * (X[g] - a)))))) for g, a in zip(idx, ang, strict=True))
    n_flow = int(sol.stats.get("explicit_steps", 0)) + int(sol.stats.get("stiff_steps", 0))
    local = n_flow * rtol * (1 + float(np.max(np.abs(sol.X)))) + len(r.t) * 1e-12 * (1 + math.pi) + spread
    for j in range(i100 + 1, len(ts)):
        if ts[j] >= t_red:
            break
        y = r.sol(ts[j])
        d_ref = math.remainder(float(y[1] - y[0]), 2 * math.pi)
        d_flow = math.remainder(mean_angle(sol.X[j], idx[1]) - mean_angle(sol.X[j], idx[0]), 2 * math.pi)
        G = abs(f(y)) / float(np.min(f_steps[r.t <= ts[j]]))
        if abs(d_flow - d_ref) / (local * G) > (err / bound if math.isfinite(bound) else -1.0):
            err, bound, at = abs(d_flow - d_ref), local * G, float(ts[j])
    line = (f"cluster gap against the two-Dirac ODE from t = 100: |Δd| {err:.2e} at t = {at:.4g} (≤ {bound:.2e}: "
            f"{n_flow} flow-map steps at rtol {rtol:g}, carried by the variational factor)")
    return t_flow, t_red, sol.stats, (err, bound, line)


#: CPU budget of ``circle_flow_map`` (seconds; quick: half, and 4× that in wall time): it takes ≈ 3 s at any size,
#: and a flow map that stops switching to its stiff integrator is stopped by :func:`stiff_switch` in ≈ 20 s.
FLOW_BUDGET_S = 120.0

#: DOP853's stability interval on the negative real axis, [−6.39, 0] (|R(z)| ≤ 1 of scipy's tableau).
DOP853_STABLE = 6.39


def stiff_switch(beta: float, M: int = 64, rtol: float = 1e-9,
                 deadline: float = math.inf) -> tuple[float | None, float, str]:
    """(the flow map's switch depth, the depth by which it must have switched, a line), SA, the two-cluster start.

    The rule (:mod:`mfpde.tokens.circle.flow`): switch once h σ ≥ 2 for 8 accepted explicit steps in a row, σ the
    contraction rate −min_j u'(X_j). Recomputed here: σ at every output by the direct sum of u'
    (:func:`~mfpde.tokens.circle.particles.dense_velocity_derivative`) on the flow map's labels; once an output
    interval Δt holds 2 × 8 explicit steps at DOP853's stability limit (σΔt ≥ 2·8·6.39: the collapsed clusters
    move slowly, so the step is held by stability, h σ ≈ 6.39 ≥ 2), the switch must have fired. Outputs 20 per
    decade to t = 10⁴ (the merge comes much later).
    """
    from mfpde.tokens.circle.flow import SWITCH_STEPS

    ts = np.logspace(-2, 4, 121)
    sol = _flow(TWO_MODES, M, beta, "softmax").solve(ts, rtol, deadline=deadline)
    sigma = np.array([max(0.0, -float(dense_velocity_derivative(X, beta, True).min())) for X in sol.X])
    held = sigma[:-1] * np.diff(ts) >= 2 * SWITCH_STEPS * DOP853_STABLE
    t_must = float(ts[int(np.argmax(held))]) if held.any() else math.inf
    t_sw = sol.stats.get("switch_t")
    line = (f"stiff switch at t = {'none by 10⁴' if t_sw is None else f'{t_sw:.4g}'} (σ from u′ by direct sums: "
            f"{sigma[-1]:.3g} at t = 10⁴; must by t = {t_must:.4g}, where σΔt ≥ {2 * SWITCH_STEPS * DOP853_STABLE:g})")
    return t_sw, t_must, line


@register("circle_flow_map", "§9 (Lagrangian form)",
          "the direct pairwise sum; closed form γ_k (scipy.special.iv); the Eulerian DG2 solver; the two-Dirac ODE",
          kind="ratio to bound", budget_s=FLOW_BUDGET_S, distributed=False)
def check_circle_flow_map(quick: bool) -> Outcome:
    """Flow map: force to round-off, rates to 1e-6 of max γ_k, W1 to DG2 falling in M, stiff switch, merge time.

    The stiff switch must come when u′ says (:func:`stiff_switch`). Each part is a ratio to its bound (≤ 1); the
    row shows the first part that failed (else the largest ratio), the others are in the detail.
    """
    budget = _Budget(quick)
    parts: list[tuple[str, float, str]] = []  # (part, ratio to its bound, line)

    def outcome(series: list[Series] | None = None) -> Outcome:
        failed = [p for p in parts if not p[1] <= 1.0]
        name, ratio, _ = failed[0] if failed else max(parts, key=lambda p: p[1])
        return Outcome(ratio, None, f"≤ 1 ({name}" + (", failed" if failed else ", the largest") + "); force, rates, "
                       "W1 fall, stiff switch, merge, gap each ≤ 1", not failed, "; ".join(p[2] for p in parts),
                       series or [], 1.0)

    fr, fline = _force_error()
    parts.append(("force and Jacobian / round-off bound", fr, f"force vs direct sum (relative to Σ|a_k|): {fline}"))
    if not fr <= 1.0:  # the solves below would use a wrong force or Jacobian (a stiff solve may grind for minutes)
        return outcome()
    for att in ("unnormalised", "softmax"):
        ex = gamma_k(np.arange(1, 9), 5.0, att)
        err = float(np.max(np.abs(flow_rates(48, 5.0, att) - ex)) / ex.max())
        tag = "SA" if att == "softmax" else "USA"
        parts.append((f"{tag} rates / 1e-6", err / 1e-6, f"{tag} rates: error {err:.1e} (≤ 1e-6)"))  # NaN fails
    t_sw, t_must, sline = stiff_switch(5.0, deadline=budget.deadline)
    # no switch by the last output, 10⁴: the ratio that output's (a lower bound of the switch depth's), > 1
    parts.append(("stiff switch depth / the depth u′ sets", (t_sw if t_sw is not None else 1e4) / t_must, sline))
    ref = _dg_cdf(256)
    ref_err = (float(richardson_bound([0.0], [w1_circle(ref, _dg_cdf(128))], 3.0)[0])  # DG2 in h: order 3
               + w1_circle(ref, _dg_cdf(256, 2 * REF_CAP)) / (2**3 - 1))  # SSP-RK3 in depth: order 3
    Ms = [32, 40, 48]
    errs = []
    for M in Ms:
        errs.append(w1_circle(_flow(W1_MODES, M, 5.0, "unnormalised").solve(np.array([0.5]), 1e-12).cdf[-1], ref))
        if budget.spent():
            return Outcome(math.nan, None, "budget", False, f"budget of {budget.limit:.0f} s exceeded")
    b = -float(np.polyfit(Ms, np.log(errs), 1)[0])  # log W1 = a − bM
    fall = errs[-1] / errs[0]
    algebraic = (Ms[0] / Ms[-1]) ** 6  # faster than order 6 (local reconstructions here: order 2 linear, 4 cubic)
    series = [Series(Ms, errs, "labels M", None, b, "W1(flow map, DG2)")]
    parts.append((f"W1 fall over M = {Ms[0]}..{Ms[-1]} / order 6's {algebraic:.1e}", max(fall / algebraic,
                  ref_err / (0.1 * errs[-1])),
                  f"W1 to DG2 (n = 256, its error ≤ {ref_err:.0e}, ≤ 0.1 W1): {', '.join(f'{e:.2e}' for e in errs)} at "
                  f"M = {Ms}: exp(−{b:.3f} M), fall {fall:.1e} (< {algebraic:.1e}, order 6's)"))
    if not parts[-2][1] <= 1.0:  # no stiff switch: the merge's solve to 10⁹ would step explicitly for hours
        return outcome(series)
    t_flow, t_red, stats, (gap_err, gap_bound, gap_line) = two_cluster_merge(5.0, deadline=budget.deadline)
    late = t_red * 10 ** (1 / 20)  # the next output
    r = max(t_red / (t_flow * (1 + 1e-9)), t_flow / late) if math.isfinite(t_red) else math.inf
    parts.append(("merge depth against the two-Dirac ODE's next output", r,
                  f"two clusters SA β=5: merge at {t_flow:.4g} (flow map), {t_red:.4g} (two-Dirac ODE; the flow map's "
                  f"must be the first output at or after it); stiff switch at t = {stats.get('switch_t')}"))
    parts.append(("cluster gap against the two-Dirac ODE / its bound", gap_err / gap_bound, gap_line))
    return outcome(series)
