"""The depth integrators as data (mfpde.tokens.rk): order, exact transpose, outflow recursion, step control.

References the code does not produce: the exponential of a matrix (scipy.linalg.expm) for the order, the
order conditions of the Butcher table for each scheme, the inner-product identity ⟨p, J du⟩ = ⟨Jᵀp, du⟩ for the
transpose (to round-off: the map is linear in u), central differences in c for ∂/∂c.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
from roundoff import gamma

from mfpde.fitting import fit_order
from mfpde.tokens import rk

pytestmark = pytest.mark.serial  # pure numpy: the rank count cannot change it


class LinearFlow:
    """du/dt = c (A u) with outflow rate b·u: an operator of the rk protocols over rows (S, n)."""

    def __init__(self, A, b, dtmax=np.inf):
        self.A, self.b, self.dtmax = A, b, dtmax

    def velocity(self, state, heads, linearize):
        return float(heads[0])

    def rate(self, state, vel):
        return vel * state @ self.A.T, state @ self.b

    def limit(self, state):
        return None

    def max_stable_dt(self, vel):
        return np.full(1, self.dtmax)

    def take(self, state, idx):
        return state

    def put(self, state, idx, rows):
        return rows

    def step_size(self, h):
        return float(h[0])

    def rate_transpose(self, state, heads, vel, costate):
        return heads[0] * costate @ self.A, np.array([costate @ (self.A @ state)])

    def limit_transpose(self, record, p):
        return p


def _flow(n=5, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((n, n)) / np.sqrt(n)
    return LinearFlow(A, rng.standard_normal(n)), rng.standard_normal(n)


@pytest.mark.parametrize("table", list(rk.SCHEMES.values()), ids=list(rk.SCHEMES))
def test_order_against_the_matrix_exponential(table):
    """Global error at t = 1 against expm(A) decays at the table's order (fitted, ±0.15)."""
    op, u0 = _flow()
    exact = scipy.linalg.expm(op.A) @ u0
    ns = [8, 16, 32, 64]
    errs = []
    for n in ns:
        u = u0.copy()
        for _ in range(n):
            u, _, _ = rk.step(table, op, u, 1.0 / n, np.array([1.0]), 1.0)
        errs.append(np.linalg.norm(u - exact))
    assert abs(fit_order(1.0 / np.array(ns), errs) - table.order) < 0.15


@pytest.mark.parametrize("table", list(rk.SCHEMES.values()), ids=list(rk.SCHEMES))
def test_butcher_order_conditions(table):
    """The Shu–Osher table's Butcher form meets the order conditions up to its order (and the SSP ones)."""
    A, b = table.butcher()
    c = A.sum(axis=1)
    conds = [b.sum() - 1.0]
    if table.order >= 2:
        conds.append(b @ c - 0.5)
    if table.order >= 3:
        conds += [b @ c**2 - 1 / 3, b @ (A @ c) - 1 / 6]
    if table.order >= 4:
        conds += [b @ c**3 - 1 / 4, b @ (c * (A @ c)) - 1 / 8, b @ (A @ c**2) - 1 / 12, b @ (A @ (A @ c)) - 1 / 24]
    assert np.max(np.abs(conds)) < 1e-15 * 8
    # the SSP coefficients of the literature: 1 (Euler, Heun, Shu–Osher), 2 (SSP(4,3)), 6 (SSP(10,4))
    assert table.ssp_coefficient == pytest.approx({"ssp_rk3_4": 2.0, "ssp_rk4_10": 6.0}.get(table.name, 1.0))


def test_malformed_table_is_refused():
    with pytest.raises(ValueError, match="convex"):
        rk.ShuOsher("bad", 1, ((1.0,), (0.7, 0.2)), ((1.0,), (0.0, 0.5)))
    with pytest.raises(ValueError, match="entries"):
        rk.ShuOsher("bad", 1, ((1.0,), (1.0,)), ((1.0,), (0.0, 0.5)))


@pytest.mark.parametrize("table", list(rk.SCHEMES.values()), ids=list(rk.SCHEMES))
def test_outflow_is_the_same_recursion(table):
    """With F = −b bᵀu/|b|² ... the outflow: ∫u_new + o = ∫u exactly when F conserves Σu + outflow."""
    rng = np.random.default_rng(3)
    n = 6
    # a flow that loses mass only through the outflow: F(u) = K u with 1ᵀK = −bᵀ
    K = rng.standard_normal((n, n))
    b = rng.random(n)
    K -= np.outer(np.ones(n), (np.ones(n) @ K + b)) / n
    op = LinearFlow(K, b)
    u = rng.random(n)
    new, out, _ = rk.step(table, op, u, 0.1, np.array([1.0]), 1.0)
    assert abs(new.sum() + out - u.sum()) <= gamma(8 * n * table.stages) * (np.abs(u).sum() + 1)


