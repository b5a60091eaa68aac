"""Benchmark: a short serial ``mfpde run`` with 1 and 2 BLAS threads and several sample-batch sizes, idle and loaded.

A single-rank run used to leave OpenBLAS at its default thread count (one per core). This script measures what
that costs on the embedded default (``--set training.steps=20`` unless ``--steps`` says otherwise), each run a
subprocess ``mfpde run --quiet`` whose BLAS thread count is chosen by ``OPENBLAS_NUM_THREADS`` and
``OMP_NUM_THREADS`` (set before numpy loads; mfpde respects them), and whose batch size (the samples that advance
together in depth, ``mfpde.training.objective.BATCH_SAMPLES``) is patched before the run starts:

* ``idle``: nothing else started by this script (other users' jobs are reported by the load average);
* ``loaded``: one busy process (a pure-Python loop) on a core for the whole measurement.

``--threads default`` runs with no thread variable at all, i.e. what ``mfpde`` itself chooses. Every row
records the load average before it; the best of ``--repeat`` wall times is reported, with the final risk
(identical across settings up to round-off). Writes ``out/bench/threads.json`` and prints a markdown table.

Run: ``python bench/bench_threads.py [--steps 20] [--threads 1 2 default] [--batch 4 8 16] [--repeat 2]``
(about 3 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "MFPDE_BLAS_THREADS")
#: The child: patch the batch size, then the CLI (numpy is loaded after the environment is set).
CHILD = ("import sys; import mfpde.training.objective as o; o.BATCH_SAMPLES = int(sys.argv[1]); "
         "from mfpde.cli import main; sys.exit(main(sys.argv[2:]))")


def load_average() -> float:
    """The 1-minute load average (``os.getloadavg``)."""
    return os.getloadavg()[0]


def one_run(threads: str, batch: int, steps: int) -> tuple[float, float]:
    """Wall seconds and final risk of one ``mfpde run`` of the embedded default shortened to ``steps``."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    if threads != "default":
        env.update(OPENBLAS_NUM_THREADS=threads, OMP_NUM_THREADS=threads)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-c", CHILD, str(batch), "run", "--quiet", "--out", tmp,
               "--set", f"training.steps={steps}", "--set", "output.fields=false", "--set", "output.plots=false"]
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        risk = json.loads((Path(tmp) / "report.json").read_text())["final"]["risk"]
    return wall, risk


class Busy:
    """One busy process (a pure-Python loop) for the duration of a ``with`` block."""

    def __enter__(self) -> Busy:
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.5)
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", nargs="+", default=["1", "2", "default"])
    ap.add_argument("--batch", nargs="+", type=int, default=[4, 8, 16])
    ap.add_argument("--loads", nargs="+", default=["idle", "loaded"], choices=["idle", "loaded"])
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    one_run("1", 8, 1)  # warm the FFCx cache and the file system
    rows = []
    for load in args.loads:
        for threads in args.threads:
            for batch in args.batch:
                la = load_average()
                if load == "loaded":
                    with Busy():
                        runs = [one_run(threads, batch, args.steps) for _ in range(args.repeat)]
                else:
                    runs = [one_run(threads, batch, args.steps) for _ in range(args.repeat)]
                rows.append({"load": load, "threads": threads, "batch": batch, "load_average": la,
                             "wall_s": min(w for w, _ in runs), "risk": runs[0][1]})
                print(f"{load} threads={threads} batch={batch}: {rows[-1]['wall_s']:.2f} s (load {la:.2f})",
                      file=sys.stderr, flush=True)
    out = ROOT / "out" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    (out / "threads.json").write_text(json.dumps({"steps": args.steps, "rows": rows}, indent=1))
    print(f"| load | BLAS threads | batch | wall [s] ({args.steps} steps) | load average before | final risk |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['load']} | {r['threads']} | {r['batch']} | {r['wall_s']:.2f} | {r['load_average']:.2f} "
              f"| {r['risk']:.10g} |")


if __name__ == "__main__":
    main()
