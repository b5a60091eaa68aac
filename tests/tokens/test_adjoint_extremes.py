"""The reverse pass where the forward is fine: saturated softmax (a = 300) and DG1 on meshes of 2–8 cells (issue 14).

* The forward softmax sums over the support of μ, shifted by its maximum there; the VJPs exponentiated the
  zero-weight points too, e^{a x·(y − y*)} up to e^{1152}, capped at e^{700} and then summed or multiplied into
  inf/NaN. Every VJP path now forms the derivative on the support only (0 at a zero weight,
  :func:`mfpde.tokens.attention.support_only`).
* DG1: the reverse pass treated the positivity limiter as the identity, and the costate at a clipped node (a zero
  weight) grew by e^{a x·Δy} a stage: gradients of 1e18–1e275 where finite differences give O(1). The limiter is
  now transposed (:mod:`mfpde.tokens.limiter`).
* DG1 with saturated heads: the limiter left its limited minimum at a round-off residue (1e-21) instead of 0; the
  softmax weighed that point by e^{75}, so ŷ jumped by 2% of its slope in c with the sign of a rounding and the
  reverse pass (which takes u_{i*} ≡ 0) disagreed with finite differences by 2%. The minimum is now exactly 0.
"""

from __future__ import annotations

from mpi4py import MPI

import dolfinx.fem
import numpy as np
import pytest
from configs import DEEP
from roundoff import gamma

from mfpde.config import load
from mfpde.fitting import fit_order
from mfpde.heads import HeadMeasure
from mfpde.mesh import box
from mfpde.tokens.attention import TensorGrid, tilted_kernel, velocity_vjp
from mfpde.tokens.box.adjoint import DiscreteAdjoint, dyhat_dmu
from mfpde.tokens.box.data import Sample, fill_density
from mfpde.tokens.box.interpolated import InterpolatedSoftmax
from mfpde.tokens.box.problem import build
from mfpde.tokens.box.readout import readout_function
from mfpde.tokens.box.separable import TensorSoftmax
from mfpde.tokens.box.transport import TokenTransport
from mfpde.training.config import section
from mfpde.training.objective import Objective

pytestmark = pytest.mark.ranks  # the rank count can change what it checks: run again under mpiexec

A_BIG = 300.0


