"""Samples in batches: the DG0 token transport and its discrete adjoint for S input measures at once.

The same scheme as :class:`~mfpde.tokens.box.transport.TokenTransport` for k = 0 on a tensor-grid box (theory §1.3
(F): upwind finite volumes, SSP-RK3 in depth, CFL sub-steps; theory §3: the discrete adjoint of
:mod:`mfpde.tokens.box.adjoint`), with the states of S samples stacked as rows of arrays of shape (S, n_cells): the
attention kernels are then one matrix product per head for the whole batch
(:class:`~mfpde.tokens.box.separable.TensorSoftmax` with a batch axis) and the facet sums one sparse product
(:class:`~mfpde.tokens.box.upwind.UpwindFiniteVolume`), instead of one small product and a Python round per sample.
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
from typing import Any

import numpy as np
import numpy.typing as npt

from mfpde.errors import NumericalError
from mfpde.heads import HeadMeasure
from mfpde.tokens import rk
from mfpde.tokens.attention import active_heads
from mfpde.tokens.box.readout import Readout
from mfpde.tokens.box.separable import TensorSoftmax
from mfpde.tokens.box.tape import TAPE_BUDGET_BYTES, CheckpointedTape, reverse
from mfpde.tokens.box.transport import TokenTransport, TransportReport
from mfpde.tokens.stepping import batch_moments, cfl_step, check_depth_step

__all__ = ["BatchDeclined", "BatchTransport", "BatchVelocity", "batchable"]

Array = npt.NDArray[np.float64]
Index = npt.NDArray[np.int64]


class BatchDeclined(Exception):
    """The batch cannot be advanced together (see :meth:`BatchTransport.velocity`): solve its samples one by one."""


def batchable(tokens: TokenTransport) -> bool:
    """Whether :class:`BatchTransport` applies to this token solver (DG0, tensor grid in d = 2, one rank)."""
    vel = tokens.velocity
    return (tokens.degree == 0 and tokens.comm.size == 1 and vel.d == 2 and vel.grid is not None
            and tokens.quad.grid_axes is not None and tokens.fv is not None)


#: Bytes the moments of the heads of one untaped velocity may take (:meth:`BatchTransport.velocity`: chunks of
#: heads beyond; about 5 values a velocity grid point, head and row while the products run).
UNTAPED_CHUNK_BYTES = 16 * 2**20

#: The batched velocity: the field at the P1 vertices (S, n_vertices d) and its softmax factors (None: no heads).
BatchVelocity = tuple[Array, TensorSoftmax | None]


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
        self._no_costate: Array | None = None  # the stage state whose F'ᵀ forms ∂(p·F)/∂c only (see backward)

    # -- the pieces of one stage -------------------------------------------------------------------
    def weights(self, U: Array) -> Array:
        """The quadrature weights m_i μ_i of each row in local node order, shape (S, N_y)."""
        return U[:, self.cells] * self.tokens.quad.local_m

    def velocity(self, U: Array, heads: HeadMeasure, linearize: bool) -> BatchVelocity:
        """V[μ; ρ] at the P1 vertices for every row of U, shape (S, n_vertices d), and its softmax factors.

        The factors (3 N_a values per vertex and row, the larger part) only with ``linearize``, for the tape;
        without, the heads are summed by chunks whose moments take at most :data:`UNTAPED_CHUNK_BYTES`.

        Raises:
            BatchDeclined: a row without mass, or heads without shared factors (solve those samples one by one).
        """
        a, c = active_heads(heads, linearize)
        S = len(U)
        if not len(a):
            return np.zeros((S, self.vel.x.size)), None
        Wg = np.zeros((S, int(np.prod(self.grid_shape))))
        Wg[:, self.cell_grid] = self.weights(U)
        f = self.vel.separable_factors(a)
        if f is None or not np.all(Wg.sum(axis=1) > 0):
            raise BatchDeclined("no shared separable factors for these heads" if f is None else "a row without mass")
        assert self.vel.grid is not None and self.tokens.quad.grid_axes is not None
        Wg = Wg.reshape(S, *self.grid_shape)
        if linearize:
            ts = TensorSoftmax(self.vel.grid, self.tokens.quad.grid_axes, Wg, a, f)
            return ts.velocity(c)[self.vertex].reshape(S, -1), ts  # V (S, n_vertices, d) blocked
        # untaped: V = Σ_k c_k m_k by chunks of heads, the moments of one chunk at a time (not kept)
        per_head = 5 * 8 * S * int(np.prod(self.vgrid_shape))  # Z̃, m and the left products while they run
        chunk = max(1, UNTAPED_CHUNK_BYTES // per_head)
        V = None
        for lo in range(0, len(a), chunk):
            part = TensorSoftmax(self.vel.grid, self.tokens.quad.grid_axes, Wg, a[lo:lo + chunk],
                                 f.part(lo, lo + chunk)).velocity(c[lo:lo + chunk])
            V = part if V is None else np.add(V, part, out=V)
        assert V is not None
        return V[self.vertex].reshape(S, -1), None

    def rate(self, U: Array, vel: BatchVelocity) -> tuple[Array, Array]:
        """dU/dt = M⁻¹ L(U, V) per row and the outflow rate of each, shapes (S, n) and (S,)."""
        out = np.zeros_like(U)
        r = self.fv.rate(U, self.fv.normal_flux(vel[0]), out)
        return out * self.inv_m, r

    def max_stable_dt(self, vel: BatchVelocity) -> Array:
        """Per row, the largest Δt with Δt · outflow(cell)/|cell| ≤ cfl, shape (S,) (inf: no outflow)."""
        V = vel[0]
        out = self.fv.cell_outflow(self.fv.normal_flux(V))[:, : len(self.tokens.cell_vol)]
        ratio = (out / self.tokens.cell_vol).max(axis=1) if out.shape[1] else np.zeros(len(V))
        return cfl_step(ratio, self.tokens.cfl)

    def limit(self, U: Array) -> None:
        """DG0 needs no limiter: upwind finite volumes are positive under the CFL bound."""
        return None

    def take(self, U: Array, idx: Index) -> Array:
        """The rows ``idx``."""
        return U[idx]

    def put(self, U: Array, idx: Index, rows: Array) -> Array:
        """Rows ``idx`` of U replaced, in place."""
        U[idx] = rows
        return U

    def step_size(self, h: Array) -> Array:
        """The rows' step sizes as a column, shape (S_r, 1)."""
        return h[:, None]

    def budget(self, vel: BatchVelocity) -> BatchVelocity | None:
        """A stage's velocity for the tape, or None once the tape's budget is spent (re-evaluated in reverse)."""
        V, ts = vel
        if ts is None or self._tape_bytes + ts.nbytes + V.nbytes > TAPE_BUDGET_BYTES:
            return None
        self._tape_bytes += ts.nbytes + V.nbytes
        return vel

    # -- forward ------------------------------------------------------------------------------------
    def solve(self, U: Array, heads: list[HeadMeasure], T: float, steps: int, g: Readout | None = None,
              callback: Callable[[int, float, Array], None] | None = None,
              tape: list[rk.TapedStep] | CheckpointedTape | None = None,
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
            U[:], out, nsub = rk.depth_step(self.tokens.scheme, self, U, dt, hk, k, k * dt, tape, layer,
                                            self.budget if isinstance(tape, list) else None)
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
        return self._reports(U, mass0, outflow, min_mu, nsub_total, g)

    def solve_shallow(self, U: Array, heads: HeadMeasure, T: float, g: Readout | None = None,
                      tape: list[rk.TapedStep] | None = None) -> list[TransportReport]:
        """The single-layer model for every row of U, in place: μ_T = μ_0 + T M⁻¹L(μ_0; V[μ_0; ρ]) (theory §2).

        The batched :func:`~mfpde.tokens.box.shallow.solve_shallow` (one explicit step, no CFL sub-steps: the shallow
        layer is its own forward map, not a solve of (F)).

        Raises:
            NumericalError: non-finite values in a row.
            BatchDeclined: as :meth:`velocity`.
        """
        self._tape_bytes = 0
        mass0 = self.weights(U).sum(axis=1)
        keep = tape is not None
        vel0 = self.velocity(U, heads, keep)
        U[:], r, taped = rk.step(rk.FORWARD_EULER, self, U.copy(), T, heads, vel0, keep, self.budget, limited=False)
        if tape is not None:
            assert taped is not None
            tape.append(taped)
        if not np.all(np.isfinite(U)):
            raise NumericalError("non-finite token density in the shallow layer")
        return self._reports(U, mass0, r, U.min(axis=1), np.ones(len(U), np.int64), g)

    def _reports(self, U: Array, mass0: Array, outflow: Array, min_mu: Array, nsub: npt.NDArray[np.int64],
                 g: Readout | None) -> list[TransportReport]:
        """One report per row of U (as :meth:`TokenTransport.solve` reports it), the moments in stacked products."""
        x = self.tokens.quad.points
        mass, mean, cov, yhat = batch_moments(self.weights(U)[:, self.tokens.quad.order], x,
                                              g(x) if g is not None else None)
        return [TransportReport(float(mass0[s]), float(mass[s]), float(outflow[s]), float(min_mu[s]), mean[s].tolist(),
                                cov[s].tolist(), float(yhat[s]), int(nsub[s])) for s in range(len(U))]

    # -- the discrete adjoint -------------------------------------------------------------------------
    def _Ft(self, v: Array, heads: HeadMeasure, P: Array, lin: BatchVelocity | None
            ) -> tuple[Array, Array]:
        """F'(v)ᵀ p per row (shape (S, n)) and ∂(p·F)/∂c (shape (S, N_a)) at the stage states v (theory §3)."""
        V, ts = lin if lin is not None else self.velocity(v, heads, True)
        assert ts is not None
        S = len(v)
        Z = P * self.inv_m  # M symmetric: M⁻ᵀ = M⁻¹
        r = np.zeros_like(v)
        xi = np.zeros((S, self.vel.x.size))
        skip = self._no_costate is v  # the first step's stage 0 with ``backward(costate=False)``: g_c only
        self.fv.transpose(v, Z, self.fv.normal_flux(V), None if skip else r, xi)
        Xi = np.zeros((S, *self.vgrid_shape, self.vel.d))
        Xi[self.vertex] = xi.reshape(S, -1, self.vel.d)
        gW, gc = ts.vjp(heads.c, Xi, costate=not skip)
        if not skip:
            r[:, self.cells] += self.tokens.quad.local_m * gW.reshape(S, -1)[:, self.cell_grid]
        return r, gc

    def backward(self, tape: list[rk.TapedStep] | CheckpointedTape, P_T: Array, n_layers: int, n_a: list[int],
                 costate: bool = True) -> tuple[Array | None, list[Array]]:
        """The reverse pass (the batched :meth:`~mfpde.tokens.box.adjoint.DiscreteAdjoint.backward`, DG0: no limiter).

        Args:
            tape: from :meth:`solve` or :meth:`solve_shallow` with ``tape``.
            P_T: the costates at depth T, shape (S, n_cells).
            n_layers: number of layer blocks.
            n_a: the number of distinct a of each block's head measure.
            costate: form P_0 = ∂R/∂μ_0. False (the training, which takes ∂R/∂c only): the first depth step's
                first stage (of a one-step tape: the single-layer model) skips the state part of F'ᵀ and the
                attention's ∂/∂W, whose only use is P_0, and P_0 is returned as None; ∂R/∂c is bit-identical.

        Returns:
            (P_0 or None, [∂R/∂c per layer block, shape (S, N_a)]).
        """
        P = P_T.copy()
        D = [np.zeros((len(P), k)) for k in n_a]
        skip = not costate and isinstance(tape, list) and len(tape) == 1
        for st in reverse(tape):
            self._no_costate = st.states[0] if skip else None
            rows = np.arange(len(P)) if st.idx is None else st.idx
            P[rows], gc = rk.step_transpose(self, st, P[rows])
            D[st.layer][rows] += gc
            del st  # let a checkpointed tape's next replay go without this step's linearisation alive
        self._no_costate = None
        return (None if skip else P), D

    def rate_transpose(self, state: Array, heads: HeadMeasure, vel: BatchVelocity | None, costate: Array
                       ) -> tuple[Array, Array]:
        """F'(v)ᵀ p and ∂(p · F)/∂c per row: the :class:`~mfpde.tokens.rk.DepthAdjoint` of the batch."""
        return self._Ft(state, heads, costate, vel)

    def limit_transpose(self, record: None, costate: Array) -> Array:
        """DG0: no limiter, the identity."""
        return costate

    def gathered(self, u: Array) -> Array:
        """The quadrature weights of one row in the global order of :meth:`TokenQuadrature.gather`, shape (N_y,)."""
        return self.weights(u[None])[0][self.tokens.quad.order]
