"""Discrete adjoint and first variation δR/δρ (theory §3): Taylor tests and the Gaussian closed form."""

from __future__ import annotations

from mpi4py import MPI

import dolfinx.fem
import numpy as np
import pytest

from mfpde.adjoint import DiscreteAdjoint, dyhat_dmu, first_variation_values
from mfpde.attention import HeadMeasure, ScalarHeads
from mfpde.heads import ThetaSpace
from mfpde.mesh import box
from mfpde.transport import TokenTransport, readout_function


def _setup(d: int, degree: int, n: int):
    comm = MPI.COMM_WORLD
    tt = TokenTransport(box(comm, [[-3.0, 3.0]] * d, [n] * d), degree=degree)
    th = ThetaSpace(box(comm, [[-1.0, 1.0], [-1.0, 1.0]], [6, 6], "triangle"), ScalarHeads())
    return tt, th


def _risk(tt, th, rho, g, y, d, tape=None, steps=10):
    u = dolfinx.fem.Function(tt.W)
    u.interpolate(lambda x: np.exp(-((x[:d] - 0.3) ** 2).sum(axis=0) / 0.5))
    u.x.array[:] /= tt.mass(u)
    heads = HeadMeasure.from_heads(th.family, th.points, th.gather(rho), keep_zero=True)
    rep = tt.solve(u, heads, 1.0, steps, g, tape=tape)
    return 0.5 * (rep.yhat - y) ** 2, rep.yhat, heads


@pytest.mark.parametrize("d,degree,readout", [(1, 0, "second_moment"), (2, 0, "second_moment"), (1, 0, "mean")])
def test_taylor(d, degree, readout):
    """|R(ρ+εχ) − R(ρ) − ε⟨δR/δρ, χ⟩| falls like ε² for a mass-zero χ (fitted slope 2 ± 0.1)."""
    tt, th = _setup(d, degree, 16)
    rho = th.gaussian([0.2, 0.8], [[0.1, 0.0], [0.0, 0.1]])
    g, y = readout_function(readout), 1.5
    tape: list = []
    R0, yh, heads = _risk(tt, th, rho, g, y, d, tape)
    _, D = DiscreteAdjoint(tt).backward(tape, (yh - y) * dyhat_dmu(tt, g), 1)
    dR = first_variation_values(th.family, heads, D[0], th.x)
    chi = dolfinx.fem.Function(th.V)
    chi.x.array[:] = np.sin(7 * th.x[:, 0] + 3 * th.x[:, 1]) + np.cos(5 * th.x[:, 1])
    one = dolfinx.fem.Function(th.V)
    one.x.array[:] = 1.0
    chi.x.array[:] -= th.mass(chi) / th.mass(one)
    n = th.n_owned
    pred = MPI.COMM_WORLD.allreduce(float((th.m[:n] * chi.x.array[:n] * dR[:n]).sum()), op=MPI.SUM)
    eps = 0.05 / 2.0 ** np.arange(5)
    errs = []
    for e in eps:
        r = dolfinx.fem.Function(th.V)
        r.x.array[:] = rho.x.array + e * chi.x.array
        errs.append(abs(_risk(tt, th, r, g, y, d)[0] - R0 - e * pred))
    slope = np.polyfit(np.log(eps), np.log(errs), 1)[0]
    assert abs(slope - 2.0) < 0.1, f"Taylor slope {slope:.3f}, errors {errs}"
    assert abs(pred) > 1e-4  # a non-trivial direction


def test_gaussian_first_variation():
    """δR/δρ(a, v) = v (∂_ā G + a ∂_b̄ G) for Gaussian inputs (theory §6.1), at first order (DG0)."""
    m0, s0, y, T = 0.3, 0.25, 1.0, 1.0
    errs, hs = [], []
    for n in (60, 120, 240):
        comm = MPI.COMM_WORLD
        tt = TokenTransport(box(comm, [[-4.0, 4.0]], [n]), degree=0)
        th = ThetaSpace(box(comm, [[-1.0, 1.0], [-1.0, 1.0]], [4, 4], "triangle"), ScalarHeads())
        rho = th.gaussian([0.1, 0.6], [[0.2, 0.0], [0.0, 0.2]])
        heads = HeadMeasure.from_heads(th.family, th.points, th.gather(rho), keep_zero=True)
        u = dolfinx.fem.Function(tt.W)
        u.interpolate(lambda x: np.exp(-((x[0] - m0) ** 2) / (2 * s0)))
        u.x.array[:] /= tt.mass(u)
        g = readout_function("mean")
        tape: list = []
        rep = tt.solve(u, heads, T, n // 4, g, tape=tape)
        _, D = DiscreteAdjoint(tt).backward(tape, (rep.yhat - y) * dyhat_dmu(tt, g), 1)
        ab, bb = heads.abar, heads.bbar
        q = 1.0 - 2.0 * bb * s0 * T
        yhat = m0 * np.exp(ab * T) / np.sqrt(q)
        dG_da = (yhat - y) * yhat * T
        dG_db = (yhat - y) * yhat * s0 * T / q
        exact = dG_da + heads.a * dG_db
        errs.append(np.abs(D[0] - exact).max() / np.abs(exact).max())
        hs.append(8.0 / n)
    rate = np.polyfit(np.log(hs), np.log(errs), 1)[0]
    print("gaussian first variation errors", errs, "rate", rate)
    assert rate > 0.8, f"first-variation error {errs} has rate {rate:.2f}, expected ~1 (DG0)"
    assert errs[-1] < 2e-2
