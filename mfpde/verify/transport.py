"""Checks of the forward token transport (theory §1.3 (F), §5.2, §6.1; verification plan §7 items 2, 4).

* ``gaussian_exact_d1``: (m_T, σ_T²) of a Gaussian μ₀ against the closed form of theory §6.1, at the
  order of the scheme (DG0: 1, DG1: 2) in the token cell size (depth steps refined with it).
* ``stability_w1_data``: W1(μ_T, μ'_T) for μ'_0 = μ₀ shifted by δ, computed exactly in d = 1 from the
  CDFs, is linear in δ (theory §5.2: W1(μ_T, μ'_T) ≤ e^{L_V T} W1(μ₀, μ'_0), and W1(μ₀, μ'_0) = δ), with
  the constant of the closed form: for Gaussians W1(μ_T, μ'_T) = |m_T − m'_T| = δ e^{āT}(1 − 2b̄σ₀²T)^{−1/2}.
* ``stability_w1_rho``: |ŷ − ŷ'| for one head of ρ moved by δ in v is linear in W1(ρ, ρ') = wδ
  (theory §5.2, |R(ρ) − R(ρ')| ≤ C_T W1(ρ, ρ')), with the constant ∂ŷ/∂ā + a ∂ŷ/∂b̄ of the closed form.
"""

from __future__ import annotations

from mpi4py import MPI

import dolfinx.fem
import numpy as np
import numpy.typing as npt

from mfpde.exact import gaussian_transport
from mfpde.mesh import box
from mfpde.tokens.attention import HeadMeasure
from mfpde.tokens.data import Sample, fill_density
from mfpde.tokens.readout import readout_function
from mfpde.tokens.transport import TokenTransport
from mfpde.verify.registry import Outcome, Series, fit_slope, register

__all__ = ["HEADS", "gaussian_errors", "transport_gaussian", "w1_1d"]

Array = npt.NDArray[np.float64]
#: Reduced heads A = aI, V = vI (c_k = ∫_{a = a_k} v dρ): ā = 0.75, b̄ = −0.175 (contracting).
HEADS = HeadMeasure(np.array([-0.5, 0.3]), np.array([0.5, 0.25]))
M0, S0, T, BOX = 0.3, 0.25, 1.0, 5.0


