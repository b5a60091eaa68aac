"""Adaptive explicit integration for the Lagrangian token solvers: scipy's DOP853 with a PI step-size controller.

scipy's :class:`scipy.integrate.DOP853` (Dormand–Prince 8(5,3), Hairer–Nørsett–Wanner I §II.10) chooses the next
step from the current error estimate alone (an "I" controller, h ← h·0.9·err^{−1/8}, up to ×10). On the flow maps
of attention dynamics, whose velocity grows as clusters form, that overshoots and rejects: on the circle's
side-by-side problem 9 of 24 attempted steps were rejected at rtol 1e-10. The proportional–integral controller of
Gustafsson (ACM TOMS 17, 1991; Hairer–Wanner II §IV.2), h ← h·0.9·err_n^{−0.7/k}·err_{n−1}^{0.4/k} with k = 8 the
order of the error estimator plus one, damps that growth: 15–25% fewer right-hand sides at equal accuracy there
(``bench/bench_circle.py``). Everything else (the Butcher table, the error norm, dense output, the status) is
scipy's: only ``_step_impl`` is replaced.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.integrate

__all__ = ["DOP853PI", "STALL_STEPS", "STALL_WINDOW", "Stall", "first_step_refused", "record_reached"]


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



#: An integration stalls when the mean step of its last STALL_WINDOW steps would need more than STALL_STEPS further
#: steps to reach its end (hours of CPU at the milliseconds a step costs): a step size held down by round-off in
#: the velocity (unnormalised attention at β = 30 on the sphere: steps of 4e-9 at rtol 1e-10, 2.5e8 steps to T = 1),
#: not by the dynamics, which a stiff integrator follows with growing steps.
STALL_WINDOW = 2000
STALL_STEPS = 10**7


class Stall:
    """The stall guard of a step-by-step integration to ``t_end``: :meth:`check` after every accepted step."""

    def __init__(self, t_end: float) -> None:
        self.t_end = float(t_end)
        self.times: collections.deque[float] = collections.deque(maxlen=STALL_WINDOW + 1)

    def check(self, t: float) -> str | None:
        """None, or what stalls: the mean step of the last :data:`STALL_WINDOW` steps and the steps it still needs."""
        self.times.append(float(t))
        if len(self.times) <= STALL_WINDOW:
            return None
        h = (self.times[-1] - self.times[0]) / STALL_WINDOW
        left = (self.t_end - t) / h if h > 0 else math.inf
        if left <= STALL_STEPS:
            return None
        return (f"its last {STALL_WINDOW} steps averaged {h:.3g}, {left:.3g} more such steps to reach {self.t_end:g} "
                f"(more than a stall's bound of {STALL_STEPS:.0e}); the velocity's round-off may exceed rtol: "
                "raise it")


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
