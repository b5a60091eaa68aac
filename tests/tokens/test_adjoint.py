"""Discrete adjoint and first variation δR/δρ (theory §3): Taylor tests and the Gaussian closed form."""

from __future__ import annotations

from mpi4py import MPI

import dolfinx.fem
import numpy as np
import pytest
from roundoff import gamma

from mfpde.heads import HeadMeasure
from mfpde.mesh import box
from mfpde.params.family import ScalarHeads
from mfpde.params.theta import ThetaSpace
from mfpde.tokens.box.adjoint import DiscreteAdjoint, dyhat_dmu
from mfpde.tokens.box.readout import readout_function
from mfpde.tokens.box.transport import TokenTransport

pytestmark = pytest.mark.ranks  # the rank count can change what it checks: run again under mpiexec


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


# The Taylor tests of the first variation on every token-mesh path (tensor boxes, triangles, a gmsh disk,
# DG0 and DG1) are mfpde.verify.adjoint.taylor_errors, run by tests/verify/test_verify.py::test_check.


def _particle_risk(theta, w, y, m0=0.3, s0=0.25, N=400, steps=50):
    """R = ½(ŷ − y)² of the N-token network dX/dt = V(X) (theory §1.1 as L → ∞, RK4 in depth)."""
    from scipy.stats import norm

    from mfpde.tokens.box.particles import transport_particles

    x = norm.ppf((np.arange(N) + 0.5) / N, loc=m0, scale=np.sqrt(s0))[:, None]
    wt = np.full(N, 1.0 / N)
    x = transport_particles(x, wt, HeadMeasure.from_heads(ScalarHeads(), theta, w), 1.0, steps)
    return 0.5 * (x[:, 0].mean() - y) ** 2


@pytest.mark.serial
def test_particle_gradient():
    """∇_θ δR/δρ at Dirac heads agrees with the gradient of the particle network (theory §3.2):
    ∂R_N/∂θ_h = w_h ∇_θ δR/δρ(θ_h), the particle side by central differences (exact to ~1e-9)."""
    theta = np.array([[-0.5, 0.8], [0.4, 0.5]])
    w = np.array([0.6, 0.4])
    y, delta = 1.2, 1e-3
    comm = MPI.COMM_WORLD
    tt = TokenTransport(box(comm, [[-4.0, 4.0]], [400]), degree=1)
    fam = ScalarHeads()
    # the heads, plus zero-weight heads at a ± δ for D'(a) by central differences
    pts = np.vstack([theta, theta + [delta, 0.0], theta - [delta, 0.0]])
    heads = HeadMeasure.from_heads(fam, pts, np.concatenate([w, np.zeros(4)]), keep_zero=True)
    u = dolfinx.fem.Function(tt.W)
    u.interpolate(lambda x: np.exp(-((x[0] - 0.3) ** 2) / (2 * 0.25)))
    u.x.array[:] /= tt.mass(u)
    g = readout_function("mean")
    tape: list = []
    rep = tt.solve(u, heads, 1.0, 100, g, tape=tape)
    _, D = DiscreteAdjoint(tt).backward(tape, (rep.yhat - y) * dyhat_dmu(tt, g), 1)
    Dk = dict(zip(np.round(heads.a, 12), D[0], strict=True))
    pde = np.array([[v * (Dk[round(a + delta, 12)] - Dk[round(a - delta, 12)]) / (2 * delta), Dk[round(a, 12)]]
                    for a, v in theta])
    eps = 1e-5
    part = np.zeros_like(theta)
    for h in range(2):
        for j in range(2):
            tp, tm = theta.copy(), theta.copy()
            tp[h, j] += eps
            tm[h, j] -= eps
            part[h, j] = (_particle_risk(tp, w, y) - _particle_risk(tm, w, y)) / (2 * eps) / w[h]
    rel = np.abs(pde - part).max() / np.abs(part).max()
    print(f"particle gradient {part.tolist()}, PDE {pde.tolist()}, rel {rel:.2e}")
    assert rel < 1e-2, f"PDE adjoint {pde.tolist()} vs particle gradient {part.tolist()} (rel {rel:.2e})"


