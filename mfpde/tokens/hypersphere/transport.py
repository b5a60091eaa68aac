"""Zonal token transport on S^{d−1} (any d ≥ 2): a Lagrangian label flow and a finite-volume scheme in the angle.

Conventions (those of :mod:`~mfpde.tokens.hypersphere.zonal` and :mod:`~mfpde.tokens.hypersphere.theory`): tokens
x ∈ S^{d−1}, z = x·e = cos θ, θ ∈ [0, π]; a zonal measure μ has the density ν(z) with respect to the NORMALISED
surface measure σ̄ (the uniform state is ν ≡ 1), or the density ρ(θ) = c_d sin^{d−2}θ ν(cos θ) with respect to dθ,
c_d = Γ(d/2)/(√π Γ((d−1)/2)). A head (β, c) with weight w acts through Φ(x) = ∫ e^{β x·y} dμ(y):

    USA ("unnormalised"): v = (c/β) ∇_S Φ,     SA ("softmax"): v = (c/β) ∇_S log Φ,

several heads ``beta_c_w = [[β_h, c_h, w_h], ...]`` add their velocities with the weights w_h. For zonal μ the
polar velocity is dz/dt = (1 − z²) Φ'(z) c/β (USA), ÷ Φ(z) (SA), i.e. dθ/dt = −sin θ Φ'(cos θ) c/β. A label at
z′ stands for the ring {y·e = z′} (d = 2: the two points ±θ′); its kernel is the azimuthal average
K(z, z′) = e^{β z z′} B_0(β s s′), s = √(1−z²), B_0(t) = ₀F₁(; ν₀+1; t²/4), ν₀ = (d−3)/2, and, since
B_0′(t) = t/(2(ν₀+1)) ₀F₁(; ν₀+2; t²/4) and ∂_z s = −z/s,

    ∂_z K(z, z′) = β e^{β z z′} [z′ B_0(β s s′) − β z s′² ₀F₁(; ν₀+2; (β s s′)²/4)/(d − 1)]

(d = 2: B_0 = cosh, d = 3: I_0). Both are taken row-scaled, K = e^{r_i} k_ij with max_j k_ij = 1, so SA does not
overflow; β ≤ 700 as in :func:`~mfpde.tokens.hypersphere.zonal.azimuthal_kernel`. Noise τ adds τ Δ_S μ.

Limits: the density lives in a band of width ≈ 1/√d about the equator, so the finite volumes need h ≪ 1/√d
(their first-order error grows like √d h; the labels of the Gauss rule follow the band by themselves). The row
scaling is by the largest kernel entry, not the largest mass-weighted one: SA at β ≳ 300 with empty cells far from
every mass can divide 0 by 0. The flow is accurate while its map is smooth; once labels collapse into clusters
the label quadrature of a smooth f is only as good as the cluster's spread.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import scipy.integrate
import scipy.special

from mfpde.tokens.hypersphere.theory import ATTENTIONS
from mfpde.tokens.hypersphere.zonal import gauss_rule, orthonormal_basis

__all__ = ["Cells", "Flow", "bernoulli", "cell_masses", "clusters", "degree_amplitudes", "degree_power",
           "finite_volume", "flow", "heads", "potential", "substeps_at_least"]

Array = npt.NDArray[np.float64]
HeadsLike = npt.ArrayLike
logger = logging.getLogger(__name__)
#: Wall seconds between the finite volumes' progress lines inside an output interval.
LOG_EVERY_S = 30.0


class Flow(NamedTuple):
    """The label flow: ``z`` the positions Z_j(t) = cos θ_j(t), shape (len(depths), M); ``masses`` m_j, (M,)."""

    z: Array
    masses: Array


class Cells(NamedTuple):
    """The finite volumes at the depths.

    ``masses`` μ(cell_i), shape (len(depths), n); ``theta`` the cell centres, (n,); ``steps`` the SSP-RK3 steps
    taken (for round-off bounds).
    """

    masses: Array
    theta: Array
    steps: int


def heads(beta_c_w: HeadsLike) -> Array:
    """The heads as rows (β_h, c_h, w_h), shape (H, 3): one (β, c) or (β, c, w), or a list of such (w = 1 if absent).

    Raises:
        ValueError: a row of other length, β ≤ 0 or β > 700.
    """
    h = np.atleast_2d(np.asarray(beta_c_w, dtype=float))
    if h.shape[1] == 2:
        h = np.hstack([h, np.ones((h.shape[0], 1))])
    if h.ndim != 2 or h.shape[1] != 3 or not np.all((h[:, 0] > 0) & (h[:, 0] <= 700)):
        raise ValueError(f"heads must be rows (beta, c[, w]) with 0 < beta <= 700, got {beta_c_w!r}")
    return h


def _check(d: int, attention: str) -> None:
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
    if not (int(d) == d and d >= 2):
        raise ValueError(f"d must be an integer >= 2, got {d}")


def _kernel(z: Array, s: Array, zk: Array, sk: Array, beta: float, d: int) -> tuple[Array, Array, Array]:
    """(k, e, kb) with K(z_i, z_k) = e_i k_ik (max_k k_ik = 1) and ∂_z K(z_i, z_k) = β e_i kb_ik."""
    nu0 = (d - 3) / 2
    t2 = (beta * np.outer(s, sk)) ** 2 / 4
    f0 = scipy.special.hyp0f1(nu0 + 1, t2)
    logk = beta * np.outer(z, zk) + np.log(f0)
    r = logk.max(axis=1)
    k = np.exp(logk - r[:, None])
    b = zk[None, :] - beta * z[:, None] * (sk * sk)[None, :] * scipy.special.hyp0f1(nu0 + 2, t2) / (f0 * (d - 1))
    return k, np.exp(r), k * b


def potential(z: npt.ArrayLike, nodes: npt.ArrayLike, masses: npt.ArrayLike, beta: float,
              d: int) -> tuple[Array, Array]:
    """(Φ(z), Φ'(z)) of the zonal measure Σ_k m_k δ_{ring z_k} (module docstring), each of the shape (len(z),).

    Args:
        z: where, in [−1, 1].
        nodes: the rings z_k ∈ [−1, 1].
        masses: m_k (any sign: Φ is linear in them).
        beta: β ∈ (0, 700].
        d: the dimension, ≥ 2.
    """
    z, zk, m = (np.atleast_1d(np.asarray(a, dtype=float)) for a in (z, nodes, masses))
    k, e, kb = _kernel(z, np.sqrt(np.clip(1 - z * z, 0, None)), zk, np.sqrt(np.clip(1 - zk * zk, 0, None)), beta, d)
    return e * (k @ m), beta * e * (kb @ m)


def _rate(terms: list[tuple[Array, Array, Array]], h: Array, m: Array, attention: str) -> tuple[Array, Array]:
    """(G, V): dθ/dt = −sin θ G at the targets, and V the a-priori bound of |v| there (Σ w|c|Φ USA, Σ w|c| SA)."""
    g = np.zeros(terms[0][0].shape[0])
    bound = np.zeros_like(g)
    for (k, e, kb), (_, c, w) in zip(terms, h, strict=True):
        phi, dphi = k @ m, kb @ m  # both ÷ e; Φ' also ÷ β
        if attention == "softmax":
            g += w * c * dphi / phi
            bound += abs(w * c)
        else:
            g += w * c * e * dphi
            bound += abs(w * c) * e * phi
    return g, bound


def flow(nu0: Callable[[Array], Array], beta_c_w: HeadsLike, d: int, attention: str, depths: npt.ArrayLike,
         labels: int, rtol: float = 1e-10) -> Flow:
    """The noise-free Lagrangian flow map of M = ``labels`` rings, started at the Gauss rule of σ̄.

    The labels start at the nodes z_j of ``gauss_rule(labels, d)`` with the masses m_j = q_j ν0(z_j)/Σ q ν0 (so
    ∫ f dμ_t ≈ Σ m_j f(Z_j(t)), spectrally while the map is smooth; the total mass is 1). Each moves with the
    velocity of the label measure itself, dθ_j/dt = −sin θ_j Σ_h w_h (c_h/β_h) Φ_h'(Z_j) [÷ Φ_h(Z_j), SA], the
    O(M²) sum over rings including its own (a ring pulls on itself for d ≥ 3, d = 2: its mirror point). In θ the
    field vanishes at 0 and π and is smooth, so labels neither reach the poles nor cross each other. The unknown
    of DOP853 is the displacement θ − θ_0: ``rtol`` is relative to how far the labels moved (a near-stationary
    start is resolved to rtol of its motion, not of θ), atol = 1e-3 rtol.

    Args:
        nu0: ν0(z) ≥ 0, vectorised, not all zero on the nodes.
        beta_c_w: the heads (:func:`heads`).
        d: the dimension, ≥ 2.
        attention: "softmax" or "unnormalised".
        depths: output depths t ≥ 0, ascending.
        labels: M ≥ 2.
        rtol: DOP853's relative tolerance.

    Raises:
        ValueError: bad d, attention, heads, depths or a negative ν0; RuntimeError: the integration failed.
    """
    _check(d, attention)
    h = heads(beta_c_w)
    t_out = np.asarray(depths, dtype=float)
    if t_out.ndim != 1 or np.any(t_out < 0) or np.any(np.diff(t_out) < 0):
        raise ValueError(f"depths must be ascending and >= 0, got {depths!r}")
    z0, q = gauss_rule(int(labels), int(d))
    w0 = q * np.asarray(nu0(z0), dtype=float)
    if np.any(w0 < 0) or not w0.sum() > 0:
        raise ValueError("nu0 must be >= 0 and not zero on the labels")
    m, theta0 = w0 / w0.sum(), np.arccos(z0)

    def rhs(_t: float, y: Array) -> Array:
        th = theta0 + y
        z, s = np.cos(th), np.sin(th)
        terms = [_kernel(z, np.abs(s), z, np.abs(s), beta, d) for beta in h[:, 0]]
        return -s * _rate(terms, h, m, attention)[0]

    if t_out[-1] == 0:
        return Flow(np.tile(z0, (t_out.size, 1)), m)
    sol = scipy.integrate.solve_ivp(rhs, (0.0, t_out[-1]), np.zeros_like(theta0), method="DOP853", t_eval=t_out,
                                    rtol=rtol, atol=1e-3 * rtol)
    if not sol.success:
        raise RuntimeError(f"flow: solve_ivp failed: {sol.message}")
    return Flow(np.cos(theta0[None, :] + sol.y.T), m)


def _c_d(d: int) -> float:
    return math.exp(math.lgamma(d / 2) - math.lgamma((d - 1) / 2)) / math.sqrt(math.pi)


def cell_masses(nu0: Callable[[Array], Array], d: int, cells: int, points: int = 8) -> Array:
    """∫_cell c_d sin^{d−2}θ ν0(cos θ) dθ on ``cells`` uniform cells of [0, π], shape (cells,).

    ``points`` Gauss–Legendre nodes per cell: exact for polynomials of degree 2·points − 1 in θ.
    """
    x, wq = np.polynomial.legendre.leggauss(points)
    hh = math.pi / cells
    th = (np.arange(cells)[:, None] + (x[None, :] + 1) / 2) * hh
    rho = _c_d(d) * np.sin(th) ** (d - 2) * np.asarray(nu0(np.cos(th).ravel()), dtype=float).reshape(th.shape)
    return (rho * wq[None, :]).sum(axis=1) * hh / 2


def bernoulli(x: npt.ArrayLike) -> Array:
    """B(x) = x/(e^x − 1), B(0) = 1, without cancellation or overflow (B(x) → 0 as x → ∞, ≈ −x as x → −∞)."""
    x = np.asarray(x, dtype=float)
    y = np.abs(x)
    b = _bernoulli_positive(y)
    return np.where(x < 0, y + b, b)  # B(−y) = y + B(y): a sum of positive terms


def _bernoulli_positive(y: Array) -> Array:
    """B(y) for y ≥ 0: y/expm1(y) is accurate for every y > 0 (expm1 has no cancellation), 1 at y = 0."""
    y = np.maximum(y, 1e-300)
    with np.errstate(over="ignore"):
        return y / np.expm1(y)  # y > 709: expm1 = inf, B = 0 (exactly y e^{−y} ≈ 0)


def finite_volume(nu0: Callable[[Array], Array] | npt.ArrayLike, beta_c_w: HeadsLike, d: int, attention: str,
                  noise: float, cells: int, depths: npt.ArrayLike, cfl: float = 0.4,
                  max_steps: int = 10**7, callback: Callable[[int, float], None] | None = None) -> Cells:
    """Cell masses of μ_t on ``cells`` uniform cells in θ: ∂_t ρ + ∂_θ(ρ a) = τ ∂²_θ ρ, zero flux at θ = 0, π.

    The drift is a = v_θ + τ(d−2) cot θ (the zonal Laplace–Beltrami written for ρ = c_d sin^{d−2}θ ν), v_θ at each
    interior face from the current cell masses as atoms at the cell centres (midpoint rule in θ, second order;
    the face-to-centre kernels are built once). The face flux is Scharfetter–Gummel,
    J = (τ/h)[B(−ah/τ) ρ_L − B(ah/τ) ρ_R] (:func:`bernoulli`), upwind at τ = 0; it is exact for the zero-flux
    states ρ_R/ρ_L = e^{ah/τ}. In depth SSP-RK3 (Shu–Osher), each stage a forward-Euler step. The step is
    Δt = cfl · min_faces h²/(2τ + A h) with A = (a-priori bound of |v_θ|) + τ(d−2)|cot θ| ≥ |a| (the bound, not
    |a| itself, so Δt stays O(h/|v|) where the drift vanishes, e.g. about the uniform state; capped to land on
    the depths). Every Euler stage is checked to have a non-negative diagonal, 1 − (Δt/h)(out-flux rates) ≥ 0,
    which with B ≥ 0 makes it positive (always so for cfl ≤ 1/2 while |v| ≤ its bound); a stage that fails
    halves Δt and redoes the step. The flux form with zero end fluxes conserves Σ masses to round-off. A line is
    logged every :data:`LOG_EVERY_S` wall seconds (the depth reached and the steps taken).

    Args:
        nu0: ν0(z) (vectorised): the cell masses of ν0 σ̄ (:func:`cell_masses`), normalised to total mass 1;
            or the initial cell masses themselves (≥ 0, shape (cells,), used as they are).
        beta_c_w: the heads (:func:`heads`).
        d: the dimension, ≥ 2.
        attention: "softmax" or "unnormalised".
        noise: τ ≥ 0.
        cells: n ≥ 2.
        depths: output depths ≥ 0, ascending.
        cfl: the factor of the step, in (0, 1].
        max_steps: raise rather than take more steps.
        callback: called as callback(i, t_i) after output depth i (progress), or None.

    Raises:
        ValueError: bad arguments; RuntimeError: over ``max_steps`` steps.
    """
    _check(d, attention)
    h_ = heads(beta_c_w)
    tau, n = float(noise), int(cells)
    t_out = np.asarray(depths, dtype=float)
    if not (tau >= 0 and n >= 2 and 0 < cfl <= 1) or np.any(t_out < 0) or np.any(np.diff(t_out) < 0):
        raise ValueError(f"need noise >= 0, cells >= 2, 0 < cfl <= 1, ascending depths >= 0; got {noise}, {cells}, "
                         f"{cfl}, {depths!r}")
    if callable(nu0):
        m = cell_masses(nu0, d, n)
        m = m / m.sum()
    else:
        m = np.asarray(nu0, dtype=float).copy()
    if m.shape != (n,) or np.any(m < 0):
        raise ValueError(f"initial cell masses must be >= 0 of shape ({n},)")
    hh = math.pi / n
    theta: Array = (np.arange(n, dtype=np.float64) + 0.5) * hh
    face = np.arange(1, n) * hh
    zc, sc, zf, sf = np.cos(theta), np.sin(theta), np.cos(face), np.sin(face)
    terms = [_kernel(zf, sf, zc, sc, beta, d) for beta in h_[:, 0]]
    diffusive_drift = tau * (d - 2) * zf / sf  # τ(d−2) cot θ at the interior faces

    def rates(mm: Array) -> tuple[Array, Array, Array]:
        """(α, γ, A) at the interior faces: J = (α M_L − γ M_R)/h, and the bound A of |a|."""
        g, bound = _rate(terms, h_, mm, attention)
        a = -sf * g + diffusive_drift
        big = sf * bound + np.abs(diffusive_drift)
        if tau == 0:
            return np.maximum(a, 0), np.maximum(-a, 0), big
        x = a * hh / tau
        y = np.abs(x)
        b = _bernoulli_positive(y)  # B(−x) = |x| + B(|x|) if x ≥ 0, B(|x|) if x < 0; B(x) the other way round
        pos = x >= 0
        return tau / hh * np.where(pos, y + b, b), tau / hh * np.where(pos, b, y + b), big

    def euler(mm: Array, dt: float, r: tuple[Array, Array, Array] | None = None) -> Array | None:
        """The Euler stage mm + Δt L(mm); None if a diagonal 1 − (Δt/h)(out-flux rates) would be negative."""
        al, ga, _ = rates(mm) if r is None else r
        out = np.zeros(n)
        out[:-1] += al  # cell i loses α_{i+1/2} M_i/h through its right face
        out[1:] += ga  # and γ_{i−1/2} M_i/h through its left one
        if np.any(dt / hh * out > 1):
            return None
        j = np.zeros(n + 1)
        j[1:-1] = (al * mm[:-1] - ga * mm[1:]) / hh
        return mm - dt * (j[1:] - j[:-1])

    result = np.empty((t_out.size, n))
    t, steps = 0.0, 0
    next_log = time.monotonic() + LOG_EVERY_S
    for i, target in enumerate(t_out):
        while t < target:
            r0 = rates(m)
            dt = min(cfl * float(np.min(hh * hh / (2 * tau + r0[2] * hh))), target - t)
            while True:  # SSP-RK3 (Shu–Osher): three Euler stages and their convex combinations
                e1 = euler(m, dt, r0)
                e2 = None if e1 is None else euler(e1, dt)
                e3 = None if e2 is None else euler(0.75 * m + 0.25 * e2, dt)
                if e3 is not None:
                    break
                dt /= 2
            m = m / 3 + 2 * e3 / 3
            t = target if dt == target - t else t + dt
            steps += 1
            if steps > max_steps:
                raise RuntimeError(f"finite_volume: more than {max_steps} steps")
            if steps % 64 == 0 and time.monotonic() > next_log:
                next_log = time.monotonic() + LOG_EVERY_S
                logger.info("hypersphere finite volumes: t = %.6g of %.6g, %d steps of Δt ≈ %.3g", t, t_out[-1], steps,
                            dt)
        result[i] = m
        if callback is not None:
            callback(i, float(target))
    return Cells(result, theta, steps)


def substeps_at_least(beta_c_w: HeadsLike, d: int, attention: str, noise: float, cells: int, depth: float,
                      cfl: float = 0.4) -> float:
    """A lower bound of :func:`finite_volume`'s SSP-RK3 steps to the depth T, whatever the state.

    Its step is Δt = cfl · min_f h²/(2τ + A_f h) (or shorter: halved, capped to land on a depth), A_f = sin θ_f V_f +
    τ(d−2)|cot θ_f| with V_f the a-priori bound of |Φ'|-velocity: Σ|w c| (SA) or Σ|w c| Φ ≥ Σ|w c| e^{−β} (USA, a
    probability μ and x·y ≥ −1). So Δt ≤ cfl h²/(2τ + A_f^− h) at every face, A_f^− the state-free lower bound of
    A_f, and the steps are at least T (2τ + max_f A_f^− h)/(cfl h²); with noise the face next to a pole gives
    ≈ T τ d/(cfl h²) (d = 64, 64 cells, T = 2, τ = 1: 1.33e5, and 132 706 were taken).
    """
    h_ = heads(beta_c_w)
    n = int(cells)
    hh = math.pi / n
    face = np.arange(1, n) * hh
    v = float(np.sum(np.abs(h_[:, 1] * h_[:, 2]) * (1.0 if attention == "softmax" else np.exp(-h_[:, 0]))))
    a_lo = np.sin(face) * v + noise * (d - 2) * np.abs(np.cos(face) / np.sin(face))
    return float(depth * (2 * noise + float(np.max(a_lo)) * hh) / (cfl * hh * hh))


def degree_amplitudes(z: npt.ArrayLike, masses: npt.ArrayLike, d: int, lmax: int) -> Array:
    """μ̂_ℓ = Σ_j m_j p_ℓ(z_j), ℓ = 0..lmax, p_ℓ orthonormal in σ̄ (μ̂_ℓ = ∫ ν p_ℓ dσ̄), shape (..., lmax + 1).

    z (..., M) and masses (M,) or broadcastable: labels (:class:`Flow`), or cells with z = cos of the centres
    (:class:`Cells`; the midpoint rule, O(h²)).
    """
    z, mm = np.broadcast_arrays(np.asarray(z, dtype=float), np.asarray(masses, dtype=float))
    p = orthonormal_basis(z.ravel(), lmax, d).reshape(*z.shape, lmax + 1)
    return np.einsum("...j,...jl->...l", mm, p)


def degree_power(z: npt.ArrayLike, masses: npt.ArrayLike, d: int, lmax: int) -> Array:
    """μ̂_ℓ², ℓ = 0..lmax (:func:`degree_amplitudes`), shape (..., lmax + 1)."""
    return degree_amplitudes(z, masses, d, lmax) ** 2


def clusters(theta: npt.ArrayLike, masses: npt.ArrayLike, d: int, bins: int, least: float = 1e-3) -> int:
    """The number of clusters of the zonal measure Σ m_j δ_{θ_j} on S^{d−1}, as on the circle.

    A cluster is a maximal run of the ``bins`` equal bins of [0, π] in θ whose mass exceeds twice the uniform
    state's (the normalised measure σ̄'s mass of the bin, by the regularised incomplete beta function: z = cos θ
    has the density ∝ (1 − z²)^((d−3)/2)) and that holds at least ``least`` of the mass: a cap about a pole or a
    ring. The uniform state has none; the cells of the finite volumes are their own bins, the flow's labels are
    binned (a few labels a bin).

    Raises:
        ValueError: bins < 1, d < 2 or no atom of positive mass.
    """
    from scipy.special import betainc

    th, mm = np.asarray(theta, dtype=float).ravel(), np.asarray(masses, dtype=float).ravel()
    if bins < 1 or d < 2 or not mm.sum() > 0:
        raise ValueError(f"need bins >= 1, d >= 2 and a positive mass, got {bins}, {d}")
    edges = np.linspace(0.0, math.pi, bins + 1)
    got = np.histogram(np.clip(th, 0.0, math.pi), edges, weights=mm)[0] / mm.sum()
    a = (d - 1) / 2
    uniform = np.diff(betainc(a, a, (1 - np.cos(edges)) / 2))
    over = got > 2 * uniform
    count, run = 0, 0.0
    for k in range(bins + 1):
        if k < bins and over[k]:
            run += got[k]
        else:
            count += run >= least
            run = 0.0
    return int(count)
