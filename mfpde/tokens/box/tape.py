"""The forward → adjoint hand-off of the token solvers: the taped steps of one forward solve, whole or checkpointed.

:class:`~mfpde.tokens.box.transport.TokenTransport` and :class:`~mfpde.tokens.box.batch.BatchTransport` (through
:func:`mfpde.tokens.rk.depth_step`) and the shallow layer append one :class:`~mfpde.tokens.rk.TapedStep` per sub-step
when asked for a tape; :class:`~mfpde.tokens.box.adjoint.DiscreteAdjoint` and ``BatchTransport.backward`` read them
back in reverse (theory §3, discrete adjoint) by :func:`mfpde.tokens.rk.step_transpose`.

A :data:`Tape` (a list) keeps every sub-step: its stage states and the velocity linearisation of each stage (the
softmax factors of every head, the larger part). :class:`CheckpointedTape` keeps them only while they fit in a
memory budget; beyond, it keeps the state before every k-th sub-step (uniform checkpoints in depth) and a small
record of every sub-step (its step size, rows, heads and layer), and the reverse pass replays each segment from its
checkpoint with these records before transposing it. The replay runs the same operations on the same inputs as the
forward pass (the CFL sub-step counts and the rows of each round are the recorded ones, not decided again; the
limiter sees the same states), so the gradient is bit for bit that of the whole tape. With one level of uniform
checkpoints every sub-step is replayed once whatever k is: the cost is one more forward solve, and k only trades
the checkpoints' memory (n/k states of C bytes) against one segment's (k taped sub-steps of T bytes), so k is the
one that minimises (n/k) C + k T: k = √(n C / T) (rounded, at least 1). The solver's forecast of n (the sub-steps
of the depth step under way times the depth steps left, :meth:`CheckpointedTape.forecast`) decides before the
first sub-step whether the whole tape fits; without one the tape is kept whole until it outgrows the budget.
Everything is non-dimensional except the bytes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

from mpi4py import MPI

import numpy as np

from mfpde.config.rules import parse_size
from mfpde.errors import ConfigError, InputRefused
from mfpde.tokens.rk import SubstepOperator, TapedStep, step

__all__ = ["TAPE_BUDGET_BYTES", "CheckpointedTape", "Tape", "TapeTooSmall", "TapedStep", "reverse", "tape_budget"]

#: Memory per tape for the velocity linearisations of the stages; beyond it the reverse pass re-evaluates the
#: velocity at the stages left without one (about one forward kernel more per stage).
TAPE_BUDGET_BYTES = 2**30

#: The forward → adjoint hand-off: the taped steps of one forward solve, in depth order.
Tape = list[TapedStep]

#: ``training.tape_memory = "auto"``: this fraction of the node's physical memory per rank on the node ...
AUTO_FRACTION = 1 / 16
#: ... and at most this many bytes (the tape of a 128×128 digits step fits below it with checkpoints).
AUTO_MAX_BYTES = 256 * 2**20
def tape_budget(value: str | int, comm: MPI.Comm) -> int:
    """The tape's memory budget per rank in bytes: ``value`` parsed, or for ``"auto"`` the node's share.

    ``"auto"``: :data:`AUTO_FRACTION` of the node's physical memory (``os.sysconf``) divided by the ranks of
    ``comm`` on this node, at most :data:`AUTO_MAX_BYTES`. Collective over ``comm`` (the ranks per node).
    """
    size = parse_size(value)
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    per_node = node.Get_size()
    node.Free()
    if size is not None:
        return size
    try:
        mem = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        mem = math.inf
    return int(min(AUTO_MAX_BYTES, AUTO_FRACTION * mem / per_node))


class TapeTooSmall(ConfigError):
    """``training.tape_memory`` cannot hold the checkpoints a depth solve needs (found while it runs). Exit 2.

    Raised in the first evaluation of a run, nothing computed yet, the run turns it into
    :class:`~mfpde.errors.InputRefused` (the output directory is restored: :mod:`mfpde.outdir`).
    """


def nbytes(obj: Any) -> int:
    """Memory held by a tape entry (arrays, tuples of them, objects with ``nbytes``), in bytes."""
    if obj is None:
        return 0
    if isinstance(obj, tuple | list):
        return sum(nbytes(o) for o in obj)
    n = getattr(obj, "nbytes", None)
    if n is not None:
        return int(n)
    return sum(nbytes(v) for v in vars(obj).values() if isinstance(v, np.ndarray)) if hasattr(obj, "__dict__") else 0


class CheckpointedTape:
    """A tape within a memory budget: whole while it fits, else uniform checkpoints in depth replayed in reverse.

    Used as the ``tape`` of :func:`mfpde.tokens.rk.depth_step` (``len``, ``append``, ``del tape[n:]`` and
    :meth:`mark`, called with the whole state before every sub-step); read back by :func:`reverse`.

    Args:
        budget: bytes per rank for the tape (checkpoints and the taped sub-steps of one segment).
        op: the solver's operator, for the replay (the same one the forward pass stepped with).
        state_bytes: bytes of one whole state on this rank.
        stages: the stages of the scheme.
        comm: the ranks that step together (their decisions agree: sizes are the maximum over them).
        depth_steps: the depth steps of the forward solve, for :meth:`forecast` (0: no forecast).

    Raises:
        ConfigError: ``training.tape_memory`` cannot hold a checkpoint and one sub-step's stage states (here), or
            (:meth:`mark`) the checkpoints of the sub-steps so far and one segment's stage states, half the budget
            each: about 2 √(n s) states for n sub-steps of s stages.

    Attributes:
        every: the checkpoint interval k in sub-steps, √(n C / T) for the n sub-steps expected (doubled when the
            checkpoints outgrow half the budget).
        expected: the sub-steps the last :meth:`forecast` expects in all (0: none yet).
        segments: segments replayed by the last reverse pass; recomputed: sub-steps replayed.
        peak_bytes: the largest estimated size of the tape (kept steps and checkpoints) so far, in bytes.
    """

    def __init__(self, budget: int, op: SubstepOperator, state_bytes: int, stages: int, comm: MPI.Comm,
                 depth_steps: int = 0) -> None:
        self.budget, self.op, self.comm, self.stages, self.depth_steps = budget, op, comm, stages, depth_steps
        self.C = comm.allreduce(int(state_bytes), op=MPI.MAX)
        need = self.C * (1 + stages)
        if budget < need:
            raise InputRefused(f"training.tape_memory: {budget} bytes cannot hold the tape's checkpoints: at least "
                              f"{need} bytes per rank (one state and one sub-step's {stages} stage states of "
                              f"{self.C} bytes); raise it or leave it \"auto\"")
        self.records: list[TapedStep] = []  # per sub-step: table, h, heads, layer, idx (no states, no velocities)
        self.checkpoints: dict[int, Any] = {}  # sub-step index → the whole state before it
        self.full: list[TapedStep] | None = []  # every taped sub-step, while the budget holds them
        self.T = 0  # estimated bytes of one taped sub-step (the first, over the ranks), set by the first append
        self.every = 1
        self.expected = 0
        self.segments = self.recomputed = 0
        self.peak_bytes = 0

    def __len__(self) -> int:
        """The sub-steps recorded."""
        return len(self.records)

    def __delitem__(self, key: slice) -> None:
        """``del tape[n:]``: forget the sub-steps from n on (a depth step redone with more sub-steps)."""
        n = key.start
        del self.records[n:]
        if self.full is not None:
            del self.full[n:]
        for m in [m for m in self.checkpoints if m >= n]:
            del self.checkpoints[m]

    def _bytes(self) -> int:
        return len(self.checkpoints) * self.C + (len(self.full) * self.T if self.full is not None else 0)

    def mark(self, state: Any) -> None:
        """Before sub-step ``len(self)``: keep a copy of the whole ``state`` if it starts a segment."""
        m = len(self.records)
        if m % self.every:
            return
        if (len(self.checkpoints) + 1) * self.C > self.budget // 2 and len(self.checkpoints) > 1:
            self.every *= 2  # thin out: keep every other checkpoint
            if self.every * self.stages * self.C > self.budget // 2:  # a segment's stage states would not fit
                need = int(2 * math.sqrt(m * self.stages) * self.C)  # min over k of (m/k + k s) C
                raise TapeTooSmall(f"training.tape_memory: {self.budget} bytes cannot hold the checkpoints of the "
                                  f"depth solve: at least {need} bytes per rank for its {m} sub-steps so far "
                                  f"(states of {self.C} bytes); raise it or leave it \"auto\"")
            self.checkpoints = {j: s for j, s in self.checkpoints.items() if j % self.every == 0}
            if m % self.every:
                return
        self.checkpoints[m] = state.copy()
        self.peak_bytes = max(self.peak_bytes, self._bytes())

    def forecast(self, step_no: int, substeps: int) -> None:
        """Before the sub-steps of depth step ``step_no`` (0-based): ``substeps`` each for the depth steps left.

        Called by :func:`~mfpde.tokens.rk.depth_step` with the largest sub-step count of the rows (the same on
        every rank). Where the sub-steps so far and those expected will not fit whole, the tape checkpoints from
        here on instead of filling the budget first.
        """
        if self.depth_steps <= 0:
            return
        self.expected = len(self.records) + substeps * max(1, self.depth_steps - step_no)
        if self.T:
            self._plan()

    @staticmethod
    def segment(n: int, C: int, T: int) -> int:
        """The checkpoint interval k in 1..n that minimises ⌈n/k⌉ C + k T (the smallest such k).

        n sub-steps, states of C bytes, taped sub-steps of T bytes: k ≈ r = √(n C / T), the checkpoints' memory and
        one segment's balanced. Searched over k ≤ 2r + 2 + C/T: beyond, k T alone exceeds the cost at ⌈r⌉.
        """
        T = max(T, 1)
        r = math.sqrt(n * C / T)
        k = np.arange(1, max(1, min(n, math.ceil(2 * r + 2 + C / T))) + 1, dtype=np.int64)
        return int(np.argmin(-(-n // k) * C + k * T)) + 1

    def _plan(self) -> None:
        """Give up the whole tape where the sub-steps expected will not fit; k from the sub-steps expected."""
        if self.full is None or self.expected * (self.T + self.C) <= self.budget:
            return
        self.full = None  # from now on: checkpoints (those kept so far stay: segments run between any two)
        self.every = self.segment(self.expected, self.C, self.T)

    def append(self, taped: TapedStep) -> None:
        """Record a sub-step; keep it whole while the budget holds every sub-step so far (and those forecast)."""
        if not self.records:
            self.T = self.comm.allreduce(nbytes(taped.states) + nbytes(taped.vel) + nbytes(taped.limiter),
                                         op=MPI.MAX)
            # checkpoints for the case the whole tape outgrows the budget: at least budget / T sub-steps then
            self.every = self.segment(max(self.expected, self.budget // max(self.T, 1)), self.C, self.T)
        self.records.append(TapedStep(taped.table, taped.h, taped.heads, (), (), (), taped.layer, taped.idx))
        if self.full is not None:
            self.full.append(taped)
            if self._bytes() > self.budget:
                self.full = None  # from now on: checkpoints, replayed in reverse
            else:
                self._plan()
        self.peak_bytes = max(self.peak_bytes, self._bytes())

    @property
    def whole(self) -> bool:
        """Whether every sub-step is kept (the reverse pass replays nothing)."""
        return self.full is not None

    def _replay(self, m0: int, m1: int) -> list[TapedStep]:
        """Sub-steps m0..m1−1 taped again from the checkpoint before m0 (the forward pass's operations)."""
        op, U = self.op, self.checkpoints.pop(m0)
        room = self.budget - len(self.checkpoints) * self.C
        seg: list[TapedStep] = []
        held = len(self.checkpoints) * self.C
        for n, rec in enumerate(self.records[m0:m1]):
            keep_vel = (n + 1) * self.T <= room  # by counts and the ranks' largest sizes: the same on every rank
            assert rec.idx is not None
            rows = op.take(U, rec.idx)
            vel = op.velocity(rows, rec.heads, True)
            new, _, taped = step(rec.table, op, rows, rec.h, rec.heads, vel, True,
                                 None if keep_vel else (lambda v: None))
            assert taped is not None
            seg.append(replace(taped, layer=rec.layer, idx=rec.idx))
            held += self.T if keep_vel else rec.table.stages * self.C
            self.peak_bytes = max(self.peak_bytes, held)
            U = op.put(U, rec.idx, new)
        self.segments += 1
        self.recomputed += m1 - m0
        return seg

    def reversed_steps(self) -> Iterator[TapedStep]:
        """The taped sub-steps, last first; segments replayed from their checkpoints and freed as they are read."""
        self.segments = self.recomputed = 0
        if self.full is not None:
            while self.full:
                yield self.full.pop()
            return
        starts = sorted(self.checkpoints)
        for m0, m1 in reversed(list(zip(starts, [*starts[1:], len(self.records)], strict=True))):
            seg = self._replay(m0, m1)
            while seg:
                yield seg.pop()

    def stats(self) -> dict[str, int]:
        """What the tape cost: sub-steps, segments replayed, sub-steps recomputed, estimated peak bytes, budget."""
        return {"substeps": len(self.records), "segments": self.segments, "recomputed_substeps": self.recomputed,
                "checkpoint_every": self.every if self.full is None else 0, "tape_bytes": self.peak_bytes,
                "budget_bytes": self.budget}


def reverse(tape: Tape | CheckpointedTape) -> Iterable[TapedStep]:
    """The taped sub-steps of a forward solve, last first (a checkpointed tape replays its segments)."""
    return tape.reversed_steps() if isinstance(tape, CheckpointedTape) else reversed(tape)
