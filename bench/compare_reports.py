"""Rerun the reference jobs and compare their outputs with a recorded baseline (issue 10).

The jobs are the default run (shrunk as in ``tests/training/test_coupling.py``), the README's 1-D Gaussian
example, ``mfpde transport`` on every ``demos/*.toml``, the demo script, and shrunk runs that reach the
other code paths a refactoring touches (Strang splitting, depth-indexed and shallow models, Tikhonov
regularisation, a numerical failure, ``--resume``), serially and on 2 ranks where it matters.

Usage::

    python bench/compare_reports.py record /tmp/baseline10     # once, before a change
    python bench/compare_reports.py compare /tmp/baseline10    # after each step
    python bench/compare_reports.py compare /tmp/baseline10 /tmp/new10  # keeps the new outputs (compares them
                                                                        # again without a rerun where they exist)

``compare`` reruns every job into a fresh directory and compares every numeric field of ``report.json``
and ``history.csv`` (all but the timings and ``version``) and of the checkpoint, the exit status, the
non-numeric fields, the resolved ``config.toml``, the names of the plot and field files, and the numbers
the demo prints. Two numbers a, b agree when |a − b| ≤ RTOL·max(|a|, |b|) with RTOL = 1e-12:
a change of code layout that keeps the floating-point operations and their order gives bit-identical
results (which is what the refactoring aims at, and the maximum difference is printed to show it); the
tolerance only leaves room for a reduction that a refactoring legitimately regroups (a sum over layer
blocks, an ``allreduce`` of a different partial sum), whose effect is a few ulps, ~1e-15 relative. The
script exits 1 if any field differs, naming it.
"""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
RTOL = 1e-12
SMALL = ["tokens.cells=[8, 8]", "heads.cells=[20]", "depth.steps=4", "data.split=0", "data.samples=4",
         "data.test_samples=4", "training.steps=3", "output.every=1", "output.checkpoint_every=1"]
IGNORED = {"wall_s", "version", "solve_cpu_s", "cpu_s"}  # timings


def _sets(items: list[str]) -> list[str]:
    return [a for s in items for a in ("--set", s)]


def _readme_example() -> str:
    """The TOML of the config page's "A 1-D Gaussian training problem" block."""
    text = (ROOT / "docs" / "config.md").read_text()
    m = re.search(r"A 1-D Gaussian training problem:\s*```toml\n(.*?)```", text, re.S)
    assert m is not None, "docs/config.md: the 1-D Gaussian example block is missing"
    return m.group(1)


def jobs(work: Path) -> dict[str, list[tuple[int, list[str]]]]:
    """Job name -> the commands it runs in order, each (number of ranks, mfpde arguments); out dir is work/name."""
    readme = work / "readme_1d.toml"
    readme.write_text(_readme_example())
    cfg1d = str(readme)
    quiet_small = [str(ROOT / "demos" / "digits_deep.toml"), "--quiet", *_sets(SMALL)]  # the default before issue 13
    j: dict[str, list[tuple[int, list[str]]]] = {
        "run_small": [(1, ["run", *quiet_small])],
        "run_small_np2": [(2, ["run", *quiet_small])],
        "readme_1d": [(1, ["run", cfg1d, "--quiet"])],
        "readme_1d_np2": [(2, ["run", cfg1d, "--quiet"])],
        "run_strang": [(1, ["run", cfg1d, "--quiet", *_sets(["training.splitting=\"strang\"", "training.steps=6",
                                                                "output.every=1"])])],
        "run_depth_indexed": [(1, ["run", *quiet_small, *_sets(["depth.model=\"depth-indexed\"", "depth.layers=2"])])],
        "run_shallow": [(1, ["run", *quiet_small, *_sets(["depth.model=\"shallow\""])])],
        "run_shallow_value": [(1, ["run", cfg1d, "--quiet", *_sets(["depth.model=\"shallow\"", "training.steps=10"])])],
        "run_tikhonov": [(1, ["run", cfg1d, "--quiet", *_sets(["training.regularization=\"tikhonov\"",
                                                                  "training.lambda=0.0", "training.steps=10",
                                                                  "output.every=1"])])],
        "run_tikhonov_strang": [(1, ["run", cfg1d, "--quiet", *_sets(["training.regularization=\"tikhonov\"",
                                                                         "training.lambda=0.0", "training.steps=4",
                                                                         "training.splitting=\"strang\""])])],
        "run_fail_outflow": [(1, ["run", *quiet_small, *_sets(["tokens.box=[[-0.5, 1.5], [-0.5, 1.5]]",
                                                               "data.origin=[0.0, 0.0]", "tokens.outflow_tol=1e-4"])])],
        "run_resume": [(1, ["run", "--quiet", *_sets([*SMALL, "training.steps=2"])]),
                       (1, ["run", "--quiet", "--resume", *_sets(SMALL)])],
    }
    for toml in sorted((ROOT / "demos").glob("*.toml")):
        j[f"transport_{toml.stem}"] = [(1, ["transport", str(toml)])]
        j[f"transport_{toml.stem}_np2"] = [(2, ["transport", str(toml)])]
    return j


