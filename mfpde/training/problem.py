"""The coupled system of one config: the built problem, the objective over its samples, and ρ (theory §4).

:class:`CoupledProblem` is what ``mfpde run`` trains (:mod:`mfpde.jobs.run`) and what tests and
scripts evaluate: ``heads()``, ``gradient(heads)``, ``ntk()``, and the splitting of a training step. It reads
training's section of the config (:mod:`mfpde.training.config`: the box's and ``[training]``), never the whole
config; :meth:`CoupledProblem.from_config` builds the section first.
"""

from __future__ import annotations

import logging
from typing import Any

from mpi4py import MPI

import dolfinx.fem
import numpy as np
import numpy.typing as npt

from mfpde.heads import HeadMeasure
from mfpde.params.family import HeadFamily
from mfpde.params.theta import ThetaSpace
from mfpde.tokens.box.adjoint import Gradient
from mfpde.tokens.box.problem import build
from mfpde.training.config import Section, section
from mfpde.training.objective import Objective, ntk_gram
from mfpde.training.splitting import (
    FrozenPotentialFlow,
    OrnsteinUhlenbeckFlow,
    RiskTransportFlow,
    Splitting,
    SubFlow,
)
from mfpde.training.state import HeadDensities

__all__ = ["CoupledProblem", "Section", "section"]

logger = logging.getLogger(__name__)


class CoupledProblem:
    """The problem built from the config (samples split over rank groups), its objective and ρ per layer block.

    Args:
        sec: training's section of the config (:func:`section`; ``heads.init`` a Gaussian density).
        comm: the ranks of the job.

    Attributes:
        sec, comm: as given.
        problem: the built :class:`~mfpde.tokens.box.problem.Problem`.
        objective: R, its first variation, ŷ over the samples (:class:`~mfpde.training.objective.Objective`).
        state: ρ^ℓ, the potentials Φ^ℓ and the Fokker–Planck solvers
            (:class:`~mfpde.training.state.HeadDensities`).

    Raises:
        ConfigError, MeshError: invalid input (exit status 2), on every rank.
        TypeError: ``sec`` is not training's section (a whole config, say: :meth:`from_config`).
    """

    def __init__(self, sec: Section, comm: MPI.Comm = MPI.COMM_WORLD) -> None:
        if not isinstance(sec, Section):
            raise TypeError(f"CoupledProblem takes training's section of the config, not a {type(sec).__name__}: "
                            "CoupledProblem.from_config(cfg), or CoupledProblem(mfpde.training.config.section(cfg))")
        self.sec, self.comm = sec, comm
        self.problem = build(sec, comm, split_samples=True)
        self.state = HeadDensities(self.problem, sec)
        self.objective = Objective(self.problem, sec.training.tape_memory)
        fp = self.state.fp.solver
        logger.info("linear solvers: %s; %s", self.problem.tokens.mass_solver.describe(),
                    fp.describe() if fp is not None else "mfpde_param_: explicit (λ = 0)")

    @classmethod
    def from_config(cls, cfg: Any, comm: MPI.Comm = MPI.COMM_WORLD) -> CoupledProblem:
        """The problem of a validated config: its :func:`section`, then the problem."""
        return cls(section(cfg), comm)

    @property
    def theta(self) -> ThetaSpace:
        """The Θ space."""
        return self.state.theta

    @property
    def family(self) -> HeadFamily:
        """The head family."""
        return self.problem.family

    @property
    def rhos(self) -> list[dolfinx.fem.Function]:
        """ρ per layer block."""
        return self.state.rhos

    def heads(self) -> list[HeadMeasure]:
        """The reduced head measure of each block's ρ (every a of the Θ grid kept)."""
        return self.state.heads()

    def gradient(self, heads: list[HeadMeasure], per_sample: bool = False) -> Gradient:
        """R(ρ), ŷ and ∂R/∂c per block (:meth:`Objective.gradient`)."""
        return self.objective.gradient(heads, per_sample=per_sample)

    def ntk(self, heads: list[HeadMeasure] | None = None) -> npt.NDArray[np.float64]:
        """The mean-field NTK Gram matrix K_ρ, shape (n, n), the same on every rank (theory §5.5)."""
        heads = heads if heads is not None else self.heads()
        grad = self.gradient(heads, per_sample=True)
        assert grad.Dy is not None
        return ntk_gram(self.theta, self.rhos, heads, grad.Dy)

    def risk_potentials(self) -> None:
        """δR/δρ^ℓ at the current ρ into ``state.phi_risk`` (one forward + adjoint pass)."""
        heads = self.heads()
        self.state.set_risk_potentials(heads, self.gradient(heads).D)

    def splitting(self) -> Splitting:
        """The scheme ``training.splitting`` over this problem's sub-flows."""
        flows: dict[str, SubFlow] = {"fokker_planck": FrozenPotentialFlow(self.state),
                 "ornstein_uhlenbeck": OrnsteinUhlenbeckFlow(self.state),
                 "risk_transport": RiskTransportFlow(self.state, self.risk_potentials)}
        return Splitting(self.sec.training.splitting, flows)
