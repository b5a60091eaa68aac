"""Benchmark: the cost of a training step's gradient (forward + discrete adjoint) against one forward solve.

Issue 12's first target: a training step costs at most 3 forward solves. The d = 1 adjoint's nonlocal source
(the velocity's vector–Jacobian product) was the naive N_a N_x N_y exponential sum while the forward
interpolates in s = a x; ``mfpde.tokens.chebyshev`` gives the adjoint the same interpolation. This script times,
side by side in one run, on one core:

* the forward solve μ_0 ↦ μ_T (taped, as in training);
* the gradient (forward + adjoint) with the Chebyshev VJP, and with the direct VJP (the code before it);

for the d = 1 problems of the issue: DG1, 400 cells, 200 depth steps, one Gaussian sample, ``value`` heads on
300 Θ cells, and ``scalar`` heads on a 48×48 Θ mesh (48 distinct a). It checks that both gradients agree
(relative difference printed) and writes ``out/bench/training_step.json`` and a markdown table.

Run: ``python bench/bench_training_step.py [--repeat 2]``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from mpi4py import MPI

import dolfinx.fem
import numpy as np
from threadpoolctl import threadpool_limits

import mfpde.tokens.velocity as velocity_module
from mfpde import config as C
from mfpde.tokens.data import fill_density
from mfpde.training.problem import CoupledProblem

CASES = {
    "value, 300 Θ cells": {"family": "value", "box": [[-2.0, 2.0]], "cells": [300],
                           "init": {"kind": "gaussian", "mean": [0.4], "cov": [[0.05]]}},
    "scalar, 48×48 Θ": {"family": "scalar", "box": [[-2.0, 2.0], [-2.0, 2.0]], "cells": [48, 48],
                        "init": {"kind": "gaussian", "mean": [0.3, 0.5], "cov": [[0.1, 0.0], [0.0, 0.1]]}},
}


def _config(heads: dict) -> C.Config:
    return C.from_dict({
        "tokens": {"dim": 1, "box": [[-4.0, 4.0]], "cells": [400], "degree": 1},
        "depth": {"T": 1.0, "steps": 200},
        "heads": heads,
        "data": {"kind": "gaussian", "mean": [[0.3]], "cov": [[[0.25]]], "target": [1.0]},
        "output": {"fields": False, "plots": False},
    })


def _best(f, repeat: int) -> tuple[float, object]:
    best, out = np.inf, None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = f()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _measure(name: str, heads_cfg: dict, repeat: int) -> dict:
    """Forward, gradient with the Chebyshev VJP and gradient with the direct VJP for one case."""
    chebyshev = velocity_module.velocity_vjp_1d
    pb = CoupledProblem(_config(heads_cfg), MPI.COMM_SELF)
    heads = pb.heads()
    obj, tokens = pb.objective, pb.problem.tokens

    def forward() -> float:
        u = dolfinx.fem.Function(tokens.W)
        fill_density(pb.problem.train[0], u, tokens.mass)
        return obj.forward(u, heads, tape=[]).yhat

    pb.gradient(heads)  # JIT and caches
    t_fwd, _ = _best(forward, repeat)
    t_cheb, g_cheb = _best(lambda: pb.gradient(heads), repeat)
    velocity_module.velocity_vjp_1d = lambda *a, **k: None  # the direct VJP (the code before)
    try:
        t_dir, g_dir = _best(lambda: pb.gradient(heads), repeat)
    finally:
        velocity_module.velocity_vjp_1d = chebyshev
    d_c, d_d = g_cheb.D[0], g_dir.D[0]
    rel = float(np.abs(d_c - d_d).max() / np.abs(d_d).max())
    return {"case": name, "n_a": len(heads[0].a), "forward_s": t_fwd, "gradient_chebyshev_s": t_cheb,
            "gradient_direct_s": t_dir, "ratio_chebyshev": t_cheb / t_fwd, "ratio_direct": t_dir / t_fwd,
            "speedup": t_dir / t_cheb, "max_rel_diff_dR_dc": rel}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2, help="best of this many runs per timing")
    args = parser.parse_args()
    rows = []
    for name, heads_cfg in CASES.items():
        rows.append(_measure(name, heads_cfg, args.repeat))
    print("| case | N_a | forward (s) | gradient, Chebyshev VJP (s) | gradient, direct VJP (s) | "
          "gradient / forward | speed-up | max rel. diff. of ∂R/∂c |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['n_a']} | {r['forward_s']:.2f} | {r['gradient_chebyshev_s']:.2f} | "
              f"{r['gradient_direct_s']:.2f} | {r['ratio_chebyshev']:.2f} (was {r['ratio_direct']:.1f}) | "
              f"{r['speedup']:.1f}× | {r['max_rel_diff_dR_dc']:.1e} |")
    out = Path("out/bench")
    out.mkdir(parents=True, exist_ok=True)
    (out / "training_step.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    with threadpool_limits(limits=1):
        main()
