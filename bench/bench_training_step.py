"""Benchmark: the cost of a training step's gradient (forward + discrete adjoint), today's code against a baseline.

Issue 12's targets: a training step (forward + adjoint) costs at most 3 forward solves, and the training
throughput of the default run (images·steps per second) is at least 10× that of the code the issue was filed
against. This script times, on one core, side by side in one run, the current tree and a baseline commit
(default ``97e80a2``, the code before issue 12; checked out with ``git worktree`` into a temporary directory
and imported from there), each in its own process:

* the forward solve μ_0 ↦ μ_T of every training sample (untaped, as for predictions);
* the gradient R(ρ), ∂R/∂c by forward + discrete adjoint over the training samples (one training step's work;
  the Fokker–Planck step costs milliseconds);

for three problems:

* ``d=1 value``: DG1, 400 cells, 200 depth steps, one Gaussian sample, ``value`` heads on 300 Θ cells;
* ``d=1 scalar``: the same with ``scalar`` heads on a 48×48 Θ mesh (49 distinct a);
* ``d=2 digits``: ``demos/digits_deep.toml`` (20 images, DG0 on 32×32 cells, 8 depth steps, 16×16 Θ; the default of
  ``mfpde run`` when issue 12 was filed);
* ``d=2 digits 16x16``: the same on 16×16 token cells with 60 images (the size of exploratory runs).

It checks that both versions return the same ∂R/∂c (relative difference printed), prints a markdown table and
writes ``out/bench/training_step.json``.

Run: ``python bench/bench_training_step.py [--repeat 3] [--baseline REV | --baseline none] [--baseline-repeat 1]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from baseline import baseline_tree  # noqa: E402

ROOT = HERE.parent

GAUSSIAN_1D = ['data.kind="gaussian"', "data.mean=[[0.3]]", "data.cov=[[[0.25]]]", "data.target=[1.0]",
               'loss.readout="mean"']
#: Every case starts from the deep digits problem (``demos/digits_deep.toml``, the embedded default of ``mfpde run``
#: before issue 13 made it the single-layer model) with these overrides (TOML values, as ``--set``).
BASE_CONFIG = ROOT / "demos" / "digits_deep.toml"
CASES: dict[str, list[str]] = {
    "d=1 value": [
        "tokens.dim=1", "tokens.box=[[-4.0, 4.0]]", "tokens.cells=[400]", "tokens.degree=1", "depth.steps=200",
        'heads.family="value"', "heads.box=[[-2.0, 2.0]]", "heads.cells=[300]",
        'heads.init={kind="gaussian", mean=[0.4], cov=[[0.05]]}',
        *GAUSSIAN_1D],
    "d=1 scalar": [
        "tokens.dim=1", "tokens.box=[[-4.0, 4.0]]", "tokens.cells=[400]", "tokens.degree=1", "depth.steps=200",
        "heads.cells=[48, 48]", 'heads.init={kind="gaussian", mean=[0.3, 0.5], cov=[[0.1, 0.0], [0.0, 0.1]]}',
        *GAUSSIAN_1D],
    "d=2 digits": [],
    "d=2 digits 16x16": ["tokens.cells=[16, 16]", "data.samples=60"],
}


def measure(case: str, repeat: int, extra: tuple[str, ...] = ()) -> dict:
    """Time the forward solves and the gradient of one case with whichever ``mfpde`` is importable.

    ``extra``: further ``--set`` overrides (the test suite shrinks the cases with them).
    """
    from mpi4py import MPI

    import dolfinx.fem
    import numpy as np
    from threadpoolctl import threadpool_limits

    import mfpde
    from mfpde import config as C
    from mfpde.tokens.box.data import fill_density
    from mfpde.training.problem import CoupledProblem

    overrides = [*CASES[case], "output.fields=false", "output.plots=false", *extra]
    cfg = C.load(BASE_CONFIG, overrides)
    t0 = time.perf_counter()
    pb = CoupledProblem.from_config(cfg, MPI.COMM_SELF)
    setup = time.perf_counter() - t0
    heads = pb.heads()
    obj, tokens, train = pb.objective, pb.problem.tokens, pb.problem.train

    def forward() -> None:
        if hasattr(obj, "_solves"):  # batched where the code batches (issue 12), as its predictions are
            obj.predict(train, heads)
            return
        for s in train:
            u = dolfinx.fem.Function(tokens.W)
            fill_density(s, u, tokens.mass)
            obj.forward(u, heads)

    def timed(f) -> float:
        t = time.perf_counter()
        f()
        return time.perf_counter() - t

    with threadpool_limits(limits=1):
        t0 = time.perf_counter()
        g = pb.gradient(heads)  # JIT, caches
        first = time.perf_counter() - t0
        # interleaved, best of each: a load that comes and goes biases neither
        t_fwd, t_grad = np.inf, np.inf
        for _ in range(repeat):
            t_fwd = min(t_fwd, timed(forward))
            t_grad = min(t_grad, timed(lambda: pb.gradient(heads)))
        tracemalloc.start()  # peak of the numpy arrays (the tape included) during one gradient
        pb.gradient(heads)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    dofs = tokens.W.dofmap.index_map.size_global
    return {"case": case, "mfpde": str(Path(mfpde.__file__).parent), "samples": len(train),
            "n_a": len(heads[0].a), "setup_s": setup, "first_gradient_s": first, "forward_s": t_fwd,
            "gradient_s": t_grad, "ratio": t_grad / t_fwd, "images_per_s": len(train) / t_grad,
            "dR_dc": [float(x) for x in g.D[0]], "risk": g.risk, "peak_numpy_bytes": peak,
            "token_dofs": dofs, "peak_bytes_per_dof": peak / dofs}


def _run(tree: Path, case: str, repeat: int) -> dict:
    """:func:`measure` in a fresh process that imports ``mfpde`` from ``tree``."""
    # glibc malloc as `mfpde` sets it (mfpde.environment.keep_freed_memory), for both trees: a process setting
    env = dict(os.environ, PYTHONPATH=str(tree), MALLOC_MMAP_THRESHOLD_="67108864", MALLOC_TRIM_THRESHOLD_="268435456")
    code = (f"import sys, json; sys.path.insert(0, {str(tree)!r}); sys.path.insert(1, {str(HERE)!r}); "
            f"import bench_training_step as b; print(json.dumps(b.measure({case!r}, {repeat})))")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tree, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{case} in {tree} failed:\n{out.stderr[-3000:]}")
    row = json.loads(out.stdout.strip().splitlines()[-1])
    if Path(row["mfpde"]).resolve() != (tree / "mfpde").resolve():
        raise RuntimeError(f"imported mfpde from {row['mfpde']}, not {tree}")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs per timing")
    parser.add_argument("--baseline", default="97e80a2", help="commit to compare with, or 'none'")
    parser.add_argument("--baseline-repeat", type=int, default=1,
                        help="best of this many runs per baseline timing (its d = 1 scalar gradient takes minutes)")
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    args = parser.parse_args()
    rows = []
    with baseline_tree(args.baseline) as base:
        for case in args.cases:
            now = _run(ROOT, case, args.repeat)
            row = {"case": case, "now": now}
            if base is not None:
                before = _run(base, case, args.baseline_repeat)
                d_now, d_before = (__import__("numpy").array(r["dR_dc"]) for r in (now, before))
                row |= {"before": before, "speedup": before["gradient_s"] / now["gradient_s"],
                        "max_rel_diff_dR_dc": float(abs(d_now - d_before).max() / abs(d_before).max())}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("now", "before")}), flush=True)
    print(f"\n| case | samples | N_a | forward (s) | gradient (s) | gradient / forward | images/s | peak numpy MB "
          f"(per token dof) | before: gradient (s), gradient / forward ({args.baseline}) | speed-up | ∂R/∂c agree to |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        n = r["now"]
        b = r.get("before")
        before = f"{b['gradient_s']:.2f}, {b['ratio']:.1f}" if b else "—"
        speed = f"**{r['speedup']:.1f}×**" if b else "—"
        agree = f"{r['max_rel_diff_dR_dc']:.1e}" if b else "—"
        print(f"| {r['case']} | {n['samples']} | {n['n_a']} | {n['forward_s']:.3f} | {n['gradient_s']:.3f} | "
              f"**{n['ratio']:.2f}** | {n['images_per_s']:.1f} | {n['peak_numpy_bytes'] / 1e6:.0f} "
              f"({n['peak_bytes_per_dof'] / 1e3:.0f} kB) | {before} | {speed} | {agree} |")
    out = ROOT / "out" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    (out / "training_step.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
