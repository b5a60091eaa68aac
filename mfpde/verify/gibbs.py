"""Check of the continued Gibbs fixed points ρ = p_ρ of entropic training (theory §4, §5.4, §6.2).

``gibbs_fixed_point_branch``: the single-layer problem of :mod:`mfpde.verify.training` (value heads θ = v, a = 0.5,
one sample N(0.3, 0.25), target 1, λ₂ = 1; DG1 tokens on [−6, 6], 120 cells; Θ = [−3, 3], 150 cells) continued
in λ from :data:`LAM_START` to :data:`LAM_STOP` by :func:`mfpde.training.gibbs.gibbs_branches` (Newton on ρ − p_ρ, the
Jacobian from the adjoint). At branch points λ_j (quick: 2, full: 4) the mean ā and variance V of ρ are compared
with two references the continuation did not produce:

(a) **time stepping**: ``mfpde run``'s training step (forward + adjoint, Φ set, the Lie splitting's implicit
    Fokker–Planck step: :meth:`CoupledProblem.splitting`) from ρ₀ = N(0.4, 0.05) for S steps of Δs = 0.5 at λ_j.
    Its fixed point is the same discrete vector (the EAFE generator is in detailed balance with e^{−Φ/λ}), so
    what separates them is what the iteration has left and the solvers' tolerances: the Lie step contracts the
    mean by |1 − k²Δs|/(1 + λ₂Δs) and the variance by 1/(1 + 2λ₂Δs) per step (the moment laws of theory §6.2
    under backward Euler, :func:`mfpde.exact.shallow_lie_law`), so with q the larger,
    |x_S − x_∞| ≤ q/(1 − q)|x_S − x_{S−1}| (a posteriori);
(b) **the closed form** N(ā*, λ/λ₂) of :func:`mfpde.exact.shallow_fixed_point`. The discrete fixed point is the
    nodal Gaussian e^{−Φ/λ}, Φ linear + (λ₂/2)v², normalised by the lumped (trapezoidal) sum: its moments are the
    Gaussian's up to the aliasing of the trapezoidal rule, 2e^{−2π²σ²/h²} times (1 + 2πσ/h)² (Poisson summation;
    σ² = λ/λ₂, h = 0.04: < 1e-40 at λ ≥ 0.01), and the mass beyond Θ, erfc((3 − |ā*|)/(σ√2)) times 3² (< 1e-30 at
    λ ≤ 0.1). The mean also moves with the token model's error δŷ of ŷ (DG1: :func:`~mfpde.verify.shallow.dg1_bound`
    times 0.4, absolute) by ≤ k δŷ/λ₂ (ā = −k(ŷ(ā) − y)/λ₂); the variance λ/λ₂ does not depend on ŷ.

Both bounds add Newton's tolerance, ‖ρ_N − ρ*‖₂ ≤ ‖(∂F/∂ρ)⁻¹‖₂ ‖F(ρ_N)‖₂, times the 2-norm of the moment's weights
(m v, m (v − ā)², m), and round-off γ_n|x| with n = 100 N_Θ (Higham's γ_n over the Θ sums and solves). Two more
conditions catch a wrong Jacobian or stability (Newton converges to the right root with a wrong Jacobian):
the Taylor remainder ‖F(x + εδ) − F(x) − εJδ‖ falls at order ≥ 1.8 from ε = 10⁻² to 10⁻³ (2 less the 0.2 every
order check allows; H = ∂D/∂c is exact here, R being quadratic in c), and the leading eigenvalue of −∂F/∂ρ is −1
to 1e-9 of the largest |eigenvalue| (the single layer's spectrum: −1 on the N − 1 directions that do not move ā,
and −(1 + k²Var_p(v)/λ) on the one that does: ``mfpde.training.gibbs``). The certificate λ KL(ρ ‖ p_ρ) that
every branch point reports is 0 there, so it is checked off the branch, at a perturbed ρ, against λ Σ m ρ log(ρ/p_ρ)
recomputed (:func:`certificate_off_branch`).
"""