@pytest.mark.parametrize("table", list(rk.SCHEMES.values()), ids=list(rk.SCHEMES))
def test_transpose_is_exact(table):
    """⟨p, ∂u_new/∂u du⟩ = ⟨transpose(p), du⟩ to round-off; ∂/∂c against central differences."""
    op, u = _flow(seed=1)
    rng = np.random.default_rng(2)
    p, du = rng.standard_normal(len(u)), rng.standard_normal(len(u))
    c = np.array([0.7])
    h = 0.3
    new, _, taped = rk.step(table, op, u, h, c, op.velocity(u, c, True), keep=True)
    assert taped is not None and len(taped.states) == table.stages
    lin, _, _ = rk.step(table, op, du, h, c, op.velocity(du, c, True))  # linear in u: J du = step(du)
    pu, gc = rk.step_transpose(op, taped, p)
    scale = np.abs(p) @ np.abs(lin) + np.abs(pu) @ np.abs(du)
    assert abs(p @ lin - pu @ du) <= gamma(16 * len(u) * table.stages) * scale
    eps = 1e-5
    up = rk.step(table, op, u, h, c + eps, float(c[0] + eps))[0]
    um = rk.step(table, op, u, h, c - eps, float(c[0] - eps))[0]
    fd = p @ (up - um) / (2 * eps)
    assert gc.shape == (1,)
    # central difference of a polynomial of degree s in c: error ≤ eps² |third derivative| (bounded by h³...)
    assert abs(gc[0] - fd) < 1e-8 * (1 + abs(fd))


def test_depth_step_doubles_where_the_cfl_bound_breaks():
    """n_s = ⌈dt/Δt_max⌉, and the tape holds one TapedStep per sub-step with its layer."""
    op, u = _flow()
    op.dtmax = 0.03
    tape: list[rk.TapedStep] = []
    new, out, nsub = rk.depth_step(rk.SSP_RK3, op, u, 0.1, np.array([1.0]), 0, 0.0, tape=tape, layer=2)
    assert nsub.tolist() == [4] and len(tape) == 4 and all(s.layer == 2 for s in tape)
    ref = u.copy()
    for _ in range(4):
        ref, _, _ = rk.step(rk.SSP_RK3, op, ref, 0.025, np.array([1.0]), 1.0)
    assert np.array_equal(new, ref)


@pytest.mark.parametrize("dtmax", [1e-27, 1e-300, 0.0])
def test_depth_step_refuses_a_vanishing_cfl_step(dtmax):
    """A CFL step so small that the sub-step count would pass MAX_SUBSTEPS (or wrap an int64, 1e-27 → −9e18, and
    run no sub-step at all) is a NumericalError before any sub-step, not a silent no-op; in the first depth step,
    where the velocity is the input's own, it is an input error (StepTooLong, a ConfigError: exit 2)."""
    from mfpde.errors import ConfigError, NumericalError
    from mfpde.tokens.stepping import StepTooLong

    op, u = _flow()
    op.dtmax = dtmax
    with pytest.raises(NumericalError, match="do not converge at depth step 2"):
        rk.depth_step(rk.SSP_RK3, op, u, 0.1, np.array([1.0]), 1, 0.1)
    with pytest.raises(StepTooLong, match="depth step 1 .* CFL sub-steps at t = 0") as info:
        rk.depth_step(rk.SSP_RK3, op, u, 0.1, np.array([1.0]), 0, 0.0)
    assert isinstance(info.value, ConfigError) and not isinstance(info.value, NumericalError)


def test_a_failure_inside_a_depth_step_says_which():
    """A non-finite velocity (cfl_step's NumericalError) said only "non-finite token velocity": it names the depth
    step and its depth; a message that names them already is left as it is."""
    from mfpde.errors import NumericalError
    from mfpde.tokens.stepping import cfl_step

    op, u = _flow()
    op.max_stable_dt = lambda vel: cfl_step(np.array([np.nan]), 0.4)
    with pytest.raises(NumericalError, match=r"^non-finite token velocity at depth step 4, t = 0\.3$"):
        rk.depth_step(rk.SSP_RK3, op, u, 0.1, np.array([1.0]), 3, 0.3)
    op.dtmax = 1e-300
    del op.max_stable_dt
    with pytest.raises(NumericalError, match=r"^the CFL sub-steps do not converge at depth step 4 \(velocity blow-up "
                       r"near t = 0\.3\)$"):
        rk.depth_step(rk.SSP_RK3, op, u, 0.1, np.array([1.0]), 3, 0.3)


