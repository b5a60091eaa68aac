"""Checks of the discrete adjoint and the first variation δR/δρ (theory §3, §6.1; verification plan §7 item 3).

* ``adjoint_taylor``: |R(ρ + εχ) − R(ρ) − ε⟨δR/δρ, χ⟩| = O(ε²) for a mass-zero χ, the reference being R
  itself at perturbed ρ (finite differences): fitted slope 2. Run on every path of the velocity's
  vector–Jacobian product: a tensor box (separable kernels), right triangles and the gmsh disk (direct
  sums), DG1 (d = 1, Chebyshev VJP; d = 2 triangles, direct sums).
* ``adjoint_taylor_interpolated``: the same Taylor test in the head masses c on a gmsh disk fine enough
  (≈ 760 cells) that the velocity and its VJP go through the Chebyshev grid of the bounding box
  (:mod:`mfpde.tokens.box.interpolated`, the path of unstructured meshes); the check fails if the tape holds no such
  linearisation (the path silently fell back to the direct sums).
* ``adjoint_gaussian_exact``: δR/δρ(a, v) = v (∂_āG + a ∂_b̄G) of the Gaussian closed form (theory §6.1)
  against the adjoint's, first order in the token cell size h (DG0).
"""

from __future__ import annotations

from mpi4py import MPI

import dolfinx.fem
import dolfinx.mesh
import numpy as np

from mfpde.exact import gaussian_risk_derivatives
from mfpde.fitting import fit_order
from mfpde.heads import HeadMeasure
from mfpde.mesh import Domain, box
from mfpde.params.family import ScalarHeads
from mfpde.params.theta import ThetaSpace, first_variation_values
from mfpde.tokens.box.adjoint import DiscreteAdjoint, dyhat_dmu
from mfpde.tokens.box.readout import readout_function
from mfpde.tokens.box.transport import Tape, TokenTransport
from mfpde.verify.registry import Outcome, Series, register

__all__ = ["TAYLOR_CASES", "gaussian_first_variation_errors", "interpolated_taylor_errors", "taylor_errors"]

#: Taylor-test cases: name → (token mesh kind, d, DG degree, cells per axis). Together they cover the
#: three VJP paths (tensor separable, direct sums, d = 1 Chebyshev) and both DG degrees.
TAYLOR_CASES: dict[str, tuple[str, int, int, int]] = {
    "interval_dg0": ("interval", 1, 0, 24),
    "quad_dg0": ("quadrilateral", 2, 0, 16),
    "triangle_dg0": ("triangle", 2, 0, 10),
    "gmsh_disk_dg0": ("gmsh", 2, 0, 0),
    "interval_dg1": ("interval", 1, 1, 24),
    "triangle_dg1": ("triangle", 2, 1, 6),
}
#: The slope of a second-order remainder, and the tolerance of its least-squares fit over 5 halvings of ε.
TAYLOR_ORDER, TAYLOR_TOL = 2.0, 0.1


def gmsh_disk(comm: MPI.Comm, radius: float = 3.0, h: float = 0.6) -> Domain:
    """An unstructured triangle mesh of the disk of radius ``radius``, size h, made by gmsh (rank 0) and distributed.

    The coarse sibling of ``meshes/disk.msh`` (h = 0.2), small enough for direct-sum kernels in a check.
    """
    import dolfinx.cpp
    import dolfinx.io.gmsh
    import gmsh

    if not gmsh.isInitialized():
        gmsh.initialize()
    gmsh.option.setNumber("General.Terminal", 0)
    gmsh.model.add("mfpde_verify_disk")
    if comm.rank == 0:
        gmsh.model.occ.addDisk(0.0, 0.0, 0.0, radius, radius)
        gmsh.model.occ.synchronize()
        gmsh.model.addPhysicalGroup(2, [1], 1)
        gmsh.option.setNumber("Mesh.MeshSizeMin", h)
        gmsh.option.setNumber("Mesh.MeshSizeMax", h)
        gmsh.model.mesh.generate(2)
    part = dolfinx.cpp.mesh.create_cell_partitioner(dolfinx.mesh.GhostMode.shared_facet, 2)
    data = dolfinx.io.gmsh.model_to_mesh(gmsh.model, comm, 0, gdim=2, partitioner=part)
    gmsh.model.remove()
    return Domain(data.mesh, None)


