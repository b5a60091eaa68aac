"""Checks against the autodiff twin (theory §12).

The finite network of theory §1.1 in JAX (:mod:`mfpde.twin`), whose gradient comes from ``jax.grad``, never from
mfpde's adjoint.

* ``twin_gradient``: ∇_v δR/δρ of a deep (weight-tied) model from mfpde's discrete adjoint (DG1 tokens, SSP-RK3 in
  depth) against the twin's H ∂R_H/∂v_h at the same head measure (value heads: the attention does not depend on
  v, so one head at v̄ = ∫ v dρ is that measure's network) with the token limit (Gauss–Hermite) and L Euler
  layers, Richardson-extrapolated in L. The bound: the PDE's own error by Richardson in h (order ≥ 1: twice the
  change from h to h/2) plus the twin's depth error (the change from L to 2L bounds that of the extrapolation)
  plus round-off.
* ``twin_tokens_rate``, ``twin_depth_rate``: the same model with the second-moment readout; the risk and ŷ gaps of
  N i.i.d. tokens against the same twins at the token limit (paired seeds) fall as N^{−1/2}, the depth error
  (R_L − R_L')/(1 − L/L') of L Euler layers as L^{−1}.
* ``twin_heads_rate``: the deep model trained by the PDE and by twins of H Langevin heads (the token limit, many
  layers): the exponent of one seed's risk gap and of W1(heads, ρ_s) against H within 4 standard errors of
  −1/2 (propagation of chaos, theory §5.3, §12), and the seed-mean gap at the largest H within its Monte-Carlo
  error plus the O(1/H) bias bounded from the smallest H.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from mpi4py import MPI

import numpy as np

from mfpde.fitting import fit_order
from mfpde.training.problem import CoupledProblem
from mfpde.verify.models import gaussian_config
from mfpde.verify.registry import Outcome, Series, register

if TYPE_CHECKING:
    from mfpde.config import Config

__all__ = ["pde_first_variation", "twin_first_variation"]

#: The readout of these checks: g(x) = W x + B (an offset, so that a readout that drops it is caught).
W_READ, B_READ = 1.3, 0.3
TARGETS = (1.0, -0.5)


def _config(cells: int, family: str = "value", **kw: Any) -> Config:
    from dataclasses import replace

    cfg = gaussian_config(family, 2, TARGETS, "weight-tied", token_cells=cells, token_degree=1, theta_cells=40,
                          mean=(0.4,) if family == "value" else (0.3, 0.4), token_box=6.0, **kw)
    return replace(cfg, loss=replace(cfg.loss, readout="linear", w=[W_READ], b=B_READ))


def pde_first_variation(cells: int, comm: MPI.Comm = MPI.COMM_WORLD) -> tuple[float, float, float]:
    """(R, ∂_v δR/δρ at A_FIXED, v̄ = ∫ v dρ₀) of the deep value model on ``cells`` token cells (mfpde's adjoint)."""
    cp = CoupledProblem.from_config(_config(cells), comm)
    heads = cp.heads()
    g = cp.gradient(heads)
    return float(g.risk), float(g.D[0][0]), float(heads[0].abar)


def twin_first_variation(vbar: float, layers: int, cfg: Config) -> tuple[float, float]:
    """(R_H, H ∂R_H/∂v_1) of the twin with one head at v̄, the token limit and ``layers`` Euler layers."""
    from mfpde.tokens.box.data import load_samples
    from mfpde.twin.config import section
    from mfpde.twin.network import make_network
    from mfpde.twin.sizes import network_spec
    from mfpde.twin.tokens import input_tokens

    sec = section(cfg)
    train, _ = load_samples(sec)
    x, w = input_tokens(train, 0, "limit", np.random.default_rng(0))
    net = make_network(network_spec(sec), layers)
    r, g = net.risk_grad(np.array([[[vbar]]]), x, w, np.array([s.target for s in train]))
    return float(r), float(np.asarray(g)[0, 0, 0])


@register("twin_gradient", "§3, §12 (the twin)", "JAX autodiff of the finite network (token limit, L → ∞ by "
          "Richardson)", kind="|Δ δR/δρ|", budget_s=120.0)
def check_twin_gradient(quick: bool) -> Outcome:
    """|∂_v δR/δρ (adjoint, h) − H ∂R_H/∂v (twin)| within the PDE's Richardson error + the twin's depth error."""
    comm = MPI.COMM_WORLD
    cells = [60, 120] if quick else [60, 120, 240]
    pde = [pde_first_variation(n, comm) for n in cells]
    vbar = pde[-1][2]
    L = 256
    cfg = _config(cells[-1])
    (r1, d1), (r2, d2), (r3, d3) = (twin_first_variation(vbar, k * L, cfg) for k in (1, 2, 4))
    # Euler in depth: first order in 1/L; the extrapolations (2L, L) and (4L, 2L) are second order, so the
    # latter's error is at most |their difference|/(2² − 1) (Richardson again)
    d_tw, r_tw = 2 * d3 - d2, 2 * r3 - r2
    tol_tw = abs(d_tw - (2 * d2 - d1)) / 3
    d_h, d_h2 = pde[-1][1], pde[-2][1]
    tol = 2 * abs(d_h - d_h2) + tol_tw + 64 * np.finfo(float).eps * max(abs(d_h), 1.0) * cells[-1]
    err = abs(d_h - d_tw)
    errs = [abs(p[1] - d_tw) for p in pde]
    slope = fit_order([12.0 / n for n in cells], errs) if min(errs) > 0 else math.nan
    detail = (f"adjoint δR/δρ_v on {cells} cells: {', '.join(f'{p[1]:.10g}' for p in pde)}; twin (L = {L}, {2 * L}, "
              f"{4 * L}, extrapolated) {d_tw:.10g} (±{tol_tw:.1e}); |Δ| per mesh "
              f"{', '.join(f'{e:.2e}' for e in errs)} (order {slope:.2f}); "
              f"risk {pde[-1][0]:.10g} vs twin {r_tw:.10g}")
    return Outcome(err, 0.0, f"≤ {tol:.2e} (PDE's + twin's Richardson errors)", bool(err <= tol), detail,
                   [Series([12.0 / n for n in cells], errs, "h", 2.0, slope, "|adjoint − twin|")], tol)


#: Sizes of ``twin_heads_rate`` (full; quick: the first three) and its seeds.
RATE_HEADS, RATE_SEEDS = [4, 16, 64, 256], 8


def _rate_config(quick: bool, readout: str = "mean", seeds: int = RATE_SEEDS) -> Config:
    import tomllib

    from mfpde.config import from_dict
    from mfpde.config.keys import to_toml

    cfg = gaussian_config("scalar", 2, (1.0, 0.0), "weight-tied", reg="entropic", lam=0.05, lam2=1.0, ds=0.05,
                          steps=40 if quick else 100, token_cells=96, token_degree=1, theta_cells=32, theta_box=2.0,
                          mean=(0.3, 0.5), var=0.1, token_box=6.0)
    raw = tomllib.loads(to_toml(cfg))
    raw["depth"]["steps"] = 10
    raw["heads"].update(box=[[-2.0, 2.0], [-2.5, 2.5]], cells=[32, 40])
    raw["output"]["every"] = 20
    raw["loss"] = {"readout": readout}
    raw["twin"] = {"heads": RATE_HEADS[:3] if quick else RATE_HEADS, "layers": [8], "seeds": seeds}
    return from_dict(raw)


def pde_history(cfg: Config, comm: MPI.Comm = MPI.COMM_WORLD) -> object:
    """The PDE's training of ``cfg`` in memory as the twin's comparison reads it (:class:`mfpde.twin.pde.PdeRun`)."""
    from pathlib import Path

    from mfpde.twin.pde import PdeRun

    cp = CoupledProblem.from_config(cfg, comm)
    tr, every = cfg.training, cfg.output.every
    splitting = cp.splitting()
    steps, risk, rho, yhat = [], [], [], np.zeros(0)
    for step in range(tr.steps + 1):
        heads = cp.heads()
        g = cp.gradient(heads)
        if step % every == 0 or step == tr.steps:
            steps.append(step)
            risk.append(g.risk)
            rho.append(cp.theta.gather(cp.rhos[0]))
            yhat = np.asarray(g.yhat)
        if step == tr.steps:
            break
        cp.state.set_potentials(heads, g.D)
        splitting.step(tr.ds)
    nan = np.full(len(steps), np.nan)
    return PdeRun(Path("."), np.array(steps, float), np.array(risk), nan, nan, yhat, cp.theta.points, rho, None, {})


@register("twin_heads_rate", "§4, §5.3, §12 (propagation of chaos)", "twins of H Langevin heads trained by JAX "
          "autodiff (token limit, 8 layers), 8 seeds", budget_s=240.0, distributed=False)
def check_twin_heads_rate(quick: bool) -> Outcome:
    """The exponents of one seed's risk gap and of W1(heads, ρ_s) in H within 4 standard errors of −1/2."""
    from mfpde.tokens.box.data import load_samples
    from mfpde.twin.config import section
    from mfpde.twin.report import compare
    from mfpde.twin.sizes import Size, train_size

    cfg = _rate_config(quick)
    comm = MPI.COMM_SELF  # every rank the same: the twins' numbers do not depend on the rank
    pde = pde_history(cfg, comm)
    sec = section(cfg)
    samples = load_samples(sec)
    sizes = [Size("heads", H, 0, 8) for H in sec.twin.heads]
    hist = {sz.key: train_size(sec, sz, samples, []) for sz in sizes}
    exps = compare(sec, sizes, hist, pde, {"risk": 0.0, "yhat": 0.0, "rho_w1": 0.0})[0]["heads"]  # type: ignore
    worst, lines, ok, series = 0.0, [], True, []
    for name in ("risk", "rho_w1"):
        f = exps[name]
        z = abs(f["slope"] + 0.5) / f["se"] if f["slope"] is not None and f["se"] else math.inf
        ok &= z <= 4.0
        worst = max(worst, z)
        lines.append(f"{name}: {f['slope']:.3f} ± {f['se']:.3f} (gaps {', '.join(f'{g:.2e}' for g in f['gaps'])})")
        series.append(Series(f["sizes"], f["gaps"], "H", -0.5, f["slope"], name))
    good, line = _bias_within(exps["risk_bias"], "H")
    ok &= good
    lines.append(line)
    f = exps["risk"]
    return Outcome(f["slope"], -0.5, "|q + 1/2| ≤ 4 se (risk gap, W1 of the heads); bias ≤ 4 se + C/H", bool(ok),
                   "; ".join(lines) + f"; worst |q + 1/2|/se = {worst:.2f}", series, 4 * f["se"])


def _bias_within(b: dict, x: str) -> tuple[bool, str]:
    """The seed-mean gap at the largest size within its Monte-Carlo error and an O(1/size) bias.

    With |E gap| ≤ C/x, each smaller size bounds C ≤ x_k (|m_k| + 4 se_k), so at the largest |m| ≤ 4 se +
    min_k C_k / x_max. A reference that is off (a PDE with a wrong training law, tokens of the wrong law) leaves a
    gap that does not fall with the size.
    """
    X, m, se = b["sizes"], b["gaps"], b["gap_se"]
    c_max = min(h * (mk + 4 * sk) for h, mk, sk in zip(X[:-1], m[:-1], se[:-1], strict=True))
    bound = 4 * se[-1] + c_max / X[-1]
    return m[-1] <= bound, (f"seed-mean gap at {x} = {X[-1]}: {m[-1]:.2e} ± {se[-1]:.1e} (bound 4 se + C/{x} = "
                            f"{bound:.2e}, C ≤ {c_max:.2e})")


def _paired_sweep(quick: bool, sweep: str, sizes: list[int], H: int, N: int, L: int,
                  seeds: int = RATE_SEEDS) -> dict[str, object]:
    """The fits of a paired sweep of the deep model with the second-moment readout, trained by PDE and twins.

    Tokens against the token limit, layers against the next L (its depth error is resolved by the seeds).
    """
    from mfpde.tokens.box.data import load_samples
    from mfpde.twin.config import section
    from mfpde.twin.report import compare
    from mfpde.twin.sizes import Size, train_size

    cfg = _rate_config(quick, "second_moment", seeds)
    pde = pde_history(cfg, MPI.COMM_SELF)
    sec = section(cfg)
    samples = load_samples(sec)
    runs = ([Size("tokens", H, n, L) for n in sizes] + [Size("heads", H, 0, L)] if sweep == "tokens"
            else [Size("layers", H, 0, n) for n in sizes])
    hist = {sz.key: train_size(sec, sz, samples, []) for sz in runs}
    exps = compare(sec, runs, hist, pde, {"risk": 0.0, "yhat": 0.0, "rho_w1": 0.0})[0]  # type: ignore[arg-type]
    return exps[sweep]


def _rate_outcome(fits: dict[str, object], expected: float, xlabel: str) -> Outcome:
    lines, ok, series, worst = [], True, [], 0.0
    for name in ("risk", "yhat"):
        f: dict = fits[name]  # type: ignore[assignment]
        z = abs(f["slope"] - expected) / f["se"] if f["slope"] is not None and f["se"] else math.inf
        ok &= z <= 4.0
        worst = max(worst, z)
        lines.append(f"{name}: {f['slope'] if f['slope'] is not None else math.nan:.3f} ± "
                     f"{f['se'] if f['se'] is not None else math.nan:.3f} (gaps "
                     f"{', '.join(f'{g:.2e}' for g in f['gaps'])}){' ' + f['note'] if f['note'] else ''}")
        series.append(Series(f["sizes"], f["gaps"], xlabel, expected,
                             f["slope"] if f["slope"] is not None else math.nan, name))
    for name in ("risk_bias", "yhat_bias"):
        if name in fits:
            good, line = _bias_within(fits[name], xlabel)  # type: ignore[arg-type]
            ok &= good
            lines.append(f"{name}: {line}")
    f = fits["risk"]  # type: ignore[assignment]
    slope = f["slope"] if f["slope"] is not None else math.nan
    cond = "; bias ≤ 4 se + C/N" if "risk_bias" in fits else ""
    return Outcome(slope, expected, f"|q − ({expected:g})| ≤ 4 se (risk and ŷ){cond}", bool(ok),
                   "; ".join(lines) + f"; worst |q − q*|/se = {worst:.2f}", series,
                   4 * f["se"] if f["se"] else None)


@register("twin_tokens_rate", "§5.3, §12 (tokens)", "twins of N i.i.d. tokens against the same twins at the token "
          "limit (paired heads and noise), JAX autodiff, 32 seeds", budget_s=240.0, distributed=False)
def check_twin_tokens_rate(quick: bool) -> Outcome:
    """The exponents of the paired risk and ŷ gaps in N within 4 standard errors of −1/2 (i.i.d. tokens)."""
    return _rate_outcome(_paired_sweep(quick, "tokens", [8, 32, 128], 4, 0, 4,
                                       seeds=32), -0.5, "N")


@register("twin_depth_rate", "§5.3, §12 (depth)", "twins of L Euler layers against the next L (paired heads and "
          "noise), JAX autodiff, 8 seeds", budget_s=240.0, distributed=False)
def check_twin_depth_rate(quick: bool) -> Outcome:
    """The exponents of the depth error e_L = (R_L − R_L')/(1 − L/L') and of ŷ's in L within 4 se of −1."""
    return _rate_outcome(_paired_sweep(quick, "layers", [1, 2, 4, 8], 16, 0, 0),
                         -1.0, "L")
