"""What locating the threshold K_c of noisy tokens costs: continuation against time stepping and particles.

Noisy tokens on the circle (USA, one head β = 2 < β*, noise τ = 1; theory §10): the uniform state loses stability
at K_c = τβ/I_1(β) = 1.25735801617397, continuously, so above it |μ̂₁|² of the stable state grows linearly in
K − K_c. Three ways to find K_c, each timed by ``time.process_time`` (CPU seconds of this process):

1. **Continuation** (``mfpde continuation``'s code): the uniform branch from K = 0.5 to 2.5 with the branch point
   located by the Illinois iteration on det ∂F/∂u (N collocation points): points, Newton iterations, CPU, and the
   error against the closed form; then the whole diagram (the bifurcating branch, the curvature c₂, SLEPc's
   eigenvalues at every point).
2. **Time-stepping scan** (what a user without continuation does): the DG0 Scharfetter–Gummel solver of
   ``mfpde transport`` (:class:`~mfpde.tokens.circle.noise.NoisyCircleTransport`, n cells) at each K of a grid
   1 % to 5 % above K_c, swept down from 1.32 to 1.27, each K started from the previous end state (the first from
   μ_0 = (1 + 0.5 cos θ)/2π) and run in chunks of depth 10 until |μ̂₁| changes by less than 10⁻⁷ over a chunk;
   K_c from a quadratic fit of |μ̂₁|² against K, extrapolated to |μ̂₁|² = 0. The grid is given for free (a user
   would first scan coarsely to find where the clusters appear): this favours the scan. The grid must be this
   close: |μ̂₁|² is far from linear 5 % above K_c, and the fit on the exact stationary values (Newton) is off by
   1.6·10⁻³ here (printed as the fit's own bias).
3. **Noisy particles** (N = 10³; 10⁴ and 10⁵ with ``--full``): Euler–Maruyama, dθ_i = K u(θ_i) dt + √(2τ) dW_i with
   u(θ) = (2/β) Σ_{k≤M} k I_k(β) Im(e^{−ikθ} μ̂_k), μ̂_k = N⁻¹ Σ_j e^{ikθ_j} (the Fourier series of
   e^{β cos ψ} sin ψ cut where its coefficient falls below 10⁻¹⁰ of the first: O(NM) per step, as a careful user
   writes it); the same downward sweep (the first K from a von Mises sample, |μ̂₁| ≈ 0.6), at each K burn-in
   ``--burn`` then |μ̂₁|² − 1/N (the finite-N bias of the uniform state) averaged over ``--measure``; the same
   fit; several seeds.

Prints a table and writes out/bench_continuation.json. Run from the repository root:

    python bench/bench_continuation.py [--quick | --full]
    python bench/bench_continuation.py --peer

``--peer`` (alone): ``mfpde continuation``'s two demos (demos/noisy_circle.toml, β = 4; demos/noisy_sphere.toml,
β = 3) against a hand-written spectral Newton with pseudo-arclength written without mfpde's code
(bench/peer_spectral_continuation.py: Fourier / Legendre amplitudes, det scan + Brent for the branch points, Brent
on t_K for the fold), in one process, CPU of the solve by ``time.process_time`` (best of 5; set
OMP_NUM_THREADS=1): mfpde's **events** (the same results as the peer's: the uniform branch with K_c and K_2
located, the mode-1 branch with its fold, by :func:`mfpde.continuation.continue_branch` on the discretisation of
``continuation.discretisation``) and its **whole diagram** (:func:`mfpde.bifurcation.noisy_branches`: also
the curvature probes, the other branches, the Maxwell points, E and the stability at every point); then the
whole command's process CPU (``mfpde continuation``, with and without the diagram's plot) against the peer's
process for one solve (its imports included); and the located values' differences.

Default about 2 CPU minutes (--quick: 30 s; --full adds n = 64, N = 10⁴ (about 3 CPU minutes) and N = 10⁵ (about
30, extrapolated: not run to the end in development)).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import scipy.special

ROOT = Path(__file__).resolve().parent.parent
BETA, TAU = 2.0, 1.0
KC = TAU * BETA / float(scipy.special.iv(1, BETA))
#: The K grid of the scan and the particles, swept downwards (1 % to 5 % above K_c).
GRID = (1.32, 1.31, 1.30, 1.29, 1.28, 1.27)


def continuation(points: int) -> dict:
    """Locate K_c on the uniform branch; then the whole diagram. Costs and the error of K_c."""
    from mfpde.bifurcation import noisy_branches
    from mfpde.continuation import Newton, StepControl, continue_branch
    from mfpde.tokens.circle.stationary import CircleStationary

    c0 = time.process_time()
    P = CircleStationary(points, BETA, TAU)
    W = P.inner_weights()
    t0 = np.zeros(P.m + 1)
    t0[-1] = 1.0
    ctl = StepControl(0.05, 1e-6, 0.25, 0.5, 2.5, 200)
    with Newton(P, P.m) as nw:
        br = continue_branch(P, nw, np.concatenate([P.uniform(), [0.5]]), t0, W, ctl, None)
        its = nw.its
    cpu = time.process_time() - c0
    bp = [e.K for e in br.events if e.kind == "branch_point"]
    c1 = time.process_time()
    part = noisy_branches(CircleStationary(points, BETA, TAU), 0.5, 2.5, ctl)
    cpu_all = time.process_time() - c1
    return {"points_N": points, "branch_points": len(br.K), "newton_iterations": its, "cpu_s": cpu,
            "K_c": bp[0] if bp else math.nan, "rel_error": abs(bp[0] - KC) / KC if bp else math.nan,
            "diagram_cpu_s": cpu_all, "diagram_points": sum(len(b["parameter"]) for b in part["branches"]),
            "diagram_newton_iterations": part["newton_iterations"]}


def fit_threshold(Ks: list[float], r2: list[float]) -> float:
    """K where the quadratic least-squares fit of |μ̂₁|² against K crosses 0 (the root nearest the data's left)."""
    c = np.polyfit(np.asarray(Ks) - Ks[0], r2, 2)
    roots = np.roots(c)
    real = roots[np.isreal(roots)].real + Ks[0]
    return float(real[np.argmin(np.abs(real - Ks[0]))]) if len(real) else math.nan


def exact_fit_bias(points: int = 63) -> dict:
    """The stationary |μ̂₁|² on the grid by Newton (the continuation's solver, K fixed) and the fit's own error."""
    from mfpde.continuation import Newton
    from mfpde.tokens.circle.stationary import CircleStationary

    P = CircleStationary(points, BETA, TAU)
    a = np.zeros(P.m + 1)
    a[-1] = 1.0
    u = P.uniform() * (1 + 0.5 * np.cos(P.theta[: P.m]))
    r2 = []
    with Newton(P, P.m) as nw:
        for K in GRID:
            x = nw.solve(np.concatenate([u, [K]]), a, K)
            if x is None:
                raise RuntimeError(f"Newton failed at K = {K}")
            u = x[:-1]
            r2.append(P.order_parameter(u) ** 2)
    k = fit_threshold(list(GRID), r2)
    return {"r2": r2, "K_c": k, "rel_error": abs(k - KC) / KC}


def scan(cells: int, tol: float = 1e-7, chunk: float = 10.0, max_depth: float = 2000.0) -> dict:
    """The time-stepping scan on ``cells`` DG0 cells (module docstring)."""
    from mfpde.heads import HeadMeasure
    from mfpde.tokens.circle.dg import CircleMesh
    from mfpde.tokens.circle.noise import NoisyCircleTransport

    c0 = time.process_time()
    mesh = CircleMesh(cells, 0)
    phase = np.exp(1j * mesh.nodes[:, 0])
    r2, depths = [], []
    mu = mesh.interpolate(lambda th: (1 + 0.5 * np.cos(th)) / (2 * math.pi))
    for K in GRID:
        op = NoisyCircleTransport(mesh, TAU, "unnormalised")
        heads = HeadMeasure(np.array([BETA]), np.array([K]))
        r_old, depth = math.inf, 0.0
        while depth < max_depth:
            mu = op.solve(mu, heads, chunk, 1).mu_T
            depth += chunk
            r = float(abs(np.sum(mesh.weights(mu)[:, 0] * phase)))
            if abs(r - r_old) < tol:
                break
            r_old = r
        r2.append(r * r)
        depths.append(depth)
    k = fit_threshold(list(GRID), r2)
    return {"cells": cells, "K_c": k, "rel_error": abs(k - KC) / KC, "cpu_s": time.process_time() - c0,
            "depths": depths, "r2": r2}


def _force_coefficients(beta: float, tol: float = 1e-10) -> np.ndarray:
    """(2/β) k I_k(β), k = 1..M, M the first k where it falls below tol times the first."""
    k = np.arange(1, 64)
    c = 2.0 / beta * k * scipy.special.iv(k, beta)
    return c[: int(np.argmax(c < tol * c[0])) or len(c)]


def particles(N: int, seed: int, burn: float, measure: float, dt: float) -> dict:
    """The particle estimate of K_c (module docstring): |μ̂₁|² − 1/N averaged after burn-in, fitted against K."""
    c0 = time.process_time()
    coef = _force_coefficients(BETA)
    M = len(coef)
    rng = np.random.default_rng(seed)
    r2 = []
    theta = rng.vonmises(0.0, 1.5, N)
    for K in GRID:
        acc, count = 0.0, 0
        steps_burn, steps = int(round(burn / dt)), int(round((burn + measure) / dt))
        for s in range(steps):
            z = np.exp(1j * theta)
            zk = np.empty((M, N), complex)
            zk[0] = z
            for k in range(1, M):
                zk[k] = zk[k - 1] * z
            mhat = zk.mean(axis=1)  # μ̂_k, k = 1..M
            if s >= steps_burn:
                acc += abs(mhat[0]) ** 2
                count += 1
            u = (coef[:, None] * (np.conj(zk) * mhat[:, None]).imag).sum(axis=0)
            theta = theta + K * u * dt + math.sqrt(2 * TAU * dt) * rng.standard_normal(N)
        r2.append(acc / count - 1.0 / N)
    k = fit_threshold(list(GRID), r2)
    return {"N": N, "seed": seed, "K_c": k, "rel_error": abs(k - KC) / KC, "cpu_s": time.process_time() - c0,
            "r2": r2, "modes": M, "dt": dt}


def _demo(name: str) -> dict:
    import tomllib

    return tomllib.loads((ROOT / "demos" / f"noisy_{name}.toml").read_text())


def _best(fn, repeats: int = 5) -> tuple[float, object]:
    """(the least process CPU of ``repeats`` calls of fn, its last result)."""
    best, out = math.inf, None
    for _ in range(repeats):
        c0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - c0)
    return best, out


