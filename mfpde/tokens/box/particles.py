"""The particle method: N tokens moved by the McKean–Vlasov ODE dX/dt = V[μ^N; ρ](X) (theory §1.1, §1.3).

The reference against which the PDE is checked (mean-field limit, theory §5.3) and benchmarked. The
velocity is the same attention kernel as the PDE's (:func:`mfpde.tokens.attention.velocity`) on the empirical
measure μ^N = Σ_j w_j δ_{X_j}; depth is integrated by classical RK4. Non-dimensional.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from mfpde.heads import HeadMeasure
from mfpde.tokens.attention import velocity

Array = npt.NDArray[np.float64]


def transport_particles(x: Array, w: Array, heads: HeadMeasure, T: float, steps: int) -> Array:
    """X_T from X_0 = x by RK4 with ``steps`` equal depth steps.

    Args:
        x: token positions, shape (N, d).
        w: their weights, shape (N,) (sum 1).
        heads: the reduced head distribution ρ.
        T: final depth.
        steps: number of RK4 steps.

    Returns:
        The positions at depth T, shape (N, d).
    """
    dt = T / steps

    def f(z: Array) -> Array:
        return velocity(z, z, w, heads)

    for _ in range(steps):
        k1 = f(x)
        k2 = f(x + 0.5 * dt * k1)
        k3 = f(x + 0.5 * dt * k2)
        k4 = f(x + dt * k3)
        x = x + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
    return x
