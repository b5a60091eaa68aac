"""The sphere's harmonic transforms: numpy (the reference) against ducc0 (the optional extra ``mfpde[ducc]``).

Per degree L: CPU seconds (``time.process_time``, best of ``--repeat``, one thread) of the adjoint synthesis
μ̂_ℓm = Σ_j w_j Y_ℓm(x_j) (``analysis``), the synthesis with its surface gradient (``synthesis``) and one DG kernel
evaluation (``HarmonicVelocity.update`` + ``velocity`` at the same points: what a solver does per stage), at n
seeded points, each by both backends (``MFPDE_SHT``), with the largest difference of the velocities relative to
their largest value. Without ducc0 only the numpy column is printed.

    python bench/bench_sht.py [--L 16 28 40 55] [--n 20000] [--repeat 3] [--json out/bench_sht.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_sphere_kernel import best  # noqa: E402  (this folder: the script's own)

from mfpde.tokens.sphere import sht  # noqa: E402
from mfpde.tokens.sphere.kernel import HarmonicVelocity  # noqa: E402


def row(L: int, n: int, repeat: int, backend: str) -> tuple[dict[str, float], np.ndarray]:
    """The three timings at degree L and n points with ``backend``, and the kernel's velocity."""
    os.environ[sht.ENV] = backend
    rng = np.random.default_rng(L)
    x = rng.normal(size=(n, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    w = np.exp(x[:, 0] + x[:, 2] ** 2)
    w /= w.sum()
    g = rng.normal(size=(L + 1) ** 2)
    kern = HarmonicVelocity(9.0, "softmax", L=L)

    def evaluate() -> np.ndarray:
        kern.update(x, w)
        return kern.velocity(x)

    t = {"analysis": best(lambda: sht.analysis(L, x, w), repeat),
         "synthesis": best(lambda: sht.synthesis(L, g, x, gradient=True), repeat),
         "kernel": best(evaluate, repeat)}
    return t, evaluate()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--L", type=int, nargs="+", default=[16, 28, 40, 55])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    saved = os.environ.get(sht.ENV)
    backends = ["numpy"] + (["ducc0"] if sht._ducc0() is not None else [])
    rows: list[dict[str, Any]] = []
    try:
        for L in args.L:
            res = {b: row(L, args.n, args.repeat, b) for b in backends}
            r: dict[str, Any] = {"L": L, "n": args.n}
            for b, (t, _) in res.items():
                r.update({f"{k}_{b}_s": v for k, v in t.items()})
            if "ducc0" in res:
                v0, v1 = res["numpy"][1], res["ducc0"][1]
                r["velocity_rel_diff"] = float(np.abs(v1 - v0).max() / np.abs(v0).max())
            rows.append(r)
    finally:
        os.environ.pop(sht.ENV, None)
        if saved is not None:
            os.environ[sht.ENV] = saved
    print(f"CPU seconds, best of {args.repeat}, n = {args.n} points, one thread"
          + ("" if "ducc0" in backends else " (ducc0 not installed: numpy only)"))
    head = f"{'L':>3}" + "".join(f" {k + ' ' + b:>18}" for k in ("analysis", "synthesis", "kernel")
                                 for b in backends)
    if "ducc0" in backends:
        head += f" {'kernel speedup':>15} {'|Δv|/|v|':>9}"
    print(head)
    for r in rows:
        line = f"{r['L']:>3}" + "".join(f" {r[f'{k}_{b}_s']:>18.4f}" for k in ("analysis", "synthesis", "kernel")
                                        for b in backends)
        if "ducc0" in backends:
            line += f" {r['kernel_numpy_s'] / r['kernel_ducc0_s']:>14.1f}× {r['velocity_rel_diff']:>9.1e}"
        print(line)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows, "repeat": args.repeat}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
