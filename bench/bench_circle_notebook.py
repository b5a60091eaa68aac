"""Side by side on the circle (theory §9): mfpde's DG solver against the reference notebook's two codes.

At equal W1 accuracy of μ_t at t = 0.5 (USA, β = 5), with the error and cost laws of each code fitted and
extrapolated.

Problem: μ_0 = (1/2π)(1 + Σ a_k cos(k(θ − φ_k))), five modes (``MODES`` × ``--scale``); W1 on the circle against
a converged reference (DG2 on 512 cells at a quarter of the default growth cap; its error bounded by Richardson
against 256 cells and, in depth, against twice that cap).

* PDE: DG2 on n = 16, 24, 32, ... cells; CPU time of the solve (best of 3); the first n with W1 ≤ 1e-3.
* (a) particles as the notebook does them: N i.i.d. from μ_0, explicit Euler, dt = 1e-4, the O(N²) numpy pairwise
  force. Accuracy: the same Euler steps with the Bessel-series force (the same ODE to round-off, O(NK): asserted
  against the pairwise force), mean of ``R`` draws, N = 10³..; the Euler bias alone as W1(Euler, RK4) on one
  common draw. Cost: the notebook's pairwise step timed at N = 10³..1.6·10⁴, × 5000 steps.
* (b) the notebook's Lax–Friedrichs scheme on n points, dt = 0.02 dx. Accuracy: the same scheme with an FFT
  convolution (the same sums: asserted on 5 steps); cost: the notebook's O(n²) convolution step timed, × steps.

The error laws W1 ≈ C x^q and cost laws t ≈ D x^r are fitted by :func:`mfpde.fitting.fit_power` and solved for
W1 = 1e-3: an **extrapolation** where the measured sizes do not reach 1e-3. Run from the repository root:

    python bench/bench_circle_notebook.py [--scale S] [--particles N ...] [--lf n ...]

(about 30 minutes of CPU at the defaults; ``--skip-particles``: 10). Prints a markdown table and the load average.
"""

from __future__ import annotations

import argparse
import math
import os

import numpy as np
import scipy.special
from bench_circle import cpu  # the same best-of-n CPU timer

from mfpde.fitting import PowerLaw, fit_power
from mfpde.heads import HeadMeasure
from mfpde.tokens.circle.dg import CircleMesh, CircleTransport
from mfpde.tokens.circle.diag import cdf_density, cdf_points, initial_density, w1_circle
from mfpde.tokens.circle.particles import dense_velocity, sample_modes, transport_particles

BETA, T, TARGET, DT_PART = 5.0, 0.5, 1e-3, 1e-4
MODES = [[1, 2e-4, 0.0], [2, 1e-4, 1.3], [3, 1e-4, 1.0], [4, 1e-4, 2.5], [5, 5e-5, 2.0]]
M = 3 * 2**15  # a multiple of every mesh size below (16·2^j, 24·2^j)


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def pde(modes: list[list[float]], n: int, p: int = 2, cap: float | None = None) -> np.ndarray:
    """The CDF of μ_T, DG_p on n cells (the default sub-step control unless ``cap``)."""
    mesh = CircleMesh(n, p)
    rep = CircleTransport(mesh, "unnormalised", max_dt=cap).solve(initial_density(mesh, "circle_modes", modes),
                                                                  HeadMeasure(np.array([BETA]), np.array([1.0])), T, 10)
    return cdf_density(mesh, rep.mu_T, M)


def euler_bessel(theta: np.ndarray, steps: int) -> np.ndarray:
    """``steps`` explicit Euler steps of dt = T/steps of the particle ODE, the force by its Bessel series.

    u(θ_i) = (2e^β/β) Σ_k k I_k(β)e^{−β} Im(e^{−ikθ_i} S_k), S_k = (1/N) Σ_j e^{ikθ_j}; the powers z^k of z = e^{iθ}
    by products (O(NK) per step, K the terms above 1e-17 e^β).
    """
    K = 1
    while scipy.special.ive(K, BETA) > 1e-17:
        K += 1
    k = np.arange(1, K + 1)
    c = (2.0 / BETA) * k * scipy.special.ive(k, BETA) * math.exp(BETA)
    th, dt = np.array(theta, float), T / steps
    Z = np.empty((len(th), K), complex)
    for _ in range(steps):
        Z[:, 0] = np.exp(1j * th)
        for j in range(1, K):
            np.multiply(Z[:, j - 1], Z[:, 0], out=Z[:, j])
        th += dt * ((np.conj(Z) * Z.mean(axis=0)).imag @ c)
    return th


