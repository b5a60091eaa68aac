"""Numerical failure is exit 3 with status "failed", never status "ok" with inf/NaN in the results (issue 14)."""

from __future__ import annotations

import csv
import json

from mpi4py import MPI

import pytest
from configs import DEEP

from mfpde.cli import main

pytestmark = pytest.mark.ranks  # the rank count can change what it checks: run again under mpiexec

SMALL = ["tokens.cells=[8, 8]", "heads.cells=[8, 8]", "depth.steps=4", "data.samples=2", "data.test_samples=0",
         "training.steps=2", "output.plots=false", "output.fields=false"]


def test_extreme_lambda2_is_a_numerical_failure(tempdir, capfd, monkeypatch):
    """training.lambda2 = 1e160 ended with status ok and an inf/NaN grad_norm in history.csv. It is refused at the
    door now (exit 2: the Gibbs density underflows, mfpde.config.rules.check_training); with that bound lifted,
    the solver's own guard still ends it as a numerical failure with the last good state."""
    sets = [a for s in [*SMALL, "training.lambda2=1e160"] for a in ("--set", s)]
    assert main(["run", DEEP, "--out", str(tempdir / "door"), "--quiet", *sets]) == 2
    assert "training.lambda2" in capfd.readouterr().err or MPI.COMM_WORLD.rank > 0
    monkeypatch.setattr("mfpde.config.check_training", lambda cfg: None)
    code = main(["run", DEEP, "--out", str(tempdir), "--quiet", *sets])
    err = capfd.readouterr().err
    assert MPI.COMM_WORLD.allgather(code) == [3] * MPI.COMM_WORLD.size, err
    report = json.loads((tempdir / "report.json").read_text())
    assert report["status"] == "failed" and "non-finite" in report["error"], report
    if MPI.COMM_WORLD.rank == 0:
        assert "numerical failure: non-finite" in err and len(err.strip().splitlines()) == 1, err
    for row in csv.DictReader((tempdir / "history.csv").open()):
        assert all(v not in ("inf", "-inf", "nan") for v in row.values()), row
    # which and where, and the last good state saved: ρ_0 (finite, mass 1) at training step 0
    assert "training step 0" in report["error"], report["error"]
    import numpy as np

    with np.load(tempdir / "checkpoint" / "state.npz") as ck:
        assert int(ck["step"]) == 0 and np.all(np.isfinite(ck["rho"])) and np.all(ck["rho"] >= 0), ck["rho"]


def test_saturated_heads_run(tempdir, capfd):
    """One token at x = −3 on [−4, 4] (100 cells, DG0), one depth step, value heads at a = 300 (issue 14): exit 0.

    It ended with exit 3: the reverse pass exponentiated zero-weight points (the first variation), and the KL to the
    Gibbs measure took log(ρ/p) with p underflowed to 0 ("non-finite kl_gibbs"). At ρ_0 the softmax is saturated,
    so a = 200 gives the same first row (risk, grad_norm from the first variation, KL) to round-off.
    """
    import numpy as np

    comm = MPI.COMM_WORLD
    data = tempdir / "one.npz"
    if comm.rank == 0:
        np.savez(data, points=np.full((1, 1, 1), -3.0), weights=np.ones((1, 1)), target=np.ones(1))
    comm.Barrier()
    rows = []
    for a in (300.0, 200.0):
        sets = ["tokens.dim=1", "tokens.box=[[-4.0, 4.0]]", "tokens.cells=[100]", "tokens.degree=0", "depth.steps=1",
                "heads.family='value'", f"heads.a={a}", "heads.box=[[-2.0, 2.0]]", "heads.cells=[16]",
                "heads.init={kind='gaussian', mean=[0.1], cov=[[0.05]]}", "data.kind='file'", f"data.path='{data}'",
                "loss.readout='mean'", "training.steps=1", "output.plots=false", "output.fields=false"]
        out = tempdir / f"a{a:g}"
        code = main(["run", DEEP, "--out", str(out), "--quiet", *[x for s in sets for x in ("--set", s)]])
        err = capfd.readouterr().err
        assert comm.allgather(code) == [0] * comm.size, err
        rows.append(list(csv.DictReader((out / "history.csv").open())))
    for row in rows[0]:
        assert all(v not in ("inf", "-inf", "nan") for v in row.values()), row
    r300, r200 = rows[0][0], rows[1][0]  # step 0 (after a training step ρ moves tiny weights where a matters)
    for key in ("risk", "free_energy", "grad_norm", "kl_gibbs"):
        # the same discrete problem up to the softmax's round-off: a few hundred roundings per value
        assert abs(float(r300[key]) - float(r200[key])) <= 1e3 * 2.2e-16 * max(abs(float(r200[key])), 1.0), (
            key, r300[key], r200[key])
