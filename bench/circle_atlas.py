"""The atlas of clustering on the circle (theory §9): cluster counts against β, metastable lifetimes, BPA's Fig. 4.

(i) k_max(β) = argmax_k γ_k (closed form) and the number of clusters the PDE forms (USA, DG1 on 384 cells) from
    24 modes of amplitude 1e-4 with seeded random phases once the top mode has grown by 3·10⁴, for β = 1..64,
    against a fitted c √(β log β) (Geshkovski–Rigollet–Sun: modes of Gaussian kernel density estimates).
(ii) T_meta(β): the flow map (:mod:`mfpde.tokens.circle.flow`: μ_t = X_t # μ_0 on M quantile labels, DOP853 then
    LSODA) from the same
    kind of start (``SEEDS`` draws of the phases), SA by default, to t = 10⁶ (8 decades from 10⁻², 20 outputs per
    decade); clusters = groups of labels cut at gaps > 0.1·2π/k_max with mass > 0.2/k_max
    (:func:`~mfpde.tokens.circle.flow.cluster_masses`); T_meta = (first later output with fewer clusters) −
    (first output with k_max clusters); the median over the draws fitted as log T_meta = log C + cβ
    (:func:`mfpde.fitting.fit_power` with x = e^β), with its standard error. The label count M is checked by
    the same lifetimes at M/2 (``--check-m``). Nearest clusters at distance d drift together at a speed
    ∝ e^{β(cos d − 1)} sin d (SA; USA: e^{β cos d} sin d), so k equally spaced clusters live
    ∝ e^{β(1 − cos(2π/k))} (SA): the prediction c_k = 1 − cos(2π/k_max(β)) against which the medians are shown.
    And the clean case: two clusters from μ_0 ∝ 1 + 0.3 cos 2θ + 0.05 cos(θ − 0.4), β = 1..8, to t = 10⁹; the
    pair is nearly antipodal, so T_merge ∝ e^{2β} (SA) and e^{β} (USA) up to a polynomial factor
    (:data:`TWO_MODES`; M = 64 and 128 compared).
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

from mfpde.fitting import fit_power
from mfpde.heads import HeadMeasure
from mfpde.tokens.circle.dg import CircleMesh, CircleTransport
from mfpde.tokens.circle.diag import clusters, initial_density

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
        t0 = time.process_time()
        mu0 = initial_density(mesh, "circle_modes", modes())
        rep = CircleTransport(mesh, "unnormalised").solve(mu0, heads(b), T, 5)
        n_cl = clusters(mesh, rep.mu_T)[0]
        second = np.sort(g)[-2] / g.max()
        rows.append({"beta": b, "k_max": km, "clusters": n_cl, "runner_up_ratio": float(second),
                     "cpu_s": time.process_time() - t0})
        print(f"β = {b:5.1f}: k_max {km:2d}, clusters {n_cl:2d}, γ_2nd/γ_max {second:.3f}, "
              f"{time.process_time() - t0:.1f} s", flush=True)
    return rows


#: The two-cluster start of the clean lifetime law.
TWO_MODES = [[2, 0.3, 0.0], [1, 0.05, 0.4]]


def two_cluster_lifetime(beta: float, attention: str, M: int) -> dict[str, float]:
    """From :data:`TWO_MODES`: first depth with two clusters, first with one, their difference (flow map)."""
    from mfpde.tokens.circle.flow import FlowMap, cluster_masses, modes_labels

    fm = FlowMap(modes_labels(TWO_MODES, M), np.array([beta]), np.array([1.0]), attention)
    t0 = time.process_time()
    sol = fm.solve(np.logspace(-2, 9, 221), rtol=1e-8)
    w = np.full(M, 1.0 / M)
    cnt = [int((cluster_masses(x, w, 0.1 * math.pi) > 0.1).sum()) for x in sol.X]
    t_form = next((float(t) for t, c in zip(sol.t, cnt, strict=True) if c == 2), math.nan)
    t_merge = next((float(t) for t, c in zip(sol.t, cnt, strict=True) if t > t_form and c < 2), math.nan)
    return {"beta": beta, "attention": attention, "M": M, "t_form": t_form, "t_merge": t_merge,
            "T_meta": t_merge - t_form, "cpu_s": time.process_time() - t0}


#: β of the lifetimes, and the draws of the initial phases per β.
LIFE_BETAS = (1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0)
SEEDS = (7, 8, 9, 10, 11)


def lifetime(beta: float, seed: int, attention: str = "softmax", M: int = 128) -> dict[str, float]:
    """First k_max-cluster depth, first merge after it, T_meta, and the CPU seconds (flow map, see the module)."""
    from mfpde.tokens.circle.flow import FlowMap, cluster_masses, modes_labels

    km = kmax(beta)  # SA's rates are USA's over I₀(β): the same argmax
    fm = FlowMap(modes_labels(modes(seed), M), np.array([beta]), np.array([1.0]), attention)
    t0 = time.process_time()
    sol = fm.solve(np.logspace(-2, 6, 161), rtol=1e-8)
    w = np.full(M, 1.0 / M)
    cnt = [int((cluster_masses(x, w, 0.1 * 2 * math.pi / km) > 0.2 / km).sum()) for x in sol.X]
    t_form = next((float(t) for t, c in zip(sol.t, cnt, strict=True) if c == km), math.nan)
    t_merge = next((float(t) for t, c in zip(sol.t, cnt, strict=True) if t > t_form and c < km), math.nan)
    return {"beta": beta, "seed": seed, "k_max": km, "t_form": t_form, "t_merge": t_merge, "T_meta": t_merge - t_form,
            "t_reached": float(sol.t[-1]), "final_clusters": cnt[-1], "cpu_s": time.process_time() - t0, "M": M}


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
    life_betas = LIFE_BETAS[::2] if QUICK else LIFE_BETAS
    seeds = SEEDS[:2] if QUICK else SEEDS
    life = [lifetime(b, sd) for b in life_betas for sd in seeds]
    for r in life:
        print(f"β = {r['beta']:g} seed {r['seed']}: k_max {r['k_max']}, formed {r['t_form']:.3g}, merged "
              f"{r['t_merge']:.3g}, T_meta {r['T_meta']:.3g}, {r['final_clusters']} at t = {r['t_reached']:.0e}, "
              f"{r['cpu_s']:.1f} s CPU", flush=True)
    if "--check-m" in sys.argv:
        for b in life_betas[:3]:
            half = lifetime(b, seeds[0], M=64)
            full = next(r for r in life if r["beta"] == b and r["seed"] == seeds[0])
            print(f"M check β = {b:g}: T_meta {half['T_meta']:.3g} (M = 64), {full['T_meta']:.3g} (M = 128)")
    two = [two_cluster_lifetime(float(b), att, M) for att in ("softmax", "unnormalised") for b in range(1, 9)
           for M in (64, 128)]
    two_fit = {}
    for att, c_pred in (("softmax", 2.0), ("unnormalised", 1.0)):
        rr = [r for r in two if r["attention"] == att and r["M"] == 128 and r["beta"] >= 3]
        law2 = fit_power(np.exp([r["beta"] for r in rr]), [r["T_meta"] for r in rr])
        two_fit[att] = (law2.q, law2.se_q)
        for r in (r for r in two if r["attention"] == att and r["M"] == 128):
            half = next(h for h in two if h["attention"] == att and h["M"] == 64 and h["beta"] == r["beta"])
            print(f"two clusters {att} β = {r['beta']:g}: formed {r['t_form']:.3g}, merged {r['t_merge']:.3g}, "
                  f"T_meta {r['T_meta']:.3g} (M = 64: {half['T_meta']:.3g}), {r['cpu_s']:.1f} s CPU", flush=True)
        print(f"two clusters {att}: T_meta ∝ e^(c β), β = 3..8: c = {law2.q:.3f} ± {law2.se_q:.3f} "
              f"(predicted {c_pred:g} as β → ∞)", flush=True)
    med = []
    for b in life_betas:
        v = [r["T_meta"] for r in life if r["beta"] == b]
        if all(np.isfinite(v)):
            med.append((b, float(np.median(v)), float(np.min(v)), float(np.max(v))))
    law = fit_power(np.exp([m[0] for m in med]), [m[1] for m in med]) if len(med) >= 3 else None
    c, se = (law.q, law.se_q) if law else (math.nan, math.nan)
    print(f"T_meta ~ e^(c β) (SA, medians over {len(seeds)} draws): c = {c:.3f} ± {se:.3f} from {len(med)} values of β")
    if len(med) >= 3:
        x = [math.exp(b * (1 - math.cos(2 * math.pi / kmax(b)))) for b, *_ in med]
        lawk = fit_power(x, [m[1] for m in med])
        print(f"T_meta ∝ e^(c' β(1 − cos(2π/k_max))): c' = {lawk.q:.3f} ± {lawk.se_q:.3f} (nearest-cluster drift: 1)")
    for b, m, lo, hi in med:
        km = kmax(b)
        print(f"β = {b:g}: k_max {km}, T_meta median {m:.3g} (draws {lo:.3g}..{hi:.3g}), predicted exponent "
              f"β(1 − cos(2π/k_max)) = {b * (1 - math.cos(2 * math.pi / km)):.2f}")
    fig, ax = plt.subplots(2, 2, figsize=(11, 8))
    b = np.array([r["beta"] for r in rows])
    x = np.sqrt(b * np.log(np.maximum(b, 1.0 + 1e-9)))
    ck = float(np.sum(x * [r["k_max"] for r in rows]) / np.sum(x * x))
    bb = np.linspace(1, 64, 400)
    ax[0, 0].plot(bb, [kmax(v) for v in bb], "-", label="k_max(β) (linear theory)")
    ax[0, 0].plot(b, [r["clusters"] for r in rows], "o", label="clusters formed (PDE)")
    ax[0, 0].plot(bb, ck * np.sqrt(bb * np.log(bb)), ":", label=f"{ck:.2f} √(β log β)")
    ax[0, 0].plot(bb, np.sqrt(2 * bb), "--", lw=0.8, label="√(2β) (I_k(β) ≈ e^β e^{−k²/2β}/√(2πβ))")
    ax[0, 0].set(xlabel="β", ylabel="clusters", xscale="log")
    ax[0, 0].legend(fontsize=8)
    for att, mk in (("softmax", "o"), ("unnormalised", "s")):
        rr = [r for r in two if r["attention"] == att and r["M"] == 128]
        ax[0, 1].semilogy([r["beta"] for r in rr], [r["T_meta"] for r in rr], mk,
                          label=f"two clusters, {'SA' if att == 'softmax' else 'USA'}: c = {two_fit[att][0]:.2f} ± "
                                f"{two_fit[att][1]:.2f}")
    if med:
        ax[0, 1].errorbar([m[0] for m in med], [m[1] for m in med],
                          yerr=[[m[1] - m[2] for m in med], [m[3] - m[1] for m in med]], fmt="^",
                          label="k_max clusters (SA): median, min–max of draws")
    ax[0, 1].legend(fontsize=7)
    ax[0, 1].set(xlabel="β", ylabel="metastable lifetime T_meta", yscale="log")
    fig4([ax[1, 0], ax[1, 1]])
    fig.tight_layout()
    fig.savefig(OUT / "atlas.png", dpi=100)
    (OUT / "atlas.json").write_text(json.dumps({"counts": rows, "lifetimes": life, "c": c, "c_se": se, "c_sqrt": ck,
                                                "two_clusters": two, "two_fit": two_fit},
                                               indent=1))
    print("load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
