"""Test habits from DOLFINx's own conftest: collective teardown and a temp dir agreed across ranks."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from mpi4py import MPI

import dolfinx.io  # noqa: F401  (dolfinx's ADIOS2 library before the adios2 wheel's: see mfpde.io.read_vtx)
import pytest

from mfpde.petsc import collect_garbage


def pytest_configure(config: pytest.Config) -> None:
    """Give each rank its own junit file so that ranks > 0 do not overwrite rank 0's; one BLAS thread per process
    for the session, as the commands run (:func:`mfpde.environment.blas_threads`: unless the user chose, e.g.
    ``MFPDE_BLAS_THREADS=default`` keeps OpenBLAS's own count). Without it the in-process solves of two pytest
    workers, or of two MPI ranks, ran two OpenBLAS threads each on two cores."""
    rank = MPI.COMM_WORLD.rank
    xmlpath = getattr(config.option, "xmlpath", None)
    if xmlpath and rank > 0:
        config.option.xmlpath = str(Path(xmlpath).with_suffix(f".rank{rank}.xml"))
    from mfpde.environment import blas_threads

    limit = blas_threads(MPI.COMM_WORLD)
    limit.__enter__()
    config.add_cleanup(lambda: limit.__exit__(None, None, None))


def _uses_roundoff(fn: object, module: object, depth: int = 2) -> bool:
    """Whether fn (or a module-level function it calls, ``depth`` levels down) uses a bound of tests/roundoff.py."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return False
    names = set(code.co_names) | {c for const in code.co_consts if hasattr(const, "co_names") for c in const.co_names}
    for name in names:
        obj = getattr(module, name, None)
        if getattr(obj, "__module__", None) == "roundoff":
            return True
        if depth > 0 and getattr(obj, "__module__", None) == getattr(module, "__name__", None) and \
                _uses_roundoff(obj, module, depth - 1):
            return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests whose assertions are round-off bounds ``roundoff`` (what another CPU's rounding can change:
    the core-type passes run only these). On more than one rank, run only the tests marked ``ranks`` (what the
    rank count can change) and not ``serial``: the others' results cannot depend on the ranks, and the serial
    pass has run them."""
    for item in items:
        fn = getattr(item, "function", None)
        if fn is not None and _uses_roundoff(fn, item.module):
            item.add_marker(pytest.mark.roundoff)
    if MPI.COMM_WORLD.size > 1:
        serial = pytest.mark.skip(reason="serial-only test")
        rank_free = pytest.mark.skip(reason="not marked ranks: the rank count cannot change it")
        for item in items:
            if "serial" in item.keywords:
                item.add_marker(serial)
            elif "ranks" not in item.keywords:
                item.add_marker(rank_free)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move what the imports and the collection made (about 1.5·10⁵ objects: DOLFINx, UFL, matplotlib, the test
    modules) out of the cycle collector's reach (``gc.freeze``): the collective teardown's ``gc.collect()`` after
    every test then walks only what tests made (0.1 s a test, about a tenth of the suite's time, before)."""
    import gc

    gc.collect()
    gc.freeze()


#: Seconds a rank that finished a test waits for the others before it aborts the MPI job
#: (``MFPDE_TEST_MPI_TIMEOUT``). A test that fails on one rank before a collective leaves the other
#: ranks waiting in that collective for ever; without the abort `mpiexec -n 2 pytest` hangs until CI's limit.
MPI_TIMEOUT = float(os.environ.get("MFPDE_TEST_MPI_TIMEOUT", "600"))


@pytest.fixture(autouse=True)
def collective_teardown(request: pytest.FixtureRequest):
    """Free PETSc/DOLFINx objects on all ranks together, then synchronise (as DOLFINx's conftest).

    The synchronisation is a non-blocking barrier polled for ``MPI_TIMEOUT`` seconds: if the other ranks do
    not arrive (one rank failed before a collective, the others wait in it), this rank says which test and
    calls ``MPI.COMM_WORLD.Abort``, which ends every rank: the run fails instead of hanging.
    """
    yield
    collect_garbage()  # gc.collect(), then the PETSc objects of freed solvers, on every rank here
    comm = MPI.COMM_WORLD
    if comm.size == 1:
        return
    req = comm.Ibarrier()
    t0 = time.monotonic()
    while not req.Test():
        if time.monotonic() - t0 > MPI_TIMEOUT:
            capture = request.config.pluginmanager.getplugin("capturemanager")
            with capture.global_and_fixture_disabled():  # past pytest's capture, which Abort would lose
                sys.stderr.write(f"\nrank {comm.rank}: the other ranks did not finish {request.node.nodeid} "
                                 f"within {MPI_TIMEOUT:g} s (a failure on one rank before a collective?): "
                                 "aborting the MPI job\n")
                sys.stderr.flush()
            time.sleep(1.0)  # let mpiexec forward the line: an abort tears its pipes down (lost under load once)
            comm.Abort(1)
        time.sleep(0.005)


@pytest.fixture
def tempdir(request: pytest.FixtureRequest):
    """A directory that all ranks agree on, cleaned before the test (rank 0 creates it)."""
    comm = MPI.COMM_WORLD
    # per rank count: a serial and an MPI suite run side by side do not clean each other's directories
    path = Path(__file__).parent.parent / "out" / "test-tmp" / f"np{comm.size}" / request.node.name
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
    comm.Barrier()
    return path