def test_gradient_same_on_one_and_two_ranks():
    """The first variation from a token mesh distributed over COMM_WORLD equals the one on COMM_SELF."""
    out = []
    for comm in (MPI.COMM_WORLD, MPI.COMM_SELF):
        tt = TokenTransport(box(comm, [[-3.0, 3.0]] * 2, [12, 12]), degree=0)
        th = ThetaSpace(box(MPI.COMM_WORLD, [[-1.0, 1.0], [-1.0, 1.0]], [4, 4], "triangle"), ScalarHeads())
        rho = th.gaussian([0.2, 0.8], [[0.1, 0.0], [0.0, 0.1]])
        g, y = readout_function("mean"), 1.0
        tape: list = []
        _, yh, heads = _risk(tt, th, rho, g, y, 2, tape, steps=6)
        _, D = DiscreteAdjoint(tt).backward(tape, (yh - y) * dyhat_dmu(tt, g), 1)
        out.append(D[0])
    # Each is the exact-arithmetic first variation plus the round-off of 6 depth steps forward and back:
    # ≤ 10 CFL sub-steps of 3 stages, ≤ 4·5·4 + 12 roundings a DG0 dof (d = 2), each ×2, then Σ over the
    # 144 token cells; relative to the largest |δR/δρ| (the velocity is a sum of heads: no cancellation).
    n_ops = 2 * 6 * 10 * 3 * 92 + 144
    atol = 2 * gamma(n_ops) * np.abs(out[1]).max()
    np.testing.assert_allclose(out[0], out[1], rtol=0, atol=atol)


@pytest.mark.parametrize("d,degree", [(1, 1), (2, 0)])
def test_taped_linearisation_is_the_stage_state(d, degree, monkeypatch):
    """The reverse pass with the velocity's linearisation taped by the forward returns bit for bit what it
    returns when it re-evaluates the velocity at each taped stage state (TAPE_BUDGET_BYTES = 0): each taped
    linearisation belongs to its stage (the same floating-point operations on the same state)."""
    import mfpde.tokens.box.transport as transport

    tt, th = _setup(d, degree, 12)
    rho = th.gaussian([0.2, 0.8], [[0.1, 0.0], [0.0, 0.1]])
    g, y = readout_function("mean"), 1.0
    out = []
    for budget in (transport.TAPE_BUDGET_BYTES, 0):
        monkeypatch.setattr(transport, "TAPE_BUDGET_BYTES", budget)
        tape: list = []
        _, yh, heads = _risk(tt, th, rho, g, y, d, tape, steps=4)
        taped = sum(lin is not None for step in tape for lin in step.vel)
        assert taped == (3 * len(tape) if budget else 0), (taped, len(tape))
        p0, D = DiscreteAdjoint(tt).backward(tape, (yh - y) * dyhat_dmu(tt, g), 1)
        out.append((p0, D[0]))
    assert np.array_equal(out[0][0], out[1][0]) and np.array_equal(out[0][1], out[1][1])


