"""The stable clustered branch followed down in K (:mod:`mfpde.tokens.hypersphere.cluster`)."""

from __future__ import annotations

import numpy as np

from mfpde.tokens.hypersphere.cluster import cluster_transition, clustered_state
from mfpde.tokens.hypersphere.stationary import HypersphereStationary


def test_it_gives_the_continuations_fold_and_maxwell_point_where_both_apply():
    """d = 16, β = 6 on 64 points: the table's K_f and K_M (the continuation from K_c) to 1e-10."""
    r = cluster_transition(HypersphereStationary(64, 6.0, 1.0, 16))
    assert r.why == "" and r.stable and r.resolved
    assert abs(r.K_f / 0.6721127708 - 1) < 1e-9 and abs(r.K_M / 0.9153800243 - 1) < 1e-9, (r.K_f, r.K_M)
    assert r.order_fold < r.order_maxwell < 1


def test_the_cap_is_stable_the_rotation_left_out():
    """d = 16, β = 10, K = K_c/8 (a cap, order parameter ≈ 0.99): the angle rule's rotation is found (its m = 1
    eigenvalue, zero, is left out: the least of the others is τ-sized), and the state is stable; below the fold the
    fixed-point iteration finds no cluster."""
    P = HypersphereStationary(64, 10.0, 1.0, 16)
    K = P.threshold(1) / 8
    u = clustered_state(P, K)
    assert u is not None and P.order_parameter(u) > 0.99
    assert P.azimuthal_hessian(u, K, 2).min() > 0.5 and P.stability(u, K, 2, "scipy")[1]
    assert clustered_state(P, 0.02) is None  # K_f = 0.02166
    w = np.sqrt(P.q * P.density(u))
    rot = P._rotation(u) * w
    assert np.linalg.norm(rot) > 0
