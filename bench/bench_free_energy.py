"""The free-energy curve of entropic training: the PDE's exact F(ρ_s) − F* against mean-field Langevin particles.

The single residual layer (theory §2, §5.4) with Gaussian data in d = 1, two samples N(0.3, 0.25), N(−0.5, 0.1)
with targets 1 and −0.5 (the optimum fits neither: the residuals at ρ* are 0.6 and −0.3), squared loss, λ = 0.1,
λ₂ = 1, Θ = [−3, 3]^p:

* value heads θ = v (p = 1, a = 0.5): ŷ^i = m₀ⁱ + k_i ā, k_i = m₀ⁱ(1 + aσ₀ⁱ²), so R is quadratic in ā and
  ρ* = N(ā*, λ/λ₂), ā* = ⟨k(y − m₀)⟩/(λ₂ + ⟨k²⟩) (theory §6.2, n samples): F* in closed form;
* scalar heads θ = (a, v) (p = 2): ŷ^i = m₀ⁱ + m₀ⁱ(ā + σ₀ⁱ²b̄), Φ quadratic, ρ* Gaussian; its moments solve five
  algebraic equations (:func:`mfpde.exact.shallow_scalar_rate`, residual < 1e-10), F* from them.

**PDE**: ``mfpde``'s coupled solver (DG1 tokens on 120 cells, discrete adjoint, Lie splitting, Scharfetter–Gummel
P1 on Θ). At every step: F(ρ_s) (lumped quadrature), the certificate λ KL(ρ_s‖p_ρs) and the wall time.
Refinement: three Θ meshes at Δs = 0.1 and one at Δs = 0.05.

**MFLD**: H noisy heads on the same problem, same Δs, same ρ₀ (iid), closed-form drift ∇Φ = Hθ + g (Φ is
quadratic), advanced by the exact Ornstein–Uhlenbeck step with the drift frozen over Δs (an exponential
integrator: its stationary law has no O(Δs) bias, so what is left is H and the entropy estimator); one
Euler–Maruyama run (the usual MFLD step) shows the O(Δs) bias it adds. F_H = R(ρ_H) + (λ₂/2)⟨|θ|²⟩ + λ Ĥ with
∫ρ log ρ estimated by Kozachenko–Leonenko (1-NN, as Chizat) and by a Gaussian KDE (resubstitution, Scott's
bandwidth), at log-spaced rows. Particle times are the dynamics only (the estimators' cost is reported apart).

Writes ``out/bench/free_energy.json`` and ``out/bench/free_energy.png`` and prints markdown tables.
Run: ``nice -n 10 python bench/bench_free_energy.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from mpi4py import MPI

import numpy as np
from scipy.spatial import cKDTree
from scipy.special import digamma
from scipy.stats import gaussian_kde
from threadpoolctl import threadpool_limits

from mfpde.exact import shallow_scalar_rate
from mfpde.fitting import fit_order, fit_rate, slope_se
from mfpde.training.problem import CoupledProblem
from mfpde.training.records import history_row
from mfpde.verify.models import A_FIXED, M0, S0, gaussian_config
from mfpde.verify.shallow import TOKEN_BOX

LAM, LAM2, Y = 0.1, 1.0, (1.0, -0.5)
M, SIG2, TGT = np.array(M0), np.array(S0), np.array(Y)
RHO0 = {"value": (0.4,), "scalar": (0.2, 0.4)}
VAR0 = 0.05
TOLS = (1e-3, 1e-5, 1e-8)


def fixed_point(family: str) -> dict[str, Any]:
    """F*, the Gibbs minimiser's moments and the asymptotic rates of F − F* (continuous, and for the Lie step)."""
    if family == "value":
        k = M * (1 + A_FIXED * SIG2)
        k2 = float(np.mean(k * k))
        astar = float(np.mean(k * (TGT - M))) / (LAM2 + k2)
        v = LAM / LAM2
        F = float(np.mean(0.5 * (M + k * astar - TGT) ** 2)) + 0.5 * LAM2 * (astar**2 + v) \
            - 0.5 * LAM * math.log(2 * math.pi * math.e * v)
        return {"F": F, "mean": [astar], "rate": min(2 * (LAM2 + k2), 4 * LAM2), "theorem": 2 * LAM2, "k2": k2}
    z, c = shallow_scalar_rate(LAM, LAM2, M, SIG2, TGT)
    ma, mv, saa, sav, svv = z
    r = M + M * (mv + SIG2 * (sav + ma * mv)) - TGT
    det = saa * svv - sav**2
    F = float(np.mean(0.5 * r * r)) + 0.5 * LAM2 * (ma**2 + mv**2 + saa + svv) \
        - 0.5 * LAM * math.log((2 * math.pi * math.e) ** 2 * det)
    # Φ's Hessian at ρ* is [[λ₂, β], [β, λ₂]]: p_ρ* Gaussian, LSI α = (λ₂ − |β|)/λ (theory §5.4) at ρ* only
    beta = float(np.mean(r * M * SIG2))
    return {"F": F, "mean": [float(ma), float(mv)], "rate": c, "theorem": 2 * (LAM2 - abs(beta))}


