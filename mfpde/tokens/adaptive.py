"""Adaptive integration for the Lagrangian token solvers: scipy's DOP853 with a PI step-size controller, then LSODA.

scipy's :class:`scipy.integrate.DOP853` (Dormand–Prince 8(5,3), Hairer–Nørsett–Wanner I §II.10) chooses the next
step from the current error estimate alone (an "I" controller, h ← h·0.9·err^{−1/8}, up to ×10). On the flow maps
of attention dynamics, whose velocity grows as clusters form, that overshoots and rejects: on the circle's
side-by-side problem 9 of 24 attempted steps were rejected at rtol 1e-10. The proportional–integral controller of
Gustafsson (ACM TOMS 17, 1991; Hairer–Wanner II §IV.2), h ← h·0.9·err_n^{−0.7/k}·err_{n−1}^{0.4/k} with k = 8 the
order of the error estimator plus one, damps that growth: 15–25% fewer right-hand sides at equal accuracy there
(``bench/bench_circle.py``). Everything else (the Butcher table, the error norm, dense output, the status) is
scipy's: only ``_step_impl`` is replaced.

A flow map (the circle's, the sphere's) steps DOP853 while it is not stiff (:func:`explicit_phase`) and hands over to
scipy's :class:`scipy.integrate.LSODA` (ODEPACK, BDF with a dense Jacobian) once collapsing clusters hold the
explicit step by stability (:func:`stiff_phase`); both record the outputs each step reaches by its dense output, and
both stop at a CPU deadline and at a stall (:class:`Stall`).
"""

from __future__ import annotations

import collections
import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.integrate

__all__ = ["DOP853PI", "STALL_SPREAD", "STALL_STEPS", "STALL_WINDOW", "STALL_WINDOWS", "Stall", "explicit_phase",
           "first_step_refused", "record_reached", "stiff_phase"]


