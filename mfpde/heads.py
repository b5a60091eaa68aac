"""The head measure: a head distribution ρ reduced to what the attention velocity needs (theory §1.2).

For the families whose matrices are A = a I_d and V = v I_d (:mod:`mfpde.params.family`), the velocity of ρ depends
on it only through the distinct a values and the value-weighted mass c_k = ∫_{a = a_k} v dρ at each: the
:class:`HeadMeasure`, which every token domain's velocity and the training take.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

__all__ = ["Family", "HeadMeasure", "dirac_heads"]

Array = npt.NDArray[np.float64]


class Family(Protocol):
    """What :meth:`HeadMeasure.from_heads` needs of a head family (:class:`mfpde.params.family.HeadFamily`)."""

    p: int

    def a(self, theta: Array) -> Array:
        """The coefficient of A = a I_d at each θ, shape (n,), for θ of shape (n, p)."""
        ...

    def v(self, theta: Array) -> Array:
        """The coefficient of V = v I_d at each θ, shape (n,), for θ of shape (n, p)."""
        ...


@dataclass(frozen=True)
class HeadMeasure:
    """A head distribution reduced to what the velocity needs: distinct a_k and c_k = ∫_{a=a_k} v dρ.

    Attributes:
        a: distinct a values, shape (N_a,).
        c: value-weighted head mass per a, shape (N_a,).
    """

    a: Array
    c: Array

    @staticmethod
    def from_heads(family: Family, theta: Array, weights: Array, keep_zero: bool = False) -> HeadMeasure:
        """Reduce weighted heads (Dirac masses, or Θ dofs times their lumped quadrature weights).

        Args:
            family: the head family.
            theta: head parameters, shape (n, p).
            weights: non-negative weights, shape (n,) (the ρ-mass of each head).
            keep_zero: keep distinct a with c = 0 (the adjoint needs every a where δR/δρ is wanted).
        """
        theta = np.asarray(theta, dtype=float).reshape(len(weights), family.p)
        a = family.a(theta)
        key, inv = np.unique(np.round(a, 12), return_inverse=True)
        c = np.zeros(len(key))
        np.add.at(c, inv, np.asarray(weights, dtype=float) * family.v(theta))
        keep = np.ones(len(c), bool) if keep_zero else c != 0.0
        return HeadMeasure(key[keep], c[keep])

    @property
    def abar(self) -> float:
        """ā = ∫ v dρ (theory §6.1)."""
        return float(self.c.sum())

    @property
    def bbar(self) -> float:
        """b̄ = ∫ v a dρ (theory §6.1)."""
        return float((self.a * self.c).sum())


def dirac_heads(family: Family, points: list[list[float]], weights: list[float],
                keep_zero: bool = False) -> HeadMeasure:
    """Finitely many heads θ_h with weights w_h (normalised to sum 1): ρ = Σ_h w_h δ_{θ_h}, reduced.

    ``keep_zero``: keep the heads of c = 0 (:meth:`HeadMeasure.from_heads`), e.g. a single head of zero coupling.
    """
    w = np.asarray(weights, dtype=float)
    w = w / w.max()  # first: weights near the largest float would overflow their sum
    return HeadMeasure.from_heads(family, np.asarray(points, dtype=float), w / w.sum(), keep_zero)