def _one_token(d: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Grid points of [−4, 4]^d (n per axis) and weights of μ: the two points nearest (−3, −2.5) carry it."""
    ax = np.linspace(-4.0, 4.0, n)
    pts = np.stack([m.ravel() for m in np.meshgrid(*[ax] * d, indexing="ij")], axis=1)
    w = np.zeros(len(pts))
    near = np.argsort(np.abs(pts - np.array([-3.0] + [-2.5] * (d - 1))).sum(axis=1))[:2]
    w[near] = [0.7, 0.3]
    return pts, w


def _check(gw: np.ndarray, w: np.ndarray, gc: np.ndarray) -> None:
    assert np.all(np.isfinite(gw)) and np.all(np.isfinite(gc)), (np.abs(gw).max(), gc)
    assert np.all(gw[w == 0] == 0.0), np.abs(gw[w == 0]).max()


def test_direct_vjp_saturated():
    """d = 1, 2001 evaluation points, a = 300: the capped e^{700} off the support summed to inf."""
    y, w = _one_token(1, 101)
    x = np.linspace(-4.0, 4.0, 2001)[:, None]
    gw, gc = velocity_vjp(x, y, w, HeadMeasure(np.array([A_BIG]), np.array([0.5])), np.ones_like(x))
    _check(gw, w, gc)


def test_chebyshev_kernel_zero_off_support():
    """The d = 1 kernel values that the Chebyshev VJP expands are 0 off the support (they were e^{700})."""
    y, w = _one_token(1, 101)
    _, Q, Zt = tilted_kernel(-4.0 * A_BIG, 4.0 * A_BIG, 16, y[:, 0], w)
    assert np.all(np.isfinite(Q)) and np.all(Q[:, w == 0] == 0.0) and np.all((Zt >= 1.0) & (Zt <= 2.0))


def test_tensor_vjp_saturated():
    """d = 2 tensor grid: E₁ᵀ G E₂ multiplied two capped factors, e^{1400} = inf."""
    n = 17
    ax = np.linspace(-4.0, 4.0, n)
    grid = TensorGrid((ax, ax))
    _, w = _one_token(2, n)
    S = TensorSoftmax(grid, grid, w.reshape(n, n), np.array([A_BIG]))
    gW, gc = S.vjp(np.array([0.5]), np.ones((n, n, 2)))
    _check(gW.ravel(), w, gc)


def test_interpolated_vjp_saturated():
    """d = 2 unstructured support (the Chebyshev grid path): its VJP multiplied two capped factors too."""
    y, w = _one_token(2, 17)
    w[w < 0.5] = 0.0  # one point: its tilted mean is constant, so the grid converges
    S = InterpolatedSoftmax(np.array([[-4.0, 4.0], [-4.0, 4.0]]), y, w, np.array([A_BIG]), max_points=10**6)
    assert S.ok and S.grid.all()
    x = np.random.default_rng(0).uniform(-4.0, 4.0, (500, 2))
    gw, gc = S.vjp(S.grid_cotangent(x, np.ones_like(x)), np.array([0.5]))
    _check(gw, w, gc)


def _token_transport(d: int, n: int, degree: int, cell: str = "quadrilateral") -> TokenTransport:
    return TokenTransport(box(MPI.COMM_WORLD, [[-4.0, 4.0]] * d, [n] * d, cell), degree=degree)


def _saturated(tt: TokenTransport, x0: list[float], a: float, c: float) -> tuple[float, np.ndarray, np.ndarray]:
    """ŷ, ∂ŷ/∂c and p_0 for μ_0 = δ_{x0} deposited, one head (a, c), one depth step to T = 1."""
    g = readout_function("mean")
    u = dolfinx.fem.Function(tt.W)
    fill_density(Sample("points", {"points": np.array([x0]), "weights": np.array([1.0])}, 0.0), u, tt.mass)
    tape: list = []
    rep = tt.solve(u, HeadMeasure(np.array([a]), np.array([c])), 1.0, 1, g, tape=tape)
    p0, D = DiscreteAdjoint(tt).backward(tape, dyhat_dmu(tt, g), 1)
    return rep.yhat, D[0], p0


@pytest.mark.parametrize("d,cell,c", [(1, "quadrilateral", 0.2), (1, "quadrilateral", -0.2),
                                      (2, "quadrilateral", 0.03), (2, "triangle", 0.1)])
def test_saturated_gradient(d, cell, c):
    """One token at x₁ = −3 on [−4, 4]^d, DG0, one depth step, a head at a = 300 (issue 14).

    The softmax is saturated (a = 200 gives the same), so ∂ŷ/∂c at a = 300 equals its value at a = 200 up to the
    round-off of the two passes, and equals central differences of ŷ; the costate stays finite (it was NaN in d = 2
    and 1e301 in d = 1, the exit 3 "non-finite risk or first variation" of a run).
    """
    tt = _token_transport(d, 100 if d == 1 else 12, 0, cell)
    x0 = [-3.0] + [-2.5] * (d - 1)
    yh, D, p0 = _saturated(tt, x0, A_BIG, c)
    _, D200, _ = _saturated(tt, x0, 200.0, c)
    ok = MPI.COMM_WORLD.allreduce(bool(np.all(np.isfinite(p0))), op=MPI.LAND)
    assert ok and np.all(np.isfinite(D)), (D, np.abs(p0).max())
    # ≤ 2 × (forward + reverse) roundings of each dof per RK3 stage (≤ 50 in d = 2), ≤ 40 CFL sub-steps of 3 stages
    assert abs(D[0] - D200[0]) <= 2 * gamma(2 * 40 * 3 * 50) * max(abs(D200[0]), 1.0), (D, D200)
    h = 1e-5
    yp, _, _ = _saturated(tt, x0, A_BIG, c + h)
    ym, _, _ = _saturated(tt, x0, A_BIG, c - h)
    fd = (yp - ym) / (2 * h)
    # central differences: O(h²) truncation (ŷ smooth in c at fixed sub-step count) + ε|ŷ|/h round-off
    assert abs(fd - D[0]) <= 1e-4 * max(abs(D[0]), 1.0) + 1e3 * gamma(1) * max(abs(yh), 1.0) / h, (fd, D)


@pytest.mark.parametrize("n,a,c", [(2, 0.5, 1.0), (3, 0.5, 1.0), (3, -0.5, 0.8), (3, 2.0, -1.0), (4, 0.5, 1.0),
                                   (4, 2.0, -1.0), (8, 0.5, 1.0), (8, 2.0, -1.0)])
def test_dg1_tiny_mesh_taylor(n, a, c):
    """DG1 on n = 2–8 token cells (the limiter active): the Taylor remainder of ŷ in c falls at rate 2.

    r(ε) = |ŷ(c + εδ) − ŷ(c) − ε ∂ŷ/∂c·δ| = O(ε²) when ∂ŷ/∂c is the derivative of the discrete map (it was 1e18–1e275
    while finite differences gave O(1), so r grew like ε |∂ŷ/∂c|: rate 1).
    """
    tt = _token_transport(1, n, 1)
    g = readout_function("mean")
    A = np.array([a, a + 0.5])
    delta = np.array([1.0, 0.5])

    def run(C, tape=None):
        u = dolfinx.fem.Function(tt.W)
        u.interpolate(lambda x: np.exp(-((x[0] - 0.3) ** 2) / 0.5))
        u.x.array[:] /= tt.mass(u)
        return tt.solve(u, HeadMeasure(A, C), 1.0, 10, g, tape=tape).yhat

    C = np.array([c, 0.3])
    tape: list = []
    y0 = run(C, tape)
    _, D = DiscreteAdjoint(tt).backward(tape, dyhat_dmu(tt, g), 1)
    dy = float(D[0] @ delta)
    eps = 2e-4 * 0.5 ** np.arange(4)
    r = np.array([abs(run(C + e * delta) - y0 - e * dy) for e in eps])
    rate = fit_order(eps, np.maximum(r, 1e-300))
    # a remainder at round-off level (ŷ linear in c there) has no rate: ≤ 1e3 ε |ŷ| is as good as 0
    if r.max() > 1e3 * gamma(1) * max(abs(y0), 1.0):
        assert abs(rate - 2.0) < 0.2, f"Taylor remainders {r.tolist()} (∂ŷ/∂c = {D[0].tolist()}): rate {rate:.2f}"
    assert np.all(np.isfinite(D[0])) and np.abs(dy) < 1e6, D


@pytest.mark.parametrize("scale", [1e-170, 1e170])
def test_limiter_transpose_is_scale_invariant(scale: float) -> None:
    """The limiter is positively homogeneous, L(αv) = αL(v), so its Jacobian at αv is its Jacobian at v.

    Cells of ~1e-160 occur in the tails of a transported density; the transpose must not square the cell's
    range there (D² underflowed to 0 and the reverse pass of a DG1 run became NaN).
    """
    from mfpde.tokens.limiter import limit, limit_transpose

    rng = np.random.default_rng(3)
    cell_dofs = np.arange(12, dtype=np.int32).reshape(4, 3)
    m = rng.uniform(0.5, 1.5, 12)
    v = rng.uniform(-0.3, 1.0, 12)
    p = rng.normal(size=12)
    ref = limit_transpose(limit(v.copy(), cell_dofs, m), p)
    got = limit_transpose(limit(scale * v, cell_dofs, m), p)
    assert np.all(np.isfinite(got))
    # both are the same ~10 rounded operations on values of the order of p: γ₃₂ relative to Σ|p|
    assert np.abs(got - ref).max() <= gamma(32) * np.abs(p).sum() * 10, np.abs(got - ref).max()


def _issue_case(tmp, degree: int, a: float, v: float):
    """The problem and objective of issue 14's run (one token at x = −3, Ω = [−4, 4], 100 cells, one depth step).

    A data file holds the token; scalar heads θ = (a, v) on Θ = [a − 2, a + 2] × [−1, 1], ρ₀ Gaussian around (a, v).
    """
    comm = MPI.COMM_WORLD
    data = tmp / "one.npz"
    if comm.rank == 0 and not data.exists():
        np.savez(data, points=np.full((1, 1, 1), -3.0), weights=np.ones((1, 1)), target=np.ones(1))
    comm.Barrier()
    cfg = load(DEEP, ["tokens.dim=1", "tokens.box=[[-4.0, 4.0]]", "tokens.cells=[100]", f"tokens.degree={degree}",
                      "depth.steps=1", "heads.family='scalar'", f"heads.box=[[{a - 2}, {a + 2}], [-1.0, 1.0]]",
                      "heads.cells=[4, 8]",
                      f"heads.init={{kind='gaussian', mean=[{a}, {v}], cov=[[0.5, 0.0], [0.0, 0.05]]}}",
                      "data.kind='file'", f"data.path='{data}'", "loss.readout='mean'", "training.steps=1",
                      "training.lambda2=0.0"])  # no confinement: its Gibbs density underflows on Θ this far from 0
    pb = build(section(cfg), comm, split_samples=True)
    return pb, Objective(pb)


@pytest.mark.parametrize("degree", [0, 1])
def test_issue_case_saturated_heads(tempdir, degree):
    """Issue 14's case: one token at x = −3 on [−4, 4] (100 cells), one depth step, heads around a = 300.

    ρ₀ has v-mean 1e-6, so the velocity is tiny and μ stays on one or two cells: every point next to them has zero
    weight, and the old reverse pass exponentiated those, e^{a x·Δy} with a x·Δy up to 300·4·8: ∂ŷ/∂c was NaN at
    a ≈ 300 (a = 200: −3.12 for DG0) and 1e31 or NaN for DG1 at either a (measured at ad991fa). Now ∂ŷ/∂c_k is
    finite, the same at a ≈ 300 as at a ≈ 200 (the softmax is saturated at both: e^{−a·3·0.08} < 1e-20), and equal to
    central differences of ŷ in c_k.
    """
    v = 1e-6
    pb, obj = _issue_case(tempdir, degree, 300.0, v)
    g = obj.gradient([pb.heads0], per_sample=True)
    Dy = g.Dy[0][0]
    assert np.all(np.isfinite(Dy)), Dy
    pb2, obj2 = _issue_case(tempdir, degree, 200.0, v)
    Dy200 = obj2.gradient([pb2.heads0], per_sample=True).Dy[0][0]
    # the two runs are the same operations but for exponentials of < 1e-20: the bound of test_saturated_gradient
    assert np.abs(Dy - Dy200).max() <= 2 * gamma(2 * 40 * 3 * 50) * max(np.abs(Dy200).max(), 1.0), (Dy, Dy200)
    # central differences, with h below Σc ≈ 7e-7 so that the velocity keeps its sign (the upwind flux has a kink at
    # V = 0): truncation h²/6 |ŷ'''| ≈ |fd(2h) − fd(h)|/3 (Richardson); round-off ≤ 2 γ_N |ŷ|/(2h), asserted with 2×
    h, heads = 1e-7, pb.heads0
    assert heads.c.sum() > 4 * h, heads.c.sum()

    def fd(k: int, step: float) -> float:
        cp, cm = heads.c.copy(), heads.c.copy()
        cp[k] += step
        cm[k] -= step
        yp = obj.predict(pb.train, [HeadMeasure(heads.a, cp)])[0]
        ym = obj.predict(pb.train, [HeadMeasure(heads.a, cm)])[0]
        return (yp - ym) / (2 * step)

    for k in (0, len(heads.a) // 2):
        f1, f2 = fd(k, h), fd(k, 2 * h)
        tol = abs(f2 - f1) + 2 * gamma(2 * 40 * 3 * 50) * max(abs(g.yhat[0]), 1.0) / h
        assert abs(f1 - Dy[k]) <= tol, (k, f1, f2, Dy[k], tol)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_dg1_tiny_mesh_risk_gradient(n):
    """DG1 on n = 2, 4, 8 token cells (d = 1), by the run's objective: every ∂R/∂c_k equals central differences.

    Issue 14: the reverse pass of DG1 treated the positivity limiter as the identity and returned gradients of
    1e73–1e111 on such meshes where finite differences gave at most ~800. Two Gaussian samples, scalar heads on a
    5 × 4 Θ grid with every c_k ≥ 5e-4 (a c_k within h of 0 would let the difference cross a kink of the upwind
    flux, where V changes sign at a vertex), four depth steps. Error model of the central difference at h:
    truncation h²/6 |R'''| ≤ |fd(2h) − fd(h)| (Richardson: the difference of the two is 3 h²/6 |R'''| + O(h⁴)), plus
    the round-off of two risks through N ≤ 4 · 3 · 50 · 2 roundings each, divided by 2h.
    """
    cfg = load(DEEP, ["tokens.dim=1", "tokens.box=[[-4.0, 4.0]]", f"tokens.cells=[{n}]", "tokens.degree=1",
                      "tokens.outflow_tol=0.5", "depth.steps=4", "heads.family='scalar'",
                      "heads.box=[[-1.0, 1.0], [-1.0, 1.0]]", "heads.cells=[4, 4]",
                      "heads.init={kind='gaussian', mean=[0.5, 0.2], cov=[[0.3, 0.0], [0.0, 0.1]]}",
                      "data.kind='gaussian'", "data.mean=[[0.3], [-0.5]]", "data.cov=[[[0.25]], [[0.1]]]",
                      "data.target=[1.0, -1.0]", "loss.readout='mean'", "training.steps=1"])
    pb = build(section(cfg), MPI.COMM_WORLD, split_samples=True)
    obj = Objective(pb)
    heads = pb.heads0
    assert np.all(heads.c >= 5e-4), heads.c
    tape: list = []
    u = dolfinx.fem.Function(obj.tokens.W)
    fill_density(pb.train[0], u, obj.tokens.mass)
    obj.forward(u, [heads], tape)
    limited = MPI.COMM_WORLD.allreduce(sum(r is not None for s in tape for r in s.limiter), op=MPI.SUM)
    assert limited > 0, "the limiter never acted: the test would not exercise its transpose"
    g = obj.gradient([heads])
    D = g.D[0]
    assert np.all(np.isfinite(D)), D
    h = 1e-6

    def fd(k: int, step: float) -> float:
        cp, cm = heads.c.copy(), heads.c.copy()
        cp[k] += step
        cm[k] -= step
        return (obj.gradient([HeadMeasure(heads.a, cp)]).risk - obj.gradient([HeadMeasure(heads.a, cm)]).risk) / (
            2 * step)

    for k in range(len(D)):
        f1, f2 = fd(k, h), fd(k, 2 * h)
        tol = abs(f2 - f1) + 2 * gamma(4 * 3 * 50 * 2) * max(g.risk, 1.0) / (2 * h)
        assert abs(f1 - D[k]) <= tol, f"n = {n}, head a = {heads.a[k]}: adjoint {D[k]!r}, differences {f1!r} " \
                                      f"(2h: {f2!r}), tolerance {tol:.3g}"


@pytest.mark.parametrize("seed", range(5))
def test_zhang_shu_keeps_each_mean_and_lifts_each_minimum_to_zero(seed: int) -> None:
    """The one scaling every DG solver limits by: the weighted mean kept and the cell minimum 0, to round-off."""
    from mfpde.tokens.limiter import zhang_shu

    rng = np.random.default_rng(seed)
    k = 4
    q = rng.uniform(0.5, 1.5, (50, k))
    q /= q.sum(axis=1, keepdims=True)  # a mean's weights
    v = rng.normal(0.5, 1.0, (50, k))
    mean = (q * v).sum(axis=1)
    bad = (v.min(axis=1) < 0) & (mean > 0)
    u, theta = zhang_shu(v[bad], mean[bad], v[bad].min(axis=1))
    scale = np.abs(v[bad]).max(axis=1)  # |v̄|, |v − v̄|/2 and |u| are at most this
    assert np.all((0 <= theta) & (theta < 1))
    # u_i = v̄ + θ(v_i − v̄): 3 roundings of terms ≤ 3 scale; θ: 2 roundings; each weighted mean: k of terms ≤ scale
    u_err = gamma(3) * 3 * scale + gamma(2) * 2 * scale
    assert np.all(np.abs((q[bad] * u).sum(axis=1) - mean[bad]) <= 2 * gamma(k) * scale + u_err)
    assert np.all(np.abs(u.min(axis=1)) <= u_err)
