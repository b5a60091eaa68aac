"""Checks of the DG solver on S² (theory §9), each against a reference the solver does not produce.

* ``sphere_rotation``: solid-body rotation v = ω × x of a Gaussian cap to T = π/2 against the exactly rotated
  cap (scipy's Rotation), relative L2 error. DG1 on the flat icosphere, refine 1..3: the error at 1280 cells is
  below Gusto's 2.5e-2 and falls at order ≥ 2 − 0.25 in the longest edge (DG1 and the flat geometry are both
  O(h²)); full: also DG2 on the quadratic geometry at order ≥ 3 − 0.25.
* ``sphere_mass_positivity``: cluster formation (SA, β = 8, from degrees 2 and 3, to T = 2.5) by DG0, DG1 (flat)
  and DG2 (quadratic; full: also on 320 cells): ∫μ_h kept within the round-off bound of its operation count (ε
  per operation, k(Q(k+3) + 3E(k+1)) operations a dof a stage, 3 stages a sub-step) and μ_h ≥ −(2k+8)ε max μ_h
  on a lattice of step 1/12 in every cell (points the limiter does not use for p ≤ 1), at every depth step.

* ``sphere_cfl_substeps``: the sub-steps of one depth step of DG0..DG3 against the CFL rule of theory §9
  recomputed from the cells' vertices and the Gauss–Lobatto rule (:func:`cfl_rule_dt`).
* ``sphere_quadrature``: the volume and edge rules of the DG tables against polynomials of the degrees they
  promise (2p + 2, 2p + 3), to round-off (:func:`quadrature_errors`).

All run on the ranks of ``COMM_WORLD`` (the mesh distributed).
"""

from __future__ import annotations

import math
import time

from mpi4py import MPI

import numpy as np
from scipy.spatial.transform import Rotation

from mfpde.fitting import fit_order
from mfpde.tokens.sphere.dg import SphereDG
from mfpde.tokens.sphere.geometry import lattice
from mfpde.tokens.sphere.harmonics import real_harmonics
from mfpde.tokens.sphere.mesh import edge_lengths, icosphere
from mfpde.tokens.sphere.velocity import DirectVelocity, RotationVelocity
from mfpde.verify.registry import Outcome, Series, register

__all__ = ["dense_minimum", "rotation_error"]

#: CPU budget of one check (seconds): quick, full.
BUDGET_S = {True: 120.0, False: 600.0}
EPS = 2.0**-52
GUSTO_L2 = 2.5e-2
OMEGA = np.array([1.0, 0.0, 0.0])


def _cap(x: np.ndarray) -> np.ndarray:
    return np.exp(-8.0 * (1.0 - x[:, 2]))


def rotation_error(refine: int, degree: int, order: int, deadline: float = math.inf) -> tuple[float, float]:
    """(relative L2 error of the rotated cap at T = π/2, the longest edge) on ``COMM_WORLD``."""
    T = math.pi / 2
    op = SphereDG(icosphere(MPI.COMM_WORLD, refine, order), degree, RotationVelocity(OMEGA))
    rep = op.solve(op.project(_cap), T, 2, deadline=deadline)
    back = Rotation.from_rotvec(OMEGA * T).inv()
    return op.l2_error(rep.mu_T, lambda x: _cap(back.apply(x))) / op.l2_error(rep.mu_T), edge_lengths(op.mesh)[1]


def _start(x: np.ndarray) -> np.ndarray:
    """1/4π + 0.06 Y_20 + 0.05 Y_30 + 0.03 Y_32: a positive start of degrees 2 and 3."""
    Y = real_harmonics(3, x)
    return np.asarray(1 / (4 * math.pi) + 0.06 * Y[:, 6] + 0.05 * Y[:, 12] + 0.03 * Y[:, 14])


