"""The atlas of clustering on the sphere S² (theory §9): cluster counts against β, patterns, metastable lifetimes.

All runs use mfpde's flow solver (:class:`mfpde.tokens.sphere.flow.SphereFlow`: μ_t = X_t # μ_0 on the product
quadrature of μ_0, DOP853 then BDF) with the log-domain kernel (the exact direct quadrature of e^{β(x·y−1)}, O(n²)
per evaluation: cheaper than the series at these particle counts and exact at every β). Clusters are the connected
components of particles closer than ``ANGLE`` radians with at least 1% of the mass
(:func:`mfpde.tokens.sphere.flow.clusters`); ``clustered`` is the fraction of the mass in them.

(a) ℓ_max(β) = argmax_ℓ γ_ℓ (linear theory) against the number of clusters formed, SA, β = 1..32, from the seeded
    noise start :func:`~mfpde.tokens.sphere.data.noise_modes` (amplitude 1e-3, degrees 1..ℓ_max + 4) for
    ``SEEDS``: counted at T₁ = log(10⁴)/γ_max + 3/γ_max and at 1.5 T₁ (whether the count is settled).
(b) ℓ = 3 (β = 5) and ℓ = 4 (β = 9), SA: single-degree starts μ_0 = 1/4π + a Y_ℓm (a = 0.01/4π·√4π, i.e. a
    1% perturbation) for m = 0..ℓ (m < 0 is m > 0 rotated about the axis), and three seeded random unit vectors
    in the (2ℓ+1)-dimensional eigenspace: the clusters at 1.5 T₁, their count, masses and pairwise angles,
    matched against the vertex sets of :data:`POLYHEDRA` (the largest difference of the sorted pairwise angles,
    a rotation-invariant distance).
(c) Lifetimes. Two clusters: μ_0 = 1/4π + 0.04 Y_20 + 0.005 Y_11 (two polar clusters, slightly tilted so that they
    are not exactly antipodal), SA and USA, β = 1..8, outputs at 20 per decade, the horizon raised a decade at a
    time from 10² until the merge shows (at most 10¹⁰); T_meta = (first output
    with one cluster) − (first with two); fitted T_meta ∝ e^{cβ} (:func:`mfpde.fitting.fit_power`, x = e^β) for
    β in ``TWO_FIT_BETAS`` (nearly antipodal clusters: c → 2 (SA), 1 (USA)). k clusters: from the noise start,
    SA, β in ``LIFE_BETAS`` × ``SEEDS``, N = 8 (128 particles): k = the count at T₁ (collapsed), T_meta = (first output
    after T₁ with fewer than k clusters) − (first output with k), to t = 10⁶; the medians fitted the same way.

Run: ``python bench/sphere_atlas.py [--quick] [counts] [patterns] [two] [k] [plot]`` (the parts named, default
all; ``plot``: the figures from the parts' files alone; about
8 minutes of CPU; ``--quick``: fewer β and seeds); writes ``out_sphere_atlas/<part>.json`` per part, ``fits.json``,
``atlas.png`` and ``patterns.png`` (from the parts' files present) and prints the tables and the load.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from mfpde.errors import NumericalError
from mfpde.fitting import fit_power
from mfpde.tokens.sphere.data import noise_modes
from mfpde.tokens.sphere.flow import SphereFlow, SphereFlowSolution, clusters
from mfpde.tokens.sphere.kernel import sphere_velocity
from mfpde.tokens.sphere.theory import fastest_degree, growth_rate

OUT = Path("out_sphere_atlas")
QUICK = "--quick" in sys.argv
#: The linking angle of a cluster (radians) and its least mass (fraction of the total).
ANGLE, MIN_MASS = 0.05, 0.01
SEEDS = (0, 1, 2)
LIFE_BETAS = (2.0, 3.0, 4.0, 5.0, 6.0)
NOISE = 1e-3


def _polyhedra() -> dict[str, np.ndarray]:
    g = (1 + math.sqrt(5)) / 2
    ico = np.array([p for s1 in (-1, 1) for s2 in (-1, 1)
                    for p in ([0, s1, s2 * g], [s1, s2 * g, 0], [s2 * g, 0, s1])], float)
    cube = np.array(list(itertools.product((-1, 1), repeat=3)), float)
    octa = np.vstack([np.eye(3), -np.eye(3)])
    tri = [[math.cos(a), math.sin(a), 0] for a in 2 * math.pi * np.arange(3) / 3]
    pent = [[math.cos(a), math.sin(a), 0] for a in 2 * math.pi * np.arange(5) / 5]
    sq = [[math.cos(a), math.sin(a), 0] for a in math.pi / 2 * np.arange(4)]
    anti = [[math.cos(a) * math.sqrt(1 - h * h), math.sin(a) * math.sqrt(1 - h * h), h]
            for j, h in enumerate((0.5, -0.5)) for a in math.pi / 2 * np.arange(4) + j * math.pi / 4]
    out = {"antipodal pair": np.array([[0, 0, 1], [0, 0, -1]], float), "equilateral triangle": np.array(tri),
           "tetrahedron": cube[[0, 3, 5, 6]], "square": np.array(sq),
           "triangular bipyramid": np.vstack([tri, [[0, 0, 1], [0, 0, -1]]]), "square pyramid": np.vstack(
               [np.array(sq) * math.sqrt(1 - 0.2**2) + [0, 0, -0.2], [[0, 0, 1]]]),
           "octahedron": octa, "pentagonal bipyramid": np.vstack([pent, [[0, 0, 1], [0, 0, -1]]]),
           "cube": cube, "square antiprism": np.array(anti), "icosahedron": ico}
    return {k: v / np.linalg.norm(v, axis=1, keepdims=True) for k, v in out.items()}


#: Vertex sets the cluster centres are compared with (unit vectors).
POLYHEDRA = _polyhedra()


def pair_angles(c: np.ndarray) -> np.ndarray:
    """The sorted pairwise angles (degrees) of the unit vectors c (k, 3)."""
    i, j = np.triu_indices(len(c), 1)
    return np.sort(np.degrees(np.arccos(np.clip(np.sum(c[i] * c[j], axis=1), -1, 1))))


def match(c: np.ndarray) -> tuple[str, float]:
    """(the closest vertex set of the same size, the largest difference of the sorted pairwise angles, degrees)."""
    best, err = "none", math.inf
    a = pair_angles(c)
    for name, v in POLYHEDRA.items():
        if len(v) == len(c):
            e = float(np.max(np.abs(pair_angles(v) - a)))
            if e < err:
                best, err = name, e
    return best, err


def flow(beta: float, attention: str, modes: list[list[float]], N: int, t_out: np.ndarray,
         rtol: float = 1e-8) -> SphereFlowSolution:
    """The flow solver's particles at t_out (the partial solution if an integrator gives up)."""
    v = sphere_velocity(beta, attention, kernel="log-domain", L=4)
    try:
        return SphereFlow(v, nodes=N, rtol=rtol, L=4).solve(modes, float(t_out[-1]), t_out)
    except NumericalError as e:
        print(f"  (stopped: {e})", flush=True)
        return e.partial  # type: ignore[no-any-return]


