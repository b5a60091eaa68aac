# # Tokens on the circle: clusters form at the fastest linear mode
#
# This demo illustrates how to
# - run `mfpde transport` on the circle (`demos/circle.toml`: β = 5, unnormalised attention, 8 modes of
#   amplitude 1e-4 with fixed phases, DG2 on 256 cells),
# - read the report's Fourier modes and clusters, and check them against the linear theory of theory §9:
#   mode k grows like e^{γ_k t}, γ_k = k² I_k(β)/β, so k_max(5) = 3 wins and three clusters form,
#   at the angles (2πj − arg μ̂_3(0))/3 the initial phase of mode 3 predicts (the dashed lines of the notebook
#   that accompanies Bruno–Pasqualotto–Agazzi, ICLR 2025).
#
# Run: `python3 demos/demo_circle.py` (`--quick` or `MFPDE_DEMO_QUICK=1`: DG1 on 128 cells, depth 1.2).
# Output: `out_demo_circle/circle.png` (|μ̂_k(t)| against t, with the predicted slopes) and the transport's DIR.

# +
import os
import sys
from pathlib import Path

from mpi4py import MPI

import numpy as np
import scipy.special

from mfpde import config
from mfpde.jobs.transport import transport_job

quick = "--quick" in sys.argv or os.environ.get("MFPDE_DEMO_QUICK") == "1"
here = Path(__file__).resolve().parent
over = ["tokens.cells=[128]", "tokens.degree=1", "depth.T=1.2", "depth.steps=60"] if quick else []
cfg = config.load(here / "circle.toml", over + ["output.fields=false"])
out = Path("out_demo_circle")
rep = transport_job(cfg, out / "transport", MPI.COMM_WORLD)["samples"][0]
# -

# ## Against the linear theory

# +
beta = 5.0
k = np.arange(1, 33)
gamma = k**2 * scipy.special.iv(k, beta) / beta
t, amp = np.array(rep["fourier"]["t"]), np.array(rep["fourier"]["abs"])
early = np.flatnonzero(amp[:, 2] < 1e-2)  # the linear regime: |μ̂_3| < 1e-2
slope3 = float(np.polyfit(t[early], np.log(amp[early, 2]), 1)[0])
modes = cfg.data.modes
phase3 = [ph for kk, a, ph in modes if kk == 3][0]
pred = np.sort(((2 * np.pi * np.arange(3) + 3 * phase3) / 3) % (2 * np.pi))  # maxima of cos(3(θ − φ))
got = np.sort(np.array(rep["cluster_angles_T"]))
if MPI.COMM_WORLD.rank == 0:
    print(f"|μ̂_3| grows at {slope3:.3f} in the linear regime (γ_3 = {gamma[2]:.3f}); k_max = {k[np.argmax(gamma)]}")
    print(f"clusters at t = {t[-1]:g}: {rep['clusters_T']} at {np.round(got, 3).tolist()}, mode 3's maxima at "
          f"{np.round(pred, 3).tolist()}; mass error {rep['mass_error']:.1e}, min {rep['min_density']:.1e}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for j in range(6):
        (line,) = ax.semilogy(t, amp[:, j], label=f"k = {j + 1}")
        ax.semilogy(t, amp[0, j] * np.exp(gamma[j] * t), ":", color=line.get_color())
    ax.set(xlabel="depth t", ylabel=r"Fourier mode $|\hat\mu_k(t)|$", ylim=(1e-6, 1),
           title=r"β = 5: Fourier modes (dotted: linear theory $e^{\gamma_k t}$, $\gamma_k = k^2 I_k(\beta)/\beta$)")
    ax.title.set_fontsize(10)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(out / "circle.png", dpi=100)
# -

# ## Checks: the rate of mode 3 (the RK3 and DG errors are < 1e-3 here), 3 clusters, at mode 3's maxima
# (within the drift the other modes cause: 0.15 rad), mass conserved to round-off.

assert abs(slope3 / gamma[2] - 1) < 1e-2, slope3
assert rep["clusters_T"] == 3 == int(k[np.argmax(gamma)])
dist = np.abs((got[:, None] - pred[None, :] + np.pi) % (2 * np.pi) - np.pi).min(axis=1)
assert dist.max() < 0.15, dist
assert rep["mass_error"] < 1e-11 and rep["min_density"] > -1e-12
