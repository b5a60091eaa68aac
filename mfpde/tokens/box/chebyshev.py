"""The d = 1 vector–Jacobian product of the attention velocity by Chebyshev interpolation in s = a x.

In d = 1 every head and every point enter the velocity only through the product s = a x (theory §1.3 (F):
m_a(x) = f(a x), :func:`~mfpde.tokens.attention.tilted_mean_1d`). The same holds for the transpose of its
derivative, the nonlocal source of the adjoint (theory §3.1 (B)): with Λ(s) = log Σ_y w_y e^{s y} and the
normalised kernel P(s, y) = e^{s y − Λ(s)},

    g_w(y) = Σ_k c_k Σ_x ξ(x) (y − m(a_k x)) P(a_k x, y)
           = Σ_j u_j (y − m_j) P(s_j, y),          sources j = (k, x): s_j = a_k x, u_j = c_k ξ(x).

For every y, σ ↦ P(σ, y) is analytic (its logarithm σ y − Λ(σ) is concave), so it is interpolated at the
n + 1 Chebyshev points of [min s, max s] and written in the Chebyshev basis, P(s, y) ≈ Σ_i c_i(y) T_i(t(s)),
with c_i(y) from the DCT-I of the node values (Trefethen, *Approximation Theory and Approximation
Practice*, SIAM 2013, ch. 3). Then

    g_w(y) ≈ Σ_i c_i(y) (y A_i − B_i),     A_i = Σ_j u_j T_i(t_j),  B_i = Σ_j u_j m_j T_i(t_j),

the moments A, B by substitution where the sources are s = a_k x_i (every call here): t(a_k x) is affine in
x̂ = (x − x_c)/x_r, so T_i(t) is a polynomial in x̂ whose Chebyshev coefficients C_k (per head, cached across the
stages of a reverse pass) turn the moments into two matrix products (:mod:`mfpde.tokens.box.substitution`). Cost:
2 (n + 1) N_y exponentials and about 2 N_a (N_x + n)(n + 1) flops in matrix products, instead of
2 N_a N_x N_y exponentials for the direct sums (or n passes over the N_a N_x sources by the recurrence).
The degree n is doubled from 16 until, for every y, the last three Chebyshev coefficients of σ ↦ P(σ, y)
fall below ``tol`` times the largest (the stopping rule of the forward's
:func:`~mfpde.tokens.attention.tilted_mean_1d`); where degree 512 does not reach it, the caller uses the direct
path.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from mfpde.heads import HeadMeasure
from mfpde.tokens.attention import (
    CHEBYSHEV_DEGREES,
    EXP_CAP,
    TiltedInterpolant,
    chebyshev_coefficients,
    kernel_converged,
    softmax_moments_direct,
    tilted_kernel,
    tilted_mean_1d,
)
from mfpde.tokens.box.substitution import substituted_moments

__all__ = ["velocity_vjp_1d"]

Array = npt.NDArray[np.float64]

def _chebyshev_moments(t: Array, weights: Array, n: int) -> Array:
    """Σ_j weights[r, j] T_i(t_j) for i = 0..n, shape (n + 1, R), by the three-term recurrence (|t| ≤ 1)."""
    out = np.empty((n + 1, weights.shape[0]))
    t_prev, t_cur, t2, buf = np.ones_like(t), t.copy(), 2.0 * t, np.empty_like(t)
    out[0] = weights.sum(axis=1)
    out[1] = weights @ t_cur
    for i in range(2, n + 1):  # T_i = 2t T_{i−1} − T_{i−2}, in place
        np.multiply(t2, t_cur, out=buf)
        buf -= t_prev
        t_prev, t_cur, buf = t_cur, buf, t_prev
        out[i] = weights @ t_cur
    return out


def velocity_vjp_1d(x: Array, y: Array, w: Array, heads: HeadMeasure, xi: Array,
                    tol: float = 1e-14, start: int = 16, m: Array | None = None,
                    interp: TiltedInterpolant | None = None) -> tuple[Array, Array, int] | None:
    """:func:`~mfpde.tokens.attention.velocity_vjp` in d = 1 by Chebyshev interpolation in s = a x.

    Args:
        x: evaluation points, shape (N_x, 1).
        y: support of μ, shape (N_y, 1).
        w: weights of μ, shape (N_y,), non-negative, not all zero.
        heads: the reduced head distribution, N_a heads (zero c_k allowed).
        xi: the cotangent at x, shape (N_x, 1).
        tol: the tail tolerance of the Chebyshev coefficients, relative to the largest, per y.
        start: the first degree tried (the degree of the previous call is a good guess: the adjoint calls
            this at every stage of every depth step, with a slowly changing μ).
        m: the tilted means m(a_k x) of the forward, shape (N_a, N_x), if it has them; else computed by
            :func:`~mfpde.tokens.attention.tilted_mean_1d`.
        interp: the forward's interpolant of the same μ on an interval holding every a_k x; if it carries the
            kernel's converged coefficients (``kernel_coef``), they are used and no exponential is computed.

    Returns:
        (g_w, g_c, n): shapes (N_y,) and (N_a,) as the direct path (theory §3.1 (B)), and the degree used;
        or None where the direct path is as cheap (few sources) or the interpolation does not reach
        ``tol`` by degree 512. As the direct path, g_w is 0 where w_y = 0
        (:func:`~mfpde.tokens.attention.support_only`).
    """
    xs, ys, cot = x[:, 0], y[:, 0], xi[:, 0]
    s = np.outer(heads.a, xs)  # (N_a, N_x) sources
    if m is None:
        m = tilted_mean_1d(s, ys, w, tol)
    if m is None:
        return None
    gc = m @ cot  # g_c(k) = Σ_x ξ(x) m(a_k x)
    u = (heads.c[:, None] * cot[None, :]).ravel()
    src, msrc = s.ravel(), m.ravel()
    lo, hi = (interp.lo, interp.hi) if interp is not None else (float(src.min()), float(src.max()))
    if hi - lo < 1e-12:  # one s: no interpolation
        logz = softmax_moments_direct(np.array([[lo]]), y, w, 1.0)[0][0]
        sup = w > 0
        e = np.zeros(len(ys))
        e[sup] = np.exp(np.minimum(lo * ys[sup] - logz, EXP_CAP))
        return (ys * u.sum() - u @ msrc) * e, gc, 0

    def moments(n: int) -> Array:  # A, B of degree n: by substitution, else the recurrence over the sources
        uw = np.stack([u, u * msrc])
        sub = substituted_moments(heads.a, xs, uw.reshape(2, len(heads.a), len(xs)), lo, hi, n)
        if sub is not None:
            return sub
        return _chebyshev_moments(np.clip((2.0 * src - (lo + hi)) / (hi - lo), -1.0, 1.0), uw, n)

    if interp is not None and interp.kernel_coef is not None:  # the forward converged the kernel's series
        A, B = moments(interp.n).T
        return ys * (A @ interp.kernel_coef) - B @ interp.kernel_coef, gc, interp.n
    for n in (d for d in CHEBYSHEV_DEGREES if d >= min(start, CHEBYSHEV_DEGREES[-1])):
        if 2 * (n + 1) > src.size:  # no saving over the direct sums
            return None
        _, Q, Zt = tilted_kernel(lo, hi, n, ys, w)  # P(σ, y) = e^{σy − Λ(σ)} = Q / Z̃: one exponential per (σ_l, y)
        coef = chebyshev_coefficients(Q / Zt[:, None], n)  # Chebyshev coefficients c_i(y) (ATAP ch. 3)
        if kernel_converged(coef, tol):
            A, B = moments(n).T
            return ys * (A @ coef) - B @ coef, gc, n
    return None
