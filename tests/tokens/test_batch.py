"""Samples in batches (mfpde.tokens.box.batch, issue 12): the batched DG0 solver and its adjoint against the per-sample
solver, which is a separate implementation of the same discrete map (DOLFINx Functions, the PETSc mass solve, the
facet arrays one sample at a time, the tape of RK3Step records and mfpde.tokens.box.adjoint).

Both evaluate the same operations in other orders (stacked matrix products, sparse scatters, a division by the
diagonal mass matrix instead of its LU), so they agree to round-off: a value that went through n roundings on
each path differs by at most 2 κ γ_n of its size (Higham, Lemma 3.1), with n counted as in test_coupling
(per depth sub-step 3 stages of ≤ 4·5·9 + 18 + 10 roundings a dof, plus an N_y-term sum for the velocity, twice
for the reverse pass) and κ ≤ 10 the amplification of a relative perturbation through a few depth steps of a
CFL-limited positive scheme. A planted error of one sub-step's size or sign moves these values by > 1e-6.
"""

from __future__ import annotations

from mpi4py import MPI

import dolfinx.fem
import numpy as np
import pytest
from configs import DEEP
from roundoff import gamma

import mfpde.training.objective as objective_module
from mfpde import config as C
from mfpde.heads import HeadMeasure
from mfpde.tokens.box.batch import BatchDeclined, BatchTransport, batchable
from mfpde.tokens.box.readout import readout_function
from mfpde.training.problem import CoupledProblem

SMALL = ["tokens.cells=[12, 12]", "heads.cells=[6, 6]", "depth.steps=4", "data.samples=7", "data.test_samples=5",
         "output.plots=false", "output.fields=false"]
KAPPA = 10.0


def _bound(steps: int, nsub: int, n_y: int) -> float:
    return 2 * KAPPA * gamma(2 * steps * nsub * 3 * (4 * 5 * 9 + 18 + 10 + n_y))


def _both(cp: CoupledProblem, per_sample: bool = True):
    """Gradient (with ∂ŷ^i/∂c and snapshots) and test predictions, batched and then sample by sample."""
    heads = cp.heads()
    obj = cp.objective
    out = []
    for batch in (obj.batch, None):
        obj.batch = batch
        snaps: dict = {}
        g = obj.gradient(heads, per_sample=per_sample, snapshots=snaps, snapshot=(0, 3))
        out.append((g, obj.predict(cp.problem.test, heads), snaps))
    return out


@pytest.mark.parametrize("extra", [[], ['depth.model="depth-indexed"', "depth.layers=2"], ['depth.model="shallow"']],
                         ids=["tied", "indexed", "shallow"])
def test_batched_objective_equals_per_sample(extra, monkeypatch):
    """R, ŷ, ∂R/∂c, ∂ŷ^i/∂c, μ_t snapshots and held-out ŷ: batches of at most 3 (7 = 2 + 2 + 3 samples) against
    one by one, for the weight-tied, the depth-indexed and the single-layer model."""
    monkeypatch.setattr(objective_module, "BATCH_SAMPLES", 3)
    cfg = C.load(DEEP, [*SMALL, *extra])
    cp = CoupledProblem.from_config(cfg, MPI.COMM_SELF)
    assert cp.objective.batch is not None  # DG0 on a box: the batched path applies
    (g1, y1, s1), (g0, y0, s0) = _both(cp)
    tol = _bound(cfg.depth.steps, 2, int(np.prod(cfg.tokens.cells)))
    assert abs(g1.risk - g0.risk) <= tol * max(abs(g0.risk), 1.0)
    assert np.max(np.abs(g1.yhat - g0.yhat)) <= tol * np.max(np.abs(g0.yhat))
    assert np.max(np.abs(y1 - y0)) <= tol * np.max(np.abs(y0))
    for a, b in zip(g1.D, g0.D, strict=True):
        assert np.max(np.abs(a - b)) <= tol * np.max(np.abs(b)), (np.max(np.abs(a - b)), tol * np.max(np.abs(b)))
    assert g1.Dy is not None and g0.Dy is not None
    for a, b in zip(g1.Dy, g0.Dy, strict=True):
        assert np.max(np.abs(a - b)) <= tol * np.max(np.abs(b))
    assert sorted(s1) == sorted(s0) == [0, 3]
    for i in s0:
        # μ_0, μ_{T/2}, μ_T (deep); μ_0, μ_T (the single layer)
        assert len(s1[i]) == len(s0[i]) == len(cp.objective.snapshot_depths)
        for a, b in zip(s1[i], s0[i], strict=True):
            assert np.max(np.abs(a - b)) <= tol * np.max(np.abs(b))


