"""Tests for mfpde.attention: log-domain softmax moments, tensor vs direct paths, head reduction (theory §1.2, §6.1).

Pure numpy, which the rank count cannot change: only the one test on a distributed token mesh is marked
``ranks`` (run again under ``mpiexec -n 2``).
"""

from __future__ import annotations

import math

from mpi4py import MPI  # noqa: F401  (import order: mpi4py before anything that may load PETSc)

import numpy as np
import pytest
from roundoff import U, gamma, softmax_error
from scipy.special import logsumexp, softmax

from mfpde.heads import HeadMeasure
from mfpde.params.family import ScalarHeads, ValueHeads, make_family
from mfpde.tokens.attention import TensorGrid, softmax_moments_direct, velocity, velocity_vjp
from mfpde.tokens.box.separable import _TENSOR_RANGE_MAX, SeparableFactors, TensorSoftmax, velocity_tensor


def softmax_moments_tensor(xg: TensorGrid, yg: TensorGrid, W: np.ndarray, a: float
                           ) -> tuple[np.ndarray, np.ndarray] | None:
    """(log Z, m) of one head by the separable path, or None where it declines (exponent range)."""
    ts = TensorSoftmax(xg, yg, W, np.array([a]))
    return (ts.logz[0], ts.m[0]) if ts.separable[0] else None


def _reference(x: np.ndarray, y: np.ndarray, w: np.ndarray, a: float) -> tuple[np.ndarray, np.ndarray]:
    """log Z and m_a at x, independently: scipy's logsumexp / softmax over the support of w."""
    sup = w > 0
    e = a * (x @ y[sup].T) + np.log(w[sup])[None, :]
    return logsumexp(e, axis=1), softmax(e, axis=1) @ y[sup]


# --------------------------------------------------------------------------------------------------
# Log-domain softmax: no overflow for |a x·y| in the thousands


@pytest.mark.parametrize("d", [1, 2])
@pytest.mark.parametrize("a", [50.0, -50.0])
def test_direct_softmax_huge_exponents(d, a):
    rng = np.random.default_rng(3 + d)
    x = rng.uniform(-10, 10, size=(37, d))
    y = rng.uniform(-10, 10, size=(53, d))
    x[0] = 10.0  # |a x·y| up to 5000 d
    y[0] = 10.0
    w = rng.uniform(0, 1, size=53)
    w[[3, 7]] = 0.0  # zero weights are not part of the support
    assert np.max(np.abs(a * x @ y.T)) > 1000
    with np.errstate(over="raise", invalid="raise", divide="raise", under="ignore"):
        logz, m = softmax_moments_direct(x, y, w, a)
        v = velocity(x, y, w, HeadMeasure(np.array([a]), np.array([1.0])))
    ref_logz, ref_m = _reference(x, y, w, a)
    assert np.all(np.isfinite(logz)) and np.all(np.isfinite(m))
    # two evaluations, each exact to roundoff.softmax: η + u|log Z| for log Z, (2η + γ_n) max|y| for m
    eta = softmax_error(float(np.max(np.abs(a * x @ y.T))) + float(np.max(np.abs(np.log(w[w > 0])))), len(y), d)
    assert np.allclose(logz, ref_logz, rtol=2 * U, atol=2 * eta)
    ymax = float(np.abs(y).max())
    assert np.allclose(m, ref_m, rtol=0, atol=2 * (2 * eta + gamma(len(y))) * ymax)
    assert np.array_equal(v, m)
    # the tilted mean is a convex combination of the support: inside its bounding box, to its round-off
    ys = y[w > 0]
    tol = (2 * eta + gamma(len(y))) * ymax
    assert np.all(m >= ys.min(axis=0) - tol) and np.all(m <= ys.max(axis=0) + tol)


def test_direct_softmax_moderate_matches_naive():
    """For moderate exponents the naive (unshifted) formula is exact: compare to it directly."""
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(20, 2)), rng.normal(size=(30, 2))
    w = rng.uniform(0.1, 1.0, size=30)
    a = 0.7
    k = np.exp(a * x @ y.T) * w
    logz, m = softmax_moments_direct(x, y, w, a)
    # the naive formula (no shift) has the same error model as the shifted one (roundoff.softmax)
    eta = softmax_error(float(np.max(np.abs(a * x @ y.T))) + float(np.max(np.abs(np.log(w)))), len(y))
    assert np.allclose(logz, np.log(k.sum(axis=1)), rtol=2 * U, atol=2 * eta)
    assert np.allclose(m, (k @ y) / k.sum(axis=1)[:, None], rtol=0,
                       atol=2 * (2 * eta + gamma(len(y))) * float(np.abs(y).max()))