def _token_domain(comm: MPI.Comm, kind: str, d: int, n: int) -> Domain:
    if kind == "gmsh":
        return gmsh_disk(comm)
    if d == 1:
        return box(comm, [[-3.0, 3.0]], [n])
    return box(comm, [[-3.0, 3.0]] * 2, [n, n], kind)


def _risk(tt: TokenTransport, th: ThetaSpace, rho: dolfinx.fem.Function, y: float, steps: int,
          tape: Tape | None = None) -> tuple[float, float, HeadMeasure]:
    """R = ½(ŷ − y)² for μ₀ ∝ exp(−|x − 0.3|²/0.5) + 0.2, ŷ = ∫|x|² dμ_T, T = 1.

    The floor 0.2 keeps DG1 densities away from 0, where the positivity limiter would make the discrete
    forward map non-differentiable (and the Taylor remainder first order).
    """
    d = tt.msh.geometry.dim
    u = dolfinx.fem.Function(tt.W)
    u.interpolate(lambda x: np.exp(-((x[:d] - 0.3) ** 2).sum(axis=0) / 0.5) + 0.2)
    u.x.array[:] /= tt.mass(u)
    heads = HeadMeasure.from_heads(th.family, th.points, th.gather(rho), keep_zero=True)
    rep = tt.solve(u, heads, 1.0, steps, readout_function("second_moment"), tape=tape)
    return 0.5 * (rep.yhat - y) ** 2, rep.yhat, heads


def taylor_errors(case: str, comm: MPI.Comm = MPI.COMM_WORLD, steps: int = 6) -> tuple[list[float], list[float], float]:
    """Taylor remainders of the first variation on one token mesh (theory §3; collective).

    Args:
        case: a key of :data:`TAYLOR_CASES`.
        comm: the ranks the token mesh and Θ are distributed over.
        steps: depth steps (T = 1).

    Returns:
        (ε, |R(ρ+εχ) − R(ρ) − ε⟨δR/δρ, χ⟩|, ⟨δR/δρ, χ⟩) for ε = 0.05·2^{-k}, k = 0..4.
    """
    kind, d, degree, n = TAYLOR_CASES[case]
    tt = TokenTransport(_token_domain(comm, kind, d, n), degree=degree)
    th = ThetaSpace(box(comm, [[-1.0, 1.0], [-1.0, 1.0]], [6, 6], "triangle"), ScalarHeads())
    rho = th.gaussian([0.2, 0.8], [[0.1, 0.0], [0.0, 0.1]])
    y = 1.5
    tape: Tape = []
    R0, yh, heads = _risk(tt, th, rho, y, steps, tape)
    _, D = DiscreteAdjoint(tt).backward(tape, (yh - y) * dyhat_dmu(tt, readout_function("second_moment")), 1)
    dR = first_variation_values(th.family, heads, D[0], th.x)
    chi = dolfinx.fem.Function(th.V)
    chi.x.array[:] = np.sin(7 * th.x[:, 0] + 3 * th.x[:, 1]) + np.cos(5 * th.x[:, 1])
    one = dolfinx.fem.Function(th.V)
    one.x.array[:] = 1.0
    chi.x.array[:] -= th.mass(chi) / th.mass(one)
    k = th.n_owned
    pred = comm.allreduce(float((th.m[:k] * chi.x.array[:k] * dR[:k]).sum()), op=MPI.SUM)
    eps = [0.05 / 2.0**j for j in range(5)]
    errs = []
    for e in eps:
        r = dolfinx.fem.Function(th.V)
        r.x.array[:] = rho.x.array + e * chi.x.array
        errs.append(abs(_risk(tt, th, r, y, steps)[0] - R0 - e * pred))
    return eps, errs, pred


