"""The time limits of a verify check: its CPU budget and a wall-clock multiple of it, enforced while it runs."""

from __future__ import annotations

import time

import pytest

from mfpde.jobs.verify import run_check
from mfpde.verify.registry import Check, Outcome

pytestmark = pytest.mark.serial


def _check(run, budget_s: float) -> Check:
    return Check("budget_probe", "-", "-", run, "ratio to bound", budget_s=budget_s, distributed=False)


def test_a_check_past_its_wall_limit_is_stopped_with_the_reason(monkeypatch):
    """A check that waits (sleeps) is stopped at WALL_FACTOR × its CPU budget, even inside ``except Exception``."""
    monkeypatch.setenv("MFPDE_VERIFY_WALL_FACTOR", "2")

    def waits(quick: bool) -> Outcome:
        for _ in range(100):
            try:
                time.sleep(0.1)
            except Exception:  # a check's own handler must not swallow the limit
                pass
        return Outcome(0.0, None, "≤ 1", True, "done")

    t0 = time.perf_counter()
    rec = run_check(_check(waits, 0.4), quick=True)  # quick: 0.2 CPU s, wall 0.4 s
    assert time.perf_counter() - t0 < 5.0
    assert rec["passed"] is False and "wall s, stopped at 2 × its budget of 0.2 CPU s" in rec["detail"], rec
    assert rec["threshold"].startswith("over its time budget") and rec["exception"] is None
    assert rec["wall_limit_s"] == pytest.approx(0.4)


def test_a_check_past_its_cpu_budget_is_stopped_with_the_reason(monkeypatch):
    """A check that computes past its CPU budget is stopped there (not after it ends), and says so."""
    monkeypatch.setenv("MFPDE_VERIFY_WALL_FACTOR", "1000")

    def spins(quick: bool) -> Outcome:
        x, t0 = 0.0, time.process_time()
        while time.process_time() - t0 < 20.0:
            x += 1.0
        return Outcome(x, None, "≤ 1", True, "done")

    rec = run_check(_check(spins, 0.6), quick=True)  # quick: 0.3 CPU s
    assert rec["passed"] is False and "CPU s, stopped at its budget of 0.3 CPU s" in rec["detail"], rec
    assert rec["cpu_s"] < 5.0


def test_timers_are_cleared_after_a_check():
    """After a check (passed or stopped) no timer is left running and the handlers are restored."""
    import signal

    before = {s: signal.getsignal(s) for s in (signal.SIGPROF, signal.SIGALRM)}
    rec = run_check(_check(lambda quick: Outcome(0.5, None, "≤ 1", True, "ok", tolerance=1.0), 10.0), quick=True)
    assert rec["passed"] is True
    assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0) and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert {s: signal.getsignal(s) for s in before} == before
