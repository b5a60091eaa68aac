"""The ``verify`` job (interface.md): run the registered checks, print the table, write report.json and plots.

Exit status: 0 when every check passed, 3 when one failed (a failed check is a numerical finding; a
check that could not run because a solver failed is a failed check with the error as its detail).
"""

from __future__ import annotations

import difflib
import logging
import sys
import time
from pathlib import Path
from typing import Any

from mpi4py import MPI

from mfpde import __version__
from mfpde.budget import step_budget
from mfpde.errors import ConfigError, NumericalError
from mfpde.io import prepare_output_dir, write_report
from mfpde.petsc import collect_garbage
from mfpde.verify.registry import CHECKS, Check, Outcome

__all__ = ["COLUMNS", "format_table", "run_check", "table_cells", "verify_job"]

logger = logging.getLogger(__name__)


def _load_checks() -> None:
    """Import the check modules (each registers its checks)."""
    from mfpde.verify import (  # noqa: F401
        adjoint,
        batched,
        cfl,
        circle,
        circle_flow,
        conservation,
        deep,
        free_energy,
        particles,
        reach,
        shallow,
        training,
        transport,
    )


def run_check(check: Check, quick: bool, comm: MPI.Comm = MPI.COMM_WORLD) -> dict[str, Any]:
    """Run one check within its budgets and return its ``checks`` record (interface.md). Collective.

    The verdict is a fail, with the reason in ``detail``, when a solve inside the check fails (NumericalError:
    non-finite values, a stalled CFL loop), when the check spends more than its step budget
    (:mod:`mfpde.budget`), when its measured value (or its reference value) is not finite, or when it uses more
    CPU time than its time budget (the slowest rank's process time, which a loaded machine does not inflate as
    it does wall time; quick checks get half of it).
    """
    t, c = time.perf_counter(), time.process_time()
    try:
        with step_budget(check.steps) as used:
            outcome = check.run(quick)
    except NumericalError as e:  # SolverError included: a solve failed inside the check
        outcome = Outcome(float("nan"), None, "", False, f"numerical failure: {e}")
    wall = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
    cpu = comm.allreduce(time.process_time() - c, op=MPI.MAX)
    rec = outcome.record(check)
    budget = check.budget_s / 2 if quick else check.budget_s
    if (rec["measured"] is None or outcome.reference is not None and rec["reference_value"] is None) and rec["passed"]:
        rec["passed"], rec["detail"] = False, "non-finite value: " + rec["detail"]
    if cpu > budget and rec["passed"]:
        rec["passed"], rec["detail"] = False, f"over its time budget ({cpu:.1f} CPU s > {budget:g} s): " + rec["detail"]
    rec.update(wall_s=wall, cpu_s=cpu, steps=used.used, budget_s=budget, step_budget=check.steps)
    return rec


#: The widest table line :func:`format_table` prints (characters).
TABLE_WIDTH = 120

#: The table's columns: heading, and the record's text for it (interface.md).
COLUMNS = ("check", "kind", "measured", "reference", "error", "threshold", "verdict", "s")


def _num(x: float | None, digits: int) -> str:
    return "" if x is None else f"{x:.{digits}g}"


def table_cells(r: dict[str, Any]) -> tuple[str, ...]:
    """One record's cells, in the order of :data:`COLUMNS` (an empty cell: no reference value, so no error).

    Records of reports written before the reference and error columns existed (``value`` only) still read:
    their reference and error cells are empty.
    """
    measured = r.get("measured", r.get("value"))
    kind = r.get("kind", "") + (f" [{r['unit']}]" if r.get("unit") else "")
    return (r["name"], kind, "—" if measured is None else _num(measured, 4), _num(r.get("reference_value"), 4),
            _num(r.get("error"), 2), r["threshold"], "pass" if r["passed"] else "FAIL", f"{r['wall_s']:.1f}")


