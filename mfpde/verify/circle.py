"""Checks of the circle solver (theory §9), each against a reference the solver does not produce.

* ``circle_growth_rates``: the growth of modes k = 1..12 from the uniform state, fitted in the linear regime,
  against the closed form γ_k = k² I_k(β)/β (USA), k² I_k(β)/(β I₀(β)) (SA) (scipy.special.iv), SA and USA at
  β = 5 and 12. The fitted rate of |μ̂_k| per depth step is the exact growth of SSP-RK3 applied to the
  semi-discrete rate λ_h: e^{r Δt} = R(λ_h Δt), R(z) = 1 + z + z²/2 + z³/6 (all sub-steps are equal), so λ_h is
  recovered by inverting R and the error λ_h − γ_k is the spatial error alone. It is measured relative to the
  fastest rate, max_k |λ_h − γ_k| / max_k γ_k. Expected order in h: the linearised DG operator is the Galerkin
  (L²-projection) approximation of μ' ↦ −(1/2π) ∂_θ u[μ'], a convolution with the even kernel −G'/2π: a
  self-adjoint compact operator, whose Galerkin eigenvalues converge like the square of the projection
  error, O(h^{2(p+1)}) (Babuška–Osborn), and the Gauss quadrature of the kernel is also O(h^{2p+2}). So DG1:
  order 4; asserted |q − 4| < 0.25 (the tolerance of the house's order checks); the full run also asserts the
  DG2 error at n = 128 below 1e-6. Nonlinear terms: modes start at ±ε (ε = 1e-9) and the odd part
  (μ̂(ε) − μ̂(−ε))/2 is fitted, so quadratic interactions cancel and cubic ones are ≲ ε² e^{3γT} ≈ 1e-13.
* ``circle_mode_selection``: from 24 modes of amplitude 1e-4 with seeded random phases (USA), the number of
  clusters (maxima above twice the uniform density) once the fastest mode has grown by 3·10⁴ and by 10⁶
  equals k_max(β) = argmax_k γ_k, at β = 4, 5, 7, 12 (:data:`MODE_BETAS`).
* ``circle_particles``: W1(μ_T^N, μ_T) between N particles (:mod:`mfpde.tokens.circle.particles`, the Bessel
  series of the kernel, RK4) and the PDE decays like N^{-1/2}: the slope of the mean over seeds is −1/2 within
  3 standard errors (:func:`~mfpde.fitting.slope_se`) plus the slope tolerance of the bias (grid of the CDFs and
  PDE error by Richardson, :func:`~mfpde.fitting.slope_tolerance`).
* ``circle_mass_positivity``: clustering runs (DG0 and DG2 USA at β = 5, DG1 SA at β = 8) keep ∫μ to round-off
  (≤ 8 n(p+1) ε per sub-step, ε = 2⁻⁵²), μ_h ≥ −8(p+1)² ε max μ_h on a dense grid of every cell (end-points
  included) that the solver does not use, and take the sub-steps the CFL rule of theory §9 fixes, recomputed
  by direct sums and the closed-form growth rate (:func:`cfl_substeps`).

* ``circle_edge_cases``: :mod:`mfpde.verify.circle_edges`.

Each check is bounded: fixed sizes, and a CPU budget after which it fails with "budget exceeded".
"""

from __future__ import annotations

import math
import time

import numpy as np
import scipy.special

from mfpde.fitting import fit_order, fit_rate, richardson_bound, slope_se, slope_tolerance
from mfpde.heads import HeadMeasure
from mfpde.tokens.circle.dg import CircleMesh, CircleTransport
from mfpde.tokens.circle.diag import cdf_density, cdf_points, clusters, initial_density, w1_circle
from mfpde.tokens.circle.particles import sample_modes, transport_particles
from mfpde.verify.registry import Outcome, Series, register

__all__ = ["cfl_substeps", "dense_minimum", "fitted_rates", "gamma_k"]

#: CPU-time budget of one check (seconds, quick and full), the registry's time budget (quick: half of it), also the
#: deadline inside each solve: generous (quick runs take ~5–20 s alone); CPU time, so a loaded machine does not
#: trip it.
BUDGET_S = {True: 360.0, False: 720.0}
EPS = 2.0**-52


class _Budget:
    """The CPU budget of one check: ``spent()`` between runs, ``deadline`` inside a solve (it then raises)."""

    def __init__(self, quick: bool) -> None:
        self.t0, self.limit = time.process_time(), BUDGET_S[quick]
        self.deadline = self.t0 + self.limit

    def spent(self) -> bool:
        return time.process_time() > self.deadline


