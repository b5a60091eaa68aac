"""Pseudo-arclength continuation (Keller 1977) with Newton's method, fold and branch-point detection.

Newton's method is PETSc's SNES (:class:`Newton`) or, for the small dense problems of the spectral discretisations,
the same iteration in numpy (:class:`mfpde.continuation_newton.DenseNewton`): any :class:`Solver`.

A problem is F(u, K) = 0, u ∈ R^m, K the parameter, with its exact Jacobian (∂F/∂u (m, m), ∂F/∂K (m,)). A point
of a branch is x = (u, K); the tangent t solves [∂F/∂u ∂F/∂K; t_prevᵀW] t = [0; 1] (W: the weights of the inner
product ⟨x, y⟩ = Σ W x y, which makes a density's and K's changes comparable). A step predicts x + Δs t and
corrects by Newton on the bordered system

    F(x) = 0,   ⟨t, x − (x_prev + Δs t)⟩ = 0

(PETSc SNES, dense Jacobian, LU; COMM_SELF: every rank computes the same branch, so ranks agree), halving Δs on a
failed correction and growing it by 1.5 after an easy one (≤ 3 iterations). Along the branch two test functions
are watched from the second step on (the first may start at a branch point, where both vanish): the
parameter component t_K of the tangent (a sign change: a fold) and det ∂F/∂u (a sign change
without a fold: a branch point). Each is located by the Illinois (modified regula falsi) iteration on Δs from the
point before the change, every trial point corrected by Newton, to |Δs| ≤ 1e-13 (Allgower & Georg,
Numerical Continuation Methods, 1990, ch. 8 and 9). At a simple branch point the null space of [∂F/∂u ∂F/∂K] is
two-dimensional: the new branch starts along its direction orthogonal to the old tangent (:func:`branch_direction`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from mpi4py import MPI  # noqa: F401  (before petsc4py)

import numpy as np
import numpy.typing as npt

__all__ = ["Branch", "Event", "Newton", "Problem", "Solver", "StepControl", "branch_direction",
           "continue_branch", "tangent"]

Array = npt.NDArray[np.float64]
#: The Illinois iteration stops when the bracket in Δs is this small (relative to the step) or after LOCATE_ITS.
LOCATE_TOL = 1e-13
LOCATE_ITS = 60
#: A point whose |det ∂F/∂u| is below this times that of the point before is on a branch point (to round-off).
SINGULAR = 1e-12


class Problem(Protocol):
    """F(u, K) = 0 and its exact Jacobian."""

    def residual(self, u: Array, K: float) -> Array:
        """F(u, K), shape (m,)."""

    def jacobian(self, u: Array, K: float) -> tuple[Array, Array]:
        """(∂F/∂u (m, m), ∂F/∂K (m,))."""


class Solver(Protocol):
    """Newton's method under one linear constraint: :class:`Newton`, :class:`~mfpde.continuation_newton.DenseNewton`."""

    its: int

    def solve(self, x0: Array, a: Array, b: float) -> Array | None:
        """The solution x (m+1,) of F(x) = 0, aᵀx = b from x0, or None if Newton did not converge."""


@dataclass(frozen=True)
class StepControl:
    """Δs: initial, least (a correction failing below it ends the branch), largest; the parameter range; points.

    ``lo``, ``hi``: the branch ends at the end of [lo, hi] it reaches; ``max_points``: at most this many points;
    ``name``: the parameter's symbol in messages.
    """

    ds: float
    ds_min: float
    ds_max: float
    lo: float
    hi: float
    max_points: int
    name: str = "K"


@dataclass
class Event:
    """A located fold or branch point: ``kind`` ("fold" | "branch_point"), x = (u, K), its index among the points."""

    kind: str
    u: Array
    K: float
    index: int
    tangent: Array = field(repr=False)


@dataclass
class Branch:
    """The points (u_j, K_j) of one branch, its events, and why it ended (``stopped``; ``early``: not by range).

    How each point was reached, for a reader that checks the arclength condition: ``tangents[j]`` is the unit
    tangent (⟨t, t⟩_W = 1) the continuation holds at point j (at a branch point landed on, the one before it);
    point j > 0 was corrected from the predictor x_b + Δs t_b with b = ``bases[j]``, Δs = ``steps[j]``, so that
    ⟨t_b, x_j − x_b⟩_W = Δs (point 0: base −1, step 0). A located event's point and the point after it both have
    the point before the event as their base.
    """

    u: list[Array] = field(default_factory=list)
    K: list[float] = field(default_factory=list)
    tangents: list[Array] = field(default_factory=list)
    bases: list[int] = field(default_factory=list)
    steps: list[float] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    stopped: str = ""
    early: bool = False
    newton_its: int = 0


