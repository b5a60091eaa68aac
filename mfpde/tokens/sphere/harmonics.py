"""Real orthonormal spherical harmonics Y_ℓm on S² (the basis of the sphere's data and kernel, theory §9).

Index k = ℓ² + ℓ + m for ℓ = 0..L, m = −ℓ..ℓ; (L+1)² functions, orthonormal in L²(S², dσ):

    Y_ℓ0 = Y_ℓ^0,   Y_ℓm = √2 (−1)^m Re Y_ℓ^m (m > 0),   Y_ℓm = √2 (−1)^m Im Y_ℓ^{|m|} (m < 0),

with Y_ℓ^m the complex harmonics of :func:`scipy.special.sph_harm_y` (Condon–Shortley phase), colatitude ϑ
from the z-axis and longitude φ. In Cartesian form, on the unit sphere,

    Y_ℓm(x) = q_ℓ^|m|(z) T_m(x, y),   T_m = Re (x + iy)^m (m ≥ 0),  Im (x + iy)^|m| (m < 0),

where q_ℓ^m(z) = N_ℓm P_ℓ^m(z)/(1 − z²)^{m/2} is a polynomial of degree ℓ − m, computed by the standard
three-term recurrence of the normalised associated Legendre functions (stable; no division by sin ϑ). The
polynomial F_ℓm = q_ℓ^|m|(z) T_m(x, y) extends Y_ℓm off the sphere, so its surface gradient is the tangent
projection of the 3-D gradient: ∂_z F = q' T, ∂_x T_m = m T_{m−1}, ∂_y T_m = ∓ m T_{−(m−1)} (no poles, no
finite differences). Cost O(n (L+1)²) for n points, vectorised over the orders m; memory O(L n) per block of points (the
orders m on the leading axis, the points contiguous).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

import numpy as np
import numpy.typing as npt

__all__ = ["analysis", "fourier_factors", "legendre_rows", "radial_synthesis", "real_harmonics", "synthesis"]

Array = npt.NDArray[np.float64]

#: points per block of the recurrences (arrays of BLOCK × (L+1) doubles stay in cache)
BLOCK = 1024


@lru_cache(maxsize=16)
def _recurrence(L: int) -> tuple[Array, Array, Array]:
    """a_ℓm, b_ℓm (shape (L+1, L+1, 1)) of q_ℓ^m = a (z q_{ℓ−1}^m − b q_{ℓ−2}^m) for m < ℓ, and the diagonal q_m^m."""
    a, b = np.zeros((L + 1, L + 1, 1)), np.zeros((L + 1, L + 1, 1))
    for ll in range(1, L + 1):
        m = np.arange(ll)
        a[ll, :ll, 0] = np.sqrt((4.0 * ll * ll - 1.0) / (ll * ll - m * m))
        b[ll, :ll, 0] = np.sqrt(((ll - 1.0) ** 2 - m * m) / (4.0 * (ll - 1.0) ** 2 - 1.0))
    diag = np.empty(L + 1)
    diag[0] = 1.0 / np.sqrt(4.0 * np.pi)
    for k in range(1, L + 1):  # N_kk (2k−1)!!, with the √2 of the real harmonics from k = 1 on
        diag[k] = diag[k - 1] * np.sqrt((2.0 * k + 1.0) / (2.0 * k)) * (np.sqrt(2.0) if k == 1 else 1.0)
    return a, b, diag


def legendre_rows(L: int, z: Array, derivative: bool = False) -> Iterator[tuple[int, Array, Array | None]]:
    """Yield (ℓ, q_ℓ^m(z) for m = 0..ℓ (shape (ℓ+1, n)), dq/dz or None) for ℓ = 0..L, z = cos ϑ of shape (n,).

    q_ℓ^m includes the normalisation of the real harmonics (Y_ℓm = q_ℓ^|m| T_m). The yielded arrays are views
    of three rotating buffers: valid until the iteration after next.
    """
    a, b, diag = _recurrence(L)
    n = len(z)
    q = np.zeros((3, L + 1, n))
    d = np.zeros((3, L + 1, n)) if derivative else q
    q[0, 0] = diag[0]
    yield 0, q[0, :1], (d[0, :1] if derivative else None)
    t = np.empty((L + 1, n))
    for ll in range(1, L + 1):
        q0, q1, q2 = q[ll % 3], q[(ll - 1) % 3], q[(ll - 2) % 3]  # q_ℓ, q_{ℓ−1}, q_{ℓ−2} (zero past its ℓ−2)
        q2[ll - 1] = 0.0
        tt = t[:ll]
        np.multiply(z, q1[:ll], out=tt)
        tt -= b[ll, :ll] * q2[:ll]
        np.multiply(a[ll, :ll], tt, out=q0[:ll])
        q0[ll] = diag[ll]
        if derivative:
            d0, d1, d2 = d[ll % 3], d[(ll - 1) % 3], d[(ll - 2) % 3]
            d2[ll - 1] = 0.0
            np.multiply(z, d1[:ll], out=tt)
            tt += q1[:ll]
            tt -= b[ll, :ll] * d2[:ll]
            np.multiply(a[ll, :ll], tt, out=d0[:ll])
            d0[ll] = 0.0
        yield ll, q0[:ll + 1], (d[ll % 3, :ll + 1] if derivative else None)


def fourier_factors(L: int, x: Array) -> tuple[Array, Array]:
    """Re and Im of (x + iy)^m for m = 0..L at the points x (n, 3): two arrays of shape (L+1, n)."""
    c = x[:, 0] + 1j * x[:, 1]
    p = np.empty((L + 1, len(x)), complex)
    p[0] = 1.0
    for m in range(1, L + 1):  # a loop of products: 10× faster than a complex cumprod over the (L+1, n) array
        np.multiply(p[m - 1], c, out=p[m])
    return np.ascontiguousarray(p.real), np.ascontiguousarray(p.imag)


def _unit(x: npt.ArrayLike) -> Array:
    x = np.asarray(x, dtype=float).reshape(-1, 3)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def real_harmonics(L: int, x: npt.ArrayLike) -> Array:
    """Y_ℓm(x) for ℓ ≤ L at the points x (n, 3) (normalised to unit vectors): shape (n, (L+1)²), column ℓ² + ℓ + m.

    Raises:
        ValueError: L < 0.
    """
    if L < 0:
        raise ValueError(f"L must be >= 0, got {L}")
    x = _unit(x)
    out = np.empty((len(x), (L + 1) ** 2))
    for s in range(0, len(x), BLOCK):
        xb = x[s:s + BLOCK]
        tc, ts = fourier_factors(L, xb)
        o = out[s:s + BLOCK]
        for ll, q, _ in legendre_rows(L, xb[:, 2]):
            k = ll * ll + ll
            o[:, k:k + ll + 1] = (q * tc[:ll + 1]).T
            o[:, k - ll:k] = (q[:0:-1] * ts[ll:0:-1]).T
    return out


def analysis(L: int, x: npt.ArrayLike, w: npt.ArrayLike) -> Array:
    """The sums Σ_j w_j Y_ℓm(x_j) for ℓ ≤ L at the points x (n, 3): shape ((L+1)²,), index ℓ² + ℓ + m.

    With k sets of weights w (k, n) at once (one matrix product per degree): shape (k, (L+1)²).
    """
    x = _unit(x)
    w = np.asarray(w, dtype=float)
    ws = w.reshape(-1, len(x))
    out = np.zeros((len(ws), (L + 1) ** 2))
    for s in range(0, len(x), BLOCK):
        xb, wb = x[s:s + BLOCK], ws[:, s:s + BLOCK]
        tc, ts = fourier_factors(L, xb)
        for ll, q, _ in legendre_rows(L, xb[:, 2]):
            k = ll * ll + ll
            out[:, k:k + ll + 1] += wb @ (q * tc[:ll + 1]).T
            out[:, k - ll:k] += wb @ (q[:0:-1] * ts[ll:0:-1]).T
    return out[0] if w.ndim == 1 else out


def radial_synthesis(L: int, g: Array, x: npt.ArrayLike, radial: Array) -> Array:
    """Σ_ℓm radial_ℓ(x) g_{i,ℓm} Y_ℓm(x) for the k series g (k, (L+1)²) at the points x (n, 3): shape (k, n).

    ``radial`` (L+1, n) multiplies degree ℓ at each point (e.g. 4π i_ℓ(β r) of a Funk–Hecke expansion about a
    point other than the origin).
    """
    x = _unit(x)
    nk = len(g)
    gp, gm = np.zeros((nk, L + 1, L + 1, 1)), np.zeros((nk, L + 1, L + 1, 1))
    for ll in range(L + 1):
        k = ll * ll + ll
        gp[:, ll, :ll + 1, 0] = g[:, k:k + ll + 1]
        gm[:, ll, 1:ll + 1, 0] = g[:, k - ll:k][:, ::-1]
    out = np.empty((nk, len(x)))
    for s in range(0, len(x), BLOCK):
        xb = x[s:s + BLOCK]
        n = len(xb)
        tc, ts = fourier_factors(L, xb)
        sp, sm = np.zeros((nk, L + 1, n)), np.zeros((nk, L + 1, n))
        for ll, q, _ in legendre_rows(L, xb[:, 2]):
            qr = q * radial[ll, s:s + n]
            sp[:, :ll + 1] += qr * gp[:, ll, :ll + 1]
            sm[:, 1:ll + 1] += qr[1:] * gm[:, ll, 1:ll + 1]
        out[:, s:s + n] = np.einsum("mj,kmj->kj", tc, sp) + np.einsum("mj,kmj->kj", ts, sm)
    return out


def synthesis(L: int, g: Array, x: npt.ArrayLike, gradient: bool = False) -> tuple[Array, Array | None]:
    """The series f = Σ_k g_k Y_k at the points x (m, 3) (shape (m,)) and, if asked, its surface gradient ∇_S f (m, 3).

    g has shape ((L+1)²,), index ℓ² + ℓ + m. The gradient is P_x ∇F of the polynomial extension (see the module).
    """
    x = _unit(x)
    gp, gm = np.zeros((L + 1, L + 1, 1)), np.zeros((L + 1, L + 1, 1))
    for ll in range(L + 1):
        k = ll * ll + ll
        gp[ll, :ll + 1, 0] = g[k:k + ll + 1]
        gm[ll, 1:ll + 1, 0] = g[k - ll:k][::-1]
    f = np.empty(len(x))
    grad = np.empty((len(x), 3)) if gradient else None
    mm = np.arange(1, L + 1)[:, None]
    for s in range(0, len(x), BLOCK):
        xb = x[s:s + BLOCK]
        n = len(xb)
        tc, ts = fourier_factors(L, xb)
        sp, sm = np.zeros((L + 1, n)), np.zeros((L + 1, n))
        dp, dm = (np.zeros((L + 1, n)), np.zeros((L + 1, n))) if gradient else (sp, sm)
        for ll, q, d in legendre_rows(L, xb[:, 2], gradient):
            sp[:ll + 1] += q * gp[ll, :ll + 1]
            sm[1:ll + 1] += q[1:] * gm[ll, 1:ll + 1]
            if d is not None:
                dp[:ll + 1] += d * gp[ll, :ll + 1]
                dm[1:ll + 1] += d[1:] * gm[ll, 1:ll + 1]
        f[s:s + n] = np.einsum("mj,mj->j", tc, sp) + np.einsum("mj,mj->j", ts, sm)
        if grad is not None:
            g3 = np.empty((n, 3))
            g3[:, 2] = np.einsum("mj,mj->j", tc, dp) + np.einsum("mj,mj->j", ts, dm)
            a, b = sp[1:] * mm, sm[1:] * mm
            g3[:, 0] = np.einsum("mj,mj->j", tc[:L], a) + np.einsum("mj,mj->j", ts[:L], b)
            g3[:, 1] = np.einsum("mj,mj->j", tc[:L], b) - np.einsum("mj,mj->j", ts[:L], a)
            grad[s:s + n] = g3 - np.einsum("ij,ij->i", xb, g3)[:, None] * xb
    return f, grad
