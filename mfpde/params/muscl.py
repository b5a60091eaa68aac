"""Second-order transport in Θ: the edge-based MUSCL flux with a van Leer limiter and SSP-RK2 (theory §4 (WGF)).

Solves the λ = 0 part of the parameter equation, ∂_s ρ = ∇·(ρ∇Φ) with Φ frozen and zero flux on ∂Θ, on the
P1 mesh of :class:`mfpde.params.fokker_planck.ParameterFokkerPlanck`. With w_ij = −K_ij ≥ 0 (the P1 stiffness
on a non-obtuse mesh), the lumped mass m_i and c_ij = w_ij max(Φ_i − Φ_j, 0) (the upwind rate i → j),

    m_i dρ_i/ds = −Σ_j [ c_ij ρ_{i→j} − c_ji ρ_{j→i} ],

the first-order upwind scheme has ρ_{i→j} = ρ_i. Here the face value is the limited MUSCL reconstruction
of the upwind node (the edge-based form of node-centred finite volumes: T. J. Barth and D. C. Jespersen,
AIAA paper 89-0366 (1989); B. van Leer, J. Comput. Phys. 32 (1979) 101–136):

    ρ_{i→j} = ρ_i + ½ σ(a, b),   a = ρ_j − ρ_i,   b = 2 g_i·(x_j − x_i) − a,
    σ(a, b) = (a|b| + |a|b)/(|a| + |b|)   (van Leer; 0 when ab ≤ 0),  then σ ≤ 2ρ_i,

with g_i = m_i⁻¹ ∫ φ_i ∇ρ_h the lumped L² projection of the P1 gradient. On a uniform 1-D mesh g_i is the
central difference and b = ρ_i − ρ_{i−1} (the upwind-upwind difference), so this is van Leer's scheme
exactly; where ρ is smooth and not extremal σ = a + O(h²), the face value is ρ at the edge midpoint to
O(h²), and the flux is second order (the limiter clips to first order only at extrema, in O(h)-wide sets,
so the L¹ error and the moments stay O(h²)). Time: SSP-RK2 (Heun; Shu & Osher, J. Comput. Phys. 77 (1988)
439–471), ρ ← ½(ρ + E(E(ρ))) with E a forward-Euler step.

Positivity and mass (exact arithmetic): σ has the sign of a and |σ| ≤ 2|a|, so every face value lies
between ρ_i and ρ_j, hence ≥ 0; the clip σ ≤ 2ρ_i gives ρ_{i→j} ≤ 2ρ_i. So E(ρ)_i ≥ ρ_i (1 − 2h L_ii/m_i)
≥ 0 for h ≤ Δs_CFL/2, Δs_CFL = min_i m_i / L_ii, L_ii = Σ_j c_ij; Heun is a convex combination of such
steps. Every edge flux c_ij ρ_{i→j} is computed from the same numbers on both of its ranks, so the lumped
mass Σ m_i ρ_i is conserved to round-off.
"""

from __future__ import annotations

import math
from typing import Protocol

from mpi4py import MPI

import dolfinx
import dolfinx.fem.petsc
import numpy as np
import ufl
from dolfinx import fem
from numpy.typing import NDArray

from mfpde.budget import spend

__all__ = ["ORDER", "MusclTransport", "van_leer"]

Array = NDArray[np.float64]


class _Graph(Protocol):
    """What MUSCL uses of :class:`mfpde.params.fokker_planck.ParameterFokkerPlanck` (no import: no cycle)."""

    V: fem.FunctionSpace
    comm: MPI.Comm
    n_owned: int
    m: Array
    rows: NDArray[np.int64]
    lcols: NDArray[np.int64]
    _indptr: NDArray[np.int32]
    _gcols: NDArray[np.int32]

    def gather(self, f: fem.Function) -> Array: ...

    def gather_array(self, a: Array) -> Array: ...


#: The order in h (and Δs) of the scheme where ρ is smooth: what ``theta_transport_order`` expects.
ORDER = 2


def van_leer(a: Array, b: Array) -> Array:
    """The van Leer limited slope (a|b| + |a|b)/(|a| + |b|): 2ab/(a + b) if ab > 0, else 0 (same shape as a).

    Properties used for positivity: sign(σ) = sign(a) or σ = 0, |σ| ≤ 2 min(|a|, |b|); σ(a, a) = a.
    """
    num = a * np.abs(b) + np.abs(a) * b
    den = np.abs(a) + np.abs(b)
    return np.divide(num, den, out=np.zeros_like(a), where=den > 0.0)


