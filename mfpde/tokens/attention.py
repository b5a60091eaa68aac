"""Softmax attention kernels: the nonlocal velocity of the token McKean–Vlasov equation (pure numpy).

For a head θ with A(θ) = a(θ) I_d and V(θ) = v(θ) I_d (theory §1.2),

    v_θ(x, μ) = v(θ) m_a(x),     m_a(x) = ∫ y e^{a x·y} dμ(y) / ∫ e^{a x·y} dμ(y),

and the McKean–Vlasov velocity averaged over the head distribution ρ (theory §1.3 (F)) is

    V[μ; ρ](x) = ∫_Θ v(θ) m_{a(θ)}(x) dρ(θ) = Σ_k c_k m_{a_k}(x),    c_k = ∫_{a(θ) = a_k} v(θ) dρ(θ).

**Structure used** (why this is cheap):

1. V is linear in ρ and depends on ρ only through the head mass per *distinct* a: a Θ grid with N_a
   distinct a-coordinates costs N_a softmax evaluations, not one per Θ dof (``value`` family: one).
2. On tensor grids (boxes with quadrilateral or interval cells) the kernel separates,
   e^{a x·y} = Π_j e^{a x_j y_j}, so ∫ e^{a x·y} f(y) dμ(y) over an n₁×n₂ grid of y for all of an m₁×m₂
   grid of x is the matrix product E₁ W E₂ᵀ: (m₁n₁ + m₂n₂) exponentials and O(m₁n₁n₂ + m₁m₂n₂) BLAS flops
   per distinct a, instead of m₁m₂n₁n₂ exponentials (all heads in one batched product:
   :mod:`mfpde.tokens.box.separable`).
3. In d = 1, m_a(x) = f(a x) for one smooth function f = (log Z_μ)' of s = a x: it is interpolated in
   s by a Chebyshev series of adaptive degree (trailing coefficients < 1e-14, :func:`tilted_mean_1d`), so
   all heads and points cost (degree + 1) N_y exponentials (degree ~ 16–128) instead of N_a N_x N_y.
4. Otherwise (unstructured meshes), the direct sum in blocks of x: N_x N_y exponentials per distinct a.

Costs per evaluation of V: tensor path O(N_a (N_x^{1/2} N_y^{1/2} + N_x^{1/2} N_y)) with N_a (m + n) exponentials;
direct path N_a N_x N_y exponentials. Everything is computed in the log domain: the softmax is shifted by
the row maximum of a x·y over the support of μ, so |a x·y| in the thousands neither overflows nor divides
0 by 0 (the tensor path falls back to the direct path when its exponent range could underflow).

Inputs are non-dimensional. No dolfinx here: the solvers hand in points and weights.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from mfpde.heads import HeadMeasure
from mfpde.tokens.box.substitution import substituted_values

Array = npt.NDArray[np.float64]

#: Block size (rows of x) for the direct path: bounds memory at _BLOCK * N_y doubles.
_BLOCK = 2048
#: Cap on the exponents of shifted softmax factors, reached only off the support of μ (where the factor multiplies
#: a zero weight): e^{700} < 1.8e308, the largest double.
EXP_CAP = 700.0


@dataclass(frozen=True)
class TensorGrid:
    """A tensor-product point set: ``axes[j]`` holds the coordinates along axis j (d = 1 or 2)."""

    axes: tuple[Array, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        """The number of points along each axis."""
        return tuple(len(a) for a in self.axes)

    def points(self) -> Array:
        """All points in C order, shape (Π n_j, d)."""
        mesh = np.meshgrid(*self.axes, indexing="ij")
        return np.stack([m.ravel() for m in mesh], axis=1)


def softmax_moments_direct(x: Array, y: Array, w: Array, a: float) -> tuple[Array, Array]:
    """Log Z and the tilted mean m_a at x, by direct log-domain sums.

    Args:
        x: evaluation points, shape (N_x, d).
        y: support points of μ, shape (N_y, d).
        w: weights of μ, shape (N_y,), non-negative, not all zero.
        a: the scalar in A = a I_d.

    Returns:
        (log Z, m): shapes (N_x,) and (N_x, d), with Z(x) = Σ_y w_y e^{a x·y}.
    """
    sup = w > 0
    ys, logw = y[sup], np.log(w[sup])
    logz = np.empty(len(x))
    m = np.empty((len(x), y.shape[1]))
    for s in range(0, len(x), _BLOCK):
        e = a * (x[s : s + _BLOCK] @ ys.T) + logw
        shift = e.max(axis=1, keepdims=True)
        np.exp(e - shift, out=e)
        z = e.sum(axis=1)
        m[s : s + _BLOCK] = (e @ ys) / z[:, None]
        logz[s : s + _BLOCK] = np.log(z) + shift[:, 0]
    return logz, m


def _negligible(heads: HeadMeasure) -> npt.NDArray[np.bool_]:
    """Heads whose |c_k| is below 1e-16 of the total (e.g. Gaussian tails of ρ): skipped by the velocity."""
    return np.abs(heads.c) <= 1e-16 * np.abs(heads.c).sum()


def active_heads(heads: HeadMeasure, linearize: bool) -> tuple[Array, Array]:
    """The (a, c) a velocity evaluation takes, shapes (N_active,).

    Every head when linearised (the VJP needs ∂/∂c_k of all of them), else the heads that are not negligible
    (:func:`_negligible`).
    """
    keep = np.ones(len(heads.a), bool) if linearize else ~_negligible(heads)
    return heads.a[keep], heads.c[keep]


#: The Chebyshev degrees tried, doubling, by the d = 1 interpolants (forward and VJP).
CHEBYSHEV_DEGREES = (16, 32, 64, 128, 256, 512)


@functools.cache
def _dct_matrix(n: int) -> Array:
    """The DCT-I map from values at the n + 1 Chebyshev points cos(πl/n) to Chebyshev coefficients."""
    k = np.arange(n + 1)
    D = np.cos(np.pi * np.outer(k, k) / n) * (2.0 / n)
    D[:, [0, -1]] *= 0.5
    D[[0, -1]] *= 0.5
    return D


def chebyshev_coefficients(values: Array, n: int) -> Array:
    """Chebyshev coefficients, shape (n + 1, R), of the columns of ``values`` at cos(πl/n), shape (n + 1, R).

    The DCT-I (Trefethen, *Approximation Theory and Approximation Practice*, SIAM 2013, ch. 3): a dense product
    for n ≤ 64 (one BLAS call, faster than an FFT of that length along the first axis), :mod:`scipy.fft` beyond.
    """
    if n <= 64:
        return _dct_matrix(n) @ values
    import scipy.fft  # only here: with scipy.special, a tenth of a second of every run's start-up

    coef = scipy.fft.dct(values, type=1, axis=0) / n
    coef[[0, -1]] *= 0.5
    return coef


def tilted_kernel(lo: float, hi: float, n: int, y: Array, w: Array, rows: slice = slice(None)
                  ) -> tuple[Array, Array, Array]:
    """The softmax kernel of μ = Σ w_y δ_y (d = 1) at the n + 1 Chebyshev points σ_l of [lo, hi].

    Args:
        lo: the interval's lower end.
        hi: the interval's upper end.
        n: the degree.
        y: support of μ, shape (N_y,).
        w: weights of μ, shape (N_y,).
        rows: the points wanted (e.g. ``slice(1, None, 2)``: the points that degree n adds to degree n/2).

    Returns:
        (σ, Q, Z̃): the nodes σ_l = (lo + hi)/2 + (hi − lo)/2 cos(πl/n), shape (n + 1,) (or the rows asked for);
        Q = e^{σ_l y − s_l} ≤ 1/w_y with s_l = max over the support of σ_l y + log w_y, and 0 off the support
        (:func:`support_only`), shape (len(σ), N_y); and Z̃ = Σ_y w_y Q ∈ [1, N_y]. The kernel
        P(σ, y) = e^{σy − Λ(σ)} is Q / Z̃ on the support.
    """
    sup = w > 0
    nodes = (0.5 * (lo + hi) + 0.5 * (hi - lo) * np.cos(np.pi * np.arange(n + 1) / n))[rows]
    shift = (nodes[:, None] * y[sup][None, :] + np.log(w[sup])[None, :]).max(axis=1)
    Q = np.zeros((len(nodes), len(y)))
    Q[:, sup] = np.exp(np.minimum(nodes[:, None] * y[sup][None, :] - shift[:, None], EXP_CAP))
    return nodes, Q, Q[:, sup] @ w[sup]


@dataclass(frozen=True)
class TiltedInterpolant:
    """f(σ) = Σ_y w_y y e^{σy} / Σ_y w_y e^{σy} on [lo, hi] (d = 1) by its Chebyshev series.

    Attributes:
        lo, hi: the interval in σ = a x.
        n: the degree.
        coef: the Chebyshev coefficients of f, shape (n + 1,).
        kernel_coef: the Chebyshev coefficients c_i(y) of σ ↦ P(σ, y) = e^{σy − Λ(σ)} for every y, shape
            (n + 1, N_y), converged by the VJP's rule (:mod:`mfpde.tokens.box.chebyshev`), if asked for; what the
            reverse pass needs, so it computes no exponential.
    """

    lo: float
    hi: float
    n: int
    coef: Array
    kernel_coef: Array | None = None

    def __call__(self, s: Array) -> Array:
        """F at s (any shape, inside [lo, hi]), by Clenshaw's recurrence."""
        t = np.clip((2.0 * s - (self.lo + self.hi)) / (self.hi - self.lo), -1.0, 1.0)
        return np.asarray(np.polynomial.chebyshev.chebval(t, self.coef), dtype=np.float64)

    def outer(self, a: Array, x: Array) -> Array:
        """F at the sources s = a_k x_i (inside [lo, hi]), shape (N_a, N_x).

        Two matrix products by the affine substitution of x (:mod:`mfpde.tokens.box.substitution`), or Clenshaw's
        recurrence where it does not apply (one point, degree < 2).
        """
        v = substituted_values(a, x, self.coef, self.lo, self.hi)
        return v if v is not None else self(np.outer(a, x))