def test_velocity_of_gaussian_is_affine():
    """Theory §6.1: for μ = N(m, Σ), v_θ(x) = V m + V Σ Aᵀ x, so V[μ; ρ](x) = ā m + b̄ Σ x (A = aI, V = vI).

    μ is a fine tensor-grid quadrature of a non-diagonal Gaussian in d = 2 (spectrally accurate),
    so the direct path reproduces the affine closed form to its quadrature and round-off errors.
    """
    m = np.array([0.3, -0.2])
    S = np.array([[0.25, 0.1], [0.1, 0.16]])
    ax = np.linspace(-5, 5, 201)
    yg = TensorGrid((ax, ax))
    y = yg.points()
    yc = y - m
    w = np.exp(-0.5 * np.einsum("ni,ij,nj->n", yc, np.linalg.inv(S), yc))
    w /= w.sum()
    heads = HeadMeasure(np.array([-0.5, 0.3]), np.array([0.5, 0.25]))
    x = np.random.default_rng(0).uniform(-1.5, 1.5, size=(25, 2))
    v = velocity(x, y, w, heads)
    ref = heads.abar * m[None, :] + heads.bbar * x @ S  # S symmetric: (S x)ᵀ = xᵀ S
    # Quadrature: the trapezoidal rule on an analytic integrand errs by e^{−2π²σ²/h²} (Trefethen & Weideman,
    # SIAM Rev. 56 (2014) 385, §5), σ² ≥ 0.1, h = 0.05: e^{−790}, nothing. The box ±5 cuts a tail of weight
    # ≤ e^{−(5 − 1)²/(2·0.35)} (the tilted mean stays within 1 of 0, σ² ≤ 0.35), times |y| ≤ 5. Round-off:
    # roundoff.softmax_error over the 201² points, log w down to log min w. Summed over heads, Σ|c| = 0.75.
    E = 0.5 * float(np.max(np.abs(x @ y.T))) + float(np.max(np.abs(np.log(w))))
    tail = 5.0 * math.exp(-((5.0 - 1.0) ** 2) / (2 * 0.35))
    bound = 0.75 * (tail + 2 * (2 * softmax_error(E, len(y)) + gamma(len(y))) * 5.0)
    assert np.abs(v - ref).max() <= bound, (np.abs(v - ref).max(), bound)


# --------------------------------------------------------------------------------------------------
# Tensor path == direct path


def _random_grids(rng: np.random.Generator, d: int, scale: float) -> tuple[TensorGrid, TensorGrid, np.ndarray]:
    xs = tuple(np.sort(rng.uniform(-scale, scale, size=n)) for n in (13, 9)[:d])
    ys = tuple(np.sort(rng.uniform(-scale, scale, size=n)) for n in (11, 7)[:d])
    yg = TensorGrid(ys)
    W = rng.uniform(0, 1, size=yg.shape)
    W[W < 0.2] = 0.0  # holes in the support
    W.flat[0] = 0.0
    return TensorGrid(xs), yg, W


@pytest.mark.parametrize("d", [1, 2])
@pytest.mark.parametrize("a", [0.7, -1.3, 4.0])
def test_tensor_equals_direct(d, a):
    rng = np.random.default_rng(10 * d + int(abs(a) * 10))
    xg, yg, W = _random_grids(rng, d, scale=3.0)
    res = softmax_moments_tensor(xg, yg, W, a)
    assert res is not None, "small exponent range must use the separable path"
    logz_t, m_t = res
    logz_d, m_d = softmax_moments_direct(xg.points(), yg.points(), W.ravel(), a)
    assert logz_t.shape == xg.shape and m_t.shape == (*xg.shape, d)
    # three algorithms for one sum, each exact to roundoff.softmax of the exponent range (the separable
    # path shifts per axis: the same E); the log of the weights adds up to |log min W|
    xs, ys = xg.points(), yg.points()
    n, wpos = ys.shape[0], W.ravel()[W.ravel() > 0]
    E = abs(a) * float(np.max(np.abs(xs @ ys.T))) + float(np.max(np.abs(np.log(wpos))))
    eta = softmax_error(E, n, d)
    tol_z, tol_m = 2 * eta, 2 * (2 * eta + gamma(n)) * float(np.abs(ys).max())
    assert np.allclose(logz_t.ravel(), logz_d, rtol=2 * U, atol=tol_z)
    assert np.allclose(m_t.reshape(-1, d), m_d, rtol=0, atol=tol_m)
    ref_logz, ref_m = _reference(xs, ys, W.ravel(), a)
    assert np.allclose(logz_d, ref_logz, rtol=2 * U, atol=tol_z)
    assert np.allclose(m_d, ref_m, rtol=0, atol=tol_m)
    heads = HeadMeasure(np.array([a, 0.5 * a]), np.array([0.8, -0.3]))
    v_t = velocity_tensor(xg, yg, W, heads)
    v_d = velocity(xs, ys, W.ravel(), heads)
    # Σ_k c_k m_k: each m_k to tol_m (|a_k| ≤ |a|), times Σ|c| = 1.1, plus the 2-term sum
    assert np.allclose(v_t.reshape(-1, d), v_d, rtol=0, atol=1.1 * tol_m + gamma(2) * 1.1 * float(np.abs(ys).max()))


