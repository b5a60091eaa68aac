"""The unstructured-mesh attention path (mfpde.tokens.box.interpolated, d = 2): tilted means on a Chebyshev grid,
interpolated, and the exact transpose of that map, against the direct log-domain sums (theory §1.3 (F), §3.1 (B))."""

from __future__ import annotations

import math

from mpi4py import MPI

import dolfinx.fem
import numpy as np
import pytest
from roundoff import gamma, softmax_error

from mfpde.fitting import fit_order
from mfpde.heads import HeadMeasure
from mfpde.mesh import box
from mfpde.tokens.attention import velocity, velocity_vjp
from mfpde.tokens.box.interpolated import InterpolatedSoftmax
from mfpde.tokens.box.transport import TokenTransport

pytestmark = pytest.mark.ranks  # the rank count can change what it checks: run again under mpiexec

TOL = 1e-14  # the stopping rule's tail tolerance (InterpolatedSoftmax default)


def _bound(x, y, w, a, n):
    """Error of an interpolated tilted mean: the series tail, ≤ 2·4·TOL·max|y| per direction (three coefficients
    below TOL, geometric decay after them, as in the d = 1 path), plus the softmax round-off of the grid values
    (Blanchard, Higham & Higham 2021) times the 2-D Lebesgue constant of Chebyshev points, Λ² with
    Λ ≤ (2/π) log(n + 1) + 1; the direct sums carry the round-off once more."""
    ymax = float(np.abs(y).max())
    sup = w > 0
    E = float(np.abs(a).max()) * float(np.max(np.abs(x @ y[sup].T))) * 2 + float(np.max(np.abs(np.log(w[sup]))))
    eta = 2 * softmax_error(E, int(sup.sum()), 2) + gamma(int(sup.sum()))
    lebesgue = (2 / math.pi * math.log(n + 1) + 1) ** 2
    return (16 * TOL + (lebesgue + 1) * eta) * ymax


@pytest.mark.parametrize("seed", [0, 1])
def test_interpolated_equals_direct(seed):
    """Velocity and VJP of scattered points in a disk: the grid path equals the direct sums to the bound."""
    rng = np.random.default_rng(seed)
    r, th = np.sqrt(rng.uniform(0, 1, 2500)), rng.uniform(0, 2 * np.pi, 2500)
    x = np.stack([r * np.cos(th), r * np.sin(th)], axis=1)
    y = 0.98 * x[:1500]
    w = np.exp(-((y - [0.1, -0.2]) ** 2).sum(axis=1) / 0.2)
    w /= w.sum()
    heads = HeadMeasure(np.array([-2.0, -0.5, 0.0, 1.0, 2.0, 300.0]), rng.standard_normal(6))
    S = InterpolatedSoftmax(np.array([[-1.0, 1.0], [-1.0, 1.0]]), y, w, heads.a, max_points=len(x))
    assert S.ok and list(S.rest) == [5]  # |a| = 300: exponent range too large for the grid, direct sums
    V = S.velocity(x, heads.c)
    ref = velocity(x, y, w, heads)
    bound = float(np.abs(heads.c).sum()) * _bound(x, y, w, heads.a[:5], S.n)
    assert np.abs(V - ref).max() <= bound, (np.abs(V - ref).max(), bound)
    # the VJP of the grid heads: the exact transpose of the interpolated map, so against the direct sums it
    # differs by the same interpolation error, weighted by |ξ| and |y − m| (≤ 2 max|y|) and by the kernel
    xi = rng.standard_normal((len(x), 2))
    grid = HeadMeasure(heads.a[:5], heads.c[:5])
    gw, gc = S.vjp(S.grid_cotangent(x, xi), heads.c)
    gw_d, gc_d = velocity_vjp(x, y, w, grid, xi)
    assert gc[5] == 0.0 and np.all(gw != 0)
    eps_m = _bound(x, y, w, grid.a, S.n) / float(np.abs(y).max())  # relative error of the grid values
    P = np.stack([np.exp(np.minimum(a * (x @ y.T) - np.log(np.exp(a * (x @ y.T)) @ w)[:, None], 700.0))
                  for a in grid.a])  # e^{a x·y}/Z, (K, N_x, N_y)
    scale = np.einsum("k,x,kxy->y", np.abs(grid.c), np.abs(xi).sum(axis=1), P) * 2 * float(np.abs(y).max())
    assert np.all(np.abs(gw - gw_d) <= 4 * eps_m * scale + 1e-300), float(np.max(np.abs(gw - gw_d) / scale))
    assert np.allclose(gc[:5], gc_d, rtol=0, atol=float(np.abs(xi).sum()) * _bound(x, y, w, grid.a, S.n))