def kernel_converged(coef: Array, tol: float) -> bool:
    """The stopping rule of the kernel's series: for every y the last three |c_i(y)| ≤ tol · max_i |c_i(y)|."""
    return bool(np.all(np.abs(coef[-3:]).max(axis=0) <= tol * np.abs(coef).max(axis=0)))


def tilted_interpolant(lo: float, hi: float, y: Array, w: Array, tol: float = 1e-14, max_degree: int = 512,
                       kernel: bool = False) -> TiltedInterpolant | None:
    """The Chebyshev interpolant of f = (log Z)' on [lo, hi] (hi > lo), or None if ``max_degree`` is not enough.

    f is analytic, so its series converges geometrically; the degree is doubled from 16 until the last three
    coefficients fall below ``tol`` times max |y| (the points are nested: each doubling computes only the new
    ones). Cost: (degree + 1) N_y exponentials. With ``kernel`` the
    degree is raised until the kernel's series converges too (:func:`kernel_converged`) and its coefficients
    are kept (``kernel_coef``); where ``max_degree`` does not allow that, the interpolant of f alone.
    """
    sup = w > 0
    wy = w[sup] * y[sup]
    scale = max(float(np.abs(y).max()), 1e-300)
    f_only = None
    Q, Zt = np.empty((0, len(y))), np.empty(0)
    for n in (d for d in CHEBYSHEV_DEGREES if d <= max_degree):
        # The points of degree n/2 are the even points of degree n: only the odd ones are new.
        if len(Zt):
            _, Q_odd, Zt_odd = tilted_kernel(lo, hi, n, y, w, slice(1, None, 2))
            Q = np.stack([Q, np.vstack([Q_odd, np.zeros((1, len(y)))])], axis=1).reshape(-1, len(y))[: n + 1]
            Zt = np.stack([Zt, np.append(Zt_odd, 0.0)], axis=1).ravel()[: n + 1]
        else:
            _, Q, Zt = tilted_kernel(lo, hi, n, y, w)
        coef = chebyshev_coefficients(((Q[:, sup] @ wy) / Zt)[:, None], n)[:, 0]
        if np.abs(coef[-3:]).max() <= tol * scale:
            if not kernel:
                return TiltedInterpolant(lo, hi, n, coef)
            kcoef = chebyshev_coefficients(Q / Zt[:, None], n)
            if kernel_converged(kcoef, tol):
                return TiltedInterpolant(lo, hi, n, coef, kcoef)
            f_only = f_only or TiltedInterpolant(lo, hi, n, coef)
    return f_only