from __future__ import annotations

import math

from mpi4py import MPI

import numpy as np

from mfpde.config import Config
from mfpde.continuation import Branch
from mfpde.exact import shallow_fixed_point
from mfpde.training.gibbs import GibbsProblem
from mfpde.verify.models import A_FIXED, M0, S0, gaussian_config
from mfpde.verify.registry import Outcome, register

__all__ = ["LAM_START", "LAM_STOP", "continued_branch", "time_stepped"]

#: λ range of the branch, λ₂, Θ cells on [−3, 3]; Δs and steps of the time stepping; k = m₀(1 + aσ₀²).
LAM_START, LAM_STOP, LAM2, CELLS, BOX = 0.1, 0.01, 1.0, 150, 3.0
DS, STEPS = 0.5, 60
K_SHALLOW = M0[0] * (1 + A_FIXED * S0[0])
ORDER_MIN = 1.8


def _config(lam: float, steps: int = 1) -> Config:
    from mfpde.verify.shallow import TOKEN_BOX

    return gaussian_config("value", 1, (1.0,), "shallow", "entropic", lam, LAM2, DS, steps, "lie", token_cells=120,
                           token_degree=1, theta_cells=CELLS, theta_box=BOX, mean=(0.4,), var=0.05,
                           token_box=TOKEN_BOX)


def _moments(w: np.ndarray, v: np.ndarray) -> tuple[float, float]:
    """(mean, variance) of the lumped weights w_i = m_i ρ_i at the nodes v."""
    mean = float(w @ v / w.sum())
    return mean, float(w @ (v - mean) ** 2 / w.sum())


def continued_branch(comm: MPI.Comm = MPI.COMM_WORLD) -> tuple[GibbsProblem, Branch]:
    """(the GibbsProblem, the branch from LAM_START to LAM_STOP: mfpde.continuation.Branch). Collective."""
    from mfpde.continuation import Newton, StepControl, continue_branch, tangent
    from mfpde.training.gibbs import gibbs_start as _start
    from mfpde.training.problem import CoupledProblem

    P = GibbsProblem(CoupledProblem.from_config(_config(LAM_START), comm))
    W = P.inner_weights()
    with Newton(P, P.m) as nw:
        x0 = _start(P, nw, LAM_START)
        if x0 is None:
            raise ArithmeticError(f"Newton found no fixed point at λ = {LAM_START}")
        e = np.zeros(P.m + 1)
        e[-1] = -1.0
        br = continue_branch(P, nw, x0, tangent(P, x0, e, W), W, StepControl(0.05, 1e-6, 0.5, LAM_STOP, LAM_START,
                                                                               200))
    return P, br


def time_stepped(lam: float, steps: int, comm: MPI.Comm = MPI.COMM_WORLD) -> np.ndarray:
    """(mean, variance) of ρ after each of ``steps`` Lie training steps at λ, shape (steps + 1, 2). Collective."""
    from mfpde.training.problem import CoupledProblem

    cp = CoupledProblem.from_config(_config(lam, steps), comm)
    splitting = cp.splitting()
    v = cp.theta.points[:, 0]
    rows = []
    for step in range(steps + 1):
        rows.append(_moments(cp.theta.gather(cp.rhos[0]), v))
        if step < steps:
            heads = cp.heads()
            cp.state.set_potentials(heads, cp.gradient(heads).D)
            splitting.step(DS)
    return np.array(rows)


def _gamma(n: int) -> float:
    u = np.finfo(float).eps / 2
    return n * u / (1 - n * u)


