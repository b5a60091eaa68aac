"""Peer: stationary states of noisy USA tokens on S¹ and S² (zonal) by spectral Newton + pseudo-arclength.

Written from mfpde's user docs alone (docs/continuation.md, phase_transitions.md, theory.md §10, circle.md,
sphere.md, conventions.md and demos/noisy_circle.toml, noisy_sphere.toml), without reading mfpde's source.

Model (docs): μ a probability density w.r.t. dθ (S¹) or dσ (S²), stationary iff μ = exp(κ G∗μ)/Z with
κ = K/(τβ), G∗μ(x) = ∫ e^{β x·y} μ(y) dy. In the basis where the kernel is diagonal the unknowns are the
amplitudes a_k = ∫ μ c_k (the docs' "amplitude"):

- S¹, even states: c_k = cos kθ, μ = (1/2π)(1 + 2Σ a_k cos kθ), G∗μ = I_0(β) + Σ 2I_k(β) a_k cos kθ;
- S², zonal states: c_ℓ = P_ℓ(cos ϑ), μ = (1/4π)(1 + Σ(2ℓ+1) b_ℓ P_ℓ), G∗μ = i_0(β) + Σ (2ℓ+1) i_ℓ(β) b_ℓ P_ℓ
  (Funk–Hecke, i_ℓ the modified spherical Bessel function).

So F(a, K) = a − E_p[c], p ∝ exp(κ Σ_j g_j a_j c_j), g_j = 2I_j (S¹) or (2j+1)i_j (S²), with the exact Jacobian
∂F_k/∂a_j = δ_kj − κ g_j Cov_p(c_k, c_j), ∂F/∂K = −Cov_p(c, Σ g_j a_j c_j)/(τβ). The averages are taken by the
trapezoidal rule (S¹, `points` equispaced angles) or Gauss–Legendre in cos ϑ (S², `points` nodes, refined in long
double), exact to round-off here; the modes are cut where the kernel coefficient falls below 1e-18 of the
zeroth. About a = 0 the Jacobian is diag(1 − κ g_k/2) (S¹) or diag(1 − κ i_ℓ) (S²): mode k branches at
τβ/I_k(β), degree ℓ at τβ/i_ℓ(β), the docs' closed forms.

Method: branch points by a sign change of det ∂F/∂a along the uniform branch (a scan in the demo's `step`), made
exact by Brent; the mode-1 branch from K_c by Keller's pseudo-arclength continuation (Newton on F bordered by
t·(x − x_pred) = 0, tangent from the bordered Jacobian, step ×1.5 after an easy correction, ½ after a failed one);
the fold where the tangent's K component changes sign, located by Brent on t_K(s) within the step (K is
quadratic in s there, so K_f is exact to the Newton tolerance). Conventions resolved: the "amplitude" and order
parameter of a circle state are a_1 = ∫ μ cos θ dθ (= |μ̂₁| for even states), of a zonal state b_1 = |∫ x dμ|;
K_2 is reported even where it lies beyond the demo's continuation range (sphere: K_2 = 2.74 > stop = 2).
"""
import json
import time
import tomllib
from pathlib import Path

import numpy as np
from scipy.optimize import brentq
from scipy.special import eval_legendre, iv, spherical_in

ROOT = Path(__file__).resolve().parent.parent


class Problem:
    """F(a, K) = a − E_p[c] for basis values C (M × N) at quadrature nodes with weights w (sum 1)."""

    def __init__(self, g, C, w, tau, beta):
        self.g, self.C, self.w, self.s = g, C, w, 1.0 / (tau * beta)

    def F(self, x, jac=True):
        a, K = x[:-1], x[-1]
        phi = (K * self.s) * ((self.g * a) @ self.C)
        p = self.w * np.exp(phi - phi.max())
        p /= p.sum()
        m = self.C @ p
        if not jac:
            return a - m
        D = self.C - m[:, None]
        cov = (D * p) @ D.T
        J = np.empty((len(a), len(x)))
        J[:, :-1] = np.eye(len(a)) - (K * self.s) * cov * self.g
        J[:, -1] = -self.s * (cov @ (self.g * a))
        return a - m, J

    def tangent(self, x, t_ref):
        """Unit null vector of [F_a F_K], oriented along t_ref."""
        _, J = self.F(x)
        t = np.linalg.solve(np.vstack([J, t_ref]), np.r_[np.zeros(len(x) - 1), 1.0])
        return t / np.linalg.norm(t)

    def correct(self, x_pred, t, maxit=30):
        """Newton on [F(x); t·(x − x_pred)] = 0; returns (x, iterations) or raises."""
        x = x_pred.copy()
        for it in range(1, maxit + 1):
            Fx, J = self.F(x)
            dx = np.linalg.solve(np.vstack([J, t]), np.r_[Fx, t @ (x - x_pred)])
            x -= dx
            if not np.all(np.isfinite(x)) or np.linalg.norm(dx) > 0.5:
                raise ArithmeticError("Newton diverged")
            if np.linalg.norm(dx) < 1e-12 * (1 + np.linalg.norm(x)):
                Fx, J = self.F(x)          # one more step: quadratic convergence takes it to round-off
                x -= np.linalg.solve(np.vstack([J, t]), np.r_[Fx, t @ (x - x_pred)])
                return x, it + 1
        raise ArithmeticError("Newton did not converge")


def branch_points(prob, K0, dK, count=2):
    """The first `count` sign changes of det ∂F/∂a on the uniform branch a = 0, from K0 in steps dK, by Brent."""
    M = len(prob.g)
    def det(K):
        return np.linalg.det(prob.F(np.r_[np.zeros(M), K])[1][:, :-1])
    found, K, d = [], K0, det(K0)
    while len(found) < count:
        d1 = det(K + dK)
        if d * d1 < 0:
            found.append(brentq(det, K, K + dK, xtol=1e-300, rtol=8.9e-16, maxiter=200))
        K, d = K + dK, d1
    return found


