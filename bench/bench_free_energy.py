"""The free-energy curve of entropic training: the PDE's exact F(ρ_s) − F* against mean-field Langevin particles.

The problem and its closed forms are in :mod:`fe_models` (single residual layer, two Gaussian samples in d = 1,
value heads p = 1 and scalar heads p = 2, λ = 0.1, λ₂ = 1); the timed runs in :mod:`fe_runs`. Side by side, at
the same Δs = 0.1, in one process, CPU time (``time.process_time``), one BLAS thread:

* the PDE with the token solve (mfpde's coupled solver), and the PDE with the closed-form δR/δρ (the same
  Fokker–Planck step and report, no token solve): solver against solver on the same drift as the particles;
  best of 3 repeats, set-up included; Θ-mesh refinement and Δs/2; one extra row at a larger Δs;
* MFLD particles, H = 1024 … 16 384, 8 seeds, closed-form drift, the entropy by 1-NN at every step (its cost
  counted: a user sees F only through it) and by a KDE at log-spaced rows; value heads also with the token solve
  (the heads as a weighted point set), scalar heads' token drift timed per step (3H distinct a).

Writes ``out/bench/free_energy.json`` and ``out/bench/free_energy.png`` and prints markdown tables.
Run: ``nice -n 10 python bench/bench_free_energy.py [--quick]``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mpi4py import MPI  # noqa: F401  (initialised before dolfinx)

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fe_models import A_FIXED, SIG2, TGT, M, fixed_point, lie_law, negentropy_knn  # noqa: E402
from fe_report import bench_main, summarise  # noqa: E402
from fe_runs import TokenDrift, particles, pde, reach_time, token_drift_probe  # noqa: E402

__all__ = ["A_FIXED", "M", "SIG2", "TGT", "fixed_point", "negentropy_knn", "particles", "pde", "reach_time"]

TOLS = (1e-3, 1e-5, 1e-8)
REPEATS = 3


def best_pde(fam: str, cells: int, ds: float, steps: int, kind: str, repeats: int) -> dict:
    """:func:`fe_runs.pde` ``repeats`` times: the first run's gaps, each step's smallest cumulative CPU time."""
    runs = [pde(fam, cells, ds, steps, kind) for _ in range(repeats)]
    out = dict(runs[0])
    out["cpu"] = np.min([r["cpu"] for r in runs], axis=0).tolist()
    out["setup"] = min(r["setup"] for r in runs)
    out["repeats"] = repeats
    return out


def run(quick: bool) -> dict:
    """All PDE and particle runs of the benchmark (one core); returns the JSON-able results."""
    ds = 0.1
    S = {"value": 8.0 if quick else 16.0, "scalar": 6.0 if quick else 14.0}
    meshes = {"value": (30, 60, 120), "scalar": (12, 16) if quick else (20, 28, 40)}
    Hs, seeds = ((1024, 4096), 3) if quick else ((1024, 4096, 16384), 8)
    res: dict = {"load_before": os.getloadavg(), "ds": ds, "families": {}}
    for fam in ("value", "scalar"):
        steps = int(round(S[fam] / ds))
        pde(fam, meshes[fam][0], ds, 2, "token")  # the JIT cache warm: set-up times exclude compilation
        fine = meshes[fam][-1]
        runs = {}
        for kind in ("closed", "token"):
            runs[f"{kind}, {fine} cells, Δs = {ds}"] = best_pde(fam, fine, ds, steps, kind, REPEATS)
        for c in meshes[fam][:-1]:
            runs[f"token, {c} cells, Δs = {ds}"] = pde(fam, c, ds, steps, "token")
        half = meshes[fam][-2]
        runs[f"token, {half} cells, Δs = {ds / 2}"] = pde(fam, half, ds / 2, 2 * steps, "token")
        big = 0.5
        for kind in ("closed", "token"):
            runs[f"{kind}, {fine} cells, Δs = {big}"] = best_pde(fam, fine, big, round(S[fam] / big), kind, REPEATS)
        lie = {}
        for h in (ds, ds / 2, big):
            g_lie, c_lie = lie_law(fam, h, round(S[fam] / h))
            lie[str(h)] = {"gap": g_lie.tolist(), "rate": c_lie}
        kde_rows = sorted({0, *np.unique(np.geomspace(1, steps, 14 if quick else 22).astype(int)).tolist()})
        parts: dict = {}
        for H in Hs:  # the KDE is O(H²): at the largest H on two seeds only
            parts[str(H)] = [particles(fam, H, sd, ds, steps, kde_rows if (H < 16384 or sd < 2) else [])
                             for sd in range(seeds)]
        big_parts = [particles(fam, Hs[-1], sd, big, round(S[fam] / big), []) for sd in range(3)]
        em = particles(fam, Hs[-1], 0, ds, steps, [], scheme="em")
        token: dict = {}
        if fam == "value":  # one a: one token solve per step, as the PDE's
            tok = TokenDrift(fam)
            for H in Hs:
                token[str(H)] = [particles(fam, H, sd, ds, steps, [], token=tok) for sd in range(min(seeds, 3))]
        probes = {str(H): token_drift_probe(fam, H, 1 if H > 4096 else 2) for H in Hs}
        res["families"][fam] = {"fixed_point": fp_json(fixed_point(fam)), "pde": runs, "particles": parts,
                                "particles_big_ds": big_parts, "big_ds": big, "em": em, "token": token,
                                "probes": probes, "kde_rows": kde_rows, "lie": lie, "cells": list(meshes[fam])}
    res["load_after"] = os.getloadavg()
    return res


def fp_json(fp: dict) -> dict:
    """The fixed point's numbers as floats."""
    return {k: (float(v) if not isinstance(v, list) else [float(x) for x in v]) for k, v in fp.items()}