class DOP853PI(scipy.integrate.DOP853):
    """:class:`scipy.integrate.DOP853` with Gustafsson's PI step-size controller (see the module).

    Attributes:
        alpha, beta: the controller's exponents 0.7/8 and 0.4/8; safety 0.9; factors clamped to [0.2, 5].
    """

    alpha, beta, safety, fmin, fmax = 0.7 / 8, 0.4 / 8, 0.9, 0.2, 5.0

    def __init__(self, fun: Callable[[float, Any], Any], *args: Any, controlled: int | None = None,
                 absolute: bool = False, **kwargs: Any) -> None:
        super().__init__(fun, *args, **kwargs)
        self._rhs = fun  # called directly by the steps: it must return an array (n,) of y's dtype
        self._c = [float(c) for c in self.C]
        if self.E3[-1] != 0.0 or self.E5[-1] != 0.0:  # scipy's tableau changed: _rk_step would be wrong
            raise RuntimeError("DOP853's error estimators weigh f(t + h, y_new), which _rk_step leaves out")
        self._err_prev = 1.0
        self._nc = self.n if controlled is None else int(controlled)
        self._scale = (np.asarray(self.atol, float) * np.ones(self._nc)) if absolute else None

    t: float
    y: Any
    A: Any
    B: Any
    C: Any
    K: Any
    E3: Any
    E5: Any

    def _rk_step(self, t: float, y: Any, h: float) -> Any:
        """The stages and the new state of one step: scipy's ``rk_step`` without its last evaluation.

        f(t + h, y_new) is not weighed by DOP853's error estimators (E3, E5 end in 0): it is evaluated once the step
        is accepted (:meth:`_step_impl`), and a rejected step is spared it.
        """
        K, hA, fun = self.K, h * self.A, self._rhs
        K[0] = self.f
        for s, c in enumerate(self._c[1:], start=1):
            K[s] = fun(t + c * h, y + hA[s, :s] @ K[:s])
        self.nfev += len(self._c) - 1
        return y + (h * self.B) @ K[:-1]

    def _estimate_error_norm(self, K: Any, h: float, scale: Any) -> float:
        """The error norm of scipy's DOP853, |h|·‖e₅‖²/√((‖e₅‖² + ‖e₃‖²/100)·n) with e = (E·K)/scale, in fewer calls."""
        e5 = self.E5[:-1] @ K[:-1]  # the last row, f(t + h, y_new), has weight 0 and is not computed yet
        e5 /= scale
        e3 = self.E3[:-1] @ K[:-1]
        e3 /= scale
        n5, n3 = float(e5 @ e5), float(e3 @ e3)
        if n5 == 0.0 and n3 == 0.0:
            return 0.0
        return abs(h) * n5 / math.sqrt((n5 + 0.01 * n3) * len(scale))

    f: Any
    h_abs: float

    def _step_impl(self) -> tuple[bool, str | None]:
        t, y = self.t, self.y
        min_step = 10 * np.abs(np.nextafter(t, self.direction * np.inf) - t)
        h_abs = min(max(self.h_abs, min_step), self.max_step)
        rejected = False
        while True:
            if not h_abs >= min_step:  # also a NaN step (a non-finite right-hand side): stop, never loop
                return False, self.TOO_SMALL_STEP
            t_new = t + h_abs * self.direction
            if self.direction * (t_new - self.t_bound) > 0:
                t_new = self.t_bound
            h = t_new - t
            h_abs = abs(h)
            y_new = self._rk_step(t, y, h)
            nc = self._nc
            scale = (self._scale if self._scale is not None
                     else self.atol + np.maximum(np.abs(y[:nc]), np.abs(y_new[:nc])) * self.rtol)
            err = float(self._estimate_error_norm(self.K[:, :nc], h, scale))
            if not np.isfinite(err):  # a non-finite stage: shrink as for a large error
                h_abs *= self.fmin
                rejected = True
                continue
            if err < 1:
                fac = self.fmax if err == 0 else min(self.fmax, self.safety * err**-self.alpha
                                                     * self._err_prev**self.beta)
                if rejected:
                    fac = min(1.0, fac)
                self._err_prev = max(err, 1e-4)
                break
            h_abs *= max(self.fmin, self.safety * err ** (-1.0 / 8))
            rejected = True
        self.h_previous = h
        self.y_old = y
        self.t = t_new
        self.y = y_new
        self.h_abs = h_abs * fac
        self.K[-1] = self.f = self._rhs(t_new, y_new)  # the first stage of the next step (and dense output's)
        self.nfev += 1
        return True, None


def record_reached(solver: Any, t_out: Any, i: int, record: Callable[[Any], None]) -> int:
    """Record the outputs ``t_out[i:]`` that the last step of ``solver`` (a scipy ``OdeSolver``) reached.

    An output at the step's end is its state (the last depth is ``t_bound``: no interpolant is needed); one
    inside the step comes from the step's dense output. Returns the index of the next output not reached.
    """
    dense = None
    while i < len(t_out) and t_out[i] <= solver.t:
        if t_out[i] == solver.t:
            record(solver.y)
        else:
            dense = dense or solver.dense_output()
            record(dense(t_out[i]))
        i += 1
    return i


#: An integration stalls when its steps have stopped changing (the means of its last STALL_WINDOWS windows of
#: STALL_WINDOW steps within a factor STALL_SPREAD of each other) while that step would need more than STALL_STEPS
#: further steps to reach the end: a step held by round-off in the velocity, not by the dynamics, which a stiff
#: integrator follows with steps that shrink through a collapse and grow after it. Measured on the sphere's flow map
#: (unnormalised attention, rtol 1e-10): at β = 30 with 32 particles the steps stay at 6.6e-8 (1.5e8 more to
#: T = 10, hours: a spread of 1.06); runs that end (β = 16..22 to T = 12..200) shrink their steps 2× and more in a
#: window through a collapse, with up to 2.6e6 steps "left" at that step, and need 2e4-2e5 in all.
STALL_WINDOW, STALL_WINDOWS, STALL_SPREAD, STALL_STEPS = 1000, 4, 1.25, 10**7


