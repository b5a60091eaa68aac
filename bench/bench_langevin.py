"""Training: the Fokker–Planck PDE against mean-field Langevin particles (noisy heads) on the exact law of §6.2.

The value family (θ = v, A = aI fixed), one Gaussian token sample in d = 1, squared loss on the mean readout,
entropic regularisation: a Gaussian ρ₀ = N(ā₀, v₀) stays Gaussian and its mean and variance solve two ODEs
(theory §6.2, :func:`mfpde.exact.value_training_law`). The error is max(|mean − exact|, |variance − exact|) of
ρ_S at S = 1. Both methods are timed in this one run, on one core:

* **PDE**: ``mfpde``'s coupled solver (token transport DG1 on 100 cells + discrete adjoint, Fokker–Planck on
  200 Θ cells), Lie splitting for a ladder of Δs and one Strang run; the whole training loop is timed. (Strang's
  risk transport is explicit upwind on Θ: first order in h, CFL sub-steps ∝ h, two gradients per sub-step; its
  variance error here is the upwind diffusion, ~0.2 h.)
* **Mean-field Langevin particles** (H noisy heads, Euler–Maruyama with the same Δs):
  v_h ← v_h − Δs (∂_ā R(ā_H) + λ₂ v_h) + √(2λΔs) ξ_h, ā_H = mean of the v_h, the gradient of the risk from the
  particle token solver (400 quantile tokens, RK4, :func:`mfpde.tokens.box.particles.transport_particles`) by central
  differences in ā. Errors are averaged over 4 seeds.
  - "aggregated": the heads share A = aI, so the attention is evaluated once per solve (cost independent of H);
  - "per head" (what a transformer code does: every head its own attention): the cost of one solve grows like
    H; it is measured at H = 10³ and extrapolated linearly (marked).

Writes ``out/bench/langevin.json`` and prints a markdown table: for each target error (1e-2, 1e-3) the cheapest
run that reaches it. Run: ``python bench/bench_langevin.py`` (about 3 minutes).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from mpi4py import MPI

import numpy as np
from scipy.stats import norm
from threadpoolctl import threadpool_limits

from mfpde import config as C
from mfpde.exact import value_training_law
from mfpde.heads import HeadMeasure
from mfpde.jobs.run import run_training
from mfpde.tokens.box.particles import transport_particles

A, M0, S0, Y, T = 0.5, 0.3, 0.25, 1.0, 1.0
LAM, LAM2, S = 0.02, 0.5, 1.0
ABAR0, VAR0 = 0.4, 0.05
EXACT = value_training_law(S, ABAR0, VAR0, LAM, LAM2, A, M0, S0, Y, T)
TARGETS = (1e-2, 1e-3)
N_TOKENS, RK4_STEPS = 400, 40


def pde(ds: float, n_tokens: int, n_theta: int, splitting: str = "lie") -> dict:
    """One training run of the PDE solver to S; returns the error of (mean, variance) of ρ_S and the time."""
    raw = {
        "tokens": {"dim": 1, "box": [[-4.0, 4.0]], "cells": [n_tokens], "degree": 1},
        "depth": {"T": T, "steps": max(n_tokens // 4, 10)},
        "heads": {"family": "value", "a": A, "box": [[-2.5, 2.5]], "cells": [n_theta],
                  "init": {"kind": "gaussian", "mean": [ABAR0], "cov": [[VAR0]]}},
        "data": {"kind": "gaussian", "mean": [[M0]], "cov": [[[S0]]], "target": [Y]},
        "loss": {"readout": "mean"},
        "training": {"regularization": "entropic", "lambda": LAM, "lambda2": LAM2, "ds": ds,
                     "steps": int(round(S / ds)), "splitting": splitting},
        "output": {"every": int(round(S / ds)), "fields": False, "plots": False, "checkpoint_every": 10**6},
    }
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        assert run_training(C.from_dict(raw), Path(tmp), comm=MPI.COMM_SELF) == 0
        t = time.perf_counter() - t0
        fin = json.loads((Path(tmp) / "report.json").read_text())["final"]
    err = float(np.abs(np.array([fin["rho_mean"][0], fin["rho_cov"][0][0]]) - EXACT).max())
    return {"method": f"PDE ({splitting})", "size": f"Δs = {ds}, {n_tokens} token cells, {n_theta} Θ cells",
            "time_s": t, "err": err}


_X0 = M0 + np.sqrt(S0) * norm.ppf((np.arange(N_TOKENS) + 0.5) / N_TOKENS)[:, None]
_W0 = np.full(N_TOKENS, 1.0 / N_TOKENS)


def _yhat(heads: HeadMeasure) -> float:
    return float(transport_particles(_X0, _W0, heads, T, RK4_STEPS)[:, 0].mean())


def _dR(abar: float, eps: float = 1e-5) -> float:
    """∂R/∂ā by central differences of the particle network's risk ½(ŷ − y)²."""
    rp = 0.5 * (_yhat(HeadMeasure(np.array([A]), np.array([abar + eps]))) - Y) ** 2
    rm = 0.5 * (_yhat(HeadMeasure(np.array([A]), np.array([abar - eps]))) - Y) ** 2
    return (rp - rm) / (2 * eps)