@pytest.mark.parametrize("d", [1, 2])
def test_tensor_fallback_large_range(d):
    """Exponent range > _TENSOR_RANGE_MAX: the separable path declines and velocity_tensor uses the direct sum."""
    rng = np.random.default_rng(7 + d)
    xg, yg, W = _random_grids(rng, d, scale=10.0)
    a = 50.0  # |a x y| up to 5000 per axis
    assert softmax_moments_tensor(xg, yg, W, a) is None
    heads = HeadMeasure(np.array([a, 0.2]), np.array([1.0, 0.5]))  # one head falls back, one does not
    assert softmax_moments_tensor(xg, yg, W, 0.2) is not None
    with np.errstate(over="raise", invalid="raise", divide="raise", under="ignore"):
        v_t = velocity_tensor(xg, yg, W, heads)
    v_d = velocity(xg.points(), yg.points(), W.ravel(), heads)
    assert np.all(np.isfinite(v_t))
    xs, ys = xg.points(), yg.points()
    wpos = W.ravel()[W.ravel() > 0]
    E = a * float(np.max(np.abs(xs @ ys.T))) + float(np.max(np.abs(np.log(wpos))))
    tol = 2 * (2 * softmax_error(E, len(ys), d) + gamma(len(ys))) * float(np.abs(ys).max()) * 1.5  # Σ|c| = 1.5
    assert np.allclose(v_t.reshape(-1, d), v_d, rtol=0, atol=tol)
    ref = sum(c * _reference(xs, ys, W.ravel(), ak)[1] for ak, c in zip(heads.a, heads.c, strict=True))
    assert np.allclose(v_d, ref, rtol=0, atol=tol)


def test_tensor_range_threshold():
    """Just below the threshold the separable path is used and still exact; just above, it declines."""
    ax = np.linspace(-1.0, 1.0, 21)
    g = TensorGrid((ax,))
    W = np.ones(21)
    # range of a x y over y for the row x = ±1 is 2|a|
    below = 0.49 * _TENSOR_RANGE_MAX
    above = 0.51 * _TENSOR_RANGE_MAX
    res = softmax_moments_tensor(g, g, W, below)
    assert res is not None
    ref_logz, ref_m = _reference(g.points(), g.points(), W, below)
    eta = softmax_error(below, 21, 1)  # |a x y| ≤ below on [−1, 1]², unit weights
    assert np.allclose(res[0], ref_logz, rtol=2 * U, atol=2 * eta)
    assert np.allclose(res[1][:, 0], ref_m[:, 0], rtol=0, atol=2 * (2 * eta + gamma(21)))
    assert softmax_moments_tensor(g, g, W, above) is None


