"""Head families: θ ∈ Θ ⊂ R^p ↦ (a(θ), v(θ)) with A(θ) = a(θ) I_d and V(θ) = v(θ) I_d (theory §1.2).

A new family is one small class: its parameter dimension p, a(θ), v(θ) and their gradients; register it
in :func:`make_family` and in the config's ``heads.family`` check.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["HeadFamily", "ScalarHeads", "ValueHeads", "make_family"]

Array = npt.NDArray[np.float64]


class HeadFamily:
    """A head family: θ ∈ R^p ↦ (a(θ), v(θ)) with A = a I_d, V = v I_d. Subclass for a new family.

    Subclasses set ``name`` and ``p`` and implement :meth:`a`, :meth:`v` and their gradients.
    """

    name: str = ""
    p: int = 0

    def a(self, theta: Array) -> Array:
        """The coefficient of A = a I_d at each θ, shape (n,), for θ of shape (n, p)."""
        raise NotImplementedError

    def v(self, theta: Array) -> Array:
        """The coefficient of V = v I_d at each θ, shape (n,), for θ of shape (n, p)."""
        raise NotImplementedError

    def grad_a(self, theta: Array) -> Array:  # noqa: D102
        """∇_θ a(θ), shape (n, p)."""
        raise NotImplementedError

    def grad_v(self, theta: Array) -> Array:  # noqa: D102
        """∇_θ v(θ), shape (n, p)."""
        raise NotImplementedError


class ScalarHeads(HeadFamily):
    """θ = (a, v): A = a I_d, V = v I_d (p = 2)."""

    name, p = "scalar", 2

    def a(self, theta: Array) -> Array:  # noqa: D102 (documented in HeadFamily)
        return np.asarray(theta, dtype=float)[:, 0]

    def v(self, theta: Array) -> Array:  # noqa: D102
        return np.asarray(theta, dtype=float)[:, 1]

    def grad_a(self, theta: Array) -> Array:  # noqa: D102
        g = np.zeros((len(theta), 2))
        g[:, 0] = 1.0
        return g

    def grad_v(self, theta: Array) -> Array:  # noqa: D102
        g = np.zeros((len(theta), 2))
        g[:, 1] = 1.0
        return g


@dataclass(frozen=True)
class ValueHeads(HeadFamily):
    """θ = v with A = a I_d fixed (p = 1; theory §6.2)."""

    a_fixed: float = 0.5
    name = "value"
    p = 1

    def a(self, theta: Array) -> Array:  # noqa: D102 (documented in HeadFamily)
        return np.full(len(theta), self.a_fixed)

    def v(self, theta: Array) -> Array:  # noqa: D102
        return np.asarray(theta, dtype=float)[:, 0]

    def grad_a(self, theta: Array) -> Array:  # noqa: D102
        return np.zeros((len(theta), 1))

    def grad_v(self, theta: Array) -> Array:  # noqa: D102
        return np.ones((len(theta), 1))


def make_family(name: str, a: float = 0.5) -> HeadFamily:
    """The head family called ``name`` (``"scalar"`` or ``"value"`` with fixed ``a``).

    Raises:
        ValueError: unknown family.
    """
    if name == "scalar":
        return ScalarHeads()
    if name == "value":
        return ValueHeads(a)
    raise ValueError(f"unknown head family {name!r}")
