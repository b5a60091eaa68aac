"""The kernel of attention on S² without a gather: K∗μ by spherical harmonics (theory §9), and its log-domain twin.

Funk–Hecke diagonalises the convolution: with μ̂_ℓm = ∫ Y_ℓm dμ,

    (K∗μ)(x) = ∫ e^{β x·y} dμ(y) = Σ_{ℓ ≤ L} 4π i_ℓ(β) Σ_m μ̂_ℓm Y_ℓm(x) + tail,
    |tail| ≤ ‖μ‖ Σ_{ℓ>L} (2ℓ+1) i_ℓ(β)      (addition theorem, |P_ℓ| ≤ 1),

and v = c β⁻¹ ∇_S(K∗μ) (USA), c β⁻¹ ∇_S(K∗μ)/(K∗μ) (SA). :class:`HarmonicVelocity` integrates each rank's
points against Y_ℓm (O(n (L+1)²)), sums the (L+1)² numbers over the ranks with one ``Allreduce`` and evaluates
the series and its analytic surface gradient at the local points (:mod:`~mfpde.tokens.sphere.sht`: ducc0 where
installed, else the recurrences of :mod:`~mfpde.tokens.sphere.harmonics`):
memory O(n), one message of 8 (L+1)² bytes per update whatever the number of ranks.

The series is summed in doubles with terms up to ‖μ‖ e^β, so K∗μ carries an absolute error ≈ ε ‖μ‖ e^β. Far
from the mass K∗μ is as small as ‖μ‖ e^{−β}: the SA quotient then has a relative error ≈ ε e^{2β} (1e-3 at
β = 15). :func:`choose_kernel` keeps the harmonic kernel while that bound is below ``rtol`` and otherwise takes
:class:`~mfpde.tokens.sphere.tilted.TiltedVelocity`: the same series about K points of the sphere, each point
evaluated about its nearest, gather-free at any β. :class:`LogDomainVelocity`, the direct quadrature of
e^{β(x·y−1)} with the exponent (and log w) shifted by its maximum per target, is exact to round-off at any β:
the reference. It gathers the points of all ranks: 32 N bytes on every rank (N points in all) plus work arrays
of at most :data:`WORK_BYTES` (64 MiB), and O(n N) work per rank: meshes of up to ~10⁵ points. All three
expose the harmonic coefficients (computed gather-free) for the reports.

For few points the direct O(n²) sum (:class:`~mfpde.tokens.sphere.velocity.DirectVelocity`, "direct") costs less
than any series: :func:`choose_kernel` takes it when told the number of points and that number is at most
:func:`direct_limit` (the flow solver's particles; exact at any β, it gathers the points, which the flow solver
replicates anyway).
"""

from __future__ import annotations

import math

from mpi4py import MPI

import numpy as np
import numpy.typing as npt
import scipy.special

from mfpde.tokens.sphere.series import DEFAULT_TOL, EPS, degree_power, harmonic_degree, harmonic_tail
from mfpde.tokens.sphere.sht import analysis, backend, synthesis
from mfpde.tokens.sphere.theory import ATTENTIONS
from mfpde.tokens.sphere.tilted import TiltedVelocity
from mfpde.tokens.sphere.velocity import DirectVelocity, tangent

__all__ = ["DEFAULT_TOL", "KERNELS", "DirectVelocity", "HarmonicVelocity", "LogDomainVelocity", "TiltedVelocity",
           "choose_kernel", "degree_power", "direct_limit", "harmonic_degree", "harmonic_tail", "sphere_velocity"]

Array = npt.NDArray[np.float64]

#: the log-domain kernel's work arrays (three blocks of targets × all N points) stay below this many bytes
WORK_BYTES = 2**26
#: the kernels by name (the name each reports as ``kernel``)
KERNELS = ("harmonic", "tilted", "log-domain", "direct")


def _check(beta: float, attention: str) -> None:
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")


