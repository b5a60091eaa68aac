"""Exact properties of the schemes, to round-off, and agreement across rank counts (theory §7 items 1, 2, 7).

* ``token_mass``: mass_T + outflow = mass_0 at every depth step, to the round-off of the operations
  (each sub-step is conservative in exact arithmetic); DG0 and DG1, interval, quadrilaterals, triangles.
* ``token_positivity``: μ_t ≥ 0 at every depth step (upwind DG0 and DG1 with the Zhang–Shu limiter, CFL).
* ``gaussian_exact_d2``: (m_T, Σ_T) in d = 2 (non-diagonal Σ₀) against theory §6.1, DG0 order 1.
* ``fp_positivity``: ρ ≥ 0 after every Fokker–Planck step, λ > 0 (backward Euler, M-matrix) and λ = 0
  (limited MUSCL, SSP-RK2 in CFL sub-steps), at steps up to 100 times the explicit stability limit.
* ``fp_gibbs_steady_state``: the Ornstein–Uhlenbeck steady state N(c, λ/λ₂) (:func:`mfpde.exact.ou_moments`
  as s → ∞) against the solver's, p = 1 and 2: the Scharfetter–Gummel step fixes e^{−Φ/λ} exactly and
  lumped moments of a Gaussian are spectrally accurate, so the bound is tails + iteration + round-off.
* ``mpi_consistency``: δR/δρ on a token mesh over all ranks equals the one on each rank alone, to the
  round-off of the operations.
"""

from __future__ import annotations

import math

from mpi4py import MPI

import dolfinx.fem
import dolfinx.mesh
import numpy as np

from mfpde.exact import gaussian_transport, ou_moments
from mfpde.fitting import fit_order
from mfpde.heads import HeadMeasure
from mfpde.mesh import Domain, box
from mfpde.params.densities import gaussian_density
from mfpde.params.family import ScalarHeads
from mfpde.params.fokker_planck import ParameterFokkerPlanck
from mfpde.params.theta import ThetaSpace, first_variation_values
from mfpde.tokens.box.adjoint import DiscreteAdjoint, dyhat_dmu
from mfpde.tokens.box.data import Sample, fill_density
from mfpde.tokens.box.readout import readout_function
from mfpde.tokens.box.transport import Tape, TokenTransport
from mfpde.verify.registry import Outcome, Series, register

__all__ = ["gamma"]

#: The step budget of the token checks: 100 times the sub-steps they take (96 in quick mode, the same in full), so a
#: solve whose velocity blows up (a positivity lost, the CFL step halved again and again) fails within seconds.
TOKEN_STEPS = 10_000
#: Every head contracting (V·n < 0 on ∂Ω): nothing leaves the box.
INWARD = HeadMeasure(np.array([-1.0, -0.5]), np.array([0.5, 0.5]))
CONTRACTING = HeadMeasure(np.array([-0.5, 0.3]), np.array([0.5, 0.25]))
M0_2D, S0_2D = np.array([0.2, -0.1]), np.array([[0.25, 0.1], [0.1, 0.16]])


def gamma(n: float) -> float:
    """γ_n = nu/(1 − nu), u = ε/2: the relative error of n rounded operations (Higham, Lemma 3.1)."""
    u = float(np.finfo(np.float64).eps) / 2
    return n * u / (1.0 - n * u)


def _mu0(tt: TokenTransport, mean: np.ndarray, cov: np.ndarray) -> dolfinx.fem.Function:
    u = dolfinx.fem.Function(tt.W)
    fill_density(Sample("gaussian", {"mean": np.atleast_1d(mean), "cov": np.atleast_2d(cov)}, 0.0), u, tt.mass)
    return u