@register("adjoint_taylor", "§3.1 (B), (G); §7 item 3 (ii)", "finite differences of R (Taylor remainder)")
def check_adjoint_taylor(quick: bool) -> Outcome:
    """Fitted Taylor slope 2 ± 0.1 on every token-mesh path (the row: the worst case)."""
    series, worst, lines, ok = [], TAYLOR_ORDER, [], True
    for case in TAYLOR_CASES:
        eps, errs, pred = taylor_errors(case)
        slope = fit_order(eps, errs)
        good = abs(slope - TAYLOR_ORDER) < TAYLOR_TOL and abs(pred) > 1e-6
        ok &= good
        worst = slope if abs(slope - TAYLOR_ORDER) > abs(worst - TAYLOR_ORDER) else worst
        lines.append(f"{case} {slope:.3f}")
        series.append(Series(eps, errs, "ε", TAYLOR_ORDER, slope, case))
    return Outcome(worst, TAYLOR_ORDER, f"< {TAYLOR_TOL}", ok, "slopes: " + ", ".join(lines), series, TAYLOR_TOL)


def interpolated_taylor_errors(comm: MPI.Comm = MPI.COMM_WORLD, domain: Domain | None = None
                               ) -> tuple[list[float], list[float], float, bool]:
    """Taylor remainders |R(c + εδ) − R(c) − ε ∂R/∂c·δ| on the gmsh disk of radius 1.5, h = 0.15 (collective).

    ``domain`` replaces the disk (an unstructured-mesh token domain, DG0).

    μ₀ ∝ exp(−|x − (0.3, 0)|²/0.2), five heads a ∈ [−1, 1], T = 0.5 in 4 depth steps, ŷ = ∫|x|² dμ_T, y = 1.5.

    Returns:
        (ε, remainders, ∂R/∂c·δ, whether the interpolated path was taken).
    """
    tt = TokenTransport(domain if domain is not None else gmsh_disk(comm, radius=1.5, h=0.15), 0)
    g, y = readout_function("second_moment"), 1.5
    a = np.linspace(-1.0, 1.0, 5)
    c0, dc = np.array([0.2, -0.1, 0.3, 0.1, -0.2]), np.array([0.3, 0.1, -0.2, 0.4, 0.1])

    def risk(c: np.ndarray, tape: Tape | None = None) -> tuple[float, float]:
        u = dolfinx.fem.Function(tt.W)
        u.interpolate(lambda x: np.exp(-((x[0] - 0.3) ** 2 + x[1] ** 2) / 0.2))
        u.x.array[:] /= tt.mass(u)
        rep = tt.solve(u, HeadMeasure(a, c), 0.5, 4, g, tape=tape)
        return 0.5 * (rep.yhat - y) ** 2, rep.yhat

    tape: Tape = []
    R0, yh = risk(c0, tape)
    taken = any(lin is not None and lin.interp2d is not None for step in tape for lin in step.vel)
    _, D = DiscreteAdjoint(tt).backward(tape, (yh - y) * dyhat_dmu(tt, g), 1)
    pred = float(D[0] @ dc)
    eps = [0.02 / 2.0**k for k in range(5)]
    return eps, [abs(risk(c0 + e * dc)[0] - R0 - e * pred) for e in eps], pred, taken


@register("adjoint_taylor_interpolated", "§3.1 (B), (G); §7 item 3 (ii)",
          "finite differences of R on an unstructured mesh (Taylor remainder), interpolated VJP", budget_s=120.0)
