"""Side by side on the circle (theory §9): mfpde's two circle solvers against the strongest peer, in one run.

The peer (``bench/circle_peer.py``, numpy and scipy only, written without mfpde's code) is what a careful user of
the field writes: deterministic particles at the quantiles of μ_0, the O(NK) Fourier-series force, scipy's DOP853,
and a spectral reconstruction of the measure (trigonometric interpolation of the quantile map, inverted); for long
horizons LSODA. mfpde: ``tokens.solver = "flow"`` (the flow map on quantile labels with the map's derivative
carried along and a trigonometric Hermite reconstruction; DOP853, then LSODA with the exact Jacobian once clusters
collapse) and ``"dg"`` (DG2, its default step control).

Cases (μ_0 = (1/2π)(1 + Σ a cos(k(θ − φ)))):

* A: USA, β = 5, t = 0.5, the five modes ``MODES`` (clusters forming; max μ ≈ 4.8 × uniform).
* B: SA, β = 9, t = 13.5, the same plus [6, 5e-5, 0.7].
* C: two clusters, SA, β = 5 and 8, μ_0 ∝ 1 + 0.3 cos 2θ + 0.05 cos(θ − 0.4), to t = 10⁹ at 20 output depths per
  decade: the merge times (the first output with fewer clusters; clusters counted by
  :func:`mfpde.tokens.circle.diag.clusters_cdf` on both codes' CDFs).

For A and B each code runs over a grid of its own settings (labels or particles M, tolerance; DG: cells), W1 on the
circle of μ_T against a reference (the flow map at M = 256 (A) or 1024 (B), rtol 1e-13, checked against the peer at
twice as many particles, an independent code, and against itself at half as many labels), and CPU seconds of the
solve alone (``time.process_time``, best of ``--repeat``, one BLAS thread, the codes interleaved); the table
gives each code's cheapest setting that reaches W1 ≤ 1e-3, 1e-5, 1e-7.
Error-vs-cost laws W1 ≈ C·t^q are fitted (:func:`mfpde.fitting.fit_power`) through each code's Pareto front.

    python bench/bench_circle.py [--repeat 3] [--json out/bench_circle.json] [--quick] [--cases A B C]

About 3 minutes of CPU (``--quick``: fewer settings). Prints markdown tables and the load average.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import circle_peer as peer  # noqa: E402

from mfpde.environment import blas_threads  # noqa: E402
from mfpde.fitting import fit_power  # noqa: E402
from mfpde.tokens.attention import HeadMeasure  # noqa: E402
from mfpde.tokens.circle.dg import CircleMesh, CircleTransport  # noqa: E402
from mfpde.tokens.circle.diag import cdf_at, clusters_cdf, initial_density, w1_circle  # noqa: E402
from mfpde.tokens.circle.flow import FlowMap, modes_labels  # noqa: E402
from mfpde.tokens.resolution import merge_times  # noqa: E402

MODES = [[1, 2e-4, 0.0], [2, 1e-4, 1.3], [3, 1e-4, 1.0], [4, 1e-4, 2.5], [5, 5e-5, 2.0]]
CASES = {"A": ("unnormalised", 5.0, 0.5, MODES), "B": ("softmax", 9.0, 13.5, MODES + [[6, 5e-5, 0.7]])}
TWO = [[2, 0.3, 0.0], [1, 0.05, 0.4]]
TARGETS = (1e-3, 1e-5, 1e-7)
#: The labels (particles) each code is run with, per case; B's map is steep (min μ/max μ ≈ 1/55) and needs more.
LABELS = {"A": [16, 24, 32, 40, 48, 64, 80, 96, 128, 160], "B": [64, 96, 128, 192, 256, 320, 384, 512, 640]}
#: The reference's labels (its error: against the peer at twice as many and the flow map at half as many).
REF_LABELS = {"A": 256, "B": 1024}
ANGLES = 2 * math.pi * np.arange(1024) / 1024


def cpu(f: Callable[[], Any], repeat: int = 1) -> tuple[Any, float]:
    """(f(), the least CPU time of ``repeat`` calls)."""
    best, out = math.inf, None
    for _ in range(repeat):
        t0 = time.process_time()
        out = f()
        best = min(best, time.process_time() - t0)
    return out, best


def mfpde_flow(att: str, beta: float, T: float, modes: list[list[float]], M: int, rtol: float) -> np.ndarray:
    """The CDF of μ_T by mfpde's flow solver (labels, integration, reconstruction: all inside)."""
    return FlowMap(modes_labels(modes, M), np.array([beta]), np.array([1.0]), att).solve(np.array([T]), rtol).cdf[-1]


