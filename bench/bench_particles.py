"""PDE (upwind DG) against the particle method at equal accuracy, d = 1 and d = 2 Gaussian transport.

Errors against the closed form of theory §6.1 (Gaussian μ₀, heads A = aI, V = vI: Gaussians stay Gaussian, mean
and covariance by :func:`mfpde.exact.gaussian_transport`): the error of ŷ = ∫ x₁ dμ_T (readout ``mean``) and the
largest entry of the error of the covariance Σ_T. Methods, all timed in this one run on one core:

* the PDE, DG1 (and DG0 in d = 1) on a box, SSP-RK3 in depth (:class:`mfpde.tokens.box.transport.TokenTransport`);
* particles with i.i.d. tokens (what published codes do): N tokens X_j ~ μ₀, the N-token McKean–Vlasov ODE
  dX/dt = V[μ^N](X) by RK4 (:func:`mfpde.tokens.box.particles.transport_particles`, the same attention kernel; direct
  O(N²) sums in d = 2), errors averaged over 3 seeds;
* the strongest deterministic particles we have: quantile tokens in d = 1, a tensor Gauss–Hermite quadrature
  mapped by the Cholesky factor of Σ₀ in d = 2 (weighted tokens).

For each target error (1e-2, 1e-3, 1e-4) the cheapest run that reaches it; where i.i.d. particles do not reach a
target within the sizes run, the time is extrapolated from the Monte Carlo error C N^{-1/2} (C fitted) and the
cost model of the velocity sums (t ∝ N² in d = 2, ∝ N in d = 1), anchored at the largest run ("extrapolated").
Writes ``out/bench/particles.json`` and ``out/bench/particles.png`` (error against time).

Run: ``python bench/bench_particles.py [--dims 1 2]``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from mpi4py import MPI

import dolfinx.fem
import numpy as np
from numpy.polynomial.hermite_e import hermegauss
from scipy.stats import norm
from threadpoolctl import threadpool_limits

from mfpde.exact import gaussian_transport
from mfpde.fitting import fit_order
from mfpde.heads import HeadMeasure
from mfpde.mesh import box
from mfpde.tokens.box.particles import transport_particles
from mfpde.tokens.box.transport import TokenTransport

HEADS = HeadMeasure(np.array([-0.5, 0.3]), np.array([0.5, 0.25]))
T = 1.0
PROBLEMS = {
    1: {"m0": np.array([0.3]), "S0": np.array([[0.25]]), "pde": [(0, 50), (0, 200), (0, 800), (1, 25), (1, 50),
                                                                   (1, 100), (1, 200), (1, 400)],
        "iid": [100, 400, 1600, 6400], "det": [25, 50, 100, 200, 400, 800, 1600, 3200]},
    2: {"m0": np.array([0.3, -0.2]), "S0": np.array([[0.25, 0.1], [0.1, 0.2]]),
        "pde": [(1, 8), (1, 16), (1, 32), (1, 64), (1, 128)],
        "iid": [100, 200, 400, 800, 1600], "det": [3, 4, 6, 8, 12, 16, 24]},
}
TARGETS = (1e-2, 1e-3, 1e-4)


def _errors(d: int, mean: np.ndarray, cov: np.ndarray) -> tuple[float, float]:
    p = PROBLEMS[d]
    m_ex, S_ex = gaussian_transport(p["m0"], p["S0"], HEADS.abar, HEADS.bbar, T)
    return float(abs(mean[0] - m_ex[0])), float(np.abs(np.asarray(cov) - S_ex).max())


def pde(d: int, degree: int, n: int) -> dict:
    """One PDE solve on [−4, 4]^d with n cells per axis, max(n/4, 10) depth steps."""
    p = PROBLEMS[d]
    tt = TokenTransport(box(MPI.COMM_SELF, [[-4.0, 4.0]] * d, [n] * d), degree=degree)
    Sinv = np.linalg.inv(p["S0"])
    u = dolfinx.fem.Function(tt.W)

    def gauss(x: np.ndarray) -> np.ndarray:
        z = x[:d] - p["m0"][:, None]
        return np.exp(-0.5 * np.einsum("i...,ij,j...->...", z, Sinv, z))

    u.interpolate(gauss)
    u.x.array[:] /= tt.mass(u)
    t0 = time.perf_counter()
    rep = tt.solve(u, HEADS, T, max(n // 4, 10))
    t = time.perf_counter() - t0
    e_y, e_S = _errors(d, np.array(rep.mean_T), np.array(rep.cov_T))
    return {"method": f"PDE DG{degree}", "size": f"{n}^{d} cells" if d > 1 else f"{n} cells", "N": n**d,
            "time_s": t, "err_yhat": e_y, "err_cov": e_S}


def _tokens(d: int, N: int, iid: bool, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokens and weights for μ₀: i.i.d. draws, or quantiles (d = 1) / tensor Gauss–Hermite (d = 2, N per axis)."""
    p = PROBLEMS[d]
    L = np.linalg.cholesky(p["S0"])
    if iid:
        z = np.random.default_rng(seed).standard_normal((N, d))
        return p["m0"] + z @ L.T, np.full(N, 1.0 / N)
    if d == 1:
        z = norm.ppf((np.arange(N) + 0.5) / N)[:, None]
        return p["m0"] + z @ L.T, np.full(N, 1.0 / N)
    g, w = hermegauss(N)
    z = np.stack(np.meshgrid(g, g, indexing="ij"), axis=-1).reshape(-1, 2)
    ww = np.outer(w, w).ravel()
    return p["m0"] + z @ L.T, ww / ww.sum()


