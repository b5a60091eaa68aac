"""The public Python API (mfpde.__all__): configs, transport and training as arrays, .bp read back; also under MPI."""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import re
from pathlib import Path

from mpi4py import MPI

import numpy as np
import pytest

import mfpde
from mfpde.errors import ConfigError

pytestmark = pytest.mark.ranks  # the rank count can change what it checks: run again under mpiexec

ROOT = Path(__file__).resolve().parent.parent
SMALL = str(ROOT / "demos" / "transport_small.toml")


def test_every_public_name_resolves_and_is_documented():
    api = (ROOT / "docs" / "api.md").read_text()
    for name in mfpde.__all__:
        assert getattr(mfpde, name) is not None
        if name != "__version__":
            assert re.search(rf"mfpde\.{name}\b", api), f"{name} is not in docs/api.md"
    with pytest.raises(AttributeError):
        _ = mfpde.no_such_name


def test_load_config_with_overrides_and_sections():
    cfg = mfpde.load_config(SMALL, overrides=["depth.steps=10"], tokens={"cells": [100]})
    assert cfg.tokens.cells == [100] and cfg.depth.steps == 10
    assert cfg.tokens.degree == 1 and cfg.data.mean == [[0.3]]  # the file's other keys kept
    assert mfpde.load_config().data.kind == "digits"  # the embedded default of mfpde run


def test_make_config_from_keywords_and_did_you_mean():
    cfg = mfpde.make_config(heads={"family": "value"}, training={"steps": 3})
    assert cfg.heads.family == "value" and cfg.heads.box == [[-2.0, 2.0]] and cfg.training.steps == 3
    with pytest.raises(ConfigError, match=r"unknown config key training\.stpes; did you mean training\.steps\?"):
        mfpde.make_config(training={"stpes": 3})
    with pytest.raises(ConfigError, match=r"did you mean \[training\]") as one:
        mfpde.make_config(trainig={"steps": 3})
    assert one.value.messages == [str(one.value)]  # one handler for one error and for several
    with pytest.raises(mfpde.ConfigErrors) as several:
        mfpde.make_config(training={"stpes": 3, "ds": -1.0})
    assert len(several.value.messages) == 2 and all(m in str(several.value) for m in several.value.messages)


def test_transport_gives_mu_t_as_arrays_consistent_with_the_report():
    """DG0: one value per cell at its centre; h Σ μ = mass_T and h Σ x μ / mass = mean_T of the report."""
    cfg = mfpde.load_config(SMALL, overrides=["tokens.degree=0", "output.fields=false"])
    res = mfpde.transport(cfg)
    n = cfg.tokens.cells[0]
    assert res.mu_T.values.shape == (n,) and res.mu_T.points.shape == (n, 1) and res.mu_T.degree == 0
    h = (cfg.tokens.box[0][1] - cfg.tokens.box[0][0]) / n
    x = res.mu_T.points[:, 0]
    np.testing.assert_allclose(np.diff(x), h, rtol=1e-9)  # the cell centres, sorted
    np.testing.assert_allclose(h * res.mu_0.values.sum(), 1.0, rtol=1e-10)
    mass = h * res.mu_T.values.sum()
    np.testing.assert_allclose(mass, res.report["mass_T"], rtol=1e-10)
    np.testing.assert_allclose(h * (x * res.mu_T.values).sum() / mass, res.report["mean_T"][0], rtol=1e-9)
    # the field's own quadrature: the lumped weights of the cells (h each for DG0), mass and mean as reported
    np.testing.assert_allclose(res.mu_T.weights, h, rtol=1e-12)
    np.testing.assert_allclose([res.mu_T.mass, *res.mu_T.mean], [res.report["mass_T"], *res.report["mean_T"]],
                               rtol=1e-9)
    assert res.yhat == res.report["yhat"] and abs(res.yhat - 0.609) < 1e-2  # theory §6.1: m_T = 0.609014
    assert not np.allclose(res.mu_0.values, res.mu_T.values)
    with pytest.raises(IndexError):
        mfpde.transport(cfg, sample=1)
    circle = mfpde.load_config(str(ROOT / "demos" / "circle.toml"), overrides=["depth.T=0.3", "tokens.cells=[64]"])
    for solver in ("dg", "flow"):  # the circle: angles as points, the quadrature's mass 1, the report's sample block
        c = mfpde.transport(dataclasses.replace(circle, tokens=dataclasses.replace(circle.tokens, solver=solver)))
        assert c.mu_T.points.shape == (len(c.mu_T.values), 1) and math.isnan(c.yhat)
        assert c.mu_T.mass == pytest.approx(1.0, abs=1e-12) and c.report["solver"] == solver
        assert len(c.report["cdf_T"]) == 1024
    with pytest.raises(IndexError):
        mfpde.transport(circle, sample=1)


