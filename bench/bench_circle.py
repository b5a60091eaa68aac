"""Side by side on the circle (theory §9): mfpde's DG solver against the reference notebook's two codes.

Problem: USA, β = 5, μ_0 = (1/2π)(1 + Σ a_k cos(k(θ − φ_k))), modes 1..5 of amplitude 0.5–2·10⁻⁴ (``MODES``), t = 0.5:
W1 on the circle of μ_0.5 against a converged reference (DG2 on 512 cells; its own error bounded by Richardson
against 256 cells and, in depth, against twice its step cap).

* PDE: the cheapest mesh of a refinement (DG2) with W1 ≤ 1e-3, timed end to end.
* (a) particles as the notebook does them: N = 2·10⁴ i.i.d. from μ_0, explicit Euler, dt = 1e-4, the O(N²) numpy
  pairwise force. Timed per step (a few steps) and extrapolated to the 5000 steps; its accuracy measured with
  the same Euler steps and the exact-to-round-off Bessel-series force (O(NK), the same ODE), mean of 2 draws.
* (b) the notebook's Lax–Friedrichs scheme on 10⁴ points, dt = 0.02 dx, with the O(n²) convolution. Timed per
  step and extrapolated; its accuracy from the same scheme with an FFT convolution (the same sums).

Run: ``python bench/bench_circle.py`` (about 3 minutes on one core). Prints a table and the `uptime` load.
"""

from __future__ import annotations

import os
import time

import numpy as np

from mfpde.tokens.attention import HeadMeasure
from mfpde.tokens.circle import CircleMesh, CircleTransport
from mfpde.tokens.circle_diag import cdf_density, cdf_points, initial_density, w1_circle
from mfpde.tokens.circle_particles import dense_velocity, sample_modes, transport_particles

BETA, T = 5.0, 0.5
MODES = [[1, 2e-4, 0.0], [2, 1e-4, 1.3], [3, 1e-4, 1.0], [4, 1e-4, 2.5], [5, 5e-5, 2.0]]
M = 2**15


def load() -> str:
    return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def pde(n: int, p: int = 2, cap: float | None = None) -> tuple[np.ndarray, float]:
    t0 = time.perf_counter()
    mesh = CircleMesh(n, p)
    rep = CircleTransport(mesh, "unnormalised", max_dt=cap).solve(initial_density(mesh, "circle_modes", MODES),
                                                      HeadMeasure(np.array([BETA]), np.array([1.0])), T, 10)
    F = cdf_density(mesh, rep.mu_T, M)
    return F, time.perf_counter() - t0


def lax_friedrichs(n_points: int, conv: str, steps: int | None = None) -> tuple[np.ndarray, float, int]:
    """The notebook's scheme: X = linspace(0, 2π, n)[:-1], dt = 0.02 dx, u ← LF(u, u·(W*u))."""
    X = np.linspace(0, 2 * np.pi, n_points)[:-1]
    dx = X[1] - X[0]
    dt = 0.02 * dx
    nsteps = int(T / dt)
    W = -np.exp(BETA * np.cos(X)) * np.sin(X) * dx
    u = (1 + sum(a * np.cos(k * (X - ph)) for k, a, ph in MODES)) / (2 * np.pi)
    What = np.fft.rfft(W)
    t0 = time.perf_counter()
    for _ in range(nsteps if steps is None else steps):
        if conv == "direct":  # the notebook's conv1d of the doubled kernel: a cross-correlation, O(n²)
            DWu = np.correlate(np.concatenate([W, W]), u, mode="valid")[: len(X)]
        else:
            DWu = np.fft.irfft(What * np.conj(np.fft.rfft(u)), len(X))
        f = u * DWu
        u = 0.5 * (np.roll(u, 1) + np.roll(u, -1)) - dt / (2 * dx) * (np.roll(f, -1) - np.roll(f, 1))
    wall = time.perf_counter() - t0
    # point values at X_j: the measure Σ u_j dx δ_{X_j}
    return cdf_points(X, M, u * dx / (u * dx).sum()), wall, nsteps


def main() -> None:
    print(load())
    cap = 0.025 / 18.6  # a quarter of the default growth cap (Λ = γ_3(5) = 18.6): the reference converged in depth
    ref, t_ref = pde(512, cap=cap)
    ref_h, _ = pde(256, cap=cap)
    ref_t, _ = pde(512, cap=2 * cap)
    err_h, err_t = w1_circle(ref, ref_h) / (2**2 - 1), w1_circle(ref, ref_t) / (2**3 - 1)
    print(f"reference DG2 n=512: {t_ref:.1f} s, Richardson bounds: in h {err_h:.1e}, in depth {err_t:.1e}")
    rows = []
    for n in (16, 32, 64, 128):
        F, wall = pde(n)
        err = w1_circle(F, ref)
        print(f"PDE DG2 n={n}: W1 {err:.2e}, {wall:.3f} s ({load()})")
        if err <= 1e-3:
            rows.append(("mfpde DG2", f"n = {n}", err, wall, "measured"))
            break
    # (a) particles: timing of the dense O(N²) Euler step, accuracy from the same ODE by the Bessel series
    N, dt = 20_000, 1e-4
    th = sample_modes(N, MODES, np.random.default_rng(0))
    t0 = time.perf_counter()
    for _ in range(3):
        th = th + dt * dense_velocity(th, BETA, False)
    per_step = (time.perf_counter() - t0) / 3
    errs = [w1_circle(cdf_points(transport_particles(sample_modes(N, MODES, np.random.default_rng(s)), BETA, False,
                                                     T, int(T / dt), method="euler"), M), ref) for s in range(2)]
    rows.append(("particles (notebook)", f"N = {N}, Euler dt = 1e-4", float(np.mean(errs)),
                 per_step * T / dt, f"extrapolated from 3 steps of {per_step:.2f} s ({load()})"))
    # (b) Lax–Friedrichs, 10⁴ points
    _, wall_d, nsteps = lax_friedrichs(10_000, "direct", steps=20)
    F_lf, wall_f, _ = lax_friedrichs(10_000, "fft")
    how = f"extrapolated from 20 of {nsteps} steps ({load()}); FFT variant {wall_f:.1f} s"
    rows.append(("Lax–Friedrichs (notebook)", "10⁴ points, dt = 0.02 dx", w1_circle(F_lf, ref), wall_d / 20 * nsteps,
                 how))
    print("\n| code | resolution | W1 at t = 0.5 | wall (s) | how |\n|---|---|---|---|---|")
    for name, res, err, wall, how in rows:
        print(f"| {name} | {res} | {err:.2e} | {wall:.3g} | {how} |")
    print(load())


if __name__ == "__main__":
    main()