#: Expanding heads (V·n > 0 on ∂Ω for tokens near it): mass leaves the box, and ∫μ_T + outflow = ∫μ_0 tests the
#: outflow bookkeeping of the DG forms and of every stage of the depth scheme.
OUTWARD = HeadMeasure(np.array([1.0]), np.array([1.5]))
#: (bounds, cells, cell, degree, mean, cov, depth steps, heads) of the mass and positivity checks; the last two
#: lose mass through ∂Ω (a narrow box, OUTWARD heads).
TOKEN_CASES = [([[-4.0, 4.0]], [80], "quadrilateral", 1, np.array([0.2]), np.array([[0.25]]), 20, INWARD),
               ([[-4.0, 4.0]] * 2, [16, 16], "quadrilateral", 1, M0_2D, S0_2D, 8, INWARD),
               ([[-4.0, 4.0]] * 2, [12, 12], "triangle", 0, M0_2D, S0_2D, 6, INWARD),
               ([[-1.5, 1.5]], [60], "quadrilateral", 1, np.array([0.2]), np.array([[0.25]]), 20, OUTWARD),
               ([[-1.5, 1.5]] * 2, [12, 12], "quadrilateral", 0, M0_2D, S0_2D, 8, OUTWARD)]


def _token_runs() -> list[tuple[float, float, float]]:
    """Per case: (max drift of mass + outflow over the depth steps, its round-off bound, min density).

    With INWARD heads the mass itself may not move; with OUTWARD heads (outflow_tol = ∞) the balance
    ∫μ_T + outflow − ∫μ_0 is the drift, and the case counts only if some mass did leave (> 1e-3 of it).
    """
    out = []
    for bounds, cells, cell, degree, mean, cov, steps, heads in TOKEN_CASES:
        tt = TokenTransport(box(MPI.COMM_WORLD, bounds, cells, cell), degree)
        u = _mu0(tt, mean, cov)
        masses: list[float] = []
        mins: list[float] = []

        def record(k: int, t: float, v: dolfinx.fem.Function, tt: TokenTransport = tt, masses: list[float] = masses,
                   mins: list[float] = mins) -> None:
            masses.append(tt.mass(v))
            mins.append(tt.min_density(v))

        rep = tt.solve(u, heads, 1.0, steps, callback=record)
        d, k = tt.msh.geometry.dim, tt.degree
        ndofs = tt.W.dofmap.index_map.size_global
        ops = 3 * (4 * (2 * d + 1) * (k + 2) ** d + 2 * (k + 1) ** d + 10)  # roundings a dof per sub-step
        bound = (rep.substeps * gamma(ops) + 2 * gamma(ndofs)) * rep.mass_0
        balance = abs(rep.mass_T + rep.outflow - rep.mass_0)
        if heads is INWARD:
            drift = max(max(abs(m - rep.mass_0) for m in masses), balance)
        else:  # mass must have left, else the case tests nothing
            drift = balance if rep.outflow > 1e-3 * rep.mass_0 else math.inf
        out.append((drift, bound, min(mins)))
    return out


@register("token_mass", "§1.3 (F); §7 item 1", "exact conservation, bounded by the round-off of the operations",
          kind="mass drift", steps=TOKEN_STEPS)
def check_token_mass(quick: bool) -> Outcome:
    """Mass drift ≤ its round-off bound (interval DG1, quadrilaterals DG1, triangles DG0; with outflow: DG1, DG0).

    The drift of ∫μ_t (+ outflow) is 0 in exact arithmetic (the reference); the row is the case nearest to its
    bound (substeps γ_ops + 2γ_N) ∫μ_0.
    """
    runs = _token_runs()
    drift, bound, _ = max(runs, key=lambda r: r[0] / r[1])
    return Outcome(drift, 0.0, f"≤ {bound:.2g} (round-off)", drift <= bound,
                   "drift " + ", ".join(f"{d:.1e} (bound {b:.1e})" for d, b, _ in runs), tolerance=bound)


@register("token_positivity", "§1.3 (F); §7 item 1", "exact positivity of the upwind/limited scheme under CFL",
          kind="min density", steps=TOKEN_STEPS)
def check_token_positivity(quick: bool) -> Outcome:
    """The minimum over depth steps of μ_t ≥ 0 (the minimum over the meshes; a bound, no reference)."""
    runs = _token_runs()
    low = min(m for *_, m in runs)
    return Outcome(low, None, "≥ 0", low >= 0.0, "min density " + ", ".join(f"{m:.2e}" for *_, m in runs),
                   tolerance=0.0)


@register("gaussian_exact_d2", "§6.1; §7 item 2",
          "closed form (m_T, Σ_T) of theory §6.1 (d = 2); Richardson for the error constant")
