"""Benchmark: the token transport solver (upwind DG / SSP-RK3) and the softmax velocity kernel, on one core.

Prints markdown tables:

1. wall time per depth step against N_x (token cells; d = 1 and d = 2 boxes, DG1, tensor kernel path) at a fixed
   Gaussian ρ on a 48×48 Θ mesh, with the SSP-RK3 sub-steps per depth step and the fitted exponents t ∝ N_x^α
   (per depth step and per sub-step);
2. wall time per depth step against N_θ (Θ dofs of :class:`mfpde.params.theta.ThetaSpace` on [-2, 2]² with a Gaussian ρ,
   scalar family), d = 1, 400 cells, with the number N_a of distinct a values that the kernel pays for and the
   time of the Θ reduction (``ThetaSpace.head_measure``);
3. throughput of the velocity kernel in "kernel entries" N_a N_x N_y per second on the direct and the tensor
   paths, against the machine's plain ``np.exp`` throughput (values per second on arrays of the same size, capped
   at 2^22 values);
4. the two reference solves: d = 1 (400 cells, 100 depth steps, 48×48 Θ mesh) and d = 2 (64×64 cells, 100 depth
   steps, 32×32 Θ mesh), scalar family, Gaussian ρ, DG1, in seconds.

The FFCx JIT is warmed first; BLAS is limited to one thread (threadpoolctl). Run serially:
``python bench/bench_transport.py`` (about two minutes, most of it the d = 1 reference solve).
"""

from __future__ import annotations

import argparse
import time

from mpi4py import MPI

import dolfinx.fem
import numpy as np
from threadpoolctl import threadpool_limits

from mfpde.fitting import fit_order
from mfpde.heads import HeadMeasure
from mfpde.mesh import box
from mfpde.params.family import ScalarHeads
from mfpde.params.theta import ThetaSpace
from mfpde.tokens.attention import TensorGrid, velocity, velocity_vjp
from mfpde.tokens.box.data import Sample, fill_density
from mfpde.tokens.box.interpolated import InterpolatedSoftmax
from mfpde.tokens.box.separable import TensorSoftmax, velocity_tensor
from mfpde.tokens.box.transport import TokenTransport

COMM = MPI.COMM_SELF  # one core
RHO_MEAN, RHO_COV = [0.5, 1.0], [[0.01, 0.0], [0.0, 0.01]]  # the default head Gaussian (config.Heads)


def _heads(n_theta: int) -> tuple[HeadMeasure, float]:
    """Reduced heads of a Gaussian ρ on an n×n Θ mesh of [-2, 2]², and the time of the reduction."""
    th = ThetaSpace(box(COMM, [[-2.0, 2.0], [-2.0, 2.0]], [n_theta, n_theta], "triangle"), ScalarHeads())
    rho = th.gaussian(RHO_MEAN, RHO_COV)
    t0 = time.perf_counter()
    hm = th.head_measure(rho)
    return hm, time.perf_counter() - t0


def _solver(d: int, cells: int, degree: int = 1) -> tuple[TokenTransport, dolfinx.fem.Function]:
    tt = TokenTransport(box(COMM, [[-4.0, 4.0]] * d, [cells] * d), degree)
    u = dolfinx.fem.Function(tt.W)
    m0, S0 = [0.3, -0.2][:d], (np.array([[0.25, 0.05], [0.05, 0.2]]))[:d, :d]
    fill_density(Sample("gaussian", {"mean": np.array(m0), "cov": S0}, 0.0), u, tt.mass)
    return tt, u


def _time_steps(tt: TokenTransport, u: dolfinx.fem.Function, hm: HeadMeasure, steps: int, dt: float = 0.01,
                repeat: int = 2) -> tuple[float, float]:
    """(seconds per depth step, SSP-RK3 sub-steps per depth step) for ``steps`` steps of size dt from u.

    Best of ``repeat`` runs from the same initial state; u is left unchanged.
    """
    start = u.x.array.copy()
    best = np.inf
    for _ in range(repeat):
        u.x.array[:] = start
        t0 = time.perf_counter()
        rep = tt.solve(u, hm, steps * dt, steps)
        best = min(best, time.perf_counter() - t0)
    u.x.array[:] = start
    return best / steps, rep.substeps / steps


