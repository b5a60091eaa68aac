"""The phase diagram of noisy tokens on S^{d−1}: β*⁽ᵈ⁾, K_c, and above β* the fold K_f and the Maxwell point K_M.

For each d the tricritical β*⁽ᵈ⁾ is the root of I_{d/2+1}(β)/I_{d/2}(β) = 1/d; for β above it ``mfpde
continuation``'s machinery (:func:`mfpde.bifurcation.noisy_branches` on the hypersphere's zonal stationary
problem, τ = 1) continues the uniform branch and the one bifurcating at K_c = τβ/λ_1(β), locating its fold K_f and
the Maxwell point K_M where its stable part's free energy equals the uniform state's (the first-order transition);
in the cells of :data:`FROM_CLUSTER` (β = 10 from d = 16, β = 6 from d = 64) the stable clustered branch is
followed down in K from a clustered state to its fold instead (:mod:`mfpde.tokens.hypersphere.cluster`).
Each (d, β) is solved on n and 3n/2 collocation points: the table gives the change, the grid's error. Also the
noise-free growth rates: the fastest degree in every cell of d × β. Writes ``out/hypersphere_phase.json`` and
``out/hypersphere_phase.png`` (``--figure``; ``--out`` another directory), or with ``--write-docs`` (the full
grid only) also the docs' copies ``docs/_static/hypersphere_phase.json`` and ``.png``, and prints the tables.
Run from the repository root:

    python bench/hypersphere_phase.py [--quick] [--figure] [--write-docs]

About a minute of CPU on one core (``--quick``: d = 4, 16, two β each, seconds).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # dense n ≤ 300: BLAS threads only contend

from mpi4py import MPI  # noqa: F401  (before petsc4py)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mfpde.bifurcation import noisy_branches  # noqa: E402
from mfpde.continuation import StepControl  # noqa: E402
from mfpde.tokens.hypersphere.cluster import cluster_transition  # noqa: E402
from mfpde.tokens.hypersphere.stationary import HypersphereStationary  # noqa: E402
from mfpde.tokens.hypersphere.theory import beta_star, critical_coupling, fastest_degree, growth_rate  # noqa: E402

DIMS = (2, 3, 4, 5, 6, 8, 16, 32, 64, 128)
BETAS = (2.5, 4.0, 6.0, 10.0)
#: the collocation points n (and 3n/2) per d: the Gauss rule of σ̄ below d = 16, the angle rule from there
#: (:data:`mfpde.tokens.hypersphere.stationary.ANGLE_FROM_DIM`), whose clustered states need n ≈ 10√d
POINTS = {2: 48, 3: 48, 4: 48, 5: 48, 6: 48, 8: 64, 16: 64, 32: 96, 64: 96, 128: 128}
#: a row's K_f and K_M on n and 3n/2 points agree to this (relative) to count as converged
CONVERGED = 1e-6
#: the cells computed from the clustered state (the stable clustered branch followed down in K to its fold:
#: :func:`mfpde.tokens.hypersphere.cluster.cluster_transition`), and their points n. At large β·d the branch from
#: K_c is long: at d = 32, 64 (β = 10) and 128 (β = 6, 10) it turns twice on its unstable part (an S, on every
#: grid) before the clustered state's fold; the continuation, its steps of the order of K_c, left it for the uniform
#: branch at β = 10 for d ≤ 64, and at d = 128 its Newton failed on the clustered part (at d = 64, β = 6 it gives
#: the same K_f and K_M to 1e-11). At β = 10 the Maxwell point moved by 1e-6 from 96 to 144 points (d = 64) and
#: from 128 to 192 (d = 128): n is 144 and 192 there
FROM_CLUSTER = {(16, 10.0): 64, (32, 10.0): 96, (64, 6.0): 96, (64, 10.0): 144, (128, 6.0): 128, (128, 10.0): 192}
RATE_DIMS, RATE_BETAS = (3, 4, 8, 16, 64), (1.0, 4.0, 9.0, 16.0, 36.0)


def transition(d: int, beta: float, n: int) -> tuple[float, float, float, int]:
    """(K_f, K_M, CPU s, folds) of degree 1's subcritical branch on n points (τ = 1); NaN where not found.

    K_f is the branch's first fold; ``folds`` counts them (a branch with more than one is not the single
    fold–Maxwell pair of the subcritical pitchfork: at large β and d it turns again towards other states).
    """
    c0 = time.process_time()
    P = HypersphereStationary(n, beta, 1.0, d)
    kc = P.threshold(1)
    lo, hi = 1e-3 * kc, 1.02 * kc
    res = noisy_branches(P, lo, hi, StepControl(0.01 * kc, 1e-10, 10 * kc + 10, lo, hi, 3000), eig_solver="scipy")
    ev = [e for e in res["bifurcations"] if e["mode"] == 1]
    folds = [e["parameter"] for e in ev if e["kind"] == "fold"]
    km = next((e["parameter"] for e in ev if e["kind"] == "maxwell" and e.get("found")), math.nan)
    return float(folds[0]) if folds else math.nan, float(km), time.process_time() - c0, len(folds)


def cluster_transition_row(d: int, beta: float, n: int) -> tuple[float, float, float, bool]:
    """(K_f, K_M, CPU s, stable and resolved) of the stable clustered branch on n points (τ = 1); NaN where not found.

    K_f is the least K of the clustered state (the branch's fold), K_M where its free energy equals the uniform
    state's; the flag: every examined point from K_M to the fold is stable and resolved by the collocation.
    """
    c0 = time.process_time()
    r = cluster_transition(HypersphereStationary(n, beta, 1.0, d))
    return r.K_f, r.K_M, time.process_time() - c0, bool(r.stable and r.resolved)


def phase_table(dims: tuple[int, ...], betas: tuple[float, ...]) -> list[dict]:
    """One row per (d, β > β*⁽ᵈ⁾): K_c, K_f, K_M on n and 3n/2 points, their changes, the CPU."""
    rows = []
    for d in dims:
        bs = beta_star(d)
        for beta in (b for b in betas if b > bs):
            route = "cluster" if (d, beta) in FROM_CLUSTER else "continuation"
            if route == "cluster":
                n = FROM_CLUSTER[d, beta]
                kf1, km1, s1, ok1 = cluster_transition_row(d, beta, n)
                kf2, km2, s2, ok2 = cluster_transition_row(d, beta, 3 * n // 2)
                folds, single = 1, ok1 and ok2
            else:
                n = POINTS[d]
                kf1, km1, s1, _ = transition(d, beta, n)
                kf2, km2, s2, folds = transition(d, beta, 3 * n // 2)
                single = folds == 1
            kc = critical_coupling(beta, 1.0, d)
            changes = [abs(kf2 - kf1) / kf2, abs(km2 - km1) / km2]
            change = max(changes) if all(math.isfinite(c) for c in changes) else math.inf  # NaN: not found on one
            regular = single and kf2 < km2 < kc and change <= CONVERGED
            rows.append({"d": d, "beta": beta, "beta_star": bs, "K_c": kc, "K_f": kf2, "K_M": km2,
                         "points": 3 * n // 2, "K_f_change": abs(kf2 - kf1), "K_M_change": abs(km2 - km1),
                         "folds": folds, "route": route, "regular": bool(regular), "cpu_s": s1})
            r = rows[-1]
            how = f"{folds} fold(s)" if route == "continuation" else "from the clustered state"
            print(f"d = {d:4d}  β = {beta:5.2f}  K_c = {r['K_c']:.10g}  K_f = {kf2:.10g}  K_M = {km2:.10g}  "
                  f"(n = {n} → {3 * n // 2}: {r['K_f_change']:.1e}, {r['K_M_change']:.1e}; {how}; {s1:.2f} s on n)"
                  f"{'' if regular else '  — not a single converged fold–Maxwell pair'}", flush=True)
    return rows


def rate_table() -> list[dict]:
    """The fastest degree ℓ ≥ 1 of γ_ℓ and its lead over the runner-up, per (d, β)."""
    out = []
    for d in RATE_DIMS:
        for beta in RATE_BETAS:
            g = growth_rate(list(range(1, 401)), beta, d, "unnormalised")
            top = fastest_degree(beta, d)
            second = max(float(x) for i, x in enumerate(g, start=1) if i != top)
            out.append({"d": d, "beta": beta, "fastest": top, "lead": float(g[top - 1]) / second - 1.0})
    return out


def figure(rows: list[dict], path: Path) -> None:
    """K_f/K_c and K_M/K_c against β for each d (one colour per d; solid K_M, dashed K_f)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.4, 4.6))
    ax = fig.add_subplot()
    for i, d in enumerate(sorted({r["d"] for r in rows})):
        rr = [r for r in rows if r["d"] == d and r["regular"]]
        b = [r["beta"] for r in rr]
        ax.plot(b, [r["K_M"] / r["K_c"] for r in rr], "-o", color=f"C{i % 10}", ms=4, label=f"d = {d}")
        ax.plot(b, [r["K_f"] / r["K_c"] for r in rr], "--", color=f"C{i % 10}", lw=1)
    ax.plot([], [], "k-o", ms=4, label="Maxwell point K_M / K_c")
    ax.plot([], [], "k--", label="fold K_f / K_c")
    ax.set_xlabel("inverse temperature β")
    ax.set_yscale("log")  # K_f/K_c reaches 2e-3 at d = 128, β = 10
    ax.set_ylabel("coupling / K_c")
    ax.set_title("first-order transition of noisy tokens on S^(d−1) (τ = 1)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.subplots_adjust(right=0.74)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def markdown(rows: list[dict]) -> str:
    """The docs' table of the regular rows (a single converged fold–Maxwell pair), and the others in a line."""
    lines = ["| d | β | K_c | K_f | K_M | K_M/K_c | n → 3n/2 | CPU s |", "|---|---|---|---|---|---|---|---|"]
    for r in (r for r in rows if r["regular"]):
        change = max(r["K_f_change"] / r["K_f"], r["K_M_change"] / r["K_M"])
        lines.append(f"| {r['d']} | {r['beta']:g} | {r['K_c']:.10g} | {r['K_f']:.10g} | {r['K_M']:.10g} | "
                     f"{r['K_M'] / r['K_c']:.4f} | {change:.0e} | {r['cpu_s']:.2f} |")
    other = [f"d = {r['d']}, β = {r['beta']:g}" for r in rows if not r["regular"]]
    cluster = [f"d = {r['d']}, β = {r['beta']:g} (n = {2 * r['points'] // 3})" for r in rows
               if r["regular"] and r.get("route") == "cluster"]
    return ("\n".join(lines) + ("\n\nFrom the clustered state: " + "; ".join(cluster) if cluster else "")
            + ("\n\nNot a single converged fold–Maxwell pair: " + "; ".join(other) if other else ""))


def main(argv: list[str] | None = None) -> None:
    """Compute and print the tables; write the JSON (and the figure)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="d = 4, 16 and two β (seconds)")
    ap.add_argument("--figure", action="store_true", help="write out/hypersphere_phase.png")
    ap.add_argument("--write-docs", action="store_true",
                    help="also write docs/_static/hypersphere_phase.json and .png (not with --quick)")
    ap.add_argument("--out", default=str(ROOT / "out"), help="directory of hypersphere_phase.json (and .png)")
    ap.add_argument("--markdown", action="store_true", help="print the docs' table from the stored JSON and stop")
    args = ap.parse_args(argv)
    if args.write_docs and args.quick:
        ap.error("--write-docs writes the docs' copies: the full grid only (no --quick)")
    if args.markdown:
        print(markdown(json.loads((ROOT / "docs" / "_static" / "hypersphere_phase.json").read_text())["transitions"]))
        return
    dims, betas = ((4, 16), (2.5, 4.0)) if args.quick else (DIMS, BETAS)
    print("β*⁽ᵈ⁾: " + ", ".join(f"d = {d}: {beta_star(d):.7f}" for d in DIMS))
    rows = phase_table(dims, betas)
    rates = rate_table()
    for r in rates:
        print(f"d = {r['d']:3d}  β = {r['beta']:5.1f}  fastest degree {r['fastest']:3d}  lead {100 * r['lead']:.2f} %")
    out = {"beta_star": {str(d): beta_star(d) for d in DIMS}, "transitions": rows, "fastest_degree": rates}
    dest = Path(args.out)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "hypersphere_phase.json").write_text(json.dumps(out, indent=1))
    if args.figure or args.write_docs:
        figure(rows, dest / "hypersphere_phase.png")
    if args.write_docs:
        figure(rows, ROOT / "docs" / "_static" / "hypersphere_phase.png")
        (ROOT / "docs" / "_static" / "hypersphere_phase.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
