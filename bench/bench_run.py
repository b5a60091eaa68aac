"""Benchmark: the main job (``mfpde run`` on its embedded default) end to end, cold and warm, on 1 and 2 ranks.

Issue 12 asks for the training throughput of the default (images·steps per second), its parallel efficiency
from 1 to 2 ranks (goal ≥ 0.8) and the cold-start time (FFCx JIT compilation with an empty cache). Each run is
a subprocess ``mfpde run --quiet --out DIR`` (fields and plots on, as a user runs it); from its ``history.csv``
(wall time at every output step) and the process's wall time:

* start-up: wall time of the first history row (step 0: set-up, JIT, the first evaluation of R);
* throughput: training images × steps per second between the first and the last history row;
* end: process wall time minus the last row's (final outputs, plots, fields, report);
* parallel efficiency: T₁ / (2 T₂) of the total wall times.

Writes ``out/bench/run.json`` and prints a markdown table. Run: ``python bench/bench_run.py [--ranks 1 2]``
(about 3 minutes per run on 2 cores).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(ranks: int, cold: bool, overrides: list[str], config: str | None = None) -> dict:
    """One ``mfpde run [config]`` (default: the embedded default); returns its timings."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ)
        if cold:
            env["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")  # an empty FFCx cache: every form compiled
        out = Path(tmp) / "out"
        sets = [x for o in overrides for x in ("--set", o)]
        cmd = [str(BIN / "mfpde"), "run", *([config] if config else []), "--quiet", "--out", str(out), *sets]
        if ranks > 1:
            cmd = [str(BIN / "mpiexec"), "-n", str(ranks), *cmd]
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, cwd=ROOT)
        total = time.perf_counter() - t0
        rows = list(csv.DictReader((out / "history.csv").open()))
        report = json.loads((out / "report.json").read_text())
    n_train = len(report["final"]["ntk"]["eigenvalues"])  # one per training sample (data.split counted)
    first, last = rows[0], rows[-1]
    steps = int(last["step"]) - int(first["step"])
    wall = float(last["wall_s"]) - float(first["wall_s"])
    return {"ranks": ranks, "cold": cold, "total_s": total, "startup_s": float(first["wall_s"]),
            "end_s": total - float(last["wall_s"]), "steps": steps, "train_images": n_train,
            "images_steps_per_s": n_train * steps / wall, "risk": report["final"]["risk"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", nargs="*", type=int, default=[1, 2])
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--config", default=None, help="a config file (default: the embedded default); issue 12's "
                        "throughput was measured on demos/digits_deep.toml, the default when it was filed")
    args = parser.parse_args()
    rows = [run(1, True, args.overrides, args.config)] + [run(r, False, args.overrides, args.config)
                                                           for r in args.ranks]
    print("| ranks | JIT cache | total [s] | start-up [s] | end [s] | images·steps/s |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['ranks']} | {'empty' if r['cold'] else 'warm'} | {r['total_s']:.1f} | {r['startup_s']:.1f} | "
              f"{r['end_s']:.1f} | {r['images_steps_per_s']:.1f} |")
    warm = {r["ranks"]: r for r in rows if not r["cold"]}
    if 1 in warm and 2 in warm:
        eff = warm[1]["total_s"] / (2 * warm[2]["total_s"])
        thr = warm[2]["images_steps_per_s"] / (2 * warm[1]["images_steps_per_s"])
        print(f"\nparallel efficiency 1 → 2 ranks: {eff:.2f} (total wall), {thr:.2f} (training throughput)")
    out = ROOT / "out" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
