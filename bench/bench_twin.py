"""The coupled training at equal accuracy: the PDE run against the autodiff twin (`mfpde twin`), CPU of each.

For each configuration (the embedded default, the digits 0 vs 6 with the single layer of value heads on 16×16 DG0
cells; ``demos/twin_deep.toml`` with the first-moment readout, two 1-D Gaussian inputs through a weight-tied
transformer of scalar heads, DG1 on 96 cells) ``mfpde twin`` runs the PDE, the PDE on twice the token cells and
the heads sweep at the token limit. The limit of the final risk is the Richardson extrapolation
R* = R_{h/2} + (R_{h/2} − R_h)/(2^p − 1) (p = 1 for DG0, 2 for DG1); the PDE's error is |R_h − R*|; one twin's
error is E|R_H − R*| over the seeds (one seed's network). Equal accuracy: the smallest H whose one-seed error is
at most the PDE's, its CPU per seed beside the PDE run's CPU (both measured in the same ``mfpde twin`` process,
one rank). Where no H of the sweep is as accurate, the fitted law E|R_H − R*| = C H^q gives the H it would need
(marked as extrapolated).

Run from the repository root: ``python bench/bench_twin.py`` (about 10 minutes on 2 cores); it writes
``out/bench/twin.json`` and prints a markdown table.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CASES = {
    "default (digits, shallow, value heads, DG0 16²)": (None, ["twin.heads=[1, 4, 16, 64, 256]", "twin.tokens=[64]"],
                                                       1.0),
    "deep (1-D Gaussians, weight-tied, scalar heads, DG1 96)": (str(ROOT / "demos" / "twin_deep.toml"),
                                                                 ["loss.readout='mean'",
                                                                  "twin.heads=[4, 16, 64, 256, 1024]",
                                                                  "twin.tokens=[8]", "twin.layers=[8]"], 2.0),
}


def run_case(name: str, cfg: str | None, sets: list[str], out: Path) -> dict:
    cmd = [sys.executable, "-m", "mfpde", "twin", *([cfg] if cfg else []), "--out", str(out), "--quiet", "--overwrite"]
    cmd += [a for s in sets for a in ("--set", s)] + ["--set", "output.plots=false"]
    subprocess.run(cmd, check=True, cwd=ROOT)
    return json.loads((out / "report.json").read_text())


def equal_accuracy(rep: dict, p: float) -> dict:
    pde = rep["pde"]
    r_h, r_h2 = pde["risk_final"], pde["risk_refined"]
    r_star = r_h2 + (r_h2 - r_h) / (2**p - 1)
    e_pde = abs(r_h - r_star)
    rows = []
    for key, s in rep["sizes"].items():
        if not key.startswith("heads:"):
            continue
        H = int(key.split("H=")[1].split(",")[0])
        err = float(np.mean(np.abs(np.asarray(s["risk_seeds"]) - r_star)))
        rows.append({"H": H, "error": err, "cpu_per_seed": s["cpu_s"] / len(s["risk_seeds"]),
                     "test_accuracy": s["test_accuracy_mean"]})
    rows.sort(key=lambda r: r["H"])
    hit = next((r for r in rows if r["error"] <= e_pde), None)
    out = {"r_star": r_star, "pde_error": e_pde, "pde_cpu": pde["cpu_s"], "twins": rows, "equal": hit}
    if hit is None and len(rows) >= 2:
        from mfpde.fitting import fit_power

        law = fit_power([r["H"] for r in rows], [r["error"] for r in rows])
        out["extrapolated_H"] = law.solve(e_pde)[0] if law.q < 0 else float("inf")
    return out


def main() -> None:
    results = {}
    for name, (cfg, sets, p) in CASES.items():
        rep = run_case(name, cfg, sets, ROOT / "out" / "bench" / f"twin-{'default' if cfg is None else 'deep'}")
        results[name] = equal_accuracy(rep, p)
    Path(ROOT / "out" / "bench").mkdir(parents=True, exist_ok=True)
    (ROOT / "out" / "bench" / "twin.json").write_text(json.dumps(results, indent=1))
    print("| configuration | PDE: error of R, CPU s | twin H: one-seed error of R, CPU s per seed | equal accuracy |")
    print("|---|---|---|---|")
    for name, r in results.items():
        tw = "; ".join(f"H={t['H']}: {t['error']:.2e}, {t['cpu_per_seed']:.2f}" for t in r["twins"])
        if r["equal"] is not None:
            eq = f"H = {r['equal']['H']}: twin {r['equal']['cpu_per_seed']:.2f} s vs PDE {r['pde_cpu']:.1f} s"
        else:
            need = r.get("extrapolated_H", float("nan"))
            eq = f"no H of the sweep; the fitted law needs H ≈ {need:.3g} (extrapolated)"
        print(f"| {name} | {r['pde_error']:.2e}, {r['pde_cpu']:.1f} | {tw} | {eq} |")


if __name__ == "__main__":
    main()
