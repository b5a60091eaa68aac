"""Property-based configs (issue 14): small `transport` configs drawn by hypothesis, half of them with one key
spoilt. A spoilt config ends with exit 2; the others with 0 or 3, or 2 when the drawn Gaussian lies mostly
outside the drawn box. Never 1 (a bug: main raises, or aborts under MPI), never a hang (an alarm fails the
example after ALARM_S seconds). Exit 2 is one line and leaves no report.

Under MPI every rank draws the same examples (``derandomize``) and runs them together, so each example's checks
must end the same way on every rank: a check that fails on one rank only (the stderr line is checked on rank 0)
sends that rank into Hypothesis's shrinking while the others draw the next example, and the ranks then meet in
the collectives of different examples (the suite under ``mpiexec -n 2`` once had one rank sit in this test until
the 600 s abort of conftest). Shrinking cannot be made to agree across ranks: it and the search for further
failures stop on wall-clock limits (``MAX_SHRINKING_SECONDS``, 10 s after the first failure), which the ranks reach
at different examples. So each example's verdict is agreed (allgathered) before it is asserted, and under MPI the
shrink and explain phases are off: the first failing example fails the test on every rank at once.
"""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

from mpi4py import MPI

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from mfpde.cli import main

pytestmark = pytest.mark.ranks  # the rank count can change what it checks: run again under mpiexec

ROOT = Path(__file__).resolve().parents[2]
DEMO = str(ROOT / "demos" / "transport_small.toml")
ALARM_S = 120

finite = st.floats(min_value=-6.0, max_value=6.0, allow_nan=False)
#: Valid values of each drawn key, and invalid ones (an example spoils at most one key, half of the time).
VALID = {"cells": st.integers(2, 40), "degree": st.integers(0, 1), "cfl": st.sampled_from([0.05, 0.4, 1.0]),
         "steps": st.integers(1, 10), "T": st.sampled_from([0.25, 1.0, 3.0]), "lo": st.floats(-6.0, 0.0),
         "width": st.floats(1.0, 10.0), "mean": finite, "var": st.sampled_from([0.01, 0.25, 4.0]),
         "head": st.tuples(finite, finite), "weight": st.sampled_from([0.5, 1.0])}
INVALID = {"cells": st.integers(-2, 1), "degree": st.sampled_from([-1, 2]),
           "cfl": st.sampled_from([-0.1, 0.0, 1e-300, 1.5, math.nan, math.inf]),
           "steps": st.sampled_from([-1, 0, 10**12]),
           "T": st.sampled_from([-1.0, 0.0, 1e7, math.inf]), "width": st.sampled_from([-1.0, 0.0, 1e309]),
           "var": st.sampled_from([-0.1, 0.0]), "weight": st.sampled_from([-1.0, 0.0])}
configs = st.tuples(st.fixed_dictionaries(VALID), st.one_of(st.none(), st.sampled_from(list(INVALID)))).flatmap(
    lambda vb: st.just((vb[0], None)) if vb[1] is None else
    INVALID[vb[1]].map(lambda x, vb=vb: ({**vb[0], vb[1]: x}, vb[1])))


CODES: list[int] = []


def _alarm(signum, frame):
    raise TimeoutError(f"a config ran for more than {ALARM_S} s")


#: Hypothesis's phases: under MPI no shrinking or explaining, whose wall-clock limits differ between the ranks.
PHASES = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink, Phase.explain] if MPI.COMM_WORLD.size == 1
                                                          else [])


def _agree(problem: str) -> None:
    """Assert on every rank that no rank found a problem (the verdict is collective, so all ranks fail together)."""
    problems = [f"rank {r}: {p}" for r, p in enumerate(MPI.COMM_WORLD.allgather(problem)) if p]
    assert not problems, "; ".join(problems)


@settings(max_examples=40, deadline=None, derandomize=True, database=None, phases=PHASES,
          report_multiple_bugs=MPI.COMM_WORLD.size == 1,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(drawn=configs)
def test_drawn_transport_configs_end_0_2_or_3(tempdir, capfd, drawn):
    c, spoilt = drawn
    hi = c["lo"] + c["width"]
    sets = [f"tokens.cells=[{c['cells']}]", f"tokens.degree={c['degree']}", f"tokens.cfl={c['cfl']}",
            f"depth.steps={c['steps']}", f"depth.T={c['T']}", f"tokens.box=[[{c['lo']!r}, {hi!r}]]",
            f"data.mean=[[{c['mean']!r}]]", f"data.cov=[[[{c['var']!r}]]]", "output.fields=false",
            f"heads.init={{kind = 'diracs', points = [[{c['head'][0]!r}, {c['head'][1]!r}]], "
            f"weights = [{c['weight']!r}]}}"]
    comm = MPI.COMM_WORLD
    if comm.rank == 0:
        (tempdir / "out" / "report.json").unlink(missing_ok=True)  # the previous example's
    comm.Barrier()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(ALARM_S)
    try:
        code = main(["transport", DEMO, "--out", str(tempdir / "out"), *[a for s in sets for a in ("--set", s)]])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    err = capfd.readouterr().err
    codes = comm.allgather(code)
    assert codes == [code] * comm.size, (codes, c, err)
    # every further check is made on each rank into `problem`, then agreed
    problem = ""
    report = tempdir / "out" / "report.json"
    if spoilt is not None and code != 2:
        problem = f"spoilt {spoilt} ended {code}: {c} {err}"
    elif code not in (0, 2, 3):
        problem = f"exit {code}: {c} {err}"
    elif comm.rank == 0 and code == 2 and (len(err.strip().splitlines()) != 1 or "Traceback" in err):
        problem = f"exit 2 is not one line: {c} {err!r}"
    elif code == 0 and json.loads(report.read_text())["status"] != "ok":
        problem = f"exit 0 with status {json.loads(report.read_text())['status']!r}: {c}"
    elif code == 2 and report.exists():
        problem = f"exit 2 left a report: {c}"
    _agree(problem)
    CODES.append(code)


def test_the_draws_cover_every_outcome():
    """The drawn configs must exercise success and input errors (else the property test proves little)."""
    if not CODES:
        pytest.skip("run with the property test")
    assert {0, 2} <= set(CODES), CODES