def _phi(family: str, mu: np.ndarray, Mm: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(H, g, R) of Φ = ½θᵀHθ + gᵀθ for a ρ with mean μ and second moments M (ā = μ_v, b̄ = M_av); R the risk."""
    if family == "value":
        k = M * (1 + A_FIXED * SIG2)
        r = M + k * mu[0] - TGT
        return np.array([[LAM2]]), np.array([float(np.mean(r * k))]), float(np.mean(0.5 * r * r))
    r = M + M * (mu[1] + SIG2 * Mm[0, 1]) - TGT
    be = float(np.mean(r * M * SIG2))
    return np.array([[LAM2, be], [be, LAM2]]), np.array([0.0, float(np.mean(r * M))]), float(np.mean(0.5 * r * r))


def lie_law(family: str, ds: float, steps: int) -> tuple[np.ndarray, float]:
    """The exact Lie law of the moments in continuous Θ: F − F* per step, and its asymptotic rate −2 log r/Δs.

    The Lie step is backward Euler with Φ_n = ½θᵀH_nθ + g_nᵀθ frozen; testing with θ and θθᵀ closes the moments:
    (I + ΔsH_n)μ' = μ − Δs g_n and A M' + M' A = M + Δs(2λI − g_nμ'ᵀ − μ'g_nᵀ), A = I/2 + ΔsH_n. The gap is
    that of the Gaussian with these moments (exact up to λ KL(ρ_n ‖ Gaussian) ≥ 0, the non-Gaussian part of
    backward Euler, as :func:`mfpde.exact.shallow_gap`). r: the spectral radius of the map's Jacobian (central
    differences, step 1e-7) at its fixed point; F − F* is quadratic in the distance, hence the 2. Δs → 0 gives
    :func:`mfpde.exact.shallow_scalar_rate`'s c (scalar) and min(2(λ₂ + ⟨k²⟩), 4λ₂) (value).
    """
    from scipy.linalg import solve_sylvester

    p = len(RHO0[family])
    iu = np.triu_indices(p)

    def unpack(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        Mm = np.zeros((p, p))
        Mm[iu] = z[p:]
        return z[:p], Mm + np.triu(Mm, 1).T

    def step(z: np.ndarray) -> np.ndarray:
        mu, Mm = unpack(z)
        Hs, g, _ = _phi(family, mu, Mm)
        mu1 = np.linalg.solve(np.eye(p) + ds * Hs, mu - ds * g)
        A = 0.5 * np.eye(p) + ds * Hs
        M1 = solve_sylvester(A, A, Mm + ds * (2 * LAM * np.eye(p) - np.outer(g, mu1) - np.outer(mu1, g)))
        return np.concatenate([mu1, M1[iu]])

    def gap(z: np.ndarray) -> float:
        mu, Mm = unpack(z)
        S = Mm - np.outer(mu, mu)
        ent = -0.5 * math.log((2 * math.pi * math.e) ** p * np.linalg.det(S))
        return _phi(family, mu, Mm)[2] + 0.5 * LAM2 * float(np.trace(Mm)) + LAM * ent - float(fixed_point(family)["F"])

    mu0 = np.asarray(RHO0[family], float)
    z = np.concatenate([mu0, (VAR0 * np.eye(p) + np.outer(mu0, mu0))[iu]])
    gaps = [gap(z)]
    for _ in range(steps):
        z = step(z)
        gaps.append(gap(z))
    for _ in range(int(60 / ds)):
        z = step(z)
    e = 1e-7
    J = np.array([(step(z + e * u) - step(z - e * u)) / (2 * e) for u in np.eye(len(z))]).T
    return np.array(gaps), -2 * math.log(float(np.max(np.abs(np.linalg.eigvals(J))))) / ds


def pde(family: str, cells: int, ds: float, steps: int) -> dict[str, list[float]]:
    """One Lie training run; per step s, F − F*, λ KL(ρ_s‖p_ρs) and the cumulative wall time (all of it)."""
    cfg = gaussian_config(family, 2, Y, "shallow", "entropic", LAM, LAM2, ds, steps, "lie", token_cells=120,
                          token_degree=1, theta_cells=cells, theta_box=3.0, mean=RHO0[family], var=VAR0,
                          token_box=TOKEN_BOX)
    fstar = float(fixed_point(family)["F"])
    t0 = time.perf_counter()
    cp = CoupledProblem(cfg, MPI.COMM_SELF)
    splitting = cp.splitting()
    out: dict[str, list[float]] = {"s": [], "gap": [], "cert": [], "wall": []}
    for step in range(steps + 1):
        heads = cp.heads()
        grad = cp.gradient(heads)
        cp.state.set_potentials(heads, grad.D)
        row = history_row(cp, grad, step, step * ds, 0.0)
        for key, val in (("s", step * ds), ("gap", row["free_energy"] - fstar), ("cert", LAM * row["kl_gibbs"]),
                         ("wall", time.perf_counter() - t0)):
            out[key].append(float(val))
        if step < steps:
            splitting.step(ds)
    return out


def _drift(family: str, th: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Hessian, g) of Φ = δR/δρ(ρ_H) + λ₂|θ|²/2 = ½θᵀHθ + gᵀθ + const for the empirical measure of the heads."""
    if family == "value":
        k = M * (1 + A_FIXED * SIG2)
        return np.array([[LAM2]]), np.array([float(np.mean(k * (M + k * th[:, 0].mean() - TGT)))])
    abar, bbar = th[:, 1].mean(), (th[:, 0] * th[:, 1]).mean()
    r = M + M * (abar + SIG2 * bbar) - TGT
    al, be = float(np.mean(r * M)), float(np.mean(r * M * SIG2))
    return np.array([[LAM2, be], [be, LAM2]]), np.array([0.0, al])


