"""The one PETSc linear-solver helper: a KSP for a fixed operator, configured like DOLFINx's LinearProblem.

Modelled on ``dolfinx.fem.petsc.LinearProblem`` (DOLFINx 0.11, ``python/dolfinx/fem/petsc.py``): every
solver has its own options prefix (``mfpde_token_``, ``mfpde_param_``), the options of the config file
(``[petsc]``) are pushed into the global options database under that prefix only for
``KSP.setFromOptions`` and ``KSP.setUp``, and the database is tidied afterwards (what was there before is
restored). Unlike ``LinearProblem`` it never assembles: the callers own their matrices and re-use one
KSP for many right-hand sides (style.md: ``LinearProblem.solve`` re-assembles A on every call).

Precedence, highest first: the config file's ``[petsc]`` table, then the options database (the
``PETSC_OPTIONS`` environment variable and command-line options that reach PETSc), then mfpde's
defaults, which are set only for keys that neither of the others set. So
``PETSC_OPTIONS="-mfpde_param_ksp_type cg -mfpde_param_pc_type gamg"`` switches the Fokker–Planck solve
to CG/GAMG without a config change. A default that only makes sense with another default (MUMPS with
LU, the LU of block Jacobi's blocks) is dropped when the user chose another preconditioner.

Options of the config's ``[petsc]`` table that PETSc did not read while setting the solver up (a misspelt
key, or one the chosen KSP/PC ignores) are an input error naming them, as is an option PETSc rejects
(one line: PETSc's reason, without its error stack). So is an option under the solver's prefix from
``PETSC_OPTIONS`` or the command line that PETSc did not read.

Every solve checks the KSP converged reason and raises :class:`~mfpde.errors.SolverError` if it is ≤ 0.

Freeing: a parallel PETSc object is not destroyed when Python frees its petsc4py wrapper; petsc4py defers it
to PETSc's garbage of the object's communicator, and nothing cleans that for a mesh's communicator. Each
solver left there keeps PETSc's and MUMPS's duplicated communicators (MPICH has 2048 context ids a process:
the MPI test suite died of it, "Cannot allocate context ID"). Destroying in ``__del__`` (as DOLFINx's
``LinearProblem`` does) is collective at a moment the garbage collector picks, which differs between ranks
for objects in reference cycles: a rank then waits in MUMPS's finalisation for ever (seen). So the owners
call :func:`release` in ``__del__`` (local), and :func:`collect_garbage`, called where all ranks meet (the
end of a run, of a verification check, of a test), destroys what was released, in creation order.
"""

from __future__ import annotations

import gc
import itertools
from collections.abc import Mapping
from typing import Any

from petsc4py import PETSc

from mfpde.errors import ConfigError, SolverError

__all__ = ["LinearSolver", "PetscOwner", "collect_garbage", "release"]

#: Creation serial numbers of the PETSc-owning objects: the same sequence on every rank of a communicator.
SERIAL = itertools.count()
#: ((serial, position), PETSc object) released by freed owners, destroyed by :func:`collect_garbage`.
_RELEASED: list[tuple[tuple[int, int], Any]] = []


def release(serial: int, *objs: Any, first: int = 1) -> None:
    """Hand the PETSc objects of a freed owner (solver number ``serial``) to :func:`collect_garbage`.

    They are destroyed in the order (serial, first + position in ``objs``): the same on every rank whatever
    order the garbage collector freed the owners in. Local (no communication): safe in ``__del__``. Keeps the
    objects, and so their communicators, alive until then.
    """
    _RELEASED.extend(((serial, first + i), o) for i, o in enumerate(objs) if o is not None)


