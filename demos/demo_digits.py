# # Handwritten digits: the main job, each image a token measure
#
# This demo illustrates how to
# - run the main job of `mfpde run` (its embedded default: scikit-learn's 8×8 digits) from Python with
#   `mfpde.config.load` and `mfpde.training.run_job`, with `--set`-style overrides,
# - read the run's history (risk, free energy, accuracies per output step) and report,
# - read μ_T of a few images back from the run's `.bp` files with `mfpde.io.read_vtx`.
#
# Each image becomes a token measure μ₀^i on the unit square: the pixel intensities, normalised, are a
# piecewise-constant density (d = 2). Its label is a target y^i = ±1 and the prediction is the linear
# readout ŷ^i = ∫ (w·x + b) dμ_T^i of the tokens after the attention layer (theory §2). The default pair,
# 0 vs 6 with the horizontal readout, is one the untrained ρ₀ cannot separate (the mean horizontal
# position of the ink is the same); the single-layer model with value heads at a = −4 learns a shape feature
# (the attention-tilted mean against the mean). Training
# minimises the entropic free energy (theory §2, §4)
# $$F_\lambda(\rho) = \frac1n\sum_i \tfrac12(\hat y^i(\rho) - y^i)^2 + \frac{\lambda_2}{2}\int|\theta|^2 d\rho
#   + \lambda\int\rho\log\rho,$$
# by Lie splitting of the parameter Fokker–Planck equation; the class is the sign of ŷ. The single-layer
# model is linear in ρ, so F_λ is convex and the exponential-convergence theorem (theory §5.4) applies: the
# report gives its rate next to the fitted one. (`demos/digits_deep.toml` is the deep model on 6 vs 7.)
#
# Run: `python3 demos/demo_digits.py` (the default run, under a minute on one core) or
# `mpiexec -n 2 python3 demos/demo_digits.py`; `--quick` or `MFPDE_DEMO_QUICK=1` for a few images and
# steps. Output: `out_demo_digits/` (the run's `report.json`, `history.csv`, `plots/`, `fields/` and `digits.png`).

# ## Parameters: the embedded default, shrunk in quick mode

# +
import os
import sys
from pathlib import Path

from mpi4py import MPI

import numpy as np

from mfpde import config
from mfpde.io import read_vtx
from mfpde.jobs.run import run_job
from mfpde.plot_layout import legend_below

quick = "--quick" in sys.argv or os.environ.get("MFPDE_DEMO_QUICK") == "1"
comm = MPI.COMM_WORLD
overrides = ["data.split=0.0", "data.samples=8", "data.test_samples=8", "training.steps=4", "output.every=1",
             "output.checkpoint_every=4"] if quick else []
cfg = config.load(None, overrides)  # what `mfpde run --set ...` reads
out = Path("out_demo_digits")
if comm.rank == 0:
    print(f"digits {cfg.data.classes[0]} (y = −1) against {cfg.data.classes[1]} (y = +1), "
          + (f"all images, {cfg.data.split:.0%} for training" if cfg.data.split > 0 else
             f"{cfg.data.samples} training and {cfg.data.test_samples} held-out images")
          + f", {cfg.training.steps} steps of Δs = {cfg.training.ds}")
# -

# ## Training

result = run_job(cfg, out, comm=comm)
hist = result.history
s = np.array([h["s"] for h in hist])

# ## What training did

if comm.rank == 0:
    first, last = hist[0], hist[-1]
    print(f"risk {first['risk']:.4f} → {last['risk']:.4f}, free energy {first['free_energy']:.4f} → "
          f"{last['free_energy']:.4f}")
    print(f"accuracy of ρ₀: train {first['train_accuracy']:.3f}, held-out {first.get('test_accuracy', np.nan):.3f}; "
          f"trained ρ: train {last['train_accuracy']:.3f}, held-out {last.get('test_accuracy', np.nan):.3f}")
    rate = result.report["rate"]  # the reasons in full: rate["fitted_reference"], rate["theory_kind" / "theory_reason"]
    fitted = (f"fitted {rate['fitted']:.3g}" if rate["fitted"] is not None else
              "not fitted (" + ("not converged" if rate["certificate_bound"] else "F* unknown") + ")")
    theory = f"theorem {rate['theory']:.3g}" if rate["theory"] is not None else "no theorem"
    print(f"wall time {result.report['wall_s']:.1f} s; rate of F − F*: {fitted}, {theory}")