def count(sol: SphereFlowSolution, i: int) -> tuple[int, float, np.ndarray, np.ndarray]:
    """(clusters, clustered mass fraction, masses, centres) at output i."""
    m, c = clusters(sol.x[i], sol.w, ANGLE, MIN_MASS)
    return len(m), float(m.sum()), m, c


def t_cluster(beta: float) -> float:
    g = float(growth_rate(fastest_degree(beta), beta, "softmax"))
    return math.log(1e4) / g + 3.0 / g


def nodes_for(beta: float) -> int:
    """Quadrature nodes: ~60 particles per expected cluster (ℓ_max² clusters at most), at least 12."""
    return max(12, 3 * fastest_degree(beta) + 4)


def counts(betas: list[float], seeds: tuple[int, ...]) -> list[dict[str, Any]]:
    rows = []
    for b in betas:
        lm = fastest_degree(b)
        ll = np.arange(1, 60)
        g = np.sort(growth_rate(ll, b, "softmax"))
        T = t_cluster(b)
        for sd in seeds:
            t0 = time.process_time()
            sol = flow(b, "softmax", noise_modes(NOISE, sd, lm + 4), nodes_for(b), np.array([T, 1.5 * T]))
            k1, f1, *_ = count(sol, 0)
            k2, f2, *_ = count(sol, len(sol.t) - 1)
            rows.append({"beta": b, "seed": sd, "l_max": lm, "runner_up_ratio": float(g[-2] / g[-1]), "T": T,
                         "clusters_T": k1, "clusters_1.5T": k2, "clustered_1.5T": f2, "nodes": nodes_for(b),
                         "cpu_s": time.process_time() - t0})
            r = rows[-1]
            print(f"β = {b:5.1f} seed {sd}: ℓ_max {lm}, clusters {k1} at T = {T:.3g}, {k2} at 1.5T "
                  f"({f2:.2f} of the mass), {r['cpu_s']:.1f} s", flush=True)
    return rows