def langevin(ds: float, H: int, seeds: int = 4) -> dict:
    """Mean-field Langevin training of H noisy heads to S (aggregated attention); error averaged over seeds."""
    errs, times = [], []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        v = ABAR0 + np.sqrt(VAR0) * rng.standard_normal(H)
        t0 = time.perf_counter()
        for _ in range(int(round(S / ds))):
            v = v - ds * (_dR(float(v.mean())) + LAM2 * v) + np.sqrt(2 * LAM * ds) * rng.standard_normal(H)
        times.append(time.perf_counter() - t0)
        errs.append(float(np.abs(np.array([v.mean(), v.var()]) - EXACT).max()))
    return {"method": "Langevin, aggregated", "size": f"Δs = {ds}, H = {H}", "time_s": float(np.mean(times)),
            "err": float(np.mean(errs)), "ds": ds, "H": H}


def per_head_cost() -> float:
    """Seconds per training step and head of the per-head Langevin code (two solves with H = 1000 distinct heads).

    The cost of a solve with H heads, each its own attention, is linear in H; anchored at H = 1000, where the
    per-head work dominates the fixed costs (measured: H = 10, 100 cost about as much as H = 1).
    """
    H = 1000
    heads = HeadMeasure(np.full(H, A), np.random.default_rng(0).normal(ABAR0, 0.2, H) / H)
    t0 = time.perf_counter()
    _yhat(heads)
    return 2 * (time.perf_counter() - t0) / H  # two solves per step (central differences)


def main() -> None:
    rows = []
    with threadpool_limits(limits=1):
        pde(0.5, 20, 20)  # JIT
        for ds in (0.2, 0.1, 0.05, 0.025):
            rows.append(pde(ds, 100, 200))
        rows.append(pde(0.1, 100, 200, "strang"))
        for ds in (0.1, 0.05, 0.025):
            for H in (1000, 10000, 100000):
                rows.append(langevin(ds, H, seeds=3))
        c1 = per_head_cost()
    for r in [r for r in rows if r["method"].startswith("Langevin")]:
        steps = int(round(S / r["ds"]))
        rows.append({**r, "method": "Langevin, per head (extrapolated)", "time_s": steps * c1 * r["H"]})
    print("| method | size | time [s] | error of (mean, variance) of ρ_S |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['method']} | {r['size']} | {r['time_s']:.3g} | {r['err']:.1e} |")
    methods = list(dict.fromkeys(r["method"] for r in rows))
    print("\n| error ≤ | " + " | ".join(methods) + " |\n|---|" + "---|" * len(methods))
    for tol in TARGETS:
        cells = []
        for m in methods:
            ok = [r for r in rows if r["method"] == m and r["err"] <= tol]
            best = min(ok, key=lambda r: r["time_s"]) if ok else None
            cells.append(f"{best['time_s']:.3g} s ({best['size']})" if best else "not reached")
        print(f"| {tol:g} | " + " | ".join(cells) + " |")
    print(f"\nper-head Langevin step: {c1:.3g} s × H; exact law (ā_S, v_S) = {EXACT.tolist()}")
    out = Path("out/bench")
    out.mkdir(parents=True, exist_ok=True)
    (out / "langevin.json").write_text(json.dumps({"rows": rows, "per_head_step_s_per_head": c1,
                                                   "exact": EXACT.tolist()}, indent=2))


if __name__ == "__main__":
    main()
