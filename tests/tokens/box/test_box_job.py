"""The box is a token domain like the others: a package with its config rules and its part of the transport job.

The transport job has one path for every domain (mfpde.jobs.transport.domain_transport); the box's report, files,
log lines and failures are those it had when it was the job's special case (the numbers recorded then).
"""

from __future__ import annotations

import ast
import json
import logging
from pathlib import Path

from mpi4py import MPI

import pytest

import mfpde.jobs.transport
import mfpde.tokens.box.config
import mfpde.tokens.box.job
from mfpde import config as C
from mfpde.domains import DOMAINS, data_kinds, domain_job, domain_of_kind
from mfpde.errors import ConfigError, ConfigErrors, NumericalError
from mfpde.jobs.transport import transport_job

ROOT = Path(__file__).resolve().parents[3]
SMALL = ROOT / "demos" / "transport_small.toml"
TWO = ["data.mean=[[0.3], [-0.2]]", "data.cov=[[[0.25]], [[0.3]]]", "data.target=[1.0, -1.0]"]

pytestmark = pytest.mark.ranks


def test_the_box_is_a_package_behind_the_domain_protocol():
    """DOMAINS names the box's package; its job module is the box's part of the one transport path."""
    assert DOMAINS["box"] == "mfpde.tokens.box"
    assert domain_job("box") is mfpde.tokens.box.job
    assert data_kinds("box") == mfpde.tokens.box.config.KINDS == ("gaussian", "digits", "file")
    assert {k: domain_of_kind(k) for k in ("gaussian", "digits", "file", "circle_modes", "nothing")} == {
        "gaussian": "box", "digits": "box", "file": "box", "circle_modes": "circle", "nothing": None}
    assert not hasattr(mfpde.tokens.box.config, "coarser")  # no resolution check: the box counts no clusters
    src = Path(mfpde.jobs.transport.__file__).read_text()
    assert '"box"' not in src and "'box'" not in src  # no branch of the box


def test_no_module_of_the_token_domains_imports_the_jobs():
    """The domains stand below the jobs: nothing under mfpde/tokens imports mfpde.jobs."""
    up = []
    for f in (ROOT / "mfpde" / "tokens").rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            up += [f"{f.relative_to(ROOT)}: {n}" for n in names if n == "mfpde.jobs" or n.startswith("mfpde.jobs.")]
    assert not up, up


def test_the_box_rules_are_its_own():
    """The box's config rules refuse what it does not solve, every error at once, as before."""
    with pytest.raises(ConfigErrors) as e:
        C.load(SMALL, ["data.kind='circle_noise'", "tokens.solver='flow'", "depth.spacing='log'", "tokens.noise=1"])
    assert str(e.value) == (
        "4 config errors: (1) data.kind: 'circle_noise' needs tokens.domain = 'circle'; (2) tokens.solver: 'flow' "
        "needs tokens.domain = 'circle', 'sphere' or 'hypersphere' (boxes are solved by DG); (3) depth.spacing: 'log' "
        "needs tokens.domain = 'circle', 'sphere' or 'hypersphere'; (4) tokens.noise: 1 needs tokens.domain = "
        "'circle', 'sphere' or 'hypersphere' (noise is not on boxes)")
    with pytest.raises(ConfigError, match=r"^data\.kind: must be in \('gaussian', 'digits', 'file', 'circle_modes'"):
        C.load(SMALL, ["data.kind='nothing'"])


def test_transport_of_two_samples_writes_the_report_files_and_lines_of_before(tempdir, caplog):
    """Two samples: a block each (the numbers recorded from the box's special case), fields/mu_<i>.bp,
    plots/tokens.png, a log line per sample; no domain, no warnings, no progress display."""
    comm = MPI.COMM_WORLD
    cfg = C.load(SMALL, TWO)
    made: list[tuple[int, int]] = []

    def progress(total: int, initial: int) -> None:
        made.append((total, initial))

    with caplog.at_level(logging.INFO, logger="mfpde"):
        rep = transport_job(cfg, tempdir, comm, progress=progress)
    comm.Barrier()
    assert made == []
    assert list(rep) == ["status", "command", "version", "comm_size", "samples", "wall_s"]
    assert json.loads((tempdir / "report.json").read_text()).keys() == rep.keys()
    assert rep["status"] == "ok" and rep["command"] == "transport" and rep["comm_size"] == comm.size
    before = [{"mean_T": 0.6090159137519547, "cov_T": 0.22986478578199054, "yhat": 0.6090159137515212,
               "substeps": 99, "target": 1.0},
              {"mean_T": -0.40278294965214295, "cov_T": 0.27146932486531505, "yhat": -0.40278294965192796,
               "substeps": 79, "target": -1.0}]
    for block, b in zip(rep["samples"], before, strict=True):
        assert list(block) == ["mass_T", "mass_error", "min_density", "outflow", "mean_T", "cov_T", "yhat",
                               "substeps", "target"]
        assert block["substeps"] == b["substeps"] and block["target"] == b["target"]
        assert block["yhat"] == pytest.approx(b["yhat"], rel=1e-9)
        assert block["mean_T"][0] == pytest.approx(b["mean_T"], rel=1e-9)
        assert block["cov_T"][0][0] == pytest.approx(b["cov_T"], rel=1e-9)
        assert abs(block["mass_T"] - 1) < 1e-11 and block["min_density"] >= 0
    files = {p.relative_to(tempdir).as_posix() for p in tempdir.iterdir()} | {
        p.relative_to(tempdir).as_posix() for d in ("fields", "plots") for p in (tempdir / d).iterdir()}
    assert files == {"config.toml", "report.json", "fields", "fields/mu_0.bp", "fields/mu_1.bp", "plots",
                     "plots/tokens.png"}
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("mfpde.")]
    assert lines[0] == f"transport: 2 samples, d = 1, 50 depth steps -> {tempdir}"
    assert [ln.split(":")[0] for ln in lines[1:]] == ["sample 0", "sample 1"]
    assert lines[1].startswith("sample 0: mass_T 0.99999999999")


def test_a_failed_sample_reports_the_samples_done(tempdir, monkeypatch):
    """Sample 1 fails: report.json has status "failed", sample 0's block and the error naming sample 1."""
    comm = MPI.COMM_WORLD
    real = mfpde.tokens.box.job.transport_sample

    def planted(pb, i, *args, **kwargs):
        if i == 1:
            raise NumericalError("planted")
        return real(pb, i, *args, **kwargs)

    monkeypatch.setattr(mfpde.tokens.box.job, "transport_sample", planted)
    with pytest.raises(NumericalError, match=r"^sample 1: planted$"):
        transport_job(C.load(SMALL, [*TWO, "output.fields=false"]), tempdir, comm)
    comm.Barrier()
    rep = json.loads((tempdir / "report.json").read_text())
    assert list(rep) == ["status", "command", "version", "comm_size", "samples", "error", "wall_s"]
    assert rep["status"] == "failed" and rep["error"] == "sample 1: planted"
    assert [s["target"] for s in rep["samples"]] == [1.0]