def lax_friedrichs(modes: list[list[float]], n_points: int, conv: str, steps: int | None = None) -> np.ndarray:
    """The notebook's scheme: X = linspace(0, 2π, n)[:-1], dt = 0.02 dx, u ← LF(u, u·(W*u)).

    ``conv``: ``"direct"`` the notebook's O(n²) conv1d, Σ_k W((i+k)dx) u_k with W = −G dx, G(ψ) = e^{β cos ψ} sin ψ;
    ``"fft"`` the same sums by FFT; ``"corrected"`` Σ_k G((k−i)dx) u_k dx, the velocity of the equation. The
    notebook's index i + k (a cross-correlation where a convolution was meant) gives the velocity of the
    reflected density u(−θ): the scheme converges to another equation's solution unless μ_0 is even.

    Returns the CDF of Σ u_j dx δ_{X_j} (or, with ``steps``, the point values after that many steps).
    """
    X = np.linspace(0, 2 * np.pi, n_points)[:-1]
    dx = X[1] - X[0]
    dt = 0.02 * dx
    W = -np.exp(BETA * np.cos(X)) * np.sin(X) * dx
    u = (1 + sum(a * np.cos(k * (X - ph)) for k, a, ph in modes)) / (2 * np.pi)
    What, Khat = np.fft.rfft(W), np.conj(np.fft.rfft(-W))
    WW = np.concatenate([W, W])
    for _ in range(int(T / dt) if steps is None else steps):
        if conv == "direct":  # the notebook's conv1d of the doubled kernel: a cross-correlation, O(n²)
            DWu = np.correlate(WW, u, mode="valid")[: len(X)]
        elif conv == "fft":  # the same sums: Σ_k W((i+k)dx) u_k
            DWu = np.fft.irfft(What * np.conj(np.fft.rfft(u)), len(X))
        else:  # "corrected": the velocity of the equation, Σ_k G((k−i)dx) u_k dx
            DWu = np.fft.irfft(Khat * np.fft.rfft(u), len(X))
        f = u * DWu
        u = 0.5 * (np.roll(u, 1) + np.roll(u, -1)) - dt / (2 * dx) * (np.roll(f, -1) - np.roll(f, 1))
    if steps is not None:
        return u
    return cdf_points(X, M, u * dx / (u * dx).sum())


def lf_steps(n_points: int) -> int:
    return int(T / (0.02 * 2 * np.pi / (n_points - 1)))