@pytest.mark.parametrize("d", [1, 2])
def test_tensor_vjp_equals_direct(d):
    """The batched separable VJP (TensorSoftmax.vjp) equals the direct sums (velocity_vjp), heads that fall
    back to the direct path (exponent range) and heads with c_k = 0 included.

    Both compute g_W(y) = Σ_k c_k Σ_x ξ·(y − m_k) e^{a_k x·y}/Z_k and g_c(k) = Σ_x ξ·m_k (theory §3.1 (B)); the
    factors e^{a x·y}/Z and m each carry the softmax round-off η; each of the N_x terms per y weighs
    |c_k| |ξ| (|y| + |m|) times a factor ≤ max e^{a x·y}/Z, bounded here by e^{E} over all y.
    """
    rng = np.random.default_rng(3 + d)
    xg, yg, W = _random_grids(rng, d, scale=2.0)
    heads = HeadMeasure(np.array([-1.5, 0.0, 0.8, 200.0]), np.array([0.7, 0.0, -0.4, 0.3]))
    ts = TensorSoftmax(xg, yg, W, heads.a)
    assert list(ts.separable) == [True, True, True, False]  # |a x y| up to 800 for a = 200
    lz_d, m_d = softmax_moments_direct(xg.points(), yg.points(), W.ravel(), 200.0)  # the fallback head's own sums
    assert np.array_equal(ts.logz[3].ravel(), lz_d) and np.array_equal(ts.m[3].reshape(-1, d), m_d)
    Xi = rng.standard_normal((*xg.shape, d))
    gW, gc = ts.vjp(heads.c, Xi)
    gw_d, gc_d = velocity_vjp(xg.points(), yg.points(), W.ravel(), heads, Xi.reshape(-1, d))
    xs, ys = xg.points(), yg.points()
    wpos = W.ravel()[W.ravel() > 0]
    ymax = float(np.abs(ys).max())
    E = float(np.max(np.abs(heads.a))) * float(np.max(np.abs(xs @ ys.T))) + float(np.max(np.abs(np.log(wpos))))
    eta = softmax_error(E, len(ys), d)
    # g_c: Σ_x |ξ| times the error of m (test_tensor_equals_direct's tol_m), both paths
    tol_c = float(np.abs(Xi).sum()) * 2 * (2 * (2 * eta + gamma(len(ys))) * ymax)
    assert np.allclose(gc, gc_d, rtol=0, atol=tol_c), np.abs(gc - gc_d).max()
    # g_W per y: relative error (4η + γ_{N_x}) of the sum of absolute terms, for both paths
    sep = ts.separable
    absterms = np.zeros(len(ys))
    for k in range(len(heads.a)):
        logz = ts.logz[k].ravel()
        P = np.exp(np.minimum(heads.a[k] * (xs @ ys.T) - logz[:, None], 700.0))
        absterms += abs(heads.c[k]) * (np.abs(Xi.reshape(-1, d)).sum(axis=1) * 2 * ymax) @ P
    tol_w = 2 * (4 * eta + gamma(len(xs) + 4)) * absterms
    assert sep.sum() == 3
    assert np.all(np.abs(gW.ravel() - gw_d) <= tol_w), float(np.max(np.abs(gW.ravel() - gw_d) / tol_w))
    # The μ-independent factors (shift over the whole grid, built once): the same sums, the same bounds
    a_sep = heads.a[sep]
    factors = SeparableFactors.build(xg, yg, a_sep)
    assert factors is not None and SeparableFactors.build(xg, yg, heads.a) is None  # a = 200: range too large
    sub = factors.take(a_sep[[0, 2]])
    assert sub is not None and np.array_equal(sub.a, a_sep[[0, 2]]) and factors.take(np.array([0.3])) is None
    ts_f = TensorSoftmax(xg, yg, W, a_sep, factors)
    assert ts_f.separable.all()
    gW_f, gc_f = ts_f.vjp(heads.c[sep], Xi)
    gw_s, gc_s = velocity_vjp(xs, ys, W.ravel(), HeadMeasure(a_sep, heads.c[sep]), Xi.reshape(-1, d))
    assert np.allclose(gc_f, gc_s, rtol=0, atol=tol_c), np.abs(gc_f - gc_s).max()
    assert np.all(np.abs(gW_f.ravel() - gw_s) <= tol_w), float(np.max(np.abs(gW_f.ravel() - gw_s) / tol_w))
    m_ref = np.stack([softmax_moments_direct(xs, ys, W.ravel(), ak)[1] for ak in a_sep])
    tol_m = 2 * (2 * eta + gamma(len(ys))) * ymax
    assert np.allclose(ts_f.m.reshape(len(a_sep), -1, d), m_ref, rtol=0, atol=tol_m)


@pytest.mark.parametrize("d", [1, 2])
def test_tensor_no_heads(d):
    """No heads (velocity_tensor with every c_k = 0 keeps none): V = 0 and g_W = 0, batched and not."""
    rng = np.random.default_rng(21 + d)
    xg, yg, W = _random_grids(rng, d, scale=1.0)
    none = np.zeros(0)
    for Wx, f in ((W, None), (np.stack([W, W + 0.1]), SeparableFactors.build(xg, yg, none))):
        ts = TensorSoftmax(xg, yg, Wx, none, f)
        lead = Wx.shape[: Wx.ndim - d]
        assert np.array_equal(ts.velocity(none), np.zeros((*lead, *xg.shape, d)))
        gW, gc = ts.vjp(none, rng.standard_normal((*lead, *xg.shape, d)))
        assert np.array_equal(gW, np.zeros(Wx.shape)) and gc.shape == (*lead, 0)
        assert ts.m.shape == (0, *lead, *xg.shape, d) and ts.logz.shape == (0, *lead, *xg.shape)
    if d == 2:
        v = velocity_tensor(xg, yg, W, HeadMeasure(np.array([0.5, -1.0]), np.zeros(2)))
        assert np.array_equal(v, np.zeros((*xg.shape, d)))


