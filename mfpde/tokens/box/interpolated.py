"""Attention on unstructured token meshes (d = 2): the tilted means on a Chebyshev grid, interpolated, with the VJP.

On a mesh that is not a tensor grid (triangles, a gmsh disk) the direct sums cost N_a N_x N_y exponentials. But
x ↦ m_a(x) = Σ_y w_y y e^{a x·y} / Σ_y w_y e^{a x·y} is analytic (theory §1.2), so it is evaluated on the
(n + 1)² Chebyshev points X = X₁ × X₂ of the mesh's bounding box and interpolated to the vertices. On that grid
the kernel separates even though the support of μ is unstructured:

    Σ_y w_y f(y) e^{a X·y} = Σ_y E₁[i, y] w_y f(y) E₂[l, y],    E_j[i, y] = e^{a X_{j,i} y_j − s_j(i)},

one product (E₁ ∘ w f) E₂ᵀ per head: 2 (n + 1) N_y exponentials and 3 (n + 1)² N_y flops instead of N_x N_y
exponentials. The shift s_j(i) is the maximum over the support of μ (log domain); a head whose exponent range over
the support exceeds ``_RANGE_MAX`` is left to the direct sums. Interpolation in matrix form: with the Chebyshev
coefficients C = D m Dᵀ (D the DCT-I, Trefethen, *Approximation Theory and Approximation Practice*, SIAM 2013,
ch. 3) and B_j = T(t_j(x)) D the Lagrange basis of the grid at the points,

    m_h(x) = Σ_{i,l} B₁[x, i] m(X_{il}) B₂[x, l].

The degree is doubled from 16 until, for every head and component, the last three rows and columns of C fall below
``tol`` · max |y| (or declined beyond 64, or where the grid's 3 (n + 1)² N_y flops would cost more than the direct
sums' N_x N_y exponentials: (n + 1)² > 4 N_x, ``max_points``).
The grid and the degree depend only on the global bounding box and on μ, never on the partition, so the
velocity at a vertex is the same on any number of ranks.

**Without gathering μ** (``comm``, :mod:`mfpde.tokens.box.reduced`): y and w are one rank's part of μ. The sums
over y are split: the shifts s_j(i) are reduced with MAX over the ranks, the grid sums (E₁ ∘ w f) E₂ᵀ with SUM (3
(n + 1)² N_a numbers per degree tried), and every rank then holds the same grid values, so the degree test, the
grid and the interpolated velocity are those of the gathered μ up to the order of the sums. A head whose exponent
range is too large has no direct sums to fall back on there: :attr:`ok` is then False (the caller gathers).

The vector–Jacobian product transposes exactly this map (so the discrete adjoint stays exact, theory §3.1 (B)):
the cotangent is carried to the grid, Ξ_j = B₁ᵀ diag(ξ_j) B₂, and

    g_w(y) = Σ_k c_k Σ_{i,l} [Σ_j Ξ_j (y_j − m_{k,j})]_{il} E₁[i, y] E₂[l, y] / Z̃_k[i, l],   g_c(k) = Σ_{il} Ξ·m_k.

Inputs are non-dimensional; no dolfinx here.
"""

from __future__ import annotations

from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from mfpde.tokens.attention import EXP_CAP, chebyshev_coefficients, softmax_moments_direct
from mfpde.tokens.box.reduced import global_support

__all__ = ["InterpolatedSoftmax"]

Array = npt.NDArray[np.float64]

#: Exponent range over the support (summed over axes) beyond which a head is left to the direct sums.
_RANGE_MAX = 600.0
#: Degrees tried, doubling.
_DEGREES = (16, 32, 64)


def _basis(t: Array, n: int) -> Array:
    """Values at t ∈ [−1, 1] (shape (N,)) of the Lagrange basis of the n + 1 points cos(πl/n), shape (N, n + 1)."""
    return np.polynomial.chebyshev.chebvander(t, n) @ chebyshev_coefficients(np.eye(n + 1), n)


