"""Where does this model learn? Held-out accuracy on scikit-learn's digits, every pair of classes, per readout.

The default `mfpde run` once trained on a pair (6 vs 7) that the untrained ρ₀ already separates. This
script makes the table that says where training, not ρ₀, makes the classifier. For each pair of digits
(45 pairs, or ``--pairs``) and each readout, on all images of the pair with the seeded 80/20 split of
``data.split`` (the same split for every column; targets −1 for the first class, +1 for the second):

* **pixels**: logistic regression on the 64 pixels (scikit-learn, default regularisation): what the data allow;
* **mean sign**: the sign of the readout of μ₀ itself (no flow): what the data placement gives for free;
* **first order**: the best the model can do to first order in depth. One explicit step of the flow of
  theory §1.3 moves the readout to w·(m₀ + T ∫ v f(a) dρ(a, v)) with f(a) = ∫ m_a dμ₀ (m_a: the tilted mean
  of head a, the attention kernel of :mod:`mfpde.tokens.attention`), so ŷ is linear in the features
  w·f(a) over the a-grid of Θ (f(0) = m₀), with no offset: the held-out accuracy of a logistic regression on
  them without intercept (C = 100). Seconds for all pairs. This ignores that ρ is a probability measure:
* **first order, ρ ∈ P(Θ)**: the same linearisation with the model's own constraints: ŷ = 4w·(m₀ + T Σ_a c_a
  f(a)) where c_a = ∫ v dρ(a, v), so Σ_a |c_a| ≤ v_max (the v-extent of the heads box), and m₀ enters with
  coefficient 1 (the residual connection): the held-out accuracy of the least-squares fit (the training risk,
  regularisation left out) over that ℓ1 ball (scipy's SLSQP). This bounds what training can reach to first order;
* **ρ₀ / trained** (``--pde``): ``mfpde run`` itself: the held-out accuracy of the embedded default's ρ₀, with
  the screen's heads (scalar heads θ = (a, v) in Θ = [−2, 2]², 16×16 cells) unless ``--config`` is given,
  (``training.steps = 0``) and after ``--steps`` training steps (Lie, entropic, all training images), for
  the pairs where ρ₀ is at most ``--train-below``. A full-size training run on ~290 images takes tens of
  minutes on 2 cores; ``--set tokens.cells=[16,16]`` screens at a quarter of the cost.

Readouts: ``vertical``: ŷ = 4∫x₂ dμ_T (the default); ``horizontal``: ŷ = 4∫x₁ dμ_T.

Writes ``out/bench/digit_pairs.json`` (PDE rows as they finish: rerunning continues) and prints a markdown
table. Run: ``python bench/digit_pairs.py`` (the screen), ``python bench/digit_pairs.py --pde --pairs 0,6``;
``--quick``: 0 vs 6 horizontal only (seconds), to ``out/bench/digit_pairs_quick.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from pathlib import Path

from mpi4py import MPI

import numpy as np

from mfpde import config as C
from mfpde.jobs.run import run_job
from mfpde.tokens.box.data import load_samples

ROOT = Path(__file__).resolve().parent.parent
READOUTS = {"vertical": ["loss.w=[0.0, 4.0]"], "horizontal": ["loss.w=[4.0, 0.0]"]}
AXIS = {"vertical": 1, "horizontal": 0}
#: the screen's heads: scalar heads θ = (a, v) in Θ = [−2, 2]² (docs/digits.md), whatever the embedded default's
SCREEN_HEADS = ['heads.family="scalar"', "heads.box=[[-2.0, 2.0], [-2.0, 2.0]]", "heads.cells=[16, 16]",
                'heads.init={kind="gaussian", mean=[0.5, 0.5], cov=[[0.1, 0.0], [0.0, 0.1]]}']
BASE = ['loss.readout="linear"', "loss.b=0.0", "data.split=0.8", "output.fields=false", "output.plots=false",
        "output.checkpoint_every=100000"]


def pixels_accuracy(cfg: C.Config) -> float:
    """Held-out accuracy of logistic regression on the 64 pixels, on the split of ``cfg``."""
    from sklearn.linear_model import LogisticRegression

    train, test = load_samples(cfg)
    X = [np.ravel(s.params["image"]) for s in train]
    model = LogisticRegression(max_iter=5000).fit(X, [s.target for s in train])
    return float(model.score([np.ravel(s.params["image"]) for s in test], [s.target for s in test]))


def first_order(cfg: C.Config, axis: int) -> tuple[float, float, float]:
    """(mean sign, first order, first order with ρ ∈ P(Θ)): held-out accuracies on ``cfg``'s split (module doc)."""
    from sklearn.linear_model import LogisticRegression

    from mfpde.tokens.attention import softmax_moments_direct

    j, i = np.meshgrid(np.arange(8), np.arange(8))
    pts = np.stack([(j.ravel() + 0.5) / 8, 1.0 - (i.ravel() + 0.5) / 8], axis=1) + np.asarray(cfg.data.origin)
    a_grid = np.linspace(*cfg.heads.box[0], cfg.heads.cells[0] + 1)

    def features(samples: list) -> np.ndarray:
        out = []
        for smp in samples:
            w = np.ravel(smp.params["image"]) / np.sum(smp.params["image"])
            out.append([w @ softmax_moments_direct(pts, pts, w, float(a))[1][:, axis] for a in a_grid])
        return np.array(out)

    train, test = load_samples(cfg)
    Xtr, Xte = features(train), features(test)
    ytr, yte = np.array([s.target for s in train]), np.array([s.target for s in test])
    a0 = int(np.argmin(np.abs(a_grid)))
    mean_sign = float(np.mean(np.sign(Xte[:, a0]) == yte))
    model = LogisticRegression(fit_intercept=False, C=100.0, max_iter=5000).fit(Xtr, ytr)
    scale = float(np.max(np.abs(cfg.loss.w)))  # the readout 4∫x_axis dμ
    vmax = float(np.max(np.abs(cfg.heads.box[1])))
    c = measure_fit(scale * Xtr[:, a0], scale * cfg.depth.T * Xtr, ytr, vmax)
    constrained = float(np.mean(np.sign(scale * (Xte[:, a0] + cfg.depth.T * Xte @ c)) == yte))
    return mean_sign, float(model.score(Xte, yte)), constrained