def continue_branch(prob, K_b, K_stop, h=0.02, hmin=1e-7, hmax=0.1, max_points=200):
    """Mode-1 branch from the branch point (0, K_b): its points and the fold (Brent on t_K)."""
    n = len(prob.g) + 1
    e1 = np.zeros(n)
    e1[0] = 1.0
    x0 = np.zeros(n)
    x0[-1] = K_b
    x, _ = prob.correct(x0 + h * e1, e1)              # first point: the amplitude a_1 = h, K free
    t = prob.tangent(x, e1)
    pts, fold = [x0, x], None
    while len(pts) < max_points and x[-1] <= K_stop and x[0] < 0.995:
        try:
            xn, its = prob.correct(x + h * t, t)
        except (ArithmeticError, np.linalg.LinAlgError):
            h /= 2
            if h < hmin:
                break
            continue
        tn = prob.tangent(xn, t)
        if fold is None and t[-1] * tn[-1] < 0:      # the K component of the tangent changed sign
            x_, t_ = x, t
            def tK(s, x_=x_, t_=t_):
                return prob.tangent(prob.correct(x_ + s * t_, t_)[0], t_)[-1]
            s = brentq(tK, 0.0, h, xtol=1e-15, rtol=8.9e-16)
            fold = prob.correct(x_ + s * t_, t_)[0]
            pts.append(fold)
        x, t = xn, tn
        pts.append(x)
        if its <= 4:
            h = min(1.5 * h, hmax)
    return pts, fold


def solve(prob, cfg, closed):
    c = cfg["continuation"]
    K_c, K_2 = branch_points(prob, c["start"], c["step"])
    pts, fold = continue_branch(prob, K_c, c["stop"])
    return {"K_c": K_c, "K_2": K_2, "K_f": fold[-1], "amplitude_f": fold[0],
            "K_c_closed": closed[0], "K_2_closed": closed[1],
            "points": [[p[-1], p[0]] for p in pts]}


def circle(cfg):
    tau, beta, N = cfg["tokens"]["noise"], cfg["tokens"]["beta"], cfg["continuation"]["points"]
    M = next(k for k in range(1, 400) if iv(k, beta) < 1e-18 * iv(0, beta))
    k, th = np.arange(1, M + 1), 2 * np.pi * np.arange(N) / N
    prob = Problem(2 * iv(k, beta), np.cos(np.outer(k, th)), np.full(N, 1.0 / N), tau, beta)
    return solve(prob, cfg, [tau * beta / iv(1, beta), tau * beta / iv(2, beta)])


def gauss_legendre(N):
    """Gauss–Legendre nodes and weights, numpy's refined by Newton in long double.

    numpy's alone are off by up to 1e-14 in Σ w P_ℓ², which would show in K_c.
    """
    t = np.polynomial.legendre.leggauss(N)[0].astype(np.longdouble)
    for _ in range(3):
        p0, p1 = np.ones_like(t), t
        for n in range(2, N + 1):
            p0, p1 = p1, ((2 * n - 1) * t * p1 - (n - 1) * p0) / n
        dp = N * (t * p1 - p0) / (t * t - 1)
        t = t - p1 / dp
    return t.astype(float), (2 / ((1 - t * t) * dp * dp)).astype(float)


def sphere(cfg):
    tau, beta, N = cfg["tokens"]["noise"], cfg["tokens"]["beta"], cfg["continuation"]["points"]
    L = next(l for l in range(1, 400) if (2 * l + 1) * spherical_in(l, beta) < 1e-18 * spherical_in(0, beta))
    l = np.arange(1, L + 1)
    t, w = gauss_legendre(N)
    prob = Problem((2 * l + 1) * spherical_in(l, beta), eval_legendre(l[:, None], t[None, :]), w / 2, tau, beta)
    return solve(prob, cfg, [tau * beta / spherical_in(1, beta), tau * beta / spherical_in(2, beta)])


def timed(fn, cfg, repeats=5):
    best = np.inf
    for _ in range(repeats):
        t0 = time.process_time()
        r = fn(cfg)
        best = min(best, time.process_time() - t0)
    r["cpu_s"] = best
    return r


if __name__ == "__main__":
    out = {}
    for name, fn in [("circle", circle), ("sphere", sphere)]:
        cfg = tomllib.loads((ROOT / "demos" / f"noisy_{name}.toml").read_text())
        r = timed(fn, cfg)
        err_c = abs(r["K_c"] / r["K_c_closed"] - 1)
        err_2 = abs(r["K_2"] / r["K_2_closed"] - 1)
        assert err_c <= 1e-13 and err_2 <= 1e-13, (err_c, err_2)
        print(f"{name}: beta={cfg['tokens']['beta']} tau={cfg['tokens']['noise']} N={cfg['continuation']['points']}")
        print(f"  K_c = {r['K_c']:.16g}  (closed form {r['K_c_closed']:.16g}, rel. err {err_c:.1e})")
        print(f"  K_2 = {r['K_2']:.16g}  (closed form {r['K_2_closed']:.16g}, rel. err {err_2:.1e})")
        print(f"  K_f = {r['K_f']:.16g}  (amplitude {r['amplitude_f']:.10g}), {len(r['points'])} points,"
              f" CPU {r['cpu_s']:.4f} s (best of 5)")
        out[name] = {"beta": cfg["tokens"]["beta"], "noise": cfg["tokens"]["noise"], **r}
    (ROOT / "out").mkdir(exist_ok=True)
    (ROOT / "out" / "peer_spectral_continuation.json").write_text(json.dumps(out, indent=1))