def test_rows_keep_their_own_substeps():
    """Rows whose velocities need different numbers of CFL sub-steps each get their own (rounds of the batch),
    and each row ends where the per-sample TokenTransport.solve takes it, with the same number of sub-steps."""
    cfg = C.load(DEEP, SMALL)
    cp = CoupledProblem.from_config(cfg, MPI.COMM_SELF)
    tokens = cp.problem.tokens
    assert batchable(tokens)
    bt = BatchTransport(tokens)
    # a wide and a narrow Gaussian: tilted means (and so |V|) reach farther for the wide one
    rows = []
    for var in (0.25, 0.01, 0.1):
        u = dolfinx.fem.Function(tokens.W)
        u.interpolate(lambda x, v=var: np.exp(-((x[0] - 0.1) ** 2 + (x[1] + 0.2) ** 2) / (2 * v)))
        u.x.array[:] /= tokens.mass(u)
        rows.append(u)
    heads = HeadMeasure(np.array([-1.0, 0.0, 1.5]), np.array([6.0, 3.0, 5.0]))
    g = readout_function("linear", [0.0, 4.0], 0.0)
    U = np.stack([u.x.array for u in rows])
    reps = bt.solve(U, [heads], 1.0, 2, g)
    subs = [r.substeps for r in reps]
    assert len(set(subs)) > 1, subs  # the case exercises rows with different sub-step counts
    for j, u in enumerate(rows):
        rep = tokens.solve(u, heads, 1.0, 2, g)
        assert rep.substeps == subs[j]
        tol = _bound(2, max(subs), len(U[j]))
        assert np.max(np.abs(U[j] - u.x.array)) <= tol * np.max(np.abs(u.x.array))
        assert abs(reps[j].yhat - rep.yhat) <= tol * max(abs(rep.yhat), 1.0)
        assert abs(reps[j].outflow - rep.outflow) <= tol


def test_declined_batch_falls_back_to_per_sample():
    """Heads whose exponent range over the box is too large for shared factors: the batch declines and the
    objective solves its samples one by one (the same numbers as without the batched solver)."""
    cfg = C.load(DEEP, [*SMALL, "heads.box=[[290.0, 310.0], [-1.0, 1.0]]",
                        'heads.init={kind="gaussian", mean=[300.0, 0.3], cov=[[1.0, 0.0], [0.0, 0.1]]}',
                        "tokens.outflow_tol=1.0", "training.lambda2=0.0"])  # no confinement: its Gibbs density
    # would underflow on a Θ this far from 0 (refused, config.rules)
    cp = CoupledProblem.from_config(cfg, MPI.COMM_SELF)
    bt = cp.objective.batch
    assert bt is not None
    U = np.ones((2, len(cp.problem.tokens.m)))
    with pytest.raises(BatchDeclined):
        bt.velocity(U, cp.heads()[0], True)
    (g1, y1, _), (g0, y0, _) = _both(cp, per_sample=False)
    assert np.array_equal(g1.yhat, g0.yhat) and np.array_equal(y1, y0)  # the same code ran
    assert all(np.array_equal(a, b) for a, b in zip(g1.D, g0.D, strict=True))