def measure_fit(b: np.ndarray, F: np.ndarray, y: np.ndarray, vmax: float) -> np.ndarray:
    """The minimiser over Σ|c| ≤ vmax of ½ mean (b + F c − y)², shape (n_a,): c = c⁺ − c⁻, c^± ≥ 0 (SLSQP).

    b, y: shape (n,); F: shape (n, n_a). The squared risk of the linearised model, the constraint of c_a = ∫ v dρ
    over a probability measure ρ on Θ with |v| ≤ vmax.
    """
    from scipy.optimize import minimize

    n, k = F.shape
    G = np.hstack([F, -F])

    def risk(z: np.ndarray) -> tuple[float, np.ndarray]:
        r = b + G @ z - y
        return 0.5 * float(r @ r) / n, G.T @ r / n

    res = minimize(risk, np.zeros(2 * k), jac=True, method="SLSQP", bounds=[(0.0, None)] * (2 * k),
                   constraints=[{"type": "ineq", "fun": lambda z: vmax - z.sum(), "jac": lambda z: -np.ones_like(z)}],
                   options={"maxiter": 1000, "ftol": 1e-12})
    if not res.success:
        raise RuntimeError(f"measure_fit: {res.message}")
    return res.x[:k] - res.x[k:]


def accuracy(overrides: list[str], config: str | None = None) -> tuple[float, float, float]:
    """(held-out accuracy at ρ₀, at the end of the run, wall seconds) of ``mfpde run [config]`` with these overrides."""
    cfg = C.load(config, overrides)
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        res = run_job(cfg, Path(tmp) / "run", comm=MPI.COMM_SELF)
    if res.status != "ok":
        raise RuntimeError(f"run failed: {overrides}")
    return float(res.history[0]["test_accuracy"]), float(res.history[-1]["test_accuracy"]), time.perf_counter() - t