def patterns(seeds: tuple[int, ...]) -> list[dict[str, Any]]:
    rows = []
    a = 0.01 / math.sqrt(4 * math.pi)  # a·|Y| ≲ 1% of the uniform density 1/4π
    for ll, b in ((3, 5.0), (4, 9.0)):
        assert fastest_degree(b) == ll
        T = t_cluster(b)
        starts: list[tuple[str, list[list[float]]]] = [(f"Y_{ll},{m}", [[ll, m, a]]) for m in range(ll + 1)]
        for sd in seeds:
            z = np.random.default_rng(100 + sd).standard_normal(2 * ll + 1)
            z /= np.linalg.norm(z)
            starts.append((f"random combination (seed {100 + sd})",
                           [[ll, m, a * float(z[m + ll])] for m in range(-ll, ll + 1)]))
        for name, modes in starts:
            t0 = time.process_time()
            sol = flow(b, "softmax", modes, 16, np.array([T, 1.5 * T]))
            k, frac, m, c = count(sol, len(sol.t) - 1)
            poly, err = match(c) if k >= 2 else ("none", math.nan)
            rows.append({"l": ll, "beta": b, "start": name, "clusters": k, "clustered": frac,
                         "masses": m.tolist(), "centres": c.tolist(), "pair_angles": pair_angles(c).tolist(),
                         "polyhedron": poly, "angle_error_deg": err, "cpu_s": time.process_time() - t0,
                         "x": sol.x[-1].tolist() if name.startswith("Y") or "100)" in name else None})
            print(f"ℓ = {ll}, β = {b:g}, {name}: {k} clusters holding {frac:.2f} of the mass; closest {poly} "
                  f"(angles within {err:.2g}°); masses {np.round(m, 3).tolist()}, {rows[-1]['cpu_s']:.1f} s",
                  flush=True)
    return rows


#: The two-cluster start: two polar clusters, tilted by Y_11 so that they are not exactly antipodal.
TWO_MODES = [[2, 0, 0.04], [1, 1, 0.005]]
#: The β of the lifetime fits: USA from β = 7 on forms more than two clusters from TWO_MODES (the depleted
#: equatorial band is itself unstable), so its first merge is not a pair's lifetime.
TWO_FIT_BETAS = {"softmax": (3, 8), "unnormalised": (3, 6)}


