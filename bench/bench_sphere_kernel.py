"""Cost and memory of the sphere's kernels (mfpde.tokens.sphere.kernel) against n, L and the number of ranks.

One evaluation = ``update`` (μ̂_ℓm of n points, one Allreduce) + ``velocity`` at the same n points (what a
solver does per stage). Measured (CPU seconds, ``time.process_time``, best of ``--repeat``, one BLAS thread):

* the harmonic kernel against n at L = 28 (β = 9) and against L at fixed n; power laws t ≈ C n^a, t ≈ C L^b
  fitted (:func:`mfpde.fitting.fit_power`) — the model is O(n (L+1)²): a = 1, b = 2;
* the tilted kernel (SA, β = 20 and 40: K centres, 4K series) against n, its K, L and Allreduce bytes;
* the log-domain kernel (gathers, O(n²)) and the direct sum against n;
* peak memory of one evaluation per point (``tracemalloc``, numpy's allocations), harmonic and log-domain;
* with ``--ranks``: run under ``mpiexec -n P``, a weak-scaling table (n points per rank): the slowest rank's
  seconds and the bytes each rank sends (8 (L+1)² per update, whatever P);
* with ``--crossover``: the direct sum against the harmonic kernel for n = 64..4096 at L = 16..55, with each
  transform backend (numpy, and ducc0 if importable): the ratio of their CPU, the measured crossover (the n where
  the direct sum stops being cheaper) and the rule :func:`mfpde.tokens.sphere.kernel.direct_limit` sets;
* if ``ducc0`` is importable: its NUFFT-based ``synthesis_general`` (value + gradient) and
  ``adjoint_synthesis_general`` at ε = 2.1e-13 against n, for comparison (not a dependency of mfpde).

    python bench/bench_sphere_kernel.py [--repeat 3] [--quick] [--json out/bench_sphere_kernel.json]
    python bench/bench_sphere_kernel.py --crossover [--repeat 5] [--quick]
    mpiexec -n 3 python bench/bench_sphere_kernel.py --ranks [--n 20000]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mpi4py import MPI

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mfpde.fitting import fit_power  # noqa: E402
from mfpde.tokens.sphere.kernel import HarmonicVelocity, LogDomainVelocity, TiltedVelocity, direct_limit  # noqa: E402
from mfpde.tokens.sphere.velocity import DirectVelocity  # noqa: E402


def points(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Seeded unit vectors (n of them) and the masses of a smooth density (total 1)."""
    x = np.random.default_rng(seed).normal(size=(n, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    w = np.exp(x[:, 0] + x[:, 2] ** 2)
    return x, w / w.sum()


def best(fn: Callable[[], object], repeat: int) -> float:
    """The least CPU seconds of ``repeat`` calls."""
    ts = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        ts.append(time.process_time() - t0)
    return min(ts)


def evaluation(kernel: Any, x: np.ndarray, w: np.ndarray) -> Callable[[], object]:
    """One update + velocity at the same points."""
    def run() -> object:
        kernel.update(x, w)
        return kernel.velocity(x)
    return run


def peak_bytes(fn: Callable[[], object]) -> int:
    """Peak numpy allocation of one call (tracemalloc)."""
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def serial(repeat: int, quick: bool) -> dict[str, Any]:
    ns = [2000, 8000, 32000] if quick else [2000, 8000, 32000, 128000]
    res: dict[str, Any] = {"n": ns}
    h = HarmonicVelocity(9.0, "softmax")
    res["L_n"] = h.L
    res["harmonic_s"] = [best(evaluation(h, *points(n)), repeat) for n in ns]
    res["harmonic_exponent_n"] = fit_power(ns, res["harmonic_s"]).q
    Ls = [8, 16, 32, 64]
    nL = 16000
    x, w = points(nL)
    res["L"], res["n_L"] = Ls, nL
    res["harmonic_L_s"] = [best(evaluation(HarmonicVelocity(9.0, "softmax", L=L), x, w), repeat) for L in Ls]
    res["harmonic_exponent_L"] = fit_power([L + 1 for L in Ls], res["harmonic_L_s"]).q
    for beta in (20.0, 40.0):
        t = TiltedVelocity(beta, "softmax")
        res[f"tilted_{beta:g}_s"] = [best(evaluation(t, *points(n)), repeat) for n in ns]
        res[f"tilted_{beta:g}_exponent_n"] = fit_power(ns, res[f"tilted_{beta:g}_s"]).q
        res[f"tilted_{beta:g}_centres_L_allreduce_bytes"] = [len(t.centres), t.L, 8 * t._series.size]
    nd = [1000, 2000, 4000] if quick else [1000, 2000, 4000, 8000]
    res["n_direct"] = nd
    res["log_domain_s"] = [best(evaluation(LogDomainVelocity(20.0, "softmax"), *points(n)), repeat) for n in nd]
    res["direct_s"] = [best(evaluation(DirectVelocity(9.0, "softmax"), *points(n)), repeat) for n in nd]
    res["log_domain_exponent_n"] = fit_power(nd, res["log_domain_s"]).q
    nm = 32000
    res["bytes_per_point"] = {
        "harmonic": peak_bytes(evaluation(HarmonicVelocity(9.0, "softmax"), *points(nm))) / nm,
        "log_domain": peak_bytes(evaluation(LogDomainVelocity(20.0, "softmax"), *points(8000))) / 8000,
        "tilted_40": peak_bytes(evaluation(TiltedVelocity(40.0, "softmax"), *points(nm))) / nm}
    if importlib.util.find_spec("ducc0") is not None:
        res["ducc0_s"] = [best(_ducc0(h.L, *points(n)), repeat) for n in ns]
    return res


def _ducc0(L: int, x: np.ndarray, w: np.ndarray) -> Callable[[], object]:
    """ducc0's general-position transforms: the adjoint (μ̂), the value and the gradient (spin 1, DERIV1)."""
    import ducc0  # type: ignore[import-not-found]

    loc = np.stack([np.arccos(np.clip(x[:, 2], -1, 1)), np.mod(np.arctan2(x[:, 1], x[:, 0]), 2 * np.pi)], axis=1)

    def run() -> object:
        alm = ducc0.sht.adjoint_synthesis_general(map=w[None], spin=0, lmax=L, loc=loc, epsilon=2.1e-13)
        ducc0.sht.synthesis_general(alm=alm, spin=0, lmax=L, loc=loc, epsilon=2.1e-13)
        return ducc0.sht.synthesis_general(alm=alm, spin=1, lmax=L, loc=loc, epsilon=2.1e-13, mode="DERIV1")
    return run


def crossover(repeat: int, quick: bool) -> dict[str, Any]:
    """Harmonic kernel over direct sum, CPU ratio per (backend, L, n); the crossover n and the rule's limit."""
    import os

    ns = [64, 256, 1024, 4096] if quick else [64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096]
    Ls = [16, 39] if quick else [16, 22, 28, 39, 55]
    backends = ["numpy"] + (["ducc0"] if importlib.util.find_spec("ducc0") is not None else [])
    res: dict[str, Any] = {"n": ns, "L": Ls, "rows": []}
    before = os.environ.get("MFPDE_SHT")
    try:
        for sht in backends:
            os.environ["MFPDE_SHT"] = sht
            for L in Ls:
                ratio = []
                for n in ns:
                    x, w = points(n)
                    h = best(evaluation(HarmonicVelocity(9.0, "unnormalised", L=L), x, w), repeat)
                    d = best(evaluation(DirectVelocity(9.0, "unnormalised"), x, w), repeat)
                    ratio.append(h / d)
                cheaper = [n for n, r in zip(ns, ratio, strict=True) if r > 1.0]  # the direct sum is cheaper
                res["rows"].append({"sht": sht, "L": L, "harmonic_over_direct": ratio,
                                    "direct_cheaper_up_to": max(cheaper) if cheaper else None,
                                    "rule": direct_limit(L, sht)})
                print(f"{sht:6s} L={L:2d}: " + " ".join(f"{n}:{r:.2f}" for n, r in zip(ns, ratio, strict=True))
                      + f"  direct cheaper up to n = {res['rows'][-1]['direct_cheaper_up_to']}, rule "
                      f"{direct_limit(L, sht)}", flush=True)
    finally:
        if before is None:
            os.environ.pop("MFPDE_SHT", None)
        else:
            os.environ["MFPDE_SHT"] = before
    return res


def weak(n: int, repeat: int) -> dict[str, Any]:
    """Weak scaling, n points per rank: the slowest rank's CPU seconds per evaluation, bytes sent per update."""
    comm = MPI.COMM_WORLD
    x, w = points(n, seed=comm.rank)
    h = HarmonicVelocity(9.0, "softmax", comm)
    t = comm.allreduce(best(evaluation(h, x, w), repeat), MPI.MAX)
    return {"ranks": comm.size, "n_per_rank": n, "L": h.L, "slowest_rank_s": t,
            "allreduce_bytes": 8 * (h.L + 1) ** 2}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ranks", action="store_true", help="the weak-scaling row of this mpiexec -n P")
    ap.add_argument("--crossover", action="store_true", help="the direct sum against the harmonic kernel")
    ap.add_argument("--n", type=int, default=20000, help="points per rank with --ranks")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.crossover:
        res = crossover(args.repeat, args.quick)
    else:
        res = weak(args.n, args.repeat) if args.ranks else serial(args.repeat, args.quick)
    if MPI.COMM_WORLD.rank == 0:
        print(json.dumps(res, indent=1))
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