def format_table(records: list[dict[str, Any]], width: int = TABLE_WIDTH) -> str:
    """The table of interface.md: check, kind, measured, reference, error, threshold, verdict, seconds.

    One kind per column: ``measured`` is of the kind (and unit) its row's ``kind`` names, ``reference`` its
    reference value (empty for a bound), ``error`` = |measured − reference| and ``threshold`` the condition of
    the verdict (on the error, or on the measured value when the reference is empty). The threshold wraps onto
    continuation lines in its column, so that no line is wider than ``width``. The theory sections are in
    ``report.json`` and the docs.
    """
    import textwrap

    rows = [table_cells(r) for r in records]
    k = COLUMNS.index("threshold")
    widths = [max(len(str(x)) for x in col) for col in zip(COLUMNS, *rows, strict=True)]
    room = max(width - (sum(widths) - widths[k]) - 2 * (len(COLUMNS) - 1), 20)
    widths[k] = min(widths[k], room)

    def line(cells: tuple[str, ...] | list[str]) -> str:
        return "  ".join(str(x).ljust(w) for x, w in zip(cells, widths, strict=True)).rstrip()

    lines = [line(COLUMNS), line(["-" * w for w in widths])]
    for row in rows:
        wrapped = textwrap.wrap(row[k], widths[k], break_on_hyphens=False) or [""]
        lines.append(line([*row[:k], wrapped[0], *row[k + 1:]]))
        lines += [line(["" if i != k else more for i in range(len(COLUMNS))]) for more in wrapped[1:]]
    return "\n".join(lines)


def _plot(out: Path, record: dict[str, Any]) -> None:
    """Errors against the step on log axes, with the fitted and the expected slope (rank 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(5, 4))
    for k, s in enumerate(record["series"]):
        x, e = np.asarray(s["x"]), np.asarray(s["err"])
        (line,) = ax.loglog(x, e, "o-", label=f"{s['label']} (fitted slope {s['fitted']:.2f})")
        if s["expected"] is not None:
            ax.loglog(x, e[0] * (x / x[0]) ** s["expected"], ":", color=line.get_color(),
                      label=f"slope {s['expected']:g}" if k == 0 else None)
    ax.set_xlabel(record["series"][0]["xlabel"])
    ax.set_ylabel("error")
    ax.set_title(f"{record['name']} ({'pass' if record['passed'] else 'FAIL'})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    (out / "plots").mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "plots" / f"{record['name']}.png", dpi=100)
    plt.close(fig)


def verify_job(out: Path, quick: bool = False, only: list[str] | None = None, comm: MPI.Comm = MPI.COMM_WORLD,
               plots: bool = True) -> int:
    """Run the checks (all, or ``only``), print the table (rank 0), write ``report.json`` and plots. Collective.

    Args:
        out: the output directory.
        quick: the reduced sizes of each check (a few minutes on 2 cores).
        only: check names to run (default: all registered).
        comm: the ranks (every check runs on all of them).
        plots: write ``plots/<check>.png`` for checks with a convergence series.

    Returns:
        0 when every check passed, 3 otherwise.

    Raises:
        ConfigError: an unknown check name, or DIR not writable.
    """
    t0 = time.perf_counter()
    _load_checks()
    names = list(only) if only else list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:  # every unknown name, each with its closest known one
        named = []
        for u in unknown:
            close = difflib.get_close_matches(u, list(CHECKS), n=1)
            named.append(f"{u!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ConfigError(f"--only: unknown check{'s' if len(unknown) > 1 else ''} {', '.join(named)} "
                          f"(known: {', '.join(CHECKS)})")
    out = Path(out)
    prepare_output_dir(out, comm)
    records = []
    for name in names:
        logger.info("check %s ...", name)
        rec = run_check(CHECKS[name], quick, comm)
        collect_garbage()  # the check's solvers, on every rank (mfpde.petsc: MPICH's context ids)
        logger.info("check %s: %s (%s)", name, "pass" if rec["passed"] else "FAIL", rec["detail"])
        records.append(rec)
        if plots and rec["series"] and comm.rank == 0:
            _plot(out, rec)
    passed = all(r["passed"] for r in records)
    report = {"status": "ok", "command": "verify", "version": __version__, "comm_size": comm.size,
              "wall_s": time.perf_counter() - t0, "quick": quick, "checks": records, "passed": passed}
    write_report(out, report, comm)
    if comm.rank == 0:
        print(format_table(records), file=sys.stdout, flush=True)
        print(f"{sum(r['passed'] for r in records)}/{len(records)} checks passed -> {out / 'report.json'}",
              file=sys.stdout, flush=True)
    return 0 if passed else 3