def test_initial_densities_are_kept(monkeypatch):
    """μ_0 of every sample is filled once, by build (one stack per split): predictions fill nothing more and give the
    same ŷ bit for bit; with no budget (MU0_CACHE_BYTES = 0) nothing is kept and every solve fills its samples again,
    with the same ŷ."""
    import mfpde.tokens.box.problem as problem_module

    rows = []
    real = objective_module.initial_measures

    def counting(samples, *args):
        rows.append(len(samples))
        return real(samples, *args)

    monkeypatch.setattr(objective_module, "initial_measures", counting)
    cfg = C.load(DEEP, SMALL)
    ys = []
    for budget, fills in ((problem_module.MU0_CACHE_BYTES, 0), (0, 2)):
        monkeypatch.setattr(problem_module, "MU0_CACHE_BYTES", budget)
        cp = CoupledProblem.from_config(cfg, MPI.COMM_SELF)
        assert sorted(cp.problem.mu0) == (["test", "train"] if budget else [])
        heads, test = cp.heads(), cp.problem.test
        rows.clear()
        y0 = cp.objective.predict(test, heads)
        y1 = cp.objective.predict(test, heads)
        assert sum(rows) == fills * len(test), (budget, rows)
        assert np.array_equal(y0, y1)
        ys.append(y0)
    assert np.array_equal(*ys)


def test_stacked_initial_measures_equal_fill_density():
    """The stacked fill (one space, one evaluation of the pixels) gives each image's, Gaussian's and point cloud's
    μ_0 bit for bit as fill_density does one sample at a time, on DG0 and DG1."""
    from mfpde.tokens.box.data import Sample, fill_density, initial_measures

    rng = np.random.default_rng(3)
    samples = [Sample("image", {"image": rng.integers(0, 17, (8, 8)).astype(float), "origin": (-0.5, -0.5)}, 1.0)
               for _ in range(3)]
    samples += [Sample("gaussian", {"mean": np.array([0.1, -0.2]), "cov": 0.1 * np.eye(2)}, 0.0),
                Sample("points", {"points": rng.uniform(-0.9, 0.9, (5, 2)), "weights": np.ones(5)}, 0.0)]
    for degree in (0, 1):
        cfg = C.load(DEEP, [*SMALL, f"tokens.degree={degree}"])
        tokens = CoupledProblem.from_config(cfg, MPI.COMM_SELF).problem.tokens
        U = initial_measures(samples, tokens.W)
        for j, s in enumerate(samples):
            u = dolfinx.fem.Function(tokens.W)
            fill_density(s, u, tokens.mass)
            assert np.array_equal(U[j], u.x.array), (degree, s.kind)


def test_shallow_reports_equal_per_sample():
    """The single layer's batched reports (mass, outflow T·rate, min density of μ_T, mean, ŷ, one sub-step) and μ_T
    against mfpde.tokens.box.shallow.solve_shallow sample by sample; a large T so that μ_T goes negative somewhere
    and the outflow is far from 0 (planted: the outflow without T and the max for the min survived the suite)."""
    from mfpde.tokens.box.shallow import solve_shallow

    cfg = C.load(DEEP, SMALL)
    cp = CoupledProblem.from_config(cfg, MPI.COMM_SELF)
    tokens = cp.problem.tokens
    bt = BatchTransport(tokens)
    rows = []
    for var, x0 in ((0.25, 0.5), (0.02, -0.6), (0.1, 0.0)):
        u = dolfinx.fem.Function(tokens.W)
        u.interpolate(lambda x, v=var, x0=x0: np.exp(-((x[0] - x0) ** 2 + (x[1] + 0.2) ** 2) / (2 * v)))
        u.x.array[:] /= tokens.mass(u)
        rows.append(u)
    heads = HeadMeasure(np.array([-1.0, 0.0, 1.5]), np.array([6.0, 3.0, 5.0]))
    g = readout_function("linear", [0.0, 4.0], 0.0)
    T = 3.0
    U = np.stack([u.x.array for u in rows])
    reps = bt.solve_shallow(U, heads, T, g)
    for j, u in enumerate(rows):
        rep = solve_shallow(tokens, u, heads, T, g)
        tol = _bound(1, 1, len(U[j]))
        scale = np.max(np.abs(u.x.array))
        assert np.max(np.abs(U[j] - u.x.array)) <= tol * scale
        assert reps[j].substeps == rep.substeps == 1
        assert abs(rep.outflow) > 1e-3 and abs(reps[j].outflow - rep.outflow) <= tol * abs(rep.outflow)
        assert abs(reps[j].min_density - rep.min_density) <= tol * scale
        assert abs(reps[j].mass_0 - rep.mass_0) <= tol and abs(reps[j].mass_T - rep.mass_T) <= tol
        assert np.allclose(reps[j].mean_T, rep.mean_T, rtol=0, atol=tol)
        assert abs(reps[j].yhat - rep.yhat) <= tol * max(abs(rep.yhat), 1.0)
    assert min(r.min_density for r in reps) < 0  # the explicit layer is not positivity preserving at this T