class Stall:
    """The stall guard of a step-by-step integration to ``t_end``: :meth:`check` after every accepted step.

    It keeps the depth of every :data:`STALL_WINDOW`-th step only, and judges at those steps.
    """

    def __init__(self, t_end: float) -> None:
        self.t_end = float(t_end)
        self.size = STALL_WINDOW * STALL_WINDOWS + 1  # the steps that fill the windows: the first judgement
        self.steps = 0
        self.ends: collections.deque[float] = collections.deque(maxlen=STALL_WINDOWS + 1)  # the windows' ends

    def check(self, t: float) -> str | None:
        """None, or what stalls: the mean steps of the last windows and the steps still needed."""
        self.steps += 1
        if (self.steps - 1) % STALL_WINDOW:
            return None
        self.ends.append(float(t))
        if len(self.ends) <= STALL_WINDOWS:
            return None
        ts = self.ends
        means = [(ts[k + 1] - ts[k]) / STALL_WINDOW for k in range(STALL_WINDOWS)]
        h = means[-1]
        left = (self.t_end - t) / h if h > 0 else math.inf
        if left <= STALL_STEPS or not (min(means) > 0 and max(means) <= STALL_SPREAD * min(means)):
            return None
        return (f"its steps have stayed at {h:.3g} for {STALL_WINDOW * STALL_WINDOWS} steps, {left:.3g} more such "
                f"steps to reach {self.t_end:g}; the velocity's round-off may exceed rtol (unnormalised attention: "
                "ε e^β): raise rtol or lower β")


def first_step_refused(beta: float, msg: str) -> Exception:
    """The input refused (exit 2, as the DG solvers' first depth step): no explicit step at t = 0 was possible.

    The unnormalised kernel's velocity grows like e^β: at β = 700 (the door's bound) it is ≈ 1e302 and the first
    step underflows (exit 3, "numerical failure", where DG said exit 2 naming tokens.beta). ``beta``: the heads'
    largest.
    """
    from mfpde.errors import InputRefused

    return InputRefused(f"tokens.beta: the flow map cannot take its first step at t = 0 ({msg.rstrip('.')}), with "
                        f"the velocity of the input itself (nothing has moved yet): β = {beta:g} (heads.init's a); "
                        "lower β: the unnormalised kernel's velocity grows like e^β")


def explicit_phase(solver: DOP853PI, t_out: Any, i: int, record: Callable[[Any], None],
                   stiff: Callable[[DOP853PI], bool], stats: dict[str, Any], fail: Callable[[str], Exception],
                   name: str, deadline: float = math.inf,
                   first_step: Callable[[str], Exception] | None = None) -> int:
    """The explicit phase of a flow map (the circle's, the sphere's): step ``solver`` until it hands over.

    Steps until every output of ``t_out[i:]`` is reached (each recorded by ``record`` of the state), or ``stiff``
    of the solver, asked after each accepted step that leaves outputs to reach, says to hand over to a stiff
    integrator (``stats["switch_t"]`` is then its depth); the stiff phase starts from ``solver.t``, ``solver.y``.
    Counts ``stats["explicit_steps"]``.

    Args:
        solver: the explicit integrator, at the phase's start.
        t_out: the output depths (increasing).
        i: the index of the first output not reached yet.
        record: called with the state at each output reached.
        stiff: the stiffness test (it may keep its own counts).
        stats: the integrator's statistics (``explicit_steps``, ``switch_t``).
        fail: the exception (with the outputs reached) of a failure, from its message; ``name`` starts the message.
        name: the solver's name in messages ("flow map", "sphere flow").
        deadline: a ``time.process_time()`` past which the solve stops.
        first_step: the exception where the first step fails (the input's own velocity), or None: ``fail``'s.

    Returns:
        The index of the next output not reached.

    Raises:
        ``fail``'s exception: a failed or non-finite step, the deadline, a stall (:class:`Stall`).
    """
    stall = Stall(float(t_out[-1]))
    while i < len(t_out):
        msg = solver.step()
        stats["explicit_steps"] += 1
        if solver.status == "failed" or not np.all(np.isfinite(solver.y)):
            if solver.t == 0.0 and first_step is not None:
                raise first_step(msg or "a non-finite velocity")
            raise fail(f"{name}: the explicit integrator failed at t = {solver.t:.6g} ({msg})")
        i = record_reached(solver, t_out, i, record)
        if i >= len(t_out) or solver.status == "finished":
            break
        if stiff(solver):
            stats["switch_t"] = float(solver.t)
            break
        if time.process_time() > deadline:
            raise fail(f"{name}: CPU-time budget exceeded at t = {solver.t:.6g}")
        if (why := stall.check(solver.t)) is not None:
            raise fail(f"{name}: the explicit integrator stalls at t = {solver.t:.6g} (rtol {solver.rtol:g}): {why}")
    return i


