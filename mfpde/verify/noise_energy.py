"""The free energy along noisy transport on the circle, and its end state, against an independent stationary solve.

Noisy tokens (USA, one head (β, K), noise τ; theory §10) follow the gradient flow of
E(μ) = τ ∫ μ log μ − (K/2β) ∬ e^{β cos(θ−φ)} dμ dμ, whose stationary states solve

    μ = p(μ) := exp(κ G∗μ) / ∫ exp(κ G∗μ),   κ = K/(τβ),   G∗μ(θ) = ∫ e^{β cos(θ−φ)} μ(φ) dφ

(the convention of :mod:`mfpde.tokens.circle.stationary`). The reference here, :func:`stationary_fixed_point`,
iterates this map (Picard) on N equispaced points with numpy's FFT for the circular convolution: it shares no
code with mfpde's Newton or its DG solver. About a stable state the iteration's derivative κ(diag p − h p pᵀ)A has
its spectrum in [0, 1) (A and the covariance are positive semi-definite; stability puts the top below 1), so
Picard converges linearly at the measured rate ρ; about the uniform state ρ = κ I_1(β) = K/K_c exactly, which
makes the reference reproduce K_c = τβ/I_1(β) (tests/tokens/test_noise.py). Trapezoidal rule on an analytic
periodic integrand: spectral, the N = 512 state changes by < 1e-14 from N = 256.

* ``noisy_free_energy``: β = 2, K = 2, τ = 1 (K_c = 1.2574: above it, below β*, one stable one-cluster state),
  μ_0 = (1 + 0.3 cos θ)/2π, DG0 with the Scharfetter–Gummel flux (:mod:`mfpde.tokens.circle.noise`) to depth 30
  (the approach to the stationary state has rate ≈ 1.0: there |μ̂₁| is within 3e-13 of its value at depth 40 on
  32 cells, far below the discretisation errors measured), E at 60 outputs, on
  n = 32, 64, 128 cells (quick: 16, 32).

  - The state. The SG flux is consistent to O(h²) at the edges (the edge velocity is a midpoint rule of the
    kernel's derivative, the flux exact for a constant velocity), and SSP-RK3's stationary states are those of the
    semi-discrete scheme (no Δt in them): the long-time |μ̂₁| must converge to the reference's at order p = 2;
    threshold |q − 2| ≤ 0.3 (the band of a two- or three-mesh fit whose finest pair is asymptotic; measured
    1.92 on 16/32, 2.00 on 32/64/128).
  - The free energy at the end. E is stationary at its minimiser, so an O(h²) state error is an O(h⁴) error of E
    (the midpoint rule itself is spectral for periodic integrands): |E_h(μ_T) − E(μ_ref)| must fall at order
    ≥ 3.5 (measured 4.0–4.5). A wrong factor in E leaves an O(1) error.
  - Decrease. The semi-discrete scheme dissipates E_h exactly only when the edge velocity is the difference
    quotient of the cell potentials; here it differs by O(h²), so E_h is a Lyapunov function up to that defect:
    the scheme's stationary state lies O(h²) from E_h's minimiser and E_h may rise by at most its excess there,
    O(h⁴), near the end of the run (measured: the largest rise above the running minimum 5.5e-5, 3.3e-6,
    2.1e-7, 1.3e-8 at n = 16..128, order 4). Threshold on the finest mesh: rise ≤ |E_h(μ_T) − E(μ_ref)| (the excess)
    plus the round-off of two evaluations of E, 2 n ε (|τ ∫ μ log μ| + |interaction|); and the rise's fitted
    order ≥ 3.5 (or every rise below round-off).
  - Newton. mfpde's Newton (the continuation's solver) at N = 127, K fixed, from the reference's state, in both
    discretisations: :class:`~mfpde.tokens.circle.spectral.CircleSpectral` (the default; from the reference's
    cosine coefficients, its state the Gibbs density of its coefficients at the N points) and
    :class:`~mfpde.tokens.circle.stationary.CircleStationary` (the collocation): its residual under the reference's
    own map, ‖μ − p(μ)‖_∞, at most the solver's tolerance 1e-12 plus the round-off of one map,
    4 N ε max μ (1 + κ max G∗μ); the spectral tolerance is on the coefficients' residual r = c − T p(c), which
    moves the Gibbs exponent by at most κ‖λ‖₂‖r‖₂ and p by twice that relative: 1e-12 · 2κ‖λ‖₂ max μ there. Its
    state within (that residual bound)/(1 − ρ) of the reference iterated at the same N (the map's contraction
    turns a residual into a distance).
"""

