"""Refuse at the door what cannot run as asked: absurd boxes, densities mostly off their domain.

The estimates are deliberately optimistic (a lower bound on memory and time), so that only a config that
cannot run on any machine is refused; the message names the key to change.

* A Gaussian ρ₀ or datum with less than :data:`MIN_MASS_INSIDE` of its mass inside its box (Θ or Ω) would
  be silently truncated and renormalised into another density: refused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import scipy.stats

from mfpde.errors import ConfigError

__all__ = ["check_box", "check_gaussian_inside", "gaussian_box_mass"]

#: Largest coordinate of a box (non-dimensional; beyond it squares and exponentials of the kernel overflow).
MAX_COORD = 1e12
#: A Gaussian with less of its mass inside its box is refused.
MIN_MASS_INSIDE = 0.5


def check_box(key: str, box: Sequence[Sequence[float]], cells: Sequence[int]) -> None:
    """Refuse a box whose coordinates are absurd or whose cells are too small to tell apart.

    Raises:
        ConfigError: a bound beyond ±:data:`MAX_COORD`, or a cell width below 1e-10 of the coordinates.
    """
    for (lo, hi), n in zip(box, cells, strict=False):
        if max(abs(lo), abs(hi)) > MAX_COORD:
            raise ConfigError(f"{key}: bounds beyond ±{MAX_COORD:g} are not supported (rescale), got {[lo, hi]}")
        if n >= 1 and (hi - lo) / n <= 1e-10 * max(abs(lo), abs(hi), 1.0):
            raise ConfigError(f"{key}: cells of width {(hi - lo) / n:.3g} cannot be resolved at {[lo, hi]}")


def gaussian_box_mass(mean: Sequence[float], cov: Sequence[Sequence[float]], box: Sequence[Sequence[float]]) -> float:
    """The probability that N(mean, cov) puts on the box ∏ [lo_j, hi_j] (p = 1 or 2), by scipy.stats."""
    m = np.asarray(mean, dtype=float)
    c = np.asarray(cov, dtype=float)
    lo = np.array([b[0] for b in box], dtype=float)
    hi = np.array([b[1] for b in box], dtype=float)
    if len(m) == 1:
        s = math.sqrt(c[0, 0])
        return float(scipy.stats.norm.cdf(hi[0], m[0], s) - scipy.stats.norm.cdf(lo[0], m[0], s))
    mvn = scipy.stats.multivariate_normal(m, c)
    return float(mvn.cdf(hi, lower_limit=lo))


def check_gaussian_inside(key: str, mean: Sequence[float], cov: Sequence[Sequence[float]],
                          box: Sequence[Sequence[float]], where: str) -> None:
    """Refuse a Gaussian with less than :data:`MIN_MASS_INSIDE` of its mass in ``box``.

    Raises:
        ConfigError: naming ``key`` and the fraction inside.
    """
    frac = gaussian_box_mass(mean, cov, box)
    if not frac >= MIN_MASS_INSIDE:
        raise ConfigError(f"{key}: only {100 * frac:.3g}% of the Gaussian's mass lies in {where}; it would be "
                          f"truncated and renormalised (move the mean inside or enlarge {where})")