def lifetime(beta: float, attention: str, modes: list[list[float]], N: int, t_end: float, target: int | None,
             ) -> dict[str, Any]:
    """First output with ``target`` clusters (None: the count at T₁), first later one with fewer, T_meta.

    The outputs are 20 per decade from 10⁻²; the solve is run to 10², 10³, … and stopped at the first horizon
    (at most ``t_end``) that shows the merge: after a merge the collapsed cluster makes BDF slow, for nothing.
    """
    t0 = time.process_time()
    top = 2
    while True:
        t = np.logspace(-2, top, 20 * (top + 2) + 1)
        sol = flow(beta, attention, modes, N, t)
        cnt = [count(sol, i)[0] for i in range(len(sol.t))]
        # k: the count once the clusters have collapsed (the first output past T₁ of part (a)), not a transient
        # count of half-collapsed groups while they form
        settled = next((i for i, tt in enumerate(sol.t) if tt >= t_cluster(beta)), len(cnt) - 1)
        k = cnt[settled] if target is None else target
        t_form = next((float(tt) for tt, c in zip(sol.t, cnt, strict=True) if c == k), math.nan)
        t_merge = next((float(tt) for i, (tt, c) in enumerate(zip(sol.t, cnt, strict=True))
                        if tt > t_form and i >= settled * (target is None) and 0 < c < k), math.nan)
        if np.isfinite(t_merge) or 10.0 ** (top + 1) > t_end * 1.0001 or len(sol.t) < len(t):
            break
        top += 1
    return {"beta": beta, "attention": attention, "k": k, "t_form": t_form, "t_merge": t_merge,
            "T_meta": t_merge - t_form, "t_reached": float(sol.t[-1]), "final_clusters": cnt[-1],
            "cpu_s": time.process_time() - t0, "nodes": N}


def fit(rows: list[dict[str, Any]], key: str = "T_meta") -> tuple[float, float, int]:
    ok = [r for r in rows if np.isfinite(r[key]) and r[key] > 0]
    if len(ok) < 3:
        return math.nan, math.nan, len(ok)
    law = fit_power(np.exp([r["beta"] for r in ok]), [r[key] for r in ok])
    return float(law.q), float(law.se_q), len(ok)


PARTS = ("counts", "patterns", "two", "k")