def plot(res: dict, path: Path) -> None:
    """Gap against s (PDE and each H), certificate beside it, and the CPU time to accuracy, one row per family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from fe_report import particle_times

    fams = list(res["families"])
    fig, ax = plt.subplots(len(fams), 3, figsize=(15, 4.2 * len(fams)), squeeze=False)
    for i, fam in enumerate(fams):
        d = res["families"][fam]
        for name, r in d["pde"].items():
            if "Δs = 0.5" in name:
                continue
            ax[i, 0].semilogy(r["s"], np.maximum(np.abs(r["gap"]), 1e-17), label=f"PDE {name}")
            ax[i, 1].semilogy(r["s"], np.maximum(np.abs(r["cert"]), 1e-17), label=f"λ KL, {name}")
        for H, runs in d["particles"].items():
            knn = np.abs(np.mean([r["knn"] for r in runs], axis=0))
            ax[i, 0].semilogy(runs[0]["s"], knn, "-", lw=0.8, label=f"MFLD H = {H}, k-NN (seed mean)")
            kde = [r["kde"] for r in runs if np.isfinite(r["kde"][0])]
            if kde:
                rows = d["kde_rows"]
                ax[i, 0].semilogy(np.asarray(runs[0]["s"])[rows], np.abs(np.mean(kde, axis=0))[rows], "x--", ms=3,
                                  label=f"H = {H}, KDE")
        for name in [n for n in d["pde"] if "Δs = 0.1" in n][:2]:
            r = d["pde"][name]
            ax[i, 2].loglog(TOLS, [reach_time(r["gap"], r["cpu"], t) for t in TOLS], "s-", label=f"PDE {name}")
        for H, runs in d["particles"].items():
            pt = particle_times(runs)
            ax[i, 2].loglog([*TOLS, pt["floor"]], [*pt["every"], pt["floor_every"]], "o-",
                            label=f"MFLD H = {H}, k-NN every step (ε_H = {pt['floor']:.1e})")
        ax[i, 0].set(xlabel="training time s", ylabel="|F(ρ_s) − F*|", title=f"{fam} heads: free-energy gap")
        ax[i, 1].set(xlabel="training time s", ylabel="λ KL(ρ_s ‖ p_ρs)", title="certificate (PDE)")
        ax[i, 2].set(xlabel="gap reached", ylabel="CPU time [s]",
                     title="time to accuracy (particles: to their floor ε_H only)")
        ax[i, 2].invert_xaxis()
        for a in ax[i]:
            a.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    bench_main(__doc__.splitlines()[0], run, plot, lambda r: summarise(r, TOLS), "free_energy",
               "small meshes and H (about a minute)")


if __name__ == "__main__":
    main()
