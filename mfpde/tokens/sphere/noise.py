"""Noisy tokens on S² (theory §10): finite volumes with the Scharfetter–Gummel flux, and the free energy.

Solves on the icosahedral mesh (:func:`~mfpde.tokens.sphere.mesh.icosphere`, flat triangles)

    ∂_t μ + ∇_S·(μ u) = τ Δ_S μ,   u = Σ_h c_h β_h⁻¹ ∇_S(K_h∗μ) (USA; SA: ∇_S log(K_h∗μ)),

by DG0 (cell means μ_K) and a two-point flux across each edge e = K|L (Eymard, Gallouët & Herbin, *Finite Volume
Methods*, Handbook of Numerical Analysis VII, 2000, §§9–10):

    F_KL = (τ|e|/d_KL) [B(−P) μ_K − B(P) μ_L],   P = u_e d_KL/τ,   B(x) = x/(eˣ − 1),

u_e the mean over the edge of the one normal velocity per edge point of :mod:`.dg` (from K to L), |e| the edge's
length, d_KL the distance between the cells' points. The points are the circumcentres of the flat cells: two
neighbours' circumcentres lie on the perpendicular bisector of their common edge, so, the pair unfolded about the
edge, the segment joining them is orthogonal to it (the admissibility of the two-point flux, EGH Definition 9.1)
and d_KL = (|e|/2)(cot α_K + cot α_L), α the angle opposite e in each cell. It is > 0 when every angle is acute
(every circumcentre inside its cell): on the icosahedral refinement the angles lie in [54°, 72°] at every level
(checked on construction: :class:`NoisySphereFV` raises otherwise).

The flux is the Scharfetter–Gummel (exponentially fitted) flux of the circle (:mod:`mfpde.tokens.circle.noise`):
upwind as τ → 0, centred diffusion as u_e → 0. Mass: each edge's flux leaves one cell and enters the other, so
∫μ_h is conserved to round-off. Positivity: forward Euler's coefficient of μ_K is 1 − (Δt/|K|) Σ_e (τ|e|/d)
B(−P_e) (P_e oriented out of K), the others are ≥ 0; Δt ≤ cfl |K| / Σ_e (τ|e|/d) B(−P_e) keeps μ ≥ 0
(:meth:`NoisySphereFV.max_stable_dt`), and SSP-RK3 is a convex combination of such steps. The order: the
two-point flux on the circumcentres is consistent (first order in h for the fluxes, EGH Thm 10.3); the flat
facets' geometric error is O(h²); the measured orders are in ``docs/sphere.md``.

The free energy (USA; the Wasserstein gradient flow's Lyapunov functional, theory §10; the sphere's kernel
v = c β⁻¹ ∇_S K∗μ is −∇ of the first variation of the second term)

    E(μ) = τ ∫ μ log μ − Σ_h (c_h/2β_h) ∬ e^{β_h x·y} dμ(x) dμ(y),

the double integral by Funk–Hecke, Σ_ℓ 4π i_ℓ(β) Σ_m μ̂_ℓm² (:func:`free_energy`).
"""

from __future__ import annotations

import math
from typing import Any

from mpi4py import MPI

import dolfinx.mesh
import numpy as np
import numpy.typing as npt
import scipy.special

from mfpde.tokens.circle.noise import bernoulli
from mfpde.tokens.sphere.dg import SphereDG, SphereVel
from mfpde.tokens.sphere.velocity import SphereVelocity

__all__ = ["NoisySphereFV", "free_energy", "transmissibility"]

Array = npt.NDArray[np.float64]


def transmissibility(mesh: dolfinx.mesh.Mesh, cells: npt.NDArray[np.int64]) -> tuple[Array, Array]:
    """(|e|, d_KL) of the edges whose two local cells are ``cells`` (F, 2), on a flat triangle mesh; shapes (F,).

    d_KL = (|e|/2)(cot α_K + cot α_L): the distance between the two circumcentres, the cells unfolded about e.

    Raises:
        ValueError: a curved geometry, or an edge with d_KL ≤ 0 (the circumcentres not in order: not admissible).
    """
    if mesh.geometry.cmaps[0].degree != 1:
        raise ValueError("the two-point flux needs flat triangles (geometry order 1)")
    gdm = mesh.geometry.dofmaps[0]
    x = mesh.geometry.x
    g0, g1 = gdm[cells[:, 0]], gdm[cells[:, 1]]  # (F, 3) geometry nodes of each side
    cot = np.zeros(len(cells))
    ends = np.zeros((len(cells), 2, 3))
    for g, other in ((g0, g1), (g1, g0)):
        shared = (g[:, :, None] == other[:, None, :]).any(axis=2)  # (F, 3)
        if np.any(shared.sum(axis=1) != 2):
            raise ValueError("two cells of an edge do not share exactly two vertices")
        opp = x[g[np.arange(len(g)), np.argmin(shared, axis=1)]]
        ab = x[g[shared].reshape(-1, 2)]  # (F, 2, 3): the edge's ends
        a, b = ab[:, 0] - opp, ab[:, 1] - opp
        cot += np.einsum("fd,fd->f", a, b) / np.linalg.norm(np.cross(a, b), axis=1)
        ends = ab
    length = np.linalg.norm(ends[:, 1] - ends[:, 0], axis=1)
    dist = 0.5 * length * cot
    if len(dist) and not float(dist.min()) > 0:
        raise ValueError(f"the mesh is not admissible for the two-point flux: d_KL = {float(dist.min()):.3g} <= 0 "
                         "(an obtuse pair of angles opposite an edge)")
    return length, dist