def transport_gaussian(n: int, degree: int, m0: float, heads: HeadMeasure, comm: MPI.Comm = MPI.COMM_WORLD,
                       steps: int | None = None) -> tuple[TokenTransport, dolfinx.fem.Function, float, float, float]:
    """μ₀ = N(m₀, σ₀²) on [−5, 5] (n cells, depth steps n/4 or ``steps``) transported to T = 1.

    Returns:
        (solver, μ_T, m_T, σ_T², ŷ = m_T by the readout g = x).
    """
    tt = TokenTransport(box(comm, [[-BOX, BOX]], [n]), degree)
    u = dolfinx.fem.Function(tt.W)
    fill_density(Sample("gaussian", {"mean": np.array([m0]), "cov": np.array([[S0]])}, 0.0), u, tt.mass)
    rep = tt.solve(u, heads, T, steps or max(n // 4, 1), readout_function("mean"))
    return tt, u, rep.mean_T[0], rep.cov_T[0][0], rep.yhat


def w1_1d(tt: TokenTransport, u: dolfinx.fem.Function, v: dolfinx.fem.Function) -> float:
    """W1(μ, ν) = ∫ |F_μ − F_ν| dx in d = 1, from the CDFs of the lumped quadrature (DG0: cell midpoints).

    Exact for the two discrete measures Σ m_i μ_i δ_{x_i}, Σ m_i ν_i δ_{x_i} (the same nodes, sorted).
    """
    x = tt.quad.points[:, 0]
    order = np.argsort(x, kind="stable")
    cdf = np.cumsum(tt.quad.gather(u)[order] - tt.quad.gather(v)[order])
    return float(np.sum(np.abs(cdf[:-1]) * np.diff(x[order])))


def gaussian_errors(degree: int, cells: list[int], steps: int | None = None) -> tuple[list[float], list[float]]:
    """(h, max(|m_T − m_exact|, |σ_T² − σ²_exact|)) per mesh against theory §6.1.

    Depth steps n/4 (refined with the mesh), or ``steps`` on every mesh.
    """
    m_ex, S_ex = gaussian_transport(M0, S0, HEADS.abar, HEADS.bbar, T)
    hs, errs = [], []
    for n in cells:
        _, _, m, s, _ = transport_gaussian(n, degree, M0, HEADS, steps=steps)
        hs.append(2 * BOX / n)
        errs.append(max(abs(m - m_ex[0]), abs(s - S_ex[0, 0])))
    return hs, errs


@register("gaussian_exact_d1", "§6.1; §7 item 2", "closed form (m_T, σ_T²) of theory §6.1")
def check_gaussian_exact_d1(quick: bool) -> Outcome:
    """Fitted order of the moment error: DG0 |q − 1| < 0.2, DG1 |q − 2| < 0.25 (the value is DG1's)."""
    cells = [60, 120] if quick else [60, 120, 240]
    series, lines, ok, q1 = [], [], True, float("nan")
    for degree, tol in ((0, 0.2), (1, 0.25)):
        hs, errs = gaussian_errors(degree, cells)
        q = fit_slope(hs, errs)
        ok &= abs(q - (degree + 1)) < tol
        q1 = q if degree == 1 else q1
        lines.append(f"DG{degree}: errors {', '.join(f'{e:.2e}' for e in errs)}, order {q:.2f}")
        series.append(Series(hs, errs, "token cell size h", degree + 1.0, q, f"DG{degree}"))
    return Outcome(q1, "DG0 |q − 1| < 0.2, DG1 |q − 2| < 0.25", ok, "; ".join(lines), series)


@register("token_space_order", "§6.1; §7 item 2 (order in h)", "closed form (m_T, σ_T²) of theory §6.1")
def check_token_space_order(quick: bool) -> Outcome:
    """Order in the token cell size alone (depth steps fixed): DG0 |q − 1| < 0.2, DG1 |q − 2| < 0.25.

    ``gaussian_exact_d1`` refines depth and space together; here the depth steps are those of the finest
    mesh on every mesh, so the fitted slope is the spatial order of the scheme (DG0: 1, DG1: 2), provided
    the depth error (first order in Δt = T/steps, ``depth_order``) is below the finest spatial error:
    the value is DG1's order.
    """
    cells = [60, 120] if quick else [60, 120, 240]
    series, lines, ok, q1 = [], [], True, float("nan")
    for degree, tol in ((0, 0.2), (1, 0.25)):
        hs, errs = gaussian_errors(degree, cells, steps=cells[-1] // 4)
        q = fit_slope(hs, errs)
        ok &= abs(q - (degree + 1)) < tol
        q1 = q if degree == 1 else q1
        lines.append(f"DG{degree}: errors {', '.join(f'{e:.2e}' for e in errs)}, order {q:.2f}")
        series.append(Series(hs, errs, "token cell size h (depth steps fixed)", degree + 1.0, q, f"DG{degree}"))
    return Outcome(q1, "DG0 |q − 1| < 0.2, DG1 |q − 2| < 0.25 (depth fixed)", ok, "; ".join(lines), series)


@register("stability_w1_data", "§5.2; §7 item 4", "W1 exact by CDFs; closed-form constant e^{āT}(1−2b̄σ₀²T)^{−1/2}")
def check_stability_w1_data(quick: bool) -> Outcome:
    """W1(μ_T, μ'_T) against δ: fitted slope |q − 1| < 0.1, the ratio W1/δ within 2h/σ₀ of the closed form.

    2h/σ₀: the DG0 error of a first moment, O(h), relative to the scale σ₀ of μ.
    """
    n = 200
    deltas = [0.2, 0.1, 0.05]
    tt, u, *_ = transport_gaussian(n, 0, M0, HEADS)
    w1 = []
    for d in deltas:
        _, v, *_ = transport_gaussian(n, 0, M0 + d, HEADS)
        w1.append(w1_1d(tt, u, v))
    q = fit_slope(deltas, w1)
    const = float(np.exp(HEADS.abar * T) / np.sqrt(1 - 2 * HEADS.bbar * S0 * T))
    rel = max(abs(w / d - const) for w, d in zip(w1, deltas, strict=True)) / const
    h = 2 * BOX / n
    ok = abs(q - 1.0) < 0.1 and rel < 2 * h / np.sqrt(S0)
    return Outcome(q, f"|slope − 1| < 0.1, |W1/δ − C|/C < 2h/σ₀ = {2 * h / np.sqrt(S0):.2g}", ok,
                   f"W1 {', '.join(f'{w:.3e}' for w in w1)} at δ = {deltas}; W1/δ vs C = {const:.4f}: rel {rel:.2e}",
                   [Series(deltas, w1, "δ (shift of μ₀)", 1.0, q, "W1(μ_T, μ'_T)")])


@register("stability_w1_rho", "§5.2; §7 item 4", "closed-form ∂ŷ/∂ā + a∂ŷ/∂b̄ (theory §6.1)")
def check_stability_w1_rho(quick: bool) -> Outcome:
    """|ŷ − ŷ'| against W1(ρ, ρ') = wδ (head 0 moved by δ in v): slope |q − 1| < 0.1, ratio within 2h/σ₀."""
    n = 200
    deltas = [0.2, 0.1, 0.05]
    *_, y0 = transport_gaussian(n, 0, M0, HEADS)
    w = 0.5  # the head moved carries weight w: W1(ρ, ρ') = w δ (a Dirac moved by δ)
    dy, w1 = [], []
    for d in deltas:
        moved = HeadMeasure(HEADS.a.copy(), HEADS.c + np.array([w * d, 0.0]))
        *_, y1 = transport_gaussian(n, 0, M0, moved)
        dy.append(abs(y1 - y0))
        w1.append(w * d)
    q = fit_slope(w1, dy)
    # ŷ = m_T(ā, b̄); moving v of a head at a by δ with weight w moves ā by wδ and b̄ by a wδ
    e = 1e-6
    ap, bp = HEADS.abar, HEADS.bbar
    a0 = float(HEADS.a[0])

    def yh(ab: float, bb: float) -> float:
        return float(gaussian_transport(M0, S0, ab, bb, T)[0][0])

    const = abs((yh(ap + e, bp + a0 * e) - yh(ap - e, bp - a0 * e)) / (2 * e))
    rel = max(abs(y / x - const) for y, x in zip(dy, w1, strict=True)) / const
    h = 2 * BOX / n
    ok = abs(q - 1.0) < 0.1 and rel < 2 * h / np.sqrt(S0)
    return Outcome(q, f"|slope − 1| < 0.1, ratio rel. error < 2h/σ₀ = {2 * h / np.sqrt(S0):.2g}", ok,
                   f"|ŷ−ŷ'| {', '.join(f'{x:.3e}' for x in dy)} at W1(ρ,ρ') = {w1}; "
                   f"ratio vs {const:.4f}: rel {rel:.2e}",
                   [Series(w1, dy, "W1(ρ, ρ')", 1.0, q, "|ŷ − ŷ'|")])