def _risk_conf(family: str, th: np.ndarray) -> float:
    """R(ρ_H) + (λ₂/2)⟨|θ|²⟩ of the empirical measure."""
    if family == "value":
        yhat = M + M * (1 + A_FIXED * SIG2) * th[:, 0].mean()
    else:
        yhat = M + M * (th[:, 1].mean() + SIG2 * (th[:, 0] * th[:, 1]).mean())
    return float(np.mean(0.5 * (yhat - TGT) ** 2)) + 0.5 * LAM2 * float(np.mean(np.sum(th * th, axis=1)))


def negentropy_knn(th: np.ndarray) -> float:
    """∫ρ log ρ by Kozachenko–Leonenko, k = 1: −[ψ(H) − ψ(1) + log V_p + (p/H) Σ log ε_i], ε_i the 1-NN distance."""
    H, p = th.shape
    eps = cKDTree(th).query(th, k=2)[0][:, 1]
    vol = 2.0 if p == 1 else math.pi
    return -float(digamma(H) - digamma(1) + math.log(vol) + p * np.mean(np.log(eps)))


def negentropy_kde(th: np.ndarray) -> float:
    """∫ρ log ρ ≈ (1/H) Σ log ρ̂(θ_i), ρ̂ = scipy.stats.gaussian_kde (Scott's bandwidth), resubstitution."""
    return float(np.mean(np.log(gaussian_kde(th.T)(th.T))))


