"""Parameter Fokker–Planck solver: the Wasserstein gradient flow of the head distribution ρ_s on Θ.

Solves, on a polytope Θ ⊂ R^p (p = 1, 2; an interval or a triangulated polygon) with zero flux on ∂Θ,

    ∂_s ρ = ∇_θ · (ρ ∇_θ Φ) + λ Δ_θ ρ,        Φ = δR/δρ(ρ_s) + (λ₂/2)|θ|²,

the entropic (FP) equation of theory §4 for λ > 0 and the Tikhonov (WGF) equation for λ = 0. Φ is the
*full* potential, given at every step as a P1 function (nodal values); the nonlinearity in ρ enters only
through Φ, which the caller recomputes between steps (theory §4, item 3 of the coupled loop).

Discretisation (theory §7, "Parameters"): P1 Lagrange on Θ with the lumped mass m_i = ∫ φ_i and the
edge-averaged exponential fitting (EAFE, the finite-element Scharfetter–Gummel scheme) of

- J. Xu and L. Zikatanov, *A monotone finite element scheme for convection-diffusion equations*,
  Math. Comp. 68 (1999) 1429–1446 (the edge formula, their §3),
- D. L. Scharfetter and H. K. Gummel, IEEE Trans. Electron Devices 16 (1969) 64–77 (the 1D flux).

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
from numpy.typing import ArrayLike, NDArray

from mfpde import spaces
from mfpde.petsc import LinearSolver

__all__ = [
    "ParameterFokkerPlanck",
    "StepInfo",
    "gaussian_density",
    "gibbs",
    "lam_bernoulli",
    "lumped_mass",
]

logger = logging.getLogger(__name__)

#: mfpde's options for the implicit step (prefix ``mfpde_param_``), set where the user set none.
PARAM_PETSC_DEFAULTS: dict[str, str] = {
    "ksp_type": "preonly",
    "pc_type": "lu",
    "pc_factor_mat_solver_type": "mumps",
}
# Relative tolerance on positive off-diagonal stiffness entries (round-off on right angles is ~1e-16).
_OBTUSE_TOL = 1e-10
# Below |x| < _SMALL the Bernoulli function is evaluated by its Taylor series (error < x⁴/720).
_SMALL = 1e-6
# MPI tag for the consensus exchange inside the column IndexMap constructor.
_INDEXMAP_TAG = 4417


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


def lam_bernoulli(dphi: ArrayLike, lam: float) -> NDArray[np.float64]:
    """Evaluate λ·B(Δφ/λ), B(x) = x/(eˣ − 1), stably for every λ ≥ 0 (the EAFE / Scharfetter–Gummel rate).

    With Δφ = Φ_j − Φ_i this is the rate (per unit edge weight w_ij) at which mass leaves node i for node j.
    For λ → 0 it tends to the upwind rate max(Φ_i − Φ_j, 0) = max(−Δφ, 0), which is returned for λ = 0, so
    the Tikhonov (WGF) transport is the λ → 0 limit of the same formula. No overflow for any |Δφ/λ|:
    x < 0 uses Δφ/expm1(x) (|expm1| ≤ 1), x > 0 uses Δφ e^{−x}/(−expm1(−x)), |x| < 1e-6 the series
    λ(1 − x/2 + x²/12), and B(0) = 1.

    Args:
        dphi: Potential differences Φ_j − Φ_i, any shape (non-dimensional).
        lam: Entropic regularisation λ ≥ 0.

    Returns:
        λ B(Δφ/λ), same shape as ``dphi``, all entries ≥ 0.

    Raises:
        ValueError: If ``lam`` is negative or not finite.
    """
    d = np.asarray(dphi, dtype=np.float64)
    if not (math.isfinite(lam) and lam >= 0.0):
        raise ValueError(f"lam must be finite and >= 0, got {lam!r}")
    if lam == 0.0:
        return np.maximum(-d, 0.0)
    x = d / lam
    out = np.empty_like(x)
    small = np.abs(x) < _SMALL
    neg = (x < 0.0) & ~small
    pos = (x > 0.0) & ~small
    xs = x[small]
    out[small] = lam * (1.0 - 0.5 * xs + xs * xs / 12.0)
    out[neg] = d[neg] / np.expm1(x[neg])
    out[pos] = d[pos] * np.exp(-x[pos]) / -np.expm1(-x[pos])
    out[np.isnan(x)] = np.nan
    return out


def _check_p1(V: fem.FunctionSpace) -> None:
    """Raise ValueError unless V is a scalar continuous P1 Lagrange space."""
    el = V.ufl_element()
    scalar = V.dofmap.index_map_bs == 1 and V.dofmap.bs == 1 and el.reference_value_shape == ()
    if not (scalar and el.family_name == "P" and el.degree == 1 and not el.discontinuous):
        raise ValueError("ParameterFokkerPlanck needs a scalar P1 Lagrange space ('Lagrange', 1)")


def lumped_mass(V: fem.FunctionSpace) -> NDArray[np.float64]:
    """Lumped (row-sum) P1 mass m_i = ∫_Θ φ_i dθ of the owned dofs, shape (num_owned_dofs,), entries > 0."""
    return spaces.lumped_mass(V)[: V.dofmap.index_map.size_local]


def _global_sum(comm: MPI.Comm, x: float) -> float:
    return float(comm.allreduce(float(x), op=MPI.SUM))


def _dof_coords(V: fem.FunctionSpace) -> NDArray[np.float64]:
    """Coordinates of the owned dofs, shape (num_owned_dofs, p) with p = geometric dimension."""
    n = V.dofmap.index_map.size_local
    gdim = V.mesh.geometry.dim
    return np.array(V.tabulate_dof_coordinates()[:n, :gdim], dtype=np.float64)


def gibbs(V: fem.FunctionSpace, phi: fem.Function, lam: float) -> fem.Function:
    """Discrete Gibbs density p_i ∝ exp(−Φ_i/λ), normalised so that Σ_i m_i p_i = 1 (lumped mass).

    This is the exact steady state of the EAFE generator (detailed balance), theory §4 "proximal Gibbs
    measure" p_ρ ∝ exp(−Φ/λ) with Φ = δR/δρ + λ₂|θ|²/2.

    Args:
        V: Scalar P1 space on Θ.
        phi: The full potential Φ in V (non-dimensional).
        lam: Entropic regularisation λ > 0.

    Returns:
        A new P1 Function ``gibbs`` with owned and ghost values set.

    Raises:
        ValueError: If ``lam`` ≤ 0 (the λ = 0 Gibbs measure is a Dirac mass at argmin Φ).
    """
    if not (math.isfinite(lam) and lam > 0.0):
        raise ValueError(f"the Gibbs density needs lam > 0, got {lam!r}")
    comm = V.mesh.comm
    n = V.dofmap.index_map.size_local
    m = lumped_mass(V)
    phi_o = phi.x.array[:n]
    phi_min = comm.allreduce(float(phi_o.min()) if n > 0 else math.inf, op=MPI.MIN)
    e = np.exp(-(phi_o - phi_min) / lam)
    z = _global_sum(comm, np.dot(m, e))
    p = fem.Function(V, name="gibbs")
    p.x.array[:n] = e / z
    p.x.scatter_forward()
    return p


def gaussian_density(V: fem.FunctionSpace, mean: ArrayLike, cov: ArrayLike) -> fem.Function:
    """Interpolate the Gaussian N(mean, cov) density in V and normalise it to lumped mass Σ m_i ρ_i = 1.

    Args:
        V: Scalar P1 space on Θ ⊂ R^p.
        mean: Mean, shape (p,) (a scalar is accepted for p = 1).
        cov: Covariance, shape (p, p) symmetric positive definite (a scalar variance for p = 1).

    Returns:
        A new P1 Function ``rho`` with owned and ghost values set.
    """
    p = V.mesh.geometry.dim
    mu = np.atleast_1d(np.asarray(mean, dtype=np.float64)).reshape(p)
    c = np.atleast_2d(np.asarray(cov, dtype=np.float64)).reshape(p, p)
    cinv = np.linalg.inv(c)
    n = V.dofmap.index_map.size_local
    y = _dof_coords(V) - mu
    vals = np.exp(-0.5 * np.einsum("ni,ij,nj->n", y, cinv, y))
    m = lumped_mass(V)
    z = _global_sum(V.mesh.comm, np.dot(m, vals))
    rho = fem.Function(V, name="rho")
    rho.x.array[:n] = vals / z
    rho.x.scatter_forward()
    return rho


class ParameterFokkerPlanck:
    r"""EAFE (Scharfetter–Gummel) P1 solver for ∂_s ρ = ∇·(ρ∇Φ) + λΔρ with zero flux (theory §4 (FP)/(WGF)).

    Discrete scheme (Xu & Zikatanov, Math. Comp. 68 (1999) 1429–1446): with the lumped mass M_L = diag(m_i),
    the P1 stiffness K, w_ij = −K_ij ≥ 0 (i ≠ j) and r_ij := λB((Φ_j − Φ_i)/λ) = ``lam_bernoulli(Φ_j − Φ_i, λ)``
    (the i → j rate),

        M_L dρ/ds = −L ρ,   (Lρ)_i = Σ_j w_ij [ r_ij ρ_i − r_ji ρ_j ].

    Checked properties (exact arithmetic):

    * zero column sums: column j of L is Σ_k w_jk r_jk − Σ_i w_ij r_ji = 0 (w symmetric), so the lumped
      mass Σ_i m_i ρ_i is conserved by any linear one-step scheme built from L;
    * detailed balance: B(−x) = eˣB(x) gives r_ji e^{−Φ_j/λ} = r_ij e^{−Φ_i/λ}, so every edge flux vanishes
      at ρ_i ∝ e^{−Φ_i/λ} (:func:`gibbs`), the exact discrete steady state;
    * λ > 0, backward Euler (M_L + Δs L) ρ^{n+1} = M_L ρ^n: M_L + ΔsL has positive diagonal, non-positive
      off-diagonal and strictly dominant columns, so it is a non-singular M-matrix (inverse ≥ 0) and
      ρ^{n+1} ≥ 0 for every Δs > 0. On measures μ_i = m_i ρ_i the step is μ ↦ P μ with
      P = (I + Δs L M_L^{-1})^{-1} ≥ 0, 1ᵀP = 1ᵀ: a Markov kernel that fixes the discrete Gibbs measure
      π_i ∝ m_i e^{−Φ_i/λ}. With F(ρ) = Σ m_i(Φ_i ρ_i + λ ρ_i log ρ_i) = λ KL(μ‖π) − λ log Z (mass 1),
      the data-processing inequality KL(Pμ‖Pπ) ≤ KL(μ‖π) (Cover & Thomas, *Elements of Information
      Theory*, 2nd ed., §4.4) gives F(ρ^{n+1}) ≤ F(ρ^n) for every Δs (theory §7 item 5), at fixed Φ;
    * λ = 0 (Tikhonov, pure transport): r_ij = max(Φ_i − Φ_j, 0) (upwind). Forward Euler
      ρ ← ρ − h M_L^{-1} L ρ is conservative and positive iff h ≤ Δs_CFL = min_i m_i / Σ_j w_ij max(Φ_i−Φ_j, 0)
      (diagonal 1 − h L_ii/m_i ≥ 0, off-diagonals ≥ 0); :meth:`step` takes n_sub = ⌈Δs/Δs_CFL⌉ equal
      sub-steps. The scheme is first order in h (upwind) and in Δs.

    The non-obtuse-mesh condition K_ij ≤ 0 (i ≠ j) is checked at construction. Φ enters only through the
    matrix values; the sparsity of K, the Mat and the KSP are created once.

    MPI: Θ is distributed by DOLFINx; rows are the owned dofs and the PETSc AIJ numbering is the global dof
    numbering. The P1 index map does *not* in general ghost every column of the owned rows (with
    ``create_rectangle``'s shared_facet ghosting on 2 ranks one column of the 8×8 mesh is missing), so the
    solver builds its own column IndexMap (owned dofs + every off-process column of the owned rows) and
    scatters Φ and ρ into it.

    Attributes:
        v_ghosts_cover_columns: Whether V's own ghosts happen to contain every off-process column of the
            owned rows (informational; the solver does not rely on it).

    Args:
        V: Scalar P1 Lagrange space on Θ (interval or triangle mesh, non-obtuse).
        lam: Entropic regularisation λ ≥ 0 (non-dimensional); λ = 0 selects the explicit upwind WGF path.
        petsc_options: PETSc options for the implicit solve (see :class:`mfpde.petsc.LinearSolver` for the
            precedence); mfpde's defaults ``ksp_type=preonly, pc_type=lu, pc_factor_mat_solver_type=mumps``
            apply only where neither these nor the options database (``PETSC_OPTIONS``) set a key.
        prefix: PETSc options prefix (``PETSC_OPTIONS="-mfpde_param_ksp_view"`` etc. work).
        options_key: the name of the options in error messages (the config key).

    Raises:
        ConfigError: PETSc rejected the options.
        ValueError: If V is not scalar P1, λ < 0, or the mesh has a positive off-diagonal stiffness entry
            (an obtuse / non-Delaunay mesh, for which EAFE is not monotone).
    """

    def __init__(
        self,
        V: fem.FunctionSpace,
        lam: float,
        petsc_options: dict[str, object] | None = None,
        prefix: str = "mfpde_param_",
        options_key: str = "petsc.param",
    ) -> None:
        _check_p1(V)
        lam = float(lam)
        if not (math.isfinite(lam) and lam >= 0.0):
            raise ValueError(f"lam must be finite and >= 0, got {lam!r}")
        if not prefix:
            raise ValueError("a non-empty PETSc options prefix is required")
        self.V = V
        self.lam = lam
        self.prefix = prefix
        self.comm: MPI.Comm = V.mesh.comm
        imap = V.dofmap.index_map
        self._n = n = imap.size_local
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
        self._rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(self._indptr))
        grow = self._rows + r0
        offdiag = self._gcols != grow
        diag_pos = np.flatnonzero(~offdiag)
        if diag_pos.size != n or not np.array_equal(self._rows[diag_pos], np.arange(n)):
            raise RuntimeError("stiffness matrix has a missing diagonal entry")
        self._diag_pos = diag_pos

        # --- Non-obtuse check: K_ij <= tol * max_i K_ii for i != j (collective decision).
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
        self._m = lumped_mass(V)
        if n > 0 and not np.all(self._m > 0.0):
            raise ValueError("lumped mass has non-positive entries")

        # --- Column IndexMap: owned dofs + all off-process columns of owned rows (owners from the ranges).
        ghosts = np.unique(self._gcols[(self._gcols < r0) | (self._gcols >= r1)]).astype(np.int64)
        ranges = np.asarray(self.comm.allgather(r1), dtype=np.int64)
        owners = np.searchsorted(ranges, ghosts, side="right").astype(np.int32)
        self._colmap = _make_index_map(self.comm, n, ghosts, owners)
        self._lcols = np.where(
            (self._gcols >= r0) & (self._gcols < r1),
            self._gcols.astype(np.int64) - r0,
            n + np.searchsorted(ghosts, self._gcols.astype(np.int64)),
        )
        self._colvec = dolfinx.la.vector(self._colmap)
        # Verification of the brief's assumption: do V's own ghosts cover every column?
        loc = imap.global_to_local(self._gcols.astype(np.int64))
        self.v_ghosts_cover_columns: bool = bool(self.comm.allreduce(int(np.all(loc >= 0)), op=MPI.MIN))

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
            init[diag_pos] = self._m  # A = M_L until the first step (lets the KSP set up now)
            A.setValuesCSR(self._indptr, self._gcols, init)
            A.assemble()
            self._A = A
            self._b = A.createVecRight()
            self.solver = LinearSolver(A, prefix, petsc_options, PARAM_PETSC_DEFAULTS, what=options_key)
        K.destroy()

    # ------------------------------------------------------------------------------------------------
    def _gather(self, f: fem.Function) -> NDArray[np.float64]:
        """Owned + column-ghost values of f (shape (n_owned + n_colghosts,)); collective."""
        arr = self._colvec.array
        arr[: self._n] = f.x.array[: self._n]
        self._colvec.scatter_forward()
        return arr.copy()

    def _rates(self, phi_c: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Edge rates (w_ij r_ij, w_ij r_ji) per CSR entry of the owned rows."""
        dphi = phi_c[self._lcols] - phi_c[self._rows]  # Φ_j − Φ_i
        out = self._w * lam_bernoulli(dphi, self.lam)  # i → j
        inn = self._w * lam_bernoulli(-dphi, self.lam)  # j → i
        return out, inn

    def _check_args(self, rho: fem.Function, phi: fem.Function) -> None:
        nloc = self._n + self.V.dofmap.index_map.num_ghosts
        for name, f in (("rho", rho), ("phi", phi)):
            if f.x.array.size != nloc or f.x.block_size != 1:
                raise ValueError(f"{name} is not a Function in the solver's P1 space")

    def stability_limit(self, phi: fem.Function) -> float:
        """Explicit-Euler stability limit min_i m_i / L_ii of the current generator (collective).

        For λ = 0 this is the CFL limit Δs_CFL = min_i m_i / Σ_j w_ij max(Φ_i − Φ_j, 0) used for sub-stepping;
        for λ > 0 it is the limit of explicit Euler, which the implicit scheme is free to exceed.

        Args:
            phi: The full potential Φ in V.

        Returns:
            The limit (``inf`` if L = 0, e.g. λ = 0 and constant Φ), the same on every rank.
        """
        out, _ = self._rates(self._gather(phi))
        lii = np.bincount(self._rows, weights=out, minlength=self._n)
        pos = lii > 0.0
        loc = float(np.min(self._m[pos] / lii[pos])) if np.any(pos) else math.inf
        return float(self.comm.allreduce(loc, op=MPI.MIN))

    def step(self, rho: fem.Function, phi: fem.Function, ds: float) -> StepInfo:
        """Advance ρ in place from s to s + Δs with the (frozen) full potential Φ. Collective.

        λ > 0: one backward-Euler step (M_L + Δs L) ρ^{n+1} = M_L ρ^n (unconditionally positive, conservative
        and free-energy decreasing). λ = 0: n_sub = ⌈Δs/Δs_CFL⌉ forward-Euler upwind sub-steps.

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
        self._check_args(rho, phi)
        with Timer("mfpde: parameter Fokker-Planck step"):
            return self._step(rho, phi, ds)

    def _step(self, rho: fem.Function, phi: fem.Function, ds: float) -> StepInfo:
        n = self._n
        if self.lam > 0.0:
            assert self._A is not None and self.solver is not None and self._b is not None
            phi_o = phi.x.array[:n]
            key = self._cache_key
            same = key is not None and key[0] == ds and np.array_equal(key[1], phi_o)
            rebuild = not bool(self.comm.allreduce(int(same), op=MPI.MIN))
            if rebuild:
                out, inn = self._rates(self._gather(phi))
                vals = -ds * inn
                vals[self._diag_pos] = self._m + ds * np.bincount(self._rows, weights=out, minlength=n)
                self._A.setValuesCSR(self._indptr, self._gcols, vals)
                self._A.assemble()
                self._cache_key = (ds, phi_o.copy())
            self._b.array[:] = self._m * rho.x.array[:n]
            its, nsub = self.solver.solve(self._b, rho.x.petsc_vec), 1
            rho.x.scatter_forward()
        else:
            out, inn = self._rates(self._gather(phi))
            lii = np.bincount(self._rows, weights=out, minlength=n)
            pos = lii > 0.0
            cfl = float(np.min(self._m[pos] / lii[pos])) if np.any(pos) else math.inf
            cfl = float(self.comm.allreduce(cfl, op=MPI.MIN))
            nsub = 1 if math.isinf(cfl) else max(1, math.ceil(ds / cfl))
            h = ds / nsub
            # ρ_i ← (1 − h L_ii/m_i) ρ_i + (h/m_i) Σ_j w_ij r_ji ρ_j: a sum of non-negative terms (the
            # diagonal factor is ≥ 0 by the CFL bound; clipping only removes its round-off), so ρ ≥ 0 exactly.
            keep = np.maximum(1.0 - (h / self._m) * lii, 0.0)
            for _ in range(nsub):
                rc = self._gather(rho)
                inflow = np.bincount(self._rows, weights=inn * rc[self._lcols], minlength=n)
                rho.x.array[:n] = keep * rc[:n] + (h / self._m) * inflow
                rho.x.scatter_forward()
            its = 0
        mass = _global_sum(self.comm, np.dot(self._m, rho.x.array[:n]))
        rmin = float(self.comm.allreduce(float(np.min(rho.x.array[:n], initial=math.inf)), op=MPI.MIN))
        logger.debug("param FP step ds=%g its=%d nsub=%d mass=%.16g min=%.3e", ds, its, nsub, mass, rmin)
        return StepInfo(ds=ds, iterations=its, substeps=nsub, mass=mass, min_rho=rmin)

    def exact_step(self, rho: fem.Function, phi: fem.Function, ds: float) -> StepInfo:
        """ρ ← exp(−Δs M_L⁻¹ L) ρ: the semi-discrete flow with frozen Φ, exact in time. Collective.

        The generator G = −M_L⁻¹ L is a Metzler matrix with zero column sums against the lumped mass, so
        its exponential keeps ρ ≥ 0 and the mass, for every Δs (and is of any order in Δs, which is what
        Strang splitting needs of its sub-flows). It is applied by ``scipy.sparse.linalg.expm_multiply``
        (Al-Mohy & Higham, SIAM J. Sci. Comput. 33, 2011) to the gathered global generator, redundantly
        on every rank: Θ meshes are small (≤ 10⁵ dofs), and every rank gets the same ρ.

        Args:
            rho: Density, updated in place.  phi: The potential Φ, frozen.  ds: Step Δs > 0.
        """
        import scipy.sparse
        import scipy.sparse.linalg

        ds = float(ds)
        if not (math.isfinite(ds) and ds > 0.0):
            raise ValueError(f"ds must be finite and > 0, got {ds!r}")
        self._check_args(rho, phi)
        n, comm = self._n, self.comm
        out, inn = self._rates(self._gather(phi))
        vals = inn / self._m[self._rows]
        vals[self._diag_pos] = -np.bincount(self._rows, weights=out, minlength=n) / self._m
        rows = comm.allgather(self._rows + self._r0)
        cols = comm.allgather(np.asarray(self._gcols, dtype=np.int64))
        data = comm.allgather(vals)
        N = int(comm.allreduce(n, op=MPI.SUM))
        G = scipy.sparse.csr_matrix((np.concatenate(data), (np.concatenate(rows), np.concatenate(cols))), shape=(N, N))
        full = np.concatenate(comm.allgather(rho.x.array[:n]))
        new = scipy.sparse.linalg.expm_multiply(ds * G, full)
        rho.x.array[:n] = np.maximum(new[self._r0 : self._r0 + n], 0.0)  # clip round-off (≈1e-17) only
        rho.x.scatter_forward()
        mass = _global_sum(comm, np.dot(self._m, rho.x.array[:n]))
        rmin = float(comm.allreduce(float(np.min(rho.x.array[:n], initial=math.inf)), op=MPI.MIN))
        return StepInfo(ds=ds, iterations=0, substeps=1, mass=mass, min_rho=rmin)

    def diagnostics(self, rho: fem.Function, phi: fem.Function) -> dict[str, object]:
        """Lumped-mass diagnostics of ρ against Φ, reduced over MPI (same scalars on every rank). Collective.

        Args:
            rho: Density ρ in V.
            phi: Full potential Φ in V.

        Returns:
            Dict with

            * ``mass``: Σ m_i ρ_i;  ``min_rho``: min_i ρ_i;
            * ``entropy``: Σ m_i ρ_i log ρ_i (0 log 0 = 0);
            * ``free_energy``: F = Σ m_i (Φ_i ρ_i + λ ρ_i log ρ_i) (theory §4, the Lyapunov functional);
            * ``dissipation``: D = ½ Σ_{i,j} J_ij (ξ_i − ξ_j) ≥ 0 with ξ = Φ + λ log ρ and the edge flux
              J_ij = w_ij (r_ij ρ_i − r_ji ρ_j), so that dF/ds = −D for the semi-discrete flow
              (discrete analogue of −∫|∇(Φ + λ log ρ)|² dρ, theory §7 item 5); NaN if some ρ_i ≤ 0 and λ > 0;
            * ``gibbs``: owned nodal values of p ∝ e^{−Φ/λ}, Σ m_i p_i = 1 (``None`` for λ = 0);
            * ``kl``: Σ m_i ρ_i log(ρ_i/p_i) (NaN for λ = 0);  ``l1_gibbs``: Σ m_i |ρ_i − p_i| (NaN for λ = 0);
            * ``mean``: shape (p,), Σ m_i ρ_i θ_i / mass;  ``cov``: shape (p, p), the centred second moment.
        """
        self._check_args(rho, phi)
        comm, n, m, lam = self.comm, self._n, self._m, self.lam
        r = rho.x.array[:n]
        f = phi.x.array[:n]
        mass = _global_sum(comm, np.dot(m, r))
        rmin = float(comm.allreduce(float(np.min(r, initial=math.inf)), op=MPI.MIN))
        rlogr = np.where(r > 0.0, r * np.log(np.where(r > 0.0, r, 1.0)), 0.0)
        entropy = _global_sum(comm, np.dot(m, rlogr))
        free_energy = _global_sum(comm, np.dot(m, f * r)) + lam * entropy

        phi_c = self._gather(phi)
        rho_c = self._gather(rho)
        out, inn = self._rates(phi_c)
        flux = out * rho_c[self._rows] - inn * rho_c[self._lcols]
        if lam > 0.0:
            if rmin > 0.0:
                xi = phi_c + lam * np.log(np.where(rho_c > 0.0, rho_c, 1.0))
                dissipation = 0.5 * _global_sum(comm, np.dot(flux, xi[self._rows] - xi[self._lcols]))
            else:
                dissipation = math.nan
        else:
            dissipation = 0.5 * _global_sum(comm, np.dot(flux, phi_c[self._rows] - phi_c[self._lcols]))

        if lam > 0.0:
            fmin = comm.allreduce(float(np.min(f, initial=math.inf)), op=MPI.MIN)
            e = np.exp(-(f - fmin) / lam)
            p = e / _global_sum(comm, np.dot(m, e))
            with np.errstate(divide="ignore", invalid="ignore"):
                kl_terms = np.where(r > 0.0, r * np.log(np.where(r > 0.0, r, 1.0) / p), 0.0)
            kl = _global_sum(comm, np.dot(m, kl_terms))
            l1 = _global_sum(comm, np.dot(m, np.abs(r - p)))
            gibbs_arr: NDArray[np.float64] | None = p
        else:
            kl = l1 = math.nan
            gibbs_arr = None

        x = _dof_coords(self.V)
        mean = np.array(comm.allreduce((m * r) @ x, op=MPI.SUM)) / mass
        y = x - mean
        cov = np.array(comm.allreduce((y * (m * r)[:, None]).T @ y, op=MPI.SUM)) / mass
        return {
            "mass": mass,
            "min_rho": rmin,
            "entropy": entropy,
            "free_energy": free_energy,
            "dissipation": dissipation,
            "gibbs": gibbs_arr,
            "kl": kl,
            "l1_gibbs": l1,
            "mean": mean,
            "cov": cov,
        }

    def destroy(self) -> None:
        """Free the PETSc objects (optional; they are also freed by garbage collection)."""
        if self.solver is not None:
            self.solver.destroy()
        for obj in (self._A, self._b):
            if obj is not None:
                obj.destroy()
        self.solver = None
        self._A = self._b = None


def _make_index_map(
    comm: MPI.Comm, n: int, ghosts: NDArray[np.int64], owners: NDArray[np.int32]
) -> dolfinx.common.IndexMap:
    """IndexMap with ``n`` owned indices and the given global ghosts and their owner ranks (collective)."""
    return dolfinx.common.IndexMap(comm, n, ghosts, owners, _INDEXMAP_TAG)