class MusclTransport:
    """Limited MUSCL + SSP-RK2 steps of ∂_s ρ = ∇·(ρ∇Φ) on the P1 graph of a Fokker–Planck solver (λ = 0).

    Args:
        fp: the solver whose CSR pattern (owned rows, column IndexMap), lumped mass and edge weights are used.

    Raises:
        RuntimeError: the gradient matrices do not have the stiffness matrix's sparsity pattern.
    """

    def __init__(self, fp: _Graph) -> None:
        self.fp = fp
        V = fp.V
        p = V.mesh.geometry.dim
        self.p = p
        n = fp.n_owned
        u, v = ufl.TrialFunction(V), ufl.TestFunction(V)
        self._gvals = []
        for d in range(p):
            G = dolfinx.fem.petsc.assemble_matrix(fem.form(u.dx(d) * v * ufl.dx))  # G_ij = ∫ φ_i ∂_d φ_j
            G.assemble()
            indptr, cols, vals = G.getValuesCSR()
            G.destroy()
            if not (np.array_equal(indptr, fp._indptr) and np.array_equal(cols, fp._gcols)):
                raise RuntimeError("gradient matrix pattern differs from the stiffness pattern")
            self._gvals.append(np.asarray(vals, dtype=np.float64))
        x = V.tabulate_dof_coordinates()[:n, :p]
        xc = np.stack([fp.gather_array(x[:, d]) for d in range(p)], axis=1)  # (n_col, p)
        self._d = xc[fp.lcols] - xc[fp.rows]  # x_j − x_i per CSR entry, shape (nnz, p)
        self._off = fp.lcols != fp.rows

    def gradient(self, rc: Array) -> Array:
        """g_i = m_i⁻¹ Σ_j G_ij ρ_j on the column map, shape (n_col, p), from column values rc (collective)."""
        fp, n = self.fp, self.fp.n_owned
        own = [np.bincount(fp.rows, weights=gv * rc[fp.lcols], minlength=n) / fp.m for gv in self._gvals]
        return np.stack([fp.gather_array(g) for g in own], axis=1)

    def faces(self, rc: Array) -> tuple[Array, Array]:
        """Limited face values (ρ_{i→j}, ρ_{j→i}) per CSR entry of the owned rows, from column values rc."""
        fp = self.fp
        g = self.gradient(rc)
        ri, rj = rc[fp.rows], rc[fp.lcols]
        a = rj - ri
        s_out = van_leer(a, 2.0 * np.einsum("ek,ek->e", g[fp.rows], self._d) - a)
        s_in = van_leer(-a, 2.0 * np.einsum("ek,ek->e", g[fp.lcols], -self._d) + a)
        lo, hi = np.minimum(ri, rj), np.maximum(ri, rj)
        # Between ρ_i and ρ_j in exact arithmetic (|σ| ≤ 2|a|, sign a); the clip removes the round-off of
        # ρ + σ/2 with σ ≈ −2ρ (which left −2e-84 where ρ underflows towards 0).
        f_out = np.clip(ri + 0.5 * np.minimum(s_out, 2.0 * ri), lo, hi)
        f_in = np.clip(rj + 0.5 * np.minimum(s_in, 2.0 * rj), lo, hi)
        return np.where(self._off, f_out, ri), np.where(self._off, f_in, rj)

    def euler(self, rc: Array, out: Array, inn: Array, h: float) -> Array:
        """One forward-Euler step E(ρ) of size h ≤ Δs_CFL/2 (owned values, shape (n_owned,))."""
        fp, n = self.fp, self.fp.n_owned
        f_out, f_in = self.faces(rc)
        outflow = np.bincount(fp.rows, weights=out * f_out, minlength=n)
        inflow = np.bincount(fp.rows, weights=inn * f_in, minlength=n)
        # ≥ 0 in exact arithmetic (module docstring); the clip removes round-off only.
        return np.maximum(rc[:n] - (h / fp.m) * outflow, 0.0) + (h / fp.m) * inflow

    def advance(self, rho: fem.Function, out: Array, inn: Array, ds: float, rk2: bool = True) -> int:
        """ρ ← ρ(s + ds) by n = ⌈ds/(Δs_CFL/2)⌉ SSP-RK2 sub-steps with the rates (out, inn) frozen. Collective.

        With ``rk2=False`` the sub-steps are single forward-Euler steps E (the stages of an outer SSP-RK2).

        Args:
            rho: density in the P1 space, updated in place (owned and ghosts).
            out: c_ij = w_ij max(Φ_i − Φ_j, 0) per CSR entry, shape (nnz,).
            inn: c_ji per CSR entry, shape (nnz,).
            ds: the step, > 0.
            rk2: SSP-RK2 sub-steps (True) or forward-Euler ones.

        Returns:
            The number of sub-steps n.
        """
        fp, n = self.fp, self.fp.n_owned
        lii = np.bincount(fp.rows, weights=out, minlength=n)
        pos = lii > 0.0
        cfl = float(np.min(fp.m[pos] / lii[pos])) if np.any(pos) else math.inf
        cfl = float(fp.comm.allreduce(cfl, op=MPI.MIN))
        nsub = 1 if math.isinf(cfl) else max(1, math.ceil(ds / (0.5 * cfl)))
        h = ds / nsub
        spend(nsub, "Θ transport sub-steps")  # the same nsub on every rank (collective CFL bound)
        for _ in range(nsub):
            r0 = fp.gather(rho)
            r1 = self.euler(r0, out, inn, h)
            rho.x.array[:n] = 0.5 * (r0[:n] + self.euler(fp.gather_array(r1), out, inn, h)) if rk2 else r1
            rho.x.scatter_forward()
        return nsub
