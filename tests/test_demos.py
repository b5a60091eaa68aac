"""Every demo runs (quick mode), serially and under MPI."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

DEMOS = sorted((Path(__file__).parent.parent / "demos").glob("demo_*.py"))


@pytest.mark.parametrize("demo", DEMOS, ids=[d.stem for d in DEMOS])
def test_demo(demo, tempdir, monkeypatch):
    monkeypatch.chdir(tempdir)
    monkeypatch.setattr(sys, "argv", [str(demo), "--quick"])
    runpy.run_path(str(demo), run_name="__main__")
