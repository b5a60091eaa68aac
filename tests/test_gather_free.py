"""The gather-free token velocity on the box (mfpde.tokens.box.reduced): each rank's kernel sums on the Chebyshev
grid of the global bounding box, one reduction, against the direct log-domain sums (theory §1.3 (F)); the same on any
number of ranks; no gather of μ; the gathered paths unchanged where it is not used."""

from __future__ import annotations

import math

from mpi4py import MPI

import dolfinx.fem
import numpy as np
import pytest
from roundoff import gamma, softmax_error

from mfpde.heads import HeadMeasure
from mfpde.mesh import box
from mfpde.tokens.attention import softmax_moments_direct
from mfpde.tokens.box.quadrature import TokenQuadrature
from mfpde.tokens.box.transport import TokenTransport

pytestmark = pytest.mark.ranks  # sums split over ranks: what the rank count can change

TOL = 1e-14  # the stopping rule's tail tolerance (reduced_tilted_interpolant, InterpolatedSoftmax defaults)
HEADS = HeadMeasure(np.linspace(-2.0, 2.0, 5), np.array([0.1, -0.3, 0.2, 0.25, -0.15]))
CASES = [(1, [400], "quadrilateral", 0), (1, [300], "quadrilateral", 1), (2, [40, 40], "quadrilateral", 0),
         (2, [24, 24], "triangle", 1)]


def _problem(comm, d, cells, cell, degree):
    tt = TokenTransport(box(comm, [[-1.5, 1.5]] * d, cells, cell), degree=degree)
    u = dolfinx.fem.Function(tt.W)
    u.interpolate(lambda x: np.exp(-((x[0] - 0.3) ** 2 + (x[1] + 0.2) ** 2) / 0.3) + 0.05)
    return tt, u


def _lebesgue(n: int) -> float:
    """Λ_n ≤ (2/π) log(n + 1) + 1, the Lebesgue constant of the n + 1 Chebyshev points (ATAP Thm 15.2)."""
    return 2 / math.pi * math.log(n + 1) + 1


def _bound(x, y, w, heads, d):
    """|V_reduced − V_direct| at x: per head |c_k| times [the series tail, ≤ 2·4·TOL·max|y| per direction (the last
    three coefficients below TOL, geometric decay after them: the rule of the d = 1 and grid paths), plus the softmax
    round-off of the grid values (Blanchard, Higham & Higham 2021) times the d-dimensional Lebesgue constant Λ^d at
    the largest degree tried (64 in d = 2, 512 in d = 1); the direct sums carry the round-off once more]."""
    ymax = float(np.abs(y).max())
    sup = w > 0
    E = float(np.abs(heads.a).max()) * float(np.max(np.abs(x @ y[sup].T))) * 2 + float(np.max(np.abs(np.log(w[sup]))))
    eta = 2 * softmax_error(E, int(sup.sum()), d) + gamma(int(sup.sum()))
    lebesgue = _lebesgue(64 if d == 2 else 512) ** d
    return float(np.abs(heads.c).sum()) * (8 * d * TOL + (lebesgue + 1) * eta) * ymax


def _refuse_gather(monkeypatch):
    """From here on TokenQuadrature.gather (and its Allgatherv) raise: the test fails if μ is gathered (call it
    after the set-up, which gathers the quadrature points once)."""
    def refuse(*args, **kwargs):
        raise AssertionError("μ was gathered")

    monkeypatch.setattr(TokenQuadrature, "gather", refuse)
    monkeypatch.setattr(TokenQuadrature, "_allgather", refuse)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"d{c[0]}-{c[2]}-DG{c[3]}")
