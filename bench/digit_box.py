"""The embedded default against its heads box: how much of ρ_S the box holds, and what training lifts.

Each row is ``mfpde run`` on the embedded default (0 vs 6, horizontal readout 40∫x₁dμ_T, the single-layer
model, 300 steps of Δs = 1) with the overrides of the row; it prints the report's ``final.theta_boundary_mass``
(ρ_S's mass in the Θ cells touching ∂Θ), the training risk and the held-out accuracy of ρ₀ and of ρ_S.

* ``scalar``: heads θ = (a, v) on boxes and confinements λ₂: ρ_S spreads along a ridge towards large (a, v),
  which the box cuts; the confinement that keeps it inside also takes the lift.
* ``value``: value heads θ = v at a fixed attention parameter a: a Gaussian-like ρ_S around ∫v dρ ≈ −1, far
  from the box; the default's a is the one of least *training* risk (the held-out column is not used to choose).

Run: ``python bench/digit_box.py [scalar|value ...]`` (minutes per row); ``--set KEY=VALUE`` adds overrides.
"""

from __future__ import annotations

import argparse

from digit_lift import run_quiet

SCALAR = ['heads.family="scalar"', 'heads.init={kind="gaussian", mean=[0.5, 0.5], cov=[[0.1, 0.0], [0.0, 0.1]]}']


def _box(h: float, n: int) -> list[str]:
    return [f"heads.box=[[{-h}, {h}], [{-h}, {h}]]", f"heads.cells=[{n}, {n}]"]


ROWS: dict[str, list[list[str]]] = {
    "scalar": [[*SCALAR, *_box(2.0, 16), "training.lambda2=0.01"],
               [*SCALAR, *_box(4.0, 32), "training.lambda2=0.01"],
               [*SCALAR, *_box(5.0, 40), "training.lambda2=0.015"],
               [*SCALAR, *_box(5.0, 40), "training.lambda2=0.0175", "training.lambda=0.0005"],
               [*SCALAR, *_box(5.0, 40), "training.lambda2=0.019", "training.lambda=0.0005"],
               [*SCALAR, *_box(5.0, 40), "training.lambda2=0.019", "training.lambda=0.0005", "training.ds=3.0"],
               [*SCALAR, *_box(4.0, 32), "training.lambda2=0.02"]],
    "value": [[f"heads.a={a}"] for a in (2.0, -2.0, -4.0, -6.0, -8.0)],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    print("| overrides | Θ boundary mass | train risk | held-out accuracy ρ₀ → ρ_S | wall [s] |")
    print("|---|---|---|---|---|")
    for name in args.cases:
        for row in ROWS[name]:
            r, wall = run_quiet(None, [*row, *args.overrides])
            acc = r.report["accuracy"]
            shown = " ".join(o for o in row if o not in SCALAR)
            print(f"| {name}: `{shown}` | {r.report['final']['theta_boundary_mass']:.2g} | {r.history[-1]['risk']:.4f} "
                  f"| {acc['initial']['test']:.3f} → {acc['test']:.3f} | {wall:.0f} |", flush=True)


if __name__ == "__main__":
    main()
