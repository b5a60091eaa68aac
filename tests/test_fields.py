"""What the commands write under ``fields/`` read back with the ``adios2`` wheel: every cell once (issue 14).

The token mesh is ghosted, and VTX wrote each rank's ghost cells as well, with no cell ghost marker: a DG0
density on 256 cells from 2 ranks held 288 values, and its cell masses summed to 1.61, not 1. The tests never
read back what they wrote. Run under ``mpiexec -n 2`` (and 3) to mean anything; on one rank they check the same
contract.
"""

from __future__ import annotations

import json
from pathlib import Path

from mpi4py import MPI

import dolfinx.io  # noqa: F401  before adios2: the wheel's libadios2 loaded first breaks DOLFINx's own
import numpy as np
import pytest
from configs import DEEP
from roundoff import sum_error

from mfpde.cli import main

pytestmark = pytest.mark.ranks  # the rank count can change what it checks: run again under mpiexec

adios2 = pytest.importorskip("adios2")

ROOT = Path(__file__).resolve().parent.parent
DEMO = str(ROOT / "demos" / "transport_small.toml")


def _read(path: Path, name: str) -> list[tuple[np.ndarray, int]]:
    """Per step: the values of ``name`` from every block (rank) concatenated, and the number of cells.

    VTX calls the number of cells of a block ``NumberOfCells`` for cell data and ``NumberOfEntities`` for point data.
    """
    out = []
    with adios2.FileReader(str(path)) as f:
        key = "NumberOfCells" if "NumberOfCells" in f.available_variables() else "NumberOfEntities"
        info = f.all_blocks_info(name)
        for step, blocks in enumerate(info):
            vals = np.concatenate([f.read(name, step_selection=[step, 1], block_id=b).ravel()
                                   for b in range(len(blocks))])
            ncells = sum(int(f.read(key, step_selection=[step, 1], block_id=b)[0])
                         for b in range(len(blocks)))
            out.append((vals, ncells))
    return out


def test_transport_fields_hold_each_cell_once(tempdir, capfd):
    """``mfpde transport``, d = 2, DG0 on 16 × 16 cells: 256 values a snapshot, cell masses summing to ∫μ."""
    comm = MPI.COMM_WORLD
    n, half = 16, 2.0
    sets = ["tokens.dim=2", f"tokens.box=[[-{half}, {half}], [-{half}, {half}]]", f"tokens.cells=[{n}, {n}]",
            "tokens.degree=0", "depth.steps=4", "output.every=2", "data.mean=[[0.2, -0.1]]",
            "data.cov=[[[0.2, 0.0], [0.0, 0.2]]]", "heads.init={kind='diracs', points=[[-0.5, 1.0]], weights=[1.0]}"]
    code = main(["transport", DEMO, "--out", str(tempdir), *[x for s in sets for x in ("--set", s)]])
    err = capfd.readouterr().err
    assert comm.allgather(code) == [0] * comm.size, err
    _on_rank0(comm, _check_transport, tempdir, n, half)


def _on_rank0(comm: MPI.Comm, check, *args) -> None:
    """Run ``check`` (which asserts) on rank 0 and fail on every rank with its message: no rank left waiting."""
    msg = ""
    if comm.rank == 0:
        try:
            check(*args)
        except AssertionError as e:
            msg = str(e) or repr(e)
    msg = comm.bcast(msg, root=0)
    assert not msg, msg


def _check_transport(tempdir: Path, n: int, half: float) -> None:
    sample = json.loads((tempdir / "report.json").read_text())["samples"][0]
    snaps = _read(tempdir / "fields" / "mu_0.bp", "mu")
    assert len(snaps) == 3, len(snaps)  # t = 0, 0.5, 1
    area = (2 * half / n) ** 2
    for k, (vals, ncells) in enumerate(snaps):
        assert len(vals) == n * n and ncells == n * n, (k, len(vals), ncells)
        mass = float(vals.sum()) * area
        want = 1.0 if k == 0 else sample["mass_T"] if k == len(snaps) - 1 else mass
        # the same cell masses, summed in another order (and each a product with the cell area)
        assert abs(mass - want) <= sum_error(n * n, 2.0), (k, mass, want)


def test_run_fields_hold_each_cell_once(tempdir, capfd):
    """``mfpde run`` (the default problem, made small): μ_T on 8 × 8 token cells and ρ on 8 × 8 Θ cells."""
    comm = MPI.COMM_WORLD
    sets = ["tokens.cells=[8, 8]", "heads.cells=[8, 8]", "depth.steps=2", "data.samples=2", "data.test_samples=0",
            "training.steps=2", "output.every=1", "output.plots=false", "output.fields=true"]
    code = main(["run", DEEP, "--out", str(tempdir), "--quiet", *[x for s in sets for x in ("--set", s)]])
    err = capfd.readouterr().err
    assert comm.allgather(code) == [0] * comm.size, err
    _on_rank0(comm, _check_run, tempdir)


def _check_run(tempdir: Path) -> None:
    report = json.loads((tempdir / "report.json").read_text())
    snaps = _read(tempdir / "fields" / "mu_T_train.bp", "mu_T")  # one step per training sample
    assert len(snaps) == 2
    for i, (vals, ncells) in enumerate(snaps):
        assert len(vals) == 64 and ncells == 64, (i, len(vals), ncells)
        # digits in the unit square inside [-1, 1]²: cells of area 1/16; ∫μ_T = 1 − outflow ≥ 1 − outflow_tol
        assert 1.0 - 1e-2 - sum_error(64) <= vals.sum() / 16 <= 1.0 + sum_error(64, 2.0), vals.sum() / 16
    snaps = _read(tempdir / "fields" / "rho.bp", "rho")
    assert len(snaps) == report["steps_done"] + 1
    for _, ncells in snaps:
        assert ncells == 2 * 8 * 8, ncells  # the Θ box's 8 × 8 squares cut into triangles, each once