def stiff_phase(fun: Callable[[float, Any], Any], jac: Callable[[float, Any], Any] | None, t: float, y: Any,
                t_out: Any, i: int, rtol: float, atol: float, record: Callable[[Any], None], stats: dict[str, Any],
                fail: Callable[[str], Exception], name: str, deadline: float = math.inf) -> None:
    """The stiff phase of a flow map (the circle's, the sphere's): LSODA from (t, y) to the last output depth.

    Steps scipy's :class:`scipy.integrate.LSODA` (ODEPACK: Adams while the flow is not stiff, BDF with the Jacobian
    ``jac`` while it is) one step at a time until every output of ``t_out[i:]`` is reached, each recorded by
    ``record`` of the state there (:func:`record_reached`: the step's dense output inside a step). Counts
    ``stats["stiff_steps"]``, ``stats["njev"]`` and ``stats["nlu"]`` (LSODA's Jacobians and LU factorisations).

    Args:
        fun: the velocity, fun(t, y) -> (n,).
        jac: its Jacobian, jac(t, y) -> (n, n), or None: LSODA's finite differences.
        t: the depth the phase starts from (the explicit phase's last).
        y: the state there (n,).
        t_out: the output depths (increasing, the first of ``t_out[i:]`` after ``t``).
        i: the index of the first output not reached yet.
        rtol: LSODA's relative tolerance.
        atol: its absolute tolerance.
        record: called with the state at each output reached.
        stats: the integrator's statistics (``stiff_steps``, ``njev``, ``nlu``).
        fail: the exception (with the outputs reached) of a failure, from its message; ``name`` starts the message.
        name: the solver's name in messages ("flow map", "sphere flow").
        deadline: a ``time.process_time()`` past which the solve stops (checked after each step).

    Raises:
        ``fail``'s exception: a failed step (ODEPACK's reason in the message) or a non-finite state, the deadline,
        a stall (:class:`Stall`).
    """
    solver = scipy.integrate.LSODA(fun, t, y, float(t_out[-1]), rtol=rtol, atol=atol, jac=jac)
    stall = Stall(float(t_out[-1]))
    with warnings.catch_warnings():  # a failure is told by fail's message (ODEPACK's reason), not by scipy's warning
        warnings.filterwarnings("ignore", message="lsoda: ", category=UserWarning)
        while i < len(t_out):
            msg = solver.step()
            stats["stiff_steps"] += 1
            if solver.status == "failed" or not np.all(np.isfinite(solver.y)):
                raise fail(f"{name}: the stiff integrator failed at t = {solver.t:.6g} ({_lsoda_reason(solver, msg)})")
            i = record_reached(solver, t_out, i, record)
            stats["njev"], stats["nlu"] = int(solver.njev), int(solver.nlu)
            if i < len(t_out) and time.process_time() > deadline:
                raise fail(f"{name}: CPU-time budget exceeded at t = {solver.t:.6g}")
            if i < len(t_out) and (why := stall.check(solver.t)) is not None:
                raise fail(f"{name}: the stiff integrator stalls at t = {solver.t:.6g} (rtol {rtol:g}): {why}")


def _lsoda_reason(solver: Any, msg: str | None) -> str:
    """Why LSODA's step failed: ODEPACK's message of its istate (< 0), else scipy's ``msg``, else a non-finite state."""
    ode = getattr(getattr(solver, "_lsoda_solver", None), "_integrator", None)
    istate = getattr(ode, "istate", 0)
    reason = getattr(ode, "messages", {}).get(istate) if isinstance(istate, int) and istate < 0 else None
    return str(reason or msg or "a non-finite state")