def test_interpolated_vjp_is_the_transpose():
    """Directional derivative of Σ_x ξ·V_h(w) along a mass-zero δw (central differences, O(ε²)) equals g_w·δw."""
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (1500, 2))
    y = rng.uniform(-0.9, 0.9, (800, 2))
    w = np.exp(-(y**2).sum(axis=1) / 0.3)
    w /= w.sum()
    dw = rng.standard_normal(len(w)) * w
    dw -= dw.sum() / len(w)
    a, c = np.linspace(-1.5, 1.5, 7), rng.standard_normal(7)
    xi = rng.standard_normal((len(x), 2))
    box_ = np.array([[-1.0, 1.0], [-1.0, 1.0]])
    S = InterpolatedSoftmax(box_, y, w, a, max_points=len(x))
    gw, _ = S.vjp(S.grid_cotangent(x, xi), c)

    def F(eps):
        Se = InterpolatedSoftmax(box_, y, w + eps * dw, a, max_points=len(x))
        assert Se.n == S.n
        return float((xi * Se.velocity(x, c)).sum())

    eps = 1e-4
    fd = (F(eps) - F(-eps)) / (2 * eps)
    assert abs(fd - gw @ dw) <= 1e-6 * abs(gw @ dw) + 1e-12, (fd, gw @ dw)


def test_unstructured_mesh_takes_the_grid_path():
    """A triangle mesh with enough vertices evaluates the velocity on the grid; the field equals the direct sums
    at the owned vertices to the bound, on any number of ranks (the grid is the global bounding box's)."""
    tt = TokenTransport(box(MPI.COMM_WORLD, [[-1.5, 1.5]] * 2, [40, 40], "triangle"), degree=0)
    assert tt.velocity.grid is None
    u = dolfinx.fem.Function(tt.W)
    u.interpolate(lambda x: np.exp(-((x[0] - 0.3) ** 2 + x[1] ** 2) / 0.3))
    heads = HeadMeasure(np.linspace(-2.0, 2.0, 9), np.linspace(0.1, -0.3, 9))
    vel = tt.velocity
    vel.update(u, heads, linearize=True)
    assert vel.linearization is not None and vel.linearization.interp2d is not None
    wts = tt.quad.gather(u)
    ref = velocity(vel.x_owned, tt.quad.points, wts, heads)
    got = vel.field.x.array[: 2 * vel.n_owned].reshape(-1, 2)
    bound = float(np.abs(heads.c).sum()) * _bound(vel.x_owned, tt.quad.points, wts, heads.a,
                                                   vel.linearization.interp2d.n)
    assert np.abs(got - ref).max(initial=0.0) <= bound


def test_taylor_on_the_grid_path():
    """The discrete adjoint through the grid path on structured triangles (30×30; verify's
    adjoint_taylor_interpolated runs the same on a gmsh disk): the Taylor remainder falls like ε² (slope 2 ± 0.1)."""
    from mfpde.verify.adjoint import interpolated_taylor_errors

    domain = box(MPI.COMM_WORLD, [[-1.5, 1.5]] * 2, [30, 30], "triangle")
    eps, errs, pred, taken = interpolated_taylor_errors(domain=domain)
    assert taken and abs(pred) > 1e-6
    slope = fit_order(eps, errs)
    assert abs(slope - 2.0) < 0.1, f"Taylor slope {slope:.3f}, errors {errs}"
