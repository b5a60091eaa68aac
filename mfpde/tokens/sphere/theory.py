"""Linear theory of attention on S² (theory §9): the growth rate of each degree ℓ about the uniform density 1/4π.

With μ = 1/4π + ε Y_ℓm and the Funk–Hecke identity ∫ e^{β x·y} Y_ℓm(y) dσ(y) = 4π i_ℓ(β) Y_ℓm(x),

    γ_ℓ = ℓ(ℓ+1) i_ℓ(β)/β  (unnormalised, USA),     γ_ℓ = ℓ(ℓ+1) i_ℓ(β)/(β i_0(β))  (softmax, SA),

the same for all 2ℓ+1 orders m; i_ℓ is the modified spherical Bessel function of the first kind
(:func:`scipy.special.spherical_in`). Everything is non-dimensional.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import scipy.special

__all__ = ["ATTENTIONS", "fastest_degree", "funk_hecke", "growth_rate"]

#: The attention variants: softmax (SA) and unnormalised (USA).
ATTENTIONS = ("softmax", "unnormalised")


def funk_hecke(l: npt.ArrayLike, beta: float) -> npt.NDArray[np.float64]:
    """The eigenvalues 4π i_ℓ(β) of the convolution μ ↦ ∫ e^{β x·y} dμ(y) on S², degree by degree (shape of ``l``)."""
    return 4.0 * np.pi * scipy.special.spherical_in(np.asarray(l, dtype=int), beta)


def growth_rate(l: npt.ArrayLike, beta: float, attention: str = "softmax") -> npt.NDArray[np.float64]:
    """γ_ℓ of theory §9 (shape of ``l``), 1/depth; softmax divides by i_0(β).

    Raises:
        ValueError: an unknown ``attention`` or β ≤ 0.
    """
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    ll = np.asarray(l, dtype=int)
    g = ll * (ll + 1) * scipy.special.spherical_in(ll, beta) / beta
    return g / scipy.special.spherical_in(0, beta) if attention == "softmax" else g


def fastest_degree(beta: float, l_max: int = 200) -> int:
    """The degree ℓ ≥ 1 of largest growth rate (the same for SA and USA: they differ by a factor in β only)."""
    ll = np.arange(1, l_max + 1)
    return int(ll[np.argmax(growth_rate(ll, beta, "unnormalised"))])
