"""The rules the new verify checks recompute: the Gauss–Lobatto end weight and the sphere's CFL sub-step."""

from __future__ import annotations

import math

from mpi4py import MPI

import numpy as np
import pytest

from mfpde.verify.sphere_dg import cfl_rule_dt, lobatto_first_weight


@pytest.mark.parametrize(("p", "w"), [(0, 1 / 2), (1, 1 / 2), (2, 1 / 6), (3, 1 / 6), (4, 1 / 12), (5, 1 / 12)])
def test_lobatto_end_weight_is_one_over_n_n_minus_1(p, w):
    """N = max(2, ⌈(p+3)/2⌉) points (2N − 3 ≥ p), ŵ₁ = 1/(N(N−1)) on [0, 1]."""
    assert lobatto_first_weight(p) == pytest.approx(w, rel=1e-13)


@pytest.mark.parametrize("p", [0, 1, 2])
def test_sphere_cfl_rule_is_the_solvers_bound(p):
    """On the flat icosphere, the recomputed rule and SphereDG.max_stable_dt agree to round-off (rotation)."""
    from mfpde.tokens.sphere.dg import SphereDG
    from mfpde.tokens.sphere.mesh import icosphere
    from mfpde.tokens.sphere.velocity import RotationVelocity

    op = SphereDG(icosphere(MPI.COMM_WORLD, 1, 1), p, RotationVelocity(np.array([0.3, 0.2, 1.0])))
    vel = op.velocity(np.asarray(op.project(lambda x: 1.0 + x[:, 2]).x.array))
    rule, solver = cfl_rule_dt(op, vel), float(op.max_stable_dt(vel)[0])
    assert math.isfinite(rule) and rule == pytest.approx(solver, rel=1e-12)
