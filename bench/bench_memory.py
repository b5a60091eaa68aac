"""Benchmark: peak memory of training against a forward solve, on token meshes of 16² to 128² cells.

Each measurement is a fresh process, its peak resident set (``ru_maxrss`` of the child, what ``/usr/bin/time -f %M``
prints), on one core, for ``demos/digits_deep.toml`` with 8 training and 8 held-out images and ``tokens.cells =
[n, n]``:

* ``run``: ``mfpde run --set training.steps=1`` (one training step: ρ₀'s predictions, two gradients, outputs off);
* ``gradient``: one :meth:`~mfpde.training.objective.Objective.gradient` (forward + adjoint of the 8 training images,
  one batch) after building the problem;
* ``forward``: one :meth:`~mfpde.training.objective.Objective.predict` of the same 8 images (the same batched
  forward, untaped), after building the problem;
* ``transport``: ``mfpde transport`` of the same config (the forward solves one sample at a time).

Memory per token dof is the growth of the peak between the smallest and the largest mesh divided by the growth of
the token dofs (what a finer mesh costs; the fixed cost of the process cancels). The current tree and a baseline
commit (``--baseline``, checked out with ``git worktree``) are measured interleaved, in one run. The adjoint's tape
cost (``report.json`` ``tape``) of each ``run`` is printed too. Writes ``out/bench/memory.json`` and a markdown table.

Run: ``python bench/bench_memory.py [--cells 16 32 64 128] [--baseline REV | --baseline none] [--set KEY=VALUE ...]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from baseline import baseline_tree  # noqa: E402

ROOT = HERE.parent
CONFIG = ROOT / "demos" / "digits_deep.toml"
BASE = ["data.samples=8", "data.test_samples=8", "output.plots=false", "output.fields=false"]
KINDS = ("run", "gradient", "forward", "transport")

#: One gradient or one forward of the training images, in a fresh process (argv: tree, n, kind, overrides...).
_SNIPPET = """
import sys
from mpi4py import MPI
from threadpoolctl import threadpool_limits
from mfpde import config as C
from mfpde.training.problem import CoupledProblem
n, kind = int(sys.argv[2]), sys.argv[3]
cfg = C.load({config!r}, [f"tokens.cells=[{{n}}, {{n}}]", *sys.argv[4:]])
cp = CoupledProblem.from_config(cfg, MPI.COMM_SELF)
heads = cp.heads()
with threadpool_limits(limits=1):
    if kind == "gradient":
        cp.objective.gradient(heads)
    else:
        cp.objective.predict(cp.problem.train, heads)
