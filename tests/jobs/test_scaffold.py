"""The jobs' one scaffold: DIR as a transaction, the resolved config, the report's head, failed and finished reports."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from mpi4py import MPI

import pytest

from mfpde import __version__
from mfpde import config as C
from mfpde.errors import ConfigError
from mfpde.jobs.scaffold import JobDir, refuse_finished
from mfpde.outdir import PREVIOUS

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.ranks


def _cfg() -> C.Config:
    return C.load(ROOT / "demos" / "circle.toml", ["tokens.beta=3.0"])


def test_a_job_dir_sets_the_previous_result_aside_and_writes_the_resolved_config(tempdir):
    """The previous result waits in .mfpde-previous until the job ends; config.toml is the resolved config."""
    comm = MPI.COMM_WORLD
    if comm.rank == 0:
        (tempdir / "report.json").write_text('{"status": "ok"}')
    comm.Barrier()
    JobDir(_cfg(), tempdir, comm, "transport", domain="circle")
    comm.Barrier()
    assert (tempdir / PREVIOUS / "report.json").exists() and not (tempdir / "report.json").exists()
    written = tomllib.loads((tempdir / "config.toml").read_text())
    assert written["tokens"]["domain"] == "circle" and written["heads"]["init"]["points"] == [[3.0, 1.0]]


def test_the_reports_share_one_head_and_end_with_the_wall_time(tempdir):
    """status, command, version, the job's own head fields, comm_size first; the fields; wall_s last."""
    comm = MPI.COMM_WORLD
    job = JobDir(None, tempdir, comm, "transport", domain="circle", dim=2)
    assert not (tempdir / "config.toml").exists()  # no config given: none written
    rep = job.failed("sample 0: overflow", [{"t": [0.0]}])
    assert list(rep) == ["status", "command", "version", "domain", "dim", "comm_size", "samples", "error", "wall_s"]
    assert rep["status"] == "failed" and rep["version"] == __version__ and rep["comm_size"] == comm.size
    comm.Barrier()
    assert json.loads((tempdir / "report.json").read_text())["error"] == "sample 0: overflow"
    rep = job.finish(samples=[], warnings=["w"])
    assert list(rep)[:6] == ["status", "command", "version", "domain", "dim", "comm_size"]
    assert list(rep)[-1] == "wall_s" and rep["wall_s"] >= 0 and rep["status"] == "ok"
    comm.Barrier()
    assert json.loads((tempdir / "report.json").read_text())["warnings"] == ["w"]
    assert job.finish("failed")["status"] == "failed"


def test_a_finished_run_is_refused_on_every_rank(tempdir):
    """A report of status ok in DIR: ConfigError naming --resume and --overwrite, on every rank; another status or
    no report: nothing to refuse."""
    comm = MPI.COMM_WORLD
    refuse_finished(tempdir, comm)  # empty DIR
    if comm.rank == 0:
        (tempdir / "report.json").write_text('{"status": "failed"}')
    comm.Barrier()
    refuse_finished(tempdir, comm)
    if comm.rank == 0:
        (tempdir / "report.json").write_text('{"status": "ok"}')
    comm.Barrier()
    with pytest.raises(ConfigError, match="holds a finished run .*--resume.*--overwrite"):
        refuse_finished(tempdir, comm)


def test_an_existing_dir_is_neither_moved_nor_given_a_config(tempdir):
    """JobDir.existing: the scaffold of a DIR the caller prepared (nothing moved, no config.toml)."""
    comm = MPI.COMM_WORLD
    if comm.rank == 0:
        (tempdir / "history.csv").write_text("s\n")
    comm.Barrier()
    rep = JobDir.existing(tempdir, comm, "transport").finish(samples=[])
    comm.Barrier()
    assert (tempdir / "history.csv").exists() and not (tempdir / PREVIOUS).exists()
    assert rep["command"] == "transport" and not (tempdir / "config.toml").exists()


def test_head_fields_added_later_stand_before_the_rank_count(tempdir):
    """add_head: what a job learns after it started (the continuation's domain and discretisation) joins the head."""
    job = JobDir(None, tempdir, MPI.COMM_WORLD, "continuation", parameter="coupling")
    job.add_head(domain="circle", points=33)
    assert list(job.report("ok"))[:6] == ["status", "command", "version", "parameter", "domain", "points"]
    assert list(job.report("ok"))[6] == "comm_size"


def test_a_report_drawn_before_it_is_written_is_the_one_written(tempdir):
    """write: the report a job drew its picture from is the one written, its wall time brought up to date."""
    comm = MPI.COMM_WORLD
    job = JobDir(None, tempdir, comm, "continuation")
    drawn = job.report("ok", branches=[1, 2])
    written = job.write(drawn)
    assert written is drawn and written["wall_s"] >= 0
    comm.Barrier()
    assert json.loads((tempdir / "report.json").read_text())["branches"] == [1, 2]
