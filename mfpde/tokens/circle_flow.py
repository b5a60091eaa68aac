"""Tokens on the circle in Lagrangian form: μ_t = X_t # μ_0 with the flow map on a quadrature of μ_0 (theory §9).

The continuity equation ∂_t μ + ∂_θ(μ u[μ]) = 0 is equivalent to the flow-map equation

    ∂_t X_t(ξ) = u[μ_t](X_t(ξ)) = Z(X_t(ξ))^{-1} ∫ e^{β cos(X_t(η) − X_t(ξ))} sin(X_t(η) − X_t(ξ)) μ_0(η) dη,

Z ≡ 1 (USA) or Z(θ) = ∫ e^{β cos(X_t(η) − θ)} μ_0(η) dη (SA). The integrand is periodic and smooth in η for as long
as X_t is (it is a diffeomorphism of the circle for all t), so the trapezoidal rule on M equispaced labels
ξ_j = 2πj/M with weights w_j = (2π/M) μ_0(ξ_j) converges spectrally; the discrete system is the particle system
with these deterministic weights, noise-free. Its accuracy does not degrade when clusters collapse: a collapsed
cluster is a group of labels at (numerically) one point, which the kernel sees exactly, whereas a fixed Eulerian
mesh pins a cluster narrower than a cell (docs/circle.md).

The collapsed phase is stiff (a cluster of mass m contracts at rate ≈ m e^β (USA) while it drifts at an
exponentially smaller speed), so the ODE is stepped by an implicit adaptive integrator, scipy's ``Radau``
(order 5) with the exact dense Jacobian (:meth:`FlowMap.jacobian`, M × M). The CDF of μ_t is transported exactly,
F_t(X_t(ξ)) = F_0(ξ), and is evaluated by linear interpolation between the labels (second order in the spacing).

Everything is replicated: every MPI rank solves the same small ODE (M ≤ a few thousand) with the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import scipy.integrate

__all__ = ["FlowMap", "FlowSolution", "cluster_masses", "modes_cdf", "modes_density"]

Array = npt.NDArray[np.float64]


def modes_density(modes: list[list[float]]) -> Callable[[Array], Array]:
    """μ_0(θ) = (1/2π)(1 + Σ a cos(k(θ − φ))) for ``modes`` = [[k, a, φ], ...]."""
    def f(t: Array) -> Array:
        return np.asarray((1.0 + sum((a * np.cos(k * (t - ph)) for k, a, ph in modes), np.zeros_like(t)))
                          / (2 * math.pi), dtype=float)
    return f


def modes_cdf(modes: list[list[float]]) -> Callable[[Array], Array]:
    """F_0(θ) = ∫_0^θ μ_0 = (θ + Σ (a/k)(sin(k(θ − φ)) + sin(kφ)))/2π."""
    def F(t: Array) -> Array:
        return np.asarray((t + sum(((a / k) * (np.sin(k * (t - ph)) + np.sin(k * ph)) for k, a, ph in modes),
                                   np.zeros_like(t))) / (2 * math.pi), dtype=float)
    return F


@dataclass
class FlowSolution:
    """Labels X_t(ξ_j) at the output depths: ``t`` (T,), ``X`` (T, M) (not wrapped), ``stats`` of the integrator."""

    t: Array
    X: Array
    stats: dict[str, int]


class FlowMap:
    """The flow-map ODE on M equispaced labels of μ_0 (see the module).

    Args:
        density: μ_0 as a vectorised function of θ (mass 1).
        M: labels; beta: inverse temperature; attention: ``"softmax"`` or ``"unnormalised"``.
    """

    def __init__(self, density: Callable[[Array], Array], M: int, beta: float, attention: str = "unnormalised"):
        if attention not in ("softmax", "unnormalised"):
            raise ValueError(f"attention must be 'softmax' or 'unnormalised', got {attention!r}")
        self.xi = 2 * math.pi * np.arange(M) / M
        self.w = (2 * math.pi / M) * density(self.xi)
        self.beta, self.softmax = float(beta), attention == "softmax"
        self.nfev = 0

    def _kernels(self, X: Array) -> tuple[Array, Array]:
        d = X[None, :] - X[:, None]  # d_ij = X_j − X_i
        e = np.exp(self.beta * (np.cos(d) - (1.0 if self.softmax else 0.0)))
        return d, e

    def velocity(self, t: float, X: Array) -> Array:
        """u_i = Σ_j w_j e^{β cos d_ij} sin d_ij (/ Σ_j w_j e^{β cos d_ij} for SA), d_ij = X_j − X_i; shape (M,)."""
        self.nfev += 1
        d, e = self._kernels(X)
        num = (e * np.sin(d)) @ self.w
        return num / (e @ self.w) if self.softmax else num

    def jacobian(self, t: float, X: Array) -> Array:
        """∂u_i/∂X_k, shape (M, M): off-diagonal w_k G'(d_ik), diagonal −Σ_{j≠i} w_j G'(d_ij) (G' = ∂_d of the kernel).

        USA: G(d) = e^{β cos d} sin d, G' = e^{β cos d}(cos d − β sin² d). SA: u = N/Z, ∂u = (∂N − u ∂Z)/Z with
        ∂_d e^{β cos d} = −β sin d e^{β cos d}.
        """
        d, e = self._kernels(X)
        s, c = np.sin(d), np.cos(d)
        gN = e * (c - self.beta * s * s) * self.w[None, :]
        np.fill_diagonal(gN, 0.0)
        JN = gN - np.diag(gN.sum(axis=1))
        if not self.softmax:
            return JN
        gZ = -self.beta * s * e * self.w[None, :]
        np.fill_diagonal(gZ, 0.0)
        JZ = gZ - np.diag(gZ.sum(axis=1))
        Z = e @ self.w
        u = (e * s) @ self.w / Z
        return np.asarray((JN - u[:, None] * JZ) / Z[:, None], dtype=float)

    def solve(self, t_eval: Array, rtol: float = 1e-9, atol: float = 1e-11, method: str = "Radau") -> FlowSolution:
        """X_t at the depths ``t_eval`` (increasing, from t_eval[0] ≥ 0 with X = ξ at t = 0), implicit and adaptive.

        Raises:
            NumericalError: the integrator failed (its message).
        """
        from mfpde.errors import NumericalError

        t_eval = np.asarray(t_eval, float)
        sol = scipy.integrate.solve_ivp(self.velocity, (0.0, float(t_eval[-1])), self.xi.copy(), method=method,
                                        t_eval=t_eval, rtol=rtol, atol=atol, jac=self.jacobian)
        if not sol.success:
            raise NumericalError(f"flow map: {sol.message}")
        return FlowSolution(sol.t, sol.y.T, {"nfev": sol.nfev, "njev": sol.njev, "nlu": sol.nlu})

    def fourier(self, X: Array, K: int) -> Array:
        """μ̂_k(t) = Σ_j w_j e^{−ik X_j} for k = 1..K (complex, shape (K,)): the trapezoidal rule of ∫ e^{−ikθ} dμ_t."""
        return np.asarray(np.exp(-1j * np.outer(np.arange(1, K + 1), X)) @ self.w)

    def cdf(self, X: Array, F0: Callable[[Array], Array], grid: Array) -> Array:
        """F_t at angles ``grid`` ⊂ [0, 2π), up to an additive constant (W1 on the circle does not see it); shape grid.

        The lifted flow map is increasing with X(ξ + 2π) = X(ξ) + 2π, and F_t(X_t(ξ)) = F_0(ξ) + const: linear
        interpolation through the points (X_j + 2πm, F_0(ξ_j) + m), m = −1, 0, 1.
        """
        X = X - 2 * math.pi * math.floor(X[0] / (2 * math.pi))  # X_0 ∈ [0, 2π): the three copies cover [0, 2π)
        f = F0(self.xi)
        xs = np.concatenate([X - 2 * math.pi, X, X + 2 * math.pi])
        fs = np.concatenate([f - 1.0, f, f + 1.0])
        return np.asarray(np.interp(grid, xs, fs), dtype=float)


def cluster_masses(X: Array, w: Array, gap: float) -> Array:
    """The masses of the groups of labels, cut where two cyclically consecutive positions are > ``gap`` apart.

    Args:
        X: label positions (M,) (radians, any lift).
        w: their weights (M,).
        gap: the cut (radians).

    Returns:
        The group masses (G,), in cyclic order from the first cut; one group of the total mass if no gap exceeds it.
    """
    x = np.mod(X, 2 * math.pi)
    o = np.argsort(x)
    x, ww = x[o], w[o]
    gaps = np.diff(np.concatenate([x, [x[0] + 2 * math.pi]]))
    cut = np.flatnonzero(gaps > gap)  # a group ends at each cut index
    if len(cut) == 0:
        return np.array([float(ww.sum())])
    c = np.concatenate([[0.0], np.cumsum(np.roll(ww, -(cut[-1] + 1)))])  # start after the last cut
    ends = np.mod(cut - cut[-1], len(x))
    ends[-1] = len(x)
    ends = np.sort(ends)
    return np.diff(np.concatenate([[0.0], c[ends]]))