from __future__ import annotations

import math
import time

import numpy as np
import numpy.typing as npt

from mfpde.fitting import fit_order
from mfpde.verify.registry import Outcome, Series, register

__all__ = ["energy_rise", "reference_free_energy", "stationary_fixed_point"]

Array = npt.NDArray[np.float64]
EPS = float(np.finfo(float).eps)
BETA, COUPLING, NOISE, DEPTH, OUTPUTS, AMPLITUDE = 2.0, 2.0, 1.0, 30.0, 60, 0.3
#: The reference's points, the Newton's collocation points, SNES's absolute tolerance (mfpde.continuation.Newton).
REF_POINTS, NEWTON_POINTS, SNES_ATOL = 512, 127, 1e-12
BUDGET_S = 240.0
#: The expected orders in h: the state's (p), E's at the end and E's rise (2p), with their bands.
STATE_ORDER, STATE_BAND, ENERGY_ORDER_MIN = 2.0, 0.3, 3.5


def _kernel_hat(N: int, beta: float) -> npt.NDArray[np.complex128]:
    h = 2 * math.pi / N
    return np.fft.rfft(h * np.exp(beta * np.cos(h * np.arange(N))))


def fixed_point_map(mu: Array, beta: float, coupling: float, noise: float) -> Array:
    """p(μ) = exp(κ G∗μ)/∫exp(κ G∗μ) on N equispaced points (trapezoidal rule, FFT convolution); shape (N,)."""
    N = len(mu)
    h = 2 * math.pi / N
    g = coupling / (noise * beta) * np.fft.irfft(_kernel_hat(N, beta) * np.fft.rfft(mu), N)
    p = np.exp(g - g.max())
    return np.asarray(p / (h * p.sum()), float)


def stationary_fixed_point(points: int, beta: float, coupling: float, noise: float, mu0: Array | None = None,
                           tol: float = 1e-15, max_it: int = 100_000) -> tuple[Array, int, float]:
    """The stationary density by Picard iteration μ ← p(μ) (module docstring), numpy only.

    Args:
        points: N equispaced angles θ_i = 2πi/N.
        beta: β > 0.
        coupling: K > 0.
        noise: τ > 0 (κ = K/(τβ)).
        mu0: the start (N,), default (1 + 0.3 cos θ)/2π.
        tol: stop when max |μ_{j+1} − μ_j| ≤ tol.
        max_it: at most this many iterations.

    Returns:
        (μ at the N points (a probability density in θ), iterations, the contraction rate ρ measured as the
        geometric mean of the last ratios of successive changes above 1e4·ε).

    Raises:
        ArithmeticError: no convergence in ``max_it`` iterations.
    """
    theta = 2 * math.pi * np.arange(points) / points
    mu = (1 + AMPLITUDE * np.cos(theta)) / (2 * math.pi) if mu0 is None else np.asarray(mu0, float)
    steps: list[float] = []
    for it in range(1, max_it + 1):
        new = fixed_point_map(mu, beta, coupling, noise)
        steps.append(float(np.abs(new - mu).max()))
        mu = new
        if steps[-1] <= tol:
            clean = [s for s in steps if s > 1e4 * EPS * float(mu.max())]
            ratios = [b / a for a, b in zip(clean[-6:-1], clean[-5:], strict=True)] if len(clean) > 2 else [0.0]
            return mu, it, float(np.exp(np.mean(np.log(np.maximum(ratios, 1e-300)))))
    raise ArithmeticError(f"the fixed-point iteration did not reach {tol:g} in {max_it} iterations "
                          f"(last change {steps[-1]:.2e})")


def reference_free_energy(mu: Array, beta: float, coupling: float, noise: float) -> tuple[float, float, float]:
    """(E, τ ∫ μ log μ, (K/2β) ∬ e^{β cos} dμ dμ) of a density at N equispaced points, trapezoidal rule and FFT."""
    N = len(mu)
    h = 2 * math.pi / N
    ent = noise * h * float(np.sum(mu * np.log(np.where(mu > 0, mu, 1.0))))
    inter = coupling / (2 * beta) * h * float(mu @ np.fft.irfft(_kernel_hat(N, beta) * np.fft.rfft(mu), N))
    return ent - inter, ent, inter