def run_jobs(work: Path) -> None:
    """Run every job into work/<name> (exit status in work/<name>/exit) and the demo into work/demo."""
    work.mkdir(parents=True, exist_ok=True)
    for name, cmds in jobs(work).items():
        out = work / name
        shutil.rmtree(out, ignore_errors=True)
        codes = []
        for np_, args in cmds:
            pre = [str(BIN / "mpiexec"), "-n", str(np_)] if np_ > 1 else []
            cmd = [*pre, sys.executable, "-m", "mfpde", *args, "--out", str(out)]
            r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            codes.append(r.returncode)
            if r.returncode not in (0, 3):
                print(f"{name}: exit {r.returncode}\n{r.stderr[-2000:]}", file=sys.stderr)
        out.mkdir(parents=True, exist_ok=True)
        (out / "exit").write_text(" ".join(map(str, codes)) + "\n")
        print(f"  {name}: exit {codes}", flush=True)
    demo = work / "demo"
    shutil.rmtree(demo, ignore_errors=True)
    demo.mkdir()
    for quick in ([], ["--quick"]):
        r = subprocess.run([sys.executable, str(ROOT / "demos" / "demo_gaussian_transport.py"), *quick], cwd=demo,
                           capture_output=True, text=True)
        (demo / f"stdout{'_quick' if quick else ''}.txt").write_text(r.stdout + f"exit {r.returncode}\n")
    print("  demo: done", flush=True)


def _numbers(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"[-+]?\d+\.?\d*(?:[eE][-+]?\d+)?", text)]


