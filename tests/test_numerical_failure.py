"""Numerical failure is exit 3 with status "failed", never status "ok" with inf/NaN in the results (issue 14)."""

from __future__ import annotations

import csv
import json

from mpi4py import MPI

from mfpde.cli import main

SMALL = ["tokens.cells=[8, 8]", "heads.cells=[8, 8]", "depth.steps=4", "data.samples=2", "data.test_samples=0",
         "training.steps=2", "output.plots=false", "output.fields=false"]


def test_extreme_lambda2_is_a_numerical_failure(tempdir, capfd):
    """training.lambda2 = 1e160 ended with status ok and an inf/NaN grad_norm in history.csv."""
    sets = [a for s in [*SMALL, "training.lambda2=1e160"] for a in ("--set", s)]
    code = main(["run", "--out", str(tempdir), "--quiet", *sets])
    err = capfd.readouterr().err
    assert MPI.COMM_WORLD.allgather(code) == [3] * MPI.COMM_WORLD.size, err
    report = json.loads((tempdir / "report.json").read_text())
    assert report["status"] == "failed" and "non-finite" in report["error"], report
    if MPI.COMM_WORLD.rank == 0:
        assert "numerical failure: non-finite" in err and len(err.strip().splitlines()) == 1, err
    for row in csv.DictReader((tempdir / "history.csv").open()):
        assert all(v not in ("inf", "-inf", "nan") for v in row.values()), row