def _fit(n, t) -> float:
    return float(fit_order(n, t))


def _best(f, repeat: int = 3) -> float:
    best = np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best


def _exp_rate(n_values: int) -> float:
    """np.exp values per second on an array of min(n_values, 2^22) doubles."""
    z = np.random.default_rng(0).uniform(-5, 0, size=min(n_values, 1 << 22))
    out = np.empty_like(z)
    return z.size / _best(lambda: np.exp(z, out=out), 5)


def warm_up() -> None:
    hm, _ = _heads(4)
    for d in (1, 2):
        for k in (0, 1):
            tt, u = _solver(d, 4, k)
            tt.solve(u, hm, 0.01, 1)
    ThetaSpace(box(COMM, [[-2.0, 2.0], [-2.0, 2.0]], [2, 2], "triangle"), ScalarHeads())


def table_nx(quick: bool) -> None:
    hm, _ = _heads(48)
    print(f"\n### Time per depth step vs N_x (DG1, Δt = 0.01, Gaussian ρ on 48×48 Θ: N_a = {len(hm.a)})\n")
    print("| d | cells | N_x (dofs) | sub-steps/step | s/step | s/sub-step |")
    print("|---|---|---|---|---|---|")
    for d, sizes in ((1, (100, 200, 400, 800)), (2, (16, 32, 64, 128))):
        if quick:
            sizes = sizes[:3]
        rows = []
        for n in sizes:
            tt, u = _solver(d, n)
            t, sub = _time_steps(tt, u, hm, 3 if n < 800 else 1)
            nx = tt.W.dofmap.index_map.size_global
            rows.append((nx, t, t / sub))
            print(f"| {d} | {'×'.join([str(n)] * d)} | {nx} | {sub:.1f} | {t:.4f} | {t / sub:.4f} |")
        nx, t, ts = map(np.array, zip(*rows, strict=True))
        print(f"| {d} | fit | t ∝ N_x^α | | α = {_fit(nx, t):.2f} | α = {_fit(nx, ts):.2f} |")


