"""Tokens on S² in Lagrangian form: μ_t = X_t # μ_0 on a quadrature of μ_0 (theory §9 (iv)).

The continuity equation ∂_t μ + ∇_S·(μ v[μ]) = 0 is solved by its characteristics: the measure μ_0 is replaced by
the quadrature measure Σ_j w_j μ_0(ξ_j) δ_{ξ_j} and every point moves with the velocity of the current measure,

    dX_j/dt = v[Σ_k m_k δ_{X_k}](X_j),   m_j = w_j μ_0(ξ_j)  (fixed: each particle carries its mass).

Design, and why:

* **Quadrature**: the product rule of :func:`~mfpde.tokens.sphere.data.product_quadrature` (N Gauss–Legendre
  nodes in cos ϑ × 2N longitudes, exact for degree ≤ 2N − 1): the moments μ̂_ℓm of polynomial data μ_0 are
  exact while ℓ + deg μ_0 ≤ 2N − 1, and the velocity's integral ∫ e^{β x·y} y dμ_0(y) is exact up to the Funk–Hecke
  tail of degree > 2N − 1 − deg μ_0 (i_ℓ(β) falls faster than geometrically), so the discrete particle system
  converges spectrally in N while the flow map stays smooth. Lebedev rules (``scipy.integrate.lebedev_rule``)
  need ~2/3 of the points for the same degree but exist only for fixed degrees; the product rule takes any N.
* **Velocity**: any :class:`~mfpde.tokens.sphere.velocity.SphereVelocity` (the direct sum, the harmonic kernel,
  a prescribed rotation). The particles are replicated on every rank; each rank tells the velocity its share
  (a contiguous slice, so a collective velocity sums every particle once) and evaluates it at all particles:
  the communication is the velocity's alone, and every rank integrates the same ODE with the same numbers.
* **Staying on S²**: the state X ∈ R^{3n} is integrated with the velocity extended off the sphere as
  V(X) = v(X/|X|), homogeneous of degree 0 and tangent (X·V = 0), so |X_j| is an exact first integral of the ODE
  being integrated: no constraint is imposed inside a step (which would break the Runge–Kutta order conditions
  and the dense output), and the integrator's drift of |X_j| is of the size of its own error. Outputs are
  X_j/|X_j|: the nearest-point retraction moves a point by ||X_j| − 1| ≤ |X_j − x_j| (x_j the exact point, on
  S²), so the projected error is at most twice the unprojected one and the order is kept.
* **Integrators**: DOP853 (order 8, PI step control: :mod:`mfpde.tokens.adaptive`) while non-stiff; Hairer's
  stiffness test of DOP853 (the Lipschitz estimate ρ = |f(y₁) − f(y₁₂)|/|y₁ − y₁₂| of the last two stages,
  both at t + h; a step is stiff when h ρ > 6.1, DOP853's stability boundary; the count of stiff steps is reset
  only by 6 non-stiff accepted steps in a row, and 15 switch, as in Hairer's DOP853: a step size that hovers at
  the boundary, above it one step and below the next, switches too) hands over to ODEPACK's LSODA (scipy's
  ``LSODA``, stepped with its dense output) once clusters collapse. For attention its Newton iterations take the
  exact Jacobian of the direct sum (:mod:`~mfpde.tokens.sphere.jacobian`, O(n²), whatever the kernel); another
  velocity gets finite differences. Measured at USA β = 20 (128 particles, harmonic kernel L = 39), from the
  switch to t = 0.1: LSODA with the exact Jacobian 15 s of CPU and 4062 velocity evaluations, BDF with it 152 s
  (32730: its step sizes change at nearly every step, each a new LU and often a new Jacobian), BDF with finite
  differences (3n velocities a Jacobian) did not pass t = 6e-4 in 240 s. The switch depth and both integrators'
  step counts are recorded.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mpi4py import MPI

import numpy as np
import numpy.typing as npt
import scipy.sparse
import scipy.sparse.csgraph
import scipy.spatial

from mfpde.tokens.adaptive import DOP853PI, explicit_phase, first_step_refused, stiff_phase
from mfpde.tokens.sphere.data import modes_density, product_quadrature
from mfpde.tokens.sphere.jacobian import attention_heads, attention_jacobian
from mfpde.tokens.sphere.sht import analysis
from mfpde.tokens.sphere.velocity import SphereVelocity

__all__ = ["CLUSTER_ANGLE", "SWITCH_H_RHO", "SWITCH_RESET", "SWITCH_STEPS", "SphereFlow", "SphereFlowSolution",
           "clusters", "degree_powers"]

Array = npt.NDArray[np.float64]
#: Hairer's stiffness test for DOP853: SWITCH_STEPS accepted steps with h ρ above SWITCH_H_RHO switch, the count
#: reset by SWITCH_RESET non-stiff accepted steps in a row.
SWITCH_H_RHO, SWITCH_STEPS, SWITCH_RESET = 6.1, 15, 6
#: Particles closer than this angle (radians) are linked into one cluster.
CLUSTER_ANGLE = 1e-3


def degree_powers(x: Array, w: Array, L: int) -> tuple[Array, Array]:
    """(μ̂_ℓm = Σ_j w_j Y_ℓm(x_j), shape ((L+1)²,); the powers Σ_m μ̂_ℓm², shape (L+1,)) of a weighted point set."""
    c = np.asarray(analysis(L, x, np.asarray(w, float)), dtype=np.float64)
    p = np.array([np.sum(c[ll * ll:(ll + 1) ** 2] ** 2) for ll in range(L + 1)])
    return c, p


def clusters(x: Array, w: Array, angle: float = CLUSTER_ANGLE, min_mass: float = 1e-2) -> tuple[Array, Array]:
    """(masses (k,), centres (k, 3)) of the clusters of the weighted points x (n, 3), w (n,), heaviest first.

    A cluster is a connected component of the graph linking points closer than ``angle`` (chord 2 sin(angle/2)),
    with at least two points and a mass ≥ ``min_mass`` times the total; its centre is the normalised mean of its
    points weighted by mass.
    """
    x, w = np.asarray(x, float).reshape(-1, 3), np.asarray(w, float).ravel()
    pairs = scipy.spatial.cKDTree(x).query_pairs(2 * math.sin(angle / 2), output_type="ndarray")
    n = len(x)
    g = scipy.sparse.coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    k, lab = scipy.sparse.csgraph.connected_components(g, directed=False)
    count = np.bincount(lab, minlength=k)
    mass = np.bincount(lab, weights=w, minlength=k)
    keep = np.flatnonzero((count >= 2) & (mass >= min_mass * w.sum()))
    keep = keep[np.argsort(-mass[keep], kind="stable")]
    centres = np.array([np.sum(x[lab == c] * w[lab == c, None], axis=0) for c in keep]).reshape(-1, 3)
    centres /= np.maximum(np.linalg.norm(centres, axis=1, keepdims=True), 1e-300)
    return mass[keep], centres


@dataclass
class SphereFlowSolution:
    """The particles at the output depths.

    Attributes:
        t: output depths (T,); x: particle positions, unit vectors (T, n, 3); w: particle masses (n,), sum 1;
        coefficients: μ̂_ℓm of the particle measure (T, (L+1)²), index ℓ² + ℓ + m; power: Σ_m μ̂_ℓm² (T, L+1);
        clusters: per output, (masses (k,), centres (k, 3)) by :func:`clusters`; solve_cpu_s: time.process_time of
        the solve alone (s); integrator: the integrators, their counts and the switch depth ``switch_t`` (None if the
        solve stayed explicit).
    """

    t: Array
    x: Array
    w: Array
    coefficients: Array
    power: Array
    clusters: list[tuple[Array, Array]]
    solve_cpu_s: float = 0.0
    integrator: dict[str, Any] = field(default_factory=dict)


class SphereFlow:
    """The flow map on the quadrature particles of μ_0 (see the module).

    Args:
        velocity: the velocity field (collective ``update``, then ``velocity``), e.g. DirectVelocity.
        nodes: N, the quadrature's Gauss–Legendre nodes in cos ϑ (2N² particles, exact to degree 2N − 1).
        rtol: the integrators' relative tolerance (absolute: rtol on the unit-vector components).
        L: the degree of the reported coefficients and powers.
        cluster_angle: the linking angle of :func:`clusters` (radians).

    Raises:
        ValueError: nodes < 1, rtol ≤ 0 or L < 0.
    """

    def __init__(self, velocity: SphereVelocity, nodes: int = 16, rtol: float = 1e-10, L: int = 16,
                 cluster_angle: float = CLUSTER_ANGLE) -> None:
        if nodes < 1 or not rtol > 0 or L < 0:
            raise ValueError(f"need nodes >= 1, rtol > 0, L >= 0; got {nodes}, {rtol}, {L}")
        self.v, self.N, self.rtol, self.L, self.cluster_angle = velocity, int(nodes), float(rtol), int(L), cluster_angle
        comm = getattr(velocity, "comm", MPI.COMM_SELF)
        self._rank, self._size = comm.rank, comm.size
        self.nfev = 0

    def particles(self, modes_or_density: list[list[float]] | Callable[[Array], Array]) -> tuple[Array, Array]:
        """(ξ_j (n, 3), m_j = w_j μ_0(ξ_j) normalised to mass 1 (n,)) for sphere modes or a density μ_0(x (n, 3)).

        Raises:
            ValueError: bad modes, or a density negative at a node (a particle cannot carry negative mass).
        """
        xi, wq = product_quadrature(self.N)
        if callable(modes_or_density):
            mu = np.asarray(modes_or_density(xi), dtype=float).reshape(-1)
        else:
            mu = modes_density(modes_or_density, xi)
        if np.any(mu < 0) or not np.all(np.isfinite(mu)):
            raise ValueError("the initial density is negative or not finite at a quadrature node")
        m = wq * mu
        return xi, m / m.sum()

    def field(self, X: Array, m: Array) -> Array:
        """The velocity (n, 3) of the particles X (n, 3) (any radius: v(X/|X|), see the module) of masses m."""
        x = X / np.sqrt(np.einsum("ij,ij->i", X, X))[:, None]
        if self._size == 1:
            self.v.update(x, m)
        else:
            part = np.array_split(np.arange(len(x)), self._size)[self._rank]
            self.v.update(x[part], m[part])
        self.nfev += 1
        return np.asarray(self.v.velocity(x), dtype=float)

    def solve(self, modes_or_density: list[list[float]] | Callable[[Array], Array], T: float,
              outputs: int | Sequence[float] | Array, callback: Callable[[int, float], None] | None = None,
              deadline: float = math.inf) -> SphereFlowSolution:
        """The particles, μ̂_ℓm, degree powers and clusters at the output depths.

        Args:
            modes_or_density: ``sphere_modes`` [[ℓ, m, a], ...] or a density μ_0(x (n, 3)) -> (n,).
            T: the final depth (> 0).
            outputs: a count k (the depths T/k, 2T/k, ..., T) or the depths themselves (increasing, in [0, T];
                0 gives the initial particles).
            callback: called as callback(i, t_i) after output i (progress).
            deadline: a time.process_time() after which the solve stops (checked after each step).

        Raises:
            ValueError: bad data, T ≤ 0, or outputs outside [0, T].
            InputRefused: unnormalised attention whose first step at t = 0 fails (the input's own velocity).
            NumericalError: an integrator failed, a non-finite state, a stall (:class:`~mfpde.tokens.adaptive.Stall`)
                or the deadline; ``exc.partial`` holds the
                outputs reached (a SphereFlowSolution).
        """
        from mfpde.errors import NumericalError

        if not T > 0:
            raise ValueError(f"T must be > 0, got {T}")
        if isinstance(outputs, int | np.integer):
            t_out = T * np.arange(1, int(outputs) + 1) / int(outputs)
        else:
            t_out = np.asarray(outputs, dtype=float).ravel()
        if len(t_out) == 0 or np.any(np.diff(t_out) <= 0) or t_out[0] < 0 or t_out[-1] > T:
            raise ValueError(f"outputs must be increasing depths in [0, {T}]")
        X0, m = self.particles(modes_or_density)
        n = len(m)
        cpu0 = time.process_time()
        self.nfev = 0
        xs: list[Array] = []
        heads = attention_heads(self.v)
        stats: dict[str, Any] = {"explicit": "DOP853 (PI step control)", "stiff": "LSODA (finite-difference Jacobian)"
                                 if heads is None else "LSODA (exact Jacobian of the direct sum)",
                                 "switch_t": None, "explicit_steps": 0, "stiff_steps": 0, "nfev": 0, "njev": 0,
                                 "nlu": 0}

        def rhs(_t: float, y: Array) -> Array:
            return self.field(y.reshape(n, 3), m).ravel()

        def record(y: Array) -> None:
            X = y.reshape(n, 3)
            xs.append(X / np.linalg.norm(X, axis=1, keepdims=True))
            if callback is not None:
                callback(len(xs) - 1, float(t_out[len(xs) - 1]))

        def result(ts: Array) -> SphereFlowSolution:
            stats["nfev"] = self.nfev
            cpu = time.process_time() - cpu0
            got = [degree_powers(x, m, self.L) for x in xs]
            co = np.array([g[0] for g in got]).reshape(len(xs), (self.L + 1) ** 2)
            pw = np.array([g[1] for g in got]).reshape(len(xs), self.L + 1)
            cl = [clusters(x, m, self.cluster_angle) for x in xs]
            return SphereFlowSolution(ts, np.array(xs).reshape(len(xs), n, 3), m, co, pw, cl, cpu, stats)

        def fail(msg: str) -> NumericalError:
            e = NumericalError(msg)
            e.partial = result(t_out[: len(xs)])
            return e

        i = 0
        while i < len(t_out) and t_out[i] <= 0.0:
            record(X0.ravel())
            i += 1
        t, y = 0.0, X0.ravel().copy()
        comm = getattr(self.v, "comm", MPI.COMM_SELF)  # every rank of it integrates the same ODE: one decision
        room = comm.allreduce(stiff_room(comm.size), op=MPI.MIN)
        if i < len(t_out):
            solver = DOP853PI(rhs, 0.0, y, float(t_out[-1]), rtol=self.rtol, atol=self.rtol)
            count = {"held": 0, "calm": 0}

            def stiff_now(solver: DOP853PI) -> bool:  # Hairer's test, unless the dense Jacobian does not fit
                if solver.step_size * _lipschitz(solver) > SWITCH_H_RHO:
                    count["held"], count["calm"] = count["held"] + 1, 0
                else:
                    count["calm"] += 1
                    count["held"] = 0 if count["calm"] >= SWITCH_RESET else count["held"]
                if count["held"] >= SWITCH_STEPS and stiff_bytes(n) > room:
                    if stats.get("stiff_refused") is None:  # stepping on explicitly: slower, but within memory
                        gib = stiff_bytes(n) / 2**30
                        stats["stiff_refused"] = (f"stiff at t = {solver.t:.6g}, but the dense Jacobian of {n} "
                                                  f"particles ({gib:.3g} GiB) does not fit this node")
                    return False
                return count["held"] >= SWITCH_STEPS

            def first_step(msg: str) -> Exception:  # at the input's own velocity: the input is to blame
                return first_step_refused(max(float(p.beta) for p in getattr(self.v, "parts", [self.v])), msg)

            unnormalised = getattr(self.v, "attention", "") == "unnormalised"
            i = explicit_phase(solver, t_out, i, record, stiff_now, stats, fail, "sphere flow", deadline,
                               first_step if unnormalised else None)
            t, y = solver.t, solver.y
        if i < len(t_out):
            jac = None if heads is None else (lambda _t, y: attention_jacobian(y.reshape(n, 3), m, heads))
            stiff_phase(rhs, jac, t, y, t_out, i, self.rtol, self.rtol, record, stats, fail, "sphere flow", deadline)
        return result(t_out)


def stiff_bytes(n: int) -> int:
    """Bytes of the stiff phase's dense Jacobian of n particles (3n × 3n) and LSODA's LU of it."""
    return 2 * 8 * (3 * n) ** 2


def stiff_room(ranks_on_node: int = 1) -> float:
    """The bytes the stiff phase may take on a rank: half the node's memory over the ranks (each holds a copy)."""
    from mfpde.limits import node_memory_bytes

    return 0.5 * node_memory_bytes() / max(ranks_on_node, 1)


def _lipschitz(solver: DOP853PI) -> float:
    """Hairer's estimate ρ = |f(y₁) − f(y₁₂)|/|y₁ − y₁₂| of DOP853's last step (y₁₂ its 12th stage, at t + h)."""
    h = solver.h_previous
    K = solver.K
    y12 = solver.y_old + h * (solver.A[11, :11] @ K[:11])
    den = float(np.linalg.norm(solver.y - y12))
    return float(np.linalg.norm(K[12] - K[11])) / den if den > 0 else 0.0