class InterpolatedSoftmax:
    """The tilted means of every head on a Chebyshev grid of a box, for μ with unstructured support.

    Args:
        box: the box [[lo₁, hi₁], [lo₂, hi₂]] holding every evaluation point (the same on every rank).
        y: support points of μ, shape (N_y, 2).
        w: weights of μ, shape (N_y,), non-negative, not all zero.
        a: the heads' scalars (A = a I₂), shape (N_a,).
        max_points: the largest grid (n + 1)² worth building (the caller: 4 N_x, an exponential costing about
            12 flops).
        tol: the tail tolerance of the Chebyshev coefficients, relative to max |y|.
        comm: where given, y and w are this rank's part of μ and the grid sums are reduced over ``comm``
            (collective: every rank calls with the same box, heads and arguments). The velocity is then that of
            the whole μ; there is no :meth:`vjp` then (its factors are not kept).
        start: the first degree tried (the degree of the previous call of a solve is a good guess).

    Attributes:
        ok: whether a degree ≤ 64 converged for every head on the grid path; if not, the caller uses the direct
            sums for all of them.
        rest: the heads not on the grid path (exponent range too large), shape (N_r,) of indices: the caller
            takes their part from the direct sums.
        n: the degree.
        grid: which heads are on the grid path, shape (N_a,) (the others: direct sums at the points).
    """

    def __init__(self, box: Array, y: Array, w: Array, a: Array, max_points: int, tol: float = 1e-14,
                 comm: MPI.Comm | None = None, start: int = _DEGREES[0]) -> None:
        self.box, self.y, self.w, self.comm = np.asarray(box, dtype=np.float64), y, w, comm
        self.a = a = np.asarray(a, dtype=np.float64)
        self.ok, self.n = False, 0
        if comm is None:
            ys = y[w > 0]
            self._lo, self._hi, ymax = ys.min(axis=0), ys.max(axis=0), float(np.abs(y).max())
        else:
            support = global_support(comm, y, w)
            if support is None:  # μ = 0
                self.grid, self.rest = np.zeros(len(a), bool), np.arange(len(a))
                return
            self._lo, self._hi, ymax = support
        span = list(self._hi - self._lo)
        reach = [np.abs(self.box[j]).max() for j in range(2)]
        self.grid = np.abs(a) * sum(r * s for r, s in zip(reach, span, strict=True)) <= _RANGE_MAX
        self.rest = np.flatnonzero(~self.grid)
        if comm is not None and len(self.rest):  # no direct sums without all of μ: the caller gathers
            return
        scale = max(ymax, 1e-300)
        for n in (d for d in _DEGREES if d >= min(start, _DEGREES[-1])):
            if (n + 1) ** 2 > max_points:
                return
            self._build(n)
            D = chebyshev_coefficients(np.eye(n + 1), n)  # values at the points → Chebyshev coefficients
            C = np.einsum("pi,kilc,ql->kpqc", D, self.m_grid, D, optimize=True)
            done = max(np.abs(C[:, -3:]).max(initial=0.0), np.abs(C[:, :, -3:]).max(initial=0.0)) <= tol * scale
            if comm is not None:  # one decision for all ranks: ranks that disagreed would desynchronise the reductions
                done = bool(comm.allreduce(done, op=MPI.LAND))
            if done:
                self.ok, self.n = True, n
                return

    def _build(self, n: int) -> None:
        """Factors, normalisations and tilted means of the grid heads at the (n + 1)² Chebyshev points.

        Head by head (the temporaries stay (n + 1) N_y); the shifts are the exact maxima over the support, from its
        bounding box (monotone rounding of t y in y), so they need no pass over y nor, with ``comm``, a reduction.
        The factors E_j are kept for :meth:`vjp` (not with ``comm``: no VJP there).
        """
        a, y, w = self.a[self.grid], self.y, self.w
        off = ~(w > 0)
        self.nodes = [0.5 * (lo + hi) + 0.5 * (hi - lo) * np.cos(np.pi * np.arange(n + 1) / n) for lo, hi in self.box]
        t = [np.outer(a, X) for X in self.nodes]  # a X_{j,i}, (K, n + 1)
        shift = [np.maximum(tj * lo, tj * hi) for tj, lo, hi in zip(t, self._lo, self._hi, strict=True)]
        F = np.stack([w, w * y[:, 0], w * y[:, 1]])  # (3, N_y)
        K, keep = len(a), self.comm is None
        E = [np.empty((K, n + 1, len(y))) for _ in range(2)] if keep else []
        num = np.empty((K, 3, n + 1, n + 1))
        for k in range(K):
            Ek = []
            for j in range(2):
                e = np.multiply.outer(t[j][k], y[:, j], out=E[j][k] if keep else None)  # (n + 1, N_y)
                e -= shift[j][k][:, None]
                np.exp(np.minimum(e, EXP_CAP, out=e), out=e)
                e[:, off] = 0.0  # 0 off the support (zero weights; the VJP is 0 there: attention.support_only)
                Ek.append(e)
            num[k] = ((Ek[0][None] * F[:, None, :]).reshape(3 * (n + 1), -1) @ Ek[1].T).reshape(3, n + 1, n + 1)
        self._E = E
        if self.comm is not None:  # every rank's part of the sums over y
            self.comm.Allreduce(MPI.IN_PLACE, num, op=MPI.SUM)
        self._z = num[:, 0]
        self.m_grid = np.moveaxis(num[:, 1:] / self._z[:, None], 1, -1)  # (K, n + 1, n + 1, 2)

    def basis(self, x: Array) -> tuple[Array, Array]:
        """The interpolation matrices B₁, B₂ at the points x (shape (N_x, 2)), each (N_x, n + 1).

        Raises:
            ValueError: the grid did not converge (:attr:`ok` is False): use the direct sums.
        """
        if not self.ok:
            raise ValueError("InterpolatedSoftmax: no degree <= 64 converged; use the direct sums")
        t = [(2.0 * x[:, j] - (lo + hi)) / (hi - lo) for j, (lo, hi) in enumerate(self.box)]
        return _basis(np.clip(t[0], -1.0, 1.0), self.n), _basis(np.clip(t[1], -1.0, 1.0), self.n)

    def velocity(self, x: Array, c: Array) -> Array:
        """V_h = Σ_k c_k m_h,k at the points x (shape (N_x, 2)), shape (N_x, 2).

        The grid heads are summed on the grid and interpolated once; the others by direct sums.
        """
        out = np.zeros((len(x), 2))
        g = self.grid
        if g.any():
            B1, B2 = self.basis(x)
            Vg = np.tensordot(c[g], self.m_grid, axes=1)  # (n + 1, n + 1, 2)
            out += np.stack([((B1 @ Vg[..., j]) * B2).sum(axis=1) for j in range(2)], axis=1)
        for k in np.flatnonzero(~g):
            out += c[k] * softmax_moments_direct(x, self.y, self.w, float(self.a[k]))[1]
        return out

    def grid_cotangent(self, x: Array, xi: Array) -> Array:
        """The cotangent ξ at the points x carried to the grid, Ξ_j = B₁ᵀ diag(ξ_j) B₂, shape (n + 1, n + 1, 2).

        Linear in ξ: the sum over the points of several ranks is the sum of their Ξ.
        """
        B1, B2 = self.basis(x)
        return np.stack([B1.T @ (xi[:, j, None] * B2) for j in range(2)], axis=-1)

    def vjp(self, Xi: Array, c: Array) -> tuple[Array, Array]:
        """The transpose of the derivative of Σ_x ξ·V_h for the grid heads, with respect to (w, c).

        Args:
            Xi: the cotangent on the grid (:meth:`grid_cotangent`, summed over all points).
            c: the heads' value-weighted masses, shape (N_a,) (zero allowed).

        Returns:
            (g_w, g_c): shapes (N_y,) and (N_a,); zero for the heads not on the grid path (:attr:`grid`), whose
            part the caller takes from the direct sums.
        """
        if self.comm is not None:
            raise ValueError("InterpolatedSoftmax: no VJP of the gather-free grid (comm); linearise on the gathered μ")
        gw = np.zeros(len(self.y))
        gc = np.zeros(len(self.a))
        g = self.grid
        if g.any():
            xm = np.einsum("ilc,kilc->kil", Xi, self.m_grid)  # Ξ·m_k on the grid, (K, n + 1, n + 1)
            gc[g] = xm.reshape(len(xm), -1).sum(axis=1)
            cz = c[g][:, None, None] / self._z
            R = np.stack([Xi[None, ..., 0] * cz, Xi[None, ..., 1] * cz, xm * cz], axis=1)  # (K, 3, n+1, n+1)
            # Σ_{il} R[i, l] E₁[i, y] E₂[l, y], summed over the heads
            T = (np.matmul(R, self._E[1][:, None]) * self._E[0][:, None]).sum(axis=(0, 2))  # (3, N_y)
            gw += T[0] * self.y[:, 0] + T[1] * self.y[:, 1] - T[2]
        return gw, gc

    @property
    def nbytes(self) -> int:
        """Memory held, in bytes."""
        return sum(e.nbytes for e in self._E) + self.m_grid.nbytes + self._z.nbytes if self.ok else 0