def table_ntheta(quick: bool) -> None:
    print("\n### Time per depth step vs N_θ (d = 1, 400 cells, DG1, Δt = 0.01, scalar family, Gaussian ρ)\n")
    print("| Θ cells | N_θ (dofs) | N_a | N_a with c_k > 1e-16 Σc | head_measure s | s/step | s/sub-step |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    tt, u0 = _solver(1, 400)
    for n in (8, 16, 32, 64) if quick else (8, 16, 32, 64, 128):
        hm, t_red = _heads(n)
        t, sub = _time_steps(tt, u0, hm, 3)
        eff = int(np.sum(np.abs(hm.c) > 1e-16 * np.abs(hm.c).sum()))
        nth = (n + 1) ** 2
        rows.append((nth, t, t / sub))
        print(f"| {n}×{n} | {nth} | {len(hm.a)} | {eff} | {t_red:.4f} | {t:.4f} | {t / sub:.4f} |")
    nth, t, ts = map(np.array, zip(*rows, strict=True))
    print(f"| fit | t ∝ N_θ^α | | | | α = {_fit(nth, t):.2f} | α = {_fit(nth, ts):.2f} |")


def table_kernel() -> None:
    print("\n### Velocity kernel throughput (N_a = 8 heads; entries = N_a N_x N_y)\n")
    print("| path | d | N_x | N_y | s | kernel entries/s | np.exp values/s | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(1)
    hm = HeadMeasure(np.linspace(-1.0, 1.0, 8), np.full(8, 0.125))
    for d, n in ((1, 3000), (2, 2000)):
        L = 3.0 if d == 1 else 1.5  # d = 2: a box where the Chebyshev grid path converges (degree 32)
        x = rng.uniform(-L, L, size=(n, d))
        y = rng.uniform(-L, L, size=(n, d))
        w = rng.uniform(0, 1, size=n)
        t = _best(lambda x=x, y=y, w=w: velocity(x, y, w, hm))
        ent = len(hm.a) * n * n
        er = _exp_rate(n * n)
        print(f"| direct | {d} | {n} | {n} | {t:.3f} | {ent / t:.3g} | {er:.3g} | {ent / t / er:.2f} |")
        if d == 2:  # the same sums by the Chebyshev grid of the box (tokens/interpolated.py)
            box_ = np.array([[-1.5, 1.5], [-1.5, 1.5]])
            S = InterpolatedSoftmax(box_, y, w, hm.a, 4 * n)
            assert S.ok, "the grid path declined the benchmark's case"
            t = _best(lambda x=x, y=y, w=w, b=box_, n=n: InterpolatedSoftmax(b, y, w, hm.a, 4 * n).velocity(x, hm.c))
            print(f"| Chebyshev grid (n = {S.n}) | {d} | {n} | {n} | {t:.3f} | {ent / t:.3g} | {er:.3g} | "
                  f"{ent / t / er:.2f} |")
            xi = rng.standard_normal((n, d))
            t = _best(lambda x=x, y=y, w=w, xi=xi: velocity_vjp(x, y, w, hm, xi))
            print(f"| direct VJP | {d} | {n} | {n} | {t:.3f} | {ent / t:.3g} | {er:.3g} | {ent / t / er:.2f} |")
            t = _best(lambda S=S, x=x, xi=xi: S.vjp(S.grid_cotangent(x, xi), hm.c))
            print(f"| Chebyshev grid VJP | {d} | {n} | {n} | {t:.4f} | {ent / t:.3g} | {er:.3g} | "
                  f"{ent / t / er:.2f} |")
    for d, m in ((1, 3001), (2, 129), (2, 257)):
        ax = np.linspace(-3, 3, m)
        g = TensorGrid((ax,) * d)
        W = rng.uniform(0, 1, size=g.shape)
        t = _best(lambda g=g, W=W: velocity_tensor(g, g, W, hm))
        npts = m**d
        ent = len(hm.a) * npts * npts
        er = _exp_rate(npts * npts)
        print(f"| tensor | {d} | {npts} | {npts} | {t:.4f} | {ent / t:.3g} | {er:.3g} | {ent / t / er:.2f} |")
        if d == 2:
            ts = TensorSoftmax(g, g, W, hm.a)
            Xi = rng.standard_normal((*g.shape, d))
            t = _best(lambda ts=ts, Xi=Xi: ts.vjp(hm.c, Xi))
            print(f"| tensor VJP | {d} | {npts} | {npts} | {t:.4f} | {ent / t:.3g} | {er:.3g} | "
                  f"{ent / t / er:.2f} |")


def table_solves() -> None:
    print("\n### Reference solves (one core, DG1, T = 1, 100 depth steps, scalar family, Gaussian ρ)\n")
    print("| case | N_x (dofs) | Θ mesh | N_a | sub-steps | setup s | solve s | mass error | ŷ (mean) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for d, cells, nth in ((1, 400, 48), (2, 64, 32)):
        t0 = time.perf_counter()
        hm, _ = _heads(nth)
        tt, u = _solver(d, cells)
        t_setup = time.perf_counter() - t0
        t0 = time.perf_counter()
        rep = tt.solve(u, hm, 1.0, 100, g=lambda x: x[:, 0])
        t_solve = time.perf_counter() - t0
        print(f"| d = {d}, {'×'.join([str(cells)] * d)} cells | {tt.W.dofmap.index_map.size_global} | "
              f"{nth}×{nth} | {len(hm.a)} | {rep.substeps} | {t_setup:.2f} | {t_solve:.2f} | "
              f"{rep.mass_error:.1e} | {rep.yhat:.6f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer sizes")
    args = p.parse_args()
    t0 = time.perf_counter()
    with threadpool_limits(limits=1):
        warm_up()
        print(f"## mfpde token transport benchmark (numpy {np.__version__}, 1 core, FFCx JIT warmed)")
        table_nx(args.quick)
        table_ntheta(args.quick)
        table_kernel()
        table_solves()
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
