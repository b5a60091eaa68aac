"""The trained state: ρ per layer block on Θ, its potentials, and the Fokker–Planck solvers (theory §4).

Depth-indexed models carry one ρ per layer block, each with its own Fokker–Planck step, coupled only
through R (theory §1.4 (D)). The potential of block ℓ is Φ^ℓ = δR/δρ^ℓ + (λ₂/2)|θ|² (theory §4 (FP)).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from mpi4py import MPI

import dolfinx.fem
import numpy as np
import numpy.typing as npt
import ufl

from mfpde.errors import ConfigError, NumericalError
from mfpde.heads import HeadMeasure
from mfpde.params.fokker_planck import ParameterFokkerPlanck, StepInfo
from mfpde.params.free_energy import training_free_energy
from mfpde.params.theta import ThetaSpace, first_variation_values
from mfpde.tokens.box.problem import Problem

if TYPE_CHECKING:
    from mfpde.training.config import Section

__all__ = ["HeadDensities"]

Array = npt.NDArray[np.float64]


class HeadDensities:
    """ρ^ℓ on Θ for each layer block ℓ, the potentials Φ^ℓ, and the parameter Fokker–Planck solvers.

    Args:
        pb: the problem.
        sec: training's section of the config (:class:`mfpde.training.config.Section`); its ``heads.init`` must
            be a Gaussian density.

    Attributes:
        theta: the Θ space; family: the head family; n_layers: number of layer blocks.
        rhos: ρ per layer block (P1 on Θ, lumped mass 1), named ``rho`` or ``rho_<ℓ>``.
        lam: λ, the entropy weight (0 for Tikhonov regularisation); lam2: λ₂.
        confinement: (λ₂/2)|θ|² at the local Θ dofs, shape (n_local,); phi_conf: the same as a Function.
        phis: Φ^ℓ = δR/δρ^ℓ + (λ₂/2)|θ|² per block (set by :meth:`set_potentials`).
        phi_risk: δR/δρ^ℓ alone per block (set by :meth:`set_risk_potentials`, for the Strang sub-flow).
        fp: the Fokker–Planck solver with λ (prefix ``mfpde_param_``).
        fp_transport: the λ = 0 solver, the Wasserstein transport by a potential (limited MUSCL, SSP-RK2).

    Raises:
        ConfigError: the initial ρ is not a density, PETSc rejected ``petsc.param`` (or it is set for the
            explicit λ = 0 step, which has no linear solve), or the Θ mesh is obtuse.
    """

    def __init__(self, pb: Problem, sec: Section) -> None:
        if sec.heads.init["kind"] != "gaussian" or pb.theta is None:
            raise ConfigError("heads.init.kind: run trains a density ρ; use kind = \"gaussian\"")
        h = sec.heads
        self.theta: ThetaSpace = pb.theta
        self.family, self.comm, self.n_layers = pb.family, pb.comm, pb.n_layers
        self.rhos = [self.theta.gaussian(h.init["mean"], h.init["cov"]) for _ in range(self.n_layers)]
        for k, r in enumerate(self.rhos):
            r.name = f"rho_{k}" if self.n_layers > 1 else "rho"
        self.lam = sec.training.lam if sec.training.regularization == "entropic" else 0.0
        self.lam2 = sec.training.lambda2
        if self.lam == 0.0 and sec.param_options:
            raise ConfigError(f"petsc.param: {sorted(sec.param_options)} would not be used: with "
                              "training.regularization = 'tikhonov' (λ = 0) the Fokker–Planck step is explicit, "
                              "without a linear solve")
        V = self.theta.V
        try:
            self.fp = ParameterFokkerPlanck(V, self.lam, sec.param_options)
            self.fp_transport = ParameterFokkerPlanck(V, 0.0, sec.param_options, prefix="mfpde_param_wgf_")
        except ConfigError:  # PETSc rejected petsc.param (the message names the key)
            raise
        except ValueError as e:  # an obtuse Θ mesh
            raise ConfigError(f"heads.mesh: {e}") from None
        self.phi_conf = dolfinx.fem.Function(V, name="confinement")
        self.phis = [dolfinx.fem.Function(V, name="Phi") for _ in range(self.n_layers)]
        self.confinement = 0.5 * self.lam2 * (self.theta.x**2).sum(axis=1)  # (λ₂/2)|θ|² at local dofs
        self.phi_conf.x.array[:] = self.confinement
        self.phi_risk = [dolfinx.fem.Function(V) for _ in range(self.n_layers)]
        # ∫ ρ |∇(Φ + λ log ρ)|² (the dissipation of F, theory §4), compiled once per block
        self._dissipation = []
        for r, phi in zip(self.rhos, self.phis, strict=True):
            xi = phi + self.lam * ufl.ln(ufl.max_value(r, 1e-300))
            self._dissipation.append(dolfinx.fem.form(r * ufl.inner(ufl.grad(xi), ufl.grad(xi)) * ufl.dx))

    def heads(self) -> list[HeadMeasure]:
        """The reduced head measure of each block's ρ, keeping every a of the Θ grid (for the adjoint)."""
        return [HeadMeasure.from_heads(self.family, self.theta.points, self.theta.gather(r), keep_zero=True)
                for r in self.rhos]

    def set_potentials(self, heads: list[HeadMeasure], D: list[Array]) -> None:
        """Φ^ℓ = δR/δρ^ℓ + (λ₂/2)|θ|² at the Θ dofs from ∂R/∂c per block (theory §3.1 (G), §4 (FP))."""
        for k in range(self.n_layers):
            dr = first_variation_values(self.family, heads[k], D[k], self.theta.x)
            self.phis[k].x.array[:] = dr + self.confinement

    def set_risk_potentials(self, heads: list[HeadMeasure], D: list[Array]) -> None:
        """δR/δρ^ℓ alone at the Θ dofs (the potential of the risk transport sub-flow)."""
        for k in range(self.n_layers):
            self.phi_risk[k].x.array[:] = first_variation_values(self.family, heads[k], D[k], self.theta.x)

    @staticmethod
    def check(info: StepInfo, what: str) -> None:
        """Stop on a ρ that lost its mass or positivity (ill-conditioned solves at extreme λ or Δs).

        Raises:
            NumericalError: the mass is not 1 to 1e-8, or some ρ_i < 0.
        """
        if not (math.isfinite(info.mass) and abs(info.mass - 1.0) <= 1e-8 and info.min_rho >= 0.0):
            raise NumericalError(f"{what}: ρ has mass {info.mass:.6g}, min {info.min_rho:.3g} (expected 1 and >= 0)")

    def free_energy(self, risk: float) -> dict[str, float]:
        """F = R + (λ₂/2)∫|θ|²dρ + λ∫ρ log ρ and its parts (:func:`mfpde.params.free_energy.training_free_energy`)."""
        return training_free_energy(self.theta, self.rhos, self.confinement, self.lam, risk)

    def dissipation_norm(self) -> float:
        """(Σ_ℓ ∫ ρ^ℓ |∇(Φ^ℓ + λ log ρ^ℓ)|²)^{1/2}, the ``grad_norm`` of the history (theory §4). Collective."""
        gn = sum(self.comm.allreduce(dolfinx.fem.assemble_scalar(f), op=MPI.SUM) for f in self._dissipation)
        return math.sqrt(max(gn, 0.0))

    def values(self) -> list[Array]:
        """Copies of the local nodal values of every ρ^ℓ (a state to go back to)."""
        return [r.x.array.copy() for r in self.rhos]

    def restore(self, values: list[Array]) -> None:
        """Set every ρ^ℓ back to values from :meth:`values`."""
        for r, a in zip(self.rhos, values, strict=True):
            r.x.array[:] = a

    def risk_oscillation(self) -> float:
        """max_ℓ osc δR/δρ^ℓ = max − min of Φ^ℓ − (λ₂/2)|θ|² over Θ (for the Holley–Stroock bound). Collective."""
        n = self.theta.n_owned
        osc = 0.0
        for phi in self.phis:
            dr = phi.x.array[:n] - self.confinement[:n]
            # a rank may own no Θ node (more ranks than Θ vertices): it joins the reductions with ±inf
            hi = self.comm.allreduce(float(np.max(dr, initial=-math.inf)), op=MPI.MAX)
            lo = self.comm.allreduce(float(np.min(dr, initial=math.inf)), op=MPI.MIN)
            osc = max(osc, hi - lo)
        return osc