class PetscOwner:
    """Mixin of a class that owns a :class:`LinearSolver` and the PETSc objects it was built on.

    Subclasses name the attribute holding the solver (``_petsc_solver``) and those holding other PETSc
    objects (``_petsc_objects``). ``destroy()`` frees them now (collective); ``__del__`` releases them to
    :func:`collect_garbage` under the solver's serial number (the solver releases its own KSP).
    """

    _petsc_solver: str = ""
    _petsc_objects: tuple[str, ...] = ()

    def destroy(self) -> None:
        """Free the solver and the PETSc objects now (collective over their communicator)."""
        for name in (self._petsc_solver, *self._petsc_objects):
            obj = getattr(self, name, None)
            if obj is not None:
                obj.destroy()
            setattr(self, name, None)

    def __del__(self) -> None:
        """Release the PETSc objects to :func:`collect_garbage` (see the module doc)."""
        solver = getattr(self, self._petsc_solver, None)
        release(solver.serial if solver is not None else -1, *(getattr(self, n, None) for n in self._petsc_objects))


def collect_garbage() -> int:
    """Destroy the PETSc objects released so far, in creation order; returns how many.

    Collective over every rank that may have released objects: call it where all ranks of the job meet.
    Runs Python's cycle collector first, so that every rank has released the same owners.
    """
    gc.collect()
    done = sorted(_RELEASED, key=lambda t: t[0])
    _RELEASED.clear()
    for _, obj in done:
        obj.destroy()
    return len(done)

#: The option prefixes of mfpde's solvers (an option under a longer one is not a shorter one's to check).
PREFIXES = ("mfpde_token_", "mfpde_param_", "mfpde_param_wgf_")

# A default key -> (the key it depends on, the values of that key for which the default applies).
_DEPENDS: dict[str, tuple[str, frozenset[str]]] = {
    "pc_factor_mat_solver_type": ("pc_type", frozenset({"lu", "cholesky"})),
    "sub_pc_type": ("pc_type", frozenset({"bjacobi", "asm"})),
}


