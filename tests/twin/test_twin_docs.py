"""The numbers of docs/twin.md, regenerated: `mfpde twin` on demos/twin_deep.toml and on the embedded default,
each number of the page against the report it comes from (at the page's rounding)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from mpi4py import MPI

import pytest

from mfpde.cli import main

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "twin.md").read_text()
#: the rows of the page's table: (sweep, quantity) in order
ROWS = [("heads", "risk"), ("heads", "rho_w1"), ("heads", "yhat"), ("tokens", "risk"), ("tokens", "yhat"),
        ("layers", "risk"), ("layers", "yhat")]


def _num(text: str) -> float:
    return float(text.replace("−", "-"))


def _same(shown: str, value: float) -> bool:
    """``shown`` is ``value`` at the page's rounding (the digits it gives)."""
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    return round(value, decimals) == pytest.approx(_num(shown), abs=0.6 * 10**-decimals)


@pytest.mark.serial
def test_the_twin_page_table_is_the_deep_run(tmp_path):
    out = tmp_path / "deep"
    assert main(["twin", str(ROOT / "demos" / "twin_deep.toml"), "--out", str(out), "--quiet",
                 "--set", "output.plots=false"]) == 0
    if MPI.COMM_WORLD.rank:
        return
    rep = json.loads((out / "report.json").read_text())
    cells = re.findall(r"^\|[^|]*\|[^|]*\| (−?[\d.]+) ± ([\d.]+) \|", PAGE, re.M)
    assert len(cells) == len(ROWS)
    for (sweep, q), (slope, se) in zip(ROWS, cells, strict=True):
        f = rep["exponents"][sweep][q]
        assert _same(slope, f["slope"]) and _same(se, f["se"]), (sweep, q, slope, se, f["slope"], f["se"])
        assert abs(f["slope"] - f["expected"]) <= 4 * f["se"], (sweep, q)  # the page's "as theory says"
    bias = rep["exponents"]["heads"]["risk_bias"]
    assert bias["slope"] is None and sum(bias["fitted"]) == 1  # "not resolved", "at three of the four sizes"
    assert 5.5e-6 < rep["pde"]["discretisation_error"]["risk"] < 6.5e-6  # "6·10⁻⁶ in the risk"
    tok = rep["exponents"]["tokens"]["risk"]["gaps"]
    assert tok[2] > tok[1]  # "the paired gap at N = 32 is above the one at N = 16"
    layers = rep["exponents"]["layers"]["risk"]["gaps"]
    assert f"{layers[0]:.0e}" == "9e-06" and layers[0] < rep["pde"]["discretisation_error"]["risk"] * 2


@pytest.mark.serial
def test_the_twin_page_default_paragraph_is_the_default_run(tmp_path):
    out = tmp_path / "default"
    assert main(["twin", "--out", str(out), "--quiet", "--set", "output.plots=false"]) == 0
    if MPI.COMM_WORLD.rank:
        return
    rep = json.loads((out / "report.json").read_text())
    tok = rep["exponents"]["tokens"]
    m = re.search(r"tokens\s+exponents are (−?[\d.]+) ± ([\d.]+) \(risk\) and (−?[\d.]+) ± ([\d.]+) \(ŷ\)", PAGE)
    assert m is not None
    assert _same(m[1], tok["risk"]["slope"]) and _same(m[2], tok["risk"]["se"])
    assert _same(m[3], tok["yhat"]["slope"]) and _same(m[4], tok["yhat"]["se"])
    err = rep["pde"]["discretisation_error"]
    assert f"{err['risk']:.1e}" == "7.8e-03" and f"{err['rho_w1']:.2f}" == "0.15"
    assert all(h["slope"] is None for h in rep["exponents"]["heads"].values())  # "no heads exponent is fitted"
    heads = [s["risk_mean"] for k, s in rep["sizes"].items() if k.startswith("heads:")]
    assert max(heads) - min(heads) < 3e-4  # "within 3·10⁻⁴ of each other"
    assert rep["diverged"] == ["H = 256, N = 16, L = 1"]  # "N = 16 ... diverges ... left out"