def dense_minimum(op: SphereDG, mu: object, n: int = 12) -> float:
    """The minimum of μ_h on the lattice of step 1/n of every owned cell, over all ranks."""
    lat = np.asarray(op.V.element.basix_element.tabulate(0, lattice(n)), dtype=float)[0, :, :, 0]
    u = op._arr(mu)[op.t.dofs[:op.t.n_owned]]  # type: ignore[arg-type]
    lo = float((u @ lat.T).min()) if len(u) else math.inf
    return float(op.comm.allreduce(lo, op=MPI.MIN))


@register("sphere_rotation", "§9 (ii) solid-body rotation", "the exactly rotated density (scipy Rotation)",
          kind="L2 error", budget_s=BUDGET_S[False])
def check_sphere_rotation(quick: bool) -> Outcome:
    """DG1 flat: error at 1280 cells ≤ 2.5e-2 and order ≥ 1.75; full: DG2 quadratic order ≥ 2.75."""
    deadline = time.process_time() + BUDGET_S[quick]
    runs = [(1, 1, 2.0)] + ([] if quick else [(2, 2, 3.0)])
    ok, lines, series, qs = True, [], [], []
    for p, order, expected in runs:
        errs, hs = [], []
        for r in (1, 2, 3):
            e, h = rotation_error(r, p, order, deadline)
            errs.append(e)
            hs.append(h)
        q = fit_order(hs, errs)
        qs.append(q - expected)
        good = q > expected - 0.25 and (p != 1 or errs[-1] < GUSTO_L2)
        ok &= good
        lines.append(f"DG{p} geometry order {order}: L2 error {', '.join(f'{e:.2e}' for e in errs)} at 80, 320, "
                     f"1280 cells, order {q:.2f} (≥ {expected - 0.25:g})" + (f", < {GUSTO_L2:g} at 1280" if p == 1
                                                                            else ""))
        series.append(Series(hs, errs, "longest edge h", expected, q, f"DG{p} (geometry {order})"))
    return Outcome(series[0].err[-1], None, f"< {GUSTO_L2:g} (Gusto, 1280 cells); order ≥ p+1 − 0.25", ok,
                   "; ".join(lines), series, GUSTO_L2)


@register("sphere_mass_positivity", "§9 (iii) conservation, positivity",
          "round-off bounds from the operation count; μ_h on a dense lattice of every cell",
          kind="ratio to bound", budget_s=BUDGET_S[False])
def check_sphere_mass_positivity(quick: bool) -> Outcome:
    """Mass and the dense minimum over their round-off bounds (≤ 1) through cluster formation; clusters formed."""
    comm = MPI.COMM_WORLD
    deadline = time.process_time() + BUDGET_S[quick]
    runs = [(0, 2, 1), (1, 1, 1), (2, 1, 2)] + ([] if quick else [(1, 2, 1), (2, 2, 2)])  # (degree, refine, geometry)
    ok, lines, worst = True, [], 0.0
    for p, r, order in runs:
        op = SphereDG(icosphere(comm, r, order), p, DirectVelocity(8.0, "softmax", comm))
        mu = op.project(_start)
        mins: list[float] = []
        tops: list[float] = []

        def watch(k: int, t: float, m: object, op: SphereDG = op, mins: list[float] = mins,
                  tops: list[float] = tops) -> None:
            if k:
                mins.append(dense_minimum(op, m))
                tops.append(comm.allreduce(float(np.abs(m.x.array).max()), op=MPI.MAX))  # type: ignore[attr-defined]

        rep = op.solve(mu, 2.5, 5, callback=watch, deadline=deadline)
        k, Q, E = op.t.phi.shape[1], op.t.phi.shape[0], op.t.we.shape[1]
        ops = k * (Q * (k + 3) + 3 * E * (k + 1)) + 10
        mass_tol = (3 * rep.substeps * ops + 2 * op.V.dofmap.index_map.size_global * k) * EPS
        min_tol = (2 * k + 8) * EPS * max(tops)
        peak = comm.allreduce(float(op.cell_means(rep.mu_T).max(initial=0.0)), op=MPI.MAX) * 4 * math.pi
        good = rep.mass_error <= mass_tol and min(mins) >= -min_tol and peak > 3.0
        ok &= good
        worst = max(worst, rep.mass_error / mass_tol, -min(mins) / min_tol)
        lines.append(f"DG{p} r={r} geometry {order}: mass error {rep.mass_error:.1e} (≤ {mass_tol:.0e}), dense min "
                     f"{min(mins):.1e} (≥ {-min_tol:.0e}), peak {peak:.2f}× uniform (> 3), {rep.substeps} sub-steps, "
                     f"{rep.limited_cells} cells limited")
    return Outcome(worst, None, "≤ 1 (mass, min over their round-off bounds); clusters > 3× uniform", ok,
                   "; ".join(lines), tolerance=1.0)