def test_checkpointed_batch_gradient_is_bit_identical():
    """The batched gradient (R, ŷ, ∂R/∂c, ∂ŷ^i/∂c) with a training.tape_memory that holds only a few states of the
    batch (checkpoints, replayed segments; rows with their own CFL sub-step counts replayed as recorded) equals
    bit for bit the one from the whole tape."""
    out = []
    for budget in ("1GB", "200kB"):  # everything; a state of 7 rows × 144 cells is 8 kB, a taped sub-step ~0.6 MB
        cp = CoupledProblem.from_config(C.load(DEEP, [*SMALL, f"training.tape_memory='{budget}'"]), MPI.COMM_SELF)
        assert cp.objective.batch is not None
        out.append((cp.objective.gradient(cp.heads(), per_sample=True), dict(cp.objective.tape_stats)))
    (g0, s0), (g1, s1) = out
    assert s0["segments"] == 0 and s1["segments"] >= 2 and s1["recomputed_substeps"] == s1["substeps"], (s0, s1)
    assert g1.risk == g0.risk and np.array_equal(g1.yhat, g0.yhat)
    assert g0.Dy is not None and g1.Dy is not None
    assert all(np.array_equal(a, b) for a, b in zip(g1.D + g1.Dy, g0.D + g0.Dy, strict=True))


def _batch_rows(monkeypatch, batch, method: str) -> list[int]:
    """The row counts of every call of ``batch.method`` from now on (a list filled as the calls come)."""
    rows: list[int] = []
    real = getattr(batch, method)

    def counting(U, *args, **kwargs):
        rows.append(len(U))
        return real(U, *args, **kwargs)

    monkeypatch.setattr(batch, method, counting)
    return rows


def test_batch_size_from_the_memory_budget(monkeypatch):
    """Without BATCH_SAMPLES a batch holds as many samples as BATCH_BYTES allows by the tape estimate 32 n (1 + N_a)
    (3 K + 1) bytes a sample: the single layer (K = 1) of a small problem advances all its training samples in one
    batched solve; a budget below one sample's estimate gives batches of one; BATCH_SAMPLES overrides the budget."""
    cfg = C.load(DEEP, [*SMALL, 'depth.model="shallow"'])
    cp = CoupledProblem.from_config(cfg, MPI.COMM_SELF)
    obj, heads = cp.objective, cp.heads()
    assert obj.batch is not None
    n_a = [len(h.a) for h in heads]
    per = 32 * obj.tokens.W.dofmap.index_map.size_global * (1 + max(n_a)) * 4
    assert obj.batch_size(n_a) == objective_module.BATCH_BYTES // per >= len(cp.problem.train)
    rows = _batch_rows(monkeypatch, obj.batch, "solve_shallow")
    g = obj.gradient(heads)
    assert rows == [len(cp.problem.train)]  # one batch
    monkeypatch.setattr(objective_module, "BATCH_BYTES", per - 1)
    assert obj.batch_size(n_a) == 1
    rows.clear()
    assert obj.gradient(heads).risk == g.risk and rows == [1] * len(cp.problem.train)
    monkeypatch.setattr(objective_module, "BATCH_SAMPLES", 3)
    assert obj.batch_size(n_a) == 3
    deep = CoupledProblem.from_config(C.load(DEEP, SMALL), MPI.COMM_SELF).objective  # K depth steps: a larger estimate
    monkeypatch.setattr(objective_module, "BATCH_SAMPLES", None)
    monkeypatch.setattr(objective_module, "BATCH_BYTES", 2 * 32 * 144 * 3 * (3 * cfg.depth.steps + 1))
    assert deep.batch_size([2, 2]) == 2