@pytest.mark.parametrize("d", [1, 2])
def test_tensor_batch_layout_and_subset_factors(d):
    """A batch (one sample with mass on one row of the grid only, one on one column, one random) with the shared
    factors of a subset of the cached heads (SeparableFactors.take): m, log Z, V, g_W and g_c of each sample
    equal the direct sums of that sample alone (the m and log Z properties unpack the internal layout)."""
    rng = np.random.default_rng(31 + d)
    xg, yg, W = _random_grids(rng, d, scale=1.0)
    a_all = np.array([-1.5, -0.2, 0.0, 0.8, 1.7])
    full = SeparableFactors.build(xg, yg, a_all)
    assert full is not None
    a = a_all[[0, 2, 4]]
    f = full.take(a)
    assert f is not None and f is not full
    Wb = np.zeros((3, *yg.shape))
    Wb[0] = W
    Wb[1][-1] = rng.uniform(0.5, 1.0, size=yg.shape[1:])  # the last row only (d = 1: the last point)
    Wb[2][..., 0] = rng.uniform(0.5, 1.0, size=yg.shape[:1]) if d == 2 else 0.0
    if d == 1:
        Wb[2][0] = 1.0
    c = np.array([0.6, -0.3, 1.1])
    ts = TensorSoftmax(xg, yg, Wb, a, f)
    Xi = rng.standard_normal((3, *xg.shape, d))
    V, (gW, gc), m, logz = ts.velocity(c), ts.vjp(c, Xi), ts.m, ts.logz
    xs, ys = xg.points(), yg.points()
    for s in range(3):
        w = Wb[s].ravel()
        for k, ak in enumerate(a):
            lz_d, m_d = softmax_moments_direct(xs, ys, w, ak)
            assert np.allclose(logz[k, s].ravel(), lz_d, rtol=1e-12, atol=1e-12)
            assert np.allclose(m[k, s].reshape(-1, d), m_d, rtol=0, atol=1e-12)
        assert np.allclose(V[s].reshape(-1, d), velocity(xs, ys, w, HeadMeasure(a, c)), rtol=0, atol=1e-12)
        gw_d, gc_d = velocity_vjp(xs, ys, w, HeadMeasure(a, c), Xi[s].reshape(-1, d))
        assert np.allclose(gc[s], gc_d, rtol=1e-11, atol=1e-11)
        scale = np.abs(c).sum() * np.abs(Xi[s]).sum() * 2 * np.abs(ys).max()  # Σ of the terms' sizes, a bound
        assert np.allclose(gW[s].ravel(), gw_d, rtol=0, atol=1e-12 * scale)  # (a one-point measure: g_W = 0)


def test_tensor_grid_points_order():
    g = TensorGrid((np.array([0.0, 1.0]), np.array([5.0, 6.0, 7.0])))
    assert g.shape == (2, 3)
    p = g.points()
    assert p.shape == (6, 2)
    assert np.array_equal(p[:3], [[0, 5], [0, 6], [0, 7]]) and np.array_equal(p[3], [1, 5])


# --------------------------------------------------------------------------------------------------
# Head families and the reduced head measure


def test_head_families():
    s, v = ScalarHeads(), ValueHeads(0.7)
    assert s.p == 2 and v.p == 1
    th2 = np.array([[0.1, 2.0], [-0.4, 3.0]])
    assert np.array_equal(s.a(th2), [0.1, -0.4]) and np.array_equal(s.v(th2), [2.0, 3.0])
    assert np.array_equal(s.grad_a(th2), [[1, 0], [1, 0]]) and np.array_equal(s.grad_v(th2), [[0, 1], [0, 1]])
    th1 = np.array([[2.0], [-1.0], [0.5]])
    assert np.array_equal(v.a(th1), [0.7, 0.7, 0.7]) and np.array_equal(v.v(th1), [2.0, -1.0, 0.5])
    assert np.array_equal(v.grad_a(th1), np.zeros((3, 1))) and np.array_equal(v.grad_v(th1), np.ones((3, 1)))
    assert isinstance(make_family("scalar"), ScalarHeads)
    fam = make_family("value", 0.25)
    assert isinstance(fam, ValueHeads) and fam.p == 1 and fam.a_fixed == 0.25
    with pytest.raises(ValueError):
        make_family("nope")


def test_head_measure_reduces_duplicates():
    fam = ScalarHeads()
    theta = np.array([[0.5, 1.0], [-0.2, 2.0], [0.5, 3.0], [0.1 + 0.2, 1.0], [0.3, -1.0], [0.9, 0.0], [-0.2, 1.0]])
    w = np.array([0.1, 0.2, 0.3, 0.15, 0.05, 0.1, 0.1])
    hm = HeadMeasure.from_heads(fam, theta, w)
    # a = 0.5: 0.1*1 + 0.3*3 = 1.0; a = -0.2: 0.2*2 + 0.1*1 = 0.5; a = 0.3 (0.1+0.2 merged): 0.15 - 0.05 = 0.1;
    # a = 0.9 has v = 0: dropped.
    # a = 0.1 + 0.2 is one rounding from 0.3; c and the means are sums of ≤ 7 products (≤ 8 roundings)
    assert np.allclose(hm.a, [-0.2, 0.3, 0.5], rtol=gamma(2), atol=0)
    assert np.allclose(hm.c, [0.5, 0.1, 1.0], rtol=0, atol=gamma(8) * float(np.abs(w * theta[:, 1]).sum()))
    assert len(np.unique(hm.a)) == len(hm.a)
    assert hm.abar == pytest.approx(float(w @ theta[:, 1]), abs=2 * gamma(8) * float(np.abs(w * theta[:, 1]).sum()))
    wav = np.abs(w * theta[:, 0] * theta[:, 1]).sum()
    assert hm.bbar == pytest.approx(float(w @ (theta[:, 0] * theta[:, 1])), abs=2 * gamma(9) * float(wav))
    # the velocity depends on ρ only through the reduced measure
    rng = np.random.default_rng(0)
    x, y, wy = rng.normal(size=(9, 1)), rng.normal(size=(15, 1)), rng.uniform(0.1, 1, 15)
    direct = sum(wk * th[1] * softmax_moments_direct(x, y, wy, th[0])[1] for th, wk in zip(theta, w, strict=True))
    # the same softmax evaluations in both (the reduced measure only regroups Σ_k w_k v_k m(a_k)), unless the
    # d = 1 Chebyshev path serves `velocity`: its error model is that of test_chebyshev_1d_matches_direct
    scale = float(np.abs(w * theta[:, 1]).sum()) * float(np.abs(y).max())
    E = 0.9 * float(np.max(np.abs(x @ y.T))) + float(np.max(np.abs(np.log(wy))))
    assert np.allclose(velocity(x, y, wy, hm), direct, rtol=0,
                       atol=2 * (2 * softmax_error(E, len(y), 1) + gamma(len(y) + 8)) * scale)