def gamma_k(k: np.ndarray, beta: float, attention: str) -> np.ndarray:
    """The closed-form linear growth rates of theory §9 (scipy.special.iv)."""
    g = k**2 * scipy.special.iv(k, beta) / beta
    return np.asarray(g / scipy.special.iv(0, beta) if attention == "softmax" else g, dtype=float)


def fitted_rates(n: int, p: int, beta: float, attention: str, K: int = 12, eps: float = 1e-9, steps: int = 40,
                 sub: int = 4, seed: int = 0, deadline: float = math.inf) -> np.ndarray:
    """The semi-discrete growth rates λ_h of modes 1..K (n cells, DG_p), from two runs at ±ε (see the module)."""
    k = np.arange(1, K + 1)
    T = 4.0 / float(gamma_k(k, beta, attention).max())
    dt = T / (steps * sub)
    mesh = CircleMesh(n, p)
    op = CircleTransport(mesh, attention, max_dt=dt * (1 + 1e-9))
    heads = HeadMeasure(np.array([beta]), np.array([1.0]))
    phases = np.random.default_rng(seed).uniform(0, 2 * np.pi, K)
    hat = {}
    basis = np.exp(-1j * np.outer(k, mesh.nodes.ravel()))
    for s in (1.0, -1.0):
        rows = [[float(kk), s * eps, float(ph)] for kk, ph in zip(k, phases, strict=True)]
        mu = initial_density(mesh, "circle_modes", rows)
        hist: list[np.ndarray] = []
        op.solve(mu, heads, T, steps, lambda i, t, u, hist=hist: hist.append(basis @ mesh.weights(u).ravel()),
                 deadline)
        hat[s] = np.array(hist)
    odd = np.abs(hat[1.0] - hat[-1.0]) / 2
    t = np.linspace(0.0, T, steps + 1)
    lam = []
    for j in range(K):
        r = -fit_rate(t, odd[:, j])
        roots = np.roots([1 / 6, 1 / 2, 1, 1 - math.exp(r * dt)])
        z = roots[np.argmin(np.abs(roots.imag) + np.abs(roots.real - r * dt))].real  # R(z) = e^{r dt}
        lam.append(z / dt)
    return np.array(lam)


@register("circle_growth_rates", "§9 (linear growth)",
          "closed form γ_k = k² I_k(β)/β (SA: /I₀(β)), scipy.special.iv",
          budget_s=BUDGET_S[False], distributed=False)
def check_circle_growth_rates(quick: bool) -> Outcome:
    """max_k |λ_h − γ_k| / max γ_k at the order 4 of DG1 in h (|q − 4| < 0.25); full: DG2 at n = 128 ≤ 1e-6."""
    budget = _Budget(quick)
    cells = [32, 64] if quick else [32, 64, 128]
    k = np.arange(1, 13)
    ok, lines, series, qs = True, [], [], []
    for beta in (5.0, 12.0):
        for att in ("unnormalised", "softmax"):
            ex = gamma_k(k, beta, att)
            errs = [float(np.max(np.abs(fitted_rates(n, 1, beta, att, deadline=budget.deadline) - ex)) / ex.max())
                    for n in cells]
            if budget.spent():
                return Outcome(math.nan, None, "budget", False, f"budget of {budget.limit:.0f} s exceeded")
            hs = [2 * math.pi / n for n in cells]
            q = fit_order(hs, errs)
            qs.append(q)
            ok &= abs(q - 4.0) < 0.25
            tag = f"β={beta:g} {'SA' if att == 'softmax' else 'USA'}"
            lines.append(f"{tag}: DG1 err {', '.join(f'{e:.2e}' for e in errs)} at n = {cells}, order {q:.2f}")
            series.append(Series(hs, errs, "cell size h (rad)", 4.0, q, f"DG1 {tag}"))
            if not quick:
                e2 = float(np.max(np.abs(fitted_rates(128, 2, beta, att, deadline=budget.deadline) - ex)) / ex.max())
                ok &= e2 <= 1e-6
                lines.append(f"{tag}: DG2 n=128 err {e2:.2e} (≤ 1e-6)")
    worst = max(qs, key=lambda q: abs(q - 4.0))
    return Outcome(worst, 4.0, "< 0.25 (DG1: Galerkin eigenvalues, O(h^{2p+2}))" + ("" if quick else
                   "; DG2 n=128 ≤ 1e-6"), ok, "; ".join(lines), series, 0.25)


def _kmax(beta: float) -> int:
    k = np.arange(1, 200)
    return int(k[np.argmax(gamma_k(k, beta, "unnormalised"))])


