"""Tokens on the circle: the mean-field attention equation in the angle θ, by periodic upwind DG and FFT kernels.

Solves theory §9,

    ∂_t μ + ∂_θ(μ u) = 0  on the circle θ ∈ [0, 2π),   u(θ) = Σ_h c_h Z_h(θ)^{-1} ∫ e^{β_h cos(φ−θ)} sin(φ−θ) dμ(φ),

with Z_h(θ) = ∫ e^{β_h cos(φ−θ)} dμ(φ) (softmax, "SA") or Z_h ≡ 1 (unnormalised, "USA"); the heads are the
reduced head measure of the scalar family (β_h = a_h, c_h = ∫_{a=a_h} v dρ): one Dirac at (β, 1) is the model of
the literature, a mixture of heads a mixture of temperatures. Everything is non-dimensional.

Design, and why:

* **A uniform mesh of n cells on the angle, periodic by the index** (cell n−1 neighbours cell 0). The density
  is a 1-D array: the solve is replicated on every rank (identical numbers on any number of ranks, no parallel
  layer); only the ParaView output is distributed (:mod:`mfpde.tokens.circle.job`).
* **Nodal DG of any degree p at the p+1 Gauss–Legendre points of each cell** (state shape (n, p+1)). The mass
  matrix is diagonal (the Gauss rule is exact for degree 2p), the volume term ∫ μ u φ' is the same rule, the
  upwind flux takes the value of the upwind cell at the edge (Cockburn–Shu). p = 0 is the upwind finite-volume
  scheme. Testing with w = 1 gives the flux balance of a cell and the fluxes telescope around the closed
  circle: the mass is conserved to round-off.
* **The velocity by circular convolutions (numpy.fft).** The kernel depends on φ − θ only; on a uniform mesh
  the matrix from the Gauss points q of every cell to the target points r of every cell (the Gauss points
  and the left edge) is circulant in the cell index for each pair (r, q), so u at all n(p+2) targets costs
  p+1 real FFTs of the nodal masses, (p+2)(p+1) products and p+2 inverse FFTs: O(p² n log n) per stage
  instead of the O(n²) of a direct sum. The quadrature is the Gauss rule of μ_h (exact for the mass, error
  O(h^{2p+2}) for the smooth kernel).
* **Depth stepping by :mod:`mfpde.tokens.rk`** (SSP-RK3, sub-steps from :meth:`CircleTransport.max_stable_dt`):
  the sub-step follows the CFL of the actual velocity, so slow phases take long steps. Two bounds: the
  Zhang–Shu positivity bound Δt·max|u_edge|/h ≤ cfl·ŵ₁ (ŵ₁ the first Gauss–Lobatto weight of N ≥ (p+3)/2
  points on [0, 1]; p = 0: Δt (u⁺_right + u⁻_left)/h ≤ cfl), and an accuracy cap ΛΔt ≤ min(0.1,
  0.42 (k_max h)^{(2p+2)/3}) with Λ the fastest linear growth rate about the uniform state (theory §9), which
  near the uniform state the CFL bound does not see (u is small there but the instability grows at rate Λ).
  The mesh-dependent part (:func:`growth_cap`) holds SSP-RK3's error per unit depth, (ΛΔt)³Λ/24, below DG_p's
  error of the growth rate, C(k h)^{2p+2}Λ: the depth error stays below the spatial error as the mesh is refined
  (with a fixed 0.1/Λ it levelled off at W1 ≈ 3·10⁻⁵ on the side-by-side problem).
* **Positivity limiter** (Zhang & Shu, J. Comput. Phys. 229, 2010) after each stage: on a cell whose
  polynomial has a negative minimum over the cell, scale toward the cell mean until that minimum is 0; means
  (so mass) are kept. The minimum is the exact one (:meth:`CircleMesh.cell_minima`: the end-points and the real
  roots of the derivative), as in Zhang–Shu's accuracy proof, so the limited density is non-negative on the
  whole circle, not only at chosen points; in particular at the Gauss–Lobatto points, so with the CFL bound
  above the means stay non-negative (the Euler step is a convex combination of Gauss–Lobatto values).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import scipy.special

from mfpde.heads import HeadMeasure
from mfpde.tokens import rk
from mfpde.tokens.limiter import zhang_shu

__all__ = ["ATTENTIONS", "CircleMesh", "CircleReport", "CircleTransport", "fastest_mode", "growth_cap",
           "linear_rate_bound"]

Array = npt.NDArray[np.float64]
ATTENTIONS = ("softmax", "unnormalised")
#: The sub-step cap near the uniform state, at most GROWTH_CAP/Λ (Λ: :func:`linear_rate_bound`).
GROWTH_CAP = 0.1
#: The depth-error balance (:func:`growth_cap`): (24 C)^{1/3} with C ≈ 3·10⁻³ the constant of DG_p's growth-rate
#: error C (k h)^{2p+2} (measured by the ``circle_growth_rates`` check: DG1 n = 32 and DG2 n = 128 at β = 5).
DEPTH_BALANCE = 0.42


def _lagrange(nodes: Array, x: Array) -> tuple[Array, Array]:
    """Values and derivatives of the Lagrange basis on ``nodes`` at points x: shapes (len(x), len(nodes))."""
    m = len(nodes)
    V, D = np.ones((len(x), m)), np.zeros((len(x), m))
    for j in range(m):
        others = [nodes[i] for i in range(m) if i != j]
        den = np.prod([nodes[j] - o for o in others]) if others else 1.0
        V[:, j] = np.prod([x - o for o in others], axis=0) / den if others else 1.0
        for i_skip in range(len(others)):
            rest = [o for i, o in enumerate(others) if i != i_skip]
            D[:, j] += (np.prod([x - o for o in rest], axis=0) if rest else 1.0) / den
    return V, D


def _gauss_lobatto(npts: int) -> tuple[Array, Array]:
    """Gauss–Lobatto points and weights on [0, 1] (npts ≥ 2), weights summing to 1."""
    P = np.polynomial.legendre.Legendre.basis(npts - 1)
    x = np.concatenate([[-1.0], np.sort(P.deriv().roots().real), [1.0]])
    w = 2.0 / (npts * (npts - 1) * P(x) ** 2)
    return 0.5 * (x + 1.0), 0.5 * w


@dataclass(frozen=True)
class CircleMesh:
    """n uniform cells [jh, (j+1)h], h = 2π/n, with the nodal DG_p reference data.

    Attributes:
        n: cells; degree: p; h: cell size (radians).
        s, w: Gauss–Legendre points on [0, 1] and weights (sum 1), shape (p+1,).
        D: D[q, j] = ℓ_j'(s_q) on [0, 1], shape (p+1, p+1); L0, L1: ℓ_j(0), ℓ_j(1), shape (p+1,).
        w_lobatto: the first Gauss–Lobatto weight ŵ₁ of the CFL bound (1 for p = 0).
    """

    n: int
    degree: int
    h: float = field(init=False)
    s: Array = field(init=False, repr=False)
    w: Array = field(init=False, repr=False)
    D: Array = field(init=False, repr=False)
    L0: Array = field(init=False, repr=False)
    L1: Array = field(init=False, repr=False)
    w_lobatto: float = field(init=False)

    def __post_init__(self) -> None:
        """Build the reference data (raises ValueError for n < 3 or p < 0)."""
        if self.n < 3 or self.degree < 0:
            raise ValueError(f"a circle mesh needs n >= 3 cells and degree >= 0, got {self.n}, {self.degree}")
        x, wg = np.polynomial.legendre.leggauss(self.degree + 1)
        s, w = 0.5 * (x + 1.0), 0.5 * wg
        _, D = _lagrange(s, s)
        ends, _ = _lagrange(s, np.array([0.0, 1.0]))
        nl = max(2, math.ceil((self.degree + 3) / 2))
        _, wl = _gauss_lobatto(nl)
        for k, v in (("h", 2 * math.pi / self.n), ("s", s), ("w", w), ("D", D), ("L0", ends[0]), ("L1", ends[1]),
                     ("w_lobatto", 1.0 if self.degree == 0 else float(wl[0]))):
            object.__setattr__(self, k, v)

    @property
    def nodes(self) -> Array:
        """The angles of the DG nodes, shape (n, p+1)."""
        return (np.arange(self.n)[:, None] + self.s[None, :]) * self.h

    def weights(self, mu: Array) -> Array:
        """The Gauss quadrature of μ_h: masses at the nodes, w_q h μ_q, shape (n, p+1)."""
        return mu * (self.h * self.w)[None, :]

    def mass(self, mu: Array) -> float:
        """∫ μ_h dθ (exact)."""
        return float(self.weights(mu).sum())

    def cell_means(self, mu: Array) -> Array:
        """The mean of μ_h on each cell, shape (n,)."""
        return mu @ self.w

    def interpolate(self, f: Any) -> Array:
        """The nodal DG function of f(θ) (vectorised), shape (n, p+1)."""
        return np.asarray(f(self.nodes), dtype=float)

    def cell_minima(self, mu: Array) -> Array:
        """The exact minimum of each cell's polynomial over the closed cell, shape (n,).

        The candidates are the end-points s = 0, 1 and the real parts (clipped to [0, 1]) of the roots of the
        derivative, from the monomial coefficients on [0, 1]: a point of [0, 1] never goes below the minimum,
        and the minimiser is an end-point or a real critical point, so the smallest candidate is the minimum
        (to the round-off of the roots). p ≤ 1: end-points; p = 2: the vertex; p ≥ 3: companion eigenvalues.
        """
        c = mu @ np.linalg.inv(np.vander(self.s, self.degree + 1, increasing=True)).T  # (n, p+1), c_i s^i
        cand = [np.zeros(self.n), np.ones(self.n)]
        if self.degree >= 2:
            d = c[:, 1:] * np.arange(1, self.degree + 1)  # derivative coefficients, (n, p)
            lead = d[:, -1]
            lead = np.where(np.abs(lead) > 1e-300, lead, 1e-300)
            if self.degree == 2:
                cand.append(np.clip(-d[:, 0] / lead, 0.0, 1.0))
            else:
                comp = np.zeros((self.n, self.degree - 1, self.degree - 1))
                comp[:, 1:, :-1] = np.eye(self.degree - 2)
                comp[:, :, -1] = -d[:, :-1] / lead[:, None]
                cand.extend(np.clip(np.linalg.eigvals(comp).real, 0.0, 1.0).T)
        S = np.stack(cand, axis=1)  # (n, candidates)
        vals = np.zeros_like(S)
        for i in range(self.degree, -1, -1):  # Horner
            vals = vals * S + c[:, i : i + 1]
        return vals.min(axis=1)

    def evaluate(self, mu: Array, s: Array) -> Array:
        """μ_h at reference points s ∈ [0, 1] of every cell, shape (n, len(s))."""
        V, _ = _lagrange(self.s, np.asarray(s, float))
        return mu @ V.T


def fastest_mode(a: Array) -> int:
    """The largest of the fastest linear modes k_max(β_h) = argmax_k k² I_k(β_h) of the heads (1 if all β ≈ 0)."""
    k = np.arange(1, 400)
    return max([1] + [int(k[np.argmax(k**2 * scipy.special.ive(k, abs(float(b))))]) for b in np.asarray(a, float)
                      if abs(float(b)) >= 1e-12])


def growth_cap(a: Array, h: float, p: int) -> float:
    """ΛΔt for the sub-step cap: min(GROWTH_CAP, DEPTH_BALANCE·(k_max h)^{(2p+2)/3}) (k_max: :func:`fastest_mode`).

    Why: in a mode growing at the rate Λ, SSP-RK3's relative error per unit depth is (ΛΔt)³Λ/24, and DG_p's error of
    the rate itself is C(k h)^{2p+2}Λ (Galerkin eigenvalues: order 2p+2); ΛΔt ≤ (24C)^{1/3}(k h)^{(2p+2)/3} keeps the
    depth error below the spatial one on every mesh, so refining the mesh alone converges (at the order of the
    spatial error: measured in docs/circle.md). GROWTH_CAP bounds it on coarse meshes.
    """
    return min(GROWTH_CAP, DEPTH_BALANCE * (fastest_mode(a) * h) ** ((2 * p + 2) / 3))


def linear_rate_bound(a: Array, c: Array, attention: str) -> float:
    """Λ = Σ_h |c_h| max_k |γ_k(β_h)|, the fastest linear rate about the uniform state (theory §9); a step cap.

    γ_k = k² I_k(β)/β (USA), divided by I₀(β) for SA (exponentially scaled Bessel functions: no overflow).
    """
    lam = 0.0
    k = np.arange(1, 400)
    for beta, ch in zip(np.asarray(a, float), np.asarray(c, float), strict=True):
        b = abs(float(beta))
        if b < 1e-12:
            continue
        g = k**2 * scipy.special.ive(k, b) / b
        # USA: ive(k, b) e^b = I_k(b) overflows past b ≈ 709: the bound is then +inf (the CFL cap goes to 0 and
        # the sub-step control stops the solve with a NumericalError, exit 3), not an OverflowError
        lam += abs(ch) * float(g.max()) * (1.0 / scipy.special.ive(0, b) if attention == "softmax"
                                           else float(np.exp(min(b, 1e4))))
    return lam


class CircleTransport(rk.SingleRow):
    """Upwind DG_p on the circle with FFT attention kernels: the :class:`mfpde.tokens.rk.SubstepOperator`.

    Args:
        mesh: the circle mesh.
        attention: ``"softmax"`` (SA) or ``"unnormalised"`` (USA).
        cfl: the positivity CFL factor in (0, 1].
        max_dt: an extra cap on the sub-step (None: GROWTH_CAP/Λ, :func:`linear_rate_bound`; inf: none).

    The state is the nodal array μ (n, p+1); a velocity is the pair (u at the nodes (n, p+1), u at the left
    edges (n,)).

    Raises:
        ValueError: an unknown attention.
    """

    def __init__(self, mesh: CircleMesh, attention: str = "softmax", cfl: float = 0.4, max_dt: float | None = None):
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
        self.mesh, self.attention, self.cfl, self.max_dt = mesh, attention, cfl, max_dt
        p = mesh.degree
        self._targets = np.concatenate([[0.0], mesh.s])  # the left edge, then the Gauss points
        j = np.arange(mesh.n)[None, None, :]
        self._shift = (j + mesh.s[None, :, None] - self._targets[:, None, None]) * mesh.h  # (p+2, p+1, n)
        self._kernels: dict[float, tuple[Array, Array | None]] = {}
        self.limited_cells = 0  # cells the limiter scaled, in total
        self.p = p
        self._caps: dict[tuple[tuple[float, ...], tuple[float, ...]], float] = {}

    # -- kernels ------------------------------------------------------------------------------
    def kernel(self, beta: float) -> tuple[Array, Array | None]:
        """conj(rfft) of g_rq[j] = G((j + s_q − s_r)h) for G = e^{β(cos ψ − s)} sin ψ and, for SA, of e^{β(cos ψ − s)}.

        s = 1 for SA (the factor e^β cancels in u = N/Z), s = 0 for USA. Shapes (p+2, p+1, n//2+1).
        """
        key = round(float(beta), 12)
        if key not in self._kernels:
            psi = self._shift
            e = np.exp(key * (np.cos(psi) - (1.0 if self.attention == "softmax" else 0.0)))
            num = np.conj(np.fft.rfft(e * np.sin(psi), axis=-1))
            den = np.conj(np.fft.rfft(e, axis=-1)) if self.attention == "softmax" else None
            self._kernels[key] = (num, den)
        return self._kernels[key]

    def step_cap(self, heads: HeadMeasure) -> float:
        """The sub-step's accuracy cap for these heads: ``max_dt``, or :func:`growth_cap`/Λ (Λ: linear_rate_bound)."""
        if self.max_dt is not None:
            return self.max_dt
        key = (tuple(np.round(heads.a, 12)), tuple(np.round(heads.c, 12)))
        if key not in self._caps:
            lam = linear_rate_bound(heads.a, heads.c, self.attention)
            self._caps[key] = growth_cap(heads.a, self.mesh.h, self.p) / lam if lam > 0 else math.inf
        return self._caps[key]

    # -- the operator protocol ------------------------------------------------------------------
    def velocity(self, state: Array, heads: HeadMeasure, linearize: bool = False) -> tuple[Array, Array, float]:
        """(u at the nodes (n, p+1), u at the left edges (n,), the step cap) of μ = ``state`` (theory §9)."""
        n = self.mesh.n
        mhat = np.fft.rfft(self.mesh.weights(state), axis=0).T  # (p+1, n//2+1)
        u = np.zeros((self.p + 2, n))
        for beta, c in zip(heads.a, heads.c, strict=True):
            num, den = self.kernel(beta)
            N = np.fft.irfft(np.einsum("rqk,qk->rk", num, mhat), n, axis=-1)
            if den is not None:
                N = N / np.fft.irfft(np.einsum("rqk,qk->rk", den, mhat), n, axis=-1)
            u += c * N
        return u[1:].T.copy(), u[0].copy(), self.step_cap(heads)

    def rate(self, state: Array, vel: tuple[Array, Array, float]) -> tuple[Array, float]:
        """(dμ/dt of the upwind DG form, 0.0): no boundary, no outflow.

        dμ_j/dt = (Σ_q w_q μ_q u_q ℓ_j'(s_q) − F_{R} ℓ_j(1) + F_{L} ℓ_j(0)) / (h w_j), F the upwind flux u_e μ_upwind.
        """
        m = self.mesh
        un, ue, _ = vel
        right = state @ m.L1  # μ at the right end of each cell
        left = state @ m.L0
        F = np.maximum(ue, 0.0) * np.roll(right, 1) + np.minimum(ue, 0.0) * left  # at the left edge of each cell
        vol = (state * un * m.w[None, :]) @ m.D
        du = (vol - np.roll(F, -1)[:, None] * m.L1[None, :] + F[:, None] * m.L0[None, :]) / (m.h * m.w[None, :])
        return du, 0.0

    def limit(self, state: Array) -> int | None:
        """Zhang–Shu scaling in place to the exact cell minimum 0 (means kept); cells scaled, or None."""
        if self.p == 0:
            return None
        vmin = self.mesh.cell_minima(state)
        bad = np.flatnonzero(vmin < 0)
        if not len(bad):
            return None
        state[bad] = zhang_shu(state[bad], self.mesh.cell_means(state[bad]), vmin[bad])[0]
        self.limited_cells += len(bad)
        return len(bad)

    def max_stable_dt(self, vel: tuple[Array, Array, float]) -> Array:
        """The positive forward-Euler sub-step for the velocity, capped by the step cap; shape (1,)."""
        _, ue, cap = vel
        m = self.mesh
        if not np.all(np.isfinite(ue)):
            return np.array([0.0]) * np.nan
        if self.p == 0:
            ratio = float(np.max(np.maximum(np.roll(ue, -1), 0.0) + np.maximum(-ue, 0.0))) / m.h
            lim = self.cfl / ratio if ratio > 0 else math.inf
        else:
            vmax = float(np.max(np.abs(ue)))
            lim = self.cfl * m.w_lobatto * m.h / vmax if vmax > 0 else math.inf
        return np.array([min(lim, cap)])

    # -- the depth loop -----------------------------------------------------------------------
    def solve(self, mu: Array, heads: HeadMeasure, T: float, steps: int, callback: Any = None,
              deadline: float = math.inf, depths: Array | None = None) -> CircleReport:
        """Transport μ_0 = ``mu`` to μ_T through ``steps`` equal depth steps of SSP-RK3 with CFL sub-steps.

        Args:
            mu: the nodal density (n, p+1); not modified.
            heads: the reduced head measure (β_h = a_h, weights c_h).
            T: final depth.
            steps: depth steps (the output depths), each sub-stepped by :func:`rk.depth_step`.
            callback: called as callback(step, t, μ_t) after every depth step (and with step 0 first).
            deadline: a ``time.process_time()`` value (CPU seconds) after which the solve stops (a check's budget).
            depths: the depth steps' ends t_0 = 0 < t_1 < … < t_steps = T (steps + 1,) instead of equal steps.

        Returns:
            The report, μ_T in ``mu_T``.

        Raises:
            NumericalError: non-finite values, too many sub-steps (:func:`rk.depth_step`), or past ``deadline``.
        """
        import time

        from mfpde.errors import NumericalError
        from mfpde.tokens.stepping import check_depth_step

        u = np.array(mu, dtype=float)
        ts = np.linspace(0.0, T, steps + 1) if depths is None else np.asarray(depths, float)
        mass0, nsub, min_mu = self.mesh.mass(u), [], float(self.mesh.cell_minima(u).min())
        if callback is not None:
            callback(0, 0.0, u)
        for k in range(steps):
            u, _, ns = rk.depth_step(rk.SSP_RK3, self, u, float(ts[k + 1] - ts[k]), heads, k, float(ts[k]))
            nsub.append(int(ns[0]))
            finite = bool(np.all(np.isfinite(u)))
            check_depth_step(k + 1, float(ts[k + 1]), finite, self.mesh.mass(u) if finite else math.nan, 0.0, mass0,
                             math.inf)
            min_mu = min(min_mu, float(self.mesh.cell_minima(u).min()))
            if callback is not None:
                callback(k + 1, float(ts[k + 1]), u)
            if time.process_time() > deadline:
                raise NumericalError(f"CPU-time budget exceeded at depth step {k + 1}, t = {ts[k + 1]:.6g}")
        return CircleReport(mass0, self.mesh.mass(u), min_mu, sum(nsub), self.limited_cells, u, nsub)


@dataclass
class CircleReport:
    """What a circle solve returns: masses, min μ_h, sub-steps, cells limited, μ_T.

    ``min_density`` is the least exact cell minimum at the depth steps; ``substeps`` the total,
    ``substeps_per_step`` the count of every depth step.
    """

    mass_0: float
    mass_T: float
    min_density: float
    substeps: int
    limited_cells: int
    mu_T: Array = field(repr=False)
    substeps_per_step: list[int] = field(default_factory=list, repr=False)

    @property
    def mass_error(self) -> float:
        """|∫μ_T − ∫μ_0| / ∫μ_0."""
        return abs(self.mass_T - self.mass_0) / self.mass_0