def test_head_measure_cancelling_and_value_family():
    fam = ScalarHeads()
    hm = HeadMeasure.from_heads(fam, np.array([[0.4, 1.0], [0.4, -1.0], [0.2, 1.0]]), np.array([0.5, 0.5, 1.0]))
    assert np.allclose(hm.a, [0.2]) and np.allclose(hm.c, [1.0])  # exact cancellation at a = 0.4 is removed
    vf = ValueHeads(0.5)
    hv = HeadMeasure.from_heads(vf, np.array([1.0, 2.0, -0.5]), np.array([0.2, 0.3, 0.5]))
    # a 3-term sum of products: γ_4 of Σ|w v| = 1.05, twice (two orders); b̄ = a ā: one more rounding
    assert np.allclose(hv.a, [0.5]) and hv.c[0] == pytest.approx(0.2 + 0.6 - 0.25, abs=2 * gamma(4) * 1.05)
    assert hv.bbar == pytest.approx(0.5 * hv.abar, abs=2 * gamma(5) * 0.5 * 1.05)


@pytest.mark.parametrize("kind", ["gaussian", "narrow", "random", "two_points", "wide_exponent"])
def test_chebyshev_1d_matches_direct(kind):
    """d = 1: the Chebyshev interpolation in s = a x (tilted_mean_1d) equals the direct log-domain sums."""
    from mfpde.heads import HeadMeasure
    from mfpde.tokens.attention import softmax_moments_direct, velocity

    rng = np.random.default_rng(3)
    L = 40.0 if kind == "wide_exponent" else 4.0
    x = np.linspace(-L, L, 301)[:, None]
    y = np.linspace(-L, L, 300)[:, None]
    w = {"gaussian": np.exp(-y[:, 0] ** 2), "narrow": np.exp(-((y[:, 0] - 2) ** 2) / 0.01),
         "random": rng.random(300), "two_points": (np.abs(y[:, 0] + 3) < 0.02) + 0.5 * (np.abs(y[:, 0] - 1) < 0.02),
         "wide_exponent": np.exp(-y[:, 0] ** 2 / 50)}[kind].astype(float)
    w /= w.sum()
    heads = HeadMeasure(np.linspace(-2.0, 2.0, 25), rng.standard_normal(25))
    V = velocity(x, y, w, heads)
    ref = sum(c * softmax_moments_direct(x, y, w, a)[1] for a, c in zip(heads.a, heads.c, strict=True))
    assert np.all(np.isfinite(V))
    # Approximation, not round-off: tilted_mean_1d stops when its last 3 Chebyshev coefficients are below
    # tol = 1e-14 of max|y|; with geometric decay (ratio ≤ 1/2 past them) the tail is ≤ 4 tol max|y|. The
    # interpolated values carry the direct path's round-off (roundoff.softmax) times the Lebesgue constant
    # of degree ≤ 512, (2/π) log 513 + 1 < 5. Summed over heads with Σ|c|.
    ymax = float(np.abs(y).max())
    wpos = w[w > 0]
    E = 2.0 * L * ymax + float(np.max(np.abs(np.log(wpos))))
    err_m = (2 * softmax_error(E, len(y), 1) + gamma(len(y))) * ymax
    bound = float(np.abs(heads.c).sum()) * (4 * 1e-14 * ymax + 5 * err_m + err_m)
    assert np.abs(V - ref).max() <= bound, (np.abs(V - ref).max(), bound)


