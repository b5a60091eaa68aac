"""The atlas of clustering on the circle (theory §9): cluster counts against β, metastable lifetimes, BPA's Fig. 4.

(i) k_max(β) = argmax_k γ_k (closed form) and the number of clusters the PDE forms (USA, DG1 on 384 cells) from
    24 modes of amplitude 1e-4 with seeded random phases once the top mode has grown by 3·10⁴, for β = 1..64,
    against a fitted c √(β log β) (Geshkovski–Rigollet–Sun: modes of Gaussian kernel density estimates).
(ii) T_meta(β) (does not work yet: clusters narrower than a cell are pinned to it, docs/circle.md, so no merge
    is seen): DG1 on 48 cells (USA by default), the same start; the depth runs in
    geometric segments (×1.2) from t = 1 to 10⁴ (four decades: the budget of this script, not six), the first
    depth with k_max clusters and the first later depth with fewer; fitted log T_meta = log C + cβ
    (:func:`mfpde.fitting.fit_rate`). A β whose run reaches 10⁴ (or its wall budget) without a merge gives a
    lower bound only.
(iii) BPA's Fig. 4: β = 5 and 7 from uniform plus white noise (the notebook's σ = 0.01, amplitude 2π·0.01), the
    space–depth picture of μ_t with the cluster angles (2πj − arg μ̂_k(0))/k predicted from the initial
    Fourier coefficient of k = k_max (USA, DG2 on 512 cells).

Run: ``python bench/circle_atlas.py [--quick]``; writes ``out_circle_atlas/atlas.png``, ``fig4.png`` and
``atlas.json`` and prints the tables (with the `uptime` load).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import scipy.special

from mfpde.fitting import fit_rate
from mfpde.tokens.attention import HeadMeasure
from mfpde.tokens.circle import CircleMesh, CircleTransport
from mfpde.tokens.circle_diag import clusters, initial_density

OUT = Path("out_circle_atlas")
QUICK = "--quick" in sys.argv


def gamma(k: np.ndarray, beta: float) -> np.ndarray:
    return np.asarray(k**2 * scipy.special.iv(k, beta) / beta, dtype=float)


def kmax(beta: float) -> int:
    k = np.arange(1, 200)
    return int(k[np.argmax(gamma(k, beta))])


def modes(seed: int = 7) -> list[list[float]]:
    ph = np.random.default_rng(seed).uniform(0, 2 * np.pi, 24)
    return [[k + 1, 1e-4, float(p)] for k, p in enumerate(ph)]


def heads(beta: float) -> HeadMeasure:
    return HeadMeasure(np.array([beta]), np.array([1.0]))


def counts(betas: list[float]) -> list[dict[str, float]]:
    rows = []
    mesh = CircleMesh(384, 1)
    for b in betas:
        km = kmax(b)
        g = gamma(np.arange(1, 200), b)
        T = math.log(3e4) / g.max()
        t0 = time.perf_counter()
        mu0 = initial_density(mesh, "circle_modes", modes())
        rep = CircleTransport(mesh, "unnormalised").solve(mu0, heads(b), T, 5)
        n_cl = clusters(mesh, rep.mu_T)[0]
        second = np.sort(g)[-2] / g.max()
        rows.append({"beta": b, "k_max": km, "clusters": n_cl, "runner_up_ratio": float(second),
                     "wall_s": time.perf_counter() - t0})
        print(f"β = {b:5.1f}: k_max {km:2d}, clusters {n_cl:2d}, γ_2nd/γ_max {second:.3f}, "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
    return rows


def lifetime(beta: float, budget_s: float, attention: str = "unnormalised", n: int = 48) -> dict[str, float]:
    mesh = CircleMesh(n, 1)
    op = CircleTransport(mesh, attention)
    mu = initial_density(mesh, "circle_modes", modes())
    km, t, t_form, t_merge, t0 = kmax(beta), 0.0, math.nan, math.nan, time.perf_counter()
    nxt = 1.0
    while nxt <= 1e4 and time.perf_counter() - t0 < budget_s:
        mu = op.solve(mu, heads(beta), nxt - t, 1).mu_T
        t = nxt
        n_cl = clusters(mesh, mu)[0]
        if math.isnan(t_form) and n_cl == km:
            t_form = t
        elif not math.isnan(t_form) and n_cl < km:
            t_merge = t
            break
        nxt = t * 1.2
    return {"beta": beta, "k_max": km, "t_form": t_form, "t_merge": t_merge, "t_reached": t,
            "T_meta": t_merge - t_form, "wall_s": time.perf_counter() - t0}


def fig4(ax_list: list, betas: tuple[float, ...] = (5.0, 7.0)) -> None:
    import matplotlib.colors

    for ax, b in zip(ax_list, betas, strict=True):
        mesh = CircleMesh(256 if QUICK else 512, 2)
        mu = initial_density(mesh, "circle_noise", amplitude=2 * math.pi * 0.01, seed=0)
        km = kmax(b)
        mk = complex(np.exp(-1j * km * mesh.nodes.ravel()) @ mesh.weights(mu).ravel())
        pred = np.sort(((2 * math.pi * np.arange(km) - np.angle(mk)) / km) % (2 * math.pi))
        T = 0.6 if b == 5.0 else 0.1  # the notebook's depths
        ts: list[float] = []
        pics: list[np.ndarray] = []

        def keep(i: int, t: float, u: np.ndarray, ts: list = ts, pics: list = pics, mesh: CircleMesh = mesh) -> None:
            ts.append(t)
            pics.append(mesh.cell_means(u))

        CircleTransport(mesh, "unnormalised").solve(mu, heads(b), T, 60, keep)
        d = np.array(pics)
        ax.pcolormesh(np.array(ts), (np.arange(mesh.n) + 0.5) * mesh.h, d.T, shading="nearest", cmap="magma",
                      norm=matplotlib.colors.LogNorm(max(d.min(), 1e-6), d.max()))
        ax.hlines(pred, 0, T, colors="c", linestyles="--", linewidth=0.8)
        ax.set(xlabel="t", ylabel="θ", title=f"β = {b:g}: {km} predicted clusters (dashed)")


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    OUT.mkdir(exist_ok=True)
    print("load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    betas = ([1, 2, 3, 4, 5, 7, 10, 16, 32, 64] if QUICK
             else [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64])
    rows = counts([float(b) for b in betas])
    life = [lifetime(b, 30.0 if QUICK else 150.0, "softmax") for b in ((1.5, 2.0) if QUICK else (1.5, 2.0, 2.5, 3.0))]
    for r in life:
        print(f"β = {r['beta']:g}: k_max {r['k_max']}, formed {r['t_form']:.3g}, merged {r['t_merge']:.3g} "
              f"(reached {r['t_reached']:.3g}), {r['wall_s']:.0f} s", flush=True)
    ok = [r for r in life if np.isfinite(r["T_meta"]) and r["T_meta"] > 0]
    c = -fit_rate([r["beta"] for r in ok], [r["T_meta"] for r in ok]) if len(ok) >= 2 else math.nan
    print(f"T_meta ~ e^(c β): c = {c:.3f} from {len(ok)} values of β")
    fig, ax = plt.subplots(2, 2, figsize=(11, 8))
    b = np.array([r["beta"] for r in rows])
    x = np.sqrt(b * np.log(np.maximum(b, 1.0 + 1e-9)))
    ck = float(np.sum(x * [r["k_max"] for r in rows]) / np.sum(x * x))
    bb = np.linspace(1, 64, 400)
    ax[0, 0].plot(bb, [kmax(v) for v in bb], "-", label="k_max(β) (linear theory)")
    ax[0, 0].plot(b, [r["clusters"] for r in rows], "o", label="clusters formed (PDE)")
    ax[0, 0].plot(bb, ck * np.sqrt(bb * np.log(bb)), ":", label=f"{ck:.2f} √(β log β)")
    ax[0, 0].set(xlabel="β", ylabel="clusters", xscale="log")
    ax[0, 0].legend(fontsize=8)
    if ok:
        ax[0, 1].semilogy([r["beta"] for r in ok], [r["T_meta"] for r in ok], "o", label="T_meta (SA)")
        if np.isfinite(c):
            ax[0, 1].semilogy(bb[bb <= 6], ok[0]["T_meta"] * np.exp(c * (bb[bb <= 6] - ok[0]["beta"])), ":",
                              label=f"e^({c:.2f} β)")
        ax[0, 1].legend(fontsize=8)
    ax[0, 1].set(xlabel="β", ylabel="metastable lifetime")
    fig4([ax[1, 0], ax[1, 1]])
    fig.tight_layout()
    fig.savefig(OUT / "atlas.png", dpi=100)
    (OUT / "atlas.json").write_text(json.dumps({"counts": rows, "lifetimes": life, "c": c, "c_sqrt": ck}, indent=1))
    print("load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
