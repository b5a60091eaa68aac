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

With ``--baseline REV`` the script first compares the CPU time (user + system of the process and its children,
one BLAS thread) of the default at ``--steps`` training steps (40 and 300) with the baseline's, both on the same
config (``--config``, default this tree's embedded default: the baseline's own may be another problem), the two
codes run alternately ``--repeat`` times (a load that comes and goes biases neither; the least CPU of each kept),
each run's final risk compared (relative difference; both trees' bytecode compiled first, as an installed package
has it), the machine's load average before and after, the start-up CPU (``import mfpde.cli`` and the CLI's
imports in a fresh process) of both, and a profile of the shortest run of each (``bench/profile_run.py``:
where the CPU time goes, by category).

Writes ``out/bench/run.json`` and prints markdown tables. Run: ``python bench/bench_run.py [--ranks 1 2]
[--config demos/digits_deep.toml] [--baseline a3bc738 [--steps 40 300] [--repeat 2]]`` (``--ranks`` with no
value skips the cold and multi-rank runs).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from baseline import baseline_tree  # noqa: E402

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


def _cpu(cmd: list[str], env: dict[str, str], cwd: Path) -> float:
    """CPU seconds (user + system) of the command and its waited-for children."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, env=env, check=True, cwd=cwd, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _env(tree: Path) -> dict[str, str]:
    """The environment of a run of the code in tree: one BLAS thread, malloc as ``mfpde`` sets it."""
    return dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                MALLOC_MMAP_THRESHOLD_="67108864", MALLOC_TRIM_THRESHOLD_="268435456")


def cpu_run(tree: Path, steps: int, config: str | None) -> dict:
    """CPU seconds and final risk of ``mfpde run [config] --set training.steps=steps`` of the code in tree."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        cmd = [sys.executable, "-m", "mfpde", "run", *([config] if config else []), "--quiet", "--out", str(out),
               "--set", f"training.steps={steps}"]
        cpu = _cpu(cmd, _env(tree), tree)
        risk = json.loads((out / "report.json").read_text())["final"]["risk"]
    return {"steps": steps, "cpu_s": cpu, "risk": risk}


def startup(tree: Path) -> float:
    """CPU seconds of a fresh process importing the CLI and what ``mfpde run`` imports before its set-up."""
    code = ("import importlib, importlib.util, mfpde.cli; "  # the run job's module of either tree
            "importlib.import_module('mfpde.jobs.run' if importlib.util.find_spec('mfpde.jobs') else "
            "'mfpde.training.driver')")
    return _cpu([sys.executable, "-c", code], _env(tree), tree)


