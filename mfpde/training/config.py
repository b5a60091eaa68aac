"""Training's section of the config: the box's (:class:`mfpde.tokens.box.config.Section`) and ``[training]``.

Built once by the jobs that train (:mod:`mfpde.jobs.run`, :mod:`mfpde.jobs.gibbs`; :func:`section`); the training
problem (:class:`mfpde.training.problem.CoupledProblem`) and the twin's section
(:class:`mfpde.twin.config.Section`) read it, never the whole config.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mfpde.tokens.box.config import Section as BoxSection
from mfpde.tokens.box.config import section as box_section

if TYPE_CHECKING:
    from mfpde.config.schema import Training

__all__ = ["Section", "section"]


@dataclass(frozen=True)
class Section(BoxSection):
    """Training's section of the config: the box's (:class:`mfpde.tokens.box.config.Section`) and ``[training]``.

    Attributes:
        training: the ``[training]`` section (the regularisation, ds, the steps, the splitting, the tape's budget).
        param_options: ``petsc.param`` (the parameter Fokker–Planck solver's PETSc options).
    """

    training: Training
    param_options: dict[str, Any]


def section(cfg: Any) -> Section:
    """Training's section of a validated config."""
    box = box_section(cfg)
    return Section(**{f.name: getattr(box, f.name) for f in dataclasses.fields(box)}, training=cfg.training,
                   param_options=dict(cfg.petsc.param))