def mfpde_dg(att: str, beta: float, T: float, modes: list[list[float]], n: int) -> np.ndarray:
    """The CDF of μ_T by mfpde's DG2 solver on n cells at its default step control."""
    mesh = CircleMesh(n, 2)
    rep = CircleTransport(mesh, att).solve(initial_density(mesh, "circle_modes", modes),
                                           HeadMeasure(np.array([beta]), np.array([1.0])), T, 1)
    return cdf_at(mesh, rep.mu_T, ANGLES)


def peer_final(att: str, beta: float, T: float, modes: list[list[float]], N: int, rtol: float,
               method: str = "DOP853") -> np.ndarray:
    """The peer's CDF of μ_T (its best reconstruction, "auto": spectral where the map is resolved, else PCHIP)."""
    return np.asarray(peer.peer_cdf(modes, beta, att, np.array([T]), N, rtol, method=method, reconstruct="auto")[-1])


#: The integrators the peer is run with (its author found odeint fastest at tight tolerances, RK45 on case B).
PEER_METHODS = ("DOP853", "odeint", "RK45")


def front(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Pareto front (cost increasing, error decreasing) of measured rows."""
    out: list[dict[str, Any]] = []
    for r in sorted(rows, key=lambda r: r["cpu"]):
        if not out or r["w1"] < out[-1]["w1"]:
            out.append(r)
    return out


def cheapest(rows: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    ok = [r for r in rows if r["w1"] <= target]
    return min(ok, key=lambda r: r["cpu"]) if ok else None


def run_case(name: str, repeat: int, quick: bool) -> dict[str, Any]:
    att, beta, T, modes = CASES[name]
    Mr = REF_LABELS[name]
    ref = mfpde_flow(att, beta, T, modes, Mr, 1e-13)
    check = {f"w1(flow M={Mr}, peer N={2 * Mr})": w1_circle(ref, peer_final(att, beta, T, modes, 2 * Mr, 1e-13)),
             f"w1(flow M={Mr}, flow M={Mr // 2})": w1_circle(ref, mfpde_flow(att, beta, T, modes, Mr // 2, 1e-13))}
    print(f"case {name}: {att}, β = {beta}, t = {T}; reference checks " +
          ", ".join(f"{k} = {v:.1e}" for k, v in check.items()), flush=True)
    Ms = LABELS[name] if not quick else LABELS[name][1::2]
    tols = [1e-5, 1e-6, 1e-7, 1e-8, 1e-9, 1e-10, 1e-11, 1e-12] if not quick else [1e-6, 1e-8, 1e-10]
    rows: dict[str, list[dict[str, Any]]] = {"flow": [], "peer": [], "dg": []}
    for M in Ms:
        for rtol in tols:  # interleaved: the same load for both
            runs: list[tuple[str, str, Callable[[], np.ndarray]]] = [
                ("flow", "auto", lambda M=M, rtol=rtol: mfpde_flow(att, beta, T, modes, M, rtol))]
            runs += [("peer", m, lambda M=M, rtol=rtol, m=m: peer_final(att, beta, T, modes, M, rtol, m))
                     for m in PEER_METHODS]
            for code, method, f in runs:
                try:
                    F, t = cpu(f, repeat)
                    rows[code].append({"M": M, "rtol": rtol, "method": method, "w1": w1_circle(F, ref), "cpu": t})
                except Exception as e:  # a setting that fails counts as not reached
                    print(f"  {code} {method} M={M} rtol={rtol:g}: failed ({e})", flush=True)
    for n in ([32, 64, 128, 256] if not quick else [64, 128]):
        F, t = cpu(lambda n=n: mfpde_dg(att, beta, T, modes, n), 1 if n >= 128 else repeat)
        rows["dg"].append({"n": n, "w1": w1_circle(F, ref), "cpu": t})
    best = {code: {f"{tg:g}": cheapest(r, tg) for tg in TARGETS} for code, r in rows.items()}
    laws = {}
    for code, r in rows.items():
        fr = [x for x in front(r) if x["w1"] > 1e-11]
        if len(fr) >= 3:
            law = fit_power([x["cpu"] for x in fr], [x["w1"] for x in fr])
            laws[code] = {"q": law.q, "se_q": law.se_q}
    return {"case": name, "attention": att, "beta": beta, "T": T, "modes": modes, "reference": check, "rows": rows,
            "best": best, "laws": laws}


def run_merges(repeat: int, Ms: list[int], tols: list[float]) -> list[dict[str, Any]]:
    """Case C: each code at each (M, rtol), interleaved; the merge times against the peer's at N = 256, rtol 1e-8."""
    ts = np.logspace(-2, 9, 221)
    out = []
    for beta in (5.0, 8.0):
        ref_peer, _ = peer.peer_merge_times(TWO, beta, "softmax", ts, 256, 1e-8)
        want = merge_times(ts, [clusters_cdf(F)[0] for F in ref_peer])
        for M in Ms:
            for rtol in tols:
                for code in ("flow", "peer"):
                    if code == "flow":
                        sol, t = cpu(lambda M=M, b=beta, r=rtol: FlowMap(modes_labels(TWO, M), np.array([b]),
                                                                         np.array([1.0]), "softmax").solve(ts, r),
                                     repeat)
                        cdfs, extra = sol.cdf, {"switch_t": sol.stats["switch_t"]}
                    else:
                        (cdfs, _), t = cpu(lambda M=M, b=beta, r=rtol: peer.peer_merge_times(TWO, b, "softmax", ts,
                                                                                             M, r), repeat)
                        extra = {}
                    got = merge_times(ts, [clusters_cdf(F)[0] for F in cdfs])
                    out.append({"beta": beta, "code": code, "M": M, "rtol": rtol, "cpu": t, "merge_times": got,
                                "same": got == want, "want": want, **extra})
                    print(f"  merges β={beta:g} {code} M={M} rtol={rtol:g}: {[f'{x:.3g}' for x in got]} (peer N=256: "
                          f"{[f'{x:.3g}' for x in want]}), CPU {t:.3f} s", flush=True)
    return out


def ratio(f: dict[str, Any] | None, p: dict[str, Any] | None) -> str:
    return f"{f['cpu'] / p['cpu']:.2f}×" if f and p else "—"


def fmt(r: dict[str, Any] | None, key: str) -> str:
    if r is None:
        return "not reached"
    return (f"{r['cpu']:.4f} s ({key} = {r.get(key, r.get('n'))}, rtol {r['rtol']:g}"
            + (f", {r['method']})" if r.get("method", "auto") != "auto" else ")")) if "rtol" in r else \
        f"{r['cpu']:.3f} s (n = {r['n']})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default="out/bench_circle.json")
    ap.add_argument("--cases", nargs="+", default=["A", "B", "C"], choices=["A", "B", "C"])
    args = ap.parse_args()
    print(f"load {os.getloadavg()[0]:.1f}", flush=True)
    with blas_threads():
        cases = [run_case(c, args.repeat, args.quick) for c in CASES if c in args.cases]
        merges = run_merges(args.repeat, [32, 64] if args.quick else [16, 32, 64, 128],
                            [1e-6] if args.quick else [1e-4, 1e-6, 1e-8]) if "C" in args.cases else []
    print("\n| case | W1 target | mfpde flow | mfpde DG2 | peer (quantile particles) | flow / peer |")
    print("|---|---|---|---|---|---|")
    for c in cases:
        for tg in TARGETS:
            b = c["best"]
            f, p, d = b["flow"][f"{tg:g}"], b["peer"][f"{tg:g}"], b["dg"][f"{tg:g}"]
            print(f"| {c['case']} | {tg:g} | {fmt(f, 'M')} | {fmt(d, 'n')} | {fmt(p, 'M')} | {ratio(f, p)} |")
    for c in cases:
        print(f"case {c['case']} error-vs-CPU laws (Pareto fronts, W1 ∝ CPU^q): " +
              ", ".join(f"{k}: q = {v['q']:.2f} ± {v['se_q']:.2f}" for k, v in c["laws"].items()))
    if merges:  # case C
        print("\n| β | merge times (peer N = 256) | mfpde flow: cheapest with the same | peer: cheapest with the "
              "same | flow / peer |\n|---|---|---|---|---|")
    for beta in (5.0, 8.0) if merges else ():
        rows = [r for r in merges if r["beta"] == beta]
        best = {c: min((r for r in rows if r["code"] == c and r["same"]), key=lambda r: r["cpu"], default=None)
                for c in ("flow", "peer")}
        cell = {c: f"{b['cpu']:.3f} s (M = {b['M']}, rtol {b['rtol']:g})" if b else "not reached"
                for c, b in best.items()}
        f, p = best["flow"], best["peer"]
        print(f"| {beta:g} | {', '.join(f'{x:.3g}' for x in rows[0]['want'])} | {cell['flow']} | {cell['peer']} | "
              f"{ratio(f, p)} |")
    print(f"load {os.getloadavg()[0]:.1f}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"cases": cases, "merges": merges, "load": os.getloadavg()}, indent=1,
                                          default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