def run_part(part: str, seeds: tuple[int, ...]) -> Any:
    """One part of the atlas (see the module), printed as it goes; its JSON-able result."""
    if part == "counts":
        betas = [1, 2, 4, 5, 9, 16, 32] if QUICK else [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16, 20, 24, 32]
        return counts([float(b) for b in betas], seeds)
    if part == "patterns":
        return patterns(seeds[:1] if QUICK else seeds)
    if part == "two":
        two = []
        for att in ("softmax", "unnormalised"):
            for b in range(1, 9):
                r = lifetime(float(b), att, TWO_MODES, 8, 1e10, 2)
                two.append(r)
                print(f"two clusters {att} β = {r['beta']:g}: formed {r['t_form']:.3g}, merged {r['t_merge']:.3g}, "
                      f"T_meta {r['T_meta']:.3g}, {r['cpu_s']:.1f} s", flush=True)
        return two
    life = []
    for b in LIFE_BETAS[::2] if QUICK else LIFE_BETAS:
        for sd in seeds:
            r = dict(lifetime(b, "softmax", noise_modes(NOISE, sd, fastest_degree(b) + 4), 8, 1e6, None), seed=sd)
            life.append(r)
            print(f"k clusters β = {r['beta']:g} seed {r['seed']}: {r['k']} formed at {r['t_form']:.3g}, merged at "
                  f"{r['t_merge']:.3g}, T_meta {r['T_meta']:.3g}, {r['final_clusters']} at t = {r['t_reached']:.0e}, "
                  f"{r['cpu_s']:.1f} s", flush=True)
    return life


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    OUT.mkdir(exist_ok=True)
    print("load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    seeds = SEEDS[:2] if QUICK else SEEDS
    # e.g. `python bench/sphere_atlas.py two k`; `plot`: only the figures and fits from the parts' files
    parts = [] if "plot" in sys.argv else [p for p in PARTS if p in sys.argv] or list(PARTS)
    for part in parts:
        cpu0 = time.process_time()
        res = run_part(part, seeds)
        (OUT / f"{part}.json").write_text(json.dumps({"rows": res, "cpu_s": time.process_time() - cpu0}, indent=1))
    got = {p: json.loads((OUT / f"{p}.json").read_text())["rows"] for p in PARTS if (OUT / f"{p}.json").exists()}
    rows, pats, two, life = (got.get(p, []) for p in PARTS)
    two_fit = {}
    for att, pred in (("softmax", 2.0), ("unnormalised", 1.0)):
        lo, hi = TWO_FIT_BETAS[att]
        two_fit[att] = fit([r for r in two if r["attention"] == att and lo <= r["beta"] <= hi])
        print(f"two clusters {att}: T_meta ∝ e^(cβ), β = {lo}..{hi}: c = {two_fit[att][0]:.3f} ± {two_fit[att][1]:.3f} "
              f"(antipodal limit {pred:g})", flush=True)
    med = []
    for b in sorted({r["beta"] for r in life}):
        v = [r["T_meta"] for r in life if r["beta"] == b and np.isfinite(r["T_meta"])]
        if v:
            med.append({"beta": b, "T_meta": float(np.median(v)), "lo": float(min(v)), "hi": float(max(v)),
                        "draws": len(v)})
    k_fit = fit(med)
    print(f"k clusters (SA, medians): T_meta ∝ e^(cβ): c = {k_fit[0]:.3f} ± {k_fit[1]:.3f} from {k_fit[2]} β")
    (OUT / "fits.json").write_text(json.dumps({"two_fit": two_fit, "k_medians": med, "k_fit": k_fit}, indent=1))

    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2))
    bb = np.linspace(1, 32, 300)
    ax[0].plot(bb, [fastest_degree(v) for v in bb], "-", label="ℓ_max(β) (linear theory)")
    ax[0].plot(bb, [fastest_degree(v) * (fastest_degree(v) + 1) / (2 * math.sqrt(3)) for v in bb], ":",
               label="ℓ(ℓ+1)/(2√3) at ℓ = ℓ_max: maxima of a random degree-ℓ harmonic")
    b = np.array([r["beta"] for r in rows])
    ax[0].plot(b * (1 + 0.02 * (np.array([r["seed"] for r in rows]) - 1)), [r["clusters_1.5T"] for r in rows], "o",
               ms=4, label="clusters formed (flow, SA, noise seeds)")
    ax[0].set(xlabel="β", ylabel="count", xscale="log", yscale="log")
    ax[0].legend(fontsize=8)
    for att, mk in (("softmax", "o"), ("unnormalised", "s")):
        rr = [r for r in two if r["attention"] == att]
        ax[1].semilogy([r["beta"] for r in rr], [r["T_meta"] for r in rr], mk,
                       label=f"two clusters, {'SA' if att == 'softmax' else 'USA'}: c = {two_fit[att][0]:.2f} ± "
                             f"{two_fit[att][1]:.2f}")
    if med:
        ax[1].errorbar([m["beta"] for m in med], [m["T_meta"] for m in med],
                       yerr=[[m["T_meta"] - m["lo"] for m in med], [m["hi"] - m["T_meta"] for m in med]], fmt="^",
                       label=f"k clusters from noise (SA): median, min–max; c = {k_fit[0]:.2f} ± {k_fit[1]:.2f}")
    ax[1].set(xlabel="β", ylabel="metastable lifetime T_meta", yscale="log")
    ax[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(OUT / "atlas.png", dpi=100)
    shown = [p for p in pats if p.get("x") is not None]
    if not shown:
        return
    fig, axes = plt.subplots(2, (len(shown) + 1) // 2, figsize=(2.6 * ((len(shown) + 1) // 2), 5.6),
                             subplot_kw={"projection": "3d"})
    for a3, p in zip(axes.ravel(), shown, strict=False):
        x = np.asarray(p["x"])
        a3.scatter(*x.T, s=1, c=x[:, 2], cmap="viridis")
        c = np.asarray(p["centres"]).reshape(-1, 3)
        if len(c):
            a3.scatter(*c.T, s=40, c="r", marker="x")
        label = p["start"].replace("random combination", "mix")
        a3.set_title(f"ℓ={p['l']} {label}\n{p['clusters']}: {p['polyhedron']}", fontsize=7)
        a3.set_axis_off()
        a3.set_box_aspect((1, 1, 1))
    for a3 in axes.ravel()[len(shown):]:
        a3.set_axis_off()
    fig.tight_layout()
    fig.savefig(OUT / "patterns.png", dpi=100)
    print("load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