def need(err: PowerLaw, cost: PowerLaw, what: str) -> str:
    """The size and time at which the fitted laws give W1 = TARGET, with their standard errors."""
    x, rel = err.solve(TARGET)
    t = cost(x)
    rel_t = math.hypot(abs(cost.q) * rel, cost.se_q * abs(math.log(x) - cost.xi_mean))
    return (f"{what} ≈ {x:.2g} (×/÷ e^{rel:.1f}), time ≈ {t:.2g} s (×/÷ e^{rel_t:.1f}) [extrapolated: W1 ∝ x^"
            f"{err.q:.2f}±{err.se_q:.2f}, time ∝ x^{cost.q:.2f}±{cost.se_q:.2f}]")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="factor on the amplitudes of MODES")
    ap.add_argument("--particles", type=int, nargs="*", default=[1000, 4000, 16000, 64000])
    ap.add_argument("--draws", type=int, default=3)
    ap.add_argument("--skip-particles", action="store_true", help="only the PDE and Lax–Friedrichs rows")
    ap.add_argument("--lf", type=int, nargs="*", default=[500, 1000, 2000, 4000, 8000, 16000])
    args = ap.parse_args()
    modes = [[k, a * args.scale, ph] for k, a, ph in MODES]
    print(load(), "amplitudes", [m[1] for m in modes], flush=True)
    cap = 0.025 / 18.6  # a quarter of the default growth cap (Λ = γ_3(5) = 18.6)
    ref = pde(modes, 512, cap=cap)
    err_h = w1_circle(ref, pde(modes, 256, cap=cap)) / (2**2 - 1)
    err_t = w1_circle(ref, pde(modes, 512, cap=2 * cap)) / (2**3 - 1)
    print(f"reference DG2 n=512: Richardson bounds in h {err_h:.1e}, in depth {err_t:.1e}", flush=True)
    rows = []
    for n in (16, 24, 32, 48, 64, 96, 128, 192, 256):
        F, t = cpu(lambda n=n: pde(modes, n), 3)
        err = w1_circle(F, ref)  # type: ignore[arg-type]
        print(f"PDE DG2 n={n}: W1 {err:.2e}, CPU {t:.3f} s", flush=True)
        if err <= TARGET:
            rows.append(("mfpde DG2", f"n = {n}", f"{err:.1e}", f"{t:.2f}", "measured"))
            t_pde = t
            break
    # (a) particles
    err_p = cost_p = None
    if not args.skip_particles:
        th = np.random.default_rng(9).uniform(0, 2 * np.pi, 2000)
        u_dense = dense_velocity(th, BETA, False)
        assert np.max(np.abs(euler_bessel(th, 1) - th - T * u_dense)) < 1e-10 * T * np.max(np.abs(u_dense))
        steps = round(T / DT_PART)
        means = []
        for N in args.particles:
            draws = [sample_modes(N, modes, np.random.default_rng(1000 * N + r)) for r in range(args.draws)]
            w = [w1_circle(cdf_points(euler_bessel(th0, steps), M), ref) for th0 in draws]
            means.append(float(np.mean(w)))
            print(f"particles N={N}: W1 {means[-1]:.2e} ± {np.std(w, ddof=1) / math.sqrt(len(w)):.1e}", flush=True)
        n_bias = min(args.particles[-1], 16000)  # the RK4 comparison uses the slower series force
        th0 = sample_modes(n_bias, modes, np.random.default_rng(5))
        bias = w1_circle(cdf_points(euler_bessel(th0, steps), M),
                         cdf_points(transport_particles(th0, BETA, False, T, 500), M))
        Ns = [1000, 2000, 4000, 8000, 16000]
        per = [cpu(lambda N=N: dense_velocity(np.random.default_rng(0).uniform(0, 6.3, N), BETA, False))[1] for N in Ns]
        cost_p = fit_power(Ns, [p * steps for p in per])
        err_p = fit_power(args.particles, means)
        print(f"particles: Euler bias W1(Euler dt=1e-4, RK4) = {bias:.1e} at N = {n_bias}; dense step "
              f"{', '.join(f'{p:.3f}' for p in per)} s at N = {Ns}", flush=True)
        i20 = int(np.argmin(np.abs(np.array(args.particles) - 20000)))
        N20 = args.particles[i20]
        rows.append(("particles (notebook)", f"N = {N20}, Euler dt = 1e-4", f"{means[i20]:.1e}",
                     f"{cost_p(N20):.3g}", f"pairwise step timed at N ≤ 1.6·10⁴, × {steps} steps (fit r = "
                     f"{cost_p.q:.2f}); W1 of the Bessel-force Euler, {args.draws} draws"))
        rows.append(("particles (notebook)", "W1 = 1e-3", "1e-3", "", need(err_p, cost_p, "N")
                     + (f"; Euler bias {bias:.1e} > 1e-3: unreachable at dt = 1e-4" if bias > TARGET else "")))
    # (b) Lax–Friedrichs
    d, f = lax_friedrichs(modes, 2000, "direct", 5), lax_friedrichs(modes, 2000, "fft", 5)
    assert np.max(np.abs(d - f)) < 1e-12 * np.max(np.abs(f))
    errs, errs_c, costs = [], [], []
    for n in args.lf:
        errs.append(w1_circle(lax_friedrichs(modes, n, "fft"), ref))  # type: ignore[arg-type]
        errs_c.append(w1_circle(lax_friedrichs(modes, n, "corrected"), ref))  # type: ignore[arg-type]
        s = 20 if n <= 8000 else 4
        costs.append(cpu(lambda n=n, s=s: lax_friedrichs(modes, n, "direct", s))[1] / s * lf_steps(n))
        print(f"Lax–Friedrichs n={n}: W1 {errs[-1]:.2e} (corrected convolution {errs_c[-1]:.2e}), notebook CPU "
              f"{costs[-1]:.3g} s ({lf_steps(n)} steps, extrapolated from {s})", flush=True)
    err_l, err_lc, cost_l = fit_power(args.lf, errs), fit_power(args.lf, errs_c), fit_power(args.lf, costs)
    i = args.lf.index(10_000) if 10_000 in args.lf else -1
    rows.append(("Lax–Friedrichs (notebook)", f"n = {args.lf[i]}, dt = 0.02 dx", f"{errs[i]:.1e}",
                 f"{costs[i]:.3g}", f"O(n²) step timed, × {lf_steps(args.lf[i])} steps; W1 of the FFT variant"))
    rows.append(("Lax–Friedrichs, convolution corrected", f"n = {args.lf[i]}", f"{errs_c[i]:.1e}", f"{costs[i]:.3g}",
                 "the same cost"))
    rows.append(("Lax–Friedrichs, convolution corrected", "W1 = 1e-3", "1e-3", "", need(err_lc, cost_l, "n")))
    print("\n| code | resolution | W1 at t = 0.5 | CPU (s) | how |\n|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    laws = [("Lax–Friedrichs (notebook)", err_l, cost_l), ("Lax–Friedrichs, corrected", err_lc, cost_l)]
    if err_p is not None and cost_p is not None:
        laws.insert(0, ("particles", err_p, cost_p))
    for name, e, c in laws:
        print(f"{name}: W1 ∝ x^{e.q:.3f}±{e.se_q:.3f}, CPU ∝ x^{c.q:.3f}±{c.se_q:.3f}", end="; ")
        if e.q < -3 * e.se_q:
            print(f"speed-up at W1 = 1e-3 (extrapolated): {c(e.solve(TARGET)[0]) / t_pde:.2g}×")
        else:
            print("no significant decrease of W1 over the measured sizes: 1e-3 not extrapolable from them")
    print(load())


if __name__ == "__main__":
    main()