@pytest.mark.parametrize("d,degree", [(1, 1), (2, 0)])
def test_checkpointed_tape_is_bit_identical(d, degree):
    """The reverse pass through a CheckpointedTape whose budget holds a few states (checkpoints every k-th sub-step,
    k doubled as they outgrow half the budget, each segment replayed) returns bit for bit the costate and ∂R/∂c of
    the whole tape (the replay repeats the forward's operations: recorded step sizes and rows, the same limiter
    inputs); on a distributed token mesh the ranks take the same decisions (sizes are their maximum)."""
    from mfpde.tokens.box.tape import CheckpointedTape
    from mfpde.tokens.box.transport import SampleOperator

    tt, th = _setup(d, degree, 12)
    rho = th.gaussian([0.2, 0.8], [[0.1, 0.0], [0.0, 0.1]])
    g, y = readout_function("mean"), 1.0
    state = tt.comm.allreduce(dolfinx.fem.Function(tt.W).x.array.nbytes, op=MPI.MAX)
    out = []
    for budget in (2**40, 12 * state):  # everything; 6 states for the checkpoints, 6 for a segment of 2 sub-steps
        tape = CheckpointedTape(budget, SampleOperator(tt), state, 3, tt.comm)
        _, yh, heads = _risk(tt, th, rho, g, y, d, tape, steps=8)
        p0, D = DiscreteAdjoint(tt).backward(tape, (yh - y) * dyhat_dmu(tt, g), 1)
        out.append((p0, D[0], tape.stats()))
    whole, ckpt = out[0][2], out[1][2]
    assert whole["segments"] == 0 and whole["checkpoint_every"] == 0, whole
    assert ckpt["checkpoint_every"] >= 2 and ckpt["segments"] >= 2, ckpt  # thinned, and more than one segment
    assert ckpt["recomputed_substeps"] == ckpt["substeps"] == whole["substeps"] >= 8, ckpt
    assert np.array_equal(out[0][0], out[1][0]) and np.array_equal(out[0][1], out[1][1])


def test_checkpoint_interval_minimises_the_tape_memory():
    """CheckpointedTape.segment(n, C, T): the k ≥ 1 with the least ⌈n/k⌉ C + k T (n sub-steps, states of C bytes,
    taped sub-steps of T bytes) over every k from 1 to n (it searches only up to 2 √(n C / T) + 2 + C / T)."""
    from mfpde.tokens.box.tape import CheckpointedTape

    for n, C, T in [(1, 8, 100), (27, 131072, 20_000_000), (151, 1000, 10), (64, 1, 1), (100, 50, 3), (9, 7, 7),
                    (500, 3, 1000), (2000, 1000, 3), (300, 40, 1)]:
        k = CheckpointedTape.segment(n, C, T)
        cost = [-(-n // j) * C + j * T for j in range(1, n + 1)]
        assert 1 <= k and -(-n // k) * C + k * T == min(cost), (n, C, T, k, min(cost))


def test_forecast_checkpoints_from_the_start_bit_identical():
    """A depth solve whose whole tape would outgrow the budget: from the forecast (sub-steps of the first depth step
    times the depth steps) the tape checkpoints from the first sub-step every k = √(n C / T) sub-steps, so its peak
    is the least ⌈n/k⌉ C + k T (plus one state), far below the budget it used to fill; the costate and ∂R/∂c equal
    the whole tape's bit for bit."""
    from mfpde.tokens.box.tape import CheckpointedTape
    from mfpde.tokens.box.transport import SampleOperator

    tt, th = _setup(2, 0, 12)
    rho = th.gaussian([0.2, 0.8], [[0.1, 0.0], [0.0, 0.1]])
    g, y, steps = readout_function("mean"), 1.0, 8
    state = tt.comm.allreduce(dolfinx.fem.Function(tt.W).x.array.nbytes, op=MPI.MAX)
    out = []
    budget = 2**40
    for _ in range(2):
        tape = CheckpointedTape(budget, SampleOperator(tt), state, 3, tt.comm, depth_steps=steps)
        _, yh, _ = _risk(tt, th, rho, g, y, 2, tape, steps=steps)
        p0, D = DiscreteAdjoint(tt).backward(tape, (yh - y) * dyhat_dmu(tt, g), 1)
        out.append((p0, D[0], tape.stats(), tape.T))
        budget = out[0][2]["tape_bytes"] - 1  # the whole tape does not fit
    (p_whole, d_whole, whole, T), (p_ck, d_ck, ckpt, _) = out
    n = whole["substeps"]
    least = min(-(-n // k) * state + k * T for k in range(1, n + 1))
    assert whole["segments"] == 0 and ckpt["recomputed_substeps"] == n == ckpt["substeps"], (whole, ckpt)
    assert ckpt["tape_bytes"] <= least + state < budget / 2, (ckpt, least, budget)
    assert np.array_equal(p_whole, p_ck) and np.array_equal(d_whole, d_ck)
