"""Explicit depth integrators as data: a Shu–Osher table, one forward step, its exact transpose, step control.

One home for the depth stepping of every token solver (the per-sample DG solver, the batched DG0 solver, the
single-layer model; theory §1.3 (F), §2, §3). A scheme is a coefficient table in Shu–Osher form
(Shu & Osher, J. Comput. Phys. 77, 1988; Gottlieb, Shu & Tadmor, SIAM Rev. 43, 2001),

    y₀ = u,   y_i = L_i( Σ_{j<i} α_ij y_j + β_ij h F(y_j) ),  i = 1..s,   u_new = y_s,

with α_ij ≥ 0, Σ_j α_ij = 1 and β_ij ≥ 0, so each stage is a convex combination of forward-Euler steps of
sizes (β_ij/α_ij) h and a positive Euler step makes a positive stage (L_i: the positivity limiter of the
operator, the identity where it has none). The outflow through ∂Ω obeys the same recursion with o₀ = 0 and the
outflow rate in place of F, so the mass balance ∫u_new + o_s = ∫u holds to round-off.

The transpose (the discrete adjoint of one step, theory §3) is read off the same table: with the costate p_s of
u_new,

    q_i = L_i'ᵀ p_i,   p_j += Σ_{i>j} α_ij q_i + h F'(y_j)ᵀ w_j,   w_j = Σ_{i>j} β_ij q_i,

and the derivative with respect to the head masses c, Σ_j h ∂(w_j · F(y_j))/∂c. It is the exact transpose of
the forward step (the Taylor test has slope 2) because it is derived from the same table.

What a solver provides is a :class:`DepthOperator` (forward) and a :class:`DepthAdjoint` (reverse); the states
may be one sample's DG vector, a batch of rows, or any array type with ``+`` and scalar ``*``. Everything is
non-dimensional.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from mfpde.budget import spend
from mfpde.config.schema import DEPTH_SCHEMES
from mfpde.tokens.stepping import MAX_SUBSTEPS, at_depth_step, first_step_error, substeps_error

__all__ = ["DEPTH_SCHEMES", "FORWARD_EULER", "SCHEMES", "SSP_RK2", "SSP_RK3", "SSP_RK3_4", "SSP_RK4_10", "DepthAdjoint",
           "DepthOperator", "ShuOsher",
           "SingleRow", "SubstepOperator", "TapedStep", "depth_step", "step", "step_transpose"]

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class ShuOsher:
    """An explicit Runge–Kutta scheme in Shu–Osher form (the coefficient table is the scheme).

    Attributes:
        name: the scheme's name.
        order: its order of accuracy in the step h.
        alpha: row i−1 holds α_ij for j = 0..i−1 (stage i's convex weights of the earlier stages); each row
            sums to 1 and is non-negative.
        beta: the same layout, β_ij ≥ 0 (stage i's weights of h F(y_j)).

    Raises:
        ValueError: a malformed table (rows of the wrong length, negative weights, α rows not summing to 1).
    """

    name: str
    order: int
    alpha: tuple[tuple[float, ...], ...]
    beta: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        """Check the table (raises ValueError)."""
        if len(self.alpha) != len(self.beta) or not self.alpha:
            raise ValueError(f"{self.name}: alpha and beta need the same positive number of rows")
        for i, (a, b) in enumerate(zip(self.alpha, self.beta, strict=True)):
            if len(a) != i + 1 or len(b) != i + 1:
                raise ValueError(f"{self.name}: row {i} must have {i + 1} entries")
            if min(a) < 0 or min(b) < 0 or abs(sum(a) - 1.0) > 1e-14:
                raise ValueError(f"{self.name}: row {i} is not a convex combination of Euler steps")

    @property
    def stages(self) -> int:
        """The number of stages s (evaluations of F per step)."""
        return len(self.alpha)

    @property
    def ssp_coefficient(self) -> float:
        """The SSP coefficient C = min α_ij/β_ij: the step is positive for h ≤ C × forward Euler's bound."""
        return min((a / b for ra, rb in zip(self.alpha, self.beta, strict=True)
                    for a, b in zip(ra, rb, strict=True) if b > 0), default=math.inf)

    def butcher(self) -> tuple[Array, Array]:
        """The Butcher table (A (s, s), b (s,)) of the same scheme, for order checks (y_i = u + h Σ_j A_ij F_j)."""
        s = self.stages
        # y_i = Σ_j α_ij y_j + β_ij h F_j with y_j = u + h Σ_k A_jk F_k: A_i = Σ_j α_ij A_j + β_ij e_j
        rows = [np.zeros(s)]
        for i in range(1, s + 1):
            r = np.zeros(s)
            for j in range(i):
                r += self.alpha[i - 1][j] * rows[j]
                r[j] += self.beta[i - 1][j]
            rows.append(r)
        return np.array(rows[:s]), rows[s]


#: Forward Euler: the single explicit layer of the shallow model (theory §2), order 1.
FORWARD_EULER = ShuOsher("forward_euler", 1, ((1.0,),), ((1.0,),))
#: Heun's method in SSP form (SSP-RK2), order 2, SSP coefficient 1.
SSP_RK2 = ShuOsher("ssp_rk2", 2, ((1.0,), (0.5, 0.5)), ((1.0,), (0.0, 0.5)))
#: Shu–Osher's third-order SSP scheme, the depth integrator of the transport solvers, SSP coefficient 1.
SSP_RK3 = ShuOsher("ssp_rk3", 3, ((1.0,), (0.75, 0.25), (1.0 / 3.0, 0.0, 2.0 / 3.0)),
                   ((1.0,), (0.0, 0.25), (0.0, 0.0, 2.0 / 3.0)))
#: SSP(4,3) (Kraaijevanger 1991; Ketcheson, SIAM J. Sci. Comput. 30, 2008): order 3, SSP coefficient 2 over 4 stages.
SSP_RK3_4 = ShuOsher("ssp_rk3_4", 3, ((1.0,), (0.0, 1.0), (2.0 / 3.0, 0.0, 1.0 / 3.0), (0.0, 0.0, 0.0, 1.0)),
                     ((0.5,), (0.0, 0.5), (0.0, 0.0, 1.0 / 6.0), (0.0, 0.0, 0.0, 0.5)))
_A10 = tuple((*(0.0,) * i, 1.0) for i in range(10))  # y_i = y_{i−1} + h/6 F(y_{i−1}) but for stages 5 and 10
_B10 = tuple((*(0.0,) * i, 1.0 / 6.0) for i in range(10))
#: Ketcheson's SSP(10,4) (SIAM J. Sci. Comput. 30, 2008, low-storage form): order 4, SSP coefficient 6 over 10 stages.
SSP_RK4_10 = ShuOsher("ssp_rk4_10", 4,
                      (*_A10[:4], (0.6, 0.0, 0.0, 0.0, 0.4), *_A10[5:9], (0.04, 0.0, 0.0, 0.0, 0.36, *(0.0,) * 4, 0.6)),
                      (*_B10[:4], (0.0, 0.0, 0.0, 0.0, 0.4 / 6.0), *_B10[5:9],
                       (0.0, 0.0, 0.0, 0.0, 0.06, *(0.0,) * 4, 0.1)))
#: The schemes by name.
SCHEMES = {s.name: s for s in (FORWARD_EULER, SSP_RK2, SSP_RK3, SSP_RK3_4, SSP_RK4_10)}


class DepthOperator(Protocol):
    """What a token solver provides for the forward step: the right-hand side F of du/dt = F(u).

    ``velocity`` evaluates V[u; ρ] for a state (and keeps it for the ``rate`` call that follows); ``rate``
    returns F(u) = M⁻¹L(u; V) and the outflow rate ∫_∂Ω u (V·n)⁺ (a scalar, or one per row of a batch);
    ``limit`` applies the positivity limiter in place and returns what its transpose needs (None: no-op).
    """

    def velocity(self, state: Any, heads: Any, linearize: bool) -> Any:
        """V[state; heads], in whatever form ``rate`` and the adjoint take (the tape keeps it)."""

    def rate(self, state: Any, vel: Any) -> tuple[Any, Any]:
        """(F(state), outflow rate) for the velocity ``vel`` of this state."""

    def limit(self, state: Any) -> Any:
        """The positivity limiter in place; the record its transpose needs, or None."""


class DepthAdjoint(Protocol):
    """What a token solver provides for the transposed step (theory §3)."""

    def rate_transpose(self, state: Any, heads: Any, vel: Any, costate: Any) -> tuple[Any, Array]:
        """(F'(state)ᵀ costate, ∂(costate · F(state))/∂c), with the taped velocity ``vel`` (None: recompute)."""

    def limit_transpose(self, record: Any, costate: Any) -> Any:
        """The transpose of the limiter that returned ``record`` applied to ``costate``."""


@dataclass(frozen=True)
class TapedStep:
    """One taped step of a scheme: what :func:`step_transpose` differentiates.

    Attributes:
        table: the scheme.
        h: the step size (a float, or shape (S, 1) for the rows of a batch).
        heads: the head measure the step used.
        states: the stage inputs y_0..y_{s−1}.
        vel: the velocity of each stage input, or None where the tape's memory budget was spent.
        limiter: the limiter record after each stage (None: no cell limited).
        layer: the layer block whose ρ the step used (0 for weight-tied models).
        idx: the rows of the batch that took the step (None: one sample).
    """

    table: ShuOsher
    h: Any
    heads: Any
    states: tuple[Any, ...]
    vel: tuple[Any, ...]
    limiter: tuple[Any, ...]
    layer: int = 0
    idx: npt.NDArray[np.int64] | None = field(default=None)


def _outflow_h(h: Any, r: Any) -> Any:
    """The step size h shaped as the outflow rate r (h (S, 1) against r (S,) in a batch; scalars unchanged)."""
    return h if np.ndim(h) in (0, np.ndim(r)) else np.reshape(h, np.shape(r))


def step(table: ShuOsher, op: DepthOperator, u: Any, h: Any, heads: Any, vel0: Any, keep: bool = False,
         budget: Any = None, limited: bool = True) -> tuple[Any, Any, TapedStep | None]:
    """One step of ``table`` from u with the velocity ``vel0`` already evaluated at u (theory §1.3).

    Args:
        table: the scheme.
        op: the solver's right-hand side.
        u: the state (not modified).
        h: the step size (float, or (S, 1) for the rows of a batch).
        heads: passed to ``op.velocity`` for the later stages.
        vel0: ``op.velocity(u, heads, keep)``.
        keep: return the :class:`TapedStep` (with linearised velocities) for the adjoint.
        budget: with ``keep``, a callable vel ↦ vel or None that decides whether a stage velocity is kept
            (the tape's memory budget); None keeps all.
        limited: apply ``op.limit`` after each stage (False: the plain scheme, e.g. the shallow layer).

    Returns:
        (u_new, outflow, taped): the new state, the mass that left Ω during the step (shape of the outflow
        rate), and the taped step (None unless ``keep``).
    """
    s = table.stages
    ys, vels, recs, F, R = [u], [vel0], [], [], []
    out: list[Any] = [0.0]
    y: Any = None
    for i in range(1, s + 1):
        Fj, rj = op.rate(ys[i - 1], vels[i - 1])
        if not keep:
            vels[i - 1] = None  # untaped: the stage's velocity (its softmax factors) is spent
        F.append(Fj)
        R.append(rj * _outflow_h(h, rj))
        y, out_i = None, 0.0
        for j in range(i):
            a, b = table.alpha[i - 1][j], table.beta[i - 1][j]
            if b == 0.0:
                if a == 0.0:
                    continue
                term, o = a * ys[j], a * out[j]
            elif a == 0.0:
                term, o = (b * h) * F[j], b * R[j]
            elif a == 1.0:  # the Euler step of size (β/α) h, as the SSP form is written
                term, o = ys[j] + ((b / a) * h) * F[j], out[j] + (b / a) * R[j]
            else:
                term, o = a * (ys[j] + ((b / a) * h) * F[j]), a * (out[j] + (b / a) * R[j])
            y = term if y is None else y + term
            out_i = out_i + o
        out.append(out_i)
        recs.append(op.limit(y) if limited else None)
        if i < s:
            ys.append(y)
            vels.append(op.velocity(y, heads, keep))
    taped = None
    if keep:
        kept = tuple(v if budget is None else budget(v) for v in vels)
        taped = TapedStep(table, h, heads, tuple(ys), kept, tuple(recs))
    return y, out[s], taped


def step_transpose(adj: DepthAdjoint, taped: TapedStep, p: Any) -> tuple[Any, Any]:
    """The exact transpose of :func:`step` (theory §3): the costate of u from the costate ``p`` of u_new.

    Args:
        adj: the solver's transposed right-hand side and limiter.
        taped: the step, as :func:`step` returned it.
        p: ∂R/∂u_new (the state's shape).

    Returns:
        (p_u, g_c): ∂R/∂u and the step's contribution to ∂R/∂c (c the head masses of ``taped.heads``).
    """
    table, h = taped.table, taped.h
    s = table.stages
    pacc: list[Any] = [None] * s  # the costate of each stage input y_j
    w: list[Any] = [None] * s  # Σ_{i>j} β_ij q_i
    gc: Any = None
    q = adj.limit_transpose(taped.limiter[s - 1], p)
    for i in range(s, 0, -1):
        if i < s:
            q = adj.limit_transpose(taped.limiter[i - 1], pacc[i])
        for j in range(i):
            a, b = table.alpha[i - 1][j], table.beta[i - 1][j]
            if a:
                pacc[j] = a * q if pacc[j] is None else pacc[j] + a * q
            if b:
                w[j] = b * q if w[j] is None else w[j] + b * q
        j = i - 1  # every stage after y_j is done: apply F'(y_j)ᵀ once
        if w[j] is not None:
            f, c = adj.rate_transpose(taped.states[j], taped.heads, taped.vel[j], w[j])
            pacc[j] = h * f if pacc[j] is None else pacc[j] + h * f
            gc = h * c if gc is None else gc + h * c
    return pacc[0], gc


class SubstepOperator(DepthOperator, Protocol):
    """A :class:`DepthOperator` with what the CFL sub-step control needs, over S rows (S = 1: one sample)."""

    def max_stable_dt(self, vel: Any) -> Array:
        """Per row, the largest Δt of a positive forward-Euler step for the velocity ``vel``, shape (S,)."""

    def take(self, state: Any, idx: npt.NDArray[np.int64]) -> Any:
        """The rows ``idx`` of a state (one sample: the state itself)."""

    def put(self, state: Any, idx: npt.NDArray[np.int64], rows: Any) -> Any:
        """The state with rows ``idx`` replaced by ``rows`` (may work in place); returns it."""

    def step_size(self, h: Array) -> Any:
        """The step sizes h (S_r,) in the form the states take (one sample: a float; a batch: (S_r, 1))."""


class SingleRow:
    """The row methods of :class:`SubstepOperator` for an operator whose state is one sample (S = 1)."""

    def take(self, state: Any, idx: npt.NDArray[np.int64]) -> Any:
        """One row: the state itself."""
        return state

    def put(self, state: Any, idx: npt.NDArray[np.int64], rows: Any) -> Any:
        """One row: the new state."""
        return rows

    def step_size(self, h: Array) -> float:
        """One row: h (shape (1,)) as a float."""
        return float(h[0])


def depth_step(table: ShuOsher, op: SubstepOperator, u: Any, dt: float, heads: Any, step_no: int, t: float,
               tape: Any = None, layer: int = 0, budget: Any = None
               ) -> tuple[Any, Array, npt.NDArray[np.int64]]:
    """One depth step of size dt by equal CFL sub-steps of ``table``, per row (theory §1.3, positivity).

    Each row takes n_s = ⌈dt / (C Δt_max)⌉ equal sub-steps (C: the table's SSP coefficient, Δt_max: the positive
    forward-Euler step), Δt_max from the velocity at the start of the depth
    step; where the velocity grows within the depth step beyond the CFL bound (checked before every later
    sub-step), the row's depth step is redone with twice as many. Equal sub-steps keep the step size locally
    constant in ρ, so the discrete adjoint sees a differentiable map.

    Args:
        table: the scheme.
        op: the solver's operator.
        u: the state at depth t (not modified).
        dt: the depth step.
        heads: the head measure of this step.
        step_no: the index of the depth step (0-based, for messages).
        t: its starting depth (for messages).
        tape: if given, every sub-step is appended as a :class:`TapedStep` (``idx``: its rows): a list, or a
            checkpointed tape (:class:`~mfpde.tokens.box.tape.CheckpointedTape`: ``len``, ``append``, ``del tape[n:]``,
            ``mark(state)``, called with the whole state before each sub-step, and ``forecast(step_no, n_s)``,
            called with the largest n_s of the rows before the depth step's sub-steps).
        layer: the layer block recorded on the tape.
        budget: as in :func:`step`.

    Returns:
        (u_new, outflow (S,), n_s (S,)).

    Raises:
        NumericalError: non-finite velocity, or more than ``MAX_SUBSTEPS`` sub-steps (a velocity blow-up).
        StepTooLong: a ConfigError: more than ``MAX_SUBSTEPS`` sub-steps in the first depth step, at the input's
            own velocity (:func:`~mfpde.tokens.stepping.first_step_error`).
    """
    with at_depth_step(step_no + 1, t):  # a failure inside (a non-finite velocity) says where
        n0 = len(tape) if tape is not None else 0
        vel = op.velocity(u, heads, tape is not None)
        ssp = table.ssp_coefficient  # a step of C × the Euler bound is positive (1 for SSP-RK3: the same floats)
        with np.errstate(divide="ignore"):  # a vanishing CFL step: need = inf, refused below
            need = np.ceil(dt / (op.max_stable_dt(vel) * ssp) - 1e-12)  # in floats: no int64 wrap
        if not np.all(need <= MAX_SUBSTEPS):
            if step_no == 0:  # the velocity of the input as given: the step, tokens.cfl or β are to blame
                cfl = getattr(op, "cfl", None) or getattr(getattr(op, "tokens", None), "cfl", None)
                noise = getattr(op, "diffusion_substeps", None)
                raise first_step_error(float(np.max(need)), dt, cfl, getattr(op, "attention", None),
                                       noise(dt) if noise is not None else 0.0)
            raise substeps_error(step_no + 1, t)
        nsub = np.maximum(1, need).astype(np.int64)
        while True:
            if tape is not None and hasattr(tape, "forecast"):  # the sub-steps still to come, for the tape's plan
                tape.forecast(step_no, int(nsub.max()))
            first, vel = [vel], None  # handed over: _substeps drops it after its first round (memory)
            v, outflow, broken = _substeps(table, op, u, first, dt, nsub, heads, layer, tape, budget)
            if not broken.any():
                return v, outflow, nsub
            nsub[broken] *= 2
            if nsub.max() > MAX_SUBSTEPS:
                raise substeps_error(step_no + 1, t)
            if tape is not None:
                del tape[n0:]
            vel = op.velocity(u, heads, tape is not None)


def _substeps(table: ShuOsher, op: SubstepOperator, u: Any, first: list[Any], dt: float,
              nsub: npt.NDArray[np.int64], heads: Any, layer: int, tape: Any, budget: Any) -> tuple[Any, Array, Any]:
    """nsub[r] sub-steps of size dt/nsub[r] for every row r, in rounds; (state, outflow, broken rows).

    ``first`` holds the velocity at u (taken out: no velocity outlives the round that uses it here, nor a taped
    step its hand-over to the tape).
    """
    vel, taped = first.pop(), None
    v = u.copy()
    outflow, broken = np.zeros(len(nsub)), np.zeros(len(nsub), bool)
    for j in range(int(nsub.max())):
        idx = np.flatnonzero(nsub > j)
        h = dt / nsub[idx]
        rows = op.take(v, idx)
        if j > 0:
            vel = None  # the last round's, spent
            vel = op.velocity(rows, heads, tape is not None)
            broken[idx] = h > op.max_stable_dt(vel) * table.ssp_coefficient * (1 + 1e-9)
            if broken.any():
                return v, outflow, broken
        spend(len(idx))
        if tape is not None and hasattr(tape, "mark"):  # a checkpointed tape: the whole state before the sub-step
            tape.mark(v)
        new, o, taped = step(table, op, rows, op.step_size(h), heads, vel, tape is not None, budget)
        if tape is not None:
            assert taped is not None
            tape.append(replace(taped, layer=layer, idx=idx))
            taped = None  # the tape's now (a checkpointed tape may keep none of it)
        v = op.put(v, idx, new)
        outflow[idx] += o
    return v, outflow, broken