def particles(family: str, H: int, seed: int, ds: float, steps: int, rows: list[int], kde: bool,
              scheme: str = "ou") -> dict[str, list[float]]:
    """MFLD of H heads; at ``rows``: F_H − F* (k-NN and KDE entropy) and the cumulative dynamics wall time."""
    rng = np.random.default_rng((27, H, seed, len(RHO0[family])))
    p = len(RHO0[family])
    th = np.asarray(RHO0[family]) + math.sqrt(VAR0) * rng.standard_normal((H, p))
    fstar = float(fixed_point(family)["F"])
    out: dict[str, list[float]] = {"s": [], "knn": [], "kde": [], "wall": [], "knn_s": [], "kde_s": []}
    wall = 0.0
    for step in range(steps + 1):
        if step in rows:
            t = time.perf_counter()
            rc = _risk_conf(family, th)
            out["knn"].append(rc + LAM * negentropy_knn(th) - fstar)
            t1 = time.perf_counter()
            out["kde"].append(rc + LAM * negentropy_kde(th) - fstar if kde else math.nan)
            out["knn_s"].append(t1 - t)
            out["kde_s"].append(time.perf_counter() - t1 if kde else math.nan)
            out["s"].append(step * ds)
            out["wall"].append(wall)
        if step == steps:
            break
        t = time.perf_counter()
        Hs, g = _drift(family, th)
        if scheme == "em":
            th = th - ds * (th @ Hs + g) + math.sqrt(2 * LAM * ds) * rng.standard_normal((H, p))
        else:  # exact OU step of dθ = −(Hθ + g)ds + √(2λ)dB, H frozen: mean θ* + e^{−HΔs}(θ − θ*)
            w, Q = np.linalg.eigh(Hs)
            E = Q @ np.diag(np.exp(-w * ds)) @ Q.T
            C = Q @ np.diag(np.sqrt(LAM / w * (1 - np.exp(-2 * w * ds)))) @ Q.T
            tstar = -np.linalg.solve(Hs, g)
            th = tstar + (th - tstar) @ E + rng.standard_normal((H, p)) @ C
        wall += time.perf_counter() - t
    return out


def reach_time(gap: list[float], wall: list[float], tol: float) -> float:
    """Wall time of the first row from which |gap| ≤ tol for the rest of the run (NaN: not reached)."""
    g = np.abs(np.asarray(gap))
    bad = np.nonzero(~(g <= tol))[0]
    first = 0 if len(bad) == 0 else int(bad[-1]) + 1
    return float(wall[first]) if first < len(g) else math.nan


def run(quick: bool) -> dict:
    """All PDE and particle runs of the benchmark (one core); returns the JSON-able results."""
    ds = 0.1
    S = {"value": 8.0 if quick else 16.0, "scalar": 6.0 if quick else 14.0}
    meshes = {"value": (30, 60, 120), "scalar": (12, 16) if quick else (20, 28, 40)}
    Hs, seeds = ((1024, 4096), 3) if quick else ((1024, 4096, 16384), 8)
    res: dict = {"load_before": os.getloadavg(), "ds": ds, "families": {}}
    for fam in ("value", "scalar"):
        steps = int(round(S[fam] / ds))
        fp = fixed_point(fam)
        runs = {f"{c} cells, Δs = {ds}": pde(fam, c, ds, steps) for c in meshes[fam]}
        half = meshes[fam][-2 if fam == "scalar" else -1]
        runs[f"{half} cells, Δs = {ds / 2}"] = pde(fam, half, ds / 2, 2 * steps)
        lie = {}
        for h in (ds, ds / 2):
            g_lie, c_lie = lie_law(fam, h, round(S[fam] / h))
            lie[str(h)] = {"gap": g_lie.tolist(), "rate": c_lie}
        rows = sorted({0, *np.unique(np.geomspace(1, steps, 14 if quick else 22).astype(int)).tolist()})
        parts = {}
        for H in Hs:  # the KDE is O(H²): at the largest H on two seeds only
            parts[H] = [particles(fam, H, sd, ds, steps, rows, kde=(H < 16384 or sd < 2)) for sd in range(seeds)]
        em = particles(fam, Hs[-1], 0, ds, steps, rows, kde=False, scheme="em")
        res["families"][fam] = {"fixed_point": fp, "pde": runs, "particles": {str(h): v for h, v in parts.items()},
                                "em": em, "rows": rows, "lie": lie, "cells": list(meshes[fam])}
    res["load_after"] = os.getloadavg()
    return res