def _reason(e: PETSc.Error) -> str:
    """PETSc's own one-line reason of an error (the last line of its stack), without the stack."""
    lines = [ln.split("] ", 1)[-1].strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[-1] if lines else str(e)


class LinearSolver:
    """A PETSc KSP solving A x = b for a fixed operator A, options under ``prefix``.

    Args:
        A: the assembled operator (its values may change later; the KSP sees the changes).
        prefix: the options prefix, non-empty, ending in ``_`` (e.g. ``"mfpde_param_"``).
        options: the user's options without the prefix (the config's ``[petsc]`` table), e.g.
            ``{"ksp_type": "cg", "pc_type": "gamg"}``. Values are converted with ``str``.
        defaults: mfpde's options without the prefix, used only for keys the user did not set.
        what: the name of the solve in error messages (e.g. ``"petsc.param"``).

    Raises:
        ConfigError: PETSc rejected the options (unknown type, bad value), or did not use one of ``options``;
            the message starts with ``what``, or with ``PETSC_OPTIONS`` when the options rejected came from the
            database (the variable or the command line) only.
        ValueError: the prefix is empty.
    """

    def __init__(self, A: PETSc.Mat, prefix: str, options: Mapping[str, object] | None = None,
                 defaults: Mapping[str, object] | None = None, what: str = "petsc") -> None:
        if not prefix:
            raise ValueError("a non-empty PETSc options prefix is required")
        self.prefix, self.what = prefix, what
        user = {k: str(v) for k, v in (options or {}).items()}
        db = PETSc.Options()
        effective = {k: str(v) for k, v in (defaults or {}).items() if not db.hasName(prefix + k)}
        for k in list(effective):
            dep = _DEPENDS.get(k)
            if dep is not None:
                key, values = dep
                chosen = user.get(key) or (db.getString(prefix + key) if db.hasName(prefix + key) else None) \
                    or effective.get(key)
                if chosen not in values:
                    del effective[k]
        effective.update(user)
        self.serial = next(SERIAL)
        self.ksp = PETSc.KSP().create(A.getComm())
        self.ksp.setOptionsPrefix(prefix)
        self.ksp.setOperators(A)
        saved = {k: db.getString(prefix + k) if db.hasName(prefix + k) else None for k in effective}
        for k, v in effective.items():
            db.setValue(prefix + k, v)
        try:
            self.ksp.setFromOptions()
            self.ksp.setUp()  # reads the sub-solver and factor options (bjacobi blocks, MUMPS) while they are set
            self.ksp.setUpOnBlocks()
            unused = sorted(k for k in user if not db.used(prefix + k))
            # options of this prefix from PETSC_OPTIONS or the command line (not another solver's longer prefix)
            env_unused = sorted(k for k in db.getAll() if k.startswith(prefix) and k[len(prefix):] not in effective
                                and not k.startswith(tuple(p for p in PREFIXES if len(p) > len(prefix)))
                                and not db.used(k))
        except PETSc.Error as e:
            raise ConfigError(self._rejected(db, effective, user, _reason(e))) from None
        finally:
            for k, old in saved.items():  # tidy the global database: leave it as it was
                if old is None:
                    db.delValue(prefix + k)
                else:
                    db.setValue(prefix + k, old)
        if env_unused:
            for k in env_unused:  # reported here: PETSc would repeat them in four lines at exit ("Option left")
                db.delValue(k)
            raise ConfigError(f"{what}: PETSc did not use the option(s) {', '.join('-' + k for k in env_unused)} "
                              f"of PETSC_OPTIONS or the command line (misspelt, or not read by the chosen KSP "
                              f"{self.ksp_type} / PC {self.pc_type})")
        if unused:
            raise ConfigError(f"{what}: PETSc did not use the option(s) {', '.join(unused)} (misspelt, or not "
                              f"read by the chosen KSP {self.ksp_type} / PC {self.pc_type})")

    def _rejected(self, db: PETSc.Options, effective: Mapping[str, str], user: Mapping[str, str], why: str) -> str:
        """The message when PETSc rejected the options: the config's table and/or the database's options named."""
        prefix = self.prefix
        env = {k: v for k, v in db.getAll().items() if k.startswith(prefix) and k[len(prefix):] not in effective
               and not k.startswith(tuple(p for p in PREFIXES if len(p) > len(prefix)))}
        if not env:
            return f"{self.what}: PETSc rejected the options {user}: {why}"
        given = " ".join(f"-{k} {v}".rstrip() for k, v in sorted(env.items()))
        if user:
            return f"{self.what} and PETSC_OPTIONS (or the command line): PETSc rejected {user} with {given}: {why}"
        return f"PETSC_OPTIONS (or the command line): PETSc rejected {given}: {why}"

    def solve(self, b: PETSc.Vec, x: PETSc.Vec) -> int:
        """Solve A x = b into x (owned entries; the caller scatters ghosts). Collective.

        Returns:
            The number of KSP iterations (1 for ``preonly``).

        Raises:
            SolverError: the KSP did not converge (converged reason ≤ 0).
        """
        self.ksp.solve(b, x)
        reason = int(self.ksp.getConvergedReason())  # type: ignore[call-overload]
        if reason <= 0:
            raise SolverError(f"{self.prefix} KSP did not converge (reason {reason})")
        return int(self.ksp.getIterationNumber())

    @property
    def ksp_type(self) -> str:
        """The KSP type in use (e.g. ``"preonly"``, ``"gmres"``)."""
        return str(self.ksp.getType())

    @property
    def pc_type(self) -> str:
        """The preconditioner type in use (e.g. ``"lu"``, ``"jacobi"``)."""
        return str(self.ksp.getPC().getType())

    def describe(self) -> str:
        """One line for the log: prefix, KSP and preconditioner types (and the factor package, if any)."""
        pc = self.ksp.getPC()
        factor = ""
        if self.pc_type in ("lu", "cholesky"):
            factor = f" ({pc.getFactorSolverType()})"
        return f"{self.prefix}: KSP {self.ksp_type}, PC {self.pc_type}{factor}"

    def destroy(self) -> None:
        """Free the KSP now (collective over its communicator)."""
        ksp = getattr(self, "ksp", None)
        if ksp is not None:
            ksp.destroy()

    def __del__(self) -> None:
        """Release the KSP to :func:`collect_garbage` (see the module doc)."""
        release(getattr(self, "serial", -1), getattr(self, "ksp", None), first=0)