def _taylor_order(P: GibbsProblem, x: np.ndarray) -> float:
    """log10 of the ratio of the Taylor remainders at ε = 10⁻² and 10⁻³ along a fixed direction (δρ, δλ)."""
    m = P.m
    u, lam = x[:m], float(x[m])
    rng = np.random.default_rng(7)
    d = rng.standard_normal(m) * P.blocks(u).max() * 0.1
    dl = 0.1 * lam
    Ju, JK = P.jacobian(u, lam)
    F0 = P.residual(u, lam)
    rem = [float(np.linalg.norm(P.residual(u + e * d, lam + e * dl) - F0 - e * (Ju @ d + JK * dl)))
           for e in (1e-2, 1e-3)]
    return math.log10(rem[0] / rem[1]) if rem[1] > 0 else math.inf


def certificate_off_branch(P: GibbsProblem, u: np.ndarray, lam: float) -> tuple[float, float, float, str]:
    """(the code's certificate, λ Σ m ρ log(ρ/p_ρ) recomputed, the round-off bound, a line) at a ρ off the fixed point.

    ρ = the branch point times 1 + 0.3 sin(3v + 0.5), renormalised (Σ m ρ = 1 per block): there KL(ρ‖p_ρ) > 0, so a
    certificate without its factor λ (or with another λ) is seen; at a fixed point it is 0 whatever the factor. The
    reference takes the code's Φ at ρ (the adjoint's δR/δρ, checked by the branch itself) and makes
    log p = −Φ/λ − log Σ m e^{−Φ/λ} by scipy's logsumexp, then λ Σ m ρ (log ρ − log p). Bound: γ_{4N+16} times
    λ Σ m ρ (|log ρ| + |log p|) (N terms, each made in a few operations; the log-sum-exp's own round-off).
    """
    from scipy.special import logsumexp

    rho = P.blocks(u) * (1.0 + 0.3 * np.sin(3.0 * P.v + 0.5))[None, :]
    rho = rho / (rho @ P.mass)[:, None]
    u_off = rho.ravel()
    cert = P.certificate(u_off, lam)
    phi = P.potential(u_off)[0]
    logp = -phi / lam - logsumexp(-phi / lam, b=P.mass[None, :], axis=1)[:, None]
    pos = rho > 0
    logr = np.log(np.where(pos, rho, 1.0))
    w = np.where(pos, rho, 0.0) * P.mass[None, :]
    ref = float(lam * (w * (logr - logp)).sum())
    bound = _gamma(4 * rho.size + 16) * lam * float((w * (np.abs(logr) + np.abs(logp))).sum())
    return cert, ref, bound, (f"certificate off the branch at λ = {lam:.4g}: {cert:.15g} against λ Σ m ρ log(ρ/p_ρ) "
                              f"{ref:.15g} (|Δ| {abs(cert - ref):.1e} ≤ {bound:.1e})")


@register("gibbs_fixed_point_branch", "§4 (ρ = p_ρ); §5.4; §6.2", "Lie time stepping to stationarity; closed form "
          "N(ā*, λ/λ₂)", kind="moment", budget_s=120.0)