def check_gaussian_exact_d2(quick: bool) -> Outcome:
    """max(|Δm|, |ΔΣ|) in d = 2 (non-diagonal Σ₀, quadrilaterals DG0) at order 1 ± 0.2, and the error constants.

    Each of m₁, m₂, Σ₁₁, Σ₁₂, Σ₂₂: its error at the finest mesh over the Richardson estimate from the solver's own
    values must lie in the band of order 1 ± 0.2 (:func:`~mfpde.verify.reach.richardson_ratio_band`).
    """
    from mfpde.verify.reach import richardson_ratio_band

    m_ex, S_ex = gaussian_transport(M0_2D, S0_2D, CONTRACTING.abar, CONTRACTING.bbar, 1.0)
    ex = np.r_[m_ex, S_ex[[0, 0, 1], [0, 1, 1]]]
    cells = [16, 24, 32]
    vals = []
    for n in cells:
        tt = TokenTransport(box(MPI.COMM_WORLD, [[-4.0, 4.0]] * 2, [n, n]), 0)
        rep = tt.solve(_mu0(tt, M0_2D, S0_2D), CONTRACTING, 1.0, n // 2)
        vals.append(np.r_[rep.mean_T, np.asarray(rep.cov_T)[[0, 0, 1], [0, 1, 1]]])
    errs = [float(np.abs(v - ex).max()) for v in vals]
    hs = [8.0 / n for n in cells]
    q = fit_order(hs, errs)
    r = cells[-1] / cells[-2]
    ratio = np.abs(vals[-1] - ex) / (np.abs(vals[-2] - vals[-1]) / (r - 1))
    lo, hi = richardson_ratio_band(1.0, 0.2, r)
    ok = abs(q - 1.0) < 0.2 and bool(np.all((ratio >= lo) & (ratio <= hi)))
    return Outcome(q, 1.0, "< 0.2; e_h/R_h of m, Σ in the band of order 1 ± 0.2", ok,
                   f"errors {', '.join(f'{e:.2e}' for e in errs)}; e_h/R_h of m, Σ "
                   f"{', '.join(f'{x:.3f}' for x in ratio)} in [{lo:.2f}, {hi:.2f}]",
                   [Series(hs, errs, "token cell size h", 1.0, q, "DG0, d = 2")], 0.2)


def _theta_space(p: int, n: int, half: float) -> dolfinx.fem.FunctionSpace:
    comm = MPI.COMM_WORLD
    if p == 1:
        msh = dolfinx.mesh.create_interval(comm, n, [-half, half])
    else:
        msh = dolfinx.mesh.create_rectangle(comm, [[-half, -half], [half, half]], [n, n])
    return dolfinx.fem.functionspace(msh, ("Lagrange", 1))


@register("fp_positivity", "§4 (FP), (WGF); §7 item 1", "exact positivity of the M-matrix / MUSCL steps",
          kind="min density")
def check_fp_positivity(quick: bool) -> Outcome:
    """ρ ≥ 0 after every step (λ ∈ {0.05, 0}, Δs up to 100× the stability limit, p = 1, 2), the MUSCL sub-step counts.

    Limited MUSCL with SSP-RK2 is positive for sub-steps h ≤ Δs_CFL/2 (Δs_CFL = min_i m_i/Σ_j w_ij(Φ_i − Φ_j)⁺, the
    upwind bound: the reconstruction at most doubles the outflow of a cell), so a step Δs = f Δs_CFL takes
    n = ⌈2f⌉ sub-steps: fewer break the bound (a positivity that holds only by luck), more waste work.
    """
    lows, counts = [], []
    for p in (1, 2):
        V = _theta_space(p, 40 if p == 1 else 16, 2.0)
        phi = dolfinx.fem.Function(V)
        phi.interpolate(lambda x, p=p: (x[0] ** 2 - 1) ** 2 + 0.3 * np.sin(3 * x[0]) + (x[1] ** 2 if p == 2 else 0.0))
        for lam in (0.05, 0.0):
            rho = gaussian_density(V, [-1.2] * p, 0.01 * np.eye(p))
            fp = ParameterFokkerPlanck(V, lam, prefix=f"mfpde_verify_fp{p}_{int(lam > 0)}_")
            limit = fp.stability_limit(phi)
            low = math.inf
            for factor in (1.0, 10.0, 100.0):
                for _ in range(5):
                    info = fp.step(rho, phi, factor * limit)
                    low = min(low, info.min_rho)
                    if lam == 0.0:
                        counts.append((info.substeps, math.ceil(2 * factor * (1 - 1e-12))))
            lows.append(low)
    wrong = [(n, n_cfl) for n, n_cfl in counts if n != n_cfl]
    return Outcome(min(lows), None, "≥ 0; λ = 0: n = ⌈2Δs/Δs_CFL⌉ MUSCL sub-steps", min(lows) >= 0.0 and not wrong,
                   "min ρ " + ", ".join(f"{x:.2e}" for x in lows)
                   + (f"; sub-steps {wrong[0][0]} where the CFL rule fixes {wrong[0][1]}" if wrong else
                      f"; λ = 0 sub-step counts as the CFL rule fixes them ({len(counts)} steps)"), tolerance=0.0)


@register("fp_gibbs_steady_state", "§4 (Gibbs measure); §7 item 7", "closed-form OU steady state N(c, λ/λ₂)",
          kind="moment")
def check_fp_gibbs_steady_state(quick: bool) -> Outcome:
    """|moments − (c, λ/λ₂)| ≤ tails beyond the box + iteration remainder + γ_{100N}.

    The row is the moment (mean or variance, p = 1 or 2) nearest to its bound, against its closed-form value.
    """
    lam, lam2, half = 0.1, 1.0, 3.5
    lines, worst, row = [], -1.0, (math.nan, math.nan, math.nan)
    for p, n, c in ((1, 80, [0.3]), (2, 32, [0.3, -0.2])):
        V = _theta_space(p, n, half)
        phi = dolfinx.fem.Function(V)
        phi.interpolate(lambda x, p=p, c=c: 0.5 * lam2 * sum((x[i] - c[i]) ** 2 for i in range(p)))
        rho = gaussian_density(V, [-0.4] * p, 0.05 * np.eye(p))
        fp = ParameterFokkerPlanck(V, lam, prefix=f"mfpde_verify_ou{p}_")
        ds, steps = 1.0, 60
        prev = None
        for _ in range(steps):
            fp.step(rho, phi, ds)
            d = fp.diagnostics(rho, phi)
            cur = np.concatenate([d["mean"], np.diag(d["cov"])])  # type: ignore[call-overload]
            change = 0.0 if prev is None else float(np.abs(cur - prev).max())
            prev = cur
        m_ex, v_ex = ou_moments(math.inf, c, [-0.4] * p, [0.05] * p, lam, lam2)
        exact = np.concatenate([m_ex, v_ex])
        i = int(np.argmax(np.abs(cur - exact)))
        err = float(abs(cur[i] - exact[i]))
        sd = math.sqrt(lam / lam2)
        far = half + max(abs(x) for x in c)  # the farthest a truncated point is from the mean
        tail = math.erfc((half - max(abs(x) for x in c)) / (math.sqrt(2) * sd)) * far**2
        q = 1 / (1 + lam2 * ds)  # backward Euler on the OU moments contracts by at least this per step
        bound = tail + q / (1 - q) * change + gamma(100 * V.dofmap.index_map.size_global)
        if err / bound > worst:
            worst, row = err / bound, (float(cur[i]), float(exact[i]), bound)
        lines.append(f"p = {p}: error {err:.1e}, bound {bound:.1e}")
    measured, exact_value, bound = row
    return Outcome(measured, exact_value, f"≤ {bound:.2g} (tails + iteration remainder + round-off)", worst <= 1.0,
                   "; ".join(lines), tolerance=bound)


def permuted_box(comm: MPI.Comm, half: float, n: int, seed: int = 11) -> Domain:
    """The quadrilateral box [−half, half]² with n × n cells, its cells and vertices listed in a random order.

    The same mesh as :func:`mfpde.mesh.box` (and the same vertex axes, so the same attention path), but
    built by ``dolfinx.mesh.create_mesh`` from a shuffled cell list and shuffled vertex numbers: every dof
    numbering, and so the order of every sum, differs from the box's on any number of ranks.
    """
    import basix.ufl

    axis = np.linspace(-half, half, n + 1)
    X, Y = np.meshgrid(axis, axis, indexing="xy")
    x = np.stack([X.ravel(), Y.ravel()], axis=1)  # vertex (i, j) at index j(n + 1) + i
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="xy")
    v0 = (j * (n + 1) + i).ravel()
    cells = np.stack([v0, v0 + 1, v0 + n + 1, v0 + n + 2], axis=1)  # DOLFINx tensor-product vertex order
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(x))  # new number of old vertex k: perm[k]
    xp = np.empty_like(x)
    xp[perm] = x
    cells = perm[cells][rng.permutation(len(cells))].astype(np.int64)
    el = basix.ufl.element("Lagrange", "quadrilateral", 1, shape=(2,))
    if comm.rank > 0:  # rank 0 holds the input; DOLFINx distributes it
        cells, xp = np.zeros((0, 4), np.int64), np.zeros((0, 2))
    return Domain(dolfinx.mesh.create_mesh(comm, cells, el, xp), (axis, axis))  # type: ignore[arg-type]


