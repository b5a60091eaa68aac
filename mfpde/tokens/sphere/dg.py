"""Upwind DG of degree 0..3 for tokens on S² (theory §9): the :class:`mfpde.tokens.rk.SubstepOperator` of the sphere.

Solves ∂_t μ + ∇_S·(μ v[μ]) = 0 on a surface mesh of S² (:func:`~mfpde.tokens.sphere.mesh.icosphere`), v any
:class:`~mfpde.tokens.sphere.velocity.SphereVelocity` (attention, or a prescribed rotation), in the weak form

    Σ_K [ ∫_K ∂_t μ φ − ∫_K μ v·∇φ + ∫_∂K u_n μ^up φ ] = 0,

with ONE normal velocity per edge point u_n = ½(v·n⁺ − v·n⁻) (n± the two cells' in-plane conormals, not opposite
on a faceted surface: theory §9), taken as +u_n by the first cell and −u_n by the second, and μ^up the value of
the upwind cell (Cockburn–Shu): the edge fluxes cancel in the sum over cells, so ∫μ_h is conserved to round-off.

* **Stages** (every one): the quadrature points of the rank's OWN cells mapped onto S² (x/|x|) and their masses
  μ_h ω|J| go to ``velocity.update`` (collective), then v is evaluated at the nodes of a continuous P2 (DG3: P3)
  field and interpolated to the volume and edge points (:mod:`.nodal`; ``nodal=False``: v at those points).
  The cell and edge tables are precomputed (:mod:`.geometry`): a stage is array contractions, no form compiled.
* **Depth stepping** by :func:`mfpde.tokens.rk.depth_step` (SSP-RK3) with sub-steps from the actual velocity:
  p = 0, Δt Σ_e ∫_e u_n⁺ ds/|K| ≤ cfl (the upwind scheme is then a convex combination); p ≥ 1, the
  Zhang–Xia–Shu bound (J. Sci. Comput. 50, 2012) Δt Σ_e |e| max_e|u_n|/|K| ≤ cfl·(2/3)ŵ₁ (ŵ₁ the first
  Gauss–Lobatto weight of N ≥ (p+3)/2 points on [0, 1]); ``max_dt`` an extra cap (e.g. 0.1/γ_max near the
  uniform state, where v is small but the instability grows).
* **Positivity** (Zhang & Shu, J. Comput. Phys. 229, 2010) after each stage: a cell whose minimum over its
  limiter points is negative is scaled toward its mean (kept) until that minimum is 0. The points: p = 1 the
  vertices (the exact minimum of a linear function on a flat cell); p ≥ 2 the lattice of step 1/(3p), the volume
  points and the edge points (a dense bound, not the exact minimum).
* **MPI**: the mesh is distributed with facet-sharing ghost cells; the state is the local DG array, its ghosts
  refreshed (``scatter_forward``) before each use; edges are oriented by the input cell and node indices, so
  every rank computes the same numbers for an edge. Reductions: mass, minimum, the step size.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mpi4py import MPI

import dolfinx.fem
import numpy as np
import numpy.typing as npt

from mfpde.tokens import rk
from mfpde.tokens.limiter import zhang_shu
from mfpde.tokens.sphere.geometry import surface_tables
from mfpde.tokens.sphere.nodal import NodalVelocity
from mfpde.tokens.sphere.velocity import SphereVelocity

__all__ = ["SphereDG", "SphereReport", "SphereVel", "growth_step_cap"]

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class SphereVel:
    """A stage's velocity: at the volume points (C, Q, 3); each edge side's outward u_n (F, 2, E) (side 1: −side 0)."""

    vq: Array
    un: Array


@dataclass
class SphereReport:
    """What :meth:`SphereDG.solve` returns: every number over all ranks.

    Masses, min over the limiter points at the depth steps, sub-steps, ``limited_cells`` summed over the ranks'
    owned cells; ``solve_cpu_s`` is the largest rank's.
    """

    mass_0: float
    mass_T: float
    min_density: float
    substeps: int
    limited_cells: int
    solve_cpu_s: float
    mu_T: dolfinx.fem.Function = field(repr=False)
    substeps_per_step: list[int] = field(default_factory=list, repr=False)

    @property
    def mass_error(self) -> float:
        """|∫μ_T − ∫μ_0| / ∫μ_0."""
        return abs(self.mass_T - self.mass_0) / self.mass_0


def growth_step_cap(beta: float, attention: str, c: float = 1.0, fraction: float = 0.1) -> float:
    """``fraction``/(|c| max_ℓ γ_ℓ(β)): a sub-step cap (``max_dt``) for attention near the uniform state.

    There v is small, so the CFL bound allows long steps, but degree ℓ grows at γ_ℓ (theory §9,
    :func:`~mfpde.tokens.sphere.theory.growth_rate`); with γΔt ≤ 0.1 SSP-RK3's relative error of a growth rate
    is (γΔt)³/24 ≤ 4·10⁻⁵ per unit depth. Non-dimensional (depth units).
    """
    from mfpde.tokens.sphere.theory import growth_rate

    g = abs(c) * float(np.max(growth_rate(np.arange(1, 201), beta, attention)))
    return fraction / g if g > 0 else math.inf


def _lobatto_first_weight(p: int) -> float:
    """ŵ₁ of N = max(2, ⌈(p+3)/2⌉) Gauss–Lobatto points on [0, 1] (1/(N(N−1)))."""
    n = max(2, math.ceil((p + 3) / 2))
    return 1.0 / (n * (n - 1))


class SphereDG(rk.SingleRow):
    """Upwind DG_p (p = 0..3) on a surface mesh of S²: the operator :func:`rk.depth_step` steps.

    Args:
        mesh: a closed triangle surface mesh of S² with facet-sharing ghosts (:func:`.mesh.icosphere`).
        degree: p in 0..3.
        velocity: the velocity (``update`` is called with every stage's quadrature measure).
        cfl: the positivity CFL factor in (0, 1].
        max_dt: an extra cap on the sub-step (None: none).
        nodal: evaluate v at the nodes of a continuous Lagrange field and interpolate (:mod:`.nodal`, ≈ 5×
            fewer kernel evaluations for DG1), or (False) at every volume and edge point.

    Attributes:
        V: the DG_p space; a state is the local array of a Function of V (owned and ghost dofs).

    Raises:
        ValueError: a degree outside 0..3 or cfl outside (0, 1].
    """

    def __init__(self, mesh: dolfinx.mesh.Mesh, degree: int, velocity: SphereVelocity, cfl: float = 0.4,
                 max_dt: float | None = None, nodal: bool = True) -> None:
        if degree not in (0, 1, 2, 3):
            raise ValueError(f"degree must be 0..3, got {degree}")
        if not 0.0 < cfl <= 1.0:
            raise ValueError(f"cfl must be in (0, 1], got {cfl}")
        self.mesh, self.degree, self.vel, self.cfl = mesh, degree, velocity, cfl
        self.attention = getattr(velocity, "attention", None)  # USA: a first step too long names β (rk)
        self.max_dt = math.inf if max_dt is None else float(max_dt)
        self.comm: MPI.Comm = mesh.comm
        self.V = dolfinx.fem.functionspace(mesh, ("DG", degree))
        self.t = surface_tables(self.V, degree)
        self._work = dolfinx.fem.Function(self.V, name="mu")
        self._w1 = _lobatto_first_weight(degree)
        self.nodes = NodalVelocity(mesh, degree, self.t) if nodal else None
        self.limited_cells = 0

    # -- the state ----------------------------------------------------------------------------------
    def _cells(self, state: Array) -> Array:
        """The cell values (all local cells, k) of ``state`` with its ghosts refreshed."""
        self._work.x.array[:] = state
        self._work.x.scatter_forward()
        return np.asarray(self._work.x.array[self.t.dofs], dtype=float)

    def quadrature(self, mu: dolfinx.fem.Function | Array) -> tuple[Array, Array]:
        """The measure μ_h of this rank's cells as point masses: (x (n, 3) on S², w (n,) = μ_h ω|J|)."""
        u = self._arr(mu)[self.t.dofs[:self.t.n_owned]]
        w = (u @ self.t.phi.T) * self.t.wq
        return self.t.xq.reshape(-1, 3), w.ravel()

    @staticmethod
    def _arr(mu: dolfinx.fem.Function | Array) -> Array:
        return np.asarray(mu.x.array if isinstance(mu, dolfinx.fem.Function) else mu, dtype=float)

    def mass(self, mu: dolfinx.fem.Function | Array) -> float:
        """∫ μ_h over the mesh's surface (all ranks; exact on flat cells)."""
        return float(self.comm.allreduce(float(self.quadrature(mu)[1].sum()), op=MPI.SUM))

    def cell_means(self, mu: dolfinx.fem.Function | Array) -> Array:
        """The mean of μ_h on each owned cell, shape (owned cells,)."""
        u = self._arr(mu)[self.t.dofs[:self.t.n_owned]]
        return ((u @ self.t.phi.T) * self.t.wq).sum(axis=1) / self.t.area

    def cell_centres(self) -> Array:
        """The owned cells' centres of area projected onto S², shape (owned cells, 3)."""
        c = np.einsum("cq,cqd->cd", self.t.wq, self.t.xq)
        return c / np.linalg.norm(c, axis=1, keepdims=True)

    def min_density(self, mu: dolfinx.fem.Function | Array) -> float:
        """The minimum of μ_h over the limiter points of all owned cells of all ranks (p ≤ 1: exact)."""
        u = self._arr(mu)[self.t.dofs[:self.t.n_owned]]
        lo = float((u @ self.t.lim.T).min()) if len(u) else math.inf
        return float(self.comm.allreduce(lo, op=MPI.MIN))

    def project(self, f: Callable[[Array], Array]) -> dolfinx.fem.Function:
        """The L2 projection of f (unit vectors (m, 3) → (m,)) at x/|x| onto V, cell by cell (ghosts scattered)."""
        out = dolfinx.fem.Function(self.V, name="mu")
        fq = np.asarray(f(self.t.xq.reshape(-1, 3)), dtype=float).reshape(self.t.wq.shape)
        rhs = (fq * self.t.wq) @ self.t.phi
        out.x.array[self.t.dofs[:self.t.n_owned]] = np.einsum("cij,cj->ci", self.t.minv, rhs)
        out.x.scatter_forward()
        return out

    def l2_error(self, mu: dolfinx.fem.Function | Array, f: Callable[[Array], Array] | None = None) -> float:
        """‖μ_h − f(x/|x|)‖_{L2} over the surface (all ranks; f None: ‖μ_h‖), at the volume points."""
        u = self._arr(mu)[self.t.dofs[:self.t.n_owned]] @ self.t.phi.T
        if f is not None:
            u = u - np.asarray(f(self.t.xq.reshape(-1, 3)), dtype=float).reshape(u.shape)
        return math.sqrt(self.comm.allreduce(float((u * u * self.t.wq).sum()), op=MPI.SUM))

    # -- the operator protocol ----------------------------------------------------------------------
    def velocity(self, state: Array, heads: Any = None, linearize: bool = False) -> SphereVel:
        """Tell ``velocity`` the measure of ``state`` (collective), then v at the volume points and u_n on the edges."""
        t = self.t
        x, w = self.quadrature(state)
        if self.nodes is not None:
            self.vel.update(self.nodes.x, self.nodes.masses(w))
            vq, ve = self.nodes.interpolate(self.vel.velocity(self.nodes.x))
        else:
            self.vel.update(x, w)
            vq = self.vel.velocity(x).reshape(t.xq.shape)
            ve = self.vel.velocity(t.xe.reshape(-1, 3)).reshape(t.xe.shape)
        own = np.einsum("fqd,fsqd->fsq", ve, t.ne)  # each side's v·n± (outward)
        un = 0.5 * (own - own[:, ::-1])  # one normal velocity per edge point: side 1 takes side 0's, negated
        return SphereVel(vq, un)

    def rate(self, state: Array, vel: SphereVel) -> tuple[Array, float]:
        """(dμ/dt = M⁻¹ (volume + edge terms) on the owned cells' dofs (ghost entries 0), 0.0: no outflow)."""
        t = self.t
        U = self._cells(state)
        r = np.einsum("cq,cqd,cqkd->ck", U[:t.n_owned] @ t.phi.T, vel.vq, t.grad)
        mu_e = np.einsum("fsqk,fsk->fsq", t.phi_e, U[t.cells])  # each side's trace
        F = t.we[:, None] * (np.maximum(vel.un, 0.0) * mu_e + np.minimum(vel.un, 0.0) * mu_e[:, ::-1])  # outflow
        r -= np.einsum("fsq,fsqk->fsk", F, t.phi_e)[t.cell_edges, t.cell_sides].sum(axis=1)
        du = np.zeros_like(state)
        du[t.dofs[:t.n_owned]] = np.einsum("cij,cj->ci", t.minv, r)
        return du, 0.0

    def limit(self, state: Array) -> int | None:
        """Zhang–Shu scaling in place to the limiter points' minimum 0 (means kept); cells scaled, or None."""
        if self.degree == 0:
            return None
        t = self.t
        d = t.dofs[:t.n_owned]
        U = state[d]
        vmin = (U @ t.lim.T).min(axis=1)
        bad = np.flatnonzero(vmin < 0)
        if not len(bad):
            return None
        mean = ((U[bad] @ t.phi.T) * t.wq[bad]).sum(axis=1) / t.area[bad]
        state[d[bad]] = zhang_shu(U[bad], mean, vmin[bad])[0]
        self.limited_cells += len(bad)
        return len(bad)

    def max_stable_dt(self, vel: SphereVel) -> Array:
        """The positive forward-Euler sub-step for ``vel`` (all ranks' minimum), capped by ``max_dt``; shape (1,)."""
        t = self.t
        if not (np.all(np.isfinite(vel.un)) and np.all(np.isfinite(vel.vq))):
            lim = math.nan
        else:
            if self.degree == 0:
                out = (np.maximum(vel.un[t.cell_edges, t.cell_sides], 0.0) * t.we[t.cell_edges]).sum(axis=(1, 2))
                bound = 1.0
            else:
                edge = np.abs(vel.un).max(axis=(1, 2)) * t.we.sum(axis=1)  # |e| max|u_n|
                out = edge[t.cell_edges].sum(axis=1)
                bound = 2.0 / 3.0 * self._w1
            ratio = float((out / t.area).max()) if len(out) else 0.0
            lim = self.cfl * bound / ratio if ratio > 0 else math.inf
        nan = self.comm.allreduce(math.isnan(lim), op=MPI.LOR)  # both collectives on every rank, always
        lim = self.comm.allreduce(math.inf if math.isnan(lim) else lim, op=MPI.MIN)
        return np.array([math.nan if nan else min(lim, self.max_dt)])

    # -- the depth loop -----------------------------------------------------------------------------
    def solve(self, mu: dolfinx.fem.Function, T: float, steps: int, callback: Any = None,
              deadline: float = math.inf, depths: Any = None) -> SphereReport:
        """Transport μ_0 = ``mu`` to depth T through ``steps`` equal depth steps of SSP-RK3 with CFL sub-steps.

        Args:
            mu: the initial density, a Function of ``V``; not modified.
            T: the final depth.
            steps: depth steps (the output depths), each sub-stepped by :func:`rk.depth_step`.
            callback: called as callback(step, t, μ_t) after every depth step and with step 0 first; μ_t is one
                Function of V reused by every call (ghosts current): copy it to keep it.
            deadline: a ``time.process_time()`` value after which the solve stops (NumericalError).
            depths: the depth-step ends t_0 = 0 < … < t_steps = T (None: T·j/steps).

        Returns:
            The report; μ_T in ``mu_T`` (a new Function). ``solve_cpu_s`` is the process time of the solve
            without the callbacks.

        Raises:
            NumericalError: non-finite values, mass balance lost, too many sub-steps, or past ``deadline``.
        """
        from mfpde.errors import NumericalError
        from mfpde.tokens.stepping import check_depth_step

        cpu = 0.0
        start = time.process_time()
        u = np.array(mu.x.array, dtype=float)
        out = dolfinx.fem.Function(self.V, name="mu")
        mass0, nsub, min_mu = self.mass(u), [], self.min_density(u)

        def emit(k: int, tk: float) -> None:
            out.x.array[:] = u
            out.x.scatter_forward()
            callback(k, tk, out)

        ts = np.linspace(0.0, T, steps + 1) if depths is None else np.asarray(depths, dtype=float)
        cpu += time.process_time() - start
        if callback is not None:
            emit(0, 0.0)
        for k in range(steps):
            start = time.process_time()
            u, _, ns = rk.depth_step(rk.SSP_RK3, self, u, float(ts[k + 1] - ts[k]), None, k, float(ts[k]))
            nsub.append(int(ns[0]))
            finite = bool(self.comm.allreduce(bool(np.all(np.isfinite(u))), op=MPI.LAND))
            check_depth_step(k + 1, float(ts[k + 1]), finite, self.mass(u) if finite else math.nan, 0.0, mass0,
                             math.inf)
            min_mu = min(min_mu, self.min_density(u))
            cpu += time.process_time() - start
            if callback is not None:
                emit(k + 1, float(ts[k + 1]))
            if self.comm.allreduce(time.process_time() > deadline, op=MPI.LOR):
                raise NumericalError(f"CPU-time budget exceeded at depth step {k + 1}, t = {ts[k + 1]:.6g}")
        out.x.array[:] = u
        out.x.scatter_forward()
        limited = int(self.comm.allreduce(self.limited_cells, op=MPI.SUM))  # each rank limits its owned cells
        cpu = float(self.comm.allreduce(cpu, op=MPI.MAX))
        return SphereReport(mass0, self.mass(u), min_mu, sum(nsub), limited, cpu, out, nsub)
