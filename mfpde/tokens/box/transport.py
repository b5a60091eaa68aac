"""Token transport: the McKean–Vlasov continuity equation in depth, by upwind discontinuous Galerkin.

Solves theory §1.3 (F),

    ∂_t μ_t + ∇·(μ_t V[μ_t; ρ]) = 0  on Ω ⊂ R^d (d = 1, 2),  t ∈ [0, T],  no inflow on ∂Ω,

with the softmax attention velocity of :mod:`mfpde.tokens.attention`.

Design, and why:

* **Discontinuous Galerkin of degree k = 0 or 1 with the upwind flux** (Cockburn–Shu, J. Sci. Comput. 16,
  2001). DG is locally conservative: testing with w = 1 on a cell gives exactly the flux balance, so mass
  changes only by the outflow through ∂Ω, which is accumulated (``outflow``) rather than lost.
  k = 0 is the upwind finite-volume scheme (first order, positive); k = 1 is second order.
* **SSP Runge–Kutta 3** (Shu–Osher) in depth: a convex combination of forward-Euler steps, so the
  positivity of each Euler step carries over. The step is sub-cycled automatically so that
  Δt · (outflow of the cell)/|cell| ≤ ``cfl`` (for k = 1, half of it: the Zhang–Shu condition for P1), times the
  SSP coefficient of the scheme (``depth.scheme``: SSP(4,3) and SSP(10,4) take 2× and 6× the step of SSP-RK3 with
  4/3 and 10/3 of its stages; :mod:`mfpde.tokens.rk`).
* **Positivity limiter for k = 1** (Zhang & Shu, J. Comput. Phys. 229, 2010): after each stage the
  polynomial on each cell is scaled toward its cell mean until its nodal minimum is ≥ 0. Cell means are
  untouched, so mass is conserved; for P1/Q1 the nodal minimum is the minimum over the cell.
* **The velocity** (:class:`~mfpde.tokens.box.velocity.VelocityOperator`) is a continuous vector P1
  field, evaluated at every stage at the mesh vertices from the whole of μ: each rank gathers the
  quadrature data of μ (nodes fixed at set-up, weights per stage, in a global order fixed by the
  original cell index, so the sum is the same on any number of ranks).
  The quadrature is the lumped-mass rule, Σ_i m_i μ_i δ_{x_i} with m_i = ∫ φ_i: exact for the mass,
  positive weights whenever μ_h ≥ 0, midpoint rule for k = 0.
* The DG mass matrix is block diagonal: it is assembled once and solved by PETSc KSP (prefix
  ``mfpde_token_``; block Jacobi with exact LU per rank block by default). For k = 0 the form is evaluated by
  arrays over the facets (:mod:`mfpde.tokens.box.upwind`), the same scheme without form-assembly overhead.

Cost per stage: one velocity evaluation (see :mod:`mfpde.tokens.attention`), one vector assembly (k = 1) or
facet sums (k = 0) and one block-diagonal solve, O(N_x) each. Everything is non-dimensional.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from mpi4py import MPI

import dolfinx.fem
import dolfinx.fem.petsc
import dolfinx.la
import numpy as np
import numpy.typing as npt
import ufl

from mfpde.heads import HeadMeasure
from mfpde.mesh import Domain
from mfpde.petsc import LinearSolver, PetscOwner
from mfpde.spaces import lumped_mass
from mfpde.tokens import rk
from mfpde.tokens.attention import TensorGrid
from mfpde.tokens.box.quadrature import TokenQuadrature
from mfpde.tokens.box.readout import Readout
from mfpde.tokens.box.tape import TAPE_BUDGET_BYTES, CheckpointedTape, Tape
from mfpde.tokens.box.upwind import FACET_QUADRATURE_DEGREE, UpwindFiniteVolume
from mfpde.tokens.box.velocity import VelocityLinearization, VelocityOperator
from mfpde.tokens.limiter import LimiterRecord, limit
from mfpde.tokens.stepping import cfl_step, check_depth_step, quadrature_moments

__all__ = ["SampleOperator", "Tape", "TokenTransport", "TransportReport"]

logger = logging.getLogger(__name__)
Array = npt.NDArray[np.float64]
#: mfpde's options for the DG mass solve (block diagonal: exact LU per rank block), prefix ``mfpde_token_``.
TOKEN_PETSC_DEFAULTS = {"ksp_type": "preonly", "pc_type": "bjacobi", "sub_pc_type": "lu"}
@dataclass
class TransportReport:
    """Diagnostics of one token solve (theory §1.3; the ``transport`` report of interface.md)."""

    mass_0: float
    mass_T: float
    outflow: float
    min_density: float
    mean_T: list[float]
    cov_T: list[list[float]]
    yhat: float
    substeps: int
    history: list[dict[str, float]] = field(default_factory=list)

    @property
    def mass_error(self) -> float:
        """|∫μ_T − ∫μ_0| / ∫μ_0, outflow included.

        The mass lost or gained other than by the outflow is mass_error minus outflow; with nothing
        leaving Ω it is the conservation error.
        """
        return abs(self.mass_T - self.mass_0) / self.mass_0


class TokenTransport(PetscOwner):
    """The upwind-DG / SSP-RK3 solver of the token McKean–Vlasov equation (theory §1.3 (F)).

    Args:
        domain: token mesh (and tensor axes for boxes).
        degree: DG degree, 0 or 1.
        cfl: safety factor of the positivity CFL condition, in (0, 1].
        petsc_options: options for the mass solve (prefix ``mfpde_token_``).
    """

    _petsc_solver = "mass_solver"
    _petsc_objects = ("M",)

    def __init__(self, domain: Domain, degree: int = 0, cfl: float = 0.4,
                 petsc_options: dict | None = None):
        if degree not in (0, 1):
            raise ValueError(f"DG degree must be 0 or 1, got {degree}")
        self.domain = domain
        msh = domain.mesh
        self.msh = msh
        self.comm = msh.comm
        self.degree = degree
        self.cfl = cfl * (1.0 if degree == 0 else 0.5)
        self.scheme = rk.SSP_RK3  # the depth integrator (``depth.scheme``: :data:`mfpde.tokens.rk.DEPTH_SCHEMES`)
        self.W = dolfinx.fem.functionspace(msh, ("DG", degree))
        self.Q = self.W if degree == 0 else dolfinx.fem.functionspace(msh, ("DG", 0))
        self.u = dolfinx.fem.Function(self.W, name="mu")  # state being evaluated by the forms
        self.rhs = dolfinx.fem.Function(self.W)
        self.du = dolfinx.fem.Function(self.W)
        self._stage = dolfinx.fem.Function(self.W)
        self.quad = TokenQuadrature(self.W, domain)
        self.velocity = VelocityOperator(msh, self.quad, domain.axes)
        self.vel, self.P = self.velocity.field, self.velocity.P
        self.m = lumped_mass(self.W)
        self.n_owned = self.W.dofmap.index_map.size_local
        self.fv = UpwindFiniteVolume(self.W, self.P) if degree == 0 else None
        self._forms()
        self._mass_solver(petsc_options or {})
        if degree == 1:
            tdim = msh.topology.dim
            nc = msh.topology.index_map(tdim).size_local + msh.topology.index_map(tdim).num_ghosts
            self.cell_dofs = self.W.dofmap.list[:nc]

    # -- set-up -------------------------------------------------------------------------------
    def _forms(self) -> None:
        msh, u, V = self.msh, self.u, self.vel
        w = ufl.TestFunction(self.W)
        q = ufl.TestFunction(self.Q)
        n = ufl.FacetNormal(msh)
        vn = ufl.dot(V, n)
        vnp = 0.5 * (vn + abs(vn))
        vf = ufl.dot(V("+"), n("+"))
        flux = u("+") * 0.5 * (vf + abs(vf)) - u("-") * 0.5 * (abs(vf) - vf)
        # k = 0: the facet rule of the facet-array scheme (mfpde.tokens.box.upwind); k = 1: UFL's estimated degree
        md = {"quadrature_degree": FACET_QUADRATURE_DEGREE} if self.degree == 0 else {}
        dS, ds = ufl.Measure("dS", msh, metadata=md), ufl.Measure("ds", msh, metadata=md)
        self.L_expr = u * ufl.dot(V, ufl.grad(w)) * ufl.dx - flux * ufl.jump(w) * dS - u * vnp * w * ds
        self.L = dolfinx.fem.form(self.L_expr)
        self.outflow_rate = dolfinx.fem.form(u * vnp * ds)
        # Per cell: total outflow velocity flux through its facets, for the CFL condition.
        self.cell_out = dolfinx.fem.form(0.5 * (vf + abs(vf)) * q("+") * dS + 0.5 * (abs(vf) - vf) * q("-") * dS
                                         + vnp * q * ds)
        self.cell_vol = lumped_mass(self.Q)[: self.Q.dofmap.index_map.size_local]
        self._out = dolfinx.fem.Function(self.Q)

    def _mass_solver(self, options: dict) -> None:
        w, v = ufl.TestFunction(self.W), ufl.TrialFunction(self.W)
        self.M = dolfinx.fem.petsc.assemble_matrix(dolfinx.fem.form(w * v * ufl.dx))
        self.M.assemble()
        self.mass_solver = LinearSolver(self.M, "mfpde_token_", options, TOKEN_PETSC_DEFAULTS, what="petsc.token")

    # -- evaluation ---------------------------------------------------------------------------
    @property
    def vgrid(self) -> TensorGrid | None:
        """The vertex grid of the tensor-grid velocity kernels (None: direct sums)."""
        return self.velocity.grid

    def rate(self, u: dolfinx.fem.Function) -> tuple[dolfinx.fem.Function, float]:
        """du/dt = M⁻¹ L(u) and the outflow rate ∫_∂Ω u (V·n)⁺, for the current velocity.

        Returns:
            (du, r): du is the solver's work Function (overwritten by the next call), r the outflow rate.

        Raises:
            SolverError: the mass solve did not converge.
        """
        self.rhs.x.array[:] = 0.0
        rate: float | complex
        if self.fv is not None:
            rate = self.fv.rate(u.x.array, self.fv.normal_flux(self.vel.x.array), self.rhs.x.array)
        else:
            self.u.x.array[:] = u.x.array
            dolfinx.fem.assemble_vector(self.rhs.x.array, self.L)
            rate = dolfinx.fem.assemble_scalar(self.outflow_rate)
        self.rhs.x.scatter_reverse(dolfinx.la.InsertMode.add)
        self.mass_solver.solve(self.rhs.x.petsc_vec, self.du.x.petsc_vec)
        self.du.x.scatter_forward()
        return self.du, self.comm.allreduce(rate, op=MPI.SUM)

    def max_stable_dt(self) -> float:
        """The largest Δt with Δt · outflow(cell)/|cell| ≤ cfl for the current velocity."""
        self._out.x.array[:] = 0.0
        if self.fv is not None:  # k = 0: Q = W
            self._out.x.array[:] = self.fv.cell_outflow(self.fv.normal_flux(self.vel.x.array))
        else:
            dolfinx.fem.assemble_vector(self._out.x.array, self.cell_out)
        self._out.x.scatter_reverse(dolfinx.la.InsertMode.add)
        out = self._out.x.array[: len(self.cell_vol)]
        ratio = np.max(out / self.cell_vol) if len(out) else 0.0
        return float(cfl_step(np.array(self.comm.allreduce(float(ratio), op=MPI.MAX)), self.cfl))

    def budget(self, lin: VelocityLinearization | None) -> VelocityLinearization | None:
        """A stage's velocity linearisation for the tape, or None once the tape's budget is spent."""
        if lin is None or self._tape_bytes + lin.nbytes > TAPE_BUDGET_BYTES:
            return None
        self._tape_bytes += lin.nbytes
        return lin

    # -- diagnostics --------------------------------------------------------------------------
    def mass(self, u: dolfinx.fem.Function) -> float:
        """∫ μ over Ω (lumped mass is exact for the mass)."""
        n = self.n_owned
        return self.comm.allreduce(float(self.m[:n] @ u.x.array[:n]), op=MPI.SUM)

    def min_density(self, u: dolfinx.fem.Function) -> float:
        """The minimum nodal value of μ_h (for k ≤ 1 the minimum over Ω)."""
        n = self.n_owned
        local = float(u.x.array[:n].min()) if n else math.inf
        return self.comm.allreduce(local, op=MPI.MIN)

    def moments(self, u: dolfinx.fem.Function, g: Readout | None = None) -> tuple[float, Array, Array, float]:
        """Mass, mean (d,), covariance (d, d) and ∫ g dμ of u by the lumped quadrature.

        Moments are of the normalised measure μ/∫μ; ∫ g dμ is not normalised (theory §2: ŷ = ∫ g dμ_T).
        """
        return quadrature_moments(self.quad.gather(u), self.quad.points, g)

    # -- the depth loop -----------------------------------------------------------------------
    def solve(self, u: dolfinx.fem.Function, heads: HeadMeasure | list[HeadMeasure] | Callable[[float], HeadMeasure],
              T: float, steps: int,
              g: Readout | None = None, callback: Callable[[int, float, dolfinx.fem.Function], None] | None = None,
              tape: Tape | CheckpointedTape | None = None, outflow_tol: float = math.inf) -> TransportReport:
        """Transport u = μ_0 to μ_T in place through ``steps`` depth steps (sub-cycled for the CFL).

        Args:
            u: the initial density in ``self.W``; overwritten with μ_T.
            heads: the reduced head distribution (weight-tied), or one per layer block (depth-indexed,
                theory §1.4 (D)): layer ℓ acts on depth steps [ℓ S/L, (ℓ+1) S/L); L must divide steps;
                or a callable t ↦ HeadMeasure.
            T: final depth.
            steps: number of depth steps.
            g: readout for ŷ.
            callback: called as callback(step, t, u) after every depth step.
            tape: if given, every sub-step is appended (:class:`~mfpde.tokens.rk.TapedStep`) for the adjoint; a
                :class:`~mfpde.tokens.box.tape.CheckpointedTape` keeps them within its budget.
            outflow_tol: stop when more than this fraction of ∫μ_0 has left Ω (interface: exit status 3).

        The single-layer (shallow) model is another forward map: :func:`mfpde.tokens.box.shallow.solve_shallow`.

        Raises:
            NumericalError: non-finite values, or outflow beyond ``outflow_tol``.
        """
        layers: list[HeadMeasure | Callable[[float], HeadMeasure]]
        if callable(heads):  # t ↦ HeadMeasure
            per_layer, layers = steps, [heads]
        else:
            layers = list(heads) if isinstance(heads, list) else [heads]
            per_layer = steps // len(layers)
        dt = T / steps
        mass0 = self.mass(u)
        self._tape_bytes = 0
        op = SampleOperator(self)
        outflow, nsub_total, t = 0.0, 0, 0.0
        min_mu = self.min_density(u)
        for k in range(steps):
            layer = layers[k // per_layer]
            hk = layer(k * dt) if callable(layer) else layer
            new, out, nsub = rk.depth_step(self.scheme, op, u.x.array, dt, hk, k, k * dt, tape, k // per_layer,
                                           self.budget if isinstance(tape, list) else None)
            u.x.array[:] = new
            outflow += float(out[0])
            nsub_total += int(nsub[0])
            t = (k + 1) * dt
            finite = self.comm.allreduce(bool(np.all(np.isfinite(u.x.array))), op=MPI.LAND)
            check_depth_step(k + 1, t, finite, self.mass(u) if finite else math.nan, outflow, mass0, outflow_tol)
            min_mu = min(min_mu, self.min_density(u))
            if callback is not None:
                callback(k + 1, t, u)
        mass, mean, cov, yhat = self.moments(u, g)
        return TransportReport(mass0, self.mass(u), outflow, min_mu, mean.tolist(), cov.tolist(), yhat,
                               nsub_total)


class SampleOperator(rk.SingleRow):
    """One sample's DG solver as the operator of :mod:`mfpde.tokens.rk` (states: local DG arrays, owned and ghost).

    ``velocity`` sets the P1 velocity field of ``tokens`` for a state and returns its linearisation (None unless
    ``linearize``); ``rate`` uses the field last set, so it must follow ``velocity`` of the same state (as
    :func:`~mfpde.tokens.rk.step` calls them).
    """

    def __init__(self, tokens: TokenTransport) -> None:
        self.tokens = tokens

    def velocity(self, state: Array, heads: HeadMeasure, linearize: bool) -> VelocityLinearization | None:
        """V[state; ρ] into ``tokens.vel``; its linearisation, or None."""
        f = self.tokens._stage
        f.x.array[:] = state
        self.tokens.velocity.update(f, heads, linearize=linearize)
        return self.tokens.velocity.linearization if linearize else None

    def rate(self, state: Array, vel: VelocityLinearization | None) -> tuple[Array, float]:
        """(M⁻¹L(state; V), outflow rate) for the velocity last set."""
        f = self.tokens._stage
        f.x.array[:] = state
        du, r = self.tokens.rate(f)
        return du.x.array.copy(), r

    def limit(self, state: Array) -> LimiterRecord | None:
        """The Zhang–Shu limiter in place (k = 1)."""
        return None if self.tokens.degree == 0 else limit(state, self.tokens.cell_dofs, self.tokens.m)

    def max_stable_dt(self, vel: VelocityLinearization | None) -> Array:
        """The CFL bound of the velocity last set, shape (1,)."""
        return np.array([self.tokens.max_stable_dt()])



