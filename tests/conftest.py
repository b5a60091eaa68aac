"""Test habits from DOLFINx's own conftest: collective teardown and a temp dir agreed across ranks."""

from __future__ import annotations

import gc
import shutil
from pathlib import Path

from mpi4py import MPI

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Give each rank its own junit file so that ranks > 0 do not overwrite rank 0's."""
    rank = MPI.COMM_WORLD.rank
    xmlpath = getattr(config.option, "xmlpath", None)
    if xmlpath and rank > 0:
        config.option.xmlpath = str(Path(xmlpath).with_suffix(f".rank{rank}.xml"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip serial-only tests when run on more than one rank."""
    if MPI.COMM_WORLD.size > 1:
        skip = pytest.mark.skip(reason="serial-only test")
        for item in items:
            if "serial" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def collective_teardown():
    """Free PETSc/DOLFINx objects on all ranks together, then synchronise (as DOLFINx's conftest)."""
    yield
    gc.collect()
    MPI.COMM_WORLD.Barrier()


@pytest.fixture
def tempdir(request: pytest.FixtureRequest):
    """A directory that all ranks agree on, cleaned before the test (rank 0 creates it)."""
    comm = MPI.COMM_WORLD
    path = Path(__file__).parent.parent / "out" / "test-tmp" / request.node.name
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
    comm.Barrier()
    return path
