"""PETSc objects are freed with the solvers that own them.

petsc4py does not destroy a parallel PETSc object that Python's garbage collector frees: it defers it to PETSc's
garbage of the object's communicator, which nothing cleans for a mesh's communicator. Each solver left there
keeps PETSc's and MUMPS's duplicated communicators, and MPICH has 2048 context ids a process: the MPI test suite
was killed ("Cannot allocate context ID", exit 15, no output) when `mfpde verify --quick` ran after the other
files. The solvers release their PETSc objects in ``__del__`` and :func:`mfpde.petsc.collect_garbage` destroys them
where all ranks meet; these tests build solvers several times and count the context ids left.
"""

from __future__ import annotations

from mpi4py import MPI

import dolfinx.fem
import numpy as np
import pytest
from configs import DEEP

from mfpde.config import load
from mfpde.mesh import box
from mfpde.petsc import collect_garbage
from mfpde.tokens.attention import HeadMeasure
from mfpde.tokens.data import Sample, fill_density
from mfpde.tokens.transport import TokenTransport
from mfpde.training.problem import CoupledProblem

pytestmark = pytest.mark.ranks  # the rank count can change what it checks: run again under mpiexec

#: More communicators than MPICH can make (2048 context ids): the count below is exact under MPICH, and under an
#: MPI with more ids it stops here (then the test cannot see a leak, but does not fail).
CAP = 4096


def _free_context_ids(comm: MPI.Comm) -> int:
    """How many duplicates of comm can be made now (collective): MPI_Comm_dup until it fails, then free them."""
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    dups = []
    try:
        while len(dups) < CAP:
            dups.append(comm.Dup())
    except MPI.Exception:
        pass
    finally:
        for c in dups:
            c.Free()
        comm.Set_errhandler(MPI.ERRORS_ARE_FATAL)
    return len(dups)


def _transport() -> None:
    """A DG1 token transport (its mass matrix and KSP) solving a few depth steps."""
    tt = TokenTransport(box(MPI.COMM_WORLD, [[-4.0, 4.0]], [40], "quadrilateral"), 1)
    u = dolfinx.fem.Function(tt.W)
    fill_density(Sample("gaussian", {"mean": np.array([0.2]), "cov": np.array([[0.25]])}, 0.0), u, tt.mass)
    tt.solve(u, HeadMeasure(np.array([-1.0, -0.5]), np.array([0.5, 0.5])), 1.0, 3)


def _coupled() -> None:
    """A coupled problem (token transport, adjoint, entropic Fokker–Planck with MUMPS): a gradient and one
    Lie step."""
    cfg = load(DEEP, ["tokens.cells=[8, 8]", "heads.cells=[6, 6]", "depth.steps=2", "data.samples=2",
                      "data.test_samples=0", "training.lambda=0.05"])
    pb = CoupledProblem(cfg, MPI.COMM_WORLD)
    assert np.isfinite(pb.gradient(pb.heads()).risk)
    pb.splitting().step(0.01)


@pytest.mark.parametrize("build", [_transport, _coupled], ids=["transport", "coupled"])
def test_solvers_free_their_communicators(build):
    """Three builds (and uses) of a solver leave as many free context ids as one: the ids a solver takes are
    given back when it is freed (the first build may keep ids for good: JIT modules, cached splits)."""
    comm = MPI.COMM_WORLD
    build()
    collect_garbage()
    before = _free_context_ids(comm)
    for _ in range(3):
        build()
        collect_garbage()
    after = _free_context_ids(comm)
    assert after == before, f"{before - after} context ids not given back after 3 builds"