def main(argv: list[str] | None = None) -> list[dict]:
    """The screen (and the PDE columns with ``--pde``) as a markdown table; returns the rows."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readouts", nargs="*", default=list(READOUTS), choices=list(READOUTS))
    parser.add_argument("--pairs", nargs="*", default=None, help="pairs as 'a,b' (default: all 45)")
    parser.add_argument("--pde", action="store_true", help="also the ρ₀ / trained columns by mfpde run")
    parser.add_argument("--steps", type=int, default=30, help="training steps of the trained column")
    parser.add_argument("--train-below", type=float, default=0.65, help="train only where ρ₀'s accuracy is ≤ this")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="further config overrides for every run (e.g. a coarser token mesh to screen)")
    parser.add_argument("--config", default=None,
                        help="the config of the PDE columns (default: the embedded default, the single-layer model; "
                             "demos/digits_deep.toml for the deep one)")
    parser.add_argument("--quick", action="store_true",
                        help="the smoke run: 0 vs 6, horizontal, to out/bench/digit_pairs_quick.json (seconds)")
    parser.add_argument("--out", default=None, help="the JSON of the rows (default out/bench/digit_pairs.json)")
    args = parser.parse_args(argv)
    if args.quick:
        args.pairs, args.readouts = args.pairs or ["0,6"], ["horizontal"]
    name = "digit_pairs_quick.json" if args.quick else "digit_pairs.json"
    args.out = args.out or str(ROOT / "out" / "bench" / name)
    pairs = [tuple(int(c) for c in p.split(",")) for p in args.pairs] if args.pairs else list(
        itertools.combinations(range(10), 2))
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [r for r in json.loads(path.read_text()) if "constrained" in r] if path.is_file() else []
    done = {(tuple(r["pair"]), r["readout"]) for r in rows}
    for (c0, c1), name in itertools.product(pairs, args.readouts):
        key = ((c0, c1), name)
        ov = [*BASE, *READOUTS[name], f"data.classes=[{c0}, {c1}]", *args.overrides]
        if key not in done:
            cfg = C.load(None, [*SCREEN_HEADS, *ov])
            ms, fo, fc = first_order(cfg, AXIS[name])
            rows.append({"pair": [c0, c1], "readout": name, "overrides": args.overrides, "pixels":
                         pixels_accuracy(cfg), "mean_sign": ms, "first_order": fo, "constrained": fc, "rho0": None,
                         "trained": None})
            done.add(key)
        row = next(r for r in rows if (tuple(r["pair"]), r["readout"]) == key)
        if args.pde and row["rho0"] is None:
            ov = [*(SCREEN_HEADS if args.config is None else []), *ov]
            row["rho0"], _, row["forward_s"] = accuracy([*ov, "training.steps=0"], args.config)
            row["pde_overrides"], row["pde_config"] = args.overrides, args.config
            if row["rho0"] <= args.train_below:
                _, row["trained"], row["train_s"] = accuracy([*ov, f"training.steps={args.steps}"], args.config)
                row["steps"] = args.steps
            print(json.dumps(row), flush=True)
        path.write_text(json.dumps(rows, indent=1))

    def fmt(x: float | None) -> str:
        return "—" if x is None else f"{x:.3f}"

    print("\n| pair | readout | pixels (logistic) | mean sign | first order | first order, ρ ∈ P(Θ) | ρ₀ | trained |")
    print("|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: -(r["constrained"] - r["mean_sign"])):
        print(f"| {r['pair'][0]} vs {r['pair'][1]} | {r['readout']} | {fmt(r['pixels'])} | {fmt(r['mean_sign'])} | "
              f"{fmt(r['first_order'])} | {fmt(r['constrained'])} | {fmt(r['rho0'])} | {fmt(r['trained'])} |")
    return rows


if __name__ == "__main__":
    main()
