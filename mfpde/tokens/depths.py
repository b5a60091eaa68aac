"""Output depths of a transport run on the circle or the sphere, and a progress display without a terminal."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

__all__ = ["LogProgress", "kept_outputs", "output_depths"]

logger = logging.getLogger(__name__)


def output_depths(sec: Any) -> np.ndarray:
    """The depth-step ends 0 = t_0 < … < T: T·j/steps, or with ``depth.spacing = "log"`` 0 and the geometric depths.

    Log spacing: T·10^{−decades(1 − j/steps)}, j = 0..steps, after 0 (steps + 2 values: the first depth step runs
    from 0 to T·10^{−decades}).

    ``sec``: a section with the ``[depth]`` section as ``depth`` (a domain's, :func:`mfpde.domains.domain_section`).
    """
    d = sec.depth
    if d.spacing == "log":
        return np.concatenate([[0.0], d.T * 10.0 ** (-d.decades * (1.0 - np.arange(d.steps + 1) / d.steps))])
    return np.linspace(0.0, d.T, d.steps + 1)


def kept_outputs(sec: Any) -> list[int]:
    """The indices of the depth-step ends that are output depths (every ``output.every``-th, and the last).

    ``sec``: a section with ``depth`` and ``output`` (:func:`output_depths`).
    """
    steps = len(output_depths(sec)) - 1
    return [j for j in range(steps + 1) if j % sec.output.every == 0 or j == steps]


class LogProgress:
    """A progress display without a terminal: one log line at every tenth of the output depths."""

    def __init__(self, total: int, ts: Any, name: str) -> None:
        self.total, self.ts, self.done, self.name = total, ts, 0, name
        self.every = max(1, total // 10)

    def update(self, n: int = 1) -> None:
        """Count n more output depths; log at every tenth."""
        self.done += n
        if self.done % self.every == 0 or self.done == self.total:
            logger.info("%s: output %d/%d, t = %.4g", self.name, self.done, self.total, float(self.ts[self.done]))

    def close(self) -> None:
        """Nothing to close."""