def _first_variation(comm: MPI.Comm, permuted: bool) -> np.ndarray:
    """δR/δρ at the Θ nodes of one 2-D token solve (forward + discrete adjoint), the same on every rank."""
    dom = permuted_box(comm, 3.0, 12) if permuted else box(comm, [[-3.0, 3.0]] * 2, [12, 12])
    tt = TokenTransport(dom, degree=0)
    th = ThetaSpace(box(MPI.COMM_WORLD, [[-1.0, 1.0], [-1.0, 1.0]], [4, 4], "triangle"), ScalarHeads())
    rho = th.gaussian([0.2, 0.8], [[0.1, 0.0], [0.0, 0.1]])
    u = dolfinx.fem.Function(tt.W)
    u.interpolate(lambda x: np.exp(-((x[:2] - 0.3) ** 2).sum(axis=0) / 0.5))
    u.x.array[:] /= tt.mass(u)
    heads = HeadMeasure.from_heads(th.family, th.points, th.gather(rho), keep_zero=True)
    g = readout_function("mean")
    tape: Tape = []
    rep = tt.solve(u, heads, 1.0, 6, g, tape=tape)
    _, D = DiscreteAdjoint(tt).backward(tape, (rep.yhat - 1.0) * dyhat_dmu(tt, g), 1)
    return np.asarray(first_variation_values(th.family, heads, D[0], th.points))