def particles(d: int, N: int, iid: bool, seed: int = 0, steps: int = 40) -> dict:
    """One particle run: RK4 in depth with ``steps`` steps."""
    x, w = _tokens(d, N, iid, seed)
    t0 = time.perf_counter()
    x = transport_particles(x, w, HEADS, T, steps)
    t = time.perf_counter() - t0
    mean = w @ x
    xc = x - mean
    e_y, e_S = _errors(d, mean, (xc * w[:, None]).T @ xc)
    kind = "i.i.d." if iid else ("quantile" if d == 1 else "Gauss–Hermite")
    return {"method": f"particles, {kind}", "size": f"N = {len(x)}", "N": len(x), "time_s": t, "err_yhat": e_y,
            "err_cov": e_S}


def _cheapest(rows: list[dict], method: str, key: str, tol: float) -> dict | None:
    ok = [r for r in rows if r["method"] == method and r[key] <= tol]
    return min(ok, key=lambda r: r["time_s"]) if ok else None


def _extrapolate(rows: list[dict], key: str, tol: float, d: int) -> str:
    """Time for i.i.d. particles to reach tol, from the cost and error models of the method.

    Error: Monte Carlo, err = C N^{-1/2} (theory §5.3), C fitted to the runs (seed-averaged); time: the cost
    model of the velocity sums, t ∝ N² (direct sums, d = 2) or t ∝ N (Chebyshev path, d = 1), anchored at the
    largest run. The fitted exponents are printed for comparison.
    """
    N = np.array([r["N"] for r in rows], float)
    err = np.array([r[key] for r in rows])
    C = float(np.exp(np.mean(np.log(err) + 0.5 * np.log(N))))
    n_needed = (C / tol) ** 2
    q = 2.0 if d == 2 else 1.0
    t = rows[-1]["time_s"] * (n_needed / N[-1]) ** q
    p_fit = fit_order(N, err)
    q_fit = fit_order(N, [r["time_s"] for r in rows])
    return (f"{t:.2g} s (extrapolated: N ≈ {n_needed:.1g} from err = {C:.2g} N^-1/2, t ∝ N^{q:g}; fitted "
            f"exponents {p_fit:.2f}, {q_fit:.2f})")


def run(d: int) -> dict:
    p = PROBLEMS[d]
    pde(d, 1, 8)  # JIT
    rows = [pde(d, deg, n) for deg, n in p["pde"]]
    rows += [particles(d, N, False) for N in p["det"]]
    iid = []
    for N in p["iid"]:
        runs = [particles(d, N, True, s) for s in range(3)]
        iid.append({**runs[0], "time_s": float(np.mean([r["time_s"] for r in runs])),
                    "err_yhat": float(np.mean([r["err_yhat"] for r in runs])),
                    "err_cov": float(np.mean([r["err_cov"] for r in runs]))})
    rows += iid
    methods = list(dict.fromkeys(r["method"] for r in rows))
    table = []
    for key in ("err_yhat", "err_cov"):
        for tol in TARGETS:
            cells = {}
            for m in methods:
                best = _cheapest(rows, m, key, tol)
                cells[m] = f"{best['time_s']:.3g} s ({best['size']})" if best else (
                    _extrapolate(iid, key, tol, d) if m == "particles, i.i.d." else "not reached")
            table.append({"error": key, "target": tol, **cells})
    return {"d": d, "rows": rows, "table": table, "methods": methods}


def _plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5), squeeze=False)
    for ax, res in zip(axes[0], results, strict=True):
        for m in res["methods"]:
            rs = sorted((r for r in res["rows"] if r["method"] == m), key=lambda r: r["time_s"])
            ax.loglog([r["time_s"] for r in rs], [r["err_cov"] for r in rs], "o-", label=m)
        for tol in TARGETS:
            ax.axhline(tol, color="grey", lw=0.5, ls=":")
        ax.set_xlabel("wall time of one solve [s] (one core)")
        ax.set_ylabel("max |Σ_T − Σ_T^exact| (theory §6.1)")
        ax.set_title(f"d = {res['d']}: Gaussian transport, two heads")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", nargs="*", type=int, default=[1, 2], choices=[1, 2])
    args = parser.parse_args()
    results = []
    with threadpool_limits(limits=1):
        for d in args.dims:
            res = run(d)
            results.append(res)
            print(f"\n## d = {d}\n\n| method | size | time [s] | error of ŷ | error of Σ_T |\n|---|---|---|---|---|")
            for r in res["rows"]:
                print(f"| {r['method']} | {r['size']} | {r['time_s']:.3g} | {r['err_yhat']:.1e} | {r['err_cov']:.1e} |")
            print("\n| error | ≤ | " + " | ".join(res["methods"]) + " |\n|---|---|" + "---|" * len(res["methods"]))
            for row in res["table"]:
                name = "ŷ" if row["error"] == "err_yhat" else "Σ_T"
                print(f"| {name} | {row['target']:g} | " + " | ".join(row[m] for m in res["methods"]) + " |")
    out = Path("out/bench")
    out.mkdir(parents=True, exist_ok=True)
    (out / "particles.json").write_text(json.dumps(results, indent=2, default=float))
    _plot(results, out / "particles.png")


if __name__ == "__main__":
    main()
