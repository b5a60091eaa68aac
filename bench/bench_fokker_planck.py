"""Benchmark: wall time per step of the parameter Fokker–Planck solver vs the number of Θ dofs (p = 2).

Θ = [-2, 2]², structured right-triangle meshes with n × n cells (n = 32, 64, 128, 256 by default), λ > 0
(backward Euler, MUMPS LU) with a potential Φ that changes every step, so each step pays the EAFE matrix
values (numpy), the PETSc Mat update and a numeric LU factorisation + solve ("new Φ"). Also times a step with
Φ and Δs unchanged (factorisation reused: triangular solves only) and the λ = 0 explicit upwind path per
sub-step. Prints a markdown table and the fitted exponent t ∝ N^α.

Run: ``python bench/bench_fokker_planck.py [--sizes 32 64 128 256] [--steps 5]`` (about a minute serially;
``mpiexec -n 2 python bench/bench_fokker_planck.py`` also works).
"""

from __future__ import annotations

import argparse
import time

from mpi4py import MPI

import numpy as np
from dolfinx import fem, mesh

from mfpde.fitting import fit_order
from mfpde.params.densities import gaussian_density
from mfpde.params.fokker_planck import ParameterFokkerPlanck


def _time_size(n: int, steps: int, lam: float) -> dict[str, float]:
    comm = MPI.COMM_WORLD
    msh = mesh.create_rectangle(comm, [[-2.0, -2.0], [2.0, 2.0]], [n, n])
    V = fem.functionspace(msh, ("Lagrange", 1))
    ndofs = V.dofmap.index_map.size_global
    phi = fem.Function(V)
    rho = gaussian_density(V, [0.3, -0.2], 0.2 * np.eye(2))

    def set_phi(k: int) -> None:
        a = 0.1 * np.sin(0.7 * k)
        phi.interpolate(lambda x: (x[0] ** 2 - 1) ** 2 / 4 + x[1] ** 2 / 2 + a * x[0] * x[1])

    comm.Barrier()
    t0 = time.perf_counter()
    fp = ParameterFokkerPlanck(V, lam)
    comm.Barrier()
    t_setup = time.perf_counter() - t0

    set_phi(0)
    fp.step(rho, phi, 0.01)  # warm-up (first numeric factorisation)
    times = []
    for k in range(1, steps + 1):
        set_phi(k)  # Φ changes: matrix values and LU refactorisation every step
        comm.Barrier()
        t0 = time.perf_counter()
        info = fp.step(rho, phi, 0.01)
        comm.Barrier()
        times.append(time.perf_counter() - t0)
    assert abs(info.mass - 1.0) < 1e-10 and info.min_rho >= 0.0
    cached = []
    for _ in range(steps):  # Φ and Δs unchanged: the factorisation is reused, only the triangular solves
        comm.Barrier()
        t0 = time.perf_counter()
        fp.step(rho, phi, 0.01)
        comm.Barrier()
        cached.append(time.perf_counter() - t0)

    # λ = 0: explicit upwind, time per sub-step
    fp0 = ParameterFokkerPlanck(V, 0.0)
    cfl = fp0.stability_limit(phi)
    comm.Barrier()
    t0 = time.perf_counter()
    info0 = fp0.step(rho, phi, 10.0 * cfl)
    comm.Barrier()
    t_sub = (time.perf_counter() - t0) / info0.substeps
    return {
        "ndofs": ndofs,
        "setup": t_setup,
        "step": float(np.median(times)),
        "cached": float(np.median(cached)),
        "substep0": t_sub,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lam", type=float, default=0.1)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    _time_size(8, 1, args.lam)  # JIT warm-up of the forms
    rows = [(n, _time_size(n, args.steps, args.lam)) for n in args.sizes]
    if comm.rank == 0:
        print(f"Parameter Fokker–Planck, p = 2, λ = {args.lam}, {comm.size} rank(s), median of {args.steps} steps\n")
        print("| cells | Θ dofs | setup [s] | step, new Φ [s] | µs/dof | step, same Φ [s] | λ=0 sub-step [ms] |")
        print("|---|---|---|---|---|---|---|")
        for n, r in rows:
            print(
                f"| {n}×{n} | {r['ndofs']} | {r['setup']:.3f} | {r['step']:.4f} | "
                f"{1e6 * r['step'] / r['ndofs']:.2f} | {r['cached']:.4f} | {1e3 * r['substep0']:.3f} |"
            )
        if len(rows) >= 2:
            nd = np.array([r["ndofs"] for _, r in rows], dtype=float)
            a_step = fit_order(nd, [r["step"] for _, r in rows])
            a_sub = fit_order(nd, [r["substep0"] for _, r in rows])
            print(f"\nfitted exponent t_step ∝ N^α: α = {a_step:.2f} (implicit), {a_sub:.2f} (λ = 0 sub-step)")


if __name__ == "__main__":
    main()