def check_gibbs_fixed_point_branch(quick: bool) -> Outcome:
    """Mean and variance of the continued fixed points against time stepping and the closed form (module docstring).

    The row is the comparison nearest its bound (measured/bound ≤ 1); the Taylor order and the spectrum are in
    the threshold's conditions.
    """
    from mfpde.verify.shallow import dg1_bound

    P, br = continued_branch()
    inside = [j for j, lam in enumerate(br.K) if LAM_STOP <= lam <= LAM_START]
    n_cmp = 2 if quick else 4
    picks = [inside[round(i * (len(inside) - 1) / (n_cmp - 1))] for i in range(n_cmp)] if len(inside) >= n_cmp else []
    if not picks:
        return Outcome(math.nan, 0.0, "≤ 1", False, f"the branch has {len(inside)} points in [{LAM_STOP}, "
                       f"{LAM_START}]: {br.stopped}")
    v, mass, h = P.points[:, 0], P.mass, 2 * BOX / CELLS
    worst: tuple[float, float, float, float, str] = (-1.0, 0.0, 0.0, 0.0, "")
    lines = []
    for j in picks:
        u, lam = br.u[j], br.K[j]
        astar, var_star, _ = shallow_fixed_point(lam, LAM2, A_FIXED, M0[0], S0[0], 1.0)
        mean, var = _moments(mass * u, v)
        Ju = P.jacobian(u, lam)[0]
        dr = float(np.linalg.norm(np.linalg.inv(Ju), 2) * np.linalg.norm(P.residual(u, lam)))
        newton = {"mean": dr * float(np.linalg.norm(mass * v)) + abs(mean) * dr * float(np.linalg.norm(mass)),
                  "var": dr * float(np.linalg.norm(mass * (v - mean) ** 2)) + var * dr * float(np.linalg.norm(mass))}
        sigma = math.sqrt(var_star)
        theta_err = (2 * math.exp(-2 * math.pi**2 * var_star / h**2) * (1 + 2 * math.pi * sigma / h) ** 2
                     + math.erfc((BOX - abs(astar)) / (sigma * math.sqrt(2))) * BOX**2)
        token = K_SHALLOW * 0.4 * dg1_bound(120) / LAM2
        ts = time_stepped(lam, STEPS)
        q = max(abs(1 - K_SHALLOW**2 * DS) / (1 + LAM2 * DS), 1 / (1 + 2 * LAM2 * DS))
        for col, key, x, exact in ((0, "mean", mean, astar), (1, "var", var, var_star)):
            ro = _gamma(100 * (CELLS + 1)) * abs(exact)
            left = q / (1 - q) * abs(ts[-1, col] - ts[-2, col])
            b_ts = left + newton[key] + 2 * ro
            b_cf = newton[key] + ro + theta_err + (token if key == "mean" else 0.0)
            for err, bound, ref, what in ((abs(x - ts[-1, col]), b_ts, ts[-1, col], "time stepping"),
                                          (abs(x - exact), b_cf, exact, "closed form")):
                lines.append(f"λ={lam:.4g} {key} {x:.14g} vs {what} {ref:.14g}: {err:.1e} ≤ {bound:.1e}")
                if err / bound > worst[0]:
                    worst = (err / bound, x, ref, bound, f"{key} at λ = {lam:.6g} against {what}")
    cert, cert_ref, cert_bound, cert_line = certificate_off_branch(P, br.u[picks[0]], br.K[picks[0]])
    lines.append(cert_line)
    order = _taylor_order(P, np.concatenate([br.u[picks[0]], [br.K[picks[0]]]]))
    vals, _ = P.stability(br.u[picks[-1]], br.K[picks[-1]], 2)
    lead = float(vals[0].real)
    spec_ok = abs(lead + 1.0) <= 1e-9 * max(1.0, float(np.abs(vals).max()))
    cert_ok = abs(cert - cert_ref) <= cert_bound
    ok = worst[0] <= 1.0 and order >= ORDER_MIN and spec_ok and cert_ok
    ratio, x, ref, bound, what = worst
    conditions = f"Taylor order ≥ {ORDER_MIN}; leading eigenvalue −1"
    if not cert_ok:  # the row shows the part that failed
        return Outcome(cert, cert_ref, f"≤ {cert_bound:.1e} (the certificate λ KL(ρ‖p_ρ) off the branch, round-off); "
                       "moments within their bounds; " + conditions, False, "; ".join(lines), [], cert_bound)
    conditions += f"; certificate off the branch = λ Σ m ρ log(ρ/p_ρ) to {cert_bound:.1e}"
    return Outcome(x, ref, f"≤ {bound:.1e} (stationarity + Newton + Θ/token + round-off); " + conditions, ok,
                   f"worst: {what} (|Δ|/bound = {ratio:.2f}); {len(br.K)} branch points, {br.newton_its} Newton "
                   f"iterations; Jacobian Taylor order {order:.2f}; leading eigenvalue of −∂F/∂ρ {lead:.12g}; "
                   + "; ".join(lines), [], bound)
