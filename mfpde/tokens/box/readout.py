"""The readout g of theory §2: ŷ = ∫ g dμ_T, as a function of points."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

__all__ = ["Readout", "readout_function"]

Array = npt.NDArray[np.float64]
#: g as a function of points, shape (N, d) → (N,).
Readout = Callable[[Array], Array]


def readout_function(kind: str, w: list[float] | None = None, b: float = 0.0) -> Readout:
    """The readout g of theory §2 as a function of points (N, d) → (N,).

    Args:
        kind: ``"mean"``: g = x_1; ``"second_moment"``: g = |x|²; ``"linear"``: g = w·x + b.
        w: the weights of ``"linear"``, length d.
        b: the offset of ``"linear"``.

    Raises:
        ValueError: unknown ``kind``.
    """
    if kind == "mean":
        return lambda x: x[:, 0]
    if kind == "second_moment":
        return lambda x: (x * x).sum(axis=1)
    if kind == "linear":
        wv = np.asarray(w, dtype=float)
        return lambda x: x @ wv + b
    raise ValueError(f"unknown readout {kind!r}")
