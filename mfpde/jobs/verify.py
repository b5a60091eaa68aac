"""The ``verify`` job (interface.md): run the registered checks, print the table, write report.json and plots.

Exit status: 0 when every check passed, 3 when one failed (a failed check is a numerical finding; a
check that could not run because a solver failed, or that raised any other exception, is a failed check with
the error as its detail, and the remaining checks still run).
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from mpi4py import MPI

from mfpde.budget import StepBudget, step_budget
from mfpde.errors import ConfigError, NumericalError
from mfpde.jobs.scaffold import JobDir
from mfpde.petsc import collect_garbage
from mfpde.verify.registry import CHECKS, Check, Outcome
from mfpde.verify.table import format_table

__all__ = ["WALL_FACTOR", "OverBudget", "run_check", "time_limits", "verify_job"]

logger = logging.getLogger(__name__)

#: The loggers of the solvers a check drives: their info lines (a training problem's "linear solvers", a run's
#: steps), repeated by every check, are quieted to warnings while the checks run; verify logs one line a check.
INNER_LOGGERS = ("mfpde.training", "mfpde.tokens", "mfpde.params", "mfpde.tokens.box.problem", "mfpde.fields")


class Progress(Protocol):
    """A progress display (``mfpde.cli``'s tqdm bar): ``update`` per check, ``describe`` the running one, ``close``."""

    def update(self, n: int = 1) -> object:
        """Advance by n checks."""
        ...

    def describe(self, text: str) -> None:
        """Show what runs now."""
        ...

    def close(self) -> None:
        """End the display."""
        ...


def _load_checks() -> None:
    """Import the check modules (each registers its checks)."""
    from mfpde.verify import (  # noqa: F401
        adjoint,
        batched,
        box_kernel,
        cfl,
        circle,
        circle_edges,
        circle_flow,
        conservation,
        continuation_branches,
        continuation_checks,
        deep,
        free_energy,
        gibbs,
        hypersphere,
        hypersphere_fv,
        hypersphere_rates,
        noise,
        noise_energy,
        particles,
        reach,
        shallow,
        sphere_dg,
        sphere_flow,
        sphere_kernel,
        sphere_solvers,
        sphere_zonal,
        training,
        transport,
        twin,
    )


#: Seconds a rank whose check raised waits for the other ranks to end the check (``MFPDE_MPI_EXIT_TIMEOUT``).
AGREE_TIMEOUT_S = 60.0


def _others_arrive(comm: MPI.Comm) -> bool:
    """Whether every rank reaches the end of the check within :data:`AGREE_TIMEOUT_S` (a non-blocking barrier).

    Called by a rank whose check raised; the others call it when their check ends (see :func:`run_check`). False
    when they do not come: they wait in a collective of the check that this rank left, and agreeing on the
    verdict would hang, so the exception ends the job instead (exit 1 on every rank, :func:`mfpde.cli.main`).
    """
    if comm.size == 1:
        return True
    try:
        timeout = float(os.environ.get("MFPDE_MPI_EXIT_TIMEOUT", AGREE_TIMEOUT_S))
    except ValueError:
        timeout = AGREE_TIMEOUT_S
    req, t0 = comm.Ibarrier(), time.monotonic()
    while not req.Test():
        if time.monotonic() - t0 > timeout:
            return False
        time.sleep(0.01)
    return True


#: A check's wall-clock limit as a multiple of its CPU budget (``MFPDE_VERIFY_WALL_FACTOR``): a loaded machine
#: stretches the wall time of a check by its load, and past this factor the check fails instead of running on.
WALL_FACTOR = 4.0


class OverBudget(BaseException):  # noqa: N818  not an Exception: a check's ``except Exception`` must not swallow it
    """A check ran past its CPU budget or its wall-clock limit (raised by :func:`time_limits`' timers).

    Attributes:
        what: ``"CPU"`` or ``"wall"``; limit: the limit in seconds.
    """

    def __init__(self, what: str, limit: float) -> None:
        super().__init__(f"{what} time limit {limit:g} s")
        self.what, self.limit = what, limit


def _wall_factor() -> float:
    try:
        k = float(os.environ.get("MFPDE_VERIFY_WALL_FACTOR", WALL_FACTOR))
    except ValueError:
        return WALL_FACTOR
    return k if k > 0 else WALL_FACTOR


@contextlib.contextmanager
def time_limits(cpu_s: float, wall_s: float) -> Iterator[None]:
    """Within the block, raise :class:`OverBudget` past ``cpu_s`` CPU seconds or ``wall_s`` wall seconds.

    CPU: ``ITIMER_PROF`` (user + system time of all threads, what ``time.process_time`` counts); wall:
    ``ITIMER_REAL``. The signal is handled at the next Python instruction (a long call into
    compiled code finishes first). Outside the main thread, or where the timers do not exist, no limit is set.
    The previous handlers and timers are restored (a timer already running outside is not nested: it is cleared).
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        raise OverBudget("CPU" if signum == signal.SIGPROF else "wall", cpu_s if signum == signal.SIGPROF else wall_s)

    old = {s: signal.signal(s, handler) for s in (signal.SIGPROF, signal.SIGALRM)}
    try:
        if math.isfinite(cpu_s):
            signal.setitimer(signal.ITIMER_PROF, max(cpu_s, 1e-3))
        if math.isfinite(wall_s):
            signal.setitimer(signal.ITIMER_REAL, max(wall_s, 1e-3))
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        for s, h in old.items():
            signal.signal(s, h)


def run_check(check: Check, quick: bool, comm: MPI.Comm = MPI.COMM_WORLD) -> dict[str, Any]:
    """Run one check within its budgets and return its ``checks`` record (interface.md). Collective.

    The verdict is a fail, with the reason in ``detail``, when a solve inside the check fails (NumericalError:
    non-finite values, a stalled CFL loop), when the check spends more than its step budget
    (:mod:`mfpde.budget`), when its measured value (or its reference value) is not finite, or when it uses more
    CPU time than its time budget (the slowest rank's process time, which a loaded machine does not inflate as
    it does wall time; quick checks get half of it), or when its wall time passes :data:`WALL_FACTOR` times that
    budget (a loaded machine, or a check that waits). Both are enforced while the check runs, by timers
    (:func:`time_limits`): the check is stopped there, and its row says which limit stopped it and when. Any
    other exception raised by the check (a fit on NaN errors, a log of a negative gap: a bug in the check or in
    the code it checks) is its failure too: ``detail`` and ``threshold`` say ``raised <type>: <message>``,
    ``exception`` holds the type and message (None when the check ran to its verdict), and the traceback goes
    to the debug log. The ranks agree on it (the lowest rank's exception is reported). Interruptions
    (:class:`~mfpde.signals.Interrupted`, KeyboardInterrupt) pass through.
    """
    t, c = time.perf_counter(), time.process_time()
    budget = check.budget_s / 2 if quick else check.budget_s
    wall_limit = _wall_factor() * budget
    raised: dict[str, str] | None = None
    used: StepBudget | None = None
    try:
        with time_limits(budget, wall_limit), step_budget(check.steps) as used:
            outcome = check.run(quick)
    except OverBudget as e:  # stopped by a timer: a verdict (fail), on every rank
        raised = {"type": "OverBudget", "message": (
            f"{time.process_time() - c:.1f} CPU s, stopped at its budget of {budget:g} CPU s" if e.what == "CPU" else
            f"{time.perf_counter() - t:.1f} wall s, stopped at {_wall_factor():g} × its budget of {budget:g} CPU s "
            f"(the machine is loaded or the check waits)")}
        if not _others_arrive(comm):
            raise
    except NumericalError as e:  # SolverError included: a solve failed inside the check
        outcome = Outcome(float("nan"), None, "", False, f"numerical failure: {e}")
    except Exception as e:  # the check's failure, not the job's: the rest still run
        logger.debug("check %s raised", check.name, exc_info=True)
        raised = {"type": type(e).__name__, "message": str(e)[:500]}
        if not _others_arrive(comm):  # they wait in one of the check's collectives: end the job (mfpde.cli)
            raise
    if raised is None and comm.size > 1:  # the barrier of _others_arrive, for the ranks that did not raise
        comm.Ibarrier().Wait()
    every = comm.allgather(raised)
    first = next((r for r in every if r is not None), None)
    if first is not None:
        rank = every.index(first)
        where = f" (rank {rank} of {comm.size})" if comm.size > 1 else ""
        if first["type"] == "OverBudget":  # not an exception of the check: its time ran out
            text = f"over its time budget: {first['message']}{where}"
            first = None
        else:
            text = f"raised {first['type']}: {first['message']}{where}"
        outcome = Outcome(float("nan"), None, text, False, text)
    wall = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
    cpu = comm.allreduce(time.process_time() - c, op=MPI.MAX)
    rec = outcome.record(check)
    rec["exception"] = first
    if (rec["measured"] is None or outcome.reference is not None and rec["reference_value"] is None) and rec["passed"]:
        rec["passed"], rec["detail"] = False, "non-finite value: " + rec["detail"]
    if cpu > budget and rec["passed"]:  # past the budget between two checks of the timer (or without timers)
        over = f"over its time budget ({cpu:.1f} CPU s > {budget:g} s)"
        rec["passed"], rec["detail"] = False, f"{over}: " + rec["detail"]
        rec["threshold"] = f"{over}; {rec['threshold']}"
    rec.update(wall_s=wall, cpu_s=cpu, steps=used.used if used is not None else 0, budget_s=budget,
               step_budget=check.steps, wall_limit_s=wall_limit)
    return rec


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


@contextlib.contextmanager
def _inner_logs_quiet() -> Iterator[None]:
    """Within the block, the loggers of :data:`INNER_LOGGERS` pass warnings only (their levels are restored).

    Not when they are set to debug: whoever debugs sees every line.
    """
    loggers = [logging.getLogger(n) for n in INNER_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        if lg.getEffectiveLevel() > logging.DEBUG:
            lg.setLevel(max(logging.WARNING, lg.getEffectiveLevel()))
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def verify_job(out: Path, quick: bool = False, only: list[str] | None = None, comm: MPI.Comm = MPI.COMM_WORLD,
               plots: bool = True, progress: Callable[[int], Progress] | None = None) -> int:
    """Run the checks (all, or ``only``), print the table (rank 0), write ``report.json`` and plots. Collective.

    Logs one line per check when it ends, ``[k/n] name ... passed (3.1 s)`` (``FAILED (…): detail`` otherwise);
    the solvers' own info lines are quieted while the checks run.

    Args:
        out: the output directory.
        quick: the reduced sizes of each check (a few minutes on 2 cores).
        only: check names to run (default: all registered).
        comm: the ranks (every check runs on all of them).
        plots: write ``plots/<check>.png`` for checks with a convergence series.
        progress: makes a progress display for n checks (rank 0's tqdm bar on a terminal), or None.

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
    job = JobDir(None, out, comm, "verify")
    records: list[dict[str, Any]] = []
    bar = progress(len(names)) if progress is not None else None
    try:
        for k, name in enumerate(names, 1):
            logger.debug("check %s ...", name)
            if bar is not None:
                bar.describe(name)
            with _inner_logs_quiet():
                rec = run_check(CHECKS[name], quick, comm)
            collect_garbage()  # the check's solvers, on every rank (mfpde.petsc: MPICH's context ids)
            verdict = "passed" if rec["passed"] else "FAILED"
            logger.info("[%d/%d] %s ... %s (%.1f s)%s", k, len(names), name, verdict, rec["wall_s"],
                        "" if rec["passed"] else f": {rec['detail']}")
            records.append(rec)
            if plots and rec["series"] and comm.rank == 0:
                _plot(out, rec)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    passed = all(r["passed"] for r in records)
    job.t0 = t0  # the checks' loading counts
    job.finish(quick=quick, checks=records, passed=passed)
    if comm.rank == 0:
        print(format_table(records), file=sys.stdout, flush=True)
        raised = [r["name"] for r in records if r.get("exception")]
        print(f"{sum(r['passed'] for r in records)}/{len(records)} checks passed"
              + (f" ({len(raised)} raised an exception: {', '.join(raised)})" if raised else "")
              + f" -> {out / 'report.json'}", file=sys.stdout, flush=True)
    return 0 if passed else 3
