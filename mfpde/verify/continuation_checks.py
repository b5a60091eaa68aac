"""Checks of every output of the continuation of noisy tokens (theory §10) against references it does not produce.

The reference for the states is :class:`ZonalReference`, written here from the definitions: the stationary
equation μ = e^{κ G∗μ}/∫e^{κ G∗μ} (κ = K/(τβ)) in the coefficients a_ℓ = ∫ μ φ_ℓ dσ of the zonal basis (cos ℓθ on
the circle's even states, P_ℓ(cos ϑ) on the sphere's zonal ones), where the kernel is diagonal, G∗φ_ℓ = λ_ℓ φ_ℓ
(λ_ℓ = 2π I_ℓ(β), 4π i_ℓ(β): scipy.special), parameterised by the amplitude a_k of the branch's mode and solved
by Newton (exact Jacobian from covariances; the trapezoidal rule on 512 angles, Gauss–Legendre on 128 nodes: exact
for the basis products, spectral for the Gibbs factor). No code of mfpde is used for it. The continuation under
test is :func:`mfpde.continuation_job.noisy_branches` (collocation, Keller's pseudo-arclength, PETSc SNES) and,
for the arclength and the landing, :func:`mfpde.continuation.continue_branch` itself.

* ``continuation_fold``: each fold of the report (circle β = 4, N = 81; sphere β = 3, N = 48) against the
  reference's extreme parameter K_f = min_a K(a) (scipy's bounded Brent over the amplitude, xatol 1e-9), to 1e-8
  relative; on S^15 (β = 2, N = 96) against the independent Gegenbauer solve of
  :mod:`mfpde.verify.hypersphere_reference` (its root of dK/da). The continuation locates t_K = 0 to
  |Δs| ≤ 1e-13 of the step and K is stationary there, so its own error is the Newton tolerance (≈ 1e-12
  relative); the collocation's is spectral, below the continued states' tail (≤ 1e-9 of the mean where the branch
  is continued); 1e-8 keeps a decade over both. The fold must also be
  a point of its branch and the branch's least K (to 4 ulps: the located point, not the step's start), and its
  amplitude (and |μ̂₁|) must be a_f to the resolution K(a) gives a at its minimum, √(8εK_f/|K''|) + xatol.
* ``continuation_curvature``: c₂ = dK/d(a²) and c₁ = dK/da of every bifurcation from the uniform state (circle
  β = 4 modes 1 and 2, sphere β = 3 degrees 1 and 2) against (i) the same definitions evaluated by the reference
  (Richardson on the even part (K(a) + K(−a))/2 at ρ, 2ρ; (K(ρ) − K(−ρ))/2ρ; ρ = 10⁻²), to 1e-7 in c₂ and 1e-8
  in c₁, times max(1, K_k) (the continuation's Newton tolerance, 10⁻¹² relative in K, over ρ² times Richardson's
  17/12, and over ρ, with a factor 5–10 to spare: the derivation of ``noisy_tricritical``), plus the reference's
  own round-off carried through the definitions; (ii) closed forms
  from the weakly nonlinear expansion
  (derived in :func:`closed_c2`, :func:`closed_c1`): c₂ = K_k (1 − 2r)/(2(1 − r)), r = I_{2k}(β)/I_k(β) (circle,
  mode k), c₂ = K_1 (3/5)(1 − 3r)/(1 − r), r = i_2(β)/i_1(β) (sphere, degree 1), c₁ = 0 for these and
  c₁ = −(5/7) K_2 (sphere, degree 2, transcritical; its c₂ against the reference's fit), and on S^15
  (β = 2, against :mod:`mfpde.verify.hypersphere_reference`) c₂ = K_1 d(1 − dr)/((d + 2)(1 − r)), r = λ_2/λ_1. The
  continuation's values carry the probes' truncation (c₂: −4c₆ρ⁴, c₁: c₃ρ²), which the reference measures by a fit
  of K(a) at ±ρ, ±2ρ, ±3ρ; the threshold is twice that term plus (i)'s. The reference's own fit at ρ/2 must meet
  the closed forms to its round-off (n ε K_c/|a| per probe through the fit) plus twice its Richardson estimate.
* ``continuation_stability``: the ``stable`` flag of every point of every branch (circle β = 4: the uniform branch,
  mode 1 through its fold, mode 2; sphere β = 3: the uniform branch, degree 1 through its fold) against the sign
  of the least eigenvalue of the free energy's second variation, δ²E[ν] = τ ∫ν²/μ − (K/β)∬ e^{β x·y} ν ν on the
  mass-zero perturbations in the metric ∫ν²/μ (numpy eigvalsh; the translation μ′, on S² the rotations s μ′ of the
  azimuthal order 1, left out; S²: the azimuthal orders m = 0..8, as the code's definition of stable), assembled
  here at the reference's state of the point's amplitude: for this gradient flow its sign is the linearisation's
  (Sylvester's law of inertia). Points within δ = 1e-8 max μ/min μ of 0 are not compared: the code calls a leading
  eigenvalue below 1e-9 stable (its eigensolver's round-off), and a marginal mode's eigenvalues of the two differ by
  the mobility ∫μ|∇(ν/μ)|²/∫ν²/μ ≥ min μ/max μ (Poincaré). At every point also: K against the reference's K(a)
  (bifurcating branches; their first point against τβ/I_k, τβ/i_k), the free energy E and the order parameter by
  the reference's quadrature, to 1e-7 relative (the collocation's tail ≤ 1e-9 where continued, times a sensitivity
  ≤ 100); on the uniform branch the leading eigenvalue against max_k k²(K I_k/β − τ) (sphere: ℓ(ℓ+1)(K i_ℓ/β − τ)),
  to 1e4 ε ‖L‖ (‖L‖ ≈ τ(N/2)², τN²: the round-off of the dense eigenvalues).
* ``continuation_arclength``: on the circle (β = 4, N = 81), the uniform branch over [0.38, 0.66] and the mode-1
  branch from K_c through its fold (clustered states, steps grown by 1.5 and halved): every point j satisfies
  Keller's condition ⟨t_b, x_j − x_b⟩_W = Δs_j for the point b it was predicted from (the branch's ``tangents``,
  ``bases``, ``steps``), to the Newton tolerance 1e-12 on the bordered residual (the condition is its last row) plus
  4(m+1)ε times the sums' terms; and every stored tangent (except at branch points, where the null space is
  two-dimensional) is the unit (in W) null vector of [∂F/∂u ∂F/∂K] computed here by an SVD, to 20 ε σ_1/σ_m.
* ``continuation_landing``: on the circle's uniform branch (N = 41, β = 1 and 2) steps of a fixed dyadic Δs ≈ K_c/8
  land on K_c exactly and 3·10⁻¹⁴ before and after it. The landing is inside the continuation's singular band
  (|det| ≤ 1e-12 |det before|; here ≈ 8 · 3·10⁻¹⁴) and outside the round-off of det (≈ 1e-16 relative), so each
  case has a known side. The run must find exactly the branch points K_c, at the landing point (within its offset
  + 8 ε of τβ/I_1(β)), and K_2 = τβ/I_2(β) within 1e-10 (the sign of det carried past the landing), as a run
  whose steps do not land on K_c does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import scipy.optimize
import scipy.special

from mfpde.verify.registry import Outcome, register

__all__ = ["ZonalReference", "closed_c1", "closed_c2", "second_variation_least"]

Array = npt.NDArray[np.float64]
EPS = float(np.finfo(float).eps)
#: The probes' amplitude of the continuation's c₂, c₁ (the docs' definition).
RHO = 1e-2
#: CPU budgets (full; quick: half) of each check.
BUDGET_S = 60.0
#: Bound on |c₂ − the same definition by the reference| and on |c₁ − ...| (module docstring).
C2_TOL, C1_TOL = 1e-7, 1e-8
FOLD_TOL = 1e-8
#: Brent's tolerance in the amplitude of the reference's fold.
FOLD_XATOL = 1e-9


class ZonalReference:
    """The stationary equation in zonal coefficients (module docstring), for one branch of mode ``k``.

    Args:
        domain: "circle" (even states, basis cos ℓθ) or "sphere" (zonal states, basis P_ℓ(cos ϑ)).
        beta, tau: β, τ.
        k: the branch's mode; its coefficients are those of ℓ in ``modes`` (default: the multiples of k, or all
            degrees on the sphere for odd k; the symmetry class of the branch).
        L: how many coefficients; nodes: the quadrature's nodes.
    """

    def __init__(self, domain: str, beta: float, tau: float, k: int = 1, L: int = 48, nodes: int = 0,
                 modes: Sequence[int] | None = None):
        self.domain, self.beta, self.tau, self.k = domain, float(beta), float(tau), int(k)
        if modes is None:
            modes = [k * j for j in range(1, L + 1)] if domain == "circle" or k % 2 == 0 else list(range(1, L + 1))
        self.modes = np.asarray(modes)
        if domain == "circle":
            n = nodes or 512
            x = 2 * math.pi * np.arange(n) / n
            self.w = np.full(n, 2 * math.pi / n)
            self.phi = np.cos(np.outer(self.modes, x))  # (L, n)
            lam = 2 * math.pi * scipy.special.iv(self.modes, self.beta)
            norm = np.full(len(self.modes), math.pi)
        else:
            n = nodes or 128
            z, wz = np.polynomial.legendre.leggauss(n)
            self.w = 2 * math.pi * wz
            self.phi = np.array([scipy.special.eval_legendre(int(ell), z) for ell in self.modes])
            lam = 4 * math.pi * scipy.special.spherical_in(self.modes, self.beta)
            norm = 4 * math.pi / (2 * self.modes + 1)
        self.g = lam / norm  # G∗μ = const + Σ_ℓ g_ℓ a_ℓ φ_ℓ
        self.i = int(np.flatnonzero(self.modes == k)[0])
        # at the uniform state a_k = κ g_k a_k ‖φ_k‖²/|Ω| (‖φ_k‖² = norm) ⇒ κ_c = |Ω|/λ_k
        area = 2 * math.pi if domain == "circle" else 4 * math.pi
        self.K_c = self.tau * self.beta * area / float(lam[self.i])
        self._cache: dict[float, Array] = {}

    def _gibbs(self, c: Array, kappa: float) -> tuple[Array, Array]:
        h = (self.g * c) @ self.phi
        e = kappa * h
        p = self.w * np.exp(e - e.max())
        return p / p.sum(), h

    def solve(self, a: float, guess: Array | None = None, tol: float = 1e-15) -> Array:
        """The stationary state of amplitude a: (a_ℓ for ℓ in modes, a_k = a; κ), by Newton to |F| ≤ ``tol``."""
        if guess is None:
            near = min(self._cache, key=lambda b: abs(b - a)) if self._cache else None
            if near is not None:
                guess = self._cache[near]
            else:
                guess = np.zeros(len(self.modes) + 1)
                guess[-1] = self.K_c / (self.tau * self.beta)
        z = np.array(guess, dtype=float)
        z[self.i] = a
        free = np.ones(len(z), bool)
        free[self.i] = False
        for _ in range(80):
            c, kappa = z[:-1], z[-1]
            p, h = self._gibbs(c, kappa)
            mean = self.phi @ p
            F = c - mean
            if np.max(np.abs(F)) <= tol:
                self._cache[float(a)] = z.copy()
                return z
            P = self.phi * p
            cov = P @ self.phi.T - np.outer(mean, mean)
            J = np.empty((len(c), len(z)))
            J[:, :-1] = np.eye(len(c)) - kappa * cov * self.g[None, :]
            J[:, -1] = -(P @ h - mean * (p @ h))
            dz = np.linalg.solve(J[:, free], -F)
            z[free] += dz
            if np.max(np.abs(dz)) <= 4 * EPS * max(1.0, np.max(np.abs(z))):
                self._cache[float(a)] = z.copy()
                return z
        raise ArithmeticError(f"the reference's Newton did not converge at amplitude {a:g} ({self.domain}, "
                              f"β = {self.beta:g}, mode {self.k})")

    def K(self, a: float) -> float:
        """The coupling of the stationary state of amplitude a."""
        return float(self.solve(a)[-1]) * self.tau * self.beta

    def fold(self, a_max: float = 0.95, da: float = 0.02) -> tuple[float, float]:
        """(K_f, a_f): the least K over the branch (a scan in a from 0, then scipy's bounded Brent, xatol 1e-9)."""
        grid, Ks = [], []
        a = da
        while a <= a_max:
            grid.append(a)
            Ks.append(self.K(a))
            if len(Ks) >= 3 and Ks[-1] > Ks[-2] < Ks[-3]:
                break
            a += da
        else:
            raise ArithmeticError("no fold in the reference's branch up to amplitude {a_max}")
        res = scipy.optimize.minimize_scalar(self.K, bounds=(grid[-3], grid[-1]), method="bounded",
                                             options={"xatol": FOLD_XATOL})
        return float(res.fun), float(res.x)

    def curvature_in_a(self, a: float, h: float = 1e-3) -> float:
        """K''(a) by the central difference (K(a + h) − 2K(a) + K(a − h))/h²."""
        return (self.K(a + h) - 2 * self.K(a) + self.K(a - h)) / h**2

    def probes(self, rho: float, count: int = 3) -> dict[float, float]:
        """K(a) at a = ±ρ, ±2ρ, …, ±count·ρ, each Newton from the previous."""
        out = {}
        for s in (1, -1):
            self._cache.clear()
            for j in range(1, count + 1):
                out[s * j * rho] = self.K(s * j * rho)
        return out


def closed_c2(domain: str, beta: float, tau: float, k: int, d: int = 3) -> float:
    """c₂ = dK/d(a²) at the branch point of mode k (circle) or degree 1 (sphere, S^{d−1}), from the expansion below.

    With g = κ Σ_ℓ g_ℓ a_ℓ φ_ℓ and |Ω|μ = e^g/⟨e^g⟩ (⟨·⟩ the mean over Ω), a_ℓ = ⟨(g + g²/2 + g³/6 − g⟨g²⟩/2) φ_ℓ⟩
    to third order. Circle, mode k (θ → kθ): a_{2k} = g_{2k}/2 + g_k²/8, so a_{2k} = g_k²/(8(1 − κI_{2k})); then
    a_k = g_k/2 + g_k g_{2k}/4 − g_k³/16 with g_k = 2κI_k a_k gives κ − κ_k = a²(1 − 2r)/(2I_k(1 − r)), r = I_{2k}/I_k.
    Sphere, degree 1 (⟨z²P_2⟩ = 2/15, ⟨z⁴⟩ = 1/5): a_2 = g_1²/(15(1 − κi_2)), a_1 = g_1/3 + (2/15)g_1g_2 − g_1³/45
    with g_1 = 3κ i_1 a, so κ − κ_1 = (3/5)a²(1 − 3r)/(i_1(1 − r)), r = i_2/i_1. K = τβκ. S^{d−1} (``domain``
    "hypersphere"), in the normalised measure with Gegenbauer P_ℓ(1) = 1, N_ℓ harmonics of degree ℓ, g_ℓ = κN_ℓλ_ℓa_ℓ:
    ⟨z²⟩ = 1/d, ⟨z⁴⟩ = 3/(d(d+2)), ⟨z²P_2⟩ = (d−1)/(dN_2), N_2 = (d+2)(d−1)/2 give
    κ − κ_1 = a² d(1 − dr)/(λ_1(d+2)(1 − r)), r = λ_2/λ_1: c₂ = K_1 d(1 − dr)/((d+2)(1 − r)) (d = 2, 3: the above).
    """
    if domain == "hypersphere":
        from mfpde.verify.hypersphere_special import k_c, lam

        r = float(lam(2, beta, d) / lam(1, beta, d))
        return k_c(beta, tau, d) * d * (1 - d * r) / ((d + 2) * (1 - r))
    if domain == "circle":
        r = float(scipy.special.iv(2 * k, beta) / scipy.special.iv(k, beta))
        return tau * beta / float(scipy.special.iv(k, beta)) * (1 - 2 * r) / (2 * (1 - r))
    if k != 1:
        raise ValueError("the sphere's closed form of c₂ is that of degree 1")
    i1, i2 = (float(scipy.special.spherical_in(j, beta)) for j in (1, 2))
    r = i2 / i1
    return tau * beta / i1 * 0.6 * (1 - 3 * r) / (1 - r)


def closed_c1(domain: str, beta: float, tau: float, k: int) -> float:
    """c₁ = dK/da at the branch point: 0 where a ↦ −a is a symmetry (every circle mode, odd degrees on S²).

    Sphere, degree 2: a_2 = g_2/5 + ⟨P_2³⟩g_2²/2 with ⟨P_2³⟩ = 2/35 and g_2 = 5κi_2 a, so κ − κ_2 = −(5/7)a/i_2 and
    c₁ = −(5/7) K_2, K_2 = τβ/i_2(β).
    """
    if domain == "circle" or k % 2 == 1:
        return 0.0
    if k != 2:
        raise ValueError("the sphere's closed form of c₁ is that of degree 2")
    return -5 / 7 * tau * beta / float(scipy.special.spherical_in(2, beta))


def _problem(domain: str, points: int, beta: float, tau: float) -> Any:
    from mfpde.tokens.circle.stationary import CircleStationary
    from mfpde.tokens.sphere.stationary import SphereStationary

    return (SphereStationary if domain == "sphere" else CircleStationary)(points, beta, tau)


def _continued(P: Any, lo: float, hi: float, step: float, max_points: int = 400) -> dict[str, Any]:
    """The report's part of the continuation in K ∈ [lo, hi] (dense eigenvalues)."""
    from mfpde.continuation import StepControl
    from mfpde.continuation_job import noisy_branches

    return noisy_branches(P, lo, hi, StepControl(step, 1e-9, 5 * step, lo, hi, max_points), eig_solver="scipy")


#: The fold cases: (domain, β, collocation points, the range of K); τ = 1.
FOLD_CASES = (("circle", 4.0, 81, (0.38, 0.415)), ("sphere", 3.0, 48, (1.18, 1.36)))
#: The hypersphere's fold case: (d, β, collocation points, the reference's Gauss–Jacobi nodes); τ = 1.
HYPERSPHERE_FOLD = (16, 2.0, 96, 80)


def _hypersphere_fold() -> tuple[Any, float, float, float, float, float]:
    """(the problem, lo, hi, K_f, a_f, K''(a_f)) on S^{d−1} by :mod:`mfpde.verify.hypersphere_reference`."""
    from mfpde.tokens.hypersphere.stationary import HypersphereStationary
    from mfpde.verify.hypersphere_reference import fold_maxwell_point, solve_state

    d, beta, n, nodes = HYPERSPHERE_FOLD
    ref = fold_maxwell_point(beta, 1.0, d, nodes)
    h = 1e-3
    Kpp = sum(c * solve_state(ref.a_f + j * h, beta, 1.0, d, nodes).K for j, c in ((-1, 1), (0, -2), (1, 1))) / h**2
    lo, hi = ref.K_f - 0.3 * (ref.K_c - ref.K_f), ref.K_c + 0.1 * (ref.K_c - ref.K_f)
    return HypersphereStationary(n, beta, 1.0, d), lo, hi, ref.K_f, ref.a_f, Kpp


def _tail(P: Any, u: Array) -> float:
    """The state's highest spectral coefficients (last eighth) over its mean, computed here (FFT; Legendre fit)."""
    mu = P.density(u)
    if P.domain == "circle":
        c = np.abs(np.fft.rfft(mu))
    else:
        z, _ = np.polynomial.legendre.leggauss(len(mu))
        c = np.abs(np.polynomial.legendre.legfit(z, mu, len(mu) - 1))
    return float(c[-max(2, len(c) // 8):].max() / c[0])


@register("continuation_fold", "§10 (folds of the bifurcating branches)",
          "K_f = min_a K(a) of an independent Newton solve in zonal coefficients (Fourier; Legendre), scipy Brent",
          kind="relative error", budget_s=BUDGET_S, distributed=False)
def check_continuation_fold(quick: bool) -> Outcome:
    """Each reported fold within 1e-8 of the reference's K_f; the fold is its branch's least K and one of its points."""
    rows, worst, ok = [], 0.0, True
    for domain, beta, n, (lo, hi) in (*FOLD_CASES, ("hypersphere", HYPERSPHERE_FOLD[1], HYPERSPHERE_FOLD[2], (0, 0))):
        if domain == "hypersphere":
            P, lo, hi, K_f, a_f, Kpp = _hypersphere_fold()
            domain = f"S^{HYPERSPHERE_FOLD[0] - 1}"
        else:
            P = _problem(domain, n, beta, 1.0)
            ref = ZonalReference(domain, beta, 1.0, 1)
            K_f, a_f = ref.fold()
            Kpp = ref.curvature_in_a(a_f)
        res = _continued(P, lo, hi, 0.04 * (hi - lo))
        # the fold's amplitude: K is flat there, so K(a) resolves a only to √(2 · 4ε K_f/|K''|) (4ε: K's round-off),
        # plus Brent's tolerance; the continuation's own (t_K = 0 to the Newton tolerance) is far below
        tol_a = FOLD_XATOL + math.sqrt(8 * EPS * K_f / abs(Kpp))
        folds = [e for e in res["bifurcations"] if e["kind"] == "fold"]
        if len(folds) != 1:
            return Outcome(math.inf, 0.0, f"≤ {FOLD_TOL:g}", False, f"{domain} β = {beta:g}: {len(folds)} folds "
                           f"reported in [{lo:g}, {hi:g}], the reference has one at K = {K_f:.12g}")
        f = folds[0]
        Ks = np.asarray(res["branches"][f["branch"]]["parameter"])
        err = abs(f["parameter"] - K_f) / K_f
        ulp = 4 * EPS * abs(f["parameter"])
        on_branch = float(np.min(np.abs(Ks - f["parameter"])))
        least = float(f["parameter"] - Ks.min())
        err_a = max(abs(f["amplitude"] - a_f), abs(f["order_parameter"] - a_f))  # mode 1: |μ̂₁| is the amplitude
        ok &= err <= FOLD_TOL and on_branch <= ulp and abs(least) <= ulp and err_a <= tol_a
        worst = max(worst, err)
        rows.append(f"{domain} β = {beta:g} (N = {n}): K_f {f['parameter']:.13g} vs {K_f:.13g} ({err:.1e}), "
                    f"amplitude {f['amplitude']:.10f} vs {a_f:.10f} ({err_a:.1e} ≤ {tol_a:.1e}); nearest point "
                    f"{on_branch:.1e}, above the branch's least K by {least:.1e}")
    return Outcome(worst, 0.0, f"≤ {FOLD_TOL:g}; the fold a point of its branch and its least K (4 ulps); its "
                   "amplitude within K(a)'s resolution of a_f", ok, "; ".join(rows), tolerance=FOLD_TOL)


#: The curvature cases: (domain, β, collocation points, the bifurcations' modes); τ = 1; the full check adds the
#: supercritical side of β*.
CURVATURE_CASES = (("circle", 4.0, 41, (1, 2)), ("sphere", 3.0, 32, (1, 2)))
CURVATURE_FULL = (("circle", 2.0, 41, (1, 2, 3)), ("sphere", 1.0, 32, (1, 2, 3)))


def _fitted_derivatives(probes: dict[float, float], K_c: float,
                        nodes: int) -> tuple[float, float, float, float, float, float]:
    """(c₁, c₂, c₃, c₆, δc₁, δc₂): K(a) − K_c = Σ_{j=1..6} c_j a^j through the six probes ±ρ, ±2ρ, ±3ρ.

    δc: the probes' round-off carried through the fit, Σ_i |V⁻¹_ji| δK_i with δK_i = n ε K_c/|a_i|: the reference's
    residual a_k − ∫φ_k p is a sum of n terms of total size ≤ 1 (exact to n ε), and ∂F_k/∂κ ≈ −a/κ_k vanishes like
    a, so K = τβκ carries n ε K_c/|a|.
    """
    a = np.array(sorted(probes))
    Vi = np.linalg.inv(np.vander(a, 7, increasing=True)[:, 1:])
    c = Vi @ (np.array([probes[x] for x in a]) - K_c)
    dc = np.abs(Vi) @ (nodes * EPS * abs(K_c) / np.abs(a))
    return float(c[0]), float(c[1]), float(c[2]), float(c[5]), float(dc[0]), float(dc[1])


@register("continuation_curvature", "§10 (super-, subcritical and transcritical bifurcations)",
          "c₂, c₁ by an independent Newton solve at small amplitudes; closed forms of the weakly nonlinear expansion",
          kind="error/tolerance", budget_s=BUDGET_S, distributed=False)
def check_continuation_curvature(quick: bool) -> Outcome:
    """c₂ and c₁ of every bifurcation against the reference's probes and the closed forms (module docstring)."""
    rows, ok, worst = [], True, 0.0
    for domain, beta, n, modes in CURVATURE_CASES + (() if quick else CURVATURE_FULL):
        P = _problem(domain, n, beta, 1.0)
        for k in modes:
            Kk = P.threshold(k)
            res = _continued(P, 0.97 * Kk, 1.03 * Kk, 0.02 * Kk, 60)
            bif = [e for e in res["bifurcations"] if "curvature" in e and e["mode"] == k]
            if len(bif) != 1:
                return Outcome(math.inf, 0.0, "one bifurcation", False, f"{domain} β = {beta:g}: {len(bif)} "
                               f"bifurcations of mode {k} in [{0.97 * Kk:.6g}, {1.03 * Kk:.6g}]")
            c2, c1 = float(bif[0]["curvature"]), float(bif[0]["slope"])
            ref = ZonalReference(domain, beta, 1.0, k)
            pr = ref.probes(RHO)
            K0 = ref.K_c
            even = {j: 0.5 * (pr[j * RHO] + pr[-j * RHO]) for j in (1, 2)}  # K's even part (the code's definition)
            d2 = (16 * (even[1] - K0) - (even[2] - K0)) / (12 * RHO**2)  # the definition, by the reference
            d1 = (pr[RHO] - pr[-RHO]) / (2 * RHO)
            f1, f2, f3, f6, _, _ = _fitted_derivatives(pr, K0, len(ref.w))
            # the fit at ρ/2: its truncation is ≈ Δ/63 (ρ⁶)
            h1, h2, _, _, dh1, dh2 = _fitted_derivatives(ref.probes(RHO / 2), K0, len(ref.w))
            # the sphere's c₂ of degrees ≥ 2 has no closed form here: the reference's own (its fit at ρ/2) instead
            closed = domain == "circle" or k == 1
            want2 = closed_c2(domain, beta, 1.0, k) if closed else h2
            want1 = closed_c1(domain, beta, 1.0, k)
            # the probes' truncation: Richardson on the even part leaves −4c₆ρ⁴, the central difference c₃ρ² (the
            # fit's c₆, c₃; twice them for the higher orders the fit leaves out); the Newton tolerance bounds K to
            # a relative precision: the bounds of (i) scale with max(1, K_k)
            t2, t1 = C2_TOL * max(1.0, Kk), C1_TOL * max(1.0, Kk)
            tol2 = t2 + 8 * abs(f6) * RHO**4
            tol1 = t1 + 2 * abs(f3) * RHO**2
            # the reference's round-off in the definitions: δK(a) = n ε K_c/|a| (:func:`_fitted_derivatives`) through
            # (16 δK_e(ρ) + δK_e(2ρ))/12ρ² and (δK(ρ) + δK(−ρ))/2ρ
            r2, r1 = 16.5 / 12 * len(ref.w) * EPS * K0 / RHO**3, len(ref.w) * EPS * K0 / RHO**2
            # the reference's own c₂, c₁ (the fit at ρ/2) against the closed forms: the fit's round-off (δc) plus
            # twice its truncation estimated by Richardson from the fit at ρ (the expansion's check)
            ref2 = dh2 + 2 * abs(f2 - h2) / 63
            ref1 = dh1 + 2 * abs(f1 - h1) / 63
            if not closed:  # compared with the reference's fit: its bound too
                tol2 += ref2
            errs = (abs(c2 - d2), abs(c1 - d1), abs(c2 - want2), abs(c1 - want1),
                    abs(h2 - want2) if closed else 0.0, abs(h1 - want1))
            tols = (t2 + r2, t1 + r1, tol2, tol1, ref2, ref1)
            ok &= all(e <= t for e, t in zip(errs, tols, strict=True))
            worst = max(worst, max(e / t for e, t in zip(errs, tols, strict=True)))
            rows.append(f"{domain} β = {beta:g} mode {k}: c₂ {c2:.10g} (definition {d2:.10g}, "
                        f"{'closed form' if closed else 'the reference fit'} "
                        f"{want2:.10g}), c₁ {c1:.4g} (definition {d1:.4g}, closed form {want1:.6g}); errors "
                        + ", ".join(f"{e:.1e}/{t:.1e}" for e, t in zip(errs, tols, strict=True)))
    e, line = _hypersphere_curvature()
    ok &= e <= 1.0
    worst = max(worst, e)
    rows.append(line)
    return Outcome(worst, None, "≤ 1 (error / tolerance: c₂ vs its definition 1e-7 max(1, K_k), c₁ 1e-8 "
                   "max(1, K_k); vs the closed forms those plus the probes' truncation)", ok, "; ".join(rows),
                   tolerance=1.0)


#: The hypersphere's curvature case: (d, β, collocation points, the reference's Gauss–Jacobi nodes); τ = 1.
HYPERSPHERE_CURVATURE = (16, 2.0, 32, 80)


def _hypersphere_curvature() -> tuple[float, str]:
    """(the largest error/tolerance, a line) of c₂, c₁ on S^{d−1} against :mod:`mfpde.verify.hypersphere_reference`.

    The reference's states are those of a > 0 (the branch is symmetric in a): K(a) − K_c = c₂a² + c₄a⁴ + c₆a⁶
    through ρ, 2ρ, 3ρ, and again through ρ/2, ρ, 3ρ/2 for its Richardson estimate; c₁ = 0 by the symmetry.
    """
    from mfpde.tokens.hypersphere.stationary import HypersphereStationary
    from mfpde.verify.hypersphere_reference import solve_state
    from mfpde.verify.hypersphere_special import k_c

    d, beta, n, nodes = HYPERSPHERE_CURVATURE
    P = HypersphereStationary(n, beta, 1.0, d, rule="gauss")  # exact for the uniform state's polynomials
    Kk = P.threshold(1)
    res = _continued(P, 0.97 * Kk, 1.03 * Kk, 0.02 * Kk, 60)
    bif = [e for e in res["bifurcations"] if "curvature" in e and e["mode"] == 1]
    if len(bif) != 1:
        return math.inf, f"S^{d - 1} β = {beta:g}: {len(bif)} bifurcations of degree 1"
    c2, c1 = float(bif[0]["curvature"]), float(bif[0]["slope"])
    K0 = k_c(beta, 1.0, d)
    fits = []
    for rho in (RHO, RHO / 2):
        a = rho * np.arange(1, 4)
        K = np.array([solve_state(float(x), beta, 1.0, d, nodes).K for x in a])
        Vi = np.linalg.inv(np.column_stack([a**2, a**4, a**6]))
        # the probes' round-off carried through the fit: n ε K_c/a per probe (as in :func:`_fitted_derivatives`)
        fits.append((Vi @ (K - K0), float((np.abs(Vi) @ (nodes * EPS * K0 / a))[0]), K))
    (f, _, K), (h, dh2, _) = fits
    d2 = (16 * (K[0] - K0) - (K[1] - K0)) / (12 * RHO**2)  # the definition, by the reference
    want2 = closed_c2("hypersphere", beta, 1.0, 1, d)
    t2, t1 = C2_TOL * max(1.0, Kk), C1_TOL * max(1.0, Kk)
    errs = (abs(c2 - d2), abs(c1), abs(c2 - want2), abs(h[0] - want2))
    r2 = 16.5 / 12 * nodes * EPS * K0 / RHO**3  # the reference's round-off in the definition
    tols = (t2 + r2, t1, t2 + 8 * abs(f[2]) * RHO**4, dh2 + 2 * abs(f[0] - h[0]) / 63)
    line = (f"S^{d - 1} β = {beta:g} degree 1: c₂ {c2:.10g} (definition {d2:.10g}, closed form {want2:.10g}), c₁ "
            f"{c1:.4g} (closed form 0); errors "
            + ", ".join(f"{e:.1e}/{t:.1e}" for e, t in zip(errs, tols, strict=True)))
    return max(e / t for e, t in zip(errs, tols, strict=True)), line


def second_variation_least(mu: Array, dmu: Array | None, K: float, beta: float, tau: float) -> float:
    """The least eigenvalue of δ²E on the mass-zero perturbations of a state μ on the circle, μ′ left out.

    μ at N equispaced angles (N ≫ the state's bandwidth); metric ∫ν²/μ. With ψ = ν √(h/μ):
    δ²E = τ|ψ|² − (K/β) h ψᵀ S G S ψ, S = diag √μ, G_ij = e^{β cos(θ_i − θ_j)}, on ψ ⊥ √μ (mass zero) and, where
    ``dmu`` (μ′ at the angles) is given, ψ ⊥ μ′/√μ (the translation, eigenvalue 0).
    """
    N = len(mu)
    h = 2 * math.pi / N
    th = h * np.arange(N)
    G = np.exp(beta * np.cos(th[:, None] - th[None, :]))
    s = np.sqrt(mu)
    H = tau * np.eye(N) - (K / beta) * h * (s[:, None] * G * s[None, :])
    cons = [s] if dmu is None else [s, dmu / s]
    Q = np.linalg.svd(np.array(cons).T, full_matrices=True)[0][:, len(cons):]
    return float(np.linalg.eigvalsh(Q.T @ H @ Q)[0])


def _circle_state(ref: ZonalReference, a: float, n: int) -> tuple[Array, Array | None, float]:
    """(μ, μ′ (None for the uniform state), K) of the reference's state of amplitude a at n angles."""
    th = 2 * math.pi * np.arange(n) / n
    if a == 0.0:
        return np.full(n, 1 / (2 * math.pi)), None, math.nan
    z = ref.solve(a)
    c, kappa = z[:-1], z[-1]
    hh = (ref.g * c) @ np.cos(np.outer(ref.modes, th))
    dh = -(ref.g * c * ref.modes) @ np.sin(np.outer(ref.modes, th))
    e = np.exp(kappa * (hh - hh.max()))
    mu = e / (2 * math.pi / n * e.sum())
    return mu, kappa * dh * mu, float(kappa) * ref.tau * ref.beta


def azimuthal_kernels(t: Array, beta: float, orders: int = 8) -> list[Array]:
    """K_m(t, t′) = 2π I_m(β s s′) e^{β t t′} at the nodes t, m = 0..orders (s = √(1 − t²))."""
    s = np.sqrt(1 - t**2)
    ss, tt = beta * np.outer(s, s), beta * np.outer(t, t)
    return [2 * math.pi * scipy.special.ive(m, ss) * np.exp(ss + tt) for m in range(orders + 1)]


def sphere_second_variation_least(t: Array, w: Array, mu: Array, dmu: Array | None, K: float, beta: float,
                                  tau: float, kernels: Sequence[Array]) -> float:
    """The least eigenvalue of δ²E on perturbations f(t) cos mφ, m = 0..orders, of a zonal state on S².

    Gauss–Legendre nodes t, weights w; μ and μ′ at them. δ²E = c_m [τ∫f²/μ dt − (K/β)∬ f K_m f′], c_0 = 2π,
    c_m = π, K_m(t, t′) = 2π I_m(β s s′) e^{β t t′} (s = √(1 − t²)), in the metric ∫f²/μ dt; m = 0 on ∫f dt = 0,
    m = 1 without the rotations f = s μ′ (where ``dmu`` is given); ``kernels``: :func:`azimuthal_kernels`.
    """
    s = np.sqrt(1 - t**2)
    r = np.sqrt(w * mu)
    least = math.inf
    for m, Km in enumerate(kernels):
        H = tau * np.eye(len(t)) - (K / beta) * (r[:, None] * Km * r[None, :])
        cons = [r] if m == 0 else ([s * dmu * np.sqrt(w / mu)] if m == 1 and dmu is not None else [])
        if cons:
            Q = np.linalg.svd(np.array(cons).T, full_matrices=True)[0][:, len(cons):]
            H = Q.T @ H @ Q
        least = min(least, float(np.linalg.eigvalsh(H)[0]))
    return least


def _sphere_state(ref: ZonalReference, a: float, t: Array) -> tuple[Array, Array | None, float]:
    """(μ, μ′ (None for the uniform state), K) of the reference's zonal state of amplitude a at the nodes t."""
    if a == 0.0:
        return np.full(len(t), 1 / (4 * math.pi)), None, math.nan
    z = ref.solve(a)
    c, kappa = z[:-1], z[-1]
    P = np.array([scipy.special.eval_legendre(int(ell), t) for ell in ref.modes])
    dP = np.array([np.polynomial.legendre.legval(t, np.polynomial.legendre.legder(np.eye(int(ell) + 1)[-1]))
                   for ell in ref.modes])
    hh, dh = (ref.g * c) @ P, (ref.g * c) @ dP
    e = np.exp(kappa * (hh - hh.max()))
    _, wz = np.polynomial.legendre.leggauss(len(t))
    mu = e / (2 * math.pi * float(wz @ e))
    return mu, kappa * dh * mu, float(kappa) * ref.tau * ref.beta


class _Domain:
    """A domain's reference quantities at a state of the reference (circle: 256 angles; sphere: 64 Gauss nodes)."""

    def __init__(self, domain: str, beta: float, tau: float):
        self.domain, self.beta, self.tau = domain, beta, tau
        if domain == "circle":
            self.x = 2 * math.pi * np.arange(FINE) / FINE
            self.w = np.full(FINE, 2 * math.pi / FINE)
            self.G = np.exp(beta * np.cos(self.x[:, None] - self.x[None, :]))  # ∬ e^{β cos} = Σ w w G
            self.first = np.cos(self.x)
        else:
            t, wz = np.polynomial.legendre.leggauss(FINE // 4)
            self.x, self.w = t, 2 * math.pi * wz
            s = np.sqrt(1 - t**2)
            ss = beta * np.outer(s, s)
            # ∬_{S²×S²} e^{β x·y} μ μ = Σ w_i w_j μ_i μ_j I_0(β s s′) e^{β t t′}: the azimuths give 2π · 2π / (2π)²
            self.G = scipy.special.ive(0, ss) * np.exp(ss + beta * np.outer(t, t))
            self.first = t
            self.kernels = azimuthal_kernels(t, beta)

    def state(self, ref: ZonalReference, a: float) -> tuple[Array, Array | None, float]:
        """(μ, μ′, K) of the reference's state of amplitude a."""
        return _circle_state(ref, a, FINE) if self.domain == "circle" else _sphere_state(ref, a, self.x)

    def threshold(self, k: int) -> float:
        """τβ/I_k(β), τβ/i_k(β)."""
        f = scipy.special.iv if self.domain == "circle" else scipy.special.spherical_in
        return self.tau * self.beta / float(f(k, self.beta))

    def free_energy(self, mu: Array, K: float) -> float:
        """E(μ) = τ∫μ log μ − (K/2β)∬ e^{β x·y} μ μ by the reference's quadrature."""
        wm = self.w * mu
        return self.tau * float(wm @ np.log(mu)) - K / (2 * self.beta) * float(wm @ self.G @ wm)

    def order_parameter(self, mu: Array) -> float:
        """|∫ μ cos θ dθ|, |∫ μ x_3 dσ|."""
        return abs(float((self.w * mu) @ self.first))

    def uniform_leading(self, K: float, n: int) -> float:
        """The uniform state's leading eigenvalue: max_k k²(K I_k(β)/β − τ), max_ℓ ℓ(ℓ+1)(K i_ℓ(β)/β − τ) (§10)."""
        if self.domain == "circle":
            k = np.arange(1, n // 2 + 1)
            return float(np.max(k**2 * (K * scipy.special.iv(k, self.beta) / self.beta - self.tau)))
        ell = np.arange(1, n - 1)
        return float(np.max(ell * (ell + 1) * (K * scipy.special.spherical_in(ell, self.beta) / self.beta - self.tau)))

    def least(self, mu: Array, dmu: Array | None, K: float) -> float:
        """The least eigenvalue of δ²E (:func:`second_variation_least`, :func:`sphere_second_variation_least`)."""
        if self.domain == "circle":
            return second_variation_least(mu, dmu, K, self.beta, self.tau)
        return sphere_second_variation_least(self.x, self.w / (2 * math.pi), mu, dmu, K, self.beta, self.tau,
                                             self.kernels)


#: The stability cases: (domain, β, collocation points, the range of K); τ = 1: the circle's uniform branch, mode 1
#: through its fold, mode 2; the sphere's uniform branch and degree 1 through its fold.
STABILITY_CASES = (("circle", 4.0, 81, (0.38, 0.66)), ("sphere", 3.0, 48, (1.18, 1.40)))
#: The code's stable band (1e-9 on the linearisation's leading eigenvalue) times 10, carried to δ²E by the mobility's
#: least Rayleigh quotient ∫μ|∇(ν/μ)|²/∫ν²/μ ≥ min μ/max μ (Poincaré on the circle and S², mean-zero ν/μ under μ):
#: δ = 1e-8 max μ/min μ.
STABILITY_BAND = 1e-8
FINE = 256
#: Bound on the relative error of a point's K, E and order parameter against the reference's state of its amplitude:
#: the collocation's tail (≤ 1e-9 where the branch is continued) times a sensitivity ≤ 100 (module docstring).
POINT_TOL = 1e-7


@register("continuation_stability", "§10 (stability of the stationary states)",
          "the sign of the least eigenvalue of the free energy's second variation at an independent state (eigvalsh)",
          kind="mismatches", budget_s=BUDGET_S, distributed=False)
def check_continuation_stability(quick: bool) -> Outcome:
    """Every point's ``stable`` against δ²E's least eigenvalue; its K, E, |μ̂₁|, λ_lead against the reference."""
    tau = 1.0
    bad, compared, skipped, rows, worst = 0, 0, 0, [], 0.0
    for domain, beta, n, (lo, hi) in STABILITY_CASES:
        P = _problem(domain, n, beta, tau)
        D = _Domain(domain, beta, tau)
        res = _continued(P, lo, hi, 0.04 * (hi - lo))
        # the collocation linearisation's round-off: 1e4 ε ‖L‖, ‖L‖ ≈ τ (N/2)² (circle), τ N² (sphere)
        lead_tol = 1e4 * EPS * tau * ((n / 2) ** 2 if domain == "circle" else n**2)
        refs: dict[int, ZonalReference] = {}
        for b in res["branches"]:
            uniform = b["origin"] == "uniform"
            ref = refs.setdefault(b["mode"], ZonalReference(domain, beta, tau, b["mode"]))
            mism = []
            for K, amp, r, E, st, lead in zip(b["parameter"], b["amplitude"], b["order_parameter"], b["free_energy"],
                                              b["stable"], b["leading_eigenvalue"], strict=True):
                # a branch's first point is its branch point: the uniform state (amplitude 0 to round-off), at K_k
                flat = uniform or amp <= 1e-8
                mu, dmu, K_ref = D.state(ref, 0.0 if flat else amp)
                K_k = D.threshold(b["mode"])
                errs = [abs(K_ref - K) / K if not flat else (0.0 if uniform else abs(K - K_k) / K_k),
                        abs(D.free_energy(mu, K) - E) / max(1.0, abs(E)), abs(r - D.order_parameter(mu))]
                if uniform:
                    errs.append(abs(lead - D.uniform_leading(K, n)) / lead_tol * POINT_TOL)
                worst = max(worst, *errs)
                if max(errs) > POINT_TOL:
                    mism.append(f"K = {K:.8g}: errors of K, E, order parameter, λ {[f'{e:.1e}' for e in errs]}")
                lam = D.least(mu, dmu, K)
                if abs(lam) <= STABILITY_BAND * float(mu.max() / mu.min()):
                    skipped += 1
                    continue
                compared += 1
                if (lam > 0) != bool(st):
                    mism.append(f"K = {K:.8g}: δ²E's least {lam:.3g}, stable = {st}")
            bad += len(mism)
            rows.append(f"{domain} β = {beta:g} {b['origin']}: {len(b['stable'])} points, {sum(b['stable'])} stable"
                        + (f", mismatches {mism[:3]}" if mism else ""))
    return Outcome(float(bad), 0.0, f"0 mismatches ({compared} points compared, {skipped} within {STABILITY_BAND:g} "
                   f"max μ/min μ of marginal; K, E, order parameter within {POINT_TOL:g}, λ_lead on the uniform "
                   "branch within 1e4 ε ‖L‖)", bad == 0 and compared > 0, f"worst {worst:.1e}; " + "; ".join(rows),
                   tolerance=0.0)


def null_tangent(P: Any, x: Array, W: Array) -> tuple[Array, float]:
    """(the unit (in W) null vector of [∂F/∂u ∂F/∂K] at x by an SVD, σ_1/σ_m: the condition of that null space)."""
    m = len(x) - 1
    Ju, JK = P.jacobian(x[:m], float(x[m]))
    s = np.sqrt(W)
    _, sv, Vt = np.linalg.svd(np.column_stack([Ju, JK]) / s[None, :])
    v = Vt[-1] / s
    return v / math.sqrt(float(np.sum(W * v * v))), float(sv[0] / sv[-1])


#: The arclength case: circle β = 4, τ = 1, N = 81; the uniform branch over [0.38, 0.66] and the mode-1 branch from
#: K_c through its fold to K = 0.38; steps from 2e-3 (grown by 1.5, halved) to 0.02.
ARCLENGTH_CASE = (4.0, 81, (0.38, 0.66))
#: The Newton tolerance of the continuation (:class:`mfpde.continuation.Newton`'s default ``atol``).
NEWTON_ATOL = 1e-12
#: A point whose [∂F/∂u ∂F/∂K] has σ_m/σ_1 below this is a branch point (a two-dimensional null space): no tangent.
SINGULAR_NULL = 1e-8


@register("continuation_arclength", "§10 (pseudo-arclength continuation)",
          "Keller's condition ⟨t_b, x_j − x_b⟩_W = Δs_j and the null vector of [∂F/∂u ∂F/∂K] by an SVD",
          kind="error/tolerance", budget_s=BUDGET_S, distributed=False)
def check_continuation_arclength(quick: bool) -> Outcome:
    """Max over the branches' points of |⟨t_b, x_j − x_b⟩_W − Δs_j| and ‖t_j − null vector‖_W over their bounds."""
    from mfpde.continuation import Newton, StepControl, branch_direction, continue_branch

    beta, n, (lo, hi) = ARCLENGTH_CASE
    P = _problem("circle", n, beta, 1.0)
    W = P.inner_weights()
    m = P.m
    ctl = StepControl(2e-3, 1e-9, 0.02, lo, hi, 400)
    e_K = np.zeros(m + 1)
    e_K[m] = 1.0
    with Newton(P, m) as nw:
        uni = continue_branch(P, nw, np.concatenate([P.uniform(), [lo]]), e_K, W, ctl, regular_start=True)
        bp = next((e for e in uni.events if e.kind == "branch_point"), None)
        if bp is None:
            return Outcome(math.inf, 0.0, "≤ 1", False, "no branch point on the uniform branch")
        x_bp = np.concatenate([bp.u, [bp.K]])
        d = branch_direction(P, x_bp, bp.tangent, W)
        if float(P.amplitude(1) @ d[:m]) < 0:
            d = -d
        clustered = continue_branch(P, nw, x_bp, d, W, ctl, P.resolved)
    worst, rows, ok = 0.0, [], True
    for name, br in (("uniform", uni), ("mode 1", clustered)):
        X = [np.concatenate([u, [K]]) for u, K in zip(br.u, br.K, strict=True)]
        if not (len(br.tangents) == len(br.bases) == len(br.steps) == len(X)):
            return Outcome(math.inf, 0.0, "≤ 1", False, f"{name}: {len(X)} points but {len(br.tangents)} tangents, "
                           f"{len(br.bases)} bases, {len(br.steps)} steps")
        arc, tan, skipped = 0.0, 0.0, 0
        for j in range(1, len(X)):
            b, t = br.bases[j], br.tangents[br.bases[j]]
            prod = W * t * (X[j] - X[b])
            # the Newton tolerance on the bordered residual (its last row is the condition) plus the round-off of
            # the sums: (m+1) ε over the terms' magnitudes, and ⟨t, t⟩_W = 1 to (m+1) ε
            terms = float(np.sum(np.abs(W * t * X[j])) + np.sum(np.abs(W * t * X[b])))
            bound = NEWTON_ATOL + 4 * (m + 1) * EPS * (terms + abs(br.steps[j]))
            arc = max(arc, abs(float(prod.sum()) - br.steps[j]) / bound)
        for j, x in enumerate(X):
            v, cond = null_tangent(P, x, W)
            if 1 / cond < SINGULAR_NULL:
                skipped += 1
                continue
            t = br.tangents[j]
            v = v if float(np.sum(W * v * t)) > 0 else -v
            # the null vector's round-off: ε σ_1/σ_m for each of the two solves, a factor 10 for the operation count
            tan = max(tan, math.sqrt(float(np.sum(W * (t - v) ** 2))) / (20 * EPS * cond))
        worst = max(worst, arc, tan)
        ok &= arc <= 1.0 and tan <= 1.0
        rows.append(f"{name}: {len(X)} points, K in [{min(br.K):.6g}, {max(br.K):.6g}], Δs in "
                    f"[{min(br.steps[1:]):.2e}, {max(br.steps[1:]):.2e}], {len(br.events)} events; arclength "
                    f"error/bound {arc:.2g}, tangent error/bound {tan:.2g} ({skipped} branch points skipped)")
    return Outcome(worst, None, "≤ 1 (|⟨t_b, x_j − x_b⟩_W − Δs_j| ≤ 1e-12 + 4(m+1)ε Σ|terms|; ‖t_j − null "
                   "vector‖_W ≤ 20 ε σ_1/σ_m)", ok, "; ".join(rows), tolerance=1.0)


#: The landing cases: circle, τ = 1, N = 41, β = 1 and 2 (full: also 0.5 and 4); where the third step lands: K_c,
#: K_c(1 ± 3e-14).
LANDING_BETAS = {True: (1.0, 2.0), False: (0.5, 1.0, 2.0, 4.0)}
LANDING_OFFSETS = (0.0, 3e-14, -3e-14)


def _dyadic_step(K: float) -> float:
    """The power of 2 nearest below K/8: steps of it from K − 3Δs reach K exactly in floating point."""
    return 2.0 ** math.floor(math.log2(K / 8))


@register("continuation_landing", "§10 (branch points on a step)",
          "K_c = τβ/I_1(β) (scipy) and the same branch continued with steps that do not land on it",
          kind="rel. error", budget_s=BUDGET_S, distributed=False)
def check_continuation_landing(quick: bool) -> Outcome:
    """Steps landing on K_c (exactly, and 3e-14 before and after it): the branch points K_c and K_2, nothing else."""
    from mfpde.continuation import Newton, StepControl, continue_branch

    worst, rows, ok = 0.0, [], True
    for beta in LANDING_BETAS[quick]:
        P = _problem("circle", 41, beta, 1.0)
        W = P.inner_weights()
        m = P.m
        e_K = np.zeros(m + 1)
        e_K[m] = 1.0
        Kc = float(1.0 * beta / scipy.special.iv(1, beta))
        K2 = float(1.0 * beta / scipy.special.iv(2, beta))
        runs = []
        with Newton(P, m) as nw:
            for off in (*LANDING_OFFSETS, None):
                if off is None:  # not landing: steps of an irrational size from an unrelated start
                    ds, lo = math.sqrt(2) * Kc / 11, 0.5 * Kc * math.sqrt(1.1)
                else:
                    target = Kc * (1 + off)
                    ds = _dyadic_step(target)
                    lo = target - 3 * ds
                hi = K2 + 2 * ds
                br = continue_branch(P, nw, np.concatenate([P.uniform(), [lo]]), e_K, W,
                                     StepControl(ds, ds, ds, lo, hi, 200), regular_start=True)
                bps = [e.K for e in br.events if e.kind == "branch_point"]
                landed = off is not None and any(K == target for K in br.K)
                runs.append((off, bps, landed))
        ref = runs[-1][1]
        for off, bps, landed in runs:
            tol_c = (abs(off) if off else 0.0) + 8 * EPS if off is not None else 1e-10
            good = len(bps) == 2 and (off is None or landed)
            if good:
                e_c, e_2 = abs(bps[0] - Kc) / Kc, abs(bps[1] - K2) / K2
                e_ref = max(abs(a - b) / b for a, b in zip(bps, ref, strict=True)) if len(ref) == 2 else math.inf
                good = e_c <= tol_c and e_2 <= 1e-10 and e_ref <= max(tol_c, 1e-10)
                worst = max(worst, e_c)
            ok &= good
            rows.append(f"β = {beta:g}, {'no landing' if off is None else f'landing at K_c(1 + {off:g})'}: "
                        f"{'landed, ' if landed else ''}branch points {[f'{k:.16g}' for k in bps]}"
                        + ("" if good else " WRONG"))
    return Outcome(worst, 0.0, "one branch point at K_c within the landing's offset + 8 ε and K_2 within 1e-10, "
                   "in every run (1e-10 where not landing)", ok, f"K_c = {Kc:.16g}; " + "; ".join(rows))