def test_untaped_batch_from_its_own_footprint(monkeypatch):
    """Predictions (no tape) are batched by their own footprint, UNTAPED_BYTES_PER_VERTEX bytes per velocity vertex a
    sample against BATCH_BYTES less the chunk of head moments, not by the tape's 32 n (1 + N_a) (3 K + 1): with a
    BATCH_BYTES below one sample's tape the gradient advances the samples one by one while the predictions of the
    same samples are one batch, equal to the gradient's ŷ to round-off; the untaped batch keeps no softmax
    factors, and its heads summed in chunks of one give the same velocity to round-off."""
    from mfpde.tokens.box import batch as batch_module

    cp = CoupledProblem.from_config(C.load(DEEP, SMALL), MPI.COMM_SELF)
    obj, heads = cp.objective, cp.heads()
    assert obj.batch is not None
    n_a = [len(h.a) for h in heads]
    taped = 32 * obj.tokens.W.dofmap.index_map.size_global * (1 + max(n_a)) * (3 * cp.problem.sec.depth.steps + 1)
    untaped = objective_module.UNTAPED_BYTES_PER_VERTEX * obj.tokens.velocity.x.shape[0]
    train = cp.problem.train
    monkeypatch.setattr(objective_module, "UNTAPED_CHUNK_BYTES", untaped)  # not the 16 MiB of a large mesh
    monkeypatch.setattr(objective_module, "BATCH_BYTES", max(taped - 1, (len(train) + 1) * untaped))
    assert obj.batch_size(n_a) == 1 and obj.batch_size(n_a, taped=False) >= len(train), (taped, untaped)
    rows = _batch_rows(monkeypatch, obj.batch, "solve")
    g = obj.gradient(heads)
    assert rows == [1] * len(train), rows
    rows.clear()
    y = obj.predict(train, heads)
    assert rows == [len(train)], rows
    assert np.allclose(y, g.yhat, rtol=1e-12, atol=0), np.abs(y - g.yhat).max()
    U = np.stack([u.x.array for u in obj._initial(train, list(range(len(train))))])
    V, ts = obj.batch.velocity(U, heads[0], False)
    V1, ts1 = obj.batch.velocity(U, heads[0], True)
    assert ts is None and ts1 is not None and len(heads[0].a) > 1
    monkeypatch.setattr(batch_module, "UNTAPED_CHUNK_BYTES", 1)  # one head a chunk
    Vc, _ = obj.batch.velocity(U, heads[0], False)
    assert np.allclose(Vc, V1, rtol=1e-12, atol=1e-14 * np.abs(V1).max()) and np.allclose(V, V1, rtol=1e-12, atol=0)


def test_backward_without_costate_keeps_dc():
    """The single-layer model's reverse pass with ``costate=False`` (the training's: ∂R/∂c only) skips P_0 and
    gives ∂R/∂c bit for bit as the full pass; the digits' weights vanish on part of the grid, so the separable
    products run over the support of the batch's marginals (TensorSoftmax._ysup), against whole-grid factors."""
    cfg = C.load(DEEP, [*SMALL, 'depth.model="shallow"'])
    cp = CoupledProblem.from_config(cfg, MPI.COMM_SELF)
    bt = cp.objective.batch
    assert bt is not None
    heads = cp.heads()[0]
    g = readout_function("linear", [0.0, 4.0], 0.0)
    U0 = np.stack([u.x.array.copy() for u in cp.objective._initial(cp.problem.train, [0, 1, 2])])
    out = []
    for costate in (True, False):
        tape: list = []
        bt.solve_shallow(U0.copy(), heads, 1.0, g, tape=tape)
        assert tape[0].vel[0][1]._ysup is not None  # the products over the support only
        out.append(bt.backward(tape, np.ones_like(U0), 1, [len(heads.a)], costate=costate))
    (P1, D1), (P0, D0) = out
    assert P1 is not None and P0 is None
    assert np.array_equal(D1[0], D0[0]) and np.any(D1[0] != 0.0)
