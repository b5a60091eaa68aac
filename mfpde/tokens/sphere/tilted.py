"""The SA kernel at large β without a gather: Funk–Hecke expansions about K points of the sphere, tilted.

The harmonic series of K∗μ about the origin sums terms up to ‖μ‖ e^β for a value as small as ‖μ‖ e^{−β}
(theory §9): relative error ε e^{2β}. About a point a (|a| = 1), with z = x − a, r = |z|, u = z/r,

    ∫ e^{β x·y} (1, y) dμ(y) = e^{M_a} Σ_ℓm 4π i_ℓ(βr) ν̂_{a,ℓm} Y_ℓm(u),   ν_a = e^{β a·y − M_a} (1, y) μ,

(Funk–Hecke for e^{β z·y} = e^{βr u·y}), M_a = max_j (β a·y_j + log w_j) over all ranks (no overflow). The
terms sum to ≤ e^{βr} ∫dν_a while the value is ≥ e^{−βr} ∫dν_a (|x·y − a·y| ≤ r): relative error
≈ ε e^{2βr}, set by the distance r to the nearest centre, not by β alone. :class:`TiltedVelocity` takes
centres on a Fibonacci lattice fine enough that r ≤ r_max = ρ/β, ρ = ½ log(rtol/(4ε)), and the degree L of
the Bessel tail at βr_max. ``update``: the 4K series (K∗μ and ∫ e^{β x·y} y dμ about each centre) from this
rank's points, one Allreduce of 4K(L+1)² numbers (and one of the K maxima); ``velocity``: each point's series
about its nearest centre, v = c P_x N/Z (SA) or c P_x N (USA). Work O(n K (L+1)²) per update (matrix
products), O(n (L+1)²) per velocity; memory O(n) plus O(K (L+1)²) for the series and O(K) per point of a
block; K ≈ 8 β²/ρ² (30 at β = 20, 118 at β = 40, 472 at β = 80).
"""

from __future__ import annotations

import math

from mpi4py import MPI

import numpy as np
import numpy.typing as npt
import scipy.special

from mfpde.tokens.sphere import sht
from mfpde.tokens.sphere.harmonics import analysis, radial_synthesis
from mfpde.tokens.sphere.series import EPS, degree_power, harmonic_degree
from mfpde.tokens.sphere.theory import ATTENTIONS
from mfpde.tokens.sphere.velocity import tangent

__all__ = ["TiltedVelocity", "fibonacci_centres", "tilt_radius"]

Array = npt.NDArray[np.float64]

#: points per block of the update (its work arrays: 5 K × BLOCK doubles)
BLOCK = 2048


def tilt_radius(rtol: float) -> float:
    """ρ = βr_max = ½ log(rtol/(4ε)): the largest βr whose round-off bound 4 ε e^{2βr} is ≤ rtol (10.4 at 1e-6)."""
    return 0.5 * math.log(rtol / (4 * EPS))


def fibonacci_centres(r_max: float) -> Array:
    """Points of a Fibonacci lattice on S² (K, 3) whose covering radius (chord) is below r_max: K = ⌈8/r_max²⌉ ≥ 12.

    A lattice of area 4π/K per point covers like a hexagonal one, radius ≈ √(8π/(3√3 K)) ≈ 0.78 r_max.
    """
    k = max(12, math.ceil(8.0 / r_max**2))
    i = np.arange(k) + 0.5
    z = 1 - 2 * i / k
    phi = math.pi * (1 + math.sqrt(5)) * i
    s = np.sqrt(1 - z * z)
    return np.stack([s * np.cos(phi), s * np.sin(phi), z], axis=1)