def test_reduced_velocity_equals_direct_sums(case, monkeypatch):
    """The gather-free velocity at every local vertex equals the direct log-domain sums over the whole of μ within
    the derived bound, and no rank gathers μ to compute it."""
    tt, u = _problem(MPI.COMM_WORLD, *case)
    v, d = tt.velocity, case[0]
    wts = tt.quad.gather(u)  # the reference's μ, before gathering is refused
    ref = sum(ck * softmax_moments_direct(v.x, tt.quad.points, wts, ak)[1]
              for ak, ck in zip(HEADS.a, HEADS.c, strict=True))
    v.gather_free = True
    _refuse_gather(monkeypatch)
    v.update(u, HEADS)
    assert v.path == "reduced"
    got = v.field.x.array.reshape(-1, d)
    bound = _bound(v.x, tt.quad.points, wts, HEADS, d)
    err = float(np.abs(got - ref).max(initial=0.0))
    assert err <= bound, (err, bound)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"d{c[0]}-{c[2]}-DG{c[3]}")
def test_reduced_velocity_is_the_same_on_any_number_of_ranks(case, monkeypatch):
    """The same velocity on COMM_WORLD (the ranks of the run: 1, 2 or 3) as on one rank (COMM_SELF), vertex by
    vertex: the same nodes, shifts, exponentials and stopping rule, only the order of the sums over y differs, so
    every grid value m = N/Z moves by at most 2 · 2γ_{N_y} max|y| (Higham eq. (4.4), twice: two orders, N and Z),
    and the interpolant by Λ^d times that, per head."""
    d = case[0]
    here, u = _problem(MPI.COMM_WORLD, *case)
    one, u1 = _problem(MPI.COMM_SELF, *case)
    _refuse_gather(monkeypatch)
    for tt, uu in ((here, u), (one, u1)):
        tt.velocity.gather_free = True
        tt.velocity.update(uu, HEADS)
        assert tt.velocity.path == "reduced"
    n_y = one.quad.counts.sum()
    ymax = float(np.abs(one.quad.local_points).max())
    bound = float(np.abs(HEADS.c).sum()) * _lebesgue(64 if d == 2 else 512) ** d * 4 * gamma(n_y) * ymax
    key1 = {tuple(np.round(x, 9)): i for i, x in enumerate(one.velocity.x)}
    idx = np.array([key1[tuple(np.round(x, 9))] for x in here.velocity.x], dtype=np.int64)
    a = here.velocity.field.x.array.reshape(-1, d)
    b = one.velocity.field.x.array.reshape(-1, d)[idx]
    err = float(np.abs(a - b).max(initial=0.0))
    assert err <= bound, (err, bound)


def test_linearised_update_gathers_and_the_vjp_is_unchanged():
    """A linearised update takes the gathered path even where plain updates do not (its VJP is the transpose of
    the map it evaluated), and its field and VJP are those of gather_free = False bit for bit."""
    tt, u = _problem(MPI.COMM_WORLD, 2, [24, 24], "triangle", 1)
    v = tt.velocity
    xi = dolfinx.fem.Function(v.P)
    xi.x.array[:] = np.sin(np.arange(len(xi.x.array)))
    out = []
    for mode in (True, False):
        v.gather_free = mode
        v.update(u, HEADS, linearize=True)
        assert v.path == "gathered" and v.linearization is not None
        out.append((v.field.x.array.copy(), *v.vjp(xi)))
    for p, q in zip(*out, strict=True):
        assert np.array_equal(p, q)


@pytest.mark.parametrize("case", CASES[::2], ids=lambda c: f"d{c[0]}")
def test_default_keeps_the_gathered_path_on_one_rank(case):
    """gather_free = None (the default): one rank gathers as before, bit for bit the field of gather_free = False;
    more ranks take the reduced path where its first message is not larger than the gather's and, on a d = 2 tensor
    grid, its sums cost less than the separable product."""
    tt, u = _problem(MPI.COMM_WORLD, *case)
    v = tt.velocity
    v.update(u, HEADS)
    first, path = v.field.x.array.copy(), v.path
    v.gather_free = False
    v.update(u, HEADS)
    d, n_y = case[0], int(tt.quad.counts.sum())
    pays = 17 ** d * (d + 1) * (1 if d == 1 else len(HEADS.a)) <= n_y
    if d == 2:  # a tensor grid: the grid sums against the separable product (velocity._GRID_COST = 2.4)
        (m1, m2), (n1, n2) = v.grid.shape, tt.quad.grid_axes.shape
        pays = pays and 2.4 * 17**2 * int(tt.quad.counts.max()) <= m1 * n1 * n2 + m1 * m2 * n2
    assert path == ("reduced" if MPI.COMM_WORLD.size > 1 and pays else "gathered"), (path, n_y)
    if path == "gathered":
        assert np.array_equal(first, v.field.x.array)