class NoisySphereFV(SphereDG):
    """DG0 on S² with noise τ > 0: finite volumes with the Scharfetter–Gummel flux (module docstring).

    Args:
        mesh: the flat icosahedral mesh (:func:`~mfpde.tokens.sphere.mesh.icosphere`, order 1).
        velocity: the drift (attention; ``RotationVelocity([0, 0, 0])`` for pure diffusion).
        noise: τ > 0.
        cfl: the positivity factor in (0, 1].
        max_dt: an extra cap on the sub-step (None: none).

    Attributes:
        length, dist: |e| and d_KL of the rank's edges, shape (F,) (the edges of :attr:`t`).

    Raises:
        ValueError: τ ≤ 0, cfl outside (0, 1], a curved or inadmissible mesh.
    """

    def __init__(self, mesh: dolfinx.mesh.Mesh, velocity: SphereVelocity, noise: float, cfl: float = 0.4,
                 max_dt: float | None = None) -> None:
        if not (noise > 0 and math.isfinite(noise)):
            raise ValueError(f"noise must be > 0 and finite, got {noise}")
        super().__init__(mesh, 0, velocity, cfl, max_dt)
        self.noise = float(noise)
        self.length, self.dist = transmissibility(mesh, self.t.cells)
        self._g = self.noise * self.length / self.dist  # τ|e|/d_KL
        own = self._g[self.t.cell_edges].sum(axis=1) / self.t.area
        self._diffusion = float(self.comm.allreduce(float(own.max()) if len(own) else 0.0, op=MPI.MAX))

    def _coefficients(self, vel: SphereVel) -> tuple[Array, Array]:
        """(B(−P), B(P)) per edge, P = u_e d_KL/τ with u_e the mean normal velocity from side 0 to side 1."""
        ue = np.einsum("fq,fq->f", vel.un[:, 0, :], self.t.we) / self.length
        P = ue * self.dist / self.noise
        return bernoulli(-P), bernoulli(P)

    def rate(self, state: Array, vel: SphereVel) -> tuple[Array, float]:
        """(dμ_K/dt = −Σ_e ±F_e/|K| on the owned cells (ghost entries 0), 0.0: no outflow)."""
        t = self.t
        U = self._cells(state)[:, 0]
        bm, bp = self._coefficients(vel)
        F = self._g * (bm * U[t.cells[:, 0]] - bp * U[t.cells[:, 1]])  # from side 0 into side 1
        sign = 1.0 - 2.0 * t.cell_sides  # +1 where the cell is side 0
        du = np.zeros_like(state)
        du[t.dofs[:t.n_owned, 0]] = -(sign * F[t.cell_edges]).sum(axis=1) / t.area
        return du, 0.0

    def max_stable_dt(self, vel: SphereVel) -> Array:
        """cfl·min_K |K| / Σ_e (τ|e|/d) B(∓P_e) (the positive forward-Euler step; all ranks), capped; shape (1,)."""
        t = self.t
        if not np.all(np.isfinite(vel.un)):
            lim = math.nan
        else:
            bm, bp = self._coefficients(vel)
            out = np.where(t.cell_sides == 0, bm[t.cell_edges], bp[t.cell_edges]) * self._g[t.cell_edges]
            ratio = float((out.sum(axis=1) / t.area).max()) if len(out) else 0.0
            lim = self.cfl / ratio if ratio > 0 else math.inf
        nan = self.comm.allreduce(math.isnan(lim), op=MPI.LOR)
        lim = self.comm.allreduce(math.inf if math.isnan(lim) else lim, op=MPI.MIN)
        return np.array([math.nan if nan else min(lim, self.max_dt)])

    def diffusion_substeps(self, dt: float) -> float:
        """The sub-steps a depth step dt needs for the noise alone (u = 0: B = 1): dt max_K Σ_e (τ|e|/d)/|K| / cfl."""
        return dt * self._diffusion / self.cfl


def free_energy(op: SphereDG, mu: Any, heads: tuple[Array, Array], noise: float, tol: float = 1e-14) -> float:
    """E(μ_h) of theory §10 (module docstring), USA, non-dimensional; μ log μ = 0 where μ = 0 (collective).

    Args:
        op: the DG0 (or DG_p: the entropy at the volume points) operator of μ_h.
        mu: the state (a Function of ``op.V`` or its array).
        heads: (β_h, c_h), shapes (H,); heads with c_h = 0 add nothing.
        noise: τ ≥ 0.
        tol: the Bessel tail of the Funk–Hecke series, relative to e^β (sets its degree).
    """
    from mfpde.tokens.sphere.diag import measure_power
    from mfpde.tokens.sphere.series import harmonic_degree

    x, w = op.quadrature(mu)
    e = 0.0
    if noise > 0:
        u = op._arr(mu)[op.t.dofs[:op.t.n_owned]] @ op.t.phi.T  # μ_h at the volume points
        ent = float(np.sum(op.t.wq * u * np.log(np.where(u > 0, u, 1.0))))
        e = noise * float(op.comm.allreduce(ent, op=MPI.SUM))
    betas, cs = (np.asarray(a, float) for a in heads)
    for beta, c in zip(betas, cs, strict=True):
        if c != 0.0:
            L = harmonic_degree(float(beta), tol)
            power = measure_power(x, w, L, op.comm)
            inter = float(np.sum(4.0 * np.pi * scipy.special.spherical_in(np.arange(L + 1), beta) * power))
            e -= float(c) / (2.0 * float(beta)) * inter
    return e