def energy_rise(E: Array) -> float:
    """The largest rise of E above its running minimum, max_k (E_k − min_{j≤k} E_j) (0 for a non-increasing E)."""
    E = np.asarray(E, float)
    return float(np.max(E - np.minimum.accumulate(E)))


def _dg_run(n: int, deadline: float) -> tuple[float, float, float, float]:
    """(|μ̂₁| of μ_T, E_h(μ_T), the rise of E_h, the round-off of two evaluations of E_h) of one DG0 SG run."""
    from mfpde.heads import HeadMeasure
    from mfpde.tokens.circle.dg import CircleMesh
    from mfpde.tokens.circle.noise import NoisyCircleTransport, free_energy, interaction

    mesh = CircleMesh(n, 0)
    heads = HeadMeasure(np.array([BETA]), np.array([COUPLING]))
    mu0 = mesh.interpolate(lambda th: (1 + AMPLITUDE * np.cos(th)) / (2 * math.pi))
    mu0 /= mesh.mass(mu0)
    E: list[float] = []
    rep = NoisyCircleTransport(mesh, NOISE, "unnormalised").solve(
        mu0, heads, DEPTH, OUTPUTS, lambda _k, _t, mu: E.append(free_energy(mesh, mu, heads, NOISE)), deadline)
    mu = rep.mu_T
    a1 = float(abs(np.sum(mesh.weights(mu)[:, 0] * np.exp(1j * mesh.nodes[:, 0]))))
    ent = abs(NOISE * float(np.sum(mesh.weights(mu * np.log(np.where(mu > 0, mu, 1.0))))))
    inter = COUPLING / (2 * BETA) * interaction(mesh, mu, BETA)
    return a1, E[-1], energy_rise(np.array(E)), 2 * n * EPS * (ent + abs(inter))