def mfpde_events(name: str, discretisation: str = "spectral") -> dict:
    """The peer's results by mfpde's code: K_c and K_2 on the uniform branch, the fold of the mode-1 branch."""
    from mfpde.bifurcation import threshold
    from mfpde.continuation import StepControl, branch_direction, continue_branch
    from mfpde.continuation_newton import newton_solver

    cfg = _demo(name)
    t, c = cfg["tokens"], cfg["continuation"]
    if discretisation == "spectral":
        mod = __import__(f"mfpde.tokens.{name}.spectral", fromlist=["x"])
        P = getattr(mod, f"{name.capitalize()}Spectral")(c["points"], t["beta"], t["noise"])
    else:
        mod = __import__(f"mfpde.tokens.{name}.stationary", fromlist=["x"])
        P = getattr(mod, f"{name.capitalize()}Stationary")(c["points"], t["beta"], t["noise"])
    ctl = StepControl(c["step"], 1e-6, 0.25, c["start"], c["stop"], c["max_points"])
    W = P.inner_weights()
    with newton_solver(P) as nw:
        t0 = np.zeros(P.m + 1)
        t0[-1] = 1.0
        marks = np.array([threshold(P, k) for k in range(1, P.m)])
        uni = continue_branch(P, nw, np.concatenate([P.uniform(), [c["start"]]]), t0, W, ctl, regular_start=True,
                              marks=marks[np.abs(marks) <= 1e6 * c["stop"]])
        bps = [e for e in uni.events if e.kind == "branch_point"]
        x = np.concatenate([bps[0].u, [bps[0].K]])
        d = branch_direction(P, x, bps[0].tangent, W)
        if P.amplitude(1) @ d[: P.m] < 0:
            d = -d
        point = getattr(P, "resolved_point", None)
        br = continue_branch(P, nw, x, d, W, ctl, None if point else P.resolved, resolved_point=point)
        folds = [e.K for e in br.events if e.kind == "fold"]
    return {"K_c": bps[0].K, "K_2": bps[1].K if len(bps) > 1 else math.nan, "K_f": folds[0] if folds else math.nan,
            "points": len(uni.K) + len(br.K), "unknowns": P.m}