#: β of the mode-selection check: the runner-up rate is at most 0.94 γ_max (β = 4: 0.86, 5: 0.88, 7: 0.94,
#: 12: 0.94), so the top mode outgrows it by (3·10⁴)^0.06 ≥ 1.9 before the count. Not at β = 16 (0.983: the
#: order of modes 5 and 6 after growth 10⁶ is decided by the initial phases, and 5 clusters form).
MODE_BETAS = (4.0, 5.0, 7.0, 12.0)


@register("circle_mode_selection", "§9 (k_max clusters)",
          "argmax_k γ_k of the closed form (scipy.special.iv)", kind="clusters",
          budget_s=BUDGET_S[False], distributed=False)
def check_circle_mode_selection(quick: bool) -> Outcome:
    """From 24 random-phase modes of amplitude 1e-4 (USA), k_max(β) clusters at growth 3·10⁴ and 10⁶ of the top mode.

    The row: the cluster count farthest from its k_max (the largest β when every count is right).
    """
    budget = _Budget(quick)
    n, p = (192, 1) if quick else (256, 2)
    phases = np.random.default_rng(7).uniform(0, 2 * np.pi, 24)
    modes = [[k + 1, 1e-4, float(ph)] for k, ph in enumerate(phases)]
    ok, lines, row = True, [], (-1, math.nan, math.nan)
    for beta in MODE_BETAS:
        km = _kmax(beta)
        gmax = float(gamma_k(np.array([km]), beta, "unnormalised")[0])
        mesh = CircleMesh(n, p)
        op = CircleTransport(mesh, "unnormalised")
        heads = HeadMeasure(np.array([beta]), np.array([1.0]))
        mu = initial_density(mesh, "circle_modes", modes)
        counts = []
        for growth in (3e4, 1e6):
            T = math.log(growth) / gmax
            counts.append(clusters(mesh, op.solve(mu, heads, T, 10, deadline=budget.deadline).mu_T)[0])
        if budget.spent():
            return Outcome(math.nan, None, "budget", False, f"budget of {budget.limit:.0f} s exceeded")
        ok &= counts == [km, km]
        far = max(counts, key=lambda c: abs(c - km))
        if abs(far - km) >= row[0]:
            row = (abs(far - km), float(far), float(km))
        lines.append(f"β={beta:g}: k_max {km}, clusters {counts[0]}, {counts[1]}")
    return Outcome(row[1], row[2], "= 0 (k_max(β) clusters at both depths, β = 4, 5, 7, 12)", ok, "; ".join(lines),
                   tolerance=0.0)


#: The particle check's problem: USA, β = 3, two modes, T = 0.5.
PART_BETA, PART_T, PART_MODES = 3.0, 0.5, [[1, 0.3, 0.5], [2, 0.2, 1.0]]
#: RK4 steps of the particles: relative error ~ (γ_max Δt)⁴ = (3.0 · 0.025)⁴ ≈ 3e-5, far below the W1 sampled.
PART_STEPS = 20


def _pde_cdf(n: int, M: int, deadline: float) -> np.ndarray:
    mesh = CircleMesh(n, 2)
    rep = CircleTransport(mesh, "unnormalised").solve(initial_density(mesh, "circle_modes", PART_MODES),
                                                      HeadMeasure(np.array([PART_BETA]), np.array([1.0])), PART_T, 10,
                                                      deadline=deadline)
    return cdf_density(mesh, rep.mu_T, M)


@register("circle_particles", "§9; §5.3 (finite N)",
          "independent particle code (Bessel-series force, RK4)",
          budget_s=BUDGET_S[False], distributed=False)