class TiltedVelocity:
    """v from tilted Funk–Hecke expansions about K centres (gather-free at any β; see the module).

    Args:
        beta: the inverse temperature β > 0.
        attention: "softmax" (SA) or "unnormalised" (USA; overflows past β ≈ 700 like e^β).
        comm: the communicator whose ranks share the measure.
        c: the head's weight.
        rtol: the relative accuracy of K∗μ aimed at (sets r_max = ρ/β, the centres and L).
        tol: the Bessel tail bound of the degree L, relative to e^{βr_max}.

        L_report: the degree of ``coefficients`` (default :func:`~mfpde.tokens.sphere.series.harmonic_degree` (β)).

    Attributes:
        centres: (K, 3); L: the degree of the tilted series; r_max: the covering radius aimed at (chord);
        coefficients: μ̂_ℓm of the measure to degree L_report ((L_report+1)²,), for the reports (one more
        Allreduce); kernel: "tilted".

    Raises:
        ValueError: an unknown attention or β ≤ 0.
    """

    kernel = "tilted"

    def __init__(self, beta: float, attention: str = "softmax", comm: MPI.Comm = MPI.COMM_SELF, c: float = 1.0,
                 rtol: float = 1e-6, tol: float = 1e-14, L_report: int | None = None) -> None:
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
        if not beta > 0:
            raise ValueError(f"beta must be > 0, got {beta}")
        self.beta, self.attention, self.comm, self.c = float(beta), attention, comm, float(c)
        self.r_max = tilt_radius(rtol) / self.beta
        self.centres = fibonacci_centres(self.r_max)
        self.L = harmonic_degree(self.beta * self.r_max, tol)
        self.L_report = harmonic_degree(self.beta, tol) if L_report is None else int(L_report)
        self.coefficients = np.zeros((self.L_report + 1) ** 2)
        self._series = np.zeros((len(self.centres), 4, (self.L + 1) ** 2))
        self._shift = np.zeros(len(self.centres))

    def update(self, x: Array, w: Array) -> None:
        """The 4K tilted series of all ranks' points (collective: three Allreduces), in blocks of points."""
        x = np.asarray(x, dtype=float).reshape(-1, 3)
        w = np.asarray(w, dtype=float).ravel()
        with np.errstate(divide="ignore"):
            logw = np.log(np.abs(w))  # masses of either sign (round-off negatives of a DG μ_h): |w| shifts, sign kept
        local = np.full(len(self.centres), -np.inf)
        for s in range(0, len(x), BLOCK):
            local = np.maximum(local, (self.beta * (self.centres @ x[s:s + BLOCK].T) + logw[s:s + BLOCK]).max(axis=1))
        self.comm.Allreduce(local, self._shift, op=MPI.MAX)
        series = np.zeros((4 * len(self.centres), (self.L + 1) ** 2))
        for s in range(0, len(x), BLOCK):
            xb = x[s:s + BLOCK]
            t = np.exp(self.beta * (self.centres @ xb.T) + logw[s:s + BLOCK] - self._shift[:, None])  # (K, b), ≤ 1
            t *= np.sign(w[s:s + BLOCK])
            weights = np.concatenate([t[:, None, :], t[:, None, :] * xb.T[None]], axis=1)  # (K, 4, b)
            series += analysis(self.L, xb, weights.reshape(-1, len(xb)))
        self.comm.Allreduce(series.reshape(self._series.shape), self._series, op=MPI.SUM)
        self.comm.Allreduce(sht.analysis(self.L_report, x, w), self.coefficients, op=MPI.SUM)

    def degree_power(self) -> Array:
        """Σ_m μ̂_ℓm² per degree ℓ = 0..L_report, shape (L_report+1,)."""
        return degree_power(self.coefficients)

    def _moments(self, x: Array) -> tuple[Array, Array, Array]:
        """Per point: the shift M of its centre (m,), e^{−M} K∗μ (m,) and e^{−M} ∫ e^{β x·y} y dμ (m, 3)."""
        x = np.asarray(x, dtype=float).reshape(-1, 3)
        near = np.argmax(x @ self.centres.T, axis=1)
        z = x - self.centres[near]
        r = np.linalg.norm(z, axis=1)
        u = np.where(r[:, None] > 0, z / np.where(r > 0, r, 1.0)[:, None], np.array([0.0, 0.0, 1.0]))
        radial = 4 * np.pi * scipy.special.spherical_in(np.arange(self.L + 1)[:, None], self.beta * r[None, :])
        f, nv = np.empty(len(x)), np.empty((len(x), 3))
        for k in np.unique(near):
            idx = np.flatnonzero(near == k)
            vals = radial_synthesis(self.L, self._series[k], u[idx], radial[:, idx])  # (4, m_k)
            f[idx], nv[idx] = vals[0], vals[1:].T
        return self._shift[near], f, nv

    def potential(self, x: Array) -> Array:
        """(K∗μ)(x) at the unit vectors x (m, 3): shape (m,)."""
        shift, f, _ = self._moments(x)
        return np.exp(shift) * f

    def velocity(self, x: Array) -> Array:
        """The velocity at the unit vectors x (m, 3): shape (m, 3)."""
        x = np.asarray(x, dtype=float).reshape(-1, 3)
        shift, f, nv = self._moments(x)
        v = nv / f[:, None] if self.attention == "softmax" else nv * np.exp(shift)[:, None]
        return self.c * tangent(x, v)
