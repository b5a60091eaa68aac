"""Softmax attention on tensor grids by separable matrix products, every head at once, with its VJP.

On a box with quadrilateral (or interval) cells the nodes of μ and the vertices where the velocity is wanted
lie on tensor grids, and the kernel of a head A = a I_d separates (theory §1.2, §1.3 (F)):

    e^{a x·y} = Π_j e^{a x_j y_j},   so   Σ_y e^{a x·y} f(y) over an n₁×n₂ grid, for all of an m₁×m₂ grid of x,
    is E₁ F E₂ᵀ with (E_j)_{x_j y_j} = e^{a x_j y_j − s_j(x_j)}.

The shift s_j(x_j) = max over the support of μ's j-th marginal keeps every factor ≤ 1 on the support (log
domain; the product is exact while the exponent range over the support stays below ``_TENSOR_RANGE_MAX``, else
that head falls back to the direct sums of :mod:`mfpde.tokens.attention`). All heads are one batched product
(``numpy.matmul`` over a leading head axis): N_a (m₁n₁ + m₂n₂) exponentials and O(N_a m₁ n₂ (n₁ + m₂)) BLAS
flops, no Python loop over heads.

:class:`TensorSoftmax` keeps the factors: the velocity V = Σ_k c_k m_k and the vector–Jacobian product (the
nonlocal source of the discrete adjoint, theory §3.1 (B)),

    g_W(y) = Σ_k c_k Σ_x ξ(x)·(y − m_k(x)) e^{a_k x·y} / Z_k(x) = Σ_k c_k [E₁ᵀ (ξ₁/Z̃) E₂ y₁ + E₁ᵀ (ξ₂/Z̃) E₂ y₂
             − E₁ᵀ (ξ·m_k/Z̃) E₂](y),          g_c(k) = Σ_x ξ(x)·m_k(x),

come from the same factors, so the reverse pass costs one batched product more than the forward. Factors
off the support of μ's marginals are 0 (they multiply zero weights in the forward; the VJP is 0 where a weight
is zero, :func:`~mfpde.tokens.attention.support_only`: off the support e^{a x·y} overflows).

Inputs are non-dimensional; no dolfinx here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from mfpde.heads import HeadMeasure
from mfpde.tokens.attention import (
    TensorGrid,
    softmax_moments_direct,
    support_only,
    velocity,
    velocity_vjp,
)

__all__ = ["SeparableFactors", "TensorSoftmax", "velocity_tensor"]

Array = npt.NDArray[np.float64]

#: Exponent range (over the support, summed over axes) beyond which the separable product could underflow.
_TENSOR_RANGE_MAX = 600.0


@dataclass(frozen=True)
class SeparableFactors:
    """The factors E_j of every head with the shift s_j(x_j) = max over the whole grid yg: independent of μ.

    Where the exponent range over the whole grid stays below ``_TENSOR_RANGE_MAX`` (a box of moderate size
    and |a|: the default's [−1, 1]² with |a| ≤ 2 has range 8), the shift need not follow the support of μ,
    and the factors serve every sample and every depth step: built once per set of heads, the forward and
    the reverse pass are matrix products only.

    Attributes:
        a: the heads' scalars, shape (N_a,), sorted.
        E: per axis, shape (N_a, m_j, n_j), entries in (0, 1].
        shift: per axis, shape (N_a, m_j).
        Ey: per axis, E_j diag(y_j) (the factor of the first moment along axis j), shape (N_a, m_j, n_j).
    """

    a: Array
    E: tuple[Array, ...]
    shift: tuple[Array, ...]
    Ey: tuple[Array, ...]

    @staticmethod
    def build(xg: TensorGrid, yg: TensorGrid, a: Array) -> SeparableFactors | None:
        """The factors for the heads a (sorted), or None if the range over the whole grid is too large."""
        rng = np.zeros(len(a))
        E, shifts = [], []
        for xj, yj in zip(xg.axes, yg.axes, strict=True):
            S = a[:, None, None] * np.outer(xj, yj)[None]
            shift = S.max(axis=2)
            rng += (shift - S.min(axis=2)).max(axis=1)
            E.append(np.exp(S - shift[..., None]))
            shifts.append(shift)
        if np.any(rng > _TENSOR_RANGE_MAX):
            return None
        return SeparableFactors(np.asarray(a, dtype=np.float64), tuple(E), tuple(shifts),
                                tuple(e * y for e, y in zip(E, yg.axes, strict=True)))

    def part(self, lo: int, hi: int) -> SeparableFactors:
        """The factors of heads lo..hi−1 (views, no copy)."""
        return SeparableFactors(self.a[lo:hi], tuple(e[lo:hi] for e in self.E), tuple(s[lo:hi] for s in self.shift),
                                tuple(e[lo:hi] for e in self.Ey))

    def take(self, a: Array) -> SeparableFactors | None:
        """The factors of a subset a of the heads (sorted), or None if some a is not among them."""
        if len(a) == len(self.a) and np.array_equal(a, self.a):
            return self
        idx = np.searchsorted(self.a, a)
        if np.any(idx >= len(self.a)) or not np.array_equal(self.a[np.minimum(idx, len(self.a) - 1)], a):
            return None
        return SeparableFactors(self.a[idx], tuple(e[idx] for e in self.E), tuple(s[idx] for s in self.shift),
                                tuple(e[idx] for e in self.Ey))


class TensorSoftmax:
    """The softmax of every head a_k for μ on the tensor grid yg, evaluated on the tensor grid xg.

    μ may be a batch of S measures (the samples of a training step, issue 12): W of shape (S, *yg.shape),
    with shared ``factors``; then every array below gains an axis S after the head axis, and the products are
    one large matrix product for the whole batch. Inside, per-head fields are kept in the layout (head, x₁,
    measure, x₂), where the products leave them (rows (x₁, measure) of one matrix product per head).

    Args:
        xg: evaluation grid, m₁ (× m₂) points (d = 1 or 2).
        yg: support grid of μ, n₁ (× n₂) points.
        W: weights of μ on yg, shape yg.shape or (S, *yg.shape), non-negative, not all zero (per measure).
        a: the heads' scalars (A = a I_d), shape (N_a,).
        factors: the factors of these heads with the whole-grid shift (:class:`SeparableFactors`), if
            precomputed; else built here with the shift over the support of μ.

    Attributes:
        separable: which heads took the separable path, shape (N_a,) (the others: direct sums).
        m: the tilted means m_k(x), shape (N_a, *xg.shape, d), or (N_a, S, *xg.shape, d) for a batch.

    Raises:
        ValueError: a batch without ``factors`` (the per-μ shifts are per measure).
    """

    def __init__(self, xg: TensorGrid, yg: TensorGrid, W: Array, a: Array,
                 factors: SeparableFactors | None = None) -> None:
        self.xg, self.yg, self.W = xg, yg, W
        self.a = a = np.asarray(a, dtype=np.float64)
        d = len(yg.axes)
        self.batched = W.ndim > d
        if self.batched and factors is None:
            raise ValueError("TensorSoftmax: a batch of measures needs the shared SeparableFactors")
        Wb = W.reshape(-1, *yg.shape)  # (S, *yshape)
        rng = np.zeros(len(a))
        E, Ey, shifts = ((list(factors.E), list(factors.Ey), list(factors.shift)) if factors is not None
                         else ([], [], []))
        for j in range(d if factors is None else 0):
            other = tuple(k for k in range(d) if k != j)
            sup = (W.sum(axis=other) if other else W) > 0
            S = a[:, None, None] * np.outer(xg.axes[j], yg.axes[j])[None]  # (N_a, m_j, n_j)
            S_sup = S[:, :, sup]
            shift = S_sup.max(axis=2)  # (N_a, m_j)
            rng += (shift - S_sup.min(axis=2)).max(axis=1)
            Ej = np.zeros_like(S)  # 0 off the marginal support: the factors multiply zero weights there
            Ej[:, :, sup] = np.exp(S_sup - shift[..., None])
            E.append(Ej)
            Ey.append(Ej * yg.axes[j])
            shifts.append(shift)
        #: Shared factors span the whole grid; a batch's weights vanish off the support of its marginals (the
        #: digits fill the middle 8 × 8 of 16 × 16 cells), so the products run over that support only (the
        #: factors' columns there, taken when used: the tape keeps the shared factors): the terms dropped are
        #: exact zeros (E_j W with W = 0 there).
        self._ysup: tuple[npt.NDArray[np.intp], ...] | None = None
        if factors is not None:
            sups = [np.flatnonzero(np.abs(Wb).sum(axis=tuple(k for k in range(d + 1) if k != j + 1)) > 0)
                    for j in range(d)]  # exact zeros only: a column of values of either sign is kept
            if sum(map(len, sups)) < sum(yg.shape):
                self._ysup = tuple(sups)
                Wb = Wb[self._grid_index()]
        self.separable = sep = rng <= _TENSOR_RANGE_MAX
        self._E, self._Ey = (tuple(E), tuple(Ey)) if sep.all() else (tuple(e[sep] for e in E),
                                                                     tuple(e[sep] for e in Ey))
        self._shared = factors is not None and sep.all()  # the factors belong to the cache, not to this object
        self._shifts = shifts
        m1, nb = len(xg.axes[0]), len(Wb)
        m2 = len(xg.axes[1]) if d == 2 else 1
        self._lay = (m1, nb, m2)  # the internal layout of per-head fields: (…, head, x₁, measure, x₂)
        self._logz_direct: dict[int, Array] = {}
        if sep.all():
            self._z, self._m = self._moments(Wb)
        else:
            self._z, self._m = np.empty((int(sep.sum()), m1, nb, m2)), np.empty((d, len(a), m1, nb, m2))
            if sep.any():
                self._z, self._m[:, sep] = self._moments(Wb)
        for k in np.flatnonzero(~sep):  # unbatched only (a batch has shared factors: every head separable)
            lz, mk = softmax_moments_direct(xg.points(), yg.points(), W.ravel(), float(a[k]))
            self._logz_direct[int(k)], self._m[:, k, :, 0, :] = lz.reshape(xg.shape), mk.T.reshape(d, m1, m2)

    def _moments(self, Wb: Array) -> tuple[Array, Array]:
        """(Z̃, m) of the separable heads for the measures Wb (shape (S, *yshape)), in the internal layout.

        Shapes (N_sep, m₁, S, m₂) and (d, N_sep, m₁, S, m₂) (m₂ = 1 in d = 1).
        Z̃ = E₁ W E₂ᵀ and the first moments E₁ diag(y₁) W E₂ᵀ, E₁ W diag(y₂) E₂ᵀ: the left products of all heads
        and measures are one matrix product, (2 N_sep m₁ × n₁) by (n₁ × S n₂), the right ones one stacked
        product per head with S m₁ rows; five half-products where Z̃, Σ y₁ and Σ y₂ each would take six.
        """
        (E0, E1), (Ey0, Ey1) = self._factors()
        K, m1, n1 = E0.shape
        S = len(Wb)
        P = np.concatenate([E0, Ey0]).reshape(2 * K * m1, n1) @ np.moveaxis(Wb, 0, 1).reshape(n1, -1)
        if E1 is None or Ey1 is None:
            buf = P.reshape(2, K, m1, S, 1)
        else:
            m2, n2 = E1.shape[1:]
            out = np.empty((3, K, m1 * S, m2))
            Pk = P.reshape(2, K, m1 * S, n2)  # (E₁W, E₁ diag(y₁) W) per head, rows (x₁, measure); K = 0 allowed
            np.matmul(Pk, E1.transpose(0, 2, 1), out=out[:2])
            np.matmul(Pk[0], Ey1.transpose(0, 2, 1), out=out[2])
            buf = out.reshape(3, K, m1, S, m2)
        np.divide(buf[1:], buf[0], out=buf[1:])
        return buf[0], buf[1:]

    def _adjoint(self, G: Array) -> Array:
        """g_W of :meth:`vjp` summed over the separable heads, shape (S, *yshape).

        G holds, in the internal layout (d + 1, N_sep, m₁, S, m₂), the fields G₀ = ξ·m c/Z̃, G₁ = ξ₁ c/Z̃ (and
        G₂ = ξ₂ c/Z̃ in d = 2); it is overwritten. With E_j diag(y_j) for the factors of y_j,

            g_W = Σ_k (E₁ diag(y₁))ᵀ G₁ E₂ + E₁ᵀ (G₂ E₂ diag(y₂) − G₀ E₂)   (d = 2; d = 1 drops the E₂),

        the right products one stacked product per head with S m₁ rows, the left ones and the sum over heads
        one matrix product with inner dimension 2 N_sep m₁.
        """
        (E0, E1), (Ey0, Ey1) = self._factors()
        K, m1, n1 = E0.shape
        S = G.shape[3]
        if E1 is None or Ey1 is None:
            Q = G.reshape(2, K * m1, S)
            np.negative(Q[0], out=Q[0])
        else:
            m2, n2 = E1.shape[1:]
            Q = np.empty((3, K * m1, S, n2))
            np.matmul(G[:2].reshape(2, K, m1 * S, m2), E1, out=Q[:2].reshape(2, K, m1 * S, n2))
            np.matmul(G[2].reshape(K, m1 * S, m2), Ey1, out=Q[2].reshape(K, m1 * S, n2))
            np.subtract(Q[2], Q[0], out=Q[0])
        out = np.concatenate([E0, Ey0]).reshape(2 * K * m1, n1).T @ Q[:2].reshape(2 * K * m1, -1)  # (n₁, S n₂)
        if self._ysup is None:
            return np.moveaxis(out.reshape(n1, S, -1), 1, 0).reshape(S, *self.yg.shape)
        g = np.zeros((S, *self.yg.shape))  # 0 off the support (support_only would zero it there anyway)
        g[self._grid_index()] = np.moveaxis(out.reshape(n1, S, -1), 1, 0).reshape(
            S, *map(len, self._ysup))
        return g

    def _factors(self) -> tuple[tuple[Array, Array | None], tuple[Array, Array | None]]:
        """(E₁, E₂), (E₁ diag(y₁), E₂ diag(y₂)) of the separable heads on the support's columns (E₂ None: d = 1)."""
        E, Ey = self._E, self._Ey
        if self._ysup is not None:
            E = tuple(e[:, :, ix] for e, ix in zip(E, self._ysup, strict=True))
            Ey = tuple(e[:, :, ix] for e, ix in zip(Ey, self._ysup, strict=True))
        return (E[0], E[1] if len(E) == 2 else None), (Ey[0], Ey[1] if len(Ey) == 2 else None)

    def _grid_index(self) -> tuple[Any, ...]:
        """The index of the support's sub-grid in an array (S, *yshape)."""
        assert self._ysup is not None
        return (slice(None), *np.ix_(*self._ysup))

    @property
    def m(self) -> Array:
        """The tilted means m_k(x), shape (N_a, (S,) *xg.shape, d) (a copy)."""
        d, nb = len(self.yg.axes), self._lay[1]
        m = self._m.transpose(1, 3, 2, 4, 0).reshape(len(self.a), nb, *self.xg.shape, d)
        return self._unbatch(m, 1)

    def _unbatch(self, x: Array, axis: int) -> Array:
        return x if self.batched else np.take(x, 0, axis=axis)

    @property
    def logz(self) -> Array:
        """Log Z_k(x) = log Σ_y W_y e^{a_k x·y}, shape (N_a, (S,) *xg.shape) (computed when asked)."""
        sep, (m1, nb, m2) = self.separable, self._lay
        out = np.empty((len(self.a), m1, nb, m2))
        if sep.any():
            logz = np.log(self._z) + self._shifts[0][sep][:, :, None, None]
            if len(self._shifts) == 2:
                logz += self._shifts[1][sep][:, None, None, :]
            out[sep] = logz
        for k, lz in self._logz_direct.items():
            out[k, :, 0, :] = lz.reshape(m1, m2)
        return self._unbatch(out.transpose(0, 2, 1, 3).reshape(len(self.a), nb, *self.xg.shape), 1)

    @property
    def nbytes(self) -> int:
        """Memory held by this object (the shared factors of a :class:`SeparableFactors` not counted), in bytes."""
        own = 0 if self._shared else sum(e.nbytes for e in self._E + self._Ey)
        return own + self._m.nbytes + self._z.nbytes + sum(v.nbytes for v in self._logz_direct.values())

    def velocity(self, c: Array) -> Array:
        """V = Σ_k c_k m_k on xg, shape ((S,) *xg.shape, d) (theory §1.3 (F))."""
        d, (m1, nb, m2) = len(self.yg.axes), self._lay
        V = np.stack([c @ self._m[j].reshape(len(c), m1 * nb * m2) for j in range(d)]).reshape(d, m1, nb, m2)
        return self._unbatch(V.transpose(2, 1, 3, 0).reshape(nb, *self.xg.shape, d), 0)

    def vjp(self, c: Array, Xi: Array, costate: bool = True) -> tuple[Array, Array]:
        """The transpose of the derivative of Σ_x ξ·V with respect to (W, c) (theory §3.1 (B)).

        Args:
            c: the heads' value-weighted masses, shape (N_a,) (zero allowed).
            Xi: the cotangent on xg, shape ((S,) *xg.shape, d).

            costate: form g_W (False: zeros, for a caller that needs g_c only; the reverse products skipped).

        Returns:
            (g_W, g_c): shapes ((S,) *yg.shape) and ((S,) N_a,), per measure of a batch.
        """
        d, sep, (m1, nb, m2) = len(self.yg.axes), self.separable, self._lay
        X = Xi.reshape(nb, m1, m2, d).transpose(3, 1, 0, 2)  # (d, m₁, S, m₂), the internal layout
        xm = self._m[0] * X[0]  # ξ·m_k, (N_a, m₁, S, m₂)
        for j in range(1, d):
            xm += self._m[j] * X[j]
        gc = xm.sum(axis=(1, 3)).T  # (S, N_a)
        gW = np.zeros((nb, *self.yg.shape))
        if not costate:
            return self._unbatch(gW, 0), self._unbatch(gc, 0)
        if sep.any():
            cz = c[sep][:, None, None, None] / self._z  # c_k / Z̃_k
            G = np.empty((d + 1, *cz.shape))
            np.multiply(xm if sep.all() else xm[sep], cz, out=G[0])
            for j in range(d):
                np.multiply(X[j], cz, out=G[1 + j])
            gW += self._adjoint(G)
        rest = np.flatnonzero(~sep & (c != 0.0))
        if len(rest):  # unbatched only (a batch has shared factors: every head separable)
            g, _ = velocity_vjp(self.xg.points(), self.yg.points(), self.W.ravel(),
                                HeadMeasure(self.a[rest], c[rest]), Xi.reshape(-1, d))
            gW[0] += g.reshape(self.yg.shape)
        return support_only(self._unbatch(gW, 0), self.W), self._unbatch(gc, 0)


def velocity_tensor(xg: TensorGrid, yg: TensorGrid, W: Array, heads: HeadMeasure) -> Array:
    """V[μ; ρ] on the tensor grid xg for μ on the tensor grid yg (theory §1.3 (F)), shape (*xg.shape, d).

    d = 2: :class:`TensorSoftmax` over the heads with non-negligible c_k; d = 1: the Chebyshev path of
    :func:`~mfpde.tokens.attention.velocity` (cheaper than the separable product there).
    """
    if len(yg.axes) == 1:
        return velocity(xg.points(), yg.points(), W.ravel(), heads).reshape(*xg.shape, 1)
    keep = np.abs(heads.c) > 1e-16 * np.abs(heads.c).sum()
    return TensorSoftmax(xg, yg, W, heads.a[keep]).velocity(heads.c[keep])
