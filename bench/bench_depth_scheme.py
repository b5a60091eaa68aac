"""Benchmark: the cost of a training step against the token cells, for each SSP depth integrator (``depth.scheme``).

An explicit positive step of the DG0 transport is bounded by the CFL condition, Δt ≤ C · cfl · |cell| / outflow,
with C the SSP coefficient of the scheme; a sub-step costs one velocity evaluation per stage. So a depth step on n
token cells takes ∝ n^{1/2} sub-steps (in d = 2) of s stages and O(n) work each: the cost per step grows like
n^{1.5} once the CFL bound, not the depth step, sets the sub-steps, whatever the scheme; a scheme with more positive
step per stage (C/s: 1/3 for SSP-RK3, 1/2 for SSP(4,3), 3/5 for SSP(10,4)) lowers the constant, not the exponent.

For each scheme and each n × n token mesh, in a fresh process on one core: build ``demos/digits_deep.toml`` (8
training images), one gradient to warm up, then the CPU time of the best of ``--repeat`` gradients (forward +
adjoint: one training step's token work), the CFL sub-steps of its forward solves and the risk. The exponent of CPU
against token cells is fitted by :func:`mfpde.fitting.fit_power` over the meshes given. Writes
``out/bench/depth_scheme.json`` and a markdown table.

Run: ``python bench/bench_depth_scheme.py [--cells 16 32 64 128] [--schemes ssp_rk3 ssp_rk4_10] [--repeat 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONFIG = ROOT / "demos" / "digits_deep.toml"


def measure(n: int, scheme: str, repeat: int) -> dict:
    """One scheme on n × n token cells with whichever ``mfpde`` is importable (run in a fresh process)."""
    import time

    from mpi4py import MPI

    from threadpoolctl import threadpool_limits

    from mfpde import config as C
    from mfpde.training.problem import CoupledProblem

    cfg = C.load(CONFIG, [f"tokens.cells=[{n}, {n}]", "data.samples=8", "data.test_samples=8",
                          "output.plots=false", "output.fields=false", f"depth.scheme='{scheme}'"])
    cp = CoupledProblem.from_config(cfg, MPI.COMM_SELF)
    heads = cp.heads()
    with threadpool_limits(limits=1):
        g = cp.gradient(heads)
        best = float("inf")
        for _ in range(repeat):
            t = time.process_time()
            g = cp.gradient(heads)
            best = min(best, time.process_time() - t)
    return {"n": n, "scheme": scheme, "token_cells": n * n, "gradient_cpu_s": best, "risk": g.risk,
            "substeps": cp.objective.tape_stats.get("substeps", 0), "tape": cp.objective.tape_stats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, nargs="*", default=[16, 32, 64, 128])
    parser.add_argument("--schemes", nargs="*", default=["ssp_rk3", "ssp_rk3_4", "ssp_rk4_10"])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    import numpy as np

    from mfpde.fitting import fit_power

    rows = []
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    for n in args.cells:
        for scheme in args.schemes:  # interleaved: a load that comes and goes biases no scheme
            code = (f"import sys, json; sys.path.insert(0, {str(HERE)!r}); import bench_depth_scheme as b; "
                    f"print(json.dumps(b.measure({n}, {scheme!r}, {args.repeat})))")
            out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True)
            if out.returncode:
                raise RuntimeError(f"{scheme} n={n}:\n{out.stderr[-3000:]}")
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "tape"}), flush=True)
    ref = {r["n"]: r for r in rows if r["scheme"] == args.schemes[0]}
    print(f"\n| n × n cells | {' | '.join(f'{s}: CPU s (sub-steps)' for s in args.schemes)} | "
          f"{' | '.join(f'risk − {args.schemes[0]}: {s}' for s in args.schemes[1:])} |")
    print("|---|" + "---|" * (2 * len(args.schemes) - 1))
    for n in args.cells:
        got = {r["scheme"]: r for r in rows if r["n"] == n}
        print(f"| {n}² | " + " | ".join(f"{got[s]['gradient_cpu_s']:.2f} ({got[s]['substeps']})" for s in args.schemes)
              + " | " + " | ".join(f"{got[s]['risk'] - ref[n]['risk']:.1e}" for s in args.schemes[1:]) + " |")
    fits = {}
    for s in args.schemes:
        r = [x for x in rows if x["scheme"] == s]
        law = fit_power(np.array([x["token_cells"] for x in r], float), np.array([x["gradient_cpu_s"] for x in r]))
        fits[s] = {"exponent": law.q, "se": law.se_q}
        print(f"{s}: CPU per training step ∝ cells^{law.q:.2f} (± {law.se_q:.2f})")
    out_dir = ROOT / "out" / "bench"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "depth_scheme.json").write_text(json.dumps({"rows": rows, "fits": fits}, indent=2))


if __name__ == "__main__":
    main()
