"""The resolution check of the sphere's cluster counts (``samples[0].resolution_check`` of the transport report).

The count of clusters and their merge depths are read off a solve at one resolution; whether they are the
answer of the PDE or of that resolution, only a second solve says. The transport job solves again at half the
flow solver's labels (``tokens.labels``) or on the mesh refined once fewer (``tokens.refine``), and warns (report
and log) where the count at T or the merge depths differ: at β = 9 the flow solver counted 3 clusters at T with 512
labels and 2 with 288, and nothing said that the count was the resolution's.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from mfpde.errors import NumericalError

__all__ = ["Quiet", "coarser", "particles", "resolution_check"]

logger = logging.getLogger(__name__)


def particles(labels: int) -> int:
    """The flow solver's particles for ``tokens.labels``: 2N², N = ⌈√(labels/2)⌉."""
    return 2 * math.ceil(math.sqrt(labels / 2)) ** 2


class Quiet:
    """A progress display that shows nothing (the resolution check's coarser solve)."""

    def update(self) -> None:
        """Nothing."""

    def close(self) -> None:
        """Nothing."""


def coarser(cfg: Any) -> tuple[Any, str] | None:
    """The config of the resolution check and what it changed: half the flow's labels, or DG one refinement fewer.

    None where there is no coarser resolution (DG on the icosahedron itself, refine 0; the flow with 2 particles).
    """
    t = cfg.tokens
    if t.solver == "flow":
        half = max(1, t.labels // 2)
        if particles(half) >= particles(t.labels):
            return None
        return dataclasses.replace(cfg, tokens=dataclasses.replace(t, labels=half)), f"{particles(half)} labels"
    if t.refine < 1:
        return None
    return (dataclasses.replace(cfg, tokens=dataclasses.replace(t, refine=t.refine - 1)),
            f"{20 * 4 ** (t.refine - 1)} cells")


def resolution_check(cfg: Any, block: dict[str, Any], solve: Callable[[Any], dict[str, Any]]) -> list[str]:
    """Solve again at the coarser resolution (:func:`coarser`) and compare the cluster counts and merge times.

    ``solve(config)`` is the job's solve of a config (collective), returning its sample block.

    Adds ``block["resolution_check"]``: ``at`` (the coarser resolution), ``clusters_t``, ``clusters_T`` and
    ``merge_times`` there, and ``agrees``; returns the warnings (also logged): where ``clusters_T`` or
    ``merge_times`` differ, the count depends on the resolution (raise ``tokens.labels`` or ``tokens.refine``).
    The coarser solve costs about half the flow's or less (half the particles), about an eighth of DG's.
    """
    half = coarser(cfg)
    if half is None:
        block["resolution_check"] = {"at": None, "agrees": None, "reason": "no coarser resolution"}
        return []
    cc, at = half
    try:
        coarse = solve(cc)
    except NumericalError as e:
        block["resolution_check"] = {"at": at, "agrees": None, "reason": f"the coarser solve failed: {e}"}
        return []
    same = (coarse["clusters_T"] == block["clusters_T"] and len(coarse["merge_times"]) == len(block["merge_times"])
            and bool(np.allclose(coarse["merge_times"], block["merge_times"])))
    block["resolution_check"] = {"at": at, "clusters_t": coarse["clusters_t"], "clusters_T": coarse["clusters_T"],
                                 "merge_times": coarse["merge_times"], "agrees": bool(same)}
    if same:
        return []
    key = "tokens.labels" if cfg.tokens.solver == "flow" else "tokens.refine"
    here = f"{block['labels']} labels" if cfg.tokens.solver == "flow" else f"{block['cells']} cells"
    msg = (f"{key}: the clusters depend on the resolution: {block['clusters_T']} at T, merges at "
           f"{[float(f'{m:.4g}') for m in block['merge_times']]} with {here}; {coarse['clusters_T']} at T, merges at "
           f"{[float(f'{m:.4g}') for m in coarse['merge_times']]} with {at} (raise {key} until they agree)")
    logger.warning(msg)
    return [msg]