@pytest.mark.parametrize("forward", [False, True])
@pytest.mark.parametrize("kind", ["gaussian", "narrow", "two_points", "dg1_points", "wide_exponent"])
def test_chebyshev_vjp_1d_matches_direct(kind, forward):
    """d = 1: the VJP by Chebyshev interpolation in s = a x (tokens.chebyshev) equals the direct sums.

    Bound per y, from the stopping rule: the interpolant of σ ↦ P(σ, y) = e^{σ y − Λ(σ)} errs by its tail,
    ≤ 2·4·tol·max_σ P(σ, y) (geometric decay past three coefficients below tol of the largest, |c_l| ≤ 2 max P),
    plus the round-off η of the node values times the Lebesgue constant (< 5 for degree ≤ 512); the direct
    sums carry η too. Each source j = (k, x) weighs |c_k ξ(x)| |y − m_j|. With ``forward`` the kernel's
    coefficients come from the forward's interpolant (``tilted_interpolant(..., kernel=True)``, the taped path
    of the adjoint), converged by the same rule.
    """
    from mfpde.tokens.attention import tilted_interpolant, tilted_mean_1d, velocity_vjp
    from mfpde.tokens.box.chebyshev import velocity_vjp_1d

    rng = np.random.default_rng(7)
    L = 40.0 if kind == "wide_exponent" else 4.0
    x = np.linspace(-L, L, 301)
    if kind == "dg1_points":  # two Gauss points per cell of 150 cells
        c, h = np.linspace(-L, L, 151)[:-1] + L / 150, L / 150
        y = np.sort(np.concatenate([c - h / np.sqrt(3), c + h / np.sqrt(3)]))
    else:
        y = np.linspace(-L, L, 300)
    w = {"gaussian": np.exp(-(y**2)), "narrow": np.exp(-((y - 2) ** 2) / 0.01), "dg1_points": np.exp(-(y**2) / 2),
         "two_points": (np.abs(y + 3) < 0.02) + 0.5 * (np.abs(y - 1) < 0.02),
         "wide_exponent": np.exp(-(y**2) / 50)}[kind].astype(float)
    w /= w.sum()
    heads = HeadMeasure(np.linspace(-2.0, 2.0, 25), rng.standard_normal(25))
    xi = rng.standard_normal((len(x), 1))
    interp = None
    if forward:
        s_all = np.outer(heads.a, x)
        interp = tilted_interpolant(float(s_all.min()), float(s_all.max()), y, w, kernel=True)
        if interp is None or interp.kernel_coef is None:
            assert kind in ("wide_exponent", "two_points"), "the forward's interpolant declined a case it must take"
            return
        res = velocity_vjp_1d(x[:, None], y[:, None], w, heads, xi, m=interp(s_all), interp=interp)
    else:
        res = velocity_vjp_1d(x[:, None], y[:, None], w, heads, xi)
    if kind in ("wide_exponent", "two_points") and res is None:
        # exponents to 3200, or a logistic of slope 4 in s (two atoms 4 apart): the forward's interpolant
        # (tilted_mean_1d) declines these too, and both use the direct sums
        assert tilted_mean_1d(np.outer(heads.a, x), y, w) is None
        return
    assert res is not None, "the Chebyshev VJP declined a case it must take"
    gw, gc, _ = res
    gw_d, gc_d = velocity_vjp(x[:, None], y[:, None], w, heads, xi)
    s = np.outer(heads.a, x)
    sig = np.linspace(s.min(), s.max(), 2001)
    sup = w > 0
    lam = logsumexp(sig[:, None] * y[sup][None, :] + np.log(w[sup])[None, :], axis=1)
    pmax = np.exp(np.minimum(np.max(sig[:, None] * y[None, :] - lam[:, None], axis=0), 700.0))
    m_all = softmax_moments_direct(s.reshape(-1, 1), y[:, None], w, 1.0)[1][:, 0]
    u = np.abs(heads.c[:, None] * xi[:, 0][None, :]).sum()
    spread = np.max(np.abs(y[:, None] - m_all[None, :]), axis=1)
    E = float(np.abs(s).max() * np.abs(y).max()) + float(np.max(np.abs(np.log(w[sup]))))
    eta = softmax_error(E, len(y), 1)
    bound = u * spread * pmax * (8 * 1e-14 + 6 * eta)
    assert np.all(np.abs(gw - gw_d) <= bound), float(np.max(np.abs(gw - gw_d) / bound))
    # g_c = Σ_x ξ m(a_k x): m by the forward's interpolant (test_chebyshev_1d_matches_direct's bound)
    err_m = (4 * 1e-14 + 6 * (2 * eta + gamma(len(y)))) * float(np.abs(y).max())
    assert np.allclose(gc, gc_d, rtol=0, atol=float(np.abs(xi).sum()) * err_m)


