"""Every demo runs in quick mode and writes its plot; each demo asserts its own checks (theory, closed forms).

The demos end with ``assert`` statements that can fail (a fitted order, a certificate, a bound derived in the
demo's text); here each is run as a script (``MFPDE_DEMO_QUICK=1``) in a fresh directory, and its figure must
be a PNG that decodes to a non-empty image. Serially every demo runs; under ``mpiexec -n 2`` (marker ``ranks``)
the two whose point is MPI (the Gaussian transport on a distributed mesh, and 2 ranks against ``COMM_SELF``).
"""

from __future__ import annotations

import runpy
import struct
import sys
from pathlib import Path

from mpi4py import MPI

import pytest

DEMOS = Path(__file__).resolve().parent.parent / "demos"
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
def test_demo(name, tempdir, monkeypatch):
    figure = FIGURES[name][0]
    monkeypatch.chdir(tempdir)
    monkeypatch.setenv("MFPDE_DEMO_QUICK", "1")
    monkeypatch.setattr(sys, "argv", [str(DEMOS / f"{name}.py")])
    runpy.run_path(str(DEMOS / f"{name}.py"), run_name="__main__")
    MPI.COMM_WORLD.Barrier()
    if MPI.COMM_WORLD.rank == 0:
        _check_png(tempdir / f"out_{name}" / figure)


def test_png_check_can_fail(tempdir):
    bad = tempdir / "bad.png"
    bad.write_bytes(PNG + b"\x00" * 40)
    with pytest.raises(AssertionError):
        _check_png(bad)