"""


def _child(tree: Path, args: list[str], out: Path | None = None) -> dict:
    """Run ``args`` with ``mfpde`` imported from ``tree``; its peak RSS (bytes) and CPU seconds."""
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(args, env=env, cwd=tree, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise RuntimeError(f"{args} in {tree} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    # ru_maxrss of the children is the largest child so far: the children run largest last within a kind, and
    # each measurement is read from a fresh sub-process of its own (below), so it is this child's peak.
    row = {"peak_bytes": after.ru_maxrss * 1024, "cpu_s": after.ru_utime + after.ru_stime - before.ru_utime
           - before.ru_stime, "wall_s": wall}
    if out is not None and (out / "report.json").exists():
        row["tape"] = json.loads((out / "report.json").read_text()).get("tape")
    return row


def measure(tree: Path, n: int, kind: str, extra: list[str]) -> dict:
    """One measurement in a fresh process (run through a wrapper so that ``ru_maxrss`` is this child's alone)."""
    sets = [*BASE, *extra]
    with tempfile.TemporaryDirectory() as tmp:
        if kind in ("run", "transport"):
            cli = [sys.executable, "-m", "mfpde", kind, str(CONFIG), "--out", tmp + "/out", "--quiet",
                   "--set", f"tokens.cells=[{n}, {n}]"] + [a for s in sets for a in ("--set", s)]
            if kind == "run":
                cli += ["--set", "training.steps=1"]
        else:
            cli = [sys.executable, "-c", _SNIPPET.format(config=str(CONFIG)), str(tree), str(n), kind, *sets]
        wrapper = [sys.executable, str(Path(__file__)), "--child", json.dumps(cli), tmp + "/out"]
        env = dict(os.environ, PYTHONPATH=str(tree))
        proc = subprocess.run(wrapper, env=env, cwd=tree, capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"{kind} n={n} in {tree}:\n{proc.stderr[-3000:]}")
        row = json.loads(proc.stdout.strip().splitlines()[-1])
    dofs = n * n  # DG0 on n × n cells
    return {"tree": str(tree), "n": n, "kind": kind, "token_dofs": dofs, **row}


def per_dof(rows: list[dict], kind: str) -> float:
    """Growth of the peak RSS per token dof between the smallest and the largest mesh, bytes."""
    r = sorted((x for x in rows if x["kind"] == kind), key=lambda x: x["n"])
    return (r[-1]["peak_bytes"] - r[0]["peak_bytes"]) / (r[-1]["token_dofs"] - r[0]["token_dofs"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, nargs="*", default=[16, 32, 64, 128])
    parser.add_argument("--baseline", default="a157b95", help="commit to compare with, or 'none'")
    parser.add_argument("--kinds", nargs="*", default=list(KINDS), choices=KINDS)
    parser.add_argument("--set", action="append", default=[], help="extra overrides for every case (current tree)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # the wrapper: run one measurement as its only child
        print(json.dumps(_child(Path.cwd(), json.loads(args.child[0]), Path(args.child[1]))))
        return
    rows: dict[str, list[dict]] = {"now": [], "before": []}
    with baseline_tree(args.baseline) as base:
        for n in args.cells:
            for kind in args.kinds:
                for label, tree, extra in (("now", ROOT, args.set), ("before", base, [])):
                    if tree is None:
                        continue
                    r = measure(tree, n, kind, extra)
                    rows[label].append(r)
                    print(json.dumps({"version": label, **{k: v for k, v in r.items() if k != "tree"}}), flush=True)
    print(f"\n| n × n cells | {' | '.join(f'{k} MB' for k in args.kinds)} | run CPU s | tape (run): segments, "
          f"recomputed / sub-steps, peak MB |")
    print("|---|" + "---|" * (len(args.kinds) + 2))
    for label in ("now", "before"):
        for n in args.cells:
            got = {r["kind"]: r for r in rows[label] if r["n"] == n}
            if not got:
                continue
            tape = got.get("run", {}).get("tape")
            t = (f"{tape['segments']}, {tape['recomputed_substeps']} / {tape['substeps']}, "
                 f"{tape['tape_bytes'] / 1e6:.0f}" if tape else "—")
            cpu = f"{got['run']['cpu_s']:.1f}" if "run" in got else "—"
            print(f"| {n}² ({label}) | " + " | ".join(f"{got[k]['peak_bytes'] / 1e6:.0f}" if k in got else "—"
                                                     for k in args.kinds) + f" | {cpu} | {t} |")
    for label in ("now", "before"):
        if len({r["n"] for r in rows[label]}) > 1:
            grow = {k: per_dof(rows[label], k) for k in args.kinds}
            print(f"\n{label}: peak growth per token dof (kB): "
                  + ", ".join(f"{k} {v / 1e3:.1f}" for k, v in grow.items())
                  + "".join(f"; gradient / forward {grow['gradient'] / grow['forward']:.1f}×"
                            for _ in [0] if "gradient" in grow and "forward" in grow)
                  + "".join(f"; run / transport {grow['run'] / grow['transport']:.1f}×"
                            for _ in [0] if "run" in grow and "transport" in grow))
    out = ROOT / "out" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    (out / "memory.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
