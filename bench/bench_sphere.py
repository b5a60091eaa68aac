"""Side by side on the sphere S² (theory §9): mfpde's DG and flow solvers against the strongest peer, in one run.

The peer (``bench/sphere_peer.py``, numpy and scipy only, no mfpde code) is what a careful user writes: quadrature
particles (N Gauss–Legendre nodes in cos ϑ × 2N longitudes, masses w_j μ_0(ξ_j)), the harmonic (Funk–Hecke) force
with scipy's ``sph_harm_y_all`` and scipy's DOP853. mfpde: ``tokens.solver = "flow"`` (the same quadrature
particles, the kernel :func:`~mfpde.tokens.sphere.kernel.sphere_velocity` picks, DOP853 with PI step control) and
``"dg"`` (:class:`~mfpde.tokens.sphere.dg.SphereDG`, DG1 and DG2 on the icosahedral mesh of the degree's geometry
order, SSP-RK3 with its CFL and growth-rate sub-steps, the job's defaults).

Case: SA, β = 5, μ_0 = 1/4π + Σ a Y_ℓm with the five small modes ``MODES`` (ℓ = 1..4; at most 3% of the uniform
density), to t = ``T`` = 6: the end of the linear phase (the power of ℓ = 3, the fastest degree, has grown from
2e-6 to 6.3e-3, √ratio 56 ≈ e^{6γ_3} = 56), the degree powers still smooth. Accuracy: the relative error of the
degree powers p_ℓ = Σ_m μ̂_ℓm², ℓ = 1..8,

    err = max_ℓ |p_ℓ − p_ℓ^ref| / max_{ℓ ≥ 1} p_ℓ^ref,

against the flow solver at N = 24, rtol 1e-13 (checked against the peer at N = 28, rtol 1e-13, an independent code,
and the flow solver at N = 16). CPU: ``time.process_time`` of the solve alone (no data set-up, no mesh, no
diagnostics), best of ``--repeat``, one BLAS thread. The table gives each code's cheapest setting that reaches
1e-3 and 1e-5 (a DG run of more than 10 s is timed once). Memory: tracemalloc's peak of one solve per particle
(flow, peer) or per cell (DG), numpy's arrays included (PETSc's and DOLFINx's C++ memory not).

    python bench/bench_sphere.py [--repeat 3] [--json out/bench_sphere.json] [--quick] [--skip-dg]

About 15 minutes of CPU, most of it DG (DG2 on 1280 cells alone ≈ 7 minutes). Prints markdown tables and the
load average; the DG rows are measured last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mpi4py import MPI

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sphere_peer as peer  # noqa: E402

from mfpde.environment import blas_threads  # noqa: E402
from mfpde.tokens.sphere.data import modes_density  # noqa: E402
from mfpde.tokens.sphere.diag import measure_power  # noqa: E402
from mfpde.tokens.sphere.flow import SphereFlow  # noqa: E402
from mfpde.tokens.sphere.kernel import sphere_velocity  # noqa: E402

BETA, ATT, T, LP = 5.0, "softmax", 6.0, 8
MODES = [[1, 1, 2e-3], [2, 0, 1.5e-3], [3, 2, 1e-3], [3, -1, 1e-3], [4, 3, 5e-4]]
TARGETS = (1e-3, 1e-5)


def cpu(f: Callable[[], Any], repeat: int) -> tuple[Any, float]:
    """(f()'s value, its CPU time: the least of ``repeat`` calls of the solve's own clock or of the process)."""
    best, out = math.inf, None
    for _ in range(repeat):
        out, t = f()
        best = min(best, t)
    return out, best


def flow_power(N: int, rtol: float) -> tuple[np.ndarray, float]:
    sol = SphereFlow(sphere_velocity(BETA, ATT), nodes=N, rtol=rtol, L=LP).solve(MODES, T, [T])
    return sol.power[-1], sol.solve_cpu_s


def peer_power(N: int, rtol: float) -> tuple[np.ndarray, float]:
    r = peer.peer_solve(MODES, BETA, ATT, N, T, np.array([T]), rtol=rtol, L_power=LP)
    return r["power"][-1], r["cpu_s"]


def dg_power(degree: int, refine: int) -> tuple[np.ndarray, float, int, int]:
    """(powers, solve CPU, cells, sub-steps) of SphereDG at the job's defaults (mesh of the degree's geometry order)."""
    from mfpde.tokens.sphere.dg import SphereDG, growth_step_cap
    from mfpde.tokens.sphere.mesh import geometry_order, icosphere

    mesh = icosphere(MPI.COMM_SELF, refine, geometry_order(degree))
    op = SphereDG(mesh, degree, sphere_velocity(BETA, ATT), max_dt=growth_step_cap(BETA, ATT))
    mu0 = op.project(lambda x: modes_density(MODES, x))
    rep = op.solve(mu0, T, 1)
    x, w = op.quadrature(rep.mu_T)
    cells = mesh.topology.index_map(2).size_local
    return measure_power(x, w, LP), rep.solve_cpu_s, cells, int(rep.substeps)


def err(p: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(p[1:] - ref[1:])) / np.max(ref[1:]))


def peak_bytes(f: Callable[[], Any]) -> int:
    tracemalloc.start()
    f()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return int(peak)


def cheapest(rows: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    ok = [r for r in rows if r["err"] <= target]
    return min(ok, key=lambda r: r["cpu"]) if ok else None


def fmt(r: dict[str, Any] | None) -> str:
    if r is None:
        return "not reached"
    what = f"DG{r['degree']}, {r['cells']} cells" if "cells" in r else f"N = {r['N']}, rtol {r['rtol']:g}"
    return f"{r['cpu']:.3f} s ({what}; err {r['err']:.1e})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-dg", action="store_true")
    ap.add_argument("--json", default="out/bench_sphere.json")
    args = ap.parse_args()
    load0 = os.getloadavg()
    print(f"load {load0[0]:.1f}", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent).stdout.strip()
    rows: dict[str, list[dict[str, Any]]] = {"flow": [], "peer": [], "dg": []}
    with blas_threads():
        ref = flow_power(24, 1e-13)[0]
        check = {"err(peer N=28, rtol 1e-13)": err(peer_power(28, 1e-13)[0], ref),
                 "err(flow N=16, rtol 1e-13)": err(flow_power(16, 1e-13)[0], ref)}
        print(f"reference powers ℓ=0..{LP}: {np.array2string(ref, precision=3)}; checks " +
              ", ".join(f"{k} = {v:.1e}" for k, v in check.items()), flush=True)
        Ns = [8, 12, 16, 20] if args.quick else [8, 10, 12, 14, 16, 18, 20]
        tols = [1e-4, 1e-7] if args.quick else [1e-4, 1e-6, 1e-8]
        for N in Ns:
            for rtol in tols:  # interleaved: the same load for both
                for code, f in (("flow", flow_power), ("peer", peer_power)):
                    p, t = cpu(lambda f=f, N=N, rtol=rtol: f(N, rtol), args.repeat)
                    rows[code].append({"N": N, "particles": 2 * N * N, "rtol": rtol, "err": err(p, ref), "cpu": t})
                    print(f"  {code} N={N} rtol={rtol:g}: err {rows[code][-1]['err']:.1e}, CPU {t:.4f} s", flush=True)
        mem = {"flow_bytes_per_particle": peak_bytes(lambda: flow_power(12, 1e-8)) / 288,
               "peer_bytes_per_particle": peak_bytes(lambda: peer_power(12, 1e-8)) / 288}
        dg_commit = commit
        if not args.skip_dg:
            grid = [(1, 2), (2, 1), (2, 2)] if args.quick else [(1, 2), (1, 3), (2, 1), (2, 2), (2, 3)]
            for degree, refine in grid:
                out = dg_power(degree, refine)
                best = out[1]
                for _ in range(args.repeat - 1 if best < 10 else 0):  # runs over 10 s: once
                    best = min(best, dg_power(degree, refine)[1])
                rows["dg"].append({"degree": degree, "refine": refine, "cells": out[2], "substeps": out[3],
                                   "err": err(out[0], ref), "cpu": best})
                print(f"  DG{degree} refine {refine} ({out[2]} cells, {out[3]} sub-steps): err "
                      f"{rows['dg'][-1]['err']:.1e}, CPU {best:.3f} s", flush=True)
            mem["dg2_bytes_per_cell"] = peak_bytes(lambda: dg_power(2, 1)) / 80  # 80 cells: an upper bound
    best = {code: {f"{tg:g}": cheapest(r, tg) for tg in TARGETS} for code, r in rows.items()}
    print(f"\nmeasured at commit {dg_commit}; load {load0[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    print("\n| relative error of the degree powers | mfpde flow | mfpde DG (DG1, DG2) | peer (quadrature particles) |"
          " fastest |\n|---|---|---|---|---|")
    for tg in TARGETS:
        b = {c: best[c][f"{tg:g}"] for c in rows}
        reached = {c: r["cpu"] for c, r in b.items() if r is not None}
        fastest = min(reached, key=reached.__getitem__) if reached else "—"
        print(f"| {tg:g} | {fmt(b['flow'])} | {fmt(b['dg'])} | {fmt(b['peer'])} | {fastest} |")
    print("\nmemory (tracemalloc peak of one solve): " + ", ".join(f"{k} {v:.0f} B" for k, v in mem.items()))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"case": {"beta": BETA, "attention": ATT, "T": T, "modes": MODES},
                                           "reference": {"powers": ref.tolist(), "checks": check}, "rows": rows,
                                           "best": best, "memory": mem, "commit": dg_commit,
                                           "load": [load0[0], os.getloadavg()[0]]}, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
