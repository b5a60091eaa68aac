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

import numpy as np
import numpy.typing as npt

from mfpde.tokens.attention import (
    HeadMeasure,
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
    """

    a: Array
    E: tuple[Array, ...]
    shift: tuple[Array, ...]

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
        return SeparableFactors(np.asarray(a, dtype=np.float64), tuple(E), tuple(shifts))

    def take(self, a: Array) -> SeparableFactors | None:
        """The factors of a subset a of the heads (sorted), or None if some a is not among them."""
        if len(a) == len(self.a) and np.array_equal(a, self.a):
            return self
        idx = np.searchsorted(self.a, a)
        if np.any(idx >= len(self.a)) or not np.array_equal(self.a[np.minimum(idx, len(self.a) - 1)], a):
            return None
        return SeparableFactors(self.a[idx], tuple(e[idx] for e in self.E), tuple(s[idx] for s in self.shift))


class TensorSoftmax:
    """The softmax of every head a_k for μ on the tensor grid yg, evaluated on the tensor grid xg.

    μ may be a batch of S measures (the samples of a training step, issue 12): W of shape (S, *yg.shape),
    with shared ``factors``; then every array below gains an axis S after the head axis, and the products are
    one large matrix product per head and axis for the whole batch.

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
        E, shifts = (list(factors.E), list(factors.shift)) if factors is not None else ([], [])
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
            shifts.append(shift)
        self.separable = sep = rng <= _TENSOR_RANGE_MAX
        self._E = tuple(E) if sep.all() else tuple(e[sep] for e in E)
        self._shared = factors is not None and sep.all()  # the factors belong to the cache, not to this object
        self._shifts = shifts
        xshape, nb = xg.shape, len(Wb)
        m = np.empty((len(a), nb, d, *xshape))  # the coordinate axis before the grid: no transposing copies
        self._logz_direct: dict[int, Array] = {}
        self._z = np.empty((int(sep.sum()), nb, *xshape))  # Z̃ = Z e^{−Σ_j s_j}, separable heads
        if sep.any():
            num = self._apply(np.stack([Wb, *(Wb * self._y(j) for j in range(d))], axis=1))  # (N_sep, S, 1+d, *x)
            self._z = num[:, :, 0]
            m[sep] = num[:, :, 1:] / self._z[:, :, None]
        for k in np.flatnonzero(~sep):
            lz, mk = softmax_moments_direct(xg.points(), yg.points(), W.ravel(), float(a[k]))
            self._logz_direct[int(k)], m[k, 0] = lz.reshape(xshape), np.moveaxis(mk.reshape(*xshape, d), -1, 0)
        self._m = m  # (N_a, S, d, *xshape)

    @property
    def m(self) -> Array:
        """The tilted means m_k(x), shape (N_a, (S,) *xg.shape, d) (a view)."""
        return self._unbatch(np.moveaxis(self._m, 2, -1), 1)

    def _y(self, j: int) -> Array:
        """The coordinate y_j on the grid yg, broadcastable to yg.shape."""
        d, ax = len(self.yg.axes), self.yg.axes[j]
        return ax.reshape((-1,) + (1,) * (d - 1 - j)) if d == 2 else ax

    def _unbatch(self, x: Array, axis: int) -> Array:
        return x if self.batched else np.take(x, 0, axis=axis)

    @property
    def logz(self) -> Array:
        """Log Z_k(x) = log Σ_y W_y e^{a_k x·y}, shape (N_a, (S,) *xg.shape) (computed when asked)."""
        d, sep = len(self.yg.axes), self.separable
        out = np.empty((len(self.a), *self._z.shape[1:]))
        if sep.any():
            logz = np.log(self._z)
            for j, s in enumerate(self._shifts):
                logz += s[sep].reshape((-1, 1) + tuple(len(self.xg.axes[i]) if i == j else 1 for i in range(d)))
            out[sep] = logz
        for k, lz in self._logz_direct.items():
            out[k, 0] = lz
        return self._unbatch(out, 1)

    @property
    def nbytes(self) -> int:
        """Memory held by this object (the shared factors of a :class:`SeparableFactors` not counted), in bytes."""
        own = 0 if self._shared else sum(e.nbytes for e in self._E)
        return own + self._m.nbytes + self._z.nbytes + sum(v.nbytes for v in self._logz_direct.values())

    def _apply(self, F: Array) -> Array:
        """E₁ F E₂ᵀ per separable head: F of shape (S, r, n₁(, n₂)) → (N_sep, S, r, m₁(, m₂)).

        numpy's stacked matrix product over (head, measure, right-hand side): for these sizes (tens of points
        per axis) faster than one wide product per head (measured: 4 ms against 8 ms for 17 heads, 60 columns).
        """
        E, lead = self._E, F.shape[:2]
        Fs = F.reshape(1, -1, *F.shape[2:])
        if len(E) == 1:
            out = np.matmul(E[0][:, None], Fs[..., None])[..., 0]
        else:
            out = np.matmul(np.matmul(E[0][:, None], Fs), E[1].transpose(0, 2, 1)[:, None])
        return out.reshape(len(E[0]), *lead, *out.shape[2:])

    def _apply_t(self, G: Array) -> Array:
        """Σ over heads of E₁ᵀ G E₂: G of shape (N_sep, S, r, m₁(, m₂)) → (S, r, n₁(, n₂))."""
        E, lead = self._E, G.shape[1:3]
        Gs = G.reshape(len(G), -1, *G.shape[3:])
        if len(E) == 1:
            out = np.matmul(E[0].transpose(0, 2, 1)[:, None], Gs[..., None])[..., 0]
        else:
            out = np.matmul(np.matmul(E[0].transpose(0, 2, 1)[:, None], Gs), E[1][:, None])
        return out.sum(axis=0).reshape(*lead, *out.shape[2:])

    def velocity(self, c: Array) -> Array:
        """V = Σ_k c_k m_k on xg, shape ((S,) *xg.shape, d) (theory §1.3 (F))."""
        return self._unbatch(np.moveaxis(np.tensordot(c, self._m, axes=1), 1, -1), 0)

    def vjp(self, c: Array, Xi: Array) -> tuple[Array, Array]:
        """The transpose of the derivative of Σ_x ξ·V with respect to (W, c) (theory §3.1 (B)).

        Args:
            c: the heads' value-weighted masses, shape (N_a,) (zero allowed).
            Xi: the cotangent on xg, shape ((S,) *xg.shape, d).

        Returns:
            (g_W, g_c): shapes ((S,) *yg.shape) and ((S,) N_a,), per measure of a batch.
        """
        d, sep = len(self.yg.axes), self.separable
        Xb = np.moveaxis(Xi.reshape(-1, *self.xg.shape, d), -1, 1)  # (S, d, *xshape)
        nb = len(Xb)
        xm: Array = np.einsum("ksj...,sj...->ks...", self._m, Xb)  # ξ·m_k, (N_a, S, *xshape)
        gc = xm.reshape(len(c), nb, -1).sum(axis=2).T  # (S, N_a)
        gW = np.zeros((nb, *self.yg.shape))
        if sep.any():
            cz = c[sep].reshape((-1, 1) + (1,) * d) / self._z  # c_k / Z̃_k, (N_sep, S, *xshape)
            G = np.concatenate([Xb[None] * cz[:, :, None], (xm[sep] * cz)[:, :, None]], axis=2)
            T = self._apply_t(G)  # (S, 1 + d, *yshape), summed over heads
            for j in range(d):
                gW += T[:, j] * self._y(j)
            gW -= T[:, d]
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
