"""The figures and the threshold table of docs/phase_transitions.md.

Noisy tokens (USA, one head β, coupling K, noise τ = 1) on the circle and the sphere:

* bifurcation diagrams by the continuation (the code of ``mfpde continuation``): circle β = 2 < β* and β = 4 > β*,
  sphere β = 1 < β* and β = 3 > β*;
* the hysteresis loop on the circle at β = 4: the DG0 Scharfetter–Gummel solver of ``mfpde transport`` stepped to
  depth ``--depth`` at each K of a sweep up and then down, each run started from the previous run's end state plus
  a mode-1 perturbation of amplitude 10⁻³ (a stand-in for the fluctuations of finitely many tokens; without it the
  uniform state, once reached to round-off, would persist far beyond K_c), drawn over the continued branches;
* the measured thresholds: K_c at several β (the first branch point of the uniform branch) against τβ/I_1(β), and
  β* (the root of the measured curvature c₂(β), mfpde.verify.noise) against the roots of I₂/I₁ = 1/2 and
  I_{5/2}/I_{3/2} = 1/3, with the conventions of Mun–Rosenzweig for comparison.

Writes ``--out``/phase_*.png and ``--out``/phase_diagrams.json (``--out`` default out/phase_diagrams; the figures
into docs/figures/ with ``--write-docs``, refused with ``--quick`` and ``--smoke``), prints the table. With
``--write-docs`` it also writes the table docs/_static/phase_thresholds.md, which the page includes, and the sweep's
end states docs/_static/phase_hysteresis.json, whose values the page's prose quotes. Run from the repository root:

    python bench/phase_diagrams.py [--quick | --smoke] [--write-docs] [--out DIR]

About 10 CPU minutes, most of it the sweep (--quick: a coarser and shorter sweep, about 4; --smoke: two K of the
sweep to depth 2, the rest as in the full run, seconds).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import scipy.special

ROOT = Path(__file__).resolve().parent.parent
FIG = ROOT / "out" / "phase_diagrams"
DOCS_FIG = ROOT / "docs" / "figures"


def branches(domain: str, beta: float, start: float, stop: float, points: int) -> dict:
    """The report part of ``mfpde continuation`` (branches, bifurcations) for τ = 1."""
    from mfpde.bifurcation import noisy_branches
    from mfpde.continuation import StepControl
    from mfpde.tokens.circle.stationary import CircleStationary
    from mfpde.tokens.sphere.stationary import SphereStationary

    P = (SphereStationary if domain == "sphere" else CircleStationary)(points, beta, 1.0)
    ctl = StepControl(0.02, 1e-6, 0.05, start, stop, 400)
    return noisy_branches(P, start, stop, ctl)


def draw(ax, part: dict, title: str) -> None:
    """Order parameter against K: stable solid, unstable dashed, bifurcations ○, folds ×."""
    for i, b in enumerate(part["branches"]):
        K, r, st = np.array(b["parameter"]), np.array(b["order_parameter"]), np.array(b["stable"])
        seg = st[:-1] & st[1:]  # a segment is stable when both its ends are
        cuts = [0, *(np.flatnonzero(seg[1:] != seg[:-1]) + 1), len(seg)]
        for a, z in zip(cuts[:-1], cuts[1:], strict=True):  # one polyline per run: the dashes stay visible
            ax.plot(K[a:z + 1], r[a:z + 1], color=f"C{i}", ls="-" if seg[a] else "--")
        ax.plot([], [], color=f"C{i}", label=b["origin"])
    for e in part["bifurcations"]:
        ax.plot(e["parameter"], e.get("order_parameter", 0.0), "x" if e["kind"] == "fold" else "o", color="k",
                mfc="none", ms=7)
    ax.set_xlabel("coupling K")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)


def sweep(beta: float, Ks: np.ndarray, cells: int, depth: float, kick: float = 1e-3) -> tuple[list, list, float]:
    """|μ̂₁| at the end of DG0 SG runs along Ks up then down (each from the previous end state + kick·cos θ)."""
    from mfpde.heads import HeadMeasure
    from mfpde.tokens.circle.dg import CircleMesh
    from mfpde.tokens.circle.noise import NoisyCircleTransport

    mesh = CircleMesh(cells, 0)
    th = mesh.nodes[:, :1]
    mu = np.full((cells, 1), 1 / (2 * math.pi))
    c0 = time.process_time()
    out = []
    for path in (Ks, Ks[::-1]):
        rs = []
        for K in path:
            mu = mu + kick * np.cos(th) / (2 * math.pi)
            mu /= mesh.mass(mu)
            heads = HeadMeasure(np.array([beta]), np.array([K]))
            mu = NoisyCircleTransport(mesh, 1.0, "unnormalised").solve(mu, heads, depth, 1).mu_T
            rs.append(float(abs(np.sum(mesh.weights(mu)[:, 0] * np.exp(1j * mesh.nodes[:, 0])))))
        out.append(rs)
    return out[0], out[1], time.process_time() - c0


def thresholds(quick: bool) -> dict:
    """K_c (continuation, N = 63) at several β against τβ/I_1(β); β* circle and sphere against the closed forms."""
    from mfpde.verify.noise import beta_star_closed_form, closed_threshold, measured_beta_star, measured_threshold

    rows = []
    for beta in (0.5, 1.0, 2.0, 4.0, 8.0):
        k = measured_threshold(beta, 1.0, 63)
        ref = closed_threshold("circle", beta, 1.0)
        mr = beta / (2 * float(scipy.special.iv(1, beta)))  # Mun–Rosenzweig's K_#^(2)(β) = β/(2 I_1(β))
        rows.append({"domain": "circle", "beta": beta, "K_c": k, "closed_form": ref, "rel_error": abs(k - ref) / ref,
                     "K_sharp_MR": mr})
    for beta in (1.0, 3.0):
        k = measured_threshold(beta, 1.0, 40, "sphere")
        ref = closed_threshold("sphere", beta, 1.0)
        mr = beta**1.5 / (2**1.5 * math.gamma(1.5) * float(scipy.special.iv(1.5, beta)))  # K_#^(3)(β)
        rows.append({"domain": "sphere", "beta": beta, "K_c": k, "closed_form": ref, "rel_error": abs(k - ref) / ref,
                     "K_sharp_MR": mr})
    stars = []
    for domain, points in (("circle", 41 if quick else 63), ("sphere", 24 if quick else 40)):
        bs, slope = measured_beta_star(1.0, points, domain)
        ref = beta_star_closed_form(domain)
        stars.append({"domain": domain, "points": points, "beta_star": bs, "closed_form": ref,
                      "error": abs(bs - ref), "slope": slope})
    return {"K_c": rows, "beta_star": stars}


def _sci(x: float) -> str:
    """5.7·10⁻¹⁶ (0 as 0)."""
    if x == 0:
        return "0"
    mant, exp = f"{x:.1e}".split("e")
    return f"{mant}·10{str(int(exp)).translate(str.maketrans('-0123456789', '⁻⁰¹²³⁴⁵⁶⁷⁸⁹'))}"


def threshold_table(result: dict) -> str:
    """The table of docs/phase_transitions.md (docs/_static/phase_thresholds.md): K_c, β* and the folds."""
    lines = ["| | β | measured | closed form | relative error | Mun–Rosenzweig's K_# | measured / K_# |",
             "|---|---|---|---|---|---|---|"]
    first = {"circle": "τβ/I_1(β) = ", "sphere": "τβ/i_1(β) = "}
    for r in result["thresholds"]["K_c"]:
        ref = first.pop(r["domain"], "") + f"{r['closed_form']:.15g}"
        lines.append(f"| K_c, {r['domain']} | {r['beta']:g} | {r['K_c']:.15g} | {ref} | {_sci(r['rel_error'])} | "
                     f"{r['K_sharp_MR']:.10g} | {r['K_c'] / r['K_sharp_MR']:.12g} |")
    roots = {"circle": "root of I₂/I₁ = 1/2", "sphere": "root of I_{5/2}/I_{3/2} = 1/3"}
    for b in result["thresholds"]["beta_star"]:
        lines.append(f"| β*, {b['domain']} (N = {b['points']}) | | {b['beta_star']:.10f} | {roots[b['domain']]}: "
                     f"{b['closed_form']:.10f} | {_sci(b['error'])} (absolute) | | |")
    for domain, beta, order in (("circle", 4.0, "\\|μ̂₁\\|"), ("sphere", 3.0, "\\|∫ x dμ\\|")):
        (f,) = [e for e in result[domain][str(beta)] if e["kind"] == "fold"]
        lines.append(f"| fold, {domain} | {beta:g} | K_f = {f['parameter']:.9f}, {order} = {f['order_parameter']:.4f} "
                     "| — | | | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a coarser hysteresis sweep, β* at fewer points")
    ap.add_argument("--depth", type=float, default=None, help="depth of each run of the sweep (default 200; quick 120)")
    ap.add_argument("--smoke", action="store_true", help="two K of the sweep to depth 2 (the test's run; seconds)")
    ap.add_argument("--out", default=str(FIG), help="directory of the figures and phase_diagrams.json")
    ap.add_argument("--write-docs", action="store_true", help=f"write the figures into {DOCS_FIG.relative_to(ROOT)}/ "
                    "instead of --out; the full settings only")
    args = ap.parse_args(argv)
    if args.write_docs and (args.quick or args.smoke or args.depth is not None):
        ap.error("--write-docs writes the docs' figures: the full settings only (no --quick, --smoke or --depth)")
    out = Path(args.out)
    fig_dir = DOCS_FIG if args.write_docs else out
    for d in (out, fig_dir):
        d.mkdir(parents=True, exist_ok=True)
    result: dict = {}
    c0 = time.process_time()
    circ = {2.0: branches("circle", 2.0, 0.8, 2.5, 127), 4.0: branches("circle", 4.0, 0.2, 1.0, 127)}
    sph = {1.0: branches("sphere", 1.0, 2.0, 4.0, 96), 3.0: branches("sphere", 3.0, 0.8, 2.0, 96)}
    result["continuation_cpu_s"] = time.process_time() - c0
    for name, parts, lab in (("circle", circ, "|μ̂₁|"), ("sphere", sph, "|∫ x dμ| (zonal states)")):
        fig = Figure(figsize=(10, 4))
        for i, (beta, part) in enumerate(parts.items()):
            ax = fig.add_subplot(1, 2, i + 1)
            kind = [e["kind"] for e in part["bifurcations"] if e["kind"] != "fold"][:1]
            draw(ax, part, f"{name}, β = {beta:g}, τ = 1: {kind[0] if kind else ''}")
            ax.set_ylabel(f"order parameter {lab}")
        fig.tight_layout()
        fig.savefig(fig_dir / f"phase_{name}.png", dpi=100)
        result[name] = {str(b): [e for e in p["bifurcations"]] for b, p in parts.items()}
    Ks = np.round(np.arange(0.36, 0.4501, 0.01 if args.quick else 0.005), 6)
    depth = args.depth or (120.0 if args.quick else 200.0)
    if args.smoke:
        Ks, depth = np.array([0.38, 0.42]), 2.0
    up, down, cpu = sweep(4.0, Ks, 32, depth)
    result["hysteresis"] = {"K": Ks.tolist(), "up": up, "down": down, "cells": 32, "depth": depth, "cpu_s": cpu}
    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.add_subplot()
    draw(ax, circ[4.0], f"hysteresis, circle β = 4: DG0 (32 cells) to depth {depth:g} per K")
    ax.plot(Ks, up, "^", color="C3", label="time stepping, K up")
    ax.plot(Ks[::-1], down, "v", color="C4", label="time stepping, K down")
    ax.set_xlim(0.33, 0.48)
    ax.set_ylabel("order parameter |μ̂₁|")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(fig_dir / "phase_hysteresis.png", dpi=100)
    result["thresholds"] = thresholds(args.quick)
    result["cpu_s"] = time.process_time() - c0
    (out / "phase_diagrams.json").write_text(json.dumps(result, indent=1))
    table = threshold_table(result)
    (out / "phase_thresholds.md").write_text(table)
    if args.write_docs:  # the page includes the table and quotes the sweep
        (ROOT / "docs" / "_static" / "phase_thresholds.md").write_text(table)
        (ROOT / "docs" / "_static" / "phase_hysteresis.json").write_text(json.dumps(result["hysteresis"], indent=1))
    print("| domain | β | K_c measured | closed form | rel. error | Mun–Rosenzweig K_# | ratio |")
    print("|---|---|---|---|---|---|---|")
    for r in result["thresholds"]["K_c"]:
        print(f"| {r['domain']} | {r['beta']:g} | {r['K_c']:.15g} | {r['closed_form']:.15g} | {r['rel_error']:.1e} | "
              f"{r['K_sharp_MR']:.10g} | {r['K_c'] / r['K_sharp_MR']:.12g} |")
    for s in result["thresholds"]["beta_star"]:
        print(f"β* {s['domain']} (N = {s['points']}): {s['beta_star']:.10f} vs {s['closed_form']:.10f} "
              f"(error {s['error']:.1e}, |dc₂/dβ| {s['slope']:.3g})")
    print("hysteresis: K", Ks.tolist())
    print("  up  ", [round(x, 4) for x in up])
    print("  down", [round(x, 4) for x in down[::-1]])
    print(f"CPU {result['cpu_s']:.1f} s (sweep {cpu:.1f} s); figures in {fig_dir}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
