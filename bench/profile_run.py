"""Where the CPU time of ``mfpde run`` goes: a sampling profile of one process, grouped into a few categories.

cProfile's per-call overhead distorts Python-heavy code (matplotlib's text layout most of all), so this samples
instead: the process runs ``mfpde.cli.main`` in-process under ``ITIMER_PROF`` (a signal every ``--interval``
seconds of process CPU time, user + system) and each sample's Python stack is assigned to the first category
(:data:`CATEGORIES`, outermost frame first) that one of its frames matches; samples no category claims are
"other". Time spent in C code (PETSc, numpy, ADIOS2) is charged to the Python frame that called it.

Run: ``python bench/profile_run.py [CONFIG] [--out DIR] [--set KEY=VALUE ...]``, or with ``PYTHONPATH`` pointing at
another tree to profile that code. Prints a markdown table and one JSON line (``{"category": seconds, ...}``)
as its last line; :mod:`bench_run` runs it for the current tree and the baseline.
"""

from __future__ import annotations

import argparse
import collections
import json
import signal
import sys
import tempfile
import time
from types import FrameType

#: (category, substrings of "path:function" of a frame); the first category with a matching frame wins, frames
#: searched from the outermost. Imports are matched first (a module imported lazily counts as start-up).
CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("imports", ("<frozen importlib._bootstrap>:_find_and_load",)),
    ("plots", ("mfpde/plots.py:", "mfpde/plot_loss.py:", "mfpde/plot_layout.py:")),
    ("μ_T fields (.bp)", ("objective.py:_output", "objective.py:_write_fields", "mfpde/sample_fields.py:")),
    ("initial measures μ_0", ("objective.py:_initial", "mfpde/tokens/box/data.py:fill_density",
                              "mfpde/tokens/box/data.py:initial_measures")),
    ("training: forward + adjoint", ("objective.py:_solves",)),
    ("NTK, report, held-out accuracy", ("driver.py:_final_outputs", "records.py:history_row")),
    ("ρ step (Fokker–Planck)", ("splitting.py:step",)),
    ("set-up (mesh, spaces, forms, JIT)", ("mfpde/training/problem.py:__init__",
                                           "mfpde/tokens/box/problem.py:__init__")),
    ("ρ fields, checkpoints, history", ("driver.py:_write", "records.py:save_state", "driver.py:save_state",
                                       "records.py:append_history")),
]


def _category(frame: FrameType | None) -> str:
    stack = []
    while frame is not None:
        stack.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")
        frame = frame.f_back
    stack.reverse()
    for name, keys in CATEGORIES:
        if any(k in s for s in stack for k in keys):
            return name
    return "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=None, help="config TOML (default: the embedded default)")
    parser.add_argument("--out", default=None, help="output directory (default: a temporary one)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--interval", type=float, default=0.002, help="seconds of CPU time between samples")
    args = parser.parse_args()
    counts: collections.Counter[str] = collections.Counter()

    def sample(signum: int, frame: FrameType | None) -> None:
        counts[_category(frame)] += 1

    signal.signal(signal.SIGPROF, sample)
    c0 = time.process_time()
    signal.setitimer(signal.ITIMER_PROF, args.interval, args.interval)
    with tempfile.TemporaryDirectory() as tmp:
        from mfpde.cli import main as cli_main  # the CLI's own imports are sampled as well

        sets = [x for o in args.overrides for x in ("--set", o)]
        rc = cli_main(["run", *([args.config] if args.config else []), "--quiet", "--out", args.out or f"{tmp}/out",
                       *sets])
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
    cpu = time.process_time() - c0
    if rc:
        sys.exit(rc)
    total = sum(counts.values()) or 1
    secs = {k: cpu * v / total for k, v in counts.most_common()}
    print("| where | CPU [s] | share |\n|---|---|---|")
    for k, v in secs.items():
        print(f"| {k} | {v:.2f} | {v / cpu:.0%} |")
    print(f"| total (process CPU) | {cpu:.2f} | |")
    print(json.dumps(secs | {"total": cpu}))


if __name__ == "__main__":
    main()