def summarise(res: dict) -> list[str]:
    """Markdown: PDE refinement and rates, particle floors, times to 1e-3/1e-5/1e-8."""
    out = []
    for fam, d in res["families"].items():
        fp = d["fixed_point"]
        out.append(f"\n### {fam} heads (F* = {fp['F']:.12f}; continuous asymptotic rate {fp['rate']:.4f}"
                   + f", theorem's rate 2αλ = {fp['theorem']:.4f})\n")
        out.append("| run | gap at s = 0 | final gap | final λ KL | decades | fitted rate, 1e-2..1e-8 of gap₀ "
                   "(exact Lie law: same rows; asymptotic) | "
                   "wall [s] | time to 1e-3 / 1e-5 / 1e-8 [s] | λ KL ≥ gap at every step |\n"
                   "|---|---|---|---|---|---|---|---|---|")
        rates = {}
        for name, r in d["pde"].items():
            g, s = np.asarray(r["gap"]), np.asarray(r["s"])
            w = (g < 1e-2 * g[0]) & (g > 1e-8 * g[0])
            lie = d["lie"][str(float(s[1]))]
            ok = w.sum() >= 3 and np.all(g[w] > 0)
            c = fit_rate(s[w], g[w]) if ok else math.nan
            c_ref = fit_rate(s[w], np.asarray(lie["gap"])[w]) if ok else math.nan
            rates[name] = (c, c_ref)
            ts = " / ".join(f"{reach_time(r['gap'], r['wall'], t):.2f}" for t in TOLS)
            out.append(f"| PDE {name} | {g[0]:.3e} | {g[-1]:.1e} | {r['cert'][-1]:.1e} | "
                       f"{math.log10(g[0] / max(abs(g[-1]), 1e-17)):.1f} | {c:.4f} ({c_ref:.4f}; "
                       f"{lie['rate']:.4f}) | {r['wall'][-1]:.2f} | {ts} | "
                       f"{bool(np.all(np.asarray(r['cert']) >= g - 1e-12))} |")
        hs = [6.0 / n for n in d["cells"]]
        errs = [abs(c - cr) for c, cr in list(rates.values())[: len(hs)]]
        if all(e > 0 for e in errs):
            out.append(f"\nRate error against the exact Lie law on the same rows, Θ cells {d['cells']}: "
                       + ", ".join(f"{e:.1e}" for e in errs) + f"; fitted order in h {fit_order(hs, errs):.2f}")
        out.append("\n| MFLD | seeds | floor, k-NN (mean ± SE) | floor, KDE (mean ± SE) | one run's error, k-NN "
                   "(RMS) | time to 1e-3 / 1e-5 / 1e-8 [s] (seed mean, k-NN) | dynamics [s] | one k-NN / KDE "
                   "estimate [s] |\n|---|---|---|---|---|---|---|---|")
        stats = []
        for H, runs in d["particles"].items():
            last = max(1, len(runs[0]["s"]) // 4)  # the last quarter of the rows: s ≥ 0.35 S, several relaxations
            knn = np.array([r["knn"] for r in runs])[:, -last:]
            kde = np.array([r["kde"] for r in runs if np.isfinite(r["kde"][0])])[:, -last:]
            kf, kd = knn.mean(axis=1), kde.mean(axis=1)
            se_k, se_d = kf.std(ddof=1) / math.sqrt(len(kf)), kd.std(ddof=1) / math.sqrt(len(kd))
            rms = float(np.sqrt(np.mean(knn**2)))
            stats.append((int(H), rms, float(kd.mean()), float(se_d), float(kf.mean()), float(se_k)))
            mean_knn = np.mean([r["knn"] for r in runs], axis=0).tolist()
            ts = " / ".join(f"{reach_time(mean_knn, runs[0]['wall'], t):.3f}" for t in TOLS)
            t_kde = float(np.mean([np.mean(r["kde_s"]) for r in runs if np.isfinite(r["kde"][0])]))
            out.append(f"| H = {H} | {len(runs)} ({len(kd)} KDE) | {kf.mean():+.1e} ± {se_k:.1e} | "
                       f"{kd.mean():+.1e} ± {se_d:.1e} | {rms:.1e} | {ts} | {runs[0]['wall'][-1]:.3f} | "
                       f"{np.mean(runs[0]['knn_s']):.3f} / {t_kde:.2f} |")
        em = d["em"]
        em_floor = float(np.mean(em["knn"][-max(1, len(em["knn"]) // 4):]))
        out.append(f"| H = {stats[-1][0]}, Euler–Maruyama | 1 | {em_floor:+.1e} | – | – | – | "
                   f"{em['wall'][-1]:.3f} | – |")
        Hs = [x[0] for x in stats]
        if len(Hs) >= 2:
            q = fit_order(Hs, [x[1] for x in stats])
            line = f"\nOne run's k-NN error against H: slope {q:.2f} (−1/2: the estimator's spread)"
            if all(x[2] > 0 for x in stats):
                qd = fit_order(Hs, [x[2] for x in stats])
                line += (f"; KDE bias against H: slope {qd:.2f} ± "
                         f"{slope_se(Hs, [x[2] for x in stats], [x[3] for x in stats]):.2f}")
            out.append(line)
    return out


def plot(res: dict, path: Path) -> None:
    """Gap against s (PDE and each H), certificate beside it, and the time to accuracy, one row per family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = list(res["families"])
    fig, ax = plt.subplots(len(fams), 3, figsize=(15, 4.2 * len(fams)), squeeze=False)
    for i, fam in enumerate(fams):
        d = res["families"][fam]
        for name, r in d["pde"].items():
            ax[i, 0].semilogy(r["s"], np.maximum(np.abs(r["gap"]), 1e-17), label=f"PDE {name}")
            ax[i, 1].semilogy(r["s"], np.maximum(np.abs(r["cert"]), 1e-17), label=f"λ KL, {name}")
        fine = list(d["pde"].values())[len(d["pde"]) - 2]
        ax[i, 1].semilogy(fine["s"], np.maximum(np.abs(fine["gap"]), 1e-17), "k:", label="F − F* (finest, Δs = 0.1)")
        for H, runs in d["particles"].items():
            knn = np.abs(np.mean([r["knn"] for r in runs], axis=0))
            ax[i, 0].semilogy(runs[0]["s"], knn, "o-", ms=3, label=f"MFLD H = {H}, k-NN")
            kde = [r["kde"] for r in runs if np.isfinite(r["kde"][0])]
            if kde:
                ax[i, 0].semilogy(runs[0]["s"], np.abs(np.mean(kde, axis=0)), "x--", ms=3, label=f"H = {H}, KDE")
        for name, r in list(d["pde"].items())[-2:]:
            ts = [reach_time(r["gap"], r["wall"], t) for t in TOLS]
            ax[i, 2].loglog(TOLS, ts, "s-", label=f"PDE {name}")
        for H, runs in d["particles"].items():
            mean_knn = np.mean([r["knn"] for r in runs], axis=0).tolist()
            ax[i, 2].loglog(TOLS, [reach_time(mean_knn, runs[0]["wall"], t) for t in TOLS], "o-", label=f"H = {H}")
        ax[i, 0].set(xlabel="training time s", ylabel="|F(ρ_s) − F*|", title=f"{fam} heads: free-energy gap")
        ax[i, 1].set(xlabel="training time s", ylabel="λ KL(ρ_s ‖ p_ρs)", title="certificate (PDE)")
        ax[i, 2].set(xlabel="gap reached", ylabel="wall time [s]", title="time to accuracy (missing: not reached)")
        ax[i, 2].invert_xaxis()
        for a in ax[i]:
            a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small meshes and H (about a minute)")
    ap.add_argument("--out", default="out/bench", help="directory of free_energy.json and free_energy.png")
    args = ap.parse_args()
    t0, c0 = time.perf_counter(), time.process_time()
    with threadpool_limits(limits=1):
        res = run(args.quick)
    res["wall_s"], res["cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(res, indent=1, default=lambda o: o.tolist() if hasattr(o, "tolist") else float(o))
    (out / "free_energy.json").write_text(text)
    plot(res, out / "free_energy.png")
    lines = summarise(res)
    print(f"load average before {res['load_before'][0]:.2f}, after {res['load_after'][0]:.2f} (2 cores); "
          f"wall {res['wall_s']:.0f} s, CPU {res['cpu_s']:.0f} s")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
