"""The resolution check of the cluster counts (``samples[0].resolution_check`` of the transport report).

The count of clusters and their merge depths are read off a solve at one resolution; whether they are the
answer of the PDE or of that resolution, only a second solve says. The transport job of every domain with cluster
counts (the circle, the sphere, the hypersphere) solves again at a coarser resolution, given by the domain's
``coarser(section)`` (of its typed section of the config): half the flow solver's labels (``tokens.labels``), or
half the cells (``tokens.cells``; on the sphere, the mesh refined once fewer, ``tokens.refine``), and warns (report
and log) where the count at T or the merge depths differ: on the sphere at β = 9 the flow solver counted 3 clusters
at T with 512 particles and 2 with 288, and nothing said that the count was the resolution's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from mfpde.errors import NumericalError

__all__ = ["Coarser", "Quiet", "merge_times", "resolution_check"]

logger = logging.getLogger(__name__)


def merge_times(t: npt.ArrayLike, counts: list[int]) -> list[float]:
    """The output depths at which the cluster count drops below the previous output's (clusters merged)."""
    t = np.asarray(t, dtype=np.float64)
    return [float(t[i]) for i in range(1, len(counts)) if counts[i] < counts[i - 1]]


class Quiet:
    """A progress display that shows nothing (the resolution check's coarser solve)."""

    def update(self) -> None:
        """Nothing."""

    def close(self) -> None:
        """Nothing."""


@dataclass(frozen=True)
class Coarser:
    """The resolution check's solve: its section of the config, the key it changed and both resolutions in words.

    Attributes:
        config: the domain's section of the config at the coarser resolution.
        key: the config key changed (``tokens.labels``, ``tokens.cells``, ``tokens.refine``).
        at: the coarser resolution ("144 labels", "64 cells").
        here: the job's own resolution, in the same words.
        options: what the domain's solve takes besides the section to solve the same data coarser (the circle's
            ``data_cells``: its noise drawn on the job's cells).
    """

    config: Any
    key: str
    at: str
    here: str
    options: dict[str, Any] = field(default_factory=dict)


def resolution_check(block: dict[str, Any], coarser: Coarser | None,
                     solve: Callable[..., dict[str, Any]]) -> list[str]:
    """Solve again at the coarser resolution and compare the cluster counts and merge times.

    Args:
        block: the job's sample block (``clusters_T``, ``merge_times``); gains ``resolution_check``.
        coarser: the domain's coarser resolution, or None where there is none.
        solve: the job's solve of a section and ``coarser.options`` (collective), returning its sample block.

    Returns:
        The warnings (also logged): where ``clusters_T`` or ``merge_times`` differ, the count depends on the
        resolution (raise the key until they agree); where the coarser solve failed, the check did not happen.
        ``block["resolution_check"]`` holds ``at`` (the coarser resolution), ``clusters_t``, ``clusters_T`` and
        ``merge_times`` there, and ``agrees``.
    """
    if coarser is None:
        block["resolution_check"] = {"at": None, "agrees": None, "reason": "no coarser resolution"}
        return []
    try:
        coarse = solve(coarser.config, **coarser.options)
    except NumericalError as e:
        block["resolution_check"] = {"at": coarser.at, "agrees": None, "reason": f"the coarser solve failed: {e}"}
        msg = (f"{coarser.key}: the cluster counts were not checked at a coarser resolution: the solve with "
               f"{coarser.at} failed ({e})")
        logger.warning(msg)
        return [msg]
    same = (coarse["clusters_T"] == block["clusters_T"] and len(coarse["merge_times"]) == len(block["merge_times"])
            and bool(np.allclose(coarse["merge_times"], block["merge_times"])))
    block["resolution_check"] = {"at": coarser.at, "clusters_t": coarse["clusters_t"],
                                 "clusters_T": coarse["clusters_T"], "merge_times": coarse["merge_times"],
                                 "agrees": bool(same)}
    if same:
        return []
    key = coarser.key
    msg = (f"{key}: the clusters depend on the resolution: {block['clusters_T']} at T, merges at "
           f"{[float(f'{m:.4g}') for m in block['merge_times']]} with {coarser.here}; {coarse['clusters_T']} at T, "
           f"merges at {[float(f'{m:.4g}') for m in coarse['merge_times']]} with {coarser.at} (raise {key} until "
           "they agree)")
    logger.warning(msg)
    return [msg]
