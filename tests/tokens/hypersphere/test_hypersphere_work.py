"""The hypersphere's finite volumes: a transport whose steps cannot end is refused at the door; progress is logged."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from mfpde.cli import main
from mfpde.tokens.hypersphere import transport as tr

ROOT = Path(__file__).resolve().parents[3]
DEMO = str(ROOT / "demos" / "noisy_hypersphere.toml")


def test_a_transport_that_cannot_end_is_refused_at_once(tmp_path, capsys):
    """20 000 cells on S^4095 to T = 1000: ≳ 4e14 steps; exit 2 in seconds, the key and the bound named, no DIR."""
    out = tmp_path / "t"
    t0 = time.perf_counter()
    rc = main(["transport", DEMO, "--out", str(out), "--quiet", "--set", "tokens.cells=[20000]",
               "--set", "tokens.dim=4096", "--set", "depth.T=1000.0"])
    assert rc == 2 and time.perf_counter() - t0 < 10 and not out.exists()
    err = capsys.readouterr().err
    assert "tokens.cells: the job would take more than" in err and "finite-volume steps of 20000 cells" in err


@pytest.mark.parametrize("heads,d,attention,noise,cells,T", [
    ((2.0, 1.0), 64, "unnormalised", 1.0, 64, 0.05),
    ((2.0, 1.0), 3, "unnormalised", 0.1, 40, 0.5),
    ([(4.0, 2.0, 0.5), (1.0, -1.0, 1.0)], 8, "softmax", 0.0, 48, 0.5),
])
def test_the_step_bound_is_a_lower_bound(heads, d, attention, noise, cells, T):
    """The state-free bound never exceeds the steps taken (and is within a factor 3 of them with noise)."""
    res = tr.finite_volume(lambda z: 1 + 0.3 * z, heads, d, attention, noise, cells, [T / 2, T])
    low = tr.substeps_at_least(heads, d, attention, noise, cells, T)
    assert low <= res.steps
    if noise > 0:
        assert res.steps <= 3 * low + 2


def test_a_long_transport_logs_its_progress(tmp_path, caplog):
    """Without a terminal the finite volumes log a line at every tenth of the output depths."""
    with caplog.at_level(logging.INFO):
        assert main(["transport", DEMO, "--out", str(tmp_path / "t"), "--set", "tokens.dim=4",
                     "--set", "tokens.cells=[24]", "--set", "depth.T=0.2", "--set", "output.plots=false"]) == 0
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("hypersphere: output")]
    assert lines and lines[-1].startswith("hypersphere: output") and "t = 0.2" in lines[-1]


def test_the_finite_volumes_log_inside_a_long_output_interval(monkeypatch, caplog):
    """Between two output depths the finite volumes log the depth reached every LOG_EVERY_S wall seconds."""
    monkeypatch.setattr(tr, "LOG_EVERY_S", 0.0)
    with caplog.at_level(logging.INFO, logger="mfpde.tokens.hypersphere.transport"):
        res = tr.finite_volume(lambda z: 1 + 0.1 * z, (2.0, 1.0), 16, "unnormalised", 1.0, 24, [0.1])
    lines = [r.getMessage() for r in caplog.records if "hypersphere finite volumes: t = " in r.getMessage()]
    assert res.steps > 64 and len(lines) == res.steps // 64
