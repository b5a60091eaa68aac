"""Parameter Fokker–Planck solver: the Wasserstein gradient flow of the head distribution ρ_s on Θ.

Solves, on a polytope Θ ⊂ R^p (p = 1, 2; an interval or a triangulated polygon) with zero flux on ∂Θ,

    ∂_s ρ = ∇_θ · (ρ ∇_θ Φ) + λ Δ_θ ρ,        Φ = δR/δρ(ρ_s) + (λ₂/2)|θ|²,

the entropic (FP) equation of theory §4 for λ > 0 and the Tikhonov (WGF) equation for λ = 0. Φ is the
*full* potential, given at every step as a P1 function (nodal values); the nonlinearity in ρ enters only
through Φ, which the caller recomputes between steps (theory §4, item 3 of the coupled loop).

Discretisation (theory §7, "Parameters"): P1 Lagrange on Θ with the lumped mass m_i = ∫ φ_i and the
edge-averaged exponential fitting (EAFE, finite-element Scharfetter–Gummel) of J. Xu and L. Zikatanov,
Math. Comp. 68 (1999) 1429–1446 (their §3), and Scharfetter & Gummel, IEEE TED 16 (1969) 64–77 (1-D flux).

With K the P1 stiffness matrix (K_ij ≤ 0 off the diagonal on non-obtuse meshes, w_ij = −K_ij ≥ 0) the
semi-discrete equation is M_L dρ/ds = −L ρ with the generator

    (L ρ)_i = Σ_j w_ij [ λB(δ_ij) ρ_i − λB(−δ_ij) ρ_j ],   δ_ij = (Φ_j − Φ_i)/λ,   B(x) = x/(eˣ − 1),

i.e. w_ij λB(δ_ij) is the rate i → j. Properties (shown in the class docstring) are exact in exact arithmetic:
zero column sums (mass conservation), M-matrix structure (positivity), detailed balance with the nodal Gibbs
density e^{−Φ/λ}, and a non-increasing discrete free energy for every step size.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from mpi4py import MPI
from petsc4py import PETSc

import dolfinx
import dolfinx.fem.petsc
import numpy as np
import ufl
from dolfinx import fem
from dolfinx.common import Timer
from numpy.typing import NDArray

from mfpde.params import free_energy
from mfpde.params.densities import lumped_mass_owned
from mfpde.params.eafe import check_p1, global_sum, lam_bernoulli, make_index_map
from mfpde.params.muscl import MusclTransport
from mfpde.petsc import LinearSolver, PetscOwner

__all__ = ["ParameterFokkerPlanck", "StepInfo"]

logger = logging.getLogger(__name__)

#: mfpde's options for the implicit step (prefix ``mfpde_param_``), set where the user set none.
PARAM_PETSC_DEFAULTS: dict[str, str] = {
    "ksp_type": "preonly",
    "pc_type": "lu",
    "pc_factor_mat_solver_type": "mumps",
}
# Relative tolerance on positive off-diagonal stiffness entries (round-off on right angles is ~1e-16).
_OBTUSE_TOL = 1e-10


@dataclass(frozen=True)
class StepInfo:
    """Summary of one call of :meth:`ParameterFokkerPlanck.step` (identical on every rank).

    Attributes:
        ds: The step size taken (non-dimensional training time).
        iterations: KSP iterations of the implicit solve (1 for ``preonly``; 0 for the explicit λ = 0 path).
        substeps: Number of sub-steps (1 for the implicit λ > 0 path; ⌈Δs/Δs_CFL⌉ for λ = 0).
        mass: Σ_i m_i ρ_i after the step (lumped ∫ρ).
        min_rho: min_i ρ_i after the step.
    """

    ds: float
    iterations: int
    substeps: int
    mass: float
    min_rho: float


class ParameterFokkerPlanck(PetscOwner):
    r"""EAFE (Scharfetter–Gummel) P1 solver for ∂_s ρ = ∇·(ρ∇Φ) + λΔρ with zero flux (theory §4 (FP)/(WGF)).

    Discrete scheme (Xu & Zikatanov, Math. Comp. 68 (1999) 1429–1446): with the lumped mass M_L = diag(m_i),
    the P1 stiffness K, w_ij = −K_ij ≥ 0 (i ≠ j) and r_ij := λB((Φ_j − Φ_i)/λ) = ``lam_bernoulli(Φ_j − Φ_i, λ)``
    (the i → j rate),

        M_L dρ/ds = −L ρ,   (Lρ)_i = Σ_j w_ij [ r_ij ρ_i − r_ji ρ_j ].

    Checked properties (exact arithmetic):

    * zero column sums: column j of L is Σ_k w_jk r_jk − Σ_i w_ij r_ji = 0 (w symmetric), so the lumped
      mass Σ_i m_i ρ_i is conserved by any linear one-step scheme built from L;
    * detailed balance: B(−x) = eˣB(x) gives r_ji e^{−Φ_j/λ} = r_ij e^{−Φ_i/λ}, so every edge flux vanishes
      at ρ_i ∝ e^{−Φ_i/λ} (:func:`mfpde.params.densities.gibbs`), the exact discrete steady state;
    * λ > 0, backward Euler (M_L + Δs L) ρ^{n+1} = M_L ρ^n: M_L + ΔsL has positive diagonal, non-positive
      off-diagonal and strictly dominant columns, so it is a non-singular M-matrix (inverse ≥ 0) and
      ρ^{n+1} ≥ 0 for every Δs > 0. On measures μ_i = m_i ρ_i the step is μ ↦ P μ with
      P = (I + Δs L M_L^{-1})^{-1} ≥ 0, 1ᵀP = 1ᵀ: a Markov kernel that fixes the discrete Gibbs measure
      π_i ∝ m_i e^{−Φ_i/λ}. With F(ρ) = Σ m_i(Φ_i ρ_i + λ ρ_i log ρ_i) = λ KL(μ‖π) − λ log Z (mass 1),
      the data-processing inequality KL(Pμ‖Pπ) ≤ KL(μ‖π) (Cover & Thomas, *Elements of Information
      Theory*, 2nd ed., §4.4) gives F(ρ^{n+1}) ≤ F(ρ^n) for every Δs (theory §7 item 5), at fixed Φ;
    * λ = 0 (Tikhonov, pure transport): r_ij = max(Φ_i − Φ_j, 0) (upwind rates). ``order=2`` (default):
      the limited MUSCL flux with SSP-RK2 of :class:`mfpde.params.muscl.MusclTransport`, second order in h
      and Δs, positive and conservative in ⌈Δs/(Δs_CFL/2)⌉ sub-steps. ``order=1``: forward-Euler upwind
      ρ ← ρ − h M_L^{-1} L ρ, positive iff h ≤ Δs_CFL = min_i m_i / Σ_j w_ij max(Φ_i−Φ_j, 0), in
      ⌈Δs/Δs_CFL⌉ sub-steps; first order in h and Δs.

    The non-obtuse-mesh condition K_ij ≤ 0 (i ≠ j) is checked at construction. Φ enters only through the
    matrix values; the sparsity of K, the Mat and the KSP are created once.

    MPI: rows are the owned dofs, numbered globally as in PETSc. V's index map does not in general ghost
    every column of the owned rows (one is missing on an 8×8 mesh on 2 ranks), so the solver builds its own
    column IndexMap (owned dofs + every off-process column of the owned rows) and scatters Φ and ρ into it.

    Args:
        V: Scalar P1 Lagrange space on Θ (interval or triangle mesh, non-obtuse).
        lam: Entropic regularisation λ ≥ 0 (non-dimensional); λ = 0 selects the explicit upwind WGF path.
        petsc_options: PETSc options for the implicit solve (see :class:`mfpde.petsc.LinearSolver` for the
            precedence); mfpde's defaults ``ksp_type=preonly, pc_type=lu, pc_factor_mat_solver_type=mumps``
            apply only where neither these nor the options database (``PETSC_OPTIONS``) set a key.
        prefix: PETSc options prefix (``PETSC_OPTIONS="-mfpde_param_ksp_view"`` etc. work).
        options_key: the name of the options in error messages (the config key).
        order: order in h of the λ = 0 transport, 2 (limited MUSCL, default) or 1 (upwind); unused for λ > 0.

    Raises:
        ConfigError: PETSc rejected the options.
        ValueError: If V is not scalar P1, λ < 0, or the mesh has a positive off-diagonal stiffness entry
            (an obtuse / non-Delaunay mesh, for which EAFE is not monotone).
    """

    _petsc_solver = "solver"
    _petsc_objects = ("_A", "_b")

    def __init__(
        self,
        V: fem.FunctionSpace,
        lam: float,
        petsc_options: dict[str, object] | None = None,
        prefix: str = "mfpde_param_",
        options_key: str = "petsc.param",
        order: int = 2,
    ) -> None:
        check_p1(V)
        lam = float(lam)
        if not (math.isfinite(lam) and lam >= 0.0):
            raise ValueError(f"lam must be finite and >= 0, got {lam!r}")
        if order not in (1, 2):
            raise ValueError(f"order must be 1 or 2, got {order!r}")
        if not prefix:
            raise ValueError("a non-empty PETSc options prefix is required")
        self.V = V
        self.lam = lam
        self.prefix = prefix
        self.comm: MPI.Comm = V.mesh.comm
        imap = V.dofmap.index_map
        self.n_owned = n = imap.size_local
        r0, r1 = imap.local_range
        self._r0 = r0

        # --- Stiffness matrix K, assembled once; its CSR (owned rows, global columns) fixes the pattern.
        u, v = ufl.TrialFunction(V), ufl.TestFunction(V)
        K = dolfinx.fem.petsc.assemble_matrix(fem.form(ufl.inner(ufl.grad(u), ufl.grad(v)) * ufl.dx))
        K.assemble()
        assert K.getOwnershipRange() == (r0, r1)
        indptr, gcols, kvals = K.getValuesCSR()
        self._indptr = np.asarray(indptr, dtype=PETSc.IntType)
        self._gcols = np.asarray(gcols, dtype=PETSc.IntType)
        kvals = np.asarray(kvals, dtype=np.float64)
        self.rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(self._indptr))
        grow = self.rows + r0
        offdiag = self._gcols != grow
        diag_pos = np.flatnonzero(~offdiag)
        if diag_pos.size != n or not np.array_equal(self.rows[diag_pos], np.arange(n)):
            raise RuntimeError("stiffness matrix has a missing diagonal entry")
        self._diag_pos = diag_pos

        kmax = self.comm.allreduce(float(np.max(kvals[diag_pos], initial=0.0)), op=MPI.MAX)
        koff = kvals[offdiag]
        worst = self.comm.allreduce(float(np.max(koff, initial=-math.inf)), op=MPI.MAX)
        nbad = self.comm.allreduce(int(np.count_nonzero(koff > _OBTUSE_TOL * kmax)), op=MPI.SUM)
        if nbad > 0:
            raise ValueError(
                f"the P1 stiffness matrix has {nbad} positive off-diagonal entries (max K_ij = {worst:.3e} "
                f"> {_OBTUSE_TOL:g} * max K_ii): the mesh has obtuse (non-Delaunay) angles, and the EAFE "
                "scheme is then neither monotone nor positivity preserving. Use a non-obtuse mesh "
                "(e.g. structured right triangles)."
            )
        self._w = np.where(offdiag, np.maximum(-kvals, 0.0), 0.0)

        # --- Lumped mass.
        self.m = lumped_mass_owned(V)
        if n > 0 and not np.all(self.m > 0.0):
            raise ValueError("lumped mass has non-positive entries")

        # --- Column IndexMap: owned dofs + all off-process columns of owned rows (owners from the ranges).
        ghosts = np.unique(self._gcols[(self._gcols < r0) | (self._gcols >= r1)]).astype(np.int64)
        ranges = np.asarray(self.comm.allgather(r1), dtype=np.int64)
        owners = np.searchsorted(ranges, ghosts, side="right").astype(np.int32)
        self._colmap = make_index_map(self.comm, n, ghosts, owners)
        self.lcols = np.where(
            (self._gcols >= r0) & (self._gcols < r1),
            self._gcols.astype(np.int64) - r0,
            n + np.searchsorted(ghosts, self._gcols.astype(np.int64)),
        )
        self._colvec = dolfinx.la.vector(self._colmap)

        # --- PETSc Mat (pattern of K), RHS and KSP, created once.
        self._A: PETSc.Mat | None = None
        self.solver: LinearSolver | None = None
        self._b: PETSc.Vec | None = None
        self._cache_key: tuple[float, NDArray[np.float64]] | None = None
        if lam > 0.0:
            A = K.copy()  # same AIJ layout and sparsity as K; only the values change per step
            A.setOptionsPrefix(f"{prefix}A_")
            A.setOption(PETSc.Mat.Option.NEW_NONZERO_ALLOCATION_ERR, True)
            init = np.zeros_like(kvals)
            init[diag_pos] = self.m  # A = M_L until the first step (lets the KSP set up now)
            A.setValuesCSR(self._indptr, self._gcols, init)
            A.assemble()
            self._A = A
            self._b = A.createVecRight()
            self.solver = LinearSolver(A, prefix, petsc_options, PARAM_PETSC_DEFAULTS, what=options_key)
        K.destroy()
        self.order = order
        self._muscl = MusclTransport(self) if lam == 0.0 and order == 2 else None

    # ------------------------------------------------------------------------------------------------
    def gather(self, f: fem.Function) -> NDArray[np.float64]:
        """Owned + column-ghost values of f (shape (n_owned + n_colghosts,)); collective."""
        return self.gather_array(f.x.array[: self.n_owned])

    def gather_array(self, a: NDArray[np.float64]) -> NDArray[np.float64]:
        """Owned + column-ghost values from owned values a (shape (n_owned,)); collective."""
        arr = self._colvec.array
        arr[: self.n_owned] = a[: self.n_owned]
        self._colvec.scatter_forward()
        return arr.copy()

    def rates(self, phi_c: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Edge rates (w_ij r_ij, w_ij r_ji) per CSR entry of the owned rows."""
        dphi = phi_c[self.lcols] - phi_c[self.rows]  # Φ_j − Φ_i
        out = self._w * lam_bernoulli(dphi, self.lam)  # i → j
        inn = self._w * lam_bernoulli(-dphi, self.lam)  # j → i
        return out, inn

    def check_args(self, rho: fem.Function, phi: fem.Function) -> None:
        """Raise ValueError unless rho and phi are scalar Functions of the solver's P1 space."""
        nloc = self.n_owned + self.V.dofmap.index_map.num_ghosts
        for name, f in (("rho", rho), ("phi", phi)):
            if f.x.array.size != nloc or f.x.block_size != 1:
                raise ValueError(f"{name} is not a Function in the solver's P1 space")

    def stability_limit(self, phi: fem.Function) -> float:
        """Explicit-Euler stability limit min_i m_i / L_ii of the current generator (collective).

        For λ = 0 this is Δs_CFL = min_i m_i / Σ_j w_ij max(Φ_i − Φ_j, 0) (the sub-steps are Δs_CFL for order 1,
        Δs_CFL/2 for MUSCL); for λ > 0 the limit of explicit Euler, which the implicit scheme may exceed.

        Args:
            phi: The full potential Φ in V.

        Returns:
            The limit (``inf`` if L = 0, e.g. λ = 0 and constant Φ), the same on every rank.
        """
        out, _ = self.rates(self.gather(phi))
        lii = np.bincount(self.rows, weights=out, minlength=self.n_owned)
        pos = lii > 0.0
        loc = float(np.min(self.m[pos] / lii[pos])) if np.any(pos) else math.inf
        return float(self.comm.allreduce(loc, op=MPI.MIN))

    def step(self, rho: fem.Function, phi: fem.Function, ds: float) -> StepInfo:
        """Advance ρ in place from s to s + Δs with the (frozen) full potential Φ. Collective.

        λ > 0: one backward-Euler step (M_L + Δs L) ρ^{n+1} = M_L ρ^n (unconditionally positive, conservative
        and free-energy decreasing). λ = 0: ⌈Δs/(Δs_CFL/2)⌉ MUSCL SSP-RK2 sub-steps (order 2), or
        ⌈Δs/Δs_CFL⌉ forward-Euler upwind sub-steps (order 1).

        Args:
            rho: Density ρ in V (P1, nodal values), updated in place (owned and ghost values).
            phi: The full potential Φ = δR/δρ + λ₂|θ|²/2 in V, held fixed over the step.
            ds: Step size Δs > 0 (training time, non-dimensional).

        Returns:
            StepInfo with KSP iterations, sub-steps, mass and min ρ after the step.

        Raises:
            ValueError: If Δs is not positive and finite, or rho/phi are not in V.
            SolverError: If the KSP does not converge.
        """
        ds = float(ds)
        if not (math.isfinite(ds) and ds > 0.0):
            raise ValueError(f"ds must be finite and > 0, got {ds!r}")
        self.check_args(rho, phi)
        with Timer("mfpde: parameter Fokker-Planck step"):
            return self._step(rho, phi, ds)

    def _step(self, rho: fem.Function, phi: fem.Function, ds: float) -> StepInfo:
        n = self.n_owned
        if self.lam > 0.0:
            assert self._A is not None and self.solver is not None and self._b is not None
            phi_o = phi.x.array[:n]
            key = self._cache_key
            same = key is not None and key[0] == ds and np.array_equal(key[1], phi_o)
            rebuild = not bool(self.comm.allreduce(int(same), op=MPI.MIN))
            if rebuild:
                out, inn = self.rates(self.gather(phi))
                vals = -ds * inn
                vals[self._diag_pos] = self.m + ds * np.bincount(self.rows, weights=out, minlength=n)
                self._A.setValuesCSR(self._indptr, self._gcols, vals)  # type: ignore[arg-type]
                self._A.assemble()
                self._cache_key = (ds, phi_o.copy())
            self._b.array[:] = self.m * rho.x.array[:n]
            its, nsub = self.solver.solve(self._b, rho.x.petsc_vec), 1
            rho.x.scatter_forward()
        elif self._muscl is not None:
            nsub, its = self._muscl.advance(rho, *self.rates(self.gather(phi)), ds), 0
        else:
            out, inn = self.rates(self.gather(phi))
            lii = np.bincount(self.rows, weights=out, minlength=n)
            pos = lii > 0.0
            cfl = float(np.min(self.m[pos] / lii[pos])) if np.any(pos) else math.inf
            cfl = float(self.comm.allreduce(cfl, op=MPI.MIN))
            nsub = 1 if math.isinf(cfl) else max(1, math.ceil(ds / cfl))
            h = ds / nsub
            # ρ_i ← (1 − h L_ii/m_i) ρ_i + (h/m_i) Σ_j w_ij r_ji ρ_j: a sum of non-negative terms (the
            # diagonal factor is ≥ 0 by the CFL bound; clipping only removes its round-off), so ρ ≥ 0 exactly.
            keep = np.maximum(1.0 - (h / self.m) * lii, 0.0)
            for _ in range(nsub):
                rc = self.gather(rho)
                inflow = np.bincount(self.rows, weights=inn * rc[self.lcols], minlength=n)
                rho.x.array[:n] = keep * rc[:n] + (h / self.m) * inflow
                rho.x.scatter_forward()
            its = 0
        return self._info(rho, ds, its, nsub)

    def _info(self, rho: fem.Function, ds: float, its: int, nsub: int) -> StepInfo:
        n = self.n_owned
        mass = global_sum(self.comm, np.dot(self.m, rho.x.array[:n]))
        rmin = float(self.comm.allreduce(float(np.min(rho.x.array[:n], initial=math.inf)), op=MPI.MIN))
        logger.debug("param FP step ds=%g its=%d nsub=%d mass=%.16g min=%.3e", ds, its, nsub, mass, rmin)
        return StepInfo(ds=ds, iterations=its, substeps=nsub, mass=mass, min_rho=rmin)

    def euler_transport(self, rho: fem.Function, phi: fem.Function, ds: float) -> StepInfo:
        """One forward-Euler MUSCL stage of the λ = 0 transport (sub-stepped only if Δs > Δs_CFL/2). Collective.

        The stage of an outer SSP-RK2 whose Φ changes between stages (Strang's risk transport); with
        ``order=1`` (or λ > 0) it is :meth:`step`. Raises as :meth:`step`.
        """
        if self._muscl is None:
            return self.step(rho, phi, ds)
        self.check_args(rho, phi)
        return self._info(rho, ds, 0, self._muscl.advance(rho, *self.rates(self.gather(phi)), ds, rk2=False))

    def exact_step(self, rho: fem.Function, phi: fem.Function, ds: float) -> StepInfo:
        """ρ ← exp(−Δs M_L⁻¹ L) ρ: the semi-discrete flow with frozen Φ, exact in time. Collective.

        G = −M_L⁻¹ L is Metzler with zero m-weighted column sums, so e^{ΔsG} keeps ρ ≥ 0 and the mass for every
        Δs (any order in Δs, as Strang needs). Applied by ``scipy.sparse.linalg.expm_multiply`` (Al-Mohy &
        Higham, SIAM J. Sci. Comput. 33, 2011) to the gathered generator, redundantly on every rank (Θ ≤ 10⁵
        dofs). Args: rho (updated in place), phi (Φ, frozen), ds (Δs > 0).
        """
        import scipy.sparse
        import scipy.sparse.linalg

        ds = float(ds)
        if not (math.isfinite(ds) and ds > 0.0):
            raise ValueError(f"ds must be finite and > 0, got {ds!r}")
        self.check_args(rho, phi)
        n, comm = self.n_owned, self.comm
        out, inn = self.rates(self.gather(phi))
        vals = inn / self.m[self.rows]
        vals[self._diag_pos] = -np.bincount(self.rows, weights=out, minlength=n) / self.m
        rows = comm.allgather(self.rows + self._r0)
        cols = comm.allgather(np.asarray(self._gcols, dtype=np.int64))
        data = comm.allgather(vals)
        N = int(comm.allreduce(n, op=MPI.SUM))
        G = scipy.sparse.csr_matrix((np.concatenate(data), (np.concatenate(rows), np.concatenate(cols))), shape=(N, N))
        full = np.concatenate(comm.allgather(rho.x.array[:n]))
        new = scipy.sparse.linalg.expm_multiply(ds * G, full)
        rho.x.array[:n] = np.maximum(new[self._r0 : self._r0 + n], 0.0)  # clip round-off (≈1e-17) only
        rho.x.scatter_forward()
        return self._info(rho, ds, 0, 1)

    def diagnostics(self, rho: fem.Function, phi: fem.Function) -> dict[str, object]:
        """Mass, entropy, free energy, dissipation and Gibbs distances of ρ against Φ (collective).

        See :func:`mfpde.params.free_energy.diagnostics`, which this calls.
        """
        return free_energy.diagnostics(self, rho, phi)