def check_adjoint_taylor_interpolated(quick: bool) -> Outcome:
    """Fitted Taylor slope 2 ± 0.1 through the interpolated VJP (which must be the path taken)."""
    eps, errs, pred, taken = interpolated_taylor_errors()
    slope = fit_order(eps, errs)
    ok = taken and abs(slope - TAYLOR_ORDER) < TAYLOR_TOL and abs(pred) > 1e-6
    return Outcome(slope, TAYLOR_ORDER, f"< {TAYLOR_TOL}; interpolated path taken", ok,
                   f"remainders {', '.join(f'{e:.2e}' for e in errs)}; slope {slope:.3f}; "
                   f"interpolated path {'taken' if taken else 'NOT taken'}",
                   [Series(eps, errs, "ε", TAYLOR_ORDER, slope, "gmsh disk, interpolated")], TAYLOR_TOL)


def gaussian_first_variation_errors(cells: list[int], comm: MPI.Comm = MPI.COMM_WORLD
                                    ) -> tuple[list[float], list[float]]:
    """Relative max error of the adjoint's δR/δρ against the Gaussian closed form (theory §6.1), per mesh.

    μ₀ = N(0.3, 0.25) on [−4, 4] (DG0, depth steps = cells/4), readout g = x, y = 1, scalar heads, ρ a
    Gaussian on a 4×4 Θ grid.

    Returns:
        (h, max_a |D(a) − (∂_āG + a ∂_b̄G)| / max |∂_āG + a ∂_b̄G|).
    """
    m0, s0, y, T = 0.3, 0.25, 1.0, 1.0
    errs, hs = [], []
    for n in cells:
        tt = TokenTransport(box(comm, [[-4.0, 4.0]], [n]), degree=0)
        th = ThetaSpace(box(comm, [[-1.0, 1.0], [-1.0, 1.0]], [4, 4], "triangle"), ScalarHeads())
        rho = th.gaussian([0.1, 0.6], [[0.2, 0.0], [0.0, 0.2]])
        heads = HeadMeasure.from_heads(th.family, th.points, th.gather(rho), keep_zero=True)
        u = dolfinx.fem.Function(tt.W)
        u.interpolate(lambda x: np.exp(-((x[0] - m0) ** 2) / (2 * s0)))
        u.x.array[:] /= tt.mass(u)
        g = readout_function("mean")
        tape: Tape = []
        rep = tt.solve(u, heads, T, n // 4, g, tape=tape)
        _, D = DiscreteAdjoint(tt).backward(tape, (rep.yhat - y) * dyhat_dmu(tt, g), 1)
        dG_da, dG_db = gaussian_risk_derivatives(heads.abar, heads.bbar, m0, s0, T, y)
        exact = dG_da + heads.a * dG_db
        errs.append(float(np.abs(D[0] - exact).max() / np.abs(exact).max()))
        hs.append(8.0 / n)
    return hs, errs


@register("adjoint_gaussian_exact", "§6.1; §7 item 3 (i)", "closed form δR/δρ = v(∂_āG + a∂_b̄G) (theory §6.1)")
def check_adjoint_gaussian_exact(quick: bool) -> Outcome:
    """First order in h (DG0): fitted slope |q − 1| < 0.2."""
    hs, errs = gaussian_first_variation_errors([60, 120] if quick else [60, 120, 240])
    slope = fit_order(hs, errs)
    ok = abs(slope - 1.0) < 0.2
    return Outcome(slope, 1.0, "< 0.2", ok,
                   f"errors {', '.join(f'{e:.2e}' for e in errs)} at h = {', '.join(f'{h:.3g}' for h in hs)}",
                   [Series(hs, errs, "token cell size h", 1.0, slope)], 0.2)


def checkpointed_gradients(case: str, comm: MPI.Comm = MPI.COMM_WORLD, steps: int = 6
                           ) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """(∂R/∂c by the whole tape, by a checkpointed tape, the latter's stats).

    The same forward solve (:func:`_risk`) taped twice: a list (every sub-step kept, n of them) and a
    :class:`~mfpde.tokens.box.tape.CheckpointedTape` (uniform checkpoints in depth, each segment replayed in
    reverse), each reversed by :class:`~mfpde.tokens.box.adjoint.DiscreteAdjoint`. The checkpointed tape's budget,
    2 C max(2s, ⌊n/2⌋ + 1) for states of C bytes and s stages, holds neither the whole tape (n(T + C), T ≥ s C)
    nor a checkpoint per sub-step (half the budget: fewer than n states), but checkpoints every 2 sub-steps and a
    segment's stage states (2 s C): segments of 2 sub-steps are replayed. Collective.
    """
    from mfpde.tokens.box.tape import CheckpointedTape
    from mfpde.tokens.box.transport import SampleOperator

    kind, d, degree, n = TAYLOR_CASES[case]
    tt = TokenTransport(_token_domain(comm, kind, d, n), degree=degree)
    th = ThetaSpace(box(comm, [[-1.0, 1.0], [-1.0, 1.0]], [6, 6], "triangle"), ScalarHeads())
    rho = th.gaussian([0.2, 0.8], [[0.1, 0.0], [0.0, 0.1]])
    y = 1.5
    pT = None
    grads = []
    stats: dict[str, int] = {}
    n_sub = 0
    for checkpointed in (False, True):
        if checkpointed:
            C = dolfinx.fem.Function(tt.W).x.array.nbytes
            s = tt.scheme.stages
            tape: Tape | CheckpointedTape = CheckpointedTape(2 * C * max(2 * s, n_sub // 2 + 1), SampleOperator(tt), C,
                                                             s, comm, steps)
        else:
            tape = []
        _, yh, _ = _risk(tt, th, rho, y, steps, tape)  # type: ignore[arg-type]
        pT = (yh - y) * dyhat_dmu(tt, readout_function("second_moment"))
        _, D = DiscreteAdjoint(tt).backward(tape, pT, 1)
        grads.append(np.asarray(D[0], dtype=float).copy())
        n_sub = n_sub or len(tape)
        if isinstance(tape, CheckpointedTape):
            stats = tape.stats()
    return grads[0], grads[1], stats


@register("adjoint_checkpointed", "§3.1 (discrete adjoint); depth checkpointing",
          "the same gradient through the whole tape (every sub-step kept)", kind="|Δ ∂R/∂c|")
def check_adjoint_checkpointed(quick: bool) -> Outcome:
    """∂R/∂c through a checkpointed tape (segments replayed) = through the whole tape, bit for bit (DG0 and DG1).

    The replay runs the forward pass's operations on the same inputs (the recorded sub-step sizes, rows and
    heads), so the two gradients are identical in floating point: the threshold is 0. The check fails too if
    the tape replayed no segment of several sub-steps (checkpointing not exercised).
    """
    worst, lines, ok = 0.0, [], True
    for case in ("triangle_dg0", "triangle_dg1"):
        full, ck, stats = checkpointed_gradients(case)
        diff = float(np.max(np.abs(full - ck), initial=0.0))
        replayed = stats.get("recomputed_substeps", 0) > 0 and stats.get("checkpoint_every", 0) >= 2
        ok &= diff == 0.0 and replayed and bool(np.all(np.isfinite(full)))
        worst = max(worst, diff)
        lines.append(f"{case}: max |Δ| {diff:.1e} over {full.size} head masses (max |∂R/∂c| "
                     f"{float(np.abs(full).max(initial=0.0)):.2e}); {stats.get('substeps', 0)} sub-steps, "
                     f"{stats.get('segments', 0)} segments replayed, checkpoint every "
                     f"{stats.get('checkpoint_every', 0)}")
    return Outcome(worst, 0.0, "= 0 (bit for bit); segments of ≥ 2 sub-steps replayed", ok, "; ".join(lines),
                   tolerance=0.0)
