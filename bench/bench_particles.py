"""PDE (upwind DG) against the particle method at equal accuracy, d = 1 Gaussian transport.

The error is |Σ_T − Σ_T^exact| (covariance of μ_T, theory §6.1 closed form) for two heads. The particle
method is the N-token McKean–Vlasov ODE dX/dt = V(X) with RK4 in depth (direct O(N²) attention), with
i.i.d. tokens (Monte Carlo, averaged over seeds) and with deterministic quantile tokens. Prints a
markdown table: time to reach each accuracy. Run: ``.venv/bin/python bench/bench_particles.py``.
"""

from __future__ import annotations

import time

from mpi4py import MPI

import dolfinx.fem
import numpy as np
from scipy.stats import norm

from mfpde.exact import gaussian_transport
from mfpde.mesh import box
from mfpde.tokens.attention import HeadMeasure
from mfpde.tokens.particles import transport_particles
from mfpde.tokens.transport import TokenTransport

HEADS = HeadMeasure(np.array([-0.5, 0.3]), np.array([0.5, 0.25]))
M0, S0, T = 0.3, 0.25, 1.0
EXACT = gaussian_transport(M0, S0, HEADS.abar, HEADS.bbar, T)[1][0, 0]


def pde(n: int, degree: int) -> tuple[float, float]:
    tt = TokenTransport(box(MPI.COMM_SELF, [[-4.0, 4.0]], [n]), degree=degree)
    u = dolfinx.fem.Function(tt.W)
    u.interpolate(lambda x: np.exp(-((x[0] - M0) ** 2) / (2 * S0)))
    u.x.array[:] /= tt.mass(u)
    t0 = time.perf_counter()
    rep = tt.solve(u, HEADS, T, max(n // 4, 10))
    return time.perf_counter() - t0, abs(rep.cov_T[0][0] - EXACT)


def particles(N: int, iid: bool, seed: int = 0, steps: int = 40) -> tuple[float, float]:
    if iid:
        x = np.random.default_rng(seed).normal(M0, np.sqrt(S0), N)[:, None]
    else:
        x = norm.ppf((np.arange(N) + 0.5) / N, loc=M0, scale=np.sqrt(S0))[:, None]
    t0 = time.perf_counter()
    x = transport_particles(x, np.full(N, 1.0 / N), HEADS, T, steps)
    return time.perf_counter() - t0, abs(x[:, 0].var() - EXACT)


if __name__ == "__main__":
    pde(20, 1)  # warm the JIT
    rows = []
    for n in (50, 100, 200, 400, 800):
        for deg in (0, 1):
            t, e = pde(n, deg)
            rows.append((f"PDE DG{deg}, {n} cells", t, e))
    for N in (100, 400, 1600, 3200):
        ts, es = zip(*(particles(N, True, s) for s in range(3)), strict=True)
        rows.append((f"particles iid, N = {N} (mean of 3 seeds)", float(np.mean(ts)), float(np.mean(es))))
        t, e = particles(N, False)
        rows.append((f"particles quantile, N = {N}", t, e))
    print("| method | time [s] | error of Σ_T |")
    print("|---|---|---|")
    for name, t, e in rows:
        print(f"| {name} | {t:.3f} | {e:.2e} |")
    for tol in (1e-2, 1e-3, 1e-4):
        best = {}
        for name, t, e in rows:
            kind = name.split(",")[0]
            if e <= tol and t < best.get(kind, (np.inf,))[0]:
                best[kind] = (t, name)
        print(f"\nerror ≤ {tol:g}: " + "; ".join(f"{k}: {v[0]:.3f} s ({v[1]})" for k, v in sorted(best.items())))
