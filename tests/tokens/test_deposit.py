"""Deposit of data points into cells does not depend on the partition (issue 14).

A point exactly on a vertex shared by two partitions went to the cell chosen by the partition: one point
at x = 0, box [−4, 4], 8 cells, DG0 gave μ_T with mean −1.016 on 1 and 3 ranks and +1.016 on 2.
"""

from __future__ import annotations

from pathlib import Path

from mpi4py import MPI

import dolfinx.fem
import numpy as np
import pytest

from mfpde import config
from mfpde.tokens.box.config import section
from mfpde.tokens.box.data import fill_density
from mfpde.tokens.box.problem import build

pytestmark = pytest.mark.ranks  # the rank count can change what it checks: run again under mpiexec

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "demos" / "transport_small.toml"


@pytest.mark.parametrize("x0", [0.0, 1.0, -4.0])
def test_point_on_a_shared_vertex_goes_to_the_same_cell_on_any_partition(tempdir, x0):
    path = tempdir / "point.npz"
    if MPI.COMM_WORLD.rank == 0:
        np.savez(path, points=np.full((1, 1, 1), x0), weights=np.ones((1, 1)), target=np.ones(1))
    MPI.COMM_WORLD.Barrier()
    cfg = config.load(DEMO, ["tokens.cells=[8]", "tokens.degree=0", "data.kind='file'", f"data.path='{path}'",
                             "depth.steps=10"])
    means = {}
    for name, comm in (("COMM_WORLD", MPI.COMM_WORLD), ("COMM_SELF", MPI.COMM_SELF)):
        pb = build(section(cfg), comm)
        u = dolfinx.fem.Function(pb.tokens.W)
        fill_density(pb.train[0], u, pb.tokens.mass)
        mean0 = pb.tokens.moments(u)[1][0]
        rep = pb.tokens.solve(u, pb.heads0, cfg.depth.T, cfg.depth.steps, pb.g)
        means[name] = (mean0, rep.mean_T[0])
    # the deposit picks the cell of smallest original index: the left one ([-1, 0] for x0 = 0)
    assert means["COMM_WORLD"][0] == pytest.approx(x0 - 0.5 if x0 > -4 else -3.5, abs=1e-12), means
    assert means["COMM_WORLD"] == pytest.approx(means["COMM_SELF"], rel=1e-12, abs=1e-14), means