def mfpde_diagram(name: str, discretisation: str = "spectral") -> Callable[[], dict]:
    """The whole diagram of ``mfpde continuation`` on the demo as a function to time, its problem built in it.

    In process: no start-up, no config, no report, no plot.
    """
    from mfpde.bifurcation import noisy_branches
    from mfpde.config import load
    from mfpde.continuation import StepControl
    from mfpde.domains import stationary_problem
    from mfpde.jobs.continuation import check_continuation

    cfg = load(ROOT / "demos" / f"noisy_{name}.toml", [f"continuation.discretisation={discretisation!r}"],
               command="continuation")
    beta, tau = check_continuation(cfg)
    c = cfg.continuation
    ctl = StepControl(c.step, c.step_min, c.step_max, min(c.start, c.stop), max(c.start, c.stop), c.max_points)
    return lambda: noisy_branches(stationary_problem(cfg, c.points, beta, tau), c.start, c.stop, ctl)


def _child_cpu(cmd: list[str], repeats: int = 3) -> float:
    """The least CPU (user + system) of ``repeats`` runs of cmd as a child process."""
    import os
    import resource
    import subprocess

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    best = math.inf
    for _ in range(repeats):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(cmd, check=True, capture_output=True, env=env, cwd=ROOT)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        best = min(best, r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    return best


def peer_comparison(repeats: int = 5, commands: bool = True) -> dict:
    """The ``--peer`` section (module docstring): CPU of the solves and the commands, and the located values."""
    import importlib.util
    import sys
    import tempfile

    spec = importlib.util.spec_from_file_location("peer_spectral_continuation",
                                                  ROOT / "bench" / "peer_spectral_continuation.py")
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    out: dict = {}
    for name in ("circle", "sphere"):
        cfg = _demo(name)
        fn = getattr(peer, name)
        t_peer, r_peer = _best(lambda fn=fn, cfg=cfg: fn(cfg), repeats)
        t_ev, ev = _best(lambda name=name: mfpde_events(name), repeats)
        t_dia, dia = _best(mfpde_diagram(name), repeats)
        t_col, _ = _best(mfpde_diagram(name, "collocation"), 1)
        row = {"peer_cpu_s": t_peer, "events_cpu_s": t_ev, "diagram_cpu_s": t_dia, "collocation_diagram_cpu_s": t_col,
               "events_ratio": t_ev / t_peer, "diagram_ratio": t_dia / t_peer, "mfpde": ev,
               "peer": {k: r_peer[k] for k in ("K_c", "K_2", "K_f")},
               "closed_form": {"K_c": r_peer["K_c_closed"], "K_2": r_peer["K_2_closed"]},
               "fold_difference": abs(ev["K_f"] - r_peer["K_f"]) / r_peer["K_f"],
               "K_c_error": abs(ev["K_c"] / r_peer["K_c_closed"] - 1),
               "diagram_events": [(e["kind"], e.get("parameter")) for e in dia["bifurcations"]]}
        if commands:
            demo = str(ROOT / "demos" / f"noisy_{name}.toml")
            with tempfile.TemporaryDirectory() as tmp:
                mf = [sys.executable, "-m", "mfpde", "continuation", demo, "--quiet", "--out"]
                row["command_cpu_s"] = _child_cpu(mf + [f"{tmp}/a"])
                row["command_noplot_cpu_s"] = _child_cpu(mf + [f"{tmp}/b", "--set", "output.plots=false"])
                row["command_collocation_cpu_s"] = _child_cpu(mf + [f"{tmp}/c", "--set",
                                                                   "continuation.discretisation='collocation'"], 1)
            code = (f"import sys, tomllib; sys.path.insert(0, {str(ROOT / 'bench')!r}); "
                    f"import peer_spectral_continuation as p; p.{name}(tomllib.load(open({demo!r}, 'rb')))")
            row["peer_process_cpu_s"] = _child_cpu([sys.executable, "-c", code])
            row["command_ratio"] = row["command_noplot_cpu_s"] / row["peer_process_cpu_s"]
        out[name] = row
    return out


def print_peer(res: dict) -> None:
    """The ``--peer`` table."""
    for name, r in res.items():
        print(f"{name}: peer {r['peer_cpu_s']:.4f} s; mfpde events {r['events_cpu_s']:.4f} s "
              f"({r['events_ratio']:.2f}×, {r['mfpde']['unknowns']} unknowns, {r['mfpde']['points']} points), "
              f"whole diagram {r['diagram_cpu_s']:.4f} s ({r['diagram_ratio']:.2f}×; the collocation's "
              f"{r['collocation_diagram_cpu_s']:.3f} s)")
        print(f"  K_c {r['mfpde']['K_c']:.16g} (rel. error {r['K_c_error']:.1e}), K_2 {r['mfpde']['K_2']:.16g} "
              f"(peer {r['peer']['K_2']:.16g}), fold {r['mfpde']['K_f']:.16g} (peer {r['peer']['K_f']:.16g}, "
              f"rel. difference {r['fold_difference']:.1e})")
        if "command_cpu_s" in r:
            print(f"  process CPU: mfpde continuation {r['command_cpu_s']:.2f} s (without the plot "
                  f"{r['command_noplot_cpu_s']:.2f} s, {r['command_ratio']:.2f}× the peer's process "
                  f"{r['peer_process_cpu_s']:.2f} s; collocation {r['command_collocation_cpu_s']:.2f} s)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="N = 10³ only, the scan on 16 cells, one seed")
    g.add_argument("--full", action="store_true", help="also N = 10⁴, 10⁵ and the scan on 64 cells")
    ap.add_argument("--burn", type=float, default=60.0, help="particles' burn-in depth per K")
    ap.add_argument("--measure", type=float, default=60.0, help="particles' averaging depth per K")
    ap.add_argument("--dt", type=float, default=0.02, help="Euler–Maruyama step")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per N (default: 3 at N = 10³, 1 above; quick 1)")
    ap.add_argument("--peer", action="store_true", help="only: the demos against the hand-written spectral Newton "
                    "(bench/peer_spectral_continuation.py), solve and process CPU")
    args = ap.parse_args()
    if args.peer:
        peer = peer_comparison()
        (ROOT / "out").mkdir(exist_ok=True)
        (ROOT / "out" / "bench_continuation_peer.json").write_text(json.dumps(peer, indent=1))
        print_peer(peer)
        return 0
    res: dict = {"beta": BETA, "tau": TAU, "K_c_closed_form": KC, "grid": list(GRID)}
    res["continuation"] = [continuation(n) for n in (41, 63)]
    res["scan"] = [scan(n) for n in ((16,) if args.quick else (16, 32, 64) if args.full else (16, 32))]
    res["exact_fit"] = exact_fit_bias()
    if args.quick:
        runs = [(1000, 1)]
    else:
        runs = [(1000, 3)] + ([(10_000, 1), (100_000, 1)] if args.full else [])
    res["particles"] = [particles(N, s, args.burn, args.measure, args.dt) for N, n in runs
                        for s in range(args.seeds or n)]
    out = ROOT / "out"
    out.mkdir(exist_ok=True)
    (out / "bench_continuation.json").write_text(json.dumps(res, indent=1))
    print(f"K_c = τβ/I_1(β) = {KC:.15g} (β = {BETA:g}, τ = {TAU:g})")
    print(f"{'method':<34} {'K_c':>18} {'rel. error':>10} {'CPU s':>8}  cost")
    for c in res["continuation"]:
        print(f"{'continuation, N = ' + str(c['points_N']):<34} {c['K_c']:>18.15g} {c['rel_error']:>10.1e} "
              f"{c['cpu_s']:>8.2f}  {c['branch_points']} points, {c['newton_iterations']} Newton its (whole diagram "
              f"{c['diagram_points']} points, {c['diagram_newton_iterations']} its, {c['diagram_cpu_s']:.2f} s)")
    e = res["exact_fit"]
    print(f"{'the fit on the exact |μ̂₁|² (bias)':<34} {e['K_c']:>18.10g} {e['rel_error']:>10.1e}")
    for s in res["scan"]:
        print(f"{'time-stepping scan, DG0 n = ' + str(s['cells']):<34} {s['K_c']:>18.10g} {s['rel_error']:>10.1e} "
              f"{s['cpu_s']:>8.2f}  depths {', '.join(f'{d:g}' for d in s['depths'])}")
    for p in res["particles"]:
        print(f"{'particles, N = ' + str(p['N']) + ', seed ' + str(p['seed']):<34} {p['K_c']:>18.10g} "
              f"{p['rel_error']:>10.1e} {p['cpu_s']:>8.2f}  M = {p['modes']} modes, dt = {p['dt']:g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