#: The Zhang–Xia–Shu positivity factor of DG_p, p ≥ 1, on triangles (J. Sci. Comput. 50, 2012: the cell mean is a
#: convex combination of the edge values and interior values once Δt Σ_e |e| max|u_n| / |K| ≤ (2/3) ŵ₁).
ZXS_FACTOR = 2.0 / 3.0


def lobatto_first_weight(p: int) -> float:
    """ŵ₁, the end-point weight on [0, 1] of the fewest Gauss–Lobatto points (N ≥ 2) exact for degree p (2N − 3 ≥ p).

    Computed from the rule itself (numpy): the nodes ±1 and the roots of P'_{N−1}, the weights from the moment
    equations Σ w_i x_iᵏ = ∫_{−1}^1 xᵏ dx, k < N, halved for [0, 1]. Nothing of the solver is called.
    """
    n = 2
    while 2 * n - 3 < p:
        n += 1
    inner = np.polynomial.legendre.Legendre.basis(n - 1).deriv().roots() if n > 2 else np.zeros(0)
    x = np.concatenate([[-1.0], np.sort(np.real(inner)), [1.0]])
    k = np.arange(n)
    w = np.linalg.solve(np.vander(x, n, increasing=True).T, (1.0 - (-1.0) ** (k + 1)) / (k + 1))
    return float(w[0] / 2)


def _flat_cells(op: SphereDG) -> tuple[np.ndarray, np.ndarray]:
    """The vertices (C, 3, 3) of the owned cells of a flat surface mesh and the shared vertices (F, 2, 3) of its edges.

    From the mesh's geometry nodes alone (not the solver's tables of areas, lengths and weights).
    """
    geo = op.mesh.geometry
    gdm = np.asarray(geo.dofmaps[0])
    if gdm.shape[1] != 3:
        raise ValueError("a flat (order 1) surface mesh is needed")
    verts = geo.x[gdm[:op.t.n_owned]]
    ends = np.empty((len(op.t.cells), 2, 3))
    for f, (a, b) in enumerate(op.t.cells):
        shared = np.intersect1d(gdm[a], gdm[b])
        ends[f] = geo.x[shared]
    return verts, ends


def cfl_rule_dt(op: SphereDG, vel: object) -> float:
    """The sub-step the CFL rule of theory §9 allows for ``vel`` (a :class:`SphereVel`), recomputed. Collective.

    Areas |K| and edge lengths |e| from the flat cells' vertices; DG0: Δt Σ_e ∫_e u_n⁺ ds / |K| ≤ cfl (∫_e by
    numpy's Gauss–Legendre rule of the edge's points); DG_p, p ≥ 1: Δt Σ_e |e| max_e |u_n| / |K| ≤ cfl·(2/3)ŵ₁
    (:func:`lobatto_first_weight`). The solver's normal velocity u_n at its edge points is the input (the
    velocity is not what is checked here: the rule is).
    """
    un = np.asarray(vel.un)  # type: ignore[attr-defined]
    verts, ends = _flat_cells(op)
    area = 0.5 * np.linalg.norm(np.cross(verts[:, 1] - verts[:, 0], verts[:, 2] - verts[:, 0]), axis=1)
    length = np.linalg.norm(ends[:, 1] - ends[:, 0], axis=1)
    t = op.t
    if op.degree == 0:
        ws = 0.5 * np.polynomial.legendre.leggauss(un.shape[2])[1]
        out = (np.maximum(un[t.cell_edges, t.cell_sides], 0.0) @ ws * length[t.cell_edges]).sum(axis=1)
        bound = 1.0
    else:
        out = (np.abs(un).max(axis=(1, 2)) * length)[t.cell_edges].sum(axis=1)
        bound = ZXS_FACTOR * lobatto_first_weight(op.degree)
    ratio = float((out / area).max(initial=0.0))
    ratio = float(op.comm.allreduce(ratio, op=MPI.MAX))
    return op.cfl * bound / ratio if ratio > 0 else math.inf