class Newton:
    """Newton's method on F(u, K) = 0 with one linear constraint aᵀx = b, by PETSc SNES (COMM_SELF, dense, LU).

    Args:
        problem: the problem; m its number of unknowns.
        atol: the absolute tolerance of the residual's 2-norm; max_it: Newton iterations at most.

    Call :meth:`close` (or use as a context manager) to free the PETSc objects.
    """

    def __init__(self, problem: Problem, m: int, atol: float = 1e-12, max_it: int = 25):
        from petsc4py import PETSc

        self.problem, self.m = problem, m
        self._a, self._b = np.zeros(m + 1), 0.0
        comm = PETSc.COMM_SELF
        self.snes = PETSc.SNES().create(comm)
        self.J = PETSc.Mat().createDense((m + 1, m + 1), comm=comm)
        self.J.setUp()
        self.r = PETSc.Vec().createSeq(m + 1, comm=comm)
        self.snes.setOptionsPrefix("mfpde_cont_")
        self.snes.setFunction(self._function, self.r)
        self.snes.setJacobian(self._jacobian, self.J)
        self.snes.setType("newtonls")
        self.snes.getLineSearch().setType("basic")
        self.snes.setTolerances(atol=atol, rtol=0.0, stol=0.0, max_it=max_it)
        ksp = self.snes.getKSP()
        ksp.setType("preonly")
        ksp.getPC().setType("lu")
        self.snes.setFromOptions()
        self.its = 0

    def _split(self, X: object) -> tuple[Array, float]:
        x = X.getArray(readonly=True)  # type: ignore[attr-defined]
        return np.array(x[: self.m]), float(x[self.m])

    def _function(self, snes: object, X: object, F: object) -> None:
        u, K = self._split(X)
        f = F.getArray()  # type: ignore[attr-defined]
        f[: self.m] = self.problem.residual(u, K)
        f[self.m] = self._a @ np.concatenate([u, [K]]) - self._b

    def _jacobian(self, snes: object, X: object, J: object, P: object) -> None:
        u, K = self._split(X)
        Ju, JK = self.problem.jacobian(u, K)
        arr = J.getDenseArray()  # type: ignore[attr-defined]
        arr[: self.m, : self.m] = Ju
        arr[: self.m, self.m] = JK
        arr[self.m, :] = self._a
        J.assemble()  # type: ignore[attr-defined]

    def solve(self, x0: Array, a: Array, b: float) -> Array | None:
        """The solution x (m+1,) from x0 under aᵀx = b, or None if SNES did not converge.

        Not converging includes a non-finite x and a PETSc error of SNES itself (a zero pivot of the LU of a
        singular Jacobian); an exception of a callback (a signal's) is raised as it was.
        """
        from petsc4py import PETSc

        self._a, self._b = np.asarray(a, float), float(b)
        X = self.r.duplicate()
        try:
            X.setArray(np.asarray(x0, float))  # type: ignore[arg-type]
            with np.errstate(all="ignore"):
                try:
                    self.snes.solve(None, X)
                except PETSc.Error as e:  # a callback raised: PETSc wraps it (error code 101) with it as the cause
                    if e.__cause__ is not None:  # a signal (mfpde.signals.Interrupted: exit 4), a bug: as it was
                        raise e.__cause__ from None
                    return None  # PETSc's own (a zero pivot of the LU, code 71): Newton did not converge
            self.its += self.snes.getIterationNumber()
            x = np.array(X.getArray(), dtype=float)
            reason = self.snes.getConvergedReason()
            if reason <= 0 or not np.all(np.isfinite(x)):  # type: ignore[operator]
                return None
            return x
        finally:
            X.destroy()

    def close(self) -> None:
        """Destroy the SNES, its matrix and vector (COMM_SELF objects: local, safe at any time)."""
        for obj in (self.snes, self.J, self.r):
            obj.destroy()

    def __enter__(self) -> Newton:
        """The solver itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """:meth:`close`."""
        self.close()


def tangent(problem: Problem, x: Array, prev: Array, W: Array) -> Array:
    """The unit tangent at x (⟨t, t⟩_W = 1) oriented along ``prev`` (⟨t, prev⟩_W > 0), shape (m+1,)."""
    m = len(x) - 1
    Ju, JK = problem.jacobian(x[:m], float(x[m]))
    B = np.vstack([np.column_stack([Ju, JK]), (W * prev)[None, :]])
    rhs = np.zeros(m + 1)
    rhs[m] = 1.0
    t = np.linalg.solve(B, rhs)
    return t / math.sqrt(float(np.sum(W * t * t)))


def branch_direction(problem: Problem, x: Array, t_old: Array, W: Array) -> Array:
    """At a simple branch point x: the unit direction of the new branch, orthogonal (in W) to the old tangent.

    The null space of [∂F/∂u ∂F/∂K] (m × (m+1)) is two-dimensional there (the two smallest singular values).
    """
    m = len(x) - 1
    Ju, JK = problem.jacobian(x[:m], float(x[m]))
    s = np.sqrt(W)
    _, _, Vt = np.linalg.svd(np.column_stack([Ju, JK]) / s[None, :])
    null = Vt[-2:].T / s[:, None]  # two vectors spanning the null space in the x coordinates
    told = t_old / math.sqrt(float(np.sum(W * t_old * t_old)))
    d = null - np.outer(told, (W * told) @ null)
    v = d[:, int(np.argmax(np.sum(W[:, None] * d * d, axis=0)))]
    return v / math.sqrt(float(np.sum(W * v * v)))


def _det(problem: Problem, x: Array) -> float:
    m = len(x) - 1
    sign, logdet = np.linalg.slogdet(problem.jacobian(x[:m], float(x[m]))[0])
    return float(sign * math.exp(min(logdet, 700.0)))


def _correct(newton: Solver, x: Array, t: Array, ds: float, W: Array) -> Array | None:
    pred = x + ds * t
    a = W * t
    return newton.solve(pred, a, float(a @ pred))


def _locate(newton: Solver, x: Array, t: Array, ds: float, W: Array, test: Callable[[Array], float],
            f0: float, f1: float) -> tuple[Array, float]:
    """(the point of the step from x along t where ``test`` changes sign, its Δs): Illinois on Δs ∈ (0, ds)."""
    a, b, fa, fb = 0.0, ds, f0, f1
    best, at = None, 0.0
    side = 0
    for _ in range(LOCATE_ITS):
        c = b - fb * (b - a) / (fb - fa) if fb != fa else 0.5 * (a + b)
        if not min(a, b) < c < max(a, b):
            c = 0.5 * (a + b)
        y = _correct(newton, x, t, c, W)
        if y is None:
            break
        best, at, fc = y, c, test(y)
        if fc == 0.0 or abs(b - a) <= LOCATE_TOL * abs(ds):
            break
        if (fc > 0) == (fb > 0):  # c replaces b
            b, fb = c, fc
            if side == -1:
                fa *= 0.5
            side = -1
        else:
            a, fa = c, fc
            if side == 1:
                fb *= 0.5
            side = 1
    if best is None:
        best, at = _correct(newton, x, t, 0.5 * ds, W), 0.5 * ds
    return (best, at) if best is not None else (x, 0.0)


def _fold_test(problem: Problem, t_old: Array, W: Array) -> Callable[[Array], float]:
    """X ↦ t_K(x), the parameter component of the tangent oriented along ``t_old``."""
    return lambda v: float(tangent(problem, v, t_old, W)[-1])


def continue_branch(problem: Problem, newton: Solver, x0: Array, t0: Array, W: Array, ctl: StepControl,
                    resolved: Callable[[Array], bool] | None = None, deadline: float = math.inf,
                    regular_start: bool = False, marks: Array | None = None,
                    resolved_point: Callable[[Array], bool] | None = None) -> Branch:
    """Follow the branch through x0 (a solution, (m+1,)) along the tangent t0 to an end of [lo, hi] or max_points.

    t0 is taken as given (at a branch point the bordered tangent system is singular: there it is the direction of
    :func:`branch_direction`). ``regular_start``: x0 is a regular point (not a branch point), so the first step is
    watched for folds and branch points too. A step that leaves [lo, hi] is replaced by the point at the end of
    the range (K held there by Newton), and is watched as any other. ``marks``: parameter values of known branch
    points (the uniform state's thresholds in closed form); a step crossing two is halved (down to ``ds_min``),
    since the sign of det ∂F/∂u does not change across an even number of them. ``resolved`` (given u) or
    ``resolved_point`` (given the point x = (u, K), for a problem whose state depends on K too: the spectral
    discretisations' Gibbs density) ends the branch at a state the discretisation does not resolve.

    Returns:
        The branch (its first point x0), with the located folds and branch points; ``stopped`` says why it ended.
    """
    import time

    m = len(x0) - 1
    x, t = x0.copy(), t0 / math.sqrt(float(np.sum(W * t0 * t0)))
    br = Branch(u=[x0[:m].copy()], K=[float(x0[m])], tangents=[t.copy()], bases=[-1], steps=[0.0])
    ix = 0  # the index of x among the points
    det0, pending = _det(problem, x0) if regular_start else math.nan, None
    ds = ctl.ds
    its0 = newton.its
    while len(br.K) < ctl.max_points:
        if time.process_time() > deadline:
            br.stopped, br.early = f"CPU budget exhausted at {ctl.name} = {x[m]:.10g}", True
            break
        y = _correct(newton, x, t, ds, W)
        if y is not None and not math.isfinite(det1 := _det(problem, y)):
            y = None  # the Jacobian failed there (a token solve failed): as a failed correction
        if y is None:
            ds *= 0.5
            if ds < ctl.ds_min:
                br.stopped, br.early = (f"Newton failed at step size {ds:.3g} < continuation.step_min after "
                                        f"{ctl.name} = {x[m]:.10g}"), True
                break
            continue
        if marks is not None and ds > ctl.ds_min and np.count_nonzero((marks - x[m]) * (marks - y[m]) < 0) > 1:
            ds = max(0.5 * ds, ctl.ds_min)  # one branch point a step: det's sign sees an odd count only
            continue
        end = None
        if not ctl.lo <= y[m] <= ctl.hi:  # the step leaves the range: the last one, to the range's end instead
            end = ctl.hi if y[m] > ctl.hi else ctl.lo
            y = newton.solve(x + (end - x[m]) / (y[m] - x[m]) * (y - x), np.eye(m + 1)[m], end)
            if y is None:
                br.stopped = f"the step after {ctl.name} = {x[m]:.10g} left the range [{ctl.lo:g}, {ctl.hi:g}]"
                break
            ds = float((W * t) @ (y - x))  # its arclength, where events on it are located
            det1 = _det(problem, y)
        # a step that lands on a branch point (to round-off: det ≈ 0, the tangent system singular) keeps the tangent
        # and the sign before it; the event is that point if the sign changes on the next step
        singular = abs(det1) <= SINGULAR * (abs(det0) if math.isfinite(det0) else 1.0)
        t_new = t.copy() if singular else tangent(problem, y, t, W)
        if (len(br.K) == 1 and not regular_start) or singular:  # from a branch point: t_K ≈ 0, det ≈ 0 there
            pass
        elif (t[m] > 0) != (t_new[m] > 0):
            z, dz = _locate(newton, x, t, ds, W, _fold_test(problem, t, W), t[m], t_new[m])
            br.events.append(Event("fold", z[:m], float(z[m]), len(br.K), tangent(problem, z, t, W)))
            br.u.append(z[:m].copy())  # the located point is a point of the branch
            br.K.append(float(z[m]))
            br.tangents.append(br.events[-1].tangent.copy())
            br.bases.append(ix)
            br.steps.append(dz)
        elif (det0 > 0) != (det1 > 0):
            # the tangent of the step before (at the branch point the bordered tangent system is singular)
            if pending is not None:
                br.events.append(Event("branch_point", pending[:m], float(pending[m]), len(br.K) - 1, t.copy()))
            else:
                z, dz = _locate(newton, x, t, ds, W, lambda v: _det(problem, v), det0, det1)
                br.events.append(Event("branch_point", z[:m], float(z[m]), len(br.K), t.copy()))
                br.u.append(z[:m].copy())
                br.K.append(float(z[m]))
                br.tangents.append(t.copy())  # the bordered tangent system is singular there
                br.bases.append(ix)
                br.steps.append(dz)
        pending = y if singular else None
        x, t, det0 = y, t_new, det0 if singular else det1
        br.u.append(x[:m].copy())
        br.K.append(float(x[m]))
        br.tangents.append(t.copy())
        br.bases.append(ix)
        br.steps.append(ds)
        ix = len(br.K) - 1
        if end is not None:
            br.stopped = f"{ctl.name} reached the end {end:g} of the range"
            break
        if (resolved is not None and not resolved(x[:m])) or (resolved_point is not None and not resolved_point(x)):
            br.stopped = f"the state at {ctl.name} = {x[m]:.10g} is not resolved by the collocation points"
            br.early = True
            break
        its = newton.its - its0
        its0 = newton.its
        ds = min(1.5 * ds, ctl.ds_max) if its <= 3 else (0.5 * ds if its >= 8 else ds)
    else:
        br.stopped = f"continuation.max_points = {ctl.max_points} reached"
    br.newton_its = newton.its
    return br
