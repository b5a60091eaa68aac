"""The token velocity without gathering μ: each rank's partial kernel sums on a Chebyshev grid, one reduction.

The gathered path (:meth:`~mfpde.tokens.box.quadrature.TokenQuadrature.gather`) sends the N_y quadrature weights of
μ to every rank at every evaluation; its message grows with the mesh, not with the rank count. But x ↦ m_a(x) is
analytic (theory §1.2), so it is enough to know the kernel sums

    Z(X) = Σ_y w_y e^{a X·y − s(X)},     N(X) = Σ_y w_y y e^{a X·y − s(X)}

at the Chebyshev points X of the global bounding box of the mesh: they are sums over y, so each rank sums its own
quadrature points, one ``Allreduce(SUM)`` of the (n + 1)^d (d + 1) N_a partial sums adds them up, and each rank
interpolates m = N / Z at its own vertices. The log-domain shift s(X) is global: in d = 1 the maximum of
a X y + log w_y over the support of μ, one ``Allreduce(MAX)`` of the n + 1 shifts before the sums; in d = 2 the
maximum of a X·y over the support's bounding box, which :func:`global_support` has reduced already. The degree
is doubled from 16 until the last three Chebyshev coefficients fall below ``tol`` · max |y| (Trefethen,
*Approximation Theory and Approximation Practice*, SIAM 2013, ch. 3 and 8): the test is made on the reduced
numbers, the same on every rank, so every rank takes the same number of rounds, and the result differs between
rank counts only by the order of the sums.

* d = 1: one function f(σ) = (log Z)'(σ) of σ = a x serves every head (:func:`reduced_tilted_interpolant`, the
  distributed form of :func:`~mfpde.tokens.attention.tilted_interpolant`), n + 1 and 2 (n + 1) numbers per round.
* d = 2: the separable grid sums of :class:`~mfpde.tokens.box.interpolated.InterpolatedSoftmax` with ``comm``,
  3 (n + 1)² N_a numbers per round.

Each evaluation starts at the degree of the previous one (the caller's ``start``), so a solve's evaluations take
one round each while μ does not sharpen. The reduction adds the partial sums in another order than one rank does:
the velocity on P ranks differs from one rank's by round-off only (tests/test_gather_free.py).

Inputs are non-dimensional; no dolfinx here.
"""

from __future__ import annotations

from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from mfpde.tokens.attention import CHEBYSHEV_DEGREES, TiltedInterpolant, chebyshev_coefficients

__all__ = ["global_support", "reduced_tilted_interpolant"]

Array = npt.NDArray[np.float64]


def global_support(comm: MPI.Comm, y: Array, w: Array) -> tuple[Array, Array, float] | None:
    """The bounding box of the support of μ over all ranks, and max |y| over all points. Collective (one MAX).

    Args:
        comm: the ranks holding the parts of μ.
        y: this rank's support points, shape (N_y_local, d).
        w: their weights, shape (N_y_local,).

    Returns:
        (lo, hi, ymax): shapes (d,), (d,) and a float, the same on every rank; None where no rank has a positive
        weight.
    """
    d = y.shape[1]
    ys = y[w > 0]
    v = np.concatenate([-ys.min(axis=0, initial=np.inf), ys.max(axis=0, initial=-np.inf),
                        [float(np.abs(y).max(initial=0.0))]])
    comm.Allreduce(MPI.IN_PLACE, v, op=MPI.MAX)
    if not np.all(np.isfinite(v[:d])):
        return None
    return -v[:d], v[d : 2 * d], float(v[-1])


def _partial_sums(nodes: Array, y: Array, w: Array, comm: MPI.Comm) -> tuple[Array, Array]:
    """Z(σ) and N(σ) = Σ_y w_y (1, y) e^{σ y − s(σ)} over every rank's support, at the nodes σ (shape (L,)).

    s(σ) is the global maximum of σ y + log w_y (one MAX reduction), so every term is ≤ 1 and Z ≥ 1; then one SUM
    reduction of the 2 L partial sums.
    """
    sup = w > 0
    ys, logw = y[sup], np.log(w[sup])
    e = nodes[:, None] * ys[None, :] + logw[None, :]
    shift = e.max(axis=1, initial=-np.inf)
    comm.Allreduce(MPI.IN_PLACE, shift, op=MPI.MAX)
    np.exp(e - shift[:, None], out=e)
    part = np.stack([e.sum(axis=1), e @ ys])
    comm.Allreduce(MPI.IN_PLACE, part, op=MPI.SUM)
    return part[0], part[1]


def reduced_tilted_interpolant(comm: MPI.Comm, lo: float, hi: float, y: Array, w: Array, scale: float,
                               tol: float = 1e-14, max_degree: int = CHEBYSHEV_DEGREES[-1],
                               start: int = CHEBYSHEV_DEGREES[0]) -> TiltedInterpolant | None:
    """The Chebyshev interpolant of f = (log Z)' on [lo, hi] (d = 1) from every rank's own part of μ. Collective.

    :func:`~mfpde.tokens.attention.tilted_interpolant` with the sum over y split between the ranks: the same
    nodes, the same stopping rule (the last three coefficients ≤ ``tol`` · ``scale``), decided on the reduced
    values, so every rank returns the same degree (or None) after the same number of reductions. The points of
    degree n/2 are the even points of degree n: each doubling computes and reduces only the new ones.

    Args:
        comm: the ranks holding the parts of μ.
        lo: the interval's lower end (the same on every rank).
        hi: its upper end, hi > lo.
        y: this rank's support of μ, shape (N_y_local,).
        w: its weights, shape (N_y_local,); some rank has a positive one.
        scale: max |y| over all ranks (:func:`global_support`).
        tol: the tail tolerance, relative to ``scale``.
        max_degree: the largest degree tried.
        start: the first degree tried (the degree of the previous call of a solve is a good guess; the same on
            every rank).

    Returns:
        The interpolant (no kernel coefficients: the VJP does not use this path), or None where ``max_degree`` is
        not enough.
    """
    Z, N = np.empty(0), np.empty(0)
    for n in (d for d in CHEBYSHEV_DEGREES if min(start, max_degree) <= d <= max_degree):
        nodes = 0.5 * (lo + hi) + 0.5 * (hi - lo) * np.cos(np.pi * np.arange(n + 1) / n)
        if len(Z):  # the odd points are new; the even ones are the previous degree's points
            z_odd, n_odd = _partial_sums(nodes[1::2], y, w, comm)
            Z = np.stack([Z, np.append(z_odd, 0.0)], axis=1).ravel()[: n + 1]
            N = np.stack([N, np.append(n_odd, 0.0)], axis=1).ravel()[: n + 1]
        else:
            Z, N = _partial_sums(nodes, y, w, comm)
        coef = chebyshev_coefficients((N / Z)[:, None], n)[:, 0]
        # one decision for all ranks (equal reduced values give equal decisions; ranks that disagreed would
        # desynchronise the reductions and hang in a collective no signal interrupts)
        if comm.allreduce(bool(np.abs(coef[-3:]).max() <= tol * scale), op=MPI.LAND):
            return TiltedInterpolant(lo, hi, n, coef)
    return None