class GrowingFlow(LinearFlow):
    """LinearFlow whose CFL bound shrinks as |u| grows: a depth step that breaks and is redone with more sub-steps."""

    def velocity(self, state, heads, linearize):
        return (float(heads[0]), float(np.abs(state).max()))

    def rate(self, state, vel):
        return super().rate(state, vel[0])

    def max_stable_dt(self, vel):
        return np.full(1, 0.05 / vel[1])


def test_checkpointed_tape_replays_redone_depth_steps():
    """Depth steps redone with twice the sub-steps (del tape[n:]) and checkpoints thinned (k doubled): the reverse
    pass through the CheckpointedTape's replayed segments equals the list tape's bit for bit."""
    from mpi4py import MPI

    from mfpde.tokens.box.tape import CheckpointedTape, reverse

    rng = np.random.default_rng(4)
    A = rng.standard_normal((5, 5))
    op, u0, p = GrowingFlow(A + 2 * np.eye(5), rng.standard_normal(5)), rng.standard_normal(5), rng.standard_normal(5)
    c = np.array([1.0])
    class Redone(list):  # a list tape that counts the sub-steps forgotten by redone depth steps
        forgotten = 0

        def __delitem__(self, key):
            Redone.forgotten += len(self) - key.start
            super().__delitem__(key)

    out = []
    for tape in (Redone(), CheckpointedTape(24 * u0.nbytes, op, u0.nbytes, 3, MPI.COMM_SELF)):
        u, nsubs = u0.copy(), []
        for k in range(4):
            u, _, nsub = rk.depth_step(rk.SSP_RK3, op, u, 0.1, c, k, 0.1 * k, tape=tape)
            nsubs.append(int(nsub[0]))
        q, g = p.copy(), np.zeros(1)
        for st in reverse(tape):
            q, gc = rk.step_transpose(op, st, q)
            g += gc
        out.append((u, q, g, nsubs, len(tape)))
    assert np.array_equal(out[0][0], out[1][0]) and out[0][3] == out[1][3] and out[0][4] == out[1][4]
    assert Redone.forgotten > 0, out[0][3]  # a depth step was redone with more sub-steps
    assert tape.every >= 2 and tape.segments >= 2, (tape.every, tape.segments)
    assert np.array_equal(out[0][1], out[1][1]) and np.array_equal(out[0][2], out[1][2])


def test_checkpointed_tape_refuses_a_budget_below_its_checkpoints():
    """A budget that holds one state and one sub-step's stages but not the checkpoints of the sub-steps taken and a
    segment's stage states (half the budget each, about 2 √(n s) states): exit 2's ConfigError, naming the key and
    the bytes needed, during the forward pass."""
    from mpi4py import MPI

    from mfpde.errors import ConfigError
    from mfpde.tokens.box.tape import CheckpointedTape

    rng = np.random.default_rng(4)
    op, u = GrowingFlow(rng.standard_normal((5, 5)) + 2 * np.eye(5), rng.standard_normal(5)), rng.standard_normal(5)
    with pytest.raises(ConfigError, match=r"training.tape_memory: 240 bytes cannot hold the checkpoints .* at least"):
        tape = CheckpointedTape(6 * u.nbytes, op, u.nbytes, 3, MPI.COMM_SELF)  # 4 states pass the first check
        for k in range(4):
            u, _, _ = rk.depth_step(rk.SSP_RK3, op, u, 0.1, np.array([1.0]), k, 0.1 * k, tape=tape)


def test_untaped_step_keeps_one_stage_velocity():
    """An untaped step holds the velocity of one stage at a time (each is spent by its rate: the softmax factors of
    every head, the larger part of a stage, are not kept until the step ends); a taped step keeps all of them.
    Counted: the velocities alive while the last stage's is made."""
    import weakref

    class Vel:
        def __init__(self, c):
            self.c = c

    class Counting(LinearFlow):
        live: list = []  # weak references to the velocities handed out

        def velocity(self, state, heads, linearize):
            v = Vel(float(heads[0]))
            alive = sum(r() is not None for r in self.live)
            self.most = max(getattr(self, "most", 0), alive)  # velocities alive while a new one is made
            self.live.append(weakref.ref(v))
            return v

        def rate(self, state, vel):
            return super().rate(state, vel.c)

    op0, u = _flow()
    for keep, most in ((False, 1), (True, 2)):  # the first stage's is the caller's (an argument of step)
        op = Counting(op0.A, op0.b)
        op.live = []
        rk.step(rk.SSP_RK3, op, u, 0.1, np.array([1.0]), op.velocity(u, np.array([1.0]), keep), keep)
        assert op.most == most, (keep, op.most)