def test_a_head_too_sharp_for_the_grid_falls_back_to_the_gather():
    """d = 2 with |a| = 300: the exponent range over the support exceeds what the grid takes, and no rank has the
    direct sums without all of μ: every rank gathers (the same decision on every rank) and V is the direct sums'."""
    tt, u = _problem(MPI.COMM_WORLD, 2, [24, 24], "triangle", 0)
    heads = HeadMeasure(np.array([1.0, 300.0]), np.array([0.5, 0.5]))
    v = tt.velocity
    v.gather_free = True
    v.update(u, heads)
    assert v.path == "gathered"
    v.gather_free = False
    ref = v.field.x.array.copy()
    v.gather_free = True
    v.update(u, heads)
    assert np.array_equal(v.field.x.array, ref)


def test_zero_density_gives_zero_velocity(monkeypatch):
    """μ = 0 in d = 1: V = 0, decided from one MAX reduction, without a gather."""
    tt, u = _problem(MPI.COMM_WORLD, 1, [64], "quadrilateral", 0)
    u.x.array[:] = 0.0
    _refuse_gather(monkeypatch)
    tt.velocity.gather_free = True
    tt.velocity.field.x.array[:] = 1.0
    tt.velocity.update(u, HEADS)
    assert tt.velocity.path == "reduced" and not np.any(tt.velocity.field.x.array)


def test_reduced_interpolant_is_the_serial_one_on_one_rank():
    """On one rank the distributed d = 1 interpolant is tilted_interpolant's: the same nodes, shifts and stopping
    rule, so the same degree, and coefficients that differ only by rounding (the weights enter as log w in the
    exponent here, as factors there), within 4γ_{N_y} max|y| Λ_n."""
    from mfpde.tokens.attention import tilted_interpolant
    from mfpde.tokens.box.reduced import reduced_tilted_interpolant

    y = np.linspace(-1.0, 1.0, 500)
    w = np.exp(-((y - 0.2) ** 2) / 0.1)
    a = reduced_tilted_interpolant(MPI.COMM_SELF, -3.0, 3.0, y, w, 1.0)
    b = tilted_interpolant(-3.0, 3.0, y, w)
    assert a is not None and b is not None and a.n == b.n
    assert np.abs(a.coef - b.coef).max() <= 4 * gamma(len(y)) * _lebesgue(a.n)


def test_unconverged_series_falls_back_to_the_gather(monkeypatch):
    """d = 1 where the series does not converge (here: a degree cap of 16 on a sharp μ): every rank gathers, the
    field is the gathered one bit for bit, and the next evaluation starts at the largest degree."""
    import mfpde.tokens.box.velocity as velocity_module
    from mfpde.tokens.attention import CHEBYSHEV_DEGREES
    from mfpde.tokens.box.reduced import reduced_tilted_interpolant

    tt, u = _problem(MPI.COMM_WORLD, 1, [400], "quadrilateral", 0)
    heads = HeadMeasure(np.array([40.0]), np.array([1.0]))
    v = tt.velocity
    v.gather_free = False
    v.update(u, heads)
    ref = v.field.x.array.copy()
    monkeypatch.setattr(velocity_module, "reduced_tilted_interpolant",
                        lambda *args, **kw: reduced_tilted_interpolant(*args, **{**kw, "max_degree": 16}))
    v.gather_free = True
    v.update(u, heads)
    assert v.path == "gathered" and np.array_equal(v.field.x.array, ref)
    assert v._reduced_degree == CHEBYSHEV_DEGREES[-1]
