"""Tokens on the circle in Lagrangian form: μ_t = X_t # μ_0, the flow map on the quantiles of μ_0 (theory §9).

The continuity equation ∂_t μ + ∂_θ(μ u[μ]) = 0 is equivalent to the flow-map equation for the quantile map X_t(v)
(v ∈ [0, 1) the mass coordinate: μ_t([X_t(0), X_t(v))) = v),

    ∂_t X_t(v) = u[μ_t](X_t(v)),   u(θ) = Σ_h c_h Z_h(θ)^{-1} ∫₀¹ e^{β_h cos(X_t(w) − θ)} sin(X_t(w) − θ) dw,

Z_h ≡ 1 (USA) or Z_h(θ) = ∫₀¹ e^{β_h cos(X_t(w) − θ)} dw (SA). Design, and why:

* **Labels at the quantiles, equal weights.** M labels v_j = (j + ½)/M start at X_0(v_j) = F_0^{-1}(v_j), F_0 the
  closed-form CDF of the data (Newton to round-off; ``circle_noise``: the exact inverse of its piecewise-linear
  CDF). Each label carries the mass 1/M exactly. X_t(v) − 2πv is periodic and, for smooth data, analytic, so the
  midpoint rule in v of every smooth integrand converges spectrally: the discrete system is the deterministic
  particle system on these labels.
* **The force by the Fourier series of the kernel**, O(MK) instead of the O(M²) pairwise sum:
  e^{β cos ψ} = I₀(β) + 2 Σ_k I_k(β) cos kψ, so e^{β cos ψ} sin ψ = (2/β) Σ_k k I_k(β) sin kψ, and with the moments
  S_k = (1/M) Σ_j e^{ikX_j},

      N(θ) = (2/β) Σ_k k I_k(β) Im(e^{−ikθ} S_k),   Z(θ) = I₀(β) + 2 Σ_k I_k(β) Re(e^{−ikθ} S_k),

  cut at the first K with I_k(β)/I₀(β) < 1e-17 (:func:`series_length`: the tail is below round-off). The powers
  e^{ikX_j} come by doubling (log₂K products). The direct pairwise sum
  (:func:`mfpde.tokens.circle.particles.dense_velocity`) is the tests' reference. :mod:`mfpde.tokens.circle.force`.
* **The map's derivative rides along** (the variational equation): L_j = log ∂_v X_t(v_j) obeys
  dL_j/dt = u'(X_j), u' from the same moments at almost no extra cost; L_0 = −log μ_0(X_0(v_j)). With X and ∂_v X at
  the labels the periodic part of the map is interpolated by a trigonometric **Hermite** interpolant of 2M modes
  (:func:`hermite_map`): the reconstruction error of M labels is that of 2M plain samples (measured: W1 1e-7 at
  M = 64 where plain interpolation needs M ≈ 120). The CDF at any angle is the inverse of that map (cubic
  Hermite on an oversampled grid, Newton-polished; :func:`cdf_from_map`).
* **Integrators: explicit while non-stiff, implicit once clusters collapse.** DOP853 (scipy's, order 8, with a PI
  step-size controller: :mod:`mfpde.tokens.adaptive`) steps (X, L) while the map is smooth. Its error is measured
  on the positions X alone (L is the variational equation of X on the same steps: it feeds nothing back), and
  uniformly around the circle: every label's local error against 2π·rtol radians (an angle has no relative size;
  a scale rtol·|X| would hold labels near θ = 2π seven times looser than those near 0 and break the rotation
  invariance of the equation). Measured on the benchmark's case B (M = 96, rtol 1e-5): 62 right-hand sides
  instead of 110 with (X, L) in the norm and the scale rtol(1 + |X|), W1 4.3e-4 instead of 4.0e-4. A collapsing
  cluster contracts at the rate σ = −min_j u'(X_j) (the diagonal of the Jacobian, available from L's right-hand
  side); when the explicit step is held by stability (h σ ≥ 2 for 8 accepted steps in a row) the solve switches
  to LSODA (ODEPACK, BDF with the exact dense Jacobian, :meth:`FourierForce.jacobian`) on X alone, and the CDF
  from then on is the exact one of the weighted labels, linear between them (a collapsed cluster is a jump of the
  CDF, which no smooth interpolant holds). The switch depth and both integrators' counts are recorded.

Everything is replicated: every MPI rank solves the same small ODE with the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from mfpde.tokens.adaptive import DOP853PI, explicit_phase, first_step_refused, stiff_phase
from mfpde.tokens.circle.force import FourierForce, series_length
from mfpde.tokens.circle.map import (
    CDF_POINTS,
    Labels,
    cdf_from_map,
    cdf_linear,
    cdf_local_hermite,
    cluster_masses,
    hermite_map,
    modes_cdf,
    modes_density,
    modes_labels,
    noise_labels,
)

__all__ = ["CDF_POINTS", "FlowMap", "FlowSolution", "FourierForce", "Labels", "cdf_from_map", "cdf_linear",
           "cdf_local_hermite",
           "cluster_masses", "hermite_map", "modes_cdf", "modes_density", "modes_labels", "noise_labels",
           "series_length"]

Array = npt.NDArray[np.float64]
#: Stiffness switch: h σ at or above this for SWITCH_STEPS accepted explicit steps in a row.
SWITCH_H_SIGMA, SWITCH_STEPS = 2.0, 8


@dataclass
class FlowSolution:
    """The flow map at the output depths.

    Attributes:
        t: output depths (T,); X: label positions (T, M), not wrapped; cdf: the CDF at the CDF_POINTS angles (T, 1024),
        shifted so that cdf[:, 0] = 0; reconstruction: "hermite" or "linear" per output; stats: integrator counts and
        the switch depth (``switch_t``, None if the solve stayed explicit).
    """

    t: Array
    X: Array
    cdf: Array
    reconstruction: list[str]
    stats: dict[str, Any] = field(default_factory=dict)


class FlowMap:
    """The flow-map ODE on the quantile labels of μ_0 (see the module).

    Args:
        labels: the initial labels (:func:`modes_labels`, :func:`noise_labels`).
        heads_a, heads_c: inverse temperatures β_h and weights c_h of the reduced head measure (H,).
        attention: "softmax" (SA) or "unnormalised" (USA).
    """

    def __init__(self, labels: Labels, heads_a: Array, heads_c: Array, attention: str = "unnormalised"):
        self.labels = labels
        self.M = labels.M
        self.force = FourierForce(heads_a, heads_c, attention, self.M)

    def _cdf(self, X: Array, L: Array | None) -> tuple[Array, str]:
        """(the CDF at the CDF_POINTS angles, shifted to F(0) = 0; the reconstruction used).

        "hermite" (spectral, while the labels resolve the map), "cubic" (local monotone Hermite with the exact
        derivatives, where they do not), "linear" (in the stiff phase, where the derivative is not carried, and for
        cell-wise data).
        """
        got = cdf_from_map(X, L) if L is not None and self.labels.smooth else None
        if got is not None:
            F, kind = got[0], "hermite"
        elif L is not None and self.labels.smooth:
            F, kind = cdf_local_hermite(X, L), "cubic"
        else:
            F, kind = cdf_linear(X), "linear"
        return F - F[0], kind

    def solve(self, t_out: Array, rtol: float = 1e-10, callback: Callable[[int, float], None] | None = None,
              deadline: float = math.inf) -> FlowSolution:
        """X_t and the CDF at the depths ``t_out`` (increasing, > 0; X = X_0 at t = 0 is not an output unless 0 is).

        Args:
            t_out: output depths (T,).
            rtol: the integrators' tolerance: the explicit phase holds each label's local error to 2π·rtol radians
                (L rides along uncontrolled), the stiff phase (LSODA on X) to rtol relative and absolute.
            callback: called as callback(i, t_i) after output i (progress).
            deadline: a time.process_time() after which the solve stops.

        Returns:
            The solution at every output depth.

        Raises:
            NumericalError: the explicit or the stiff integrator failed, a non-finite state, a stall
                (:class:`~mfpde.tokens.adaptive.Stall`) or the deadline (checked after each step of either); the
                message names the depth reached (the outputs reached are in ``exc.partial``, a FlowSolution).
        """
        from mfpde.errors import NumericalError

        t_out = np.asarray(t_out, float)
        M = self.M
        Xs: list[Array] = []
        Fs: list[Array] = []
        kinds: list[str] = []
        stats: dict[str, Any] = {"explicit": "DOP853 (PI step control)", "stiff": "LSODA (BDF, exact Jacobian)",
                                 "switch_t": None, "explicit_steps": 0, "stiff_steps": 0, "nfev": 0, "njev": 0,
                                 "nlu": 0}

        def record(X: Array, L: Array | None) -> None:
            F, kind = self._cdf(X, L)
            Xs.append(np.array(X))
            Fs.append(F)
            kinds.append(kind)
            if callback is not None:
                callback(len(Xs) - 1, float(t_out[len(Xs) - 1]))

        def fail(msg: str) -> NumericalError:
            stats["nfev"] = self.force.nfev
            e = NumericalError(msg)
            e.partial = FlowSolution(t_out[: len(Xs)], np.array(Xs).reshape(len(Xs), M),
                                     np.array(Fs).reshape(len(Fs), CDF_POINTS), kinds, stats)
            return e

        i = 0
        while i < len(t_out) and t_out[i] <= 0.0:
            record(self.labels.X0, self.labels.L0)
            i += 1
        Y = np.concatenate([self.labels.X0, self.labels.L0])
        t = 0.0
        if i < len(t_out):
            solver = DOP853PI(self.force.rhs, 0.0, Y, float(t_out[-1]), rtol=rtol, atol=2 * math.pi * rtol,
                              controlled=M, absolute=True)
            held = [0]

            def stiff_now(solver: DOP853PI) -> bool:  # h σ at or above SWITCH_H_SIGMA for SWITCH_STEPS steps
                sigma = max(0.0, -float(solver.f[M:].min()))  # the contraction rate, from the stored rhs
                held[0] = held[0] + 1 if solver.step_size * sigma >= SWITCH_H_SIGMA else 0
                return held[0] >= SWITCH_STEPS

            def first_step(msg: str) -> Exception:  # no step at the input's own velocity: the input is to blame
                return first_step_refused(float(np.max(self.force.beta, initial=0.0)), msg)

            i = explicit_phase(solver, t_out, i, lambda y: record(y[:M], y[M:]), stiff_now, stats, fail, "flow map",
                               deadline, None if self.force.softmax else first_step)
            t, Y = solver.t, solver.y
        if i < len(t_out):
            stiff_phase(lambda _t, x: self.force.velocity(x), lambda _t, x: self.force.jacobian(x), t, Y[:M], t_out, i,
                        rtol, rtol, lambda x: record(x, None), stats, fail, "flow map", deadline)
        stats["nfev"] = self.force.nfev
        return FlowSolution(t_out, np.array(Xs), np.array(Fs), kinds, stats)