class HarmonicVelocity:
    """v by the spherical-harmonic series of K∗μ to degree L (gather-free; see the module).

    Args:
        beta: the inverse temperature β > 0.
        attention: "softmax" (SA) or "unnormalised" (USA).
        comm: the communicator whose ranks share the measure (one Allreduce per update).
        c: the head's weight (the velocity is multiplied by it).
        L: the degree; default :func:`harmonic_degree` (beta, tol).
        tol: the Bessel tail bound that sets L when L is not given.

    Attributes:
        coefficients: μ̂_ℓm of the last update, shape ((L+1)²,), index ℓ² + ℓ + m.
        kernel: "harmonic".

    Raises:
        ValueError: an unknown attention, β ≤ 0 or L < 0.
    """

    kernel = "harmonic"

    def __init__(self, beta: float, attention: str = "softmax", comm: MPI.Comm = MPI.COMM_SELF, c: float = 1.0,
                 L: int | None = None, tol: float = DEFAULT_TOL) -> None:
        _check(beta, attention)
        self.beta, self.attention, self.comm, self.c = float(beta), attention, comm, float(c)
        self.L = harmonic_degree(self.beta, tol) if L is None else int(L)
        if self.L < 0:
            raise ValueError(f"L must be >= 0, got {L}")
        ll = np.repeat(np.arange(self.L + 1), 2 * np.arange(self.L + 1) + 1)
        self.eigenvalues = 4.0 * np.pi * scipy.special.spherical_in(ll, self.beta)  # per column, ((L+1)²,)
        self.coefficients = np.zeros((self.L + 1) ** 2)

    def update(self, x: Array, w: Array) -> None:
        """μ̂_ℓm = Σ_j w_j Y_ℓm(x_j) over the points of all ranks: local sums, one Allreduce (collective)."""
        local = analysis(self.L, x, w)
        self.comm.Allreduce(local, self.coefficients, op=MPI.SUM)

    def degree_power(self) -> Array:
        """Σ_m μ̂_ℓm² per degree ℓ = 0..L, shape (L+1,)."""
        return degree_power(self.coefficients)

    def potential(self, x: Array) -> Array:
        """(K∗μ)(x) = Σ 4π i_ℓ(β) μ̂_ℓm Y_ℓm(x) at the unit vectors x (m, 3): shape (m,)."""
        return synthesis(self.L, self.eigenvalues * self.coefficients, x)[0]

    def velocity(self, x: Array) -> Array:
        """The velocity c β⁻¹ ∇_S(K∗μ) (USA) or c β⁻¹ ∇_S(K∗μ)/(K∗μ) (SA) at the unit vectors x (m, 3): shape (m, 3)."""
        f, g = synthesis(self.L, self.eigenvalues * self.coefficients, x, gradient=True)
        assert g is not None
        if self.attention == "softmax":
            g = g / f[:, None]
        return (self.c / self.beta) * g