#: Sub-steps aimed at in ``sphere_cfl_substeps`` (the depth step is this many times the rule's sub-step, plus ½):
#: a sub-step 1.5 times too long takes 9 of the rule's 13, one 3 times too long 5.
CFL_TARGET = 12.5


@register("sphere_cfl_substeps", "§9 (CFL, positivity)",
          "the CFL rule of §9 recomputed from the cells' vertices and the Gauss–Lobatto rule (numpy)",
          kind="sub-steps", budget_s=60.0)
def check_sphere_cfl_substeps(quick: bool) -> Outcome:
    """The sub-steps of one depth step of DG0..DG3 (rotation, flat icosphere) = ⌈Δt/Δt_rule⌉ exactly.

    Δt_rule is :func:`cfl_rule_dt` (DG0's upwind bound, Zhang–Xia–Shu's for p ≥ 1), the depth step
    Δt = 12.5 Δt_rule, so the rule takes 13 sub-steps and a rule off by a factor r ≠ 1 takes about 13/r. The row:
    the sub-steps taken by the degree farthest from the rule (the last when all agree), against the rule's; equal
    passes (1 apart too where Δt/Δt_rule is within 1e-9 of an integer, where the rounding of either is the rule).
    """
    comm = MPI.COMM_WORLD
    ok, lines, worst, row = True, [], -1.0, (0.0, 0.0)
    mesh = icosphere(comm, 1, 1)
    for p in (0, 1, 2, 3):
        op = SphereDG(mesh, p, RotationVelocity(np.array([0.3, 0.2, 1.0])))
        mu = op.project(_cap)
        dt_rule = cfl_rule_dt(op, op.velocity(np.asarray(mu.x.array)))
        T = CFL_TARGET * dt_rule
        r = T / dt_rule
        need = math.ceil(r)
        taken = op.solve(mu, T, 1).substeps_per_step[0]
        slack = 1 if abs(r - round(r)) < 1e-9 else 0
        off = abs(taken - need)
        ok &= off <= slack
        if off >= worst:
            worst, row = float(off), (float(taken), float(need))
        lines.append(f"DG{p}: {taken} sub-steps, rule {need} (Δt_rule {dt_rule:.4g}"
                     + (f", ŵ₁ = {lobatto_first_weight(p):.4g}" if p else "") + ")")
    return Outcome(row[0], row[1], "= 0 (the sub-steps taken against ⌈Δt/Δt_rule⌉, DG0..DG3)", ok, "; ".join(lines),
                   tolerance=0.0)


def _gamma(n: int) -> float:
    return n * EPS / 2 / (1 - n * EPS / 2)


