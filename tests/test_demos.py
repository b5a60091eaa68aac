"""Every demo runs in quick mode and writes its plot; each demo asserts its own checks (theory, closed forms).

The demos end with ``assert`` statements that can fail (a fitted order, a certificate, a bound derived in the
demo's text); here each is run as a script (``MFPDE_DEMO_QUICK=1``) in a fresh directory, and its figure must
be a PNG that decodes to a non-empty image. Serially every demo runs; under ``mpiexec -n 2`` (marker ``ranks``)
the two whose point is MPI (the Gaussian transport on a distributed mesh, and 2 ranks against ``COMM_SELF``).

Serially each demo's printed output is also held against its stored quick-mode output
(``docs/_static/demos/<name>.txt``, shown on the demo's page and written by ``make demo-outputs``): the same text,
and every number to the digits printed (:func:`same_numbers`), so that a change which moves a number of the docs
fails here until the stored outputs are regenerated.
"""

from __future__ import annotations

import re
import runpy
import struct
import sys
from pathlib import Path

from mpi4py import MPI

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEMOS = ROOT / "demos"
STORED = ROOT / "docs" / "_static" / "demos"
#: demo → the figure it writes (in ``out_<demo stem>/``), and whether it also runs under MPI in the suite.
FIGURES = {
    "demo_gaussian_transport": ("gaussian.png", True),
    "demo_token_clustering": ("clustering.png", False),
    "demo_shallow_convergence": ("convergence.png", False),
    "demo_deep_ntk": ("ntk.png", False),
    "demo_digits": ("digits.png", False),
    "demo_mpi_run": ("mpi.png", True),
    "demo_circle": ("circle.png", False),
}
PNG = b"\x89PNG\r\n\x1a\n"
#: a printed number (the stored outputs print 1.2e-05, 0.9054, 287, −1)
NUMBER = re.compile(r"(?<![\w.])[-−]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
#: a timing, which the comparison leaves out: a number followed by " s" (seconds)
TIMING = re.compile(r"^\s?s\b")
#: below this both sides are round-off (a mass error, a difference between ranks): equal enough
ROUNDOFF = 1e-9


def same_numbers(stored: str, got: str) -> list[str]:
    """The differences between a stored output and a new one, line by line: the text between the numbers must be
    equal, and each number within two units of the last digit printed (or 1e-3 relative); timings (a number then
    " s") are not compared, and two numbers both below 1e-9 in size (round-off) are equal."""
    a, b = stored.strip().splitlines(), got.strip().splitlines()
    if len(a) != len(b):
        return [f"{len(a)} lines stored, {len(b)} printed"]
    bad = []
    for la, lb in zip(a, b, strict=True):
        if NUMBER.sub("#", la) != NUMBER.sub("#", lb):
            bad.append(f"text: {la!r} → {lb!r}")
            continue
        for ma, mb in zip(NUMBER.finditer(la), NUMBER.finditer(lb), strict=True):
            if TIMING.match(la[ma.end():]):
                continue
            x, y = (float(m.group().replace("−", "-")) for m in (ma, mb))
            mant = ma.group().split("e")[0]
            unit = 10.0 ** -(len(mant.split(".")[1]) if "." in mant else 0)
            unit *= 10.0 ** int(ma.group().split("e")[1]) if "e" in ma.group() else 1.0
            if max(abs(x), abs(y)) < ROUNDOFF or abs(x - y) <= max(2 * unit, 1e-3 * abs(x)):
                continue
            bad.append(f"{ma.group()} → {mb.group()} in {la!r}")
    return bad


def test_every_demo_is_listed():
    assert {p.stem for p in DEMOS.glob("demo_*.py")} == set(FIGURES)


def _check_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG and data[12:16] == b"IHDR", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 100 and height > 100, (width, height)
    import matplotlib.image

    img = matplotlib.image.imread(path)  # decodes every chunk (a truncated file fails here)
    assert img.shape[:2] == (height, width) and float(img[..., :3].std()) > 0, "an empty figure"


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.ranks) if FIGURES[n][1] else n
                                  for n in sorted(FIGURES)])
def test_demo(name, tempdir, monkeypatch, capfd):
    figure = FIGURES[name][0]
    monkeypatch.chdir(tempdir)
    monkeypatch.setenv("MFPDE_DEMO_QUICK", "1")
    monkeypatch.setattr(sys, "argv", [str(DEMOS / f"{name}.py")])
    runpy.run_path(str(DEMOS / f"{name}.py"), run_name="__main__")
    MPI.COMM_WORLD.Barrier()
    if MPI.COMM_WORLD.rank == 0:
        _check_png(tempdir / f"out_{name}" / figure)
    if MPI.COMM_WORLD.size == 1:  # the docs' stored output is the serial quick run's
        printed = capfd.readouterr().out.replace(str(ROOT) + "/", "")
        stored = (STORED / f"{name.removeprefix('demo_')}.txt").read_text()
        bad = same_numbers(stored, printed)
        assert not bad, f"{name}: the output moved from docs/_static/demos/ (make demo-outputs): {bad}"


def test_same_numbers_can_fail():
    """Text and numbers of a stored output: equal to the printed digits, timings and round-off left out."""
    stored = "rate 0.9054 on 9 rows; mass error 7.3e-13; wall time 6.8 s\nR 3.27e-02 → 2.18e-02"
    other = "rate 0.9055 on 9 rows; mass error 2.1e-14; wall time 9.1 s\nR 3.27e-02 → 2.18e-02"
    assert same_numbers(stored, other) == []
    first = repr(stored.split("\n")[0])
    assert same_numbers(stored, stored.replace("0.9054", "0.9167")) == [f"0.9054 → 0.9167 in {first}"]
    assert same_numbers(stored, stored.replace("2.18e-02", "2.21e-02")) != []
    assert same_numbers(stored, stored.replace("9 rows", "29 rows")) != []
    assert same_numbers(stored, stored.replace("rows", "lines")) != []
    assert same_numbers(stored, stored + "\nmore") != []


def test_png_check_can_fail(tempdir):
    bad = tempdir / "bad.png"
    bad.write_bytes(PNG + b"\x00" * 40)
    with pytest.raises(AssertionError):
        _check_png(bad)
