"""Benchmark: the main job (``mfpde run`` on its embedded default) end to end, cold and warm, on 1 and 2 ranks.

Issue 12 asks for the training throughput of the default (images·steps per second), its parallel efficiency
from 1 to 2 ranks (goal ≥ 0.8) and the cold-start time (FFCx JIT compilation with an empty cache). Each run is
a subprocess ``mfpde run --quiet --out DIR`` (fields and plots on, as a user runs it); from its ``history.csv``
(wall time at every output step) and the process's wall time:

* start-up: wall time of the first history row (step 0: set-up, JIT, the first evaluation of R);
* throughput: training images × steps per second between the first and the last history row;
* end: process wall time minus the last row's (final outputs, plots, fields, report);
* parallel efficiency: T₁ / (2 T₂) of the total wall times.

With ``--baseline REV`` (issue 12: the speed-up measured side by side in one run) the same config is also run
on one rank and warm by the code of commit REV (``git worktree`` in a temporary directory, imported first
through ``PYTHONPATH``; the same malloc settings as ``mfpde`` sets for itself), and the table gains its row and
the speed-ups of the training throughput against it.

Writes ``out/bench/run.json`` and prints a markdown table. Run: ``python bench/bench_run.py [--ranks 1 2]
[--config demos/digits_deep.toml] [--baseline 97e80a2]`` (about 3 minutes per run on 2 cores).
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


def run(ranks: int, cold: bool, overrides: list[str], config: str | None = None, tree: Path | None = None) -> dict:
    """One ``mfpde run [config]`` (default: the embedded default), of the code in ``tree`` if given; its timings."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ)
        if tree is not None:
            env.update(PYTHONPATH=str(tree), MALLOC_MMAP_THRESHOLD_="67108864", MALLOC_TRIM_THRESHOLD_="268435456")
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
    ntk = report["final"].get("ntk", {})
    if "eigenvalues" in ntk:  # one per training sample (data.split counted)
        n_train = len(ntk["eigenvalues"])
    else:  # older code (no eigenvalues in the report): the config's count
        from mfpde import config as C

        n_train = C.load(config or str(ROOT / "mfpde" / "defaults" / "run.toml"), overrides).data.samples
    first, last = rows[0], rows[-1]
    steps = int(last["step"]) - int(first["step"])
    wall = float(last["wall_s"]) - float(first["wall_s"])
    return {"ranks": ranks, "cold": cold, "code": "tree" if tree is None else tree.name, "total_s": total,
            "startup_s": float(first["wall_s"]), "end_s": total - float(last["wall_s"]), "steps": steps,
            "train_images": n_train, "images_steps_per_s": n_train * steps / wall, "risk": report["final"]["risk"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", nargs="*", type=int, default=[1, 2])
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--config", default=None, help="a config file (default: the embedded default); issue 12's "
                        "throughput was measured on demos/digits_deep.toml, the default when it was filed")
    parser.add_argument("--baseline", default=None, metavar="REV",
                        help="also run the code of this commit (one rank, warm), e.g. 97e80a2 (before issue 12)")
    args = parser.parse_args()
    rows = []
    if args.baseline:
        with tempfile.TemporaryDirectory() as tmp:
            base = Path(tmp) / args.baseline
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base), args.baseline],
                           check=True)
            try:
                rows.append(run(1, False, args.overrides, args.config, base))
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=True)
    rows += [run(1, True, args.overrides, args.config)] + [run(r, False, args.overrides, args.config)
                                                           for r in args.ranks]
    print("| code | ranks | JIT cache | total [s] | start-up [s] | end [s] | images·steps/s | final risk |\n"
          "|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['code']} | {r['ranks']} | {'empty' if r['cold'] else 'warm'} | {r['total_s']:.1f} | "
              f"{r['startup_s']:.1f} | {r['end_s']:.1f} | {r['images_steps_per_s']:.1f} | {r['risk']:.9g} |")
    if args.baseline:
        b = rows[0]["images_steps_per_s"]
        print("\ntraining throughput against " + args.baseline + ": " + ", ".join(
            f"{r['ranks']} rank(s) {r['images_steps_per_s'] / b:.1f}×" for r in rows[1:] if not r["cold"]))
    warm = {r["ranks"]: r for r in rows if not r["cold"] and r["code"] == "tree"}
    if 1 in warm and 2 in warm:
        eff = warm[1]["total_s"] / (2 * warm[2]["total_s"])
        thr = warm[2]["images_steps_per_s"] / (2 * warm[1]["images_steps_per_s"])
        print(f"\nparallel efficiency 1 → 2 ranks: {eff:.2f} (total wall), {thr:.2f} (training throughput)")
    out = ROOT / "out" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
