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
the checkpoints' memory (n/k states) against one segment's (k sub-steps); k is the largest segment that half the
budget holds. Everything is non-dimensional except the bytes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

from mpi4py import MPI

import numpy as np

from mfpde.config_rules import parse_size
from mfpde.errors import ConfigError, InputRefused
from mfpde.tokens.rk import SubstepOperator, TapedStep, step

__all__ = ["TAPE_BUDGET_BYTES", "CheckpointedTape", "Tape", "TapedStep", "reverse", "tape_budget"]

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

    Raises:
        ConfigError: ``training.tape_memory`` cannot hold a checkpoint and one sub-step's stage states (here), or
            (:meth:`mark`) the checkpoints of the sub-steps so far and one segment's stage states, half the budget
            each: about 2 √(n s) states for n sub-steps of s stages.

    Attributes:
        every: the checkpoint interval k in sub-steps (doubled when the checkpoints outgrow half the budget).
        segments: segments replayed by the last reverse pass; recomputed: sub-steps replayed.
        peak_bytes: the largest estimated size of the tape (kept steps and checkpoints) so far, in bytes.
    """

    def __init__(self, budget: int, op: SubstepOperator, state_bytes: int, stages: int, comm: MPI.Comm) -> None:
        self.budget, self.op, self.comm, self.stages = budget, op, comm, stages
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
                raise ConfigError(f"training.tape_memory: {self.budget} bytes cannot hold the checkpoints of the "
                                  f"depth solve: at least {need} bytes per rank for its {m} sub-steps so far "
                                  f"(states of {self.C} bytes); raise it or leave it \"auto\"")
            self.checkpoints = {j: s for j, s in self.checkpoints.items() if j % self.every == 0}
            if m % self.every:
                return
        self.checkpoints[m] = state.copy()
        self.peak_bytes = max(self.peak_bytes, self._bytes())

    def append(self, taped: TapedStep) -> None:
        """Record a sub-step; keep it whole while the budget holds every sub-step so far."""
        if not self.records:
            self.T = self.comm.allreduce(nbytes(taped.states) + nbytes(taped.vel) + nbytes(taped.limiter),
                                         op=MPI.MAX)
            self.every = max(1, (self.budget // 2) // max(self.T, 1))
        self.records.append(TapedStep(taped.table, taped.h, taped.heads, (), (), (), taped.layer, taped.idx))
        if self.full is not None:
            self.full.append(taped)
            if self._bytes() > self.budget:
                self.full = None  # from now on: checkpoints, replayed in reverse
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
