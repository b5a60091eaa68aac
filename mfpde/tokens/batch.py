"""Samples in batches: the DG0 token transport and its discrete adjoint for S input measures at once.

The same scheme as :class:`~mfpde.tokens.transport.TokenTransport` for k = 0 on a tensor-grid box (theory §1.3
(F): upwind finite volumes, SSP-RK3 in depth, CFL sub-steps; theory §3: the discrete adjoint of
:mod:`mfpde.tokens.adjoint`), with the states of S samples stacked as rows of arrays of shape (S, n_cells): the
attention kernels are then one matrix product per head for the whole batch
(:class:`~mfpde.tokens.separable.TensorSoftmax` with a batch axis) and the facet sums one sparse product
(:class:`~mfpde.tokens.upwind.UpwindFiniteVolume`), instead of one small product and a Python round per sample.
Issue 12: the samples of a rank group advance together in depth.

Each sample keeps its own number of CFL sub-steps per depth step (its velocity, its bound): the sub-steps of a
depth step run in rounds, round j advancing the samples that need more than j sub-steps, each with its own step
size. So a sample's result does not depend on which samples share its batch, up to the rounding of the matrix
products (BLAS may block a product of another width differently). The DG0 mass matrix is diagonal (the cell
areas): M⁻¹ is a division here, where the per-sample solver calls the KSP of ``mfpde_token_``.

The single-layer model (theory §2: one explicit step μ_0 + T M⁻¹L(μ_0; V), :meth:`BatchTransport.solve_shallow`)
is batched the same way, its discrete adjoint one transposed step.

Applies (:func:`batchable`) to DG0 on a box in d = 2 whose token mesh lives on one rank (every rank group of one
rank, as ``mfpde run`` splits samples) and to heads whose separable factors over the whole box exist; elsewhere
:class:`~mfpde.training.objective.Objective` solves sample by sample. Everything is non-dimensional.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from mfpde.errors import NumericalError
from mfpde.tokens.attention import HeadMeasure
from mfpde.tokens.readout import Readout
from mfpde.tokens.separable import TensorSoftmax
from mfpde.tokens.stepping import MAX_SUBSTEPS, cfl_step, check_depth_step, quadrature_moments, substeps_error
from mfpde.tokens.tape import TAPE_BUDGET_BYTES
from mfpde.tokens.transport import TokenTransport, TransportReport

__all__ = ["BatchDeclined", "BatchEuler", "BatchStep", "BatchTransport", "batchable"]

Array = npt.NDArray[np.float64]
Index = npt.NDArray[np.int64]


class BatchDeclined(Exception):
    """The batch cannot be advanced together (see :meth:`BatchTransport.velocity`): solve its samples one by one."""


def batchable(tokens: TokenTransport) -> bool:
    """Whether :class:`BatchTransport` applies to this token solver (DG0, tensor grid in d = 2, one rank)."""
    vel = tokens.velocity
    return (tokens.degree == 0 and tokens.comm.size == 1 and vel.d == 2 and vel.grid is not None
            and tokens.quad.grid_axes is not None and tokens.fv is not None)


@dataclass(frozen=True)
class BatchStep:
    """One taped round of SSP-RK3 sub-steps of the samples ``idx`` of a batch (the batched :class:`RK3Step`).

    Attributes:
        idx: the rows of the batch that took this sub-step, shape (S_r,).
        h: their sub-step sizes, shape (S_r,).
        heads: the reduced head distribution the step used.
        v0, v1, v2: the three stage states, shape (S_r, n_cells).
        layer: the layer block whose ρ the step used.
        lin: per stage, the velocity field (S_r, n_vertices d) and its softmax factors, or None where the
            tape's budget was spent (the reverse pass re-evaluates them).
    """

    idx: Index
    h: Array
    heads: HeadMeasure
    v0: Array
    v1: Array
    v2: Array
    layer: int
    lin: tuple[tuple[Array, TensorSoftmax] | None, ...]


@dataclass(frozen=True)
class BatchEuler:
    """The taped single explicit layer of the shallow model for a batch (the batched :class:`EulerStep`).

    Attributes:
        h: the layer's depth T (one step), the same for every row.
        heads: the reduced head distribution.
        v0: μ_0 of the rows, shape (S, n_cells).
        lin: the velocity field (S, n_vertices d) and its softmax factors, or None (re-evaluated).
        layer: the layer block whose ρ the step used (the single layer: 0).
    """

    h: float
    heads: HeadMeasure
    v0: Array
    lin: tuple[Array, TensorSoftmax] | None
    layer: int = 0


class BatchTransport:
    """DG0 token transport and discrete adjoint of a batch of samples (theory §1.3 (F), §3).

    Args:
        tokens: the per-sample solver whose mesh, facet arrays, quadrature and velocity grid are shared.

    Raises:
        ValueError: :func:`batchable` is false for ``tokens``.
    """

    def __init__(self, tokens: TokenTransport) -> None:
        if not batchable(tokens):
            raise ValueError("BatchTransport needs DG0 on a d = 2 tensor-grid box on one rank")
        self.tokens, self.vel, q = tokens, tokens.velocity, tokens.quad
        assert tokens.fv is not None and q.grid_axes is not None and self.vel.grid is not None
        self.fv = tokens.fv
        self.inv_m = 1.0 / tokens.m  # the DG0 mass matrix is diag(|cell|)
        inv = np.empty_like(q.order)
        inv[q.order] = np.arange(len(q.order))
        self.cells = q.local_dofs  # the DG0 dof of each quadrature node
        self.cell_grid = q.flat_index[inv]  # ... and its place on the tensor grid
        self.grid_shape = q.grid_axes.shape
        self.vgrid_shape = self.vel.grid.shape
        self.vertex: tuple[Any, ...] = (slice(None), *self.vel.index)  # [:, grid index of every P1 vertex]
        self._tape_bytes = 0

    # -- the pieces of one stage -------------------------------------------------------------------
    def weights(self, U: Array) -> Array:
        """The quadrature weights m_i μ_i of each row in local node order, shape (S, N_y)."""
        return U[:, self.cells] * self.tokens.quad.local_m

    def velocity(self, U: Array, heads: HeadMeasure, linearize: bool) -> tuple[Array, TensorSoftmax | None]:
        """V[μ; ρ] at the P1 vertices for every row of U, shape (S, n_vertices d), and its softmax factors.

        Raises:
            BatchDeclined: a row without mass, or heads without shared factors (solve those samples one by one).
        """
        keep = np.ones(len(heads.a), bool) if linearize else np.abs(heads.c) > 1e-16 * np.abs(heads.c).sum()
        a, c = heads.a[keep], heads.c[keep]
        S = len(U)
        if not len(a):
            return np.zeros((S, self.vel.x.size)), None
        Wg = np.zeros((S, int(np.prod(self.grid_shape))))
        Wg[:, self.cell_grid] = self.weights(U)
        f = self.vel.separable_factors(a)
        if f is None or not np.all(Wg.sum(axis=1) > 0):
            raise BatchDeclined("no shared separable factors for these heads" if f is None else "a row without mass")
        assert self.vel.grid is not None and self.tokens.quad.grid_axes is not None
        ts = TensorSoftmax(self.vel.grid, self.tokens.quad.grid_axes, Wg.reshape(S, *self.grid_shape), a, f)
        V = ts.velocity(c)[self.vertex]  # (S, n_vertices, d)
        return V.reshape(S, -1), ts

    def rate(self, U: Array, V: Array) -> tuple[Array, Array]:
        """dU/dt = M⁻¹ L(U, V) per row and the outflow rate of each, shapes (S, n) and (S,)."""
        out = np.zeros_like(U)
        r = self.fv.rate(U, self.fv.normal_flux(V), out)
        return out * self.inv_m, r

    def max_stable_dt(self, V: Array) -> Array:
        """Per row, the largest Δt with Δt · outflow(cell)/|cell| ≤ cfl, shape (S,) (inf: no outflow)."""
        out = self.fv.cell_outflow(self.fv.normal_flux(V))[:, : len(self.tokens.cell_vol)]
        ratio = (out / self.tokens.cell_vol).max(axis=1) if out.shape[1] else np.zeros(len(V))
        return cfl_step(ratio, self.tokens.cfl)

    def _lin(self, V: Array, ts: TensorSoftmax | None) -> tuple[Array, TensorSoftmax] | None:
        if ts is None or self._tape_bytes + ts.nbytes + V.nbytes > TAPE_BUDGET_BYTES:
            return None
        self._tape_bytes += ts.nbytes + V.nbytes
        return V, ts

    # -- forward ------------------------------------------------------------------------------------
    def ssp_rk3(self, U: Array, V: Array, ts: TensorSoftmax | None, h: Array, heads: HeadMeasure,
                idx: Index, layer: int, tape: list[BatchStep | BatchEuler] | None) -> tuple[Array, Array]:
        """One SSP-RK3 sub-step of size h[s] for each row (velocity V set for U); returns (U_new, outflow (S,))."""
        taped = tape is not None
        hc = h[:, None]
        du, r = self.rate(U, V)
        o1 = h * r
        v1 = U + hc * du
        V1, ts1 = self.velocity(v1, heads, taped)
        du, r = self.rate(v1, V1)
        v2 = 0.75 * U + 0.25 * (v1 + hc * du)
        o2 = 0.25 * (o1 + h * r)
        V2, ts2 = self.velocity(v2, heads, taped)
        du, r = self.rate(v2, V2)
        new = U / 3.0 + 2.0 / 3.0 * (v2 + hc * du)
        if tape is not None:
            lin = (self._lin(V, ts), self._lin(V1, ts1), self._lin(V2, ts2))
            tape.append(BatchStep(idx, h, heads, U, v1, v2, layer, lin))
        return new, 2.0 / 3.0 * (o2 + h * r)

    def _substeps(self, U: Array, V: Array, ts: TensorSoftmax | None, heads: HeadMeasure, dt: float,
                  nsub: npt.NDArray[np.int64], layer: int, tape: list[BatchStep | BatchEuler] | None
                  ) -> tuple[Array, Array]:
        """Nsub[s] sub-steps of size dt/nsub[s] for every row, in rounds; returns (outflow (S,), broken (S,) bool).

        U is advanced in place. A row whose velocity breaks its CFL bound on the way is flagged in ``broken``
        (the caller redoes the depth step with twice its sub-steps).
        """
        outflow = np.zeros(len(U))
        broken = np.zeros(len(U), bool)
        for j in range(int(nsub.max())):
            idx = np.flatnonzero(nsub > j)
            h = dt / nsub[idx]
            if j > 0:
                V, ts = self.velocity(U[idx], heads, tape is not None)
                broken[idx] = h > self.max_stable_dt(V) * (1 + 1e-9)
                if broken.any():
                    return outflow, broken
            U[idx], o = self.ssp_rk3(U[idx], V, ts, h, heads, idx, layer, tape)
            outflow[idx] += o
        return outflow, broken

    def solve(self, U: Array, heads: list[HeadMeasure], T: float, steps: int, g: Readout | None = None,
              callback: Callable[[int, float, Array], None] | None = None,
              tape: list[BatchStep | BatchEuler] | None = None,
              outflow_tol: float = math.inf) -> list[TransportReport]:
        """Transport the rows of U (μ_0 of each sample, DG0 values, shape (S, n_cells)) to μ_T, in place.

        Args as :meth:`TokenTransport.solve` (``heads`` one per layer block; ``callback(step, t, U)``).

        Raises:
            NumericalError: non-finite values, mass balance, outflow beyond ``outflow_tol``, CFL blow-up (any row).
        """
        per_layer, dt = steps // len(heads), T / steps
        self._tape_bytes = 0
        mass0 = self.weights(U).sum(axis=1)
        outflow, nsub_total = np.zeros(len(U)), np.zeros(len(U), np.int64)
        min_mu = U.min(axis=1)
        for k in range(steps):
            hk, layer = heads[k // per_layer], k // per_layer
            start, tape_len = U.copy(), len(tape) if tape is not None else 0
            V, ts = self.velocity(U, hk, tape is not None)
            nsub = np.maximum(1, np.ceil(dt / self.max_stable_dt(V) - 1e-12)).astype(np.int64)
            while True:
                out, broken = self._substeps(U, V, ts, hk, dt, nsub, layer, tape)
                if not broken.any():
                    break
                nsub[broken] *= 2  # as the per-sample solver: equal sub-steps, twice as many where broken
                if nsub.max() > MAX_SUBSTEPS:
                    raise substeps_error(k + 1, k * dt)
                U[:] = start
                if tape is not None:
                    del tape[tape_len:]
                V, ts = self.velocity(U, hk, tape is not None)
            outflow += out
            nsub_total += nsub
            t = (k + 1) * dt
            mass = self.weights(U).sum(axis=1)
            for s in range(len(U)):
                check_depth_step(k + 1, t, bool(np.all(np.isfinite(U[s]))), float(mass[s]), float(outflow[s]),
                                 float(mass0[s]), outflow_tol)
            min_mu = np.minimum(min_mu, U.min(axis=1))
            if callback is not None:
                callback(k + 1, t, U)
        return [self._report(U[s], float(mass0[s]), float(outflow[s]), float(min_mu[s]), int(nsub_total[s]), g)
                for s in range(len(U))]

    def solve_shallow(self, U: Array, heads: HeadMeasure, T: float, g: Readout | None = None,
                      tape: list[BatchStep | BatchEuler] | None = None) -> list[TransportReport]:
        """The single-layer model for every row of U, in place: μ_T = μ_0 + T M⁻¹L(μ_0; V[μ_0; ρ]) (theory §2).

        The batched :func:`~mfpde.tokens.shallow.solve_shallow` (one explicit step, no CFL sub-steps: the shallow
        layer is its own forward map, not a solve of (F)).

        Raises:
            NumericalError: non-finite values in a row.
            BatchDeclined: as :meth:`velocity`.
        """
        self._tape_bytes = 0
        mass0 = self.weights(U).sum(axis=1)
        V, ts = self.velocity(U, heads, tape is not None)
        if tape is not None:
            tape.append(BatchEuler(T, heads, U.copy(), self._lin(V, ts)))
        du, r = self.rate(U, V)
        U += T * du
        if not np.all(np.isfinite(U)):
            raise NumericalError("non-finite token density in the shallow layer")
        return [self._report(U[s], float(mass0[s]), T * float(r[s]), float(U[s].min()), 1, g) for s in range(len(U))]

    def _report(self, u: Array, mass0: float, outflow: float, min_mu: float, nsub: int, g: Readout | None
                ) -> TransportReport:
        mass, mean, cov, yhat = quadrature_moments(self.gathered(u), self.tokens.quad.points, g)
        return TransportReport(mass0, mass, outflow, min_mu, mean.tolist(), cov.tolist(), yhat, nsub)

    # -- the discrete adjoint -------------------------------------------------------------------------
    def _Ft(self, v: Array, heads: HeadMeasure, P: Array, lin: tuple[Array, TensorSoftmax] | None
            ) -> tuple[Array, Array]:
        """F'(v)ᵀ p per row (shape (S, n)) and ∂(p·F)/∂c (shape (S, N_a)) at the stage states v (theory §3)."""
        V, ts = lin if lin is not None else self.velocity(v, heads, True)
        assert ts is not None
        S = len(v)
        Z = P * self.inv_m  # M symmetric: M⁻ᵀ = M⁻¹
        r = np.zeros_like(v)
        xi = np.zeros((S, self.vel.x.size))
        self.fv.transpose(v, Z, self.fv.normal_flux(V), r, xi)
        Xi = np.zeros((S, *self.vgrid_shape, self.vel.d))
        Xi[self.vertex] = xi.reshape(S, -1, self.vel.d)
        gW, gc = ts.vjp(heads.c, Xi)
        r[:, self.cells] += self.tokens.quad.local_m * gW.reshape(S, -1)[:, self.cell_grid]
        return r, gc

    def backward(self, tape: list[BatchStep | BatchEuler], P_T: Array, n_layers: int, n_a: list[int]
                 ) -> tuple[Array, list[Array]]:
        """The reverse pass (the batched :meth:`~mfpde.tokens.adjoint.DiscreteAdjoint.backward`, DG0: no limiter).

        Args:
            tape: from :meth:`solve` or :meth:`solve_shallow` with ``tape``.
            P_T: the costates at depth T, shape (S, n_cells).
            n_layers: number of layer blocks.
            n_a: the number of distinct a of each block's head measure.

        Returns:
            (P_0, [∂R/∂c per layer block, shape (S, N_a)]).
        """
        P = P_T.copy()
        D = [np.zeros((len(P), k)) for k in n_a]
        for st in reversed(tape):
            if isinstance(st, BatchEuler):  # the shallow model's single explicit layer: p₀ = (I + hF'(v₀))ᵀp₁
                f0, c0 = self._Ft(st.v0, st.heads, P, st.lin)
                P += st.h * f0
                D[st.layer] += st.h * c0
                continue
            h = st.h[:, None]
            q3 = P[st.idx]
            f2, c2 = self._Ft(st.v2, st.heads, q3, st.lin[2])
            q2 = 2.0 / 3.0 * (q3 + h * f2)
            f1, c1 = self._Ft(st.v1, st.heads, q2, st.lin[1])
            q1 = 0.25 * (q2 + h * f1)
            f0, c0 = self._Ft(st.v0, st.heads, q1, st.lin[0])
            P[st.idx] = q3 / 3.0 + 0.75 * q2 + q1 + h * f0
            D[st.layer][st.idx] += h * (2.0 / 3.0 * c2 + 0.25 * c1 + c0)
        return P, D

    def gathered(self, u: Array) -> Array:
        """The quadrature weights of one row in the global order of :meth:`TokenQuadrature.gather`, shape (N_y,)."""
        return self.weights(u[None])[0][self.tokens.quad.order]