@pytest.mark.ranks  # a distributed token mesh
@pytest.mark.parametrize("half_width,var,floor,declined", [(3.0, 0.5, 1e-3, False), (12.0, 0.02, 0.0, True)])
def test_velocity_operator_tensor_paths(half_width, var, floor, declined):
    """VelocityOperator on a box (d = 2): with factors built once for the whole box (small exponent range), and
    with shifts over the support of μ where the range over the box is too large (1.5·12·24 per axis) but the
    range over the support of a narrow μ is not: both equal the direct sums at the owned vertices, to the
    softmax round-off (bound as in test_tensor_equals_direct)."""
    import dolfinx.fem

    from mfpde.mesh import box
    from mfpde.tokens.box.transport import TokenTransport

    L = half_width
    tt = TokenTransport(box(MPI.COMM_WORLD, [[-L, L]] * 2, [10, 10]), degree=0)
    u = dolfinx.fem.Function(tt.W)
    u.interpolate(lambda x: np.exp(-((x[0] - 0.3) ** 2 + (x[1] + 0.2) ** 2) / (2 * var)) + floor)
    heads = HeadMeasure(np.array([-1.5, 0.5, 1.5]), np.array([0.3, -0.4, 0.2]))
    vel = tt.velocity
    for _ in range(2):  # the second update takes the factors from the cache (or skips them, declined)
        vel.update(u, heads, linearize=True)
    assert (vel._factor_declined != b"") == declined and (vel._factor_cache is None) == declined
    lin = vel.linearization
    assert lin is not None and lin.tensor is not None and lin.tensor.separable.all()  # no direct fallback
    n = vel.n_owned
    wts = tt.quad.gather(u)
    ref = velocity(vel.x_owned, tt.quad.points, wts, heads)
    got = vel.field.x.array[: 2 * n].reshape(-1, 2)
    ys = tt.quad.points[wts > 0]
    E = 1.5 * float(np.max(np.abs(vel.x_owned @ ys.T))) + float(np.max(np.abs(np.log(wts[wts > 0]))))
    tol = 0.9 * 2 * (2 * softmax_error(E, len(ys), 2) + gamma(len(ys))) * float(np.abs(ys).max())
    assert np.allclose(got, ref, rtol=0, atol=tol), float(np.abs(got - ref).max() / tol)


@pytest.mark.parametrize("n", [2, 16, 64, 128])
def test_substituted_chebyshev_moments(n):
    """The d = 1 VJP's moments Σ_{k,i} w_ki T_m(t(a_k x_i)) by substitution (T_m(λ_k x̂ + β_k) in the Chebyshev basis
    of x̂, mfpde.tokens.box.substitution) equal numpy's Chebyshev–Vandermonde matrix at every source, to the round-off
    of the two recurrences: |T_m| ≤ 1 on [−1, 1] and each of the (n + 1)² coefficient updates and sums adds at
    most u of Σ|w|, so γ_{4(n+1)²} Σ|w| bounds the difference (measured: ~2e-17 Σ|w|); heads of both signs,
    unevenly spaced x and an interval [lo, hi] wider than the sources (the forward's interpolant's)."""
    from mfpde.tokens.box.substitution import substituted_moments as _substituted_moments

    rng = np.random.default_rng(n)
    a = np.sort(rng.uniform(-2.0, 2.0, 13))
    xs = np.sort(rng.uniform(-3.0, 5.0, 57))
    W = rng.standard_normal((2, len(a), len(xs)))
    src = np.outer(a, xs)
    lo, hi = float(src.min()) - 0.3, float(src.max()) + 0.1
    t = (2.0 * src.ravel() - (lo + hi)) / (hi - lo)
    ref = (W.reshape(2, -1) @ np.polynomial.chebyshev.chebvander(t, n)).T
    got = _substituted_moments(a, xs, W, lo, hi, n)
    assert got is not None and got.shape == (n + 1, 2)
    tol = gamma(4 * (n + 1) ** 2) * np.abs(W).sum(axis=(1, 2))
    assert np.all(np.abs(got - ref) <= tol), float(np.max(np.abs(got - ref) / tol))
    assert _substituted_moments(a, np.full(5, 0.7), W[:, :, :5], lo, hi, n) is None  # one x: no x̂


@pytest.mark.parametrize("n", [2, 16, 64, 128])
def test_substituted_chebyshev_values(n):
    """The forward's interpolant at every source s = a_k x_i by substitution (TiltedInterpolant.outer) equals
    numpy's Clenshaw (chebval) at each source to γ_{4(n+1)²} Σ|c| (|T_m| ≤ 1 on [−1, 1], as for the moments)."""
    from mfpde.tokens.attention import TiltedInterpolant

    rng = np.random.default_rng(100 + n)
    a = np.sort(rng.uniform(-2.0, 2.0, 11))
    xs = rng.uniform(-3.0, 5.0, 41)  # unsorted
    src = np.outer(a, xs)
    interp = TiltedInterpolant(float(src.min()) - 0.2, float(src.max()) + 0.05, n, rng.standard_normal(n + 1))
    t = (2.0 * src - (interp.lo + interp.hi)) / (interp.hi - interp.lo)
    ref = np.polynomial.chebyshev.chebval(t, interp.coef)
    got = interp.outer(a, xs)
    assert got.shape == (len(a), len(xs))
    tol = gamma(4 * (n + 1) ** 2) * np.abs(interp.coef).sum()
    assert np.all(np.abs(got - ref) <= tol), float(np.max(np.abs(got - ref) / tol))