@register("mpi_consistency", "interface (any rank count)",
          "the same solve on one rank (COMM_SELF) with every cell and vertex renumbered", kind="|Δ δR/δρ|")
def check_mpi_consistency(quick: bool) -> Outcome:
    """|δR/δρ(all ranks, box) − δR/δρ(one rank, shuffled numbering)| ≤ 2γ_n max|δR/δρ|.

    The reference is computed on COMM_SELF from the same mesh with its cells and vertices shuffled
    (:func:`permuted_box`), so on one rank as on several the two solves sum in different orders: the check
    measures that results do not depend on the partition or the numbering beyond round-off (on one rank
    the former comparison world vs self was the same computation, identically 0). Bound: each result is
    within γ_n max|δR/δρ| of the exact-arithmetic value, whatever the order of its sums (Higham, Accuracy
    and Stability of Numerical Algorithms, Lemma 3.1 and eq. (4.4)), with
    n = 2 · 6 · 10 · 3 · 92 + 144: ≤ 10 CFL sub-steps of 3 stages, ≤ 92 roundings a DG0 dof (d = 2), forward
    and adjoint, then the sum over the 144 token cells (as tests/tokens/test_adjoint.py).
    """
    a, b = _first_variation(MPI.COMM_WORLD, False), _first_variation(MPI.COMM_SELF, True)
    n_ops = 2 * 6 * 10 * 3 * 92 + 144
    tol = 2 * gamma(n_ops) * float(np.abs(b).max())
    diff = MPI.COMM_WORLD.allreduce(float(np.abs(a - b).max()), op=MPI.MAX)
    return Outcome(diff, 0.0, f"≤ {tol:.2g} (round-off)", diff <= tol,
                   f"max |Δ δR/δρ| {diff:.1e}: box on {MPI.COMM_WORLD.size} rank(s) against a renumbered box on 1",
                   tolerance=tol)