def profile(tree: Path, steps: int, config: str) -> dict[str, float]:
    """``bench/profile_run.py`` of the code in tree: CPU seconds by category."""
    cmd = [sys.executable, str(ROOT / "bench" / "profile_run.py"), config, "--set", f"training.steps={steps}"]
    out = subprocess.run(cmd, env=_env(tree), cwd=tree, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(base: Path, name: str, steps: list[int], repeat: int, config: str) -> dict:
    """The CPU comparison against the baseline tree (see the module), printed as markdown tables."""
    res: dict = {"baseline": name, "config": config, "runs": [], "startup": {}, "load": [os.getloadavg()[0]]}
    for tree in (base, ROOT):  # bytecode as an installed package has it (PYTHONDONTWRITEBYTECODE would compile
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "mfpde")], check=True)  # every run)
    for _ in range(repeat):
        for code, tree in ((name, base), ("tree", ROOT)):
            res["startup"].setdefault(code, []).append(startup(tree))
            for n in steps:
                res["runs"].append({"code": code, **cpu_run(tree, n, config)})
    res["load"].append(os.getloadavg()[0])  # the machine's 1-minute load before and after the runs
    print(f"| training steps | {name}: CPU [s] | this tree: CPU [s] | ratio | final risk, relative difference |\n"
          "|---|---|---|---|---|")
    for n in steps:
        b = [r for r in res["runs"] if r["steps"] == n and r["code"] == name]
        t = [r for r in res["runs"] if r["steps"] == n and r["code"] == "tree"]
        cb, ct = min(r["cpu_s"] for r in b), min(r["cpu_s"] for r in t)
        diff = max(abs(x["risk"] - y["risk"]) / abs(y["risk"]) for x in t for y in b)
        print(f"| {n} | {cb:.2f} | {ct:.2f} | {ct / cb:.2f} ({cb / ct:.1f}× faster) | {diff:.1e} |")
    sb, st = (min(res["startup"][c]) for c in (name, "tree"))
    print(f"\nconfig {config}; load average (1 min) before and after the runs: {res['load'][0]:.1f}, "
          f"{res['load'][1]:.1f}")
    print(f"\nstart-up (CPU of `import mfpde.cli, mfpde.jobs.run`): {name} {sb:.2f} s, this tree {st:.2f} s")
    res["profile"] = {code: profile(tree, min(steps), config) for code, tree in ((name, base), ("tree", ROOT))}
    cats = list(dict.fromkeys([*res["profile"][name], *res["profile"]["tree"]]))
    print(f"\nwhere the CPU goes, {min(steps)} training steps (bench/profile_run.py):\n\n"
          f"| | {name} [s] | this tree [s] |\n|---|---|---|")
    for c in [c for c in cats if c != "total"] + ["total"]:
        print(f"| {c} | {res['profile'][name].get(c, 0.0):.2f} | {res['profile']['tree'].get(c, 0.0):.2f} |")
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", nargs="*", type=int, default=[1, 2])
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--config", default=None, help="a config file (default: the embedded default); issue 12's "
                        "throughput was measured on demos/digits_deep.toml, the default when it was filed")
    parser.add_argument("--baseline", default=None, metavar="REV",
                        help="also run the code of this commit (one rank, warm), e.g. a3bc738, and compare CPU times")
    parser.add_argument("--steps", nargs="*", type=int, default=[40, 300], help="training steps of the CPU comparison")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each code per CPU comparison (least kept)")
    args = parser.parse_args()
    rows: list[dict] = []
    comparison = None
    if args.baseline:
        with tempfile.TemporaryDirectory() as tmp, baseline_tree(args.baseline) as base:
            assert base is not None
            config = args.config  # default: this tree's embedded default, for both codes (the same problem)
            if config is None:
                config = str(Path(tmp) / "default.toml")
                shutil.copy(ROOT / "mfpde" / "defaults" / "run.toml", config)
            comparison = compare(base, args.baseline, args.steps, args.repeat, config)
            if args.ranks:
                rows.append(run(1, False, args.overrides, args.config, base))
    if not args.ranks:
        _write(rows, comparison)
        return
    rows += [run(1, True, args.overrides, args.config)] + [run(r, False, args.overrides, args.config)
                                                           for r in args.ranks]
    print("| code | ranks | JIT cache | total [s] | start-up [s] | end [s] | images·steps/s | final risk |\n"
          "|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['code']} | {r['ranks']} | {'empty' if r['cold'] else 'warm'} | {r['total_s']:.1f} | "
              f"{r['startup_s']:.1f} | {r['end_s']:.1f} | {r['images_steps_per_s']:.1f} | {r['risk']:.9g} |")
    if args.baseline and rows:
        b = rows[0]["images_steps_per_s"]
        print("\ntraining throughput against " + args.baseline + ": " + ", ".join(
            f"{r['ranks']} rank(s) {r['images_steps_per_s'] / b:.1f}×" for r in rows[1:] if not r["cold"]))
    warm = {r["ranks"]: r for r in rows if not r["cold"] and r["code"] == "tree"}
    if 1 in warm and 2 in warm:
        eff = warm[1]["total_s"] / (2 * warm[2]["total_s"])
        thr = warm[2]["images_steps_per_s"] / (2 * warm[1]["images_steps_per_s"])
        print(f"\nparallel efficiency 1 → 2 ranks: {eff:.2f} (total wall), {thr:.2f} (training throughput)")
    _write(rows, comparison)


def _write(rows: list[dict], comparison: dict | None) -> None:
    out = ROOT / "out" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(json.dumps({"runs": rows, "cpu_comparison": comparison}, indent=2))


if __name__ == "__main__":
    main()