def tilted_mean_1d(s: Array, y: Array, w: Array, tol: float = 1e-14) -> Array | None:
    """f(s) = Σ_y w_y y e^{s y} / Σ_y w_y e^{s y} (d = 1) at many s, by Chebyshev interpolation in s.

    In d = 1, m_a(x) = f(a x): one smooth function of the product s = a x serves every head and every
    point (:func:`tilted_interpolant`). Cost: (degree + 1) N_y exponentials instead of N_s N_y.

    Args:
        s: evaluation points, any shape.
        y: support of μ, shape (N_y,).
        w: weights of μ, shape (N_y,).
        tol: the tail tolerance, relative to max |y|.

    Returns:
        f(s) with the shape of s, or None if degree 512 does not reach ``tol`` or the interpolation would
        not save work over the direct sums (use the direct path).
    """
    lo, hi = float(s.min()), float(s.max())
    if hi - lo < 1e-12:
        return np.full(s.shape, softmax_moments_direct(np.array([[lo]]), y[:, None], w, 1.0)[1][0, 0])
    interp = tilted_interpolant(lo, hi, y, w, tol, max_degree=s.size // 4 - 1)
    return None if interp is None else interp(s)


def velocity(x: Array, y: Array, w: Array, heads: HeadMeasure) -> Array:
    """The McKean–Vlasov velocity V[μ; ρ](x) by the direct path (theory §1.3 (F)).

    Args:
        x: evaluation points, shape (N_x, d).
        y: support of μ, shape (N_y, d).
        w: weights of μ, shape (N_y,).
        heads: the reduced head distribution.

    Returns:
        V at x, shape (N_x, d). Cost: N_a N_x N_y exponentials; in d = 1 (degree + 1) N_y by
        :func:`tilted_mean_1d` when that converges.
    """
    keep = ~_negligible(heads)
    a, c = heads.a[keep], heads.c[keep]
    if y.shape[1] == 1 and len(a):
        f = tilted_mean_1d(np.outer(a, x[:, 0]), y[:, 0], w)
        if f is not None:
            return (c @ f)[:, None]
    out = np.zeros((len(x), y.shape[1]))
    for ak, ck in zip(a, c, strict=True):
        out += ck * softmax_moments_direct(x, y, w, ak)[1]
    return out


def velocity_vjp(x: Array, y: Array, w: Array, heads: HeadMeasure, xi: Array,
                 moments: tuple[Array, Array] | None = None) -> tuple[Array, Array]:
    """The transpose of the velocity's derivative (reverse mode), by the direct path.

    For V(x) = Σ_k c_k m_{a_k}(x) with m_a(x) = Σ_y w_y y e^{a x·y} / Σ_y w_y e^{a x·y} and a cotangent
    ξ(x), returns

        g_w(y) = Σ_k c_k Σ_x ξ(x)·(y − m_k(x)) e^{a_k x·y} / Z_k(x)     (∂/∂w_y of Σ_x ξ·V; theory §3.1 S_t),
        g_c(k) = Σ_x ξ(x)·m_k(x)                                          (∂/∂c_k of Σ_x ξ·V).

    Args:
        x: evaluation points, shape (N_x, d).
        y: support of μ, shape (N_y, d).
        w: weights of μ, shape (N_y,).
        heads: the reduced heads, N_a of them (zero c_k allowed).
        xi: the cotangent at x, shape (N_x, d).
        moments: (log Z, m) of every head at x, shapes (N_a, N_x) and (N_a, N_x, d), if the forward has
            them (:func:`softmax_moments_direct`); else they are computed.

    Returns:
        (g_w, g_c) of shapes (N_y,) and (N_a,). Cost 2 N_a N_x N_y exponentials (N_a N_x N_y with
        ``moments``). g_w is formed on the support of μ only and is 0 where w_y = 0 (:func:`support_only`).
    """
    sup = w > 0
    ys = y[sup]
    gs = np.zeros(len(ys))
    gc = np.zeros(len(heads.a))
    for k, (ak, ck) in enumerate(zip(heads.a, heads.c, strict=True)):
        logz, m = softmax_moments_direct(x, y, w, ak) if moments is None else (moments[0][k], moments[1][k])
        xm = (xi * m).sum(axis=1)
        gc[k] = xm.sum()
        if ck == 0.0:
            continue
        for s in range(0, len(x), _BLOCK):  # e^{a x·y − log Z(x)} ≤ 1/w_y on the support: no overflow
            e = np.exp(np.minimum(ak * (x[s : s + _BLOCK] @ ys.T) - logz[s : s + _BLOCK, None], EXP_CAP))
            gs += ck * (((xi[s : s + _BLOCK].T @ e) * ys.T).sum(axis=0) - xm[s : s + _BLOCK] @ e)
    gw = np.zeros(len(y))
    gw[sup] = gs
    return gw, gc


def support_only(g: Array, w: Array) -> Array:
    """The VJPs' convention at a zero weight: g where w > 0 and 0 where w = 0, shape of g.

    The forward softmax sums over the support of μ, shifted by its maximum there (the log domain). The derivative
    with respect to a weight w_y that is zero, (y − m(x)) e^{a x·y}/Z(x), is not: e^{a x·(y − y*)} for a point y
    off the support can exceed any float (e^{1152} for a = 300 on [−4, 4] with μ = δ_{−3}), and capping it leaves
    values that overflow once summed or multiplied (issue 14: exit 3 "non-finite first variation"). It is not
    needed: the transport is positive (DG0 upwind, and DG1 with the Zhang–Shu limiter, whose clipped nodes are
    zero for every nearby ρ), so a weight that is zero at a stage is zero for every ρ near the current one, its
    costate is multiplied by a zero derivative wherever it would reach ∂R/∂c, and the first variation is exact
    with 0 in its place. (The costate p_0 = ∂R/∂μ_0 at a zero of μ_0 is then not formed.)
    """
    return np.where(w > 0, g, 0.0)
