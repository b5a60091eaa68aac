"""The layout rules of issue 10: no module over 400 lines, no import cycle, plots never solve, the scheme
registry, and a run returning a result object."""

from __future__ import annotations

import ast
from pathlib import Path

from mpi4py import MPI

import pytest
from configs import DEEP

from mfpde import config as C
from mfpde.jobs.run import RunResult, run_job
from mfpde.training.splitting import SCHEMES, Splitting

PKG = Path(__file__).resolve().parent.parent / "mfpde"
MODULES = {".".join(f.relative_to(PKG.parent).with_suffix("").parts).removesuffix(".__init__"): f
           for f in PKG.rglob("*.py")}


def _imports(path: Path) -> set[str]:
    """mfpde modules imported by a file, at run time or for type checking alike."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mfpde"):
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("mfpde"))
    return out & set(MODULES)


def test_no_module_over_400_lines():
    long = {m: n for m, f in MODULES.items() if (n := len(f.read_text().splitlines())) > 400}
    assert not long, long


def test_no_import_cycle():
    graph = {m: _imports(f) - {m} for m, f in MODULES.items()}
    state: dict[str, int] = {}  # 1 on the stack, 2 done

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in graph[m]:
            if state.get(d) == 1:
                raise AssertionError(f"import cycle: {' -> '.join([*stack[stack.index(d):], d])}")
            if d not in state:
                visit(d, [*stack, d])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [m])


def test_plots_take_arrays():
    """The plotting modules import nothing of mfpde but each other, and no solver."""
    mods = {"plots.py", "plot_layout.py", "plot_loss.py"}
    for name in mods:
        src = (PKG / name).read_text()
        assert _imports(PKG / name) <= {f"mfpde.{m[:-3]}" for m in mods}, name
        assert "dolfinx" not in src, name


def test_scheme_registry():
    assert {n: s.order for n, s in SCHEMES.items()} == {"lie": 1, "strang": 2}
    assert all(s.source for s in SCHEMES.values())
    with pytest.raises(KeyError, match="needs the sub-flows"):
        Splitting("strang", {})


def test_run_returns_a_result(tempdir):
    cfg = C.load(DEEP, ["tokens.cells=[8, 8]", "heads.cells=[8, 8]", "depth.steps=4", "data.samples=2",
                        "data.test_samples=2", "training.steps=2", "output.plots=false", "output.fields=false"])
    res = run_job(cfg, tempdir, comm=MPI.COMM_WORLD)
    assert isinstance(res, RunResult) and res.status == "ok" and res.steps_done == 2
    assert [int(h["step"]) for h in res.history] == [0, 2] and res.report["final"]["risk"] == res.history[-1]["risk"]
    assert set(res.timings) == {"fokker_planck"} and res.timings["fokker_planck"] > 0
    assert set(res.report["accuracy"]) == {"train", "test", "initial", "initial_best_sign", "gain",
                                           "agrees_with_flipped_initial"}  # initial: of ρ_0 (issue 13)


def test_tests_mirror_the_package():
    """tests/ mirrors the package: a folder of tests for every subpackage of mfpde, and no test folder without one."""
    tests = Path(__file__).resolve().parent
    subpackages = {p.name for p in PKG.iterdir() if (p / "__init__.py").exists()}
    folders = {p.name for p in tests.iterdir() if p.is_dir() and any(p.glob("test_*.py"))}
    assert subpackages == folders, (sorted(subpackages - folders), sorted(folders - subpackages))


#: The jobs floor and what stands above it or beside it at the door: they may read a whole config. The verify
#: checks (mfpde.verify) are the verify job's: each builds the config of its own problem.
READS_THE_CONFIG = ("mfpde.jobs", "mfpde.config", "mfpde.verify", "mfpde.cli", "mfpde.api", "mfpde.launch",
                    "mfpde.__main__")
#: What a module below the jobs floor may take of the config package: the types of its sections and the parsers of
#: a value.
SECTION_TYPES = {"mfpde.config.schema", "mfpde.config.rules"}


def test_nothing_below_the_jobs_floor_reads_a_whole_config():
    """Below the jobs floor a module takes its section (a domain's, training's, the twin's), never the config.

    Each package's ``section(cfg)`` is the one place that reads the whole config (the domains' ``config`` modules,
    ``mfpde.training.config``, ``mfpde.twin.config``): it is called by the jobs floor and uses only the config's
    attributes, so it imports nothing of mfpde.config but the section types.
    """
    below = {m: f for m, f in MODULES.items() if not m.startswith(READS_THE_CONFIG)}
    taken = {m: sorted(i for i in _imports(f) if i.startswith("mfpde.config") and i not in SECTION_TYPES
                       and not any(i.startswith(f"{t}.") for t in SECTION_TYPES))
             for m, f in below.items()}
    offending = {m: i for m, i in taken.items() if i}
    assert not offending, offending
