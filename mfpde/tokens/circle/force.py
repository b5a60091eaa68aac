"""The attention velocity of equal-weight labels on the circle by the Fourier series of the kernel (theory §9).

e^{β cos ψ} = I₀(β) + 2 Σ_k I_k(β) cos kψ, so e^{β cos ψ} sin ψ = (2/β) Σ_k k I_k(β) sin kψ, and with the moments
S_k = (1/M) Σ_j e^{ikX_j} of M labels X_j the velocity at θ is a sum of K terms (:class:`FourierForce`, O(MK)
instead of the O(M²) pairwise sum of :func:`mfpde.tokens.circle.particles.dense_velocity`, the tests' reference).
The series is cut at the first K with I_K(β)/I₀(β) < 1e-17 (:func:`series_length`): the tail is below round-off.
:mod:`mfpde.tokens.circle.flow` integrates the flow map with this force.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import scipy.special

__all__ = ["SERIES_CUT", "FourierForce", "series_length"]

Array = npt.NDArray[np.float64]
CArray = npt.NDArray[np.complex128]
#: The series is cut where I_k(β)/I₀(β) falls below this (double round-off, with a margin).
SERIES_CUT = 1e-17


def series_length(beta: float) -> int:
    """The first K with I_K(β)/I₀(β) < 1e-17: the terms kept in the Fourier series of the kernel."""
    b = abs(float(beta))
    cut = SERIES_CUT * scipy.special.ive(0, b)
    start = 1
    while True:  # blocks of 64 orders: one or two blocks up to β ≈ 100
        k = np.arange(start, start + 64)
        small = np.flatnonzero(scipy.special.ive(k, b) < cut)
        if len(small):
            return int(k[small[0]])
        start += 64


class FourierForce:
    """The attention velocity of M equal-weight labels by the Fourier series of the kernel (see the module).

    With E_kj = e^{ikX_j} (k = 1..K, by doubling: log₂K products of row blocks, round-off ≈ log₂K ε) and the moments
    S_k = (1/M) Σ_j E_kj, every quantity is a row of one product R = (C ⊙ conj S) E (rows C of real coefficients):
    N = −Im R_a, Z = I₀ + Re R_{2I}, and their θ-derivatives N' = −Re R_{ka}, Z' = βN (three rows per head). The
    arrays are allocated once: a call is a dozen numpy operations on (K, M) arrays.

    Args:
        heads_a: inverse temperatures β_h ≥ 0 (H,).
        heads_c: head weights c_h (H,).
        attention: "softmax" (SA: u = Σ_h c_h N_h/Z_h) or "unnormalised" (USA: u = Σ_h c_h e^{β_h} N_h, one row).
        M: the number of labels.

    Raises:
        ValueError: an unknown attention or a negative β.
    """

    def __init__(self, heads_a: Array, heads_c: Array, attention: str, M: int):
        if attention not in ("softmax", "unnormalised"):
            raise ValueError(f"attention must be 'softmax' or 'unnormalised', got {attention!r}")
        a, c = np.asarray(heads_a, float), np.asarray(heads_c, float)
        if np.any(a < 0):
            raise ValueError(f"inverse temperatures must be >= 0, got {a.tolist()}")
        self.softmax, self.M = attention == "softmax", M
        self.K = max(series_length(b) for b in a)
        k = np.arange(1, self.K + 1).astype(float)
        self.k = k
        self.beta = a
        an_rows: list[Array] = []  # per head: a_k = (2/β) k I_k(β) e^{−β} (N) and 2 I_k(β) e^{−β} (Z)
        z_rows: list[Array] = []
        self.i0: list[tuple[float, float]] = []
        for b, ch in zip(a, c, strict=True):
            if b < 1e-12:  # β → 0: e^{β cos ψ} sin ψ → sin ψ (the k = 1 term alone), Z → I₀(0) = 1
                ik, i0, an = np.zeros(self.K), 1.0, np.where(k == 1, 1.0, 0.0)
            else:
                ik, i0 = scipy.special.ive(k, b), float(scipy.special.ive(0, b))  # I_k(β) e^{−β}
                an = (2.0 / b) * k * ik
            an_rows.append(an)
            z_rows.append(2.0 * ik)
            self.i0.append((i0, float(ch)))
        self._an, self._z = an_rows, z_rows
        H = len(a)
        if self.softmax:  # rows [a_0, 2I_0, a_1, 2I_1, …, k a_0, k a_1, …]: the first 2H give u, all 3H give u'
            rows = [r for h in range(H) for r in (an_rows[h], z_rows[h])] + [k * an_rows[h] for h in range(H)]
            self._nrow = 2 * H
        else:  # USA is linear in the kernel: one row Σ_h c_h e^{β_h} (2/β_h) k I_k(β_h) e^{−β_h}, and k times it
            usa = sum(ch * an * math.exp(min(b, 700.0)) for an, b, ch in zip(an_rows, a, c, strict=True))
            rows = [usa, k * usa]
            self._nrow = 1
        self.A = np.array([an_rows[0] if self.softmax else rows[0]] + ([z_rows[0]] if self.softmax else []),
                          dtype=float).T  # (K, columns): the coefficients, for the tests' scale
        self._C = np.array(rows, dtype=float).astype(complex)
        self._CS = np.empty_like(self._C)
        # USA's right-hand side of (X, L) in one product: rows −a and −i·k a give u = Im R₀, u' = Im R₁
        self._C_usa = np.array([-self._C[0], -1j * self._C[1]]) if not self.softmax else self._C[:0]
        self._CS_usa = np.empty_like(self._C_usa)
        # SA with one head, (X, L) in one product: rows −a, 2I and −c·k a give N = Im R₀, Z − I₀ = Re R₁, cN' = Re R₂
        self._C_sa1 = (np.array([-self._C[0], self._C[1], -c[0] * self._C[2]]) if self.softmax and H == 1
                       else self._C[:0])
        self._CS_sa1 = np.empty_like(self._C_sa1)
        self.nfev = 0
        self._E = np.empty((self.K, M), complex)
        self._Er, self._Ei = self._E[0].real, self._E[0].imag
        self._w = np.full(M, 1.0 / M, complex)
        self._blocks = []
        n = 1
        while n < self.K:
            m = min(n, self.K - n)
            self._blocks.append((self._E[:m], self._E[n - 1], self._E[n : n + m]))
            n += m
        #: d(X, L)/dt = (u(X), u'(X)) for the state Y = (X, L) (2M,), called as rhs(t, Y): the flow map and its
        #: log-derivative; USA and SA with one head in one product each (a closure: the integrators' inner loop).
        self.rhs: Callable[[float, Array], Array] = self._make_rhs()

    def _powers(self, X: Array) -> Array:
        """E_kj = e^{ikX_j} (K, M) in the preallocated array."""
        E = self._E
        np.cos(X, out=E[0].real)
        np.sin(X, out=E[0].imag)
        for p, q, o in self._blocks:
            np.multiply(p, q, out=o)
        return E

    def _rows(self, X: Array, derivative: bool) -> Array:
        E = self._powers(X)
        S = np.conj(E @ self._w)
        nr = len(self._C) if derivative else self._nrow
        CS = self._CS[:nr]
        np.multiply(self._C[:nr], S, out=CS)
        return np.asarray(CS @ E)

    def field(self, X: Array, derivative: bool = False) -> tuple[Array, Array | None]:
        """(u(X_j), u'(X_j) or None) of the labels X (M,) at their own positions.

        SA: u = Σ_h c_h N_h/Z_h and u' = Σ_h c_h (N_h' − u_h Z_h')/Z_h with Z_h' = β_h N_h (the θ-derivative of
        ∫ e^{β cos(X − θ)} is β ∫ sin(X − θ) e^{β cos(X − θ)}): three rows per head.
        """
        self.nfev += 1
        R = self._rows(X, derivative)
        if not self.softmax:
            return -R[0].imag, (-R[1].real if derivative else None)
        H = len(self.i0)
        if H == 1:
            i0, ch = self.i0[0]
            N, Z = -R[0].imag, i0 + R[1].real
            u = N / Z
            if not derivative:
                return ch * u, None
            return ch * u, ch * (-R[2].real - self.beta[0] * N * u) / Z
        u = np.zeros(len(X))
        du = np.zeros(len(X)) if derivative else None
        for h, (i0, ch) in enumerate(self.i0):
            N, Z = -R[2 * h].imag, i0 + R[2 * h + 1].real
            uh = N / Z
            u += ch * uh
            if du is not None:
                du += ch * (-R[2 * H + h].real - self.beta[h] * N * uh) / Z
        return u, du

    def _make_rhs(self) -> Callable[[float, Array], Array]:
        """The right-hand side d(X, L)/dt = (u(X), u'(X)) of the state Y = (X, L) (2M,) (see ``rhs``)."""
        M, E, Er, Ei, blocks, w = self.M, self._E, self._Er, self._Ei, self._blocks, self._w
        mult, cos, sin, conj = np.multiply, np.cos, np.sin, np.conjugate

        def moments(x: Array) -> CArray:  # conj S_k, the powers E in place
            self.nfev += 1
            cos(x, out=Er)
            sin(x, out=Ei)
            for p, q, o in blocks:
                mult(p, q, out=o)
            return np.asarray(conj(E @ w))

        if not self.softmax:
            C, CS = self._C_usa, self._CS_usa

            def usa(_t: float, Y: Array) -> Array:
                mult(C, moments(Y[:M]), out=CS)
                return np.asarray((CS @ E).imag.ravel())  # rows contiguous: a view, no copy

            return usa
        if len(self.i0) > 1:
            def heads(_t: float, Y: Array) -> Array:
                out = np.empty(2 * M)
                u, du = self.field(Y[:M], True)
                out[:M], out[M:] = u, du if du is not None else 0.0
                return out

            return heads
        C, CS, (i0, c), cb = self._C_sa1, self._CS_sa1, self.i0[0], -self.i0[0][1] * float(self.beta[0])

        def sa(_t: float, Y: Array) -> Array:  # u = c N/Z, u' = (cN' − cβ N u_h)/Z with u_h = N/Z
            mult(C, moments(Y[:M]), out=CS)
            R = CS @ E
            out = np.empty(2 * M)
            uh, du = out[:M], out[M:]
            N, Z = R[0].imag, R[1].real + i0
            np.divide(N, Z, out=uh)
            mult(uh, N, out=du)
            du *= cb
            du += R[2].real
            du /= Z
            if c != 1.0:
                uh *= c
            return out

        return sa

    def velocity(self, X: Array) -> Array:
        """The velocity u at the labels (M,)."""
        return self.field(X)[0]

    def jacobian(self, X: Array) -> Array:
        """∂u_i/∂X_l (M, M), exact: through the moments (1/M)·(a rank-K product) and, on the diagonal, through θ = X_i.

        USA: ∂N(X_i)/∂X_l = (1/M) Σ_k a_k k Re(e^{ik(X_l − X_i)}), plus N'(X_i) on the diagonal; SA: (∂N Z − N ∂Z)/Z²
        with ∂Z(X_i)/∂X_l = −(1/M) Σ_k 2I_k k Im(e^{ik(X_l − X_i)}), plus Z'(X_i).
        """
        M = len(X)
        R = self._rows(X, True)
        P = self._E.T.copy()  # e^{ikX}, (M, K)
        Pc = P.conj()
        if not self.softmax:
            J = ((Pc * (self._C[0].real * self.k)) @ P.T).real / M
            J[np.diag_indices(M)] -= R[1].real
            return np.asarray(J)
        J = np.zeros((M, M))
        H = len(self.i0)
        for h, (i0, ch) in enumerate(self.i0):
            N, Z = -R[2 * h].imag, i0 + R[2 * h + 1].real
            dN, dZ = -R[2 * H + h].real, self.beta[h] * N
            JN = ((Pc * (self._an[h] * self.k)) @ P.T).real / M
            JZ = -((Pc * (self._z[h] * self.k)) @ P.T).imag / M
            JN[np.diag_indices(M)] += dN
            JZ[np.diag_indices(M)] += dZ
            J += ch * (JN * Z[:, None] - N[:, None] * JZ) / (Z * Z)[:, None]
        return J
