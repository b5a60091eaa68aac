"""The continuation's Newton solvers, chosen per problem, and the root finder of its Maxwell points.

* :class:`DenseNewton`: the iteration of PETSc's SNES (:class:`mfpde.continuation.Newton`) in numpy, for the
  spectral discretisations' few dozen unknowns, where SNES's own cost would dominate; no PETSc is started.
* :func:`newton_solver`: the one a stationary problem asks for (``dense_newton``), its options from
  ``PETSC_OPTIONS`` under the prefix ``-mfpde_cont_`` (refused as input, exit 2, where they do not apply).
* :func:`brent`: Brent's method as scipy.optimize.brentq, so that the continuation does not import scipy (0.4 s of
  start-up on a command that takes 0.3 s).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from mfpde.continuation import Newton, Problem
from mfpde.errors import InputRefused

__all__ = ["DENSE_AS_IS", "DENSE_OPTIONS", "NEWTON_PREFIX", "DenseNewton", "brent", "dense_newton_options",
           "newton_solver", "start_petsc"]

Array = npt.NDArray[np.float64]


class DenseNewton:
    """Newton's method on F(u, K) = 0 with one linear constraint aᵀx = b, in numpy (LAPACK's LU): no PETSc.

    The iteration of :class:`~mfpde.continuation.Newton` (SNES ``newtonls`` with the basic line search,
    ``rtol = stol = 0``): full steps x ← x − J⁻¹F until ‖(F, aᵀx − b)‖₂ ≤ ``atol`` (tested before each step, so a
    solution takes none), failing on a non-finite residual, a singular Jacobian, a residual 10⁴ times the first
    (SNES's divergence test) or ``max_it`` steps. For the small dense problems of the spectral discretisations,
    where SNES's own cost would dominate. Same interface: :meth:`solve`, ``its``, :meth:`close` (nothing to free).
    """

    #: SNES's divergence tolerance: a residual above this times the first ends the iteration (diverged).
    DIVTOL = 1e4

    def __init__(self, problem: Problem, m: int, atol: float = 1e-12, max_it: int = 25):
        self.problem, self.m, self.atol, self.max_it = problem, m, float(atol), int(max_it)
        self.its = 0

    def solve(self, x0: Array, a: Array, b: float) -> Array | None:
        """The solution x (m+1,) from x0 under aᵀx = b, or None if Newton did not converge."""
        m = self.m
        a = np.asarray(a, float)
        x = np.array(x0, dtype=float)
        J = np.empty((m + 1, m + 1))
        J[m] = a
        f = np.empty(m + 1)
        first = math.nan
        with np.errstate(all="ignore"):
            for it in range(self.max_it + 1):
                f[:m] = self.problem.residual(x[:m], float(x[m]))
                f[m] = a @ x - b
                norm = math.sqrt(float(f @ f))
                if not math.isfinite(norm):
                    return None
                if it == 0:
                    first = norm
                elif norm > self.DIVTOL * first:
                    return None
                if norm <= self.atol:
                    return x if np.all(np.isfinite(x)) else None
                if it == self.max_it:
                    return None
                Ju, JK = self.problem.jacobian(x[:m], float(x[m]))
                J[:m, :m] = Ju
                J[:m, m] = JK
                try:
                    dx = np.linalg.solve(J, f)
                except np.linalg.LinAlgError:
                    return None
                x -= dx
                self.its += 1
        return None

    def close(self) -> None:
        """Nothing to free (for the interface of :class:`~mfpde.continuation.Newton`)."""

    def __enter__(self) -> DenseNewton:
        """The solver itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """:meth:`close`."""


#: The options prefix of the continuation's SNES (:class:`mfpde.continuation.Newton`).
NEWTON_PREFIX = "mfpde_cont_"


def newton_solver(P: Any, atol: float = 1e-12) -> Newton | DenseNewton:
    """The continuation's Newton solver of P, its PETSc options refused as input (exit 2), not as a bug.

    A problem with ``dense_newton`` (the spectral discretisations: a few dozen unknowns) is solved by numpy's
    :class:`DenseNewton` (the same iteration, no PETSc); the others by PETSc's SNES.
    ``PETSC_OPTIONS="-mfpde_cont_snes_type bogus"`` raised PETSc's error 86 from SNESSetFromOptions (exit 1 and its
    stack, on every rank).

    Raises:
        InputRefused: naming ``PETSC_OPTIONS`` and the options of the prefix given (the output directory is
            restored: :mod:`mfpde.outdir`).
    """
    if getattr(P, "dense_newton", False):
        return DenseNewton(P, P.m, **dense_newton_options(atol))
    start_petsc()
    from petsc4py import PETSc

    db = PETSc.Options()
    given = " ".join(f"-{k} {v}".rstrip() for k, v in sorted(db.getAll().items()) if k.startswith(NEWTON_PREFIX))
    try:
        newton = Newton(P, P.m, atol=atol)
    except PETSc.Error as e:
        lines = [ln.split("] ", 1)[-1].strip() for ln in str(e).splitlines() if ln.strip()]
        why = lines[-1] if lines else str(e)
        raise InputRefused(f"PETSC_OPTIONS (or the command line): PETSc rejected {given or 'the options'} of the "
                           f"continuation's Newton solver (prefix -{NEWTON_PREFIX}): {why}") from None
    return newton


#: The options of the continuation's prefix that numpy's Newton reads (the others are SNES's: refused there), with
#: their types; and those it takes as they are (its iteration is SNES's newtonls, basic line search, LU).
DENSE_OPTIONS = {"snes_max_it": int, "snes_atol": float}
DENSE_AS_IS = {"snes_type": "newtonls", "snes_linesearch_type": "basic", "ksp_type": "preonly", "pc_type": "lu"}


def _petsc_options(env: dict[str, str] | None = None) -> dict[str, str]:
    """The options of ``PETSC_OPTIONS`` under the continuation's prefix (name without it → value, "" for none)."""
    import os

    words = (os.environ if env is None else env).get("PETSC_OPTIONS", "").split()
    out = {}
    for i, w in enumerate(words):
        if w.startswith("-" + NEWTON_PREFIX):
            nxt = words[i + 1] if i + 1 < len(words) else ""
            is_value = nxt and not (nxt.startswith("-") and not _number(nxt))
            out[w[1 + len(NEWTON_PREFIX):]] = nxt if is_value else ""
    return out


def _number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def dense_newton_options(atol: float = 1e-12, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The keyword arguments of :class:`DenseNewton` (``atol``, ``max_it``) with ``PETSC_OPTIONS``.

    The spectral discretisations are solved without PETSc, by the iteration of its SNES; the options of the prefix
    ``-mfpde_cont_`` that it has (``snes_max_it``, ``snes_atol``) are read from ``PETSC_OPTIONS`` as SNES would,
    those naming its own choices (``snes_type newtonls``, ...) are accepted, the eigensolver's (``eps_``) do not
    apply, and any other is refused as SNES refuses a bad one.

    Raises:
        InputRefused: naming ``PETSC_OPTIONS`` and the option.
    """
    given = _petsc_options(env)
    kw: dict[str, Any] = {"atol": atol}
    for name, value in given.items():
        if name.startswith("eps_"):
            continue
        line = f"-{NEWTON_PREFIX}{name} {value}".rstrip()
        if name in DENSE_OPTIONS:
            try:
                v = DENSE_OPTIONS[name](value)
            except ValueError:
                v = None
            if v is None or not (v >= 0 if name == "snes_max_it" else v > 0):
                raise InputRefused(f"PETSC_OPTIONS: {line}: the continuation's Newton solver takes a "
                                   f"{'count >= 0' if name == 'snes_max_it' else 'number > 0'} there")
            kw["max_it" if name == "snes_max_it" else "atol"] = v
        elif DENSE_AS_IS.get(name) != value:
            raise InputRefused(f"PETSC_OPTIONS: {line}: the spectral discretisation's Newton solver (numpy's: "
                               f"newtonls, basic line search, LU) reads -{NEWTON_PREFIX}snes_max_it and "
                               f"-{NEWTON_PREFIX}snes_atol only; continuation.discretisation = 'collocation' is solved "
                               "by PETSc's SNES")
    return kw


def start_petsc() -> None:
    """Start PETSc as the command line does (its signal handler off), where the continuation first needs it."""
    from mfpde import signals
    from mfpde.petsc_start import start_petsc

    start_petsc(signals.quiet_petsc)


def brent(f: Any, a: float, b: float, xtol: float, rtol: float, maxiter: int = 100) -> float:
    """A root of f in [a, b] (f(a), f(b) of opposite signs) by Brent's method, as scipy.optimize.brentq.

    The algorithm of scipy's ``brentq`` (Brent 1973, ch. 4: inverse quadratic or secant steps kept inside the
    bracket, bisection otherwise) to |Δx| ≤ xtol + rtol |x|; here so that the continuation does not import
    scipy.optimize (half a second of start-up).
    """
    xpre, xcur = a, b
    fpre, fcur = f(xpre), f(xcur)
    if fpre == 0:
        return xpre
    if fcur == 0:
        return xcur
    if (fpre > 0) == (fcur > 0):
        raise ValueError("f(a) and f(b) must have opposite signs")
    xblk, fblk, spre, scur = 0.0, 0.0, 0.0, 0.0
    for _ in range(maxiter):
        if fpre != 0 and fcur != 0 and (fpre < 0) != (fcur < 0):
            xblk, fblk = xpre, fpre
            spre = scur = xcur - xpre
        if abs(fblk) < abs(fcur):
            xpre, xcur, xblk = xcur, xblk, xcur
            fpre, fcur, fblk = fcur, fblk, fcur
        delta = (xtol + rtol * abs(xcur)) / 2
        sbis = (xblk - xcur) / 2
        if fcur == 0 or abs(sbis) < delta:
            return xcur
        if abs(spre) > delta and abs(fcur) < abs(fpre):
            if xpre == xblk:  # interpolate
                stry = -fcur * (xcur - xpre) / (fcur - fpre)
            else:  # extrapolate
                dpre = (fpre - fcur) / (xpre - xcur)
                dblk = (fblk - fcur) / (xblk - xcur)
                stry = -fcur * (fblk * dblk - fpre * dpre) / (dblk * dpre * (fblk - fpre))
            if 2 * abs(stry) < min(abs(spre), 3 * abs(sbis) - delta):  # good short step
                spre, scur = scur, stry
            else:  # bisect
                spre, scur = sbis, sbis
        else:
            spre, scur = sbis, sbis
        xpre, fpre = xcur, fcur
        xcur += scur if abs(scur) > delta else (delta if sbis > 0 else -delta)
        fcur = f(xcur)
    return xcur