class Diff:
    """Accumulates mismatches and the largest relative difference seen."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.max_rel = 0.0
        self.max_abs = 0.0
        self.count = 0

    def num(self, where: str, a: float | None, b: float | None) -> None:
        self.count += 1
        if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
            if not (a == b or (a is not None and b is not None and math.isnan(a) and math.isnan(b))):
                self.errors.append(f"{where}: {a!r} != {b!r}")
            return
        d = abs(a - b)
        scale = max(abs(a), abs(b))
        rel = d / scale if scale > 0 else 0.0
        self.max_abs = max(self.max_abs, d)
        self.max_rel = max(self.max_rel, rel)
        if d > RTOL * scale:
            self.errors.append(f"{where}: {a!r} != {b!r} (rel {rel:.2e})")

    def tree(self, where: str, a: object, b: object) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            ka, kb = set(a) - IGNORED, set(b) - IGNORED
            if ka != kb:
                self.errors.append(f"{where}: keys differ: only new {sorted(ka - kb)}, only baseline {sorted(kb - ka)}")
            for k in sorted(ka & kb):
                self.tree(f"{where}.{k}", a[k], b[k])
        elif isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                self.errors.append(f"{where}: lengths {len(a)} != {len(b)}")
            for i, (x, y) in enumerate(zip(a, b, strict=False)):
                self.tree(f"{where}[{i}]", x, y)
        elif isinstance(a, bool | str) or isinstance(b, bool | str):
            if a != b:
                self.errors.append(f"{where}: {a!r} != {b!r}")
        elif (a is None or isinstance(a, int | float)) and (b is None or isinstance(b, int | float)):
            self.num(where, a, b)
        elif a != b:
            self.errors.append(f"{where}: {a!r} != {b!r}")


def _checkpoint(z) -> dict:
    """The checkpoint arrays as a tree (``wall_s`` is ignored by name; the history rows are ``history.csv``'s)."""
    return {k: z[k].tolist() for k in z.files}


def compare(new: Path, base: Path) -> Diff:
    """Compare every job's outputs in ``new`` with those in ``base``."""
    diff = Diff()
    for d in sorted(p for p in base.iterdir() if p.is_dir()):
        n = new / d.name
        for f in sorted(d.iterdir()):
            g = n / f.name
            where = f"{d.name}/{f.name}"
            if f.is_dir():
                continue
            if not g.exists():
                diff.errors.append(f"{where}: missing")
                continue
            if f.name == "report.json":
                diff.tree(where, json.loads(g.read_text()), json.loads(f.read_text()))
            elif f.name == "history.csv":
                ra, rb = list(csv.DictReader(g.open())), list(csv.DictReader(f.open()))
                diff.tree(where, [{k: float(v) for k, v in r.items()} for r in ra],
                          [{k: float(v) for k, v in r.items()} for r in rb])
            elif f.name == "config.toml":
                if g.read_text() != f.read_text():
                    diff.errors.append(f"{where}: the resolved config differs")
            elif f.name in ("exit",) or f.suffix == ".txt":
                ta, tb = g.read_text(), f.read_text()
                na, nb = _numbers(ta), _numbers(tb)
                if re.sub(r"[-+]?\d+\.?\d*(?:[eE][-+]?\d+)?", "#", ta) != re.sub(
                        r"[-+]?\d+\.?\d*(?:[eE][-+]?\d+)?", "#", tb) or len(na) != len(nb):
                    diff.errors.append(f"{where}: text differs:\n{ta}\n---\n{tb}")
                else:
                    for i, (x, y) in enumerate(zip(na, nb, strict=True)):
                        # printed numbers carry 6 digits: equal as printed
                        if x != y:
                            diff.errors.append(f"{where}: number {i}: {x} != {y}")
        ck, cn = d / "checkpoint" / "state.npz", n / "checkpoint" / "state.npz"
        if ck.exists() and cn.exists():
            with np.load(ck) as zb, np.load(cn) as za:
                diff.tree(f"{d.name}/checkpoint", _checkpoint(za), _checkpoint(zb))
        for sub in ("plots", "fields", "checkpoint"):
            if (d / sub).is_dir():
                a = sorted(p.name for p in (d / sub).iterdir())
                b = sorted(p.name for p in (n / sub).iterdir()) if (n / sub).is_dir() else []
                if a != b:
                    diff.errors.append(f"{d.name}/{sub}: files {b} != baseline {a}")
    return diff


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3) or argv[0] not in ("record", "compare") or len(argv) == 3 and argv[0] == "record":
        print(__doc__)
        return 2
    base = Path(argv[1])
    if argv[0] == "record":
        run_jobs(base)
        return 0
    with tempfile.TemporaryDirectory(prefix="mfpde-compare-") as tmp:
        new = Path(argv[2]) if len(argv) == 3 else Path(tmp)
        if len(argv) < 3 or not new.is_dir():
            run_jobs(new)
        diff = compare(new, base)
    print(f"compared {diff.count} numbers in {sum(1 for p in base.iterdir() if p.is_dir())} jobs: "
          f"max |a-b| = {diff.max_abs:.3g}, max relative = {diff.max_rel:.3g} (tolerance {RTOL:g})")
    for e in diff.errors:
        print("DIFF", e)
    print("IDENTICAL to round-off" if not diff.errors else f"{len(diff.errors)} differences")
    return 0 if not diff.errors else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