class LogDomainVelocity(DirectVelocity):
    """v by the direct quadrature of e^{β(x·y−1)} in the log domain (gathers; see the module): exact at any β.

    Per target x the exponent β x·y_j + log |w_j| is shifted by its maximum over j (points of zero mass drop out;
    masses of either sign are allowed while K∗μ > 0),
    so neither e^{β} nor a tiny K∗μ far from the mass under- or overflows (SA). USA is the SA quotient times
    K∗μ = e^{max} Σ e^{·−max}. Arguments as :class:`DirectVelocity`; ``L`` sets the degree of ``coefficients``.
    """

    kernel = "log-domain"
    L: int

    def __init__(self, beta: float, attention: str = "softmax", comm: MPI.Comm = MPI.COMM_SELF, c: float = 1.0,
                 L: int | None = None, tol: float = DEFAULT_TOL, chunk: int = 2048) -> None:
        _check(beta, attention)
        super().__init__(beta, attention, comm, c, chunk)
        self.L = harmonic_degree(self.beta, tol) if L is None else int(L)
        self.coefficients = np.zeros((self.L + 1) ** 2)

    def update(self, x: Array, w: Array) -> None:
        """Gather the measure of all ranks and sum its harmonic coefficients (collective)."""
        super().update(x, w)
        self.comm.Allreduce(analysis(self.L, x, w), self.coefficients, op=MPI.SUM)
        with np.errstate(divide="ignore"):
            self._logw = np.log(np.abs(self._w))
        self._sign = np.sign(self._w)

    def degree_power(self) -> Array:
        """Σ_m μ̂_ℓm² per degree ℓ = 0..L, shape (L+1,)."""
        return degree_power(self.coefficients)

    def _blocks(self, x: Array) -> tuple[Array, Array, Array]:
        """The log of K∗μ (m,), and the SA quotient ∫ e^{βx·y} y dμ / K∗μ (m, 3) at x (m, 3)."""
        x = np.asarray(x, dtype=float).reshape(-1, 3)
        logk, mean = np.empty(len(x)), np.empty_like(x)
        chunk = max(1, min(self.chunk, WORK_BYTES // (24 * max(len(self._y), 1))))
        for s in range(0, len(x), chunk):
            e = self.beta * (x[s:s + chunk] @ self._y.T) + self._logw
            mx = e.max(axis=1, keepdims=True)
            k = np.exp(e - mx) * self._sign
            tot = k.sum(axis=1)
            logk[s:s + chunk] = mx[:, 0] + np.log(tot)
            mean[s:s + chunk] = k @ self._y / tot[:, None]
        return x, logk, mean

    def potential(self, x: Array) -> Array:
        """(K∗μ)(x) at the unit vectors x (m, 3): shape (m,) (overflows like e^β past β ≈ 700)."""
        return np.exp(self._blocks(x)[1])

    def velocity(self, x: Array) -> Array:
        """The velocity at x (m, 3), shape (m, 3)."""
        x, logk, mean = self._blocks(x)
        v = tangent(x, mean)
        if self.attention == "unnormalised":
            v *= np.exp(logk)[:, None]
        return self.c * v


def direct_limit(L: int, sht: str) -> int:
    """The most points for which the direct O(n²) sum is cheaper than the harmonic kernel of degree L.

    Measured per evaluation (one update + the velocity at the same points, one BLAS thread; ``python
    bench/bench_sphere_kernel.py --crossover``): with the numpy transforms (``sht`` "numpy", O(n (L+1)²)) the
    crossover is at n ≈ (L+1)² for L = 16..39 and stops growing at ≈ 1600 (past ~1000 points the direct sum's n × n
    block leaves the cache); with ducc0's (O(n + L² log L)) it is at n ≈ 450–600 for L = 16..55. Near the
    crossover the two cost the same, so a rule within a third of it loses little.
    """
    limit = min((L + 1) ** 2, 1600)
    return limit if sht == "numpy" else min(limit, 400 + 4 * (L + 1))


def choose_kernel(beta: float, attention: str, rtol: float = 1e-6, points: int | None = None,
                  L: int | None = None, tol: float = DEFAULT_TOL) -> str:
    """The kernel for β, the attention and (where known) the number of points.

    "direct" for at most :func:`direct_limit` ``points``, else "harmonic" unless the SA quotient's relative error
    bound 4 ε e^{2β} exceeds ``rtol``, then "tilted" — or, told the points, "direct" again: the tilted kernel's
    4K series cost 14–80× the direct sum's at 648–2048 particles (β = 20..150, measured), more than the direct sum
    up to the most particles the flow solver takes.

    ``points``: the number of points the velocity is summed over and evaluated at (the flow solver's particles);
    None (a mesh's quadrature points, which are many and distributed) never takes the direct sum. USA takes
    "harmonic" above the limit (its error is ε relative to the largest velocity). With rtol = 1e-6 SA switches at
    β > ½ log(rtol/(4ε)) ≈ 10.4 to :class:`~mfpde.tokens.sphere.tilted.TiltedVelocity` (gather-free, the same bound
    at any β). "log-domain" (gathers) is never chosen: it is the exact reference at any β.

    Raises:
        ValueError: an unknown attention, β ≤ 0.
    """
    _check(beta, attention)
    series = "harmonic" if attention == "unnormalised" or 4 * EPS * math.exp(min(2 * beta, 700.0)) <= rtol else "tilted"
    if points is not None:
        degree = harmonic_degree(beta, tol) if L is None else int(L)
        if series == "tilted" or points <= direct_limit(degree, backend()):
            return "direct"
    return series


def sphere_velocity(beta: float, attention: str = "softmax", comm: MPI.Comm = MPI.COMM_SELF, c: float = 1.0,
                    L: int | None = None, tol: float = DEFAULT_TOL, rtol: float = 1e-6,
                    kernel: str | None = None, points: int | None = None
                    ) -> HarmonicVelocity | TiltedVelocity | LogDomainVelocity | DirectVelocity:
    """The kernel :func:`choose_kernel` picks, or the one named by ``kernel`` (one of :data:`KERNELS`).

    ``points``: the number of points, where it is known (the flow solver's particles).

    Its ``kernel`` attribute names it; its ``coefficients`` have degree L (default :func:`harmonic_degree`
    (β, tol)) whichever series kernel computes the velocity (the direct sum has none).

    Raises:
        ValueError: an unknown kernel or attention, β ≤ 0.
    """
    name = choose_kernel(beta, attention, rtol, points, L, tol) if kernel is None else kernel
    if name == "harmonic":
        return HarmonicVelocity(beta, attention, comm, c, L, tol)
    if name == "tilted":
        return TiltedVelocity(beta, attention, comm, c, rtol, tol, L_report=L)
    if name == "log-domain":
        return LogDomainVelocity(beta, attention, comm, c, L, tol)
    if name == "direct":
        _check(beta, attention)
        return DirectVelocity(beta, attention, comm, c)
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
