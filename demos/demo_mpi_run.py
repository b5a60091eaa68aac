# # The same run on 1 and on 2 MPI ranks: how to launch it, and that the results agree
#
# This demo illustrates how to
# - run `mfpde run` under MPI (`mpiexec -n N mfpde run CONFIG`), with the `mpiexec` of the venv (the MPICH
#   that the DOLFINx wheel ships),
# - do the same from Python: `mfpde.training.run_job(cfg, out, comm=...)` takes any communicator,
# - compare two runs of one config on different rank counts, row by row.
#
# How the work is split (README, "Running under MPI"): the samples are divided between groups of ranks,
# each group transporting its samples on its own token mesh (a sub-communicator), and the first variations
# are summed with one reduction,
# $$\frac{\delta R}{\delta\rho}(\theta) = \frac1n\sum_{\text{groups } g}\;\sum_{i\in g}
#   \int_0^T\!\!\int \nabla\varphi^i_t\cdot v_\theta(x,\mu^i_t)\,d\mu^i_t\,dt \quad\text{(theory §3.1 (G))};$$
# the Θ mesh of ρ is distributed over all ranks. The arithmetic is the same on any number of ranks except the
# order of these sums and of the distributed Fokker–Planck solve, so the results agree to round-off: each
# training step's sums and solve are exact to γ_n = nu/(1 − nu) with n = 100 N_Θ (u = 2⁻⁵³, as the checks
# of `mfpde verify`), relative to the size of the quantity, and the differences add up over the steps.
#
# Run: `python3 demos/demo_mpi_run.py` launches `mpiexec -n 1` and `mpiexec -n 2` itself; or
# `mpiexec -n 2 python3 demos/demo_mpi_run.py` runs on the 2 ranks and repeats the run on rank 0 alone
# (`MPI.COMM_SELF`). `--quick` or `MFPDE_DEMO_QUICK=1`: fewer steps. Output: `out_demo_mpi_run/`.

# ## Parameters: demos/value_heads.toml with two samples (so that the samples are split between ranks)

# +
import json
import os
import subprocess
import sys
from pathlib import Path

from mpi4py import MPI

import numpy as np

from mfpde import config
from mfpde.jobs.run import run_job
from mfpde.plot_layout import spread_tick_labels

quick = "--quick" in sys.argv or os.environ.get("MFPDE_DEMO_QUICK") == "1"
comm = MPI.COMM_WORLD
here = Path(__file__).resolve().parent if "__file__" in globals() else Path("demos").resolve()
cfg_path = here / "value_heads.toml"
overrides = ["data.mean=[[0.3], [-0.5]]", "data.cov=[[[0.25]], [[0.1]]]", "data.target=[1.2, -0.4]",
             "output.every=1", "output.plots=false"] + (["training.steps=6", "tokens.cells=[60]"] if quick else [])
cfg = config.load(cfg_path, overrides)
out = Path("out_demo_mpi_run")
# -

# ## The two runs
# Serially, the demo launches the command a user types, once per rank count. Under MPI it runs on all ranks
# and again on rank 0 alone; the other ranks wait.


def launch(n: int) -> Path:
    """`mpiexec -n n mfpde run CONFIG --out DIR --set ...`, as a user types it (the venv's mpiexec)."""
    d = out / f"n{n}"
    sets = [a for o in overrides for a in ("--set", o)]
    cmd = [str(Path(sys.executable).parent / "mpiexec"), "-n", str(n), sys.executable, "-m", "mfpde", "run",
           str(cfg_path), "--out", str(d), "--quiet", *sets]
    print("$", " ".join(cmd[:3]), "mfpde run", cfg_path.name, "--out", d, "--set ...")
    subprocess.run(cmd, check=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return d


if comm.size == 1:
    dirs = [launch(1), launch(2)]
else:
    dirs = [out / "n1", out / f"n{comm.size}"]
    run_job(cfg, dirs[1], comm=comm)
    if comm.rank == 0:
        run_job(cfg, dirs[0], comm=MPI.COMM_SELF)
    comm.Barrier()

# ## Compare: every history row, and the final report

# +
if comm.rank == 0:
    reports = [json.loads((d / "report.json").read_text()) for d in dirs]
    rows = [np.genfromtxt(d / "history.csv", delimiter=",", names=True) for d in dirs]
    keys = ["risk", "free_energy", "neg_entropy", "mass_rho", "grad_norm", "kl_gibbs"]
    diff = {k: float(np.max(np.abs(rows[0][k] - rows[1][k]) / np.maximum(np.abs(rows[0][k]), 1e-300)))
            for k in keys}
    final = [np.hstack([np.ravel(rep["final"][k]) for k in ("risk", "free_energy", "rho_mean", "rho_cov")])
             for rep in reports]  # full double precision (history.csv keeps 12 digits)
    final_diff = float(np.max(np.abs(final[0] - final[1]) / np.abs(final[0])))
    n_theta = cfg.heads.cells[0] + 1
    u = np.finfo(float).eps / 2
    bound = cfg.training.steps * 100 * n_theta * u / (1 - 100 * n_theta * u)
    print(f"ranks {reports[0]['comm_size']} and {reports[1]['comm_size']}, {len(rows[0])} history rows:")
    for k in keys:
        print(f"  {k:12s} largest relative difference {diff[k]:.1e}")
    print(f"  final risk, F, mean and variance of ρ (report.json): largest relative difference {final_diff:.1e}")
    print(f"bound (steps × γ_(100 N_Θ)): {bound:.1e}; history.csv's 12 digits add 5e-12")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for r, rep in zip(rows, reports, strict=True):
        style = "o-" if rep["comm_size"] == 1 else "x--"
        ax1.plot(r["s"], r["free_energy"], style, label=f"{rep['comm_size']} rank(s)")
    ax1.set(xlabel="training time s", ylabel="free energy", title="the same run on 1 and 2 ranks")
    ax1.legend()
    ax2.semilogy([*keys, "final"], [max(d, 1e-17) for d in [*diff.values(), final_diff]], "o")
    ax2.axhline(bound, color="k", ls="--", label="round-off bound")
    ax2.set(ylabel="largest relative difference", title="1 rank against 2 ranks (1e-17: equal)")
    ax2.legend()
    spread_tick_labels(ax2)  # the keys' names overlap flat
    fig.tight_layout()
    fig.savefig(out / "mpi.png", dpi=120)
    plt.close(fig)

    # The check: every number agrees to the round-off bound, and the runs really used 1 and 2 ranks.
    assert [rep["comm_size"] for rep in reports] == [1, max(comm.size, 2)], [rep["comm_size"] for rep in reports]
    assert final_diff <= bound and max(diff.values()) <= bound + 5e-12, (final_diff, diff, bound)
# -