def check_circle_particles(quick: bool) -> Outcome:
    """E W1(μ^N_T, μ_T) ∝ N^{-1/2}: |q + 1/2| ≤ 3 se(q) + the bias's slope tolerance."""
    budget = _Budget(quick)
    Ns = [500, 2000, 8000] if quick else [500, 2000, 8000, 32000]
    R = 8 if quick else 16
    M = 2**15
    n = 128 if quick else 256
    F, F_coarse = _pde_cdf(n, M, budget.deadline), _pde_cdf(n // 2, M, budget.deadline)
    pde_err = float(richardson_bound([0.0], [w1_circle(F, F_coarse)], 2.0)[0])  # W1(F_256, F_128)/(2² − 1)
    means, ses = [], []
    for N in Ns:
        w = []
        for r in range(R):
            th0 = sample_modes(N, PART_MODES, np.random.default_rng(1000 * N + r))
            thT = transport_particles(th0, PART_BETA, False, PART_T, PART_STEPS)
            w.append(w1_circle(cdf_points(thT, M), F))
        if budget.spent():
            return Outcome(math.nan, None, "budget", False, f"budget of {budget.limit:.0f} s exceeded")
        means.append(float(np.mean(w)))
        ses.append(float(np.std(w, ddof=1) / math.sqrt(R)))
    q = fit_order(Ns, means)
    se = slope_se(Ns, means, ses)
    bias = np.full(len(Ns), math.pi / M + pde_err)
    tol = 3 * se + slope_tolerance(Ns, means, bias)
    ok = abs(q + 0.5) <= tol
    return Outcome(q, -0.5, f"≤ 3 se + bias = {tol:.2g} (statistical)", ok,
                   f"E W1 {', '.join(f'{m:.3e}' for m in means)} (se {', '.join(f'{s:.1e}' for s in ses)}) at "
                   f"N = {Ns}; slope {q:.3f} ± {se:.3f}; PDE error ≤ {pde_err:.1e} (DG2, Richardson {n // 2}/{n})",
                   [Series(Ns, means, "particles N", -0.5, q, "E W1(μ^N_T, μ_T)")], tol)


def _edge_velocity(mu: np.ndarray, beta: float, attention: str) -> np.ndarray:
    """The velocity at the left cell edges θ_j = jh by a direct O(n²) sum over the Gauss quadrature of μ_h, shape (n,).

    Independent of the solver's FFTs: the Gauss rule from numpy's ``leggauss``, the kernel summed pairwise.
    """
    n, q = mu.shape
    x, wg = np.polynomial.legendre.leggauss(q)
    h = 2 * math.pi / n
    nodes = ((np.arange(n)[:, None] + 0.5 * (x + 1.0)[None, :]) * h).ravel()
    mass = (mu * (0.5 * wg * h)[None, :]).ravel()
    d = nodes[None, :] - (np.arange(n) * h)[:, None]
    e = np.exp(beta * (np.cos(d) - (1.0 if attention == "softmax" else 0.0)))
    return (e * np.sin(d)) @ mass / ((e @ mass) if attention == "softmax" else 1.0)


def cfl_substeps(mu: np.ndarray, beta: float, attention: str, dt: float, cfl: float, growth_cap: float,
                 depth_balance: float) -> tuple[int, bool]:
    """The sub-steps ⌈dt/Δt_max⌉ the CFL rule of theory §9 fixes at the state μ_h (n, p+1), and an edge flag.

    The flag: the ratio is within 1e-8 of an integer (then one less is also the rule, in floats).

    Δt_max = min(positivity bound, min(growth_cap, depth_balance (k_max h)^{2(p+1)/3})/Λ): DG0
    Δt max_j(u⁺_{j+1/2} + u⁻_{j−1/2})/h ≤ cfl; DG_p, p ≥ 1,
    Δt max|u_edge|/h ≤ cfl ŵ₁ with ŵ₁ = 1/(N(N−1)) the first Gauss–Lobatto weight on [0, 1] of N = max(2,
    ⌈(p+3)/2⌉) points; Λ = max_k γ_k(β) of the closed form, k_max its argmax. Nothing of the solver is called.
    """
    n, q = mu.shape
    h = 2 * math.pi / n
    ue = _edge_velocity(mu, beta, attention)
    if q == 1:
        dt_pos = cfl * h / float(np.max(np.maximum(np.roll(ue, -1), 0.0) + np.maximum(-ue, 0.0)))
    else:
        N = max(2, math.ceil((q + 2) / 2))
        dt_pos = cfl * h / (N * (N - 1)) / float(np.max(np.abs(ue)))
    g = gamma_k(np.arange(1, 400), beta, attention)
    lam, kmax = float(g.max()), int(np.argmax(g)) + 1
    cap = min(growth_cap, depth_balance * (kmax * h) ** (2 * q / 3))  # (2p+2)/3, p + 1 = q
    r = dt / min(dt_pos, cap / lam)
    return max(1, math.ceil(r)), abs(r - round(r)) < 1e-8


def dense_minimum(mu: np.ndarray, points: int = 64) -> float:
    """The minimum over the cells of μ_h at ``points`` equispaced points of each closed cell (end-points included).

    The polynomial of each cell is rebuilt from its nodal values at numpy's Gauss points (a Vandermonde solve),
    none of the solver's evaluation code.
    """
    q = mu.shape[1]
    s = 0.5 * (np.polynomial.legendre.leggauss(q)[0] + 1.0)
    coef = np.linalg.solve(np.vander(s, q), mu.T)  # (q, n), highest power first
    return float(np.min(np.vander(np.linspace(0.0, 1.0, points), q) @ coef))


#: The sub-step runs of ``circle_mass_positivity``: (degree, attention, β, T, depth steps); quick and full sizes
#: of n. DG0 and DG2 USA (the growth cap binds in the linear phase, the CFL in the clustered one), DG1 SA.
SUBSTEP_RUNS = [(0, "unnormalised", 5.0, 1.0, 20), (2, "unnormalised", 5.0, 1.0, 20), (1, "softmax", 8.0, 12.0, 20)]


@register("circle_mass_positivity", "§9 (conservation, positivity, CFL)",
          "round-off bounds; μ_h on an independent dense grid; the CFL rule of §9 recomputed by direct sums",
          kind="ratio to bound", budget_s=BUDGET_S[False], distributed=False)
def check_circle_mass_positivity(quick: bool) -> Outcome:
    """Mass ≤ 8 n(p+1) ε per sub-step, μ_h ≥ −tol on a dense grid, sub-steps = the CFL rule × 2^j (DG0, 1, 2).

    Through cluster formation from noise. The minimum is taken on 64 equispaced points of every closed cell
    (end-points included), points the solver does not choose; tolerance 8 (p+1)² ε max μ_h (the round-off of
    the limiter's scaling and of evaluating a degree-p polynomial, Lebesgue constant ≤ (p+1)). Sub-steps: at
    the start of every depth step the rule fixes n_s = ⌈Δt/Δt_max⌉ (:func:`cfl_substeps`, recomputed here by
    direct sums and the closed-form Λ); a depth step redone after a CFL break doubles it, so the count taken
    must be n_s·2^j, j ≥ 0.
    """
    from mfpde.tokens.circle.dg import DEPTH_BALANCE, GROWTH_CAP

    budget = _Budget(quick)
    ok, lines, worst = True, [], 0.0
    for p, att, beta, T, steps in SUBSTEP_RUNS:
        n = (96 if quick else 192) if p else (128 if quick else 256)
        mesh = CircleMesh(n, p)
        op = CircleTransport(mesh, att)
        mu = initial_density(mesh, "circle_noise", amplitude=0.05, seed=3)
        states: list[np.ndarray] = []
        rep = op.solve(mu, HeadMeasure(np.array([beta]), np.array([1.0])), T, steps,
                       lambda i, t, u, states=states: states.append(u.copy()), budget.deadline)
        if budget.spent():
            return Outcome(math.nan, None, "budget", False, f"budget of {budget.limit:.0f} s exceeded")
        peak = max(float(u.max()) for u in states)
        dmin = min(dense_minimum(u) for u in states)
        mass_tol, min_tol = 8 * n * (p + 1) * EPS * rep.substeps, -8 * (p + 1) ** 2 * EPS * peak
        bad = []
        for k, (u, taken) in enumerate(zip(states[:-1], rep.substeps_per_step, strict=True)):
            need, edge = cfl_substeps(u, beta, att, T / steps, op.cfl, GROWTH_CAP, DEPTH_BALANCE)
            if not any(taken % m == 0 and (taken // m) & (taken // m - 1) == 0
                       for m in ((need, need - 1) if edge and need > 1 else (need,))):
                bad.append(f"step {k + 1}: {taken} for rule {need}")
        ncl = clusters(mesh, rep.mu_T)[0]
        good = rep.mass_error <= mass_tol and dmin >= min_tol and not bad and ncl >= 1
        ok &= good
        worst = max(worst, rep.mass_error / mass_tol, dmin / min_tol if dmin < 0 else 0.0)
        tag = f"DG{p} {'SA' if att == 'softmax' else 'USA'} β={beta:g} n={n}"
        lines.append(f"{tag}: mass error {rep.mass_error:.1e} (≤ {mass_tol:.0e}), dense min {dmin:.1e} "
                     f"(≥ {min_tol:.0e}, peak {peak:.3g}), sub-steps {rep.substeps_per_step[0]}..."
                     f"{rep.substeps_per_step[-1]} ({rep.substeps}) " + (f"off the CFL rule at {'; '.join(bad[:3])}"
                                                                          if bad else "= the CFL rule")
                     + f", {rep.limited_cells} cells limited, {ncl} clusters")
    return Outcome(worst, None, "≤ 1 (mass, min over their round-off bounds); sub-steps = CFL rule × 2^j", ok,
                   "; ".join(lines), tolerance=1.0)
