"""The velocity of attention on S² (theory §9) as one protocol, its O(n²) reference and a prescribed rotation.

Every sphere solver (DG on cells, the flow map on labels) describes μ by point masses of a quadrature: the
points x_j ∈ S² (shape (n, 3), unit vectors) each rank owns, and their masses w_j (shape (n,), e.g. μ_h(x_j)
|J| ω_j). A :class:`SphereVelocity` is told those (``update``, collective over its communicator) and then
evaluates the tangent velocity at any local points (``velocity``):

    v(x) = Z(x)⁻¹ P_x ∫ e^{β x·y} y dμ(y),   P_x = I − x xᵀ,   Z = ∫ e^{β x·y} dμ(y) (SA) or 1 (USA),

times the head weight c (one Dirac head (β, c) of the scalar family). :class:`DirectVelocity` sums over all
points of all ranks (an allgather, O(n²)): the reference the fast kernels are tested against, never the
production path past small meshes.
"""

from __future__ import annotations

from typing import Protocol

from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from mfpde.tokens.sphere.theory import ATTENTIONS

__all__ = ["DirectVelocity", "RotationVelocity", "SphereVelocity", "tangent"]

Array = npt.NDArray[np.float64]


class SphereVelocity(Protocol):
    """What a sphere solver calls: ``update`` with the current measure, then ``velocity`` at its points."""

    def update(self, x: Array, w: Array) -> None:
        """Take the measure Σ_j w_j δ_{x_j} (x (n, 3) unit vectors, w (n,) masses) of this rank; collective."""

    def velocity(self, x: Array) -> Array:
        """The tangent velocity (m, 3) at the unit vectors x (m, 3) of this rank (after ``update``)."""


def tangent(x: Array, v: Array) -> Array:
    """P_x v = v − (x·v) x row by row: the projection of v (m, 3) onto the tangent planes at x (m, 3)."""
    return v - np.einsum("ij,ij->i", x, v)[:, None] * x


class DirectVelocity:
    """v by the direct sum over all quadrature points of all ranks (the O(n²) reference).

    Args:
        beta: the inverse temperature β > 0.
        attention: "softmax" (SA) or "unnormalised" (USA).
        comm: the communicator whose ranks share the measure.
        c: the head's weight (the velocity is multiplied by it).
        chunk: target points per block of the m × n kernel matrix (memory 8·chunk·n bytes).

    The SA quotient is evaluated with the exponent shifted by its maximum over y for each x (no overflow at
    any β); USA overflows past β ≈ 700 like e^β itself.
    """

    kernel = "direct"
    #: no series: the degree the reports name is None
    L: int | None = None

    def __init__(self, beta: float, attention: str = "softmax", comm: MPI.Comm = MPI.COMM_SELF, c: float = 1.0,
                 chunk: int = 2048) -> None:
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
        self.beta, self.attention, self.comm, self.c, self.chunk = float(beta), attention, comm, float(c), chunk
        self._y = np.zeros((0, 3))
        self._w = np.zeros(0)

    def update(self, x: Array, w: Array) -> None:
        """Gather the measure of all ranks (collective; on one rank the arrays are kept as they are)."""
        x = np.ascontiguousarray(x, dtype=float).reshape(-1, 3)
        w = np.ascontiguousarray(w, dtype=float).ravel()
        if self.comm.size == 1:
            self._y, self._w = x, w
            return
        self._y, self._w = np.concatenate(self.comm.allgather(x)), np.concatenate(self.comm.allgather(w))

    def velocity(self, x: Array) -> Array:
        """The velocity at x (m, 3): blocks of ``chunk`` targets against all gathered points."""
        x = np.asarray(x, dtype=float).reshape(-1, 3)
        out = np.empty_like(x)
        for s in range(0, len(x), self.chunk):
            xb = x[s:s + self.chunk]
            e = self.beta * (xb @ self._y.T)  # (b, n)
            if self.attention == "softmax":
                e -= e.max(axis=1, keepdims=True)
                k = np.exp(e) * self._w
                num = k @ self._y / k.sum(axis=1, keepdims=True)
            else:
                num = (np.exp(e) * self._w) @ self._y
            out[s:s + self.chunk] = tangent(xb, num)
        return self.c * out


class RotationVelocity:
    """The solid-body rotation v(x) = ω × x (theory §9 (ii)): a prescribed, divergence-free tangent field."""

    def __init__(self, omega: npt.ArrayLike) -> None:
        self.omega = np.asarray(omega, dtype=float).reshape(3)

    def update(self, x: Array, w: Array) -> None:
        """Nothing: the rotation does not depend on μ."""

    def velocity(self, x: Array) -> Array:
        """ω × x (m, 3)."""
        return np.cross(self.omega, np.asarray(x, dtype=float).reshape(-1, 3))