def _newton(ref: Array, disc: str) -> tuple[float, float, float, float]:
    """Newton's state against the reference: (residual, its bound, distance, its bound), in the discretisation.

    mfpde's Newton (the continuation's own solver of the problem) from the reference's state interpolated (FFT) to
    NEWTON_POINTS: its residual under the reference's map and the bound, its distance to the reference iterated at
    NEWTON_POINTS and that bound (module docstring).
    """
    from mfpde.verify.continuation_checks import problem, solver

    P = problem("circle", NEWTON_POINTS, BETA, NOISE, disc)
    ref_n, _, rho = stationary_fixed_point(NEWTON_POINTS, BETA, COUPLING, NOISE)
    kappa = COUPLING / (NOISE * BETA)
    spectral = disc == "spectral"
    if spectral:  # the cosine coefficients c_k of the reference (rfft: N c_0, N c_k/2 of an even state)
        c = np.fft.rfft(ref).real / len(ref)
        c[1:] *= 2
        guess = c[: P.m]
    else:
        guess = np.fft.irfft(np.fft.rfft(ref)[: NEWTON_POINTS // 2 + 1], NEWTON_POINTS) * NEWTON_POINTS / len(ref)
        guess = guess[: P.m]
    a = np.zeros(P.m + 1)
    a[-1] = 1.0
    with solver(P) as nw:
        x = nw.solve(np.concatenate([guess, [COUPLING]]), a, COUPLING)
    if x is None:
        return math.inf, 0.0, math.inf, 0.0
    if spectral:  # the Gibbs density of the coefficients at the N points (the half grid, mirrored)
        half = P.density(x[:-1], COUPLING)
        mu = np.concatenate([half, half[1:][::-1]])
    else:
        mu = P.density(x[:-1])
    conv = np.fft.irfft(_kernel_hat(NEWTON_POINTS, BETA) * np.fft.rfft(mu), NEWTON_POINTS)
    res = float(np.abs(mu - fixed_point_map(mu, BETA, COUPLING, NOISE)).max())
    # the solver's tolerance on ‖F‖₂: on the values, μ − p(μ) itself; on the coefficients, r = c − T p(c), which the
    # map turns into a change of κ G∗μ by ≤ κ ‖λ‖₂ ‖r‖₂ (G∗ cos kθ = λ_k cos kθ), of p by twice that relative
    atol = SNES_ATOL * (2 * kappa * float(np.linalg.norm(P.lam)) * float(mu.max()) if spectral else 1.0)
    res_bound = atol + 4 * NEWTON_POINTS * EPS * float(mu.max()) * (1 + kappa * float(conv.max()))
    return res, res_bound, float(np.abs(mu - ref_n).max()), res_bound / (1 - rho)


@register("noisy_free_energy", "§10 (free energy of noisy tokens, stationary state)",
          "Picard iteration of μ = exp(κG∗μ)/Z (numpy FFT, N = 512)", kind="slope", budget_s=BUDGET_S,
          distributed=False)
def check_noisy_free_energy(quick: bool) -> Outcome:
    """DG0 SG's long-time state at order 2, E at order ≥ 3.5, E's rise within its excess, Newton's residual."""
    deadline = time.process_time() + BUDGET_S * (0.5 if quick else 1.0)
    ref, its, rho = stationary_fixed_point(REF_POINTS, BETA, COUPLING, NOISE)
    half = stationary_fixed_point(REF_POINTS // 2, BETA, COUPLING, NOISE)[0]
    self_err = float(np.abs(ref[::2] - half).max())
    E_ref = reference_free_energy(ref, BETA, COUPLING, NOISE)[0]
    h_ref = 2 * math.pi / REF_POINTS
    a_ref = abs(complex(h_ref * np.sum(ref * np.exp(1j * h_ref * np.arange(REF_POINTS)))))  # |μ̂₁|, the modulus
    cells = [16, 32] if quick else [32, 64, 128]
    runs = [_dg_run(n, deadline) for n in cells]
    hs = [2 * math.pi / n for n in cells]
    e_state = [abs(r[0] - a_ref) for r in runs]
    e_energy = [abs(r[1] - E_ref) for r in runs]
    rises = [r[2] for r in runs]
    floors = [r[3] for r in runs]
    q = fit_order(hs, e_state)
    q_E = fit_order(hs, e_energy)
    above = [(h, r) for h, r, f in zip(hs, rises, floors, strict=True) if r > f]
    q_rise = fit_order([h for h, _ in above], [r for _, r in above]) if len(above) > 1 else math.inf
    rise_bound = e_energy[-1] + floors[-1]
    newton = {disc: _newton(ref, disc) for disc in ("spectral", "collocation")}
    res = max(v[0] / v[1] for v in newton.values())  # each residual and distance over its bound, the worse
    dist = max(v[2] / v[3] for v in newton.values())
    ok = (abs(q - STATE_ORDER) <= STATE_BAND and q_E >= ENERGY_ORDER_MIN and rises[-1] <= rise_bound
          and (q_rise >= ENERGY_ORDER_MIN or len(above) < 2) and res <= 1.0 and dist <= 1.0
          and self_err <= 1e-12)
    detail = (f"n = {', '.join(map(str, cells))}: |μ̂₁| error {', '.join(f'{e:.2e}' for e in e_state)} (order {q:.2f}); "
              f"E error {', '.join(f'{e:.2e}' for e in e_energy)} (order {q_E:.2f} ≥ {ENERGY_ORDER_MIN}); largest "
              f"rise of E {', '.join(f'{r:.1e}' for r in rises)} (order {q_rise:.2f}; finest ≤ {rise_bound:.1e}); "
              f"reference N = {REF_POINTS}: |μ̂₁| {a_ref:.12f}, E {E_ref:.12f}, {its} Picard its at rate {rho:.3f}, "
              f"change from N = {REF_POINTS // 2} {self_err:.1e}; Newton N = {NEWTON_POINTS}: "
              + "; ".join(f"{d}: residual {v[0]:.1e} (≤ {v[1]:.1e}), distance to the reference {v[2]:.1e} "
                          f"(≤ {v[3]:.1e})" for d, v in newton.items()))
    threshold = (f"|q − {STATE_ORDER:g}| ≤ {STATE_BAND:g}; E's order ≥ {ENERGY_ORDER_MIN:g}; E's rise ≤ its excess "
                 f"+ round-off and order ≥ {ENERGY_ORDER_MIN:g}; Newton residual ≤ 1e-12 + round-off")
    return Outcome(q, STATE_ORDER, threshold, ok, detail,
                   [Series(hs, e_state, "cell size h", STATE_ORDER, q, "|μ̂₁| of μ_T"),
                    Series(hs, e_energy, "cell size h", 2 * STATE_ORDER, q_E, "E(μ_T)")], STATE_BAND)