# ## Output: μ₀ and μ_T of two training images (read back from the fields), and the training curves

# +
if comm.rank == 0:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    mu = read_vtx(out / "fields" / "mu_T_train.bp")  # sample i at "time" i
    for ax, i in zip(axes[:2], (0, 1), strict=True):
        xy = mu.points[i][:, :2]
        corners = mu.cells[i][:, :4] if mu.cells[i].shape[1] >= 4 else mu.cells[i]  # quads (VTK order) or triangles
        dens = mu.values[i] if mu.cell_data else mu.values[i][mu.cells[i]].mean(axis=1)  # per cell: drawn flat
        im = ax.add_collection(PolyCollection(xy[corners], array=dens, cmap="viridis", edgecolors="face"))
        fig.colorbar(im, ax=ax, label=r"density $\mu_T$ (per cell)")
        (x0, y0), (x1, y1) = xy.min(axis=0), xy.max(axis=0)
        ax.set(aspect="equal", xlim=(x0, x1), ylim=(y0, y1), xlabel="$x_1$", ylabel="$x_2$",
               title=f"image {i}: μ_T, mass {mu.integral(i):.4f}")
    ax = axes[2]
    risk, free = [h["risk"] for h in hist], [h["free_energy"] for h in hist]
    ax.plot(s, risk, "o-", ms=3, label="risk R(ρ_s)")
    ax.plot(s, free, "s-", ms=3, label=r"free energy $F_\lambda(\rho_s)$")
    if max(risk + free) > 10 * min(risk + free) > 0:  # over a decade: a log axis
        ax.set_yscale("log")
    else:  # plain ticks (0.3776), not 3.776×10⁻¹
        ax.ticklabel_format(axis="y", style="plain", useOffset=False)
    ax2 = ax.twinx()
    ax2.plot(s, [h["train_accuracy"] for h in hist], "g--", label="train accuracy")
    if "test_accuracy" in hist[0]:
        ax2.plot(s, [h["test_accuracy"] for h in hist], "r--", label="held-out accuracy")
    ax2.set(ylabel="accuracy", ylim=(0, 1.05))
    ax.set(xlabel="training time s", ylabel="risk and free energy", title="training")
    legend_below(ax, ax2)  # below the panel: inside, the legends lay over the curves
    fig.tight_layout()
    fig.savefig(out / "digits.png", dpi=120)
    plt.close(fig)
# -

# ## Checks
# 1. The run finished, and training lowered the free energy it minimises (theory §4: dF/ds ≤ 0).
# 2. The files a user reads: ρ_s in `fields/rho.bp` has mass 1 to the run's own mass check (1e-8) at every
#    snapshot, and each μ_T lost at most `tokens.outflow_tol` of its mass through ∂Ω.

if comm.rank == 0:
    assert result.status == "ok", result.error
    assert hist[-1]["free_energy"] < hist[0]["free_energy"], "training did not lower F"
    rho = read_vtx(out / "fields" / "rho.bp")
    assert len(rho.times) == len(hist) and all(abs(rho.integral(k) - 1) <= 1e-8 for k in range(len(rho.times)))
    for f in sorted((out / "fields").glob("mu_T_*.bp")):
        mu = read_vtx(f)
        assert all(1 - cfg.tokens.outflow_tol <= mu.integral(i) <= 1 + 1e-12 for i in range(len(mu.times))), f
    for name in ("loss.png", "rho.png", "tokens.png"):
        assert (out / "plots" / name).is_file(), name