VALUE = {"tokens": {"cells": [60]}, "depth": {"steps": 10}, "heads": {"family": "value", "cells": [40]},
         "data": {"mean": [[0.3], [-0.4]], "cov": [[[0.25]], [[0.2]]], "target": [1.0, 0.0]},
         "training": {"steps": 6, "ds": 0.1}, "output": {"every": 3, "plots": False}}


def test_train_gives_rho_and_history_as_arrays(tempdir):
    out = tempdir / "run"
    run = mfpde.train(mfpde.make_config(**VALUE), out)
    assert run.status == "ok" and run.out == out
    N = 41
    assert run.rho.shape == (1, N) and run.theta_points.shape == (N, 1)
    th = run.theta_points[:, 0]
    np.testing.assert_allclose(np.trapezoid(run.rho[0], th), 1.0, rtol=1e-8)  # P1 density: ∫ρ = 1
    np.testing.assert_allclose(np.trapezoid(th * run.rho[0], th), run.report["final"]["rho_mean"][0], rtol=1e-8)
    assert list(run.history["step"]) == [0, 3, 6]
    # neg_entropy is ∫ρ log ρ (minus the entropy): Σ m_i ρ_i log ρ_i with the lumped P1 masses (trapezoid rule)
    assert "entropy" not in run.history
    np.testing.assert_allclose(run.history["neg_entropy"][-1], np.trapezoid(run.rho[0] * np.log(run.rho[0]), th),
                               rtol=1e-8)
    if MPI.COMM_WORLD.rank == 0:
        rows = list(csv.DictReader((out / "history.csv").open()))
        np.testing.assert_allclose(run.history["risk"], [float(r["risk"]) for r in rows], rtol=1e-11)
    # the trained ρ is the last snapshot of fields/rho.bp, read back with the API
    if MPI.COMM_WORLD.rank == 0:
        bp = mfpde.read_vtx(out / "fields" / "rho.bp")
        assert list(bp.times) == pytest.approx([0.0, 0.3, 0.6])
        order = np.argsort(bp.points[-1][:, 0])
        pts, last = bp.points[-1][order, 0], bp.values[-1][order]
        keep = np.concatenate([[True], np.diff(pts) > 1e-12])  # a node written by two ranks, once
        np.testing.assert_allclose(pts[keep], th, atol=1e-12)
        np.testing.assert_allclose(last[keep], run.rho[0], rtol=1e-12, atol=1e-14)
        assert not np.allclose(bp.values[0][order][keep], run.rho[0])  # training moved ρ


def test_train_without_out_leaves_nothing_behind(monkeypatch):
    """Its temporary DIR is removed. The temporary folder is this test's own: the suite's other processes make
    theirs in the shared one meanwhile."""
    import shutil
    import tempfile

    comm = MPI.COMM_WORLD
    own = Path(comm.bcast(tempfile.mkdtemp(prefix="test-api-") if comm.rank == 0 else None, root=0))
    monkeypatch.setattr(tempfile, "tempdir", str(own))
    try:
        before = set(own.glob("mfpde-*"))
        run = mfpde.train(mfpde.make_config(**{**VALUE, "training": {"steps": 2, "ds": 0.1}}))
        assert run.status == "ok" and run.rho.shape[0] == 1 and len(run.history["risk"]) == 2
        comm.Barrier()
        assert set(own.glob("mfpde-*")) <= before
    finally:
        comm.Barrier()
        if comm.rank == 0:
            shutil.rmtree(own, ignore_errors=True)


def test_transport_and_train_use_one_blas_thread_as_the_commands(monkeypatch):
    """The API limits BLAS to one thread per process while it solves, as ``mfpde run`` does (a second OpenBLAS
    thread made the same runs 2-6 times slower, bench/bench_threads.py); the limit is lifted on return."""
    from threadpoolctl import threadpool_info, threadpool_limits

    import mfpde.jobs.run
    import mfpde.jobs.transport
    from mfpde.environment import THREAD_VARS

    for var in THREAD_VARS:
        monkeypatch.delenv(var, raising=False)

    def blas() -> int:
        return max(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")

    seen: list[int] = []
    for module, name in ((mfpde.jobs.transport, "transport_sample"), (mfpde.jobs.run, "run_job")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, **k: (seen.append(blas()), _real(*a, **k))[1])
    with threadpool_limits(limits=max(os.cpu_count() or 1, 2), user_api="blas"):  # not the suite's own limit
        outside = blas()
        mfpde.transport(mfpde.load_config(SMALL, overrides=["tokens.degree=0", "output.fields=false"]))
        mfpde.train(mfpde.make_config(**{**VALUE, "training": {"steps": 1, "ds": 0.1}}))
        assert seen == [1, 1] and blas() == outside
