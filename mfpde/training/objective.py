"""The training objective over the samples: risk, first variation, predictions and the NTK (theory §2, §3, §5.5).

    R(ρ) = (1/n) Σ_i ½ (ŷ^i − y^i)²,   ŷ^i = ∫ g dμ_T^i,   μ^i transported by V[μ; ρ] (theory §1.3 (F)),

with ∂R/∂c per layer block from the discrete adjoint of each sample's forward solve
(:mod:`mfpde.tokens.box.adjoint`). Samples are split over groups of ranks
(:class:`mfpde.tokens.box.problem.SampleGroups`); each group transports its share on its own token mesh, and the
sums over samples are one ``allreduce``.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterator

from mpi4py import MPI

import dolfinx.fem
import dolfinx.fem.petsc
import numpy as np
import numpy.typing as npt
import ufl

from mfpde.fields import FieldFiles
from mfpde.heads import HeadMeasure
from mfpde.params.theta import ThetaSpace, first_variation_values
from mfpde.sample_fields import write_sample_fields
from mfpde.tokens.box.adjoint import DiscreteAdjoint, Gradient, dyhat_dmu
from mfpde.tokens.box.batch import UNTAPED_CHUNK_BYTES, BatchDeclined, BatchTransport, batchable
from mfpde.tokens.box.data import Sample, initial_measures
from mfpde.tokens.box.problem import Problem
from mfpde.tokens.box.shallow import solve_shallow
from mfpde.tokens.box.tape import CheckpointedTape, tape_budget
from mfpde.tokens.box.transport import SampleOperator, Tape, TransportReport
from mfpde.tokens.rk import SubstepOperator

__all__ = ["BATCH_SAMPLES", "Objective", "Snapshots", "ntk_gram"]

Array = npt.NDArray[np.float64]
#: μ_t of a few samples at :attr:`Objective.snapshot_depths` (μ_0, μ_{T/2}, μ_T) as global quadrature
#: weights m_i μ_t(x_i), each shape (N_y,), for plots; keyed by sample index.
Snapshots = dict[int, tuple[Array, ...]]
#: Samples advanced together by the batched solver (:mod:`mfpde.tokens.box.batch`), at most; None: as many as
#: :data:`BATCH_BYTES` holds (:meth:`Objective.batch_size`).
BATCH_SAMPLES: int | None = None
#: Bytes per rank a batch's taped forward may take (estimate :meth:`Objective.batch_size`): about 9 samples of
#: ``demos/digits_deep.toml`` (DG0 on 32×32 cells, 17 heads, 8 depth steps; batches of about 10 were measured best
#: there on an idle machine, docs/benchmarks.md), 36 on 16×16 cells, and all 287 training images of the default's
#: single layer (16×16 cells, one head: 40 training steps took 3.7 s of CPU instead of 6.1 s in batches of 8,
#: the same risk to the last bit). On a loaded machine larger batches of the deep model were faster still
#: (16×16 cells, 60 images: batches of 8, 30, 60 took 2.9, 2.4, 1.4 s a gradient), at 3.4 MB of tape a sample.
BATCH_BYTES = 128 * 2**20
#: Bytes per P1 velocity vertex of a sample in an untaped batch (:meth:`Objective.batch_size`): the stage states,
#: rates and facet fluxes (measured with tracemalloc on ``demos/digits_deep.toml``, 128×128 cells: 22 values a
#: vertex a sample) and one head's moments (5 values); the moments of the other heads are summed by chunks of at
#: most :data:`~mfpde.tokens.box.batch.UNTAPED_CHUNK_BYTES` whatever the batch.
UNTAPED_BYTES_PER_VERTEX = 8 * 30


class Objective:
    """R(ρ), its first variation, ŷ and the NTK for the samples of a :class:`~mfpde.tokens.box.problem.Problem`.

    Args:
        pb: the problem (built with ``split_samples=True`` for a run).
    """

    def __init__(self, pb: Problem, tape_memory: str | int = "auto") -> None:
        self.pb, self.groups, self.tokens = pb, pb.groups, pb.tokens
        self.adjoint = DiscreteAdjoint(pb.tokens)
        self.dyhat = dyhat_dmu(pb.tokens, pb.g)
        self.batch = BatchTransport(pb.tokens) if batchable(pb.tokens) else None
        #: μ_0 of this group's samples per split as :func:`~mfpde.tokens.box.problem.build` filled them (list, row of
        #: sample i)
        self._mu0 = {id(s): (s, {i: j for j, i in enumerate(pb.groups.mine(s))}, pb.mu0[k])
                     for k, s in (("train", pb.train), ("test", pb.test)) if k in pb.mu0}
        self._pool: list[dolfinx.fem.Function] = []  # the Functions a batch's μ are set in (made once)
        #: The largest fraction of ∫μ_0 that left Ω over the samples of the last :meth:`gradient` or :meth:`predict`.
        self.max_outflow = 0.0
        self._outflow = 0.0
        #: Bytes per rank the adjoint's tape may hold (``training.tape_memory``; :mod:`mfpde.tokens.box.tape`).
        self.tape_memory = tape_budget(tape_memory, pb.comm)
        #: What the tapes of the last gradient cost (:meth:`CheckpointedTape.stats`, summed over batches; peak bytes).
        self.tape_stats: dict[str, int] = {}

    def _initial(self, samples: list[Sample], chunk: list[int]) -> list[dolfinx.fem.Function]:
        """Functions set to μ_0 of ``samples[i]`` for i in chunk (this group's), one per sample, reused by each batch.

        The densities of the problem's training and held-out samples come from the stacks
        :func:`~mfpde.tokens.box.problem.build` filled (:attr:`mfpde.tokens.box.problem.Problem.mu0`); other samples, or
        a split too large to keep, are filled for the chunk (:func:`~mfpde.tokens.box.data.initial_measures`, collective
        over the token group).
        """
        hit = self._mu0.get(id(samples))
        if hit is not None and hit[0] is samples:
            U = hit[2][[hit[1][i] for i in chunk]]
        else:
            U = initial_measures([samples[i] for i in chunk], self.tokens.W)
        while len(self._pool) < len(chunk):
            self._pool.append(dolfinx.fem.Function(self.tokens.W, name="mu_T"))
        for u, row in zip(self._pool, U, strict=False):
            u.x.array[:] = row
        return self._pool[:len(chunk)]

    def batch_size(self, n_a: list[int], taped: bool = True) -> int:
        """Samples per batch: :data:`BATCH_SAMPLES` if set, else as many as :data:`BATCH_BYTES` holds (at least 1).

        A sample's taped forward is estimated as 32 n (1 + N_a) (3 K + 1) bytes (n token dofs): K depth steps of
        three SSP stages (one for the single layer), each keeping arrays of the state's size per head (N_a: the
        largest number of heads of a layer block); measured 3.4 MB against the estimate's 3.7 MB on 16×16 cells,
        17 heads, 8 depth steps. An untaped forward keeps no tape: :data:`UNTAPED_BYTES_PER_VERTEX_HEAD` (1 + N_a)
        bytes per velocity vertex a sample (whatever K and N_a) against :data:`BATCH_BYTES` less the chunk of
        head moments :data:`~mfpde.tokens.box.batch.UNTAPED_CHUNK_BYTES`. Depends on global sizes only: the ranks
        of a group agree.
        """
        if BATCH_SAMPLES is not None:
            return BATCH_SAMPLES
        if not taped:
            per = UNTAPED_BYTES_PER_VERTEX * self.tokens.velocity.x.shape[0]
            return max(1, (BATCH_BYTES - UNTAPED_CHUNK_BYTES) // per)
        steps = 1 if self.pb.shallow else self.pb.sec.depth.steps
        n_dofs = self.tokens.W.dofmap.index_map.size_global  # a batched group is one rank
        return max(1, BATCH_BYTES // (32 * n_dofs * (1 + max(n_a, default=0)) * (3 * steps + 1)))

    def forward(self, u: dolfinx.fem.Function, heads: list[HeadMeasure], tape: Tape | CheckpointedTape | None = None,
                keep: list[Array] | None = None) -> TransportReport:
        """μ_0 ↦ μ_T in place for ρ given per layer block (theory §1.3 (F), or the shallow layer of §2).

        ``keep``, if given, receives the weights of μ_t at the intermediate :attr:`snapshot_depths`.
        """
        sec = self.pb.sec
        if self.pb.shallow:
            assert not isinstance(tape, CheckpointedTape)  # one step: :meth:`_tape` gives a list
            return solve_shallow(self.tokens, u, heads[0], sec.depth.T, self.pb.g, tape)
        return self.tokens.solve(u, heads, sec.depth.T, sec.depth.steps, self.pb.g, tape=tape,
                                 outflow_tol=sec.tokens.outflow_tol, callback=self._keeper(keep))

    @property
    def snapshot_depths(self) -> list[float]:
        """The depths t of the snapshots: 0, T/2 (nearest depth step; deep models with ≥ 2 steps) and T."""
        T, steps = self.pb.sec.depth.T, self.pb.sec.depth.steps
        return [0.0, T] if self.pb.shallow or steps < 2 else [0.0, T * (steps // 2) / steps, T]

    @property
    def _snapshot_step(self) -> int | None:
        """The depth step of the middle snapshot (T/2) of :attr:`snapshot_depths`, or None (two snapshots)."""
        return self.pb.sec.depth.steps // 2 if len(self.snapshot_depths) == 3 else None

    def _keeper(self, keep: list[Array] | None) -> Callable[[int, float, dolfinx.fem.Function], None] | None:
        half = self._snapshot_step
        if keep is None or half is None:
            return None

        def callback(k: int, t: float, u: dolfinx.fem.Function) -> None:
            if k == half:
                keep.append(self.tokens.quad.gather(u))
        return callback

    def _output(self, i: int, mus: list[Array] | None, u: dolfinx.fem.Function, kept: dict[int, Array] | None,
                snapshots: Snapshots | None, snapshot: Container[int]) -> None:
        """Keep μ_T of sample i for the fields (in ``kept``) and μ_t for plots if i is wanted."""
        if kept is not None:
            kept[i] = u.x.array.copy()
        if snapshots is not None and i in snapshot and mus is not None:
            snapshots[i] = (*mus, self.tokens.quad.gather(u))

    def _write_fields(self, fields: FieldFiles | None, tag: str, n: int, kept: dict[int, Array]) -> None:
        """Write μ_T of the n samples into ``fields/mu_T_<tag>.bp`` (sample i at "time" i). Collective."""
        if fields is not None:
            with self.groups.collective_failure():  # a full disk in the writing group: ConfigError on every rank
                write_sample_fields(self.groups, self.tokens.W, fields, f"mu_T{'_' + tag if tag else ''}", n, kept)

    def _solves(self, samples: list[Sample], heads: list[HeadMeasure], taped: bool, snapshot: Container[int]
                ) -> Iterator[tuple[int, float, list[Array] | None, Array, dolfinx.fem.Function]]:
        """The forward solve (and with ``taped`` the reverse pass for ∂ŷ/∂c) of this group's samples.

        Yields, per sample i: (i, ŷ^i, [μ_t weights at the snapshot depths before T] if i in ``snapshot``,
        ∂ŷ^i/∂c per layer block stacked (n_layers, N_a) (empty without ``taped``), μ_T as a Function).
        Batches of at most :data:`BATCH_SAMPLES` (of even sizes) advance together where
        :func:`~mfpde.tokens.box.batch.batchable`; a batch the batched solver declines is solved sample by sample.
        """
        tokens = self.tokens
        n_a = [len(h.a) for h in heads]
        if taped:
            self.tape_stats = {}
        mine = self.groups.mine(samples)
        size = self.batch_size(n_a, taped) if self.batch is not None else 1
        n_chunks = -(-len(mine) // size)  # chunks of even sizes: 10 samples are 5 + 5, not 8 + 2
        for chunk in (mine[j * len(mine) // n_chunks: (j + 1) * len(mine) // n_chunks] for j in range(n_chunks)):
            us = self._initial(samples, chunk)
            if self.batch is not None:
                try:  # the batch is solved before anything is yielded: a decline leaves ``us`` as filled
                    yield from self._batched(chunk, us, heads, taped, snapshot, n_a)
                    continue
                except BatchDeclined:
                    pass
            for i, u in zip(chunk, us, strict=True):
                mus = [tokens.quad.gather(u)] if i in snapshot else None
                tape = self._tape(SampleOperator(tokens), u.x.array.nbytes) if taped else None
                rep = self.forward(u, heads, tape, mus)
                self._outflow = max(self._outflow, rep.outflow / rep.mass_0 if rep.mass_0 > 0 else 0.0)
                dy = np.zeros((0, 0))
                if tape is not None:
                    _, dyhat_dc = self.adjoint.backward(tape, self.dyhat, self.pb.n_layers)
                    self._count(tape)
                    dy = np.stack([g if len(g) else np.zeros(k) for g, k in zip(dyhat_dc, n_a, strict=True)])
                yield i, rep.yhat, mus, dy, u

    def _batched(self, chunk: list[int], us: list[dolfinx.fem.Function], heads: list[HeadMeasure], taped: bool,
                 snapshot: Container[int], n_a: list[int]
                 ) -> Iterator[tuple[int, float, list[Array] | None, Array, dolfinx.fem.Function]]:
        """:meth:`_solves` for one batch by :class:`~mfpde.tokens.box.batch.BatchTransport` (raises BatchDeclined)."""
        bt, sec = self.batch, self.pb.sec
        assert bt is not None
        U = np.stack([u.x.array for u in us])
        keep = [j for j, i in enumerate(chunk) if i in snapshot]
        mus: dict[int, list[Array]] = {j: [bt.gathered(U[j])] for j in keep}
        half = self._snapshot_step

        def callback(k: int, t: float, Uk: Array) -> None:
            if k == half:
                for j in keep:
                    mus[j].append(bt.gathered(Uk[j]))
        tape = self._tape(bt, U.nbytes) if taped else None
        if self.pb.shallow:
            assert not isinstance(tape, CheckpointedTape)
            reps = bt.solve_shallow(U, heads[0], sec.depth.T, self.pb.g, tape=tape)
        else:
            reps = bt.solve(U, heads, sec.depth.T, sec.depth.steps, self.pb.g, callback=callback, tape=tape,
                            outflow_tol=sec.tokens.outflow_tol)
        D = (bt.backward(tape, np.tile(self.dyhat, (len(U), 1)), len(heads), n_a, costate=False)[1]  # ∂R/∂c only
             if tape is not None else [])
        self._count(tape)
        # ∂ŷ/∂c of the batch as (S, layers, N_a) once (one view a sample) where the layer blocks' head counts agree
        DY = np.stack(D, axis=1) if D and len({Dk.shape for Dk in D}) == 1 else None
        for j, (i, u) in enumerate(zip(chunk, us, strict=True)):
            u.x.array[:] = U[j]
            self._outflow = max(self._outflow, reps[j].outflow / reps[j].mass_0 if reps[j].mass_0 > 0 else 0.0)
            dy = DY[j] if DY is not None else (np.stack([Dk[j] for Dk in D]) if D else np.zeros((0, 0)))
            yield i, reps[j].yhat, mus.get(j), dy, u

    def _tape(self, op: SubstepOperator, state_bytes: int) -> Tape | CheckpointedTape:
        """A tape for one forward solve within ``training.tape_memory`` (the single layer's one step: a list)."""
        if self.pb.shallow:
            return []
        return CheckpointedTape(self.tape_memory, op, state_bytes, self.tokens.scheme.stages, self.tokens.comm,
                                self.pb.sec.depth.steps)

    def _count(self, tape: Tape | CheckpointedTape | None) -> None:
        """Add a reversed tape's cost to :attr:`tape_stats`."""
        if isinstance(tape, CheckpointedTape):
            for k, v in tape.stats().items():
                self.tape_stats[k] = max(self.tape_stats.get(k, 0), v) if k in ("tape_bytes", "budget_bytes",
                                                                              "checkpoint_every") else (
                    self.tape_stats.get(k, 0) + v)

    def predict(self, samples: list[Sample], heads: list[HeadMeasure], fields: FieldFiles | None = None,
                tag: str = "", snapshots: Snapshots | None = None, snapshot: Container[int] = ()) -> Array:
        """ŷ^i for the samples (forward only), shape (n,), the same on every rank.

        Args:
            samples: the input measures.
            heads: ρ per layer block, reduced.
            fields: the job's fields; if given, μ_T of every sample is written to ``fields/mu_T_<tag>.bp`` (VTX,
                sample i at "time" i: :func:`mfpde.sample_fields.write_sample_fields`).
            tag: the file-name tag of the fields (the split: ``train``, ``test``).
            snapshots: where μ_t at :attr:`snapshot_depths` (gathered quadrature weights) of the samples in
                ``snapshot`` are stored, on this rank's group (see :meth:`gather_snapshots`).
            snapshot: the indices of the samples to keep snapshots of.

        Raises:
            NumericalError: a solve failed in some group (raised on every rank).
        """
        y = np.zeros(len(samples))
        self._outflow = 0.0
        kept: dict[int, Array] = {}
        with self.groups.collective_failure():
            for i, yhat, mus, _, u in self._solves(samples, heads, False, snapshot):
                y[i] = yhat if self.groups.tcomm.rank == 0 else 0.0
                self._output(i, mus, u, kept if fields is not None else None, snapshots, snapshot)
        self._write_fields(fields, tag, len(samples), kept)
        self.max_outflow = self.pb.comm.allreduce(self._outflow, op=MPI.MAX)
        return self.pb.comm.allreduce(y, op=MPI.SUM)

    def gradient(self, heads: list[HeadMeasure], per_sample: bool = False, fields: FieldFiles | None = None,
                 tag: str = "", snapshots: Snapshots | None = None, snapshot: Container[int] = ()) -> Gradient:
        """R(ρ), ŷ and ∂R/∂c per layer block by forward + discrete adjoint over the training samples (theory §3).

        Args:
            heads: ρ per layer block, reduced with every a of the Θ grid (``keep_zero``).
            per_sample: also return ∂ŷ^i/∂c per sample (for the NTK, theory §5.5).
            fields: as in :meth:`predict`.
            tag: as in :meth:`predict`.
            snapshots: as in :meth:`predict`.
            snapshot: as in :meth:`predict`.

        Returns:
            The gradient, reduced over all rank groups (the same on every rank).

        Raises:
            NumericalError: a solve failed in some group (raised on every rank).
        """
        pb = self.pb
        n = len(pb.train)
        yhat = np.zeros(n)
        D = [np.zeros(len(h.a)) for h in heads]
        Dy = [np.zeros((n, len(h.a))) for h in heads] if per_sample else None
        self._outflow = 0.0
        kept: dict[int, Array] = {}
        with self.groups.collective_failure():
            for i, yi, mus, dy, u in self._solves(pb.train, heads, True, snapshot):
                r = yi - pb.train[i].target
                if self.groups.tcomm.rank == 0:
                    yhat[i] = yi
                    for k in range(pb.n_layers):
                        if len(D[k]):
                            D[k] += r * dy[k] / n
                            if Dy is not None:
                                Dy[k][i] = dy[k]
                self._output(i, mus, u, kept if fields is not None else None, snapshots, snapshot)
        self._write_fields(fields, tag, n, kept)
        comm = pb.comm
        self.max_outflow = comm.allreduce(self._outflow, op=MPI.MAX)
        yhat = comm.allreduce(yhat, op=MPI.SUM)
        D = [comm.allreduce(x, op=MPI.SUM) for x in D]
        if Dy is not None:
            Dy = [comm.allreduce(x, op=MPI.SUM) for x in Dy]
        targets = np.array([s.target for s in pb.train])
        return Gradient(float(0.5 * np.mean((yhat - targets) ** 2)), yhat, D, Dy)

    def gather_snapshots(self, snapshots: Snapshots, root: int = 0) -> Snapshots:
        """The snapshots of every rank group, merged on rank ``root`` (empty on the other ranks). Collective."""
        mine = snapshots if self.groups.tcomm.rank == 0 else {}
        parts = self.pb.comm.gather(mine, root=root)
        merged: Snapshots = {}
        for p in parts or []:
            merged.update(p)
        return merged


def ntk_gram(theta: ThetaSpace, rhos: list[dolfinx.fem.Function], heads: list[HeadMeasure], Dy: list[Array]
             ) -> Array:
    """The mean-field NTK Gram matrix K_ρ[i, j] = Σ_ℓ ∫ ∇_θ δŷ^i/δρ^ℓ · ∇_θ δŷ^j/δρ^ℓ dρ^ℓ (theory §5.5).

    δŷ^i/δρ(θ) = v(θ) ∂ŷ^i/∂c(a(θ)) comes from the discrete adjoint of each sample; its θ-gradient is
    that of the P1 interpolant on Θ, and the integral is assembled exactly for P1 ρ: K = Fᵀ A_ρ F with the
    weighted stiffness matrix A_ρ = ∫ ρ ∇φ_p·∇φ_q dθ (one form compiled, one matrix per block).

    Args:
        theta: the Θ space.
        rhos: ρ per layer block.
        heads: their reduced head measures.
        Dy: per layer block, ∂ŷ^i/∂c, shape (n, N_a) (:meth:`Objective.gradient` with ``per_sample``).

    Returns:
        K, shape (n, n), symmetric positive semi-definite, the same on every rank.
    """
    n = Dy[0].shape[0] if Dy else 0
    K = np.zeros((n, n))
    u, v = ufl.TrialFunction(theta.V), ufl.TestFunction(theta.V)
    for k, rho in enumerate(rhos):
        # K^ℓ = Fᵀ A_ρ F with A_ρ = ∫ ρ ∇φ_p·∇φ_q assembled once (one form, one matrix), F the δŷ^i/δρ^ℓ values
        A = dolfinx.fem.petsc.assemble_matrix(dolfinx.fem.form(rho * ufl.inner(ufl.grad(u), ufl.grad(v)) * ufl.dx))
        A.assemble()
        fs, Afs = [], []
        for i in range(n):
            f = dolfinx.fem.Function(theta.V)
            f.x.array[:] = first_variation_values(theta.family, heads[k], Dy[k][i], theta.x)
            Af = A.createVecLeft()
            A.mult(f.x.petsc_vec, Af)
            fs.append(f)
            Afs.append(Af)
        for i in range(n):
            for j in range(i, n):
                K[i, j] += fs[j].x.petsc_vec.dot(Afs[i])  # a collective PETSc dot: the same on every rank
                K[j, i] = K[i, j]
        for Af in Afs:
            Af.destroy()
        A.destroy()
    return K