def quadrature_errors(op: SphereDG) -> tuple[float, float, int, int]:
    """(cell, edge) relative errors over their round-off bounds of the solver's rules on polynomials; their degrees.

    Flat cells: ∫_K x̂ᵃŷᵇ = 2|K| a! b!/(a+b+2)! on the reference coordinates (a + b ≤ 2p + 2, the volume rule's
    degree); edges: ∫_e sʲ ds = |e|/(j + 1), s the arc length over |e| from an end (j ≤ 2p + 3, the p + 2 Gauss
    points'), |K| and |e| from the vertices. The volume points are the tables' reference points with their
    weights ω|J|, the edge points side 0's reference points mapped onto the flat cell, with ω ds. Bound: the
    relative round-off of a sum of Q (E) positive terms, each a power of degree ≤ d times a weight made in ≤ 48
    operations (the metric, a determinant, a square root; the exact value's cross product and factorials),
    γ_{Q+d+48} (γ_{E+d+48}), doubled. Collective.
    """
    t, p = op.t, op.degree
    verts, ends = _flat_cells(op)
    area = 0.5 * np.linalg.norm(np.cross(verts[:, 1] - verts[:, 0], verts[:, 2] - verts[:, 0]), axis=1)
    dc, de = 2 * p + 2, 2 * p + 3
    r0, r1 = t.ref_q[:, 0], t.ref_q[:, 1]
    cell = 0.0
    for a in range(dc + 1):
        for b in range(dc + 1 - a):
            exact = 2 * area * math.factorial(a) * math.factorial(b) / math.factorial(a + b + 2)
            got = t.wq @ (r0**a * r1**b)
            cell = max(cell, float(np.max(np.abs(got - exact) / exact, initial=0.0)))
    cell /= 2 * _gamma(t.wq.shape[1] + dc + 48)
    gdm = np.asarray(op.mesh.geometry.dofmaps[0])
    side0 = op.mesh.geometry.x[gdm[t.cells[:, 0]]]  # (F, 3, 3) side 0's vertices
    x = (side0[:, None, 0] + (side0[:, None, 1] - side0[:, None, 0]) * t.ref_e[:, :, :1]
         + (side0[:, None, 2] - side0[:, None, 0]) * t.ref_e[:, :, 1:])
    d = ends[:, 1] - ends[:, 0]
    length = np.linalg.norm(d, axis=1)
    s = np.einsum("fqd,fd->fq", x - ends[:, None, 0], d) / length[:, None] ** 2
    edge = 0.0
    for j in range(de + 1):
        got = (t.we * s**j).sum(axis=1)
        edge = max(edge, float(np.max(np.abs(got - length / (j + 1)) / (length / (j + 1)), initial=0.0)))
    edge /= 2 * _gamma(t.we.shape[1] + de + 48)
    cell = float(op.comm.allreduce(cell, op=MPI.MAX))
    edge = float(op.comm.allreduce(edge, op=MPI.MAX))
    return cell, edge, dc, de


@register("sphere_quadrature", "§9 (DG on S²: the volume and edge rules)",
          "polynomials integrated exactly: areas and lengths from the cells' vertices", kind="ratio to bound",
          budget_s=30.0)
def check_sphere_quadrature(quick: bool) -> Outcome:
    """The DG tables' volume rule exact for degree 2p+2 and edge rule for 2p+3 (p = 0..3), to round-off (≤ 1).

    The degrees the DG form needs: the mass matrix 2p, the volume term μ v·∇φ with v from the nodal P2 field
    (DG3: P3) 2p + 1 (2p + 2), the edge flux u_n μ φ 2p + 2 (2p + 3); the tables promise 2p + 2 and 2p + 3 (a rule
    one Gauss point short is exact to 2p + 1 on the edges only).
    """
    comm = MPI.COMM_WORLD
    mesh = icosphere(comm, 1, 1)
    ok, lines, worst = True, [], 0.0
    for p in (0, 1, 2, 3):
        op = SphereDG(mesh, p, RotationVelocity(OMEGA))
        cell, edge, dc, de = quadrature_errors(op)
        ok &= cell <= 1.0 and edge <= 1.0
        worst = max(worst, cell, edge)
        lines.append(f"DG{p}: cells to degree {dc} {cell:.2g}, edges to degree {de} {edge:.2g} of the round-off bound")
    return Outcome(worst, None, "≤ 1 (relative error over 2γ_{n+d+48}: cells to d = 2p+2, edges 2p+3, p = 0..3)", ok,
                   "; ".join(lines), tolerance=1.0)
