"""The twin's section of the config: training's (:class:`mfpde.training.config.Section`) and ``[twin]``.

Built once by the ``twin`` job (:mod:`mfpde.jobs.twin`, :func:`section`); the twin's modules read it, never the whole
config.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mfpde.training.config import Section as TrainingSection
from mfpde.training.config import section as training_section

if TYPE_CHECKING:
    from mfpde.config.schema import Twin

__all__ = ["Section", "section"]


@dataclass(frozen=True)
class Section(TrainingSection):
    """The twin's section of the config.

    Attributes:
        twin: the ``[twin]`` section (the sizes of the sweeps, the seeds, the optimiser, the sampling of tokens).
    """

    twin: Twin


def section(cfg: Any) -> Section:
    """The twin's section of a validated config."""
    tr = training_section(cfg)
    return Section(**{f.name: getattr(tr, f.name) for f in dataclasses.fields(tr)}, twin=cfg.twin)
