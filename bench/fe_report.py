"""The tables of the free-energy benchmark (markdown) from the results of ``bench_free_energy.run``.

Times are CPU seconds. For the PDE, a time "to 1e-5" is that of the first step from which the gap stays below
1e-5. A particle run's *floor* ε_H is one run's RMS k-NN error over the last quarter of the steps: one run's
F_H is known to ±ε_H, so a tolerance below ε_H is never reached; a tolerance ≥ ε_H (and "to its floor") is
reached at the first step where the seed mean of the k-NN gap falls below it (beyond it the curve is noise),
at the fastest seed's cumulative time.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from fe_runs import reach_time
from threadpoolctl import threadpool_limits

from mfpde.fitting import fit_order, fit_rate, slope_se


def particle_times(runs: list[dict], tols: tuple[float, ...] = (1e-3, 1e-5, 1e-8), rows: list[int] | None = None,
                   extra: float = 0.0) -> dict:
    """Times to ``tols`` and to the floor: k-NN at every step (``every``), at ``rows`` only (``rows``), dynamics only.

    ``extra``: a CPU cost added to every step's dynamics (the token-solve drift timed apart).
    """
    gap = np.mean([r["knn"] for r in runs], axis=0)
    n = len(gap)
    last = max(1, n // 4)
    floor = float(np.sqrt(np.mean(np.array([r["knn"] for r in runs])[:, -last:] ** 2)))
    dyn = np.array([np.asarray(r["dyn"]) + extra for r in runs])
    knn = np.array([r["knn_s"] for r in runs])
    every, dyn_only = np.cumsum(dyn + knn, axis=1), np.cumsum(dyn, axis=1)
    rows = rows if rows is not None else list(range(n))
    mask = np.zeros(n)
    mask[rows] = 1.0
    at_rows = dyn_only + np.cumsum(knn * mask, axis=1)

    def t(cum: np.ndarray, tol: float, on: list[int]) -> float:
        if tol < floor:  # one run's F_H is known to ±ε_H only: a smaller gap cannot be seen
            return math.nan
        hit = np.nonzero(np.abs(gap[on]) <= tol)[0]  # first crossing: beyond it the curve is noise
        return float(np.min(cum[:, on[hit[0]]])) if len(hit) else math.nan

    out = {"floor": floor}
    for key, cum, on in (("every", every, list(range(n))), ("rows", at_rows, rows), ("dyn", dyn_only, list(range(n)))):
        out[key] = [t(cum, tol, on) for tol in tols]
        out[f"floor_{key}"] = t(cum, floor, on)
    out["per_step_ms"] = 1e3 * float(np.min(np.mean(dyn + knn, axis=1)))
    return out


def _ms(x: float) -> str:
    return "–" if not math.isfinite(x) else f"{x:.3f}"


def time_table(d: dict, tols: tuple[float, ...], ds: str) -> list[str]:
    """Time to accuracy, PDE and particles at one Δs (``ds``: the key suffix of the PDE runs)."""
    out = [f"\n**Time to accuracy, Δs = {ds}** (CPU s; PDE best of its repeats, set-up included)\n",
           "| method | set-up | to 1e-3 | to 1e-5 | to 1e-8 | floor ε_H | to its floor | per step [ms] |",
           "|---|---|---|---|---|---|---|---|"]
    for name, r in d["pde"].items():
        if not (name.endswith(f"Δs = {ds}") and name.startswith(("closed", "token")) and "repeats" in r):
            continue
        ts = [reach_time(r["gap"], r["cpu"], t) for t in tols]
        per = 1e3 * (r["cpu"][-1] - r["setup"]) / (len(r["cpu"]) - 1)
        label = "PDE, closed-form δR/δρ" if name.startswith("closed") else "PDE, token solve"
        out.append(f"| {label} ({name.split(', ', 1)[1]}) | {r['setup']:.3f} | " + " | ".join(_ms(x) for x in ts)
                   + f" | – | – | {per:.2f} |")
    parts = d["particles"] if ds == "0.1" else {str(len(d["particles_big_ds"][0]["dyn"])): d["particles_big_ds"]}
    for H, runs in parts.items():
        if ds != "0.1":
            H = list(d["particles"])[-1]
        pt = particle_times(runs, tols, d["kde_rows"] if ds == "0.1" else None)
        variants = [("k-NN every step", "every"), ("dynamics only", "dyn")]
        if ds == "0.1":
            variants.insert(1, (f"k-NN at {len(d['kde_rows'])} rows", "rows"))
        for label, key in variants:
            out.append(f"| MFLD H = {H}, closed-form drift, {label} | – | " + " | ".join(_ms(x) for x in pt[key])
                       + f" | {pt['floor']:.1e} | {_ms(pt['floor_' + key])} | "
                       + (f"{pt['per_step_ms']:.2f} |" if key == "every" else "|"))
    if ds != "0.1":
        return out
    for H, runs in d["token"].items():
        pt = particle_times(runs, tols)
        out.append(f"| MFLD H = {H}, token solve, k-NN every step | – | " + " | ".join(_ms(x) for x in pt["every"])
                   + f" | {pt['floor']:.1e} | {_ms(pt['floor_every'])} | {pt['per_step_ms']:.2f} |")
    if not d["token"]:
        for H, pr in d["probes"].items():
            pt = particle_times(d["particles"][H], tols, extra=pr["cpu"])
            out.append(f"| MFLD H = {H}, token solve (3H a; drift timed per step), k-NN every step | – | "
                       + " | ".join(_ms(x) for x in pt["every"])
                       + f" | {pt['floor']:.1e} | {_ms(pt['floor_every'])} | {pt['per_step_ms']:.1f} |")
    out.append("\nToken-solve drift against the closed form (max |Δ∇Φ| / max |∇Φ|): "
               + ", ".join(f"H = {H}: {pr['dev']:.1e} ({1e3 * pr['cpu']:.1f} ms)" for H, pr in d["probes"].items()))
    return out


def summarise(res: dict, tols: tuple[float, ...]) -> list[str]:
    """Markdown: times to accuracy, PDE refinement and rates, particle floors."""
    out = []
    for fam, d in res["families"].items():
        fp = d["fixed_point"]
        out.append(f"\n### {fam} heads (F* = {fp['F']:.12f}; continuous asymptotic rate {fp['rate']:.4f}"
                   + f", theorem's rate 2αλ = {fp['theorem']:.4f})")
        out += time_table(d, tols, "0.1")
        out += time_table(d, tols, str(d["big_ds"]))
        closed = [r for n, r in d["pde"].items() if n.startswith("closed") and n.endswith("Δs = 0.1")][0]
        token = [r for n, r in d["pde"].items() if n.startswith("token") and n.endswith("Δs = 0.1")][0]
        out.append(f"\nSame drift, same gaps: max |gap_closed − gap_token| = "
                   f"{np.max(np.abs(np.subtract(closed['gap'], token['gap']))):.1e}")
        out.append("\n| PDE run | gap at s = 0 | final gap | final λ KL | decades | fitted rate, 1e-2..1e-8 of gap₀ "
                   "(exact Lie law: same rows; asymptotic) | λ KL ≥ gap at every step |\n|---|---|---|---|---|---|---|")
        rates = {}
        for name, r in d["pde"].items():
            g, s = np.asarray(r["gap"]), np.asarray(r["s"])
            w = (g < 1e-2 * g[0]) & (g > 1e-8 * g[0])
            lie = d["lie"][str(float(s[1]))]
            ok = w.sum() >= 3 and np.all(g[w] > 0)
            c = fit_rate(s[w], g[w]) if ok else math.nan
            c_ref = fit_rate(s[w], np.asarray(lie["gap"])[w]) if ok else math.nan
            rates[name] = (c, c_ref)
            out.append(f"| {name} | {g[0]:.3e} | {g[-1]:.1e} | {r['cert'][-1]:.1e} | "
                       f"{math.log10(g[0] / max(abs(g[-1]), 1e-17)):.1f} | {c:.4f} ({c_ref:.4f}; "
                       f"{lie['rate']:.4f}) | {bool(np.all(np.asarray(r['cert']) >= g - 1e-12))} |")
        cells = d["cells"]
        names = [f"token, {c} cells, Δs = 0.1" for c in cells]
        hs = [6.0 / n for n in cells]
        errs = [abs(rates[n][0] - rates[n][1]) for n in names]
        if all(e > 0 for e in errs):
            out.append(f"\nRate error against the exact Lie law on the same rows, Θ cells {cells}: "
                       + ", ".join(f"{e:.1e}" for e in errs) + f"; fitted order in h {fit_order(hs, errs):.2f}")
        out += floors_table(d)
    return out


def floors_table(d: dict) -> list[str]:
    """The particles' floors with each estimator, and their slopes in H."""
    out = ["\n| MFLD | seeds | floor, k-NN (mean ± SE) | floor, KDE (mean ± SE) | one run's error, k-NN (RMS) | "
           "one k-NN / KDE estimate [s] |\n|---|---|---|---|---|---|"]
    stats = []
    for H, runs in d["particles"].items():
        last = max(1, len(runs[0]["s"]) // 4)
        knn = np.array([r["knn"] for r in runs])[:, -last:]
        kf = knn.mean(axis=1)
        rows = [i for i in d["kde_rows"] if i >= len(runs[0]["s"]) - last]
        kde_runs = [r for r in runs if np.isfinite(r["kde"][0])]
        kd = np.array([np.mean(np.asarray(r["kde"])[rows]) for r in kde_runs])
        se_k, se_d = kf.std(ddof=1) / math.sqrt(len(kf)), kd.std(ddof=1) / math.sqrt(len(kd))
        rms = float(np.sqrt(np.mean(knn**2)))
        stats.append((int(H), rms, float(kd.mean()), float(se_d)))
        t_kde = float(np.mean([np.nanmean(r["kde_s"]) for r in kde_runs]))
        out.append(f"| H = {H} | {len(runs)} ({len(kd)} KDE) | {kf.mean():+.1e} ± {se_k:.1e} | "
                   f"{kd.mean():+.1e} ± {se_d:.1e} | {rms:.1e} | {np.mean(runs[0]['knn_s']):.4f} / {t_kde:.2f} |")
    em = d["em"]
    out.append(f"| H = {stats[-1][0]}, Euler–Maruyama | 1 | {np.mean(em['knn'][-max(1, len(em['knn']) // 4):]):+.1e}"
               " | – | – | – |")
    Hs = [x[0] for x in stats]
    if len(Hs) >= 2:
        line = f"\nOne run's k-NN error against H: slope {fit_order(Hs, [x[1] for x in stats]):.2f}"
        if all(x[2] > 0 for x in stats):
            line += (f"; KDE bias against H: slope {fit_order(Hs, [x[2] for x in stats]):.2f} ± "
                     f"{slope_se(Hs, [x[2] for x in stats], [x[3] for x in stats]):.2f}")
        out.append(line)
    return out


def bench_main(description: str, run: Callable[[bool], dict], plot: Callable[[dict, Path], None],
               summary: Callable[[dict], list[str]], stem: str, quick_help: str) -> None:
    """The command line of a free-energy bench: ``run(quick)`` timed, its results written, a summary printed.

    One BLAS thread; wall and CPU time; the results to ``--out``/STEM.json and STEM.png; then the load, the
    times and ``summary(results)`` printed.
    """
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--out", default="out/bench", help=f"directory of {stem}.json and {stem}.png")
    args = ap.parse_args()
    t0, c0 = time.perf_counter(), time.process_time()
    with threadpool_limits(limits=1):
        res = run(args.quick)
    res["wall_s"], res["cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(res, indent=1, default=lambda o: o.tolist() if hasattr(o, "tolist") else float(o))
    (out / f"{stem}.json").write_text(text)
    plot(res, out / f"{stem}.png")
    print(f"load average before {res['load_before'][0]:.2f}, after {res['load_after'][0]:.2f} (2 cores); "
          f"wall {res['wall_s']:.0f} s, CPU {res['cpu_s']:.0f} s")
    print("\n".join(summary(res)))
