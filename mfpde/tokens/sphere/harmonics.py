"""Real orthonormal spherical harmonics Y_ℓm on S² (the basis of the sphere's data and kernel, theory §9).

Index k = ℓ² + ℓ + m for ℓ = 0..L, m = −ℓ..ℓ; (L+1)² functions, orthonormal in L²(S², dσ):

    Y_ℓ0 = Y_ℓ^0,   Y_ℓm = √2 (−1)^m Re Y_ℓ^m (m > 0),   Y_ℓm = √2 (−1)^m Im Y_ℓ^{|m|} (m < 0),

with Y_ℓ^m the complex harmonics of :func:`scipy.special.sph_harm_y` (Condon–Shortley phase), colatitude ϑ
from the z-axis and longitude φ.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import scipy.special

__all__ = ["real_harmonics"]

Array = npt.NDArray[np.float64]


def real_harmonics(L: int, x: npt.ArrayLike) -> Array:
    """Y_ℓm(x) for ℓ ≤ L at the unit vectors x (n, 3): shape (n, (L+1)²), column ℓ² + ℓ + m.

    Raises:
        ValueError: L < 0.
    """
    if L < 0:
        raise ValueError(f"L must be >= 0, got {L}")
    x = np.asarray(x, dtype=float).reshape(-1, 3)
    theta = np.arccos(np.clip(x[:, 2] / np.linalg.norm(x, axis=1), -1.0, 1.0))
    phi = np.arctan2(x[:, 1], x[:, 0])
    out = np.empty((len(x), (L + 1) ** 2))
    for ll in range(L + 1):
        out[:, ll * ll + ll] = scipy.special.sph_harm_y(ll, 0, theta, phi).real
        for m in range(1, ll + 1):
            y = scipy.special.sph_harm_y(ll, m, theta, phi)
            s = np.sqrt(2.0) * (-1.0) ** m
            out[:, ll * ll + ll + m] = s * y.real
            out[:, ll * ll + ll - m] = s * y.imag
    return out
