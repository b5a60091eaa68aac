"""Linear stability of a stationary state: the leading eigenpairs of its dense linearisation (SLEPc, or scipy).

A stationary state of the continuation problems (:mod:`mfpde.continuation`) is linearly stable when every
eigenvalue of the linearisation has a negative real part; the few of largest real part are computed by SLEPc's
Krylov–Schur (replicated on each rank), the dense scipy.linalg.eig being the reference and the fallback.
"""

from __future__ import annotations

from mpi4py import MPI  # noqa: F401  (before petsc4py)

import numpy as np
import numpy.typing as npt
import scipy.linalg

from mfpde.errors import NumericalError

__all__ = ["leading_eigenpairs", "linearly_stable"]

Array = npt.NDArray[np.float64]


def leading_eigenpairs(L: Array, count: int, solver: str = "slepc"
                       ) -> tuple[npt.NDArray[np.complex128], npt.NDArray[np.complex128]]:
    """The ``count`` eigenpairs of largest real part of a dense linearisation L (n, n), sorted by decreasing real part.

    ``solver``: "slepc" (slepc4py's Krylov–Schur on COMM_SELF, replicated on each rank) or "scipy" (the dense
    reference, scipy.linalg.eig). Returns (eigenvalues (count,), eigenvectors (n, count)), complex. Where SLEPc
    does not converge all ``count`` pairs (seen at n ≈ 1000 with clustered spectra) the dense reference answers.

    Raises:
        NumericalError: L is not finite (the linearisation overflowed).
    """
    if not np.all(np.isfinite(L)):
        raise NumericalError("the linearisation is not finite (its entries overflowed): stability is undefined")
    if solver == "slepc":
        try:
            return _slepc_leading(L, count)
        except ArithmeticError:
            pass
    return _scipy_leading(L, count)


def linearly_stable(vals: npt.NDArray[np.complex128]) -> bool:
    """Whether every real part is < 0 up to 1e-9 times the largest |eigenvalue|.

    The tolerance is the eigensolver's round-off: at a branch point the leading eigenvalue is 0 in exact arithmetic.
    """
    return bool(np.all(vals.real < 1e-9 * max(1.0, float(np.abs(vals).max(initial=0.0)))))


def _scipy_leading(L: Array, count: int) -> tuple[npt.NDArray[np.complex128], npt.NDArray[np.complex128]]:
    vals, vecs = scipy.linalg.eig(L)
    order = np.argsort(-vals.real, kind="stable")[:count]
    return vals[order], vecs[:, order]


def _slepc_leading(L: Array, count: int) -> tuple[npt.NDArray[np.complex128], npt.NDArray[np.complex128]]:
    """The ``count`` eigenpairs of largest real part of the dense L by SLEPc (COMM_SELF: replicated on each rank)."""
    from petsc4py import PETSc

    from slepc4py import SLEPc

    n = L.shape[0]
    A = PETSc.Mat().createDense((n, n), array=np.array(L, dtype=PETSc.ScalarType),  # type: ignore[arg-type]
                                comm=PETSc.COMM_SELF)
    A.assemble()
    eps = SLEPc.EPS().create(PETSc.COMM_SELF)
    try:
        eps.setOperators(A)
        eps.setProblemType(SLEPc.EPS.ProblemType.NHEP)
        eps.setWhichEigenpairs(SLEPc.EPS.Which.LARGEST_REAL)
        eps.setDimensions(nev=min(count, n), ncv=min(n, max(2 * count + 1, 20)))
        eps.setTolerances(1e-12, 1000)
        eps.setOptionsPrefix("mfpde_cont_eps_")
        eps.setFromOptions()
        eps.solve()
        nconv = eps.getConverged()
        if nconv < min(count, n):
            raise ArithmeticError(f"SLEPc converged {nconv} of {count} eigenpairs")
        vals = np.zeros(min(count, nconv), complex)
        vecs = np.zeros((n, len(vals)), complex)
        vr, vi = A.createVecs()  # type: ignore[misc]
        for i in range(len(vals)):
            vals[i] = eps.getEigenpair(i, vr, vi)
            vecs[:, i] = vr.getArray() + 1j * vi.getArray()
        order = np.argsort(-vals.real, kind="stable")
        return vals[order], vecs[:, order]
    finally:
        eps.destroy()
        A.destroy()
