"""The timed runs of the free-energy benchmark: the PDE (token solve, or the closed-form drift) and MFLD particles.

All times are CPU seconds of this process (``time.process_time``), one BLAS thread.

* :func:`pde`: mfpde's Lie splitting (implicit Scharfetter–Gummel P1 on Θ). ``drift="token"``: the coupled solver,
  whose δR/δρ comes from the token forward solve and its discrete adjoint (DG1 tokens on 120 cells);
  ``drift="closed"``: the same Fokker–Planck step with δR/δρ = v(α + βa) from ρ's moments
  (:func:`fe_models.first_variation`), the information the particles use. Every step reports F(ρ_s)
  (lumped quadrature) and the certificate λ KL(ρ_s ‖ p_ρs) (:func:`mfpde.params.free_energy.gibbs_kl`).
* :func:`particles`: H noisy heads from ρ₀ (iid), the exact Ornstein–Uhlenbeck step with the mean-field drift
  frozen over Δs (Φ is quadratic, so this integrator has no O(Δs) bias) or Euler–Maruyama; the drift in closed
  form or from mfpde's token solve with the heads as a weighted point set (value heads: one a, so one token
  solve as the PDE's). F_H = R(ρ_H) + (λ₂/2)⟨|θ|²⟩ + λĤ with Ĥ by 1-NN (Kozachenko–Leonenko) at every step and
  by a Gaussian KDE at given rows; the cost of each estimate is recorded.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

from mpi4py import MPI

import dolfinx.fem
import numpy as np
from fe_models import (
    LAM,
    LAM2,
    RHO0,
    VAR0,
    Y,
    drift,
    first_variation,
    fixed_point,
    negentropy_kde,
    negentropy_knn,
    risk_conf,
)

from mfpde import config as C
from mfpde.heads import HeadMeasure
from mfpde.params.family import make_family
from mfpde.params.fokker_planck import ParameterFokkerPlanck
from mfpde.params.free_energy import gibbs_kl, training_free_energy
from mfpde.params.theta import theta_space
from mfpde.training.problem import CoupledProblem
from mfpde.verify.models import A_FIXED, gaussian_config
from mfpde.verify.shallow import TOKEN_BOX

#: The Θ solve's options: PETSc's own sparse LU (for ≤ 2·10³ Θ dofs it factors faster than MUMPS, the default).
PETSC_LU = {"ksp_type": "preonly", "pc_type": "lu", "pc_factor_mat_solver_type": "petsc"}


def config(family: str, cells: int, ds: float, steps: int) -> C.Config:
    """The benchmark's problem as an mfpde config (DG1 tokens on 120 cells, Θ = [−3, 3]^p, PETSc LU on Θ)."""
    cfg = gaussian_config(family, 2, Y, "shallow", "entropic", LAM, LAM2, ds, steps, "lie", token_cells=120,
                          token_degree=1, theta_cells=cells, theta_box=3.0, mean=RHO0[family], var=VAR0,
                          token_box=TOKEN_BOX)
    return dataclasses.replace(cfg, petsc=C.Petsc(param=dict(PETSC_LU)))


def pde(family: str, cells: int, ds: float, steps: int, drift_kind: str = "token") -> dict[str, Any]:
    """One Lie run; per step s: F − F*, λ KL(ρ_s‖p_ρs), the cumulative CPU time (set-up included), and the set-up."""
    cfg = config(family, cells, ds, steps)
    fstar = float(fixed_point(family)["F"])
    c0 = time.process_time()
    if drift_kind == "token":
        cp = CoupledProblem.from_config(cfg, MPI.COMM_SELF)
        st = cp.state
        theta, fp, rho, phi, conf = st.theta, st.fp, st.rhos[0], st.phis[0], st.confinement
        splitting = cp.splitting()
    else:
        theta = theta_space(MPI.COMM_SELF, cfg.heads, make_family(family, A_FIXED))
        fp = ParameterFokkerPlanck(theta.V, LAM, cfg.petsc.param)
        rho = theta.gaussian(cfg.heads.init["mean"], cfg.heads.init["cov"])
        phi = dolfinx.fem.Function(theta.V)
        conf = 0.5 * LAM2 * (theta.x**2).sum(axis=1)
        a, v = theta.x[:, 0] if family == "scalar" else A_FIXED, theta.x[:, -1]
        m = theta.m
    n = theta.n_owned
    out: dict[str, Any] = {"s": [], "gap": [], "cert": [], "cpu": [], "setup": time.process_time() - c0}
    for step in range(steps + 1):
        if drift_kind == "token":
            heads = cp.heads()
            grad = cp.gradient(heads)
            st.set_potentials(heads, grad.D)
            risk = grad.risk
        else:
            w = m * rho.x.array
            al, be, risk = first_variation(family, float(w @ v), float(w @ (a * v)))
            phi.x.array[:] = v * (al + be * a) + conf
        F = training_free_energy(theta, [rho], conf, LAM, risk)["free_energy"]
        kl = gibbs_kl(theta.comm, theta.m[:n], LAM, rho.x.array[:n], phi.x.array[:n])[0]
        if step < steps:
            if drift_kind == "token":
                splitting.step(ds)
            else:
                fp.step(rho, phi, ds)
        for key, val in (("s", step * ds), ("gap", F - fstar), ("cert", LAM * kl), ("cpu", time.process_time() - c0)):
            out[key].append(float(val))
    return out


class TokenDrift:
    """∇Φ of the heads from mfpde's token solve: the heads as a weighted point set (δR/δρ(θ) = v D(a), theory §3.1).

    D(a) comes from the discrete adjoint at every distinct a of the heads; for scalar heads ∂_a D by central
    differences (step 1e-5) at zero-weight companions a ± 1e-5, so 3H distinct a (value heads: one a).
    """

    EPS = 1e-5

    def __init__(self, family: str, cp: CoupledProblem | None = None) -> None:
        self.family = family
        self.cp = cp if cp is not None else CoupledProblem.from_config(config(family, 8, 0.1, 1), MPI.COMM_SELF)

    def __call__(self, th: np.ndarray) -> tuple[np.ndarray, float]:
        """(∇_θ δR/δρ at the heads, shape (H, p); R(ρ_H))."""
        H = len(th)
        hm = HeadMeasure.from_heads(self.cp.family, th, np.full(H, 1.0 / H), keep_zero=True)
        if self.family == "value":
            grad = self.cp.gradient([hm])
            return np.full((H, 1), grad.D[0][0]), grad.risk
        e = self.EPS
        a = np.concatenate([hm.a, hm.a - e, hm.a + e])
        order = np.argsort(a, kind="stable")
        hm3 = HeadMeasure(a[order], np.concatenate([hm.c, np.zeros(2 * len(hm.a))])[order])
        grad = self.cp.gradient([hm3])
        D = np.empty(len(a))
        D[order] = grad.D[0]
        k = len(hm.a)
        idx = np.searchsorted(hm.a, np.round(th[:, 0], 12))
        d0, dd = D[:k][idx], (D[2 * k:] - D[k:2 * k])[idx] / (2 * e)
        return np.stack([th[:, 1] * dd, d0], axis=1), grad.risk


def _ou_step(th: np.ndarray, Hs: np.ndarray, g: np.ndarray, ds: float, rng: np.random.Generator) -> np.ndarray:
    """The exact OU step of dθ = −(Hθ + g)ds + √(2λ)dB with H, g frozen: θ* + e^{−HΔs}(θ − θ*) + noise."""
    w, Q = np.linalg.eigh(Hs)
    E = Q @ np.diag(np.exp(-w * ds)) @ Q.T
    Cn = Q @ np.diag(np.sqrt(LAM / w * (1 - np.exp(-2 * w * ds)))) @ Q.T
    tstar = -np.linalg.solve(Hs, g)
    return tstar + (th - tstar) @ E + rng.standard_normal(th.shape) @ Cn


def particles(family: str, H: int, seed: int, ds: float, steps: int, kde_rows: list[int], scheme: str = "ou",
              token: TokenDrift | None = None) -> dict[str, list[float]]:
    """MFLD of H heads; per step: F_H − F* with the k-NN entropy (and the KDE's at ``kde_rows``), and CPU times.

    ``dyn``: CPU of each step's dynamics (drift + update; with ``token`` the token solve, which also gives R);
    ``knn_s``/``kde_s``: CPU of each estimate (and of R(ρ_H) + confinement). With ``token`` (value heads) the
    drift Hθ + g has H = λ₂ and g = D (the token solve's δR/δρ = vD), so the OU step is the same.
    """
    rng = np.random.default_rng((27, H, seed, len(RHO0[family])))
    p = len(RHO0[family])
    th = np.asarray(RHO0[family]) + math.sqrt(VAR0) * rng.standard_normal((H, p))
    fstar = float(fixed_point(family)["F"])
    out: dict[str, list[float]] = {"s": [], "knn": [], "kde": [], "dyn": [], "knn_s": [], "kde_s": []}
    for step in range(steps + 1):
        t = time.process_time()
        if token is not None:
            gradR, risk = token(th)
            Hs, g = np.array([[LAM2]]), gradR[0]
        else:
            Hs, g = drift(family, th)
        t_drift = time.process_time() - t
        t = time.process_time()
        conf = 0.5 * LAM2 * float(np.mean(np.sum(th * th, axis=1)))
        rc = risk + conf if token is not None else risk_conf(family, th)
        out["knn"].append(rc + LAM * negentropy_knn(th) - fstar)
        t1 = time.process_time()
        out["kde"].append(rc + LAM * negentropy_kde(th) - fstar if step in kde_rows else math.nan)
        out["knn_s"].append(t1 - t)
        out["kde_s"].append(time.process_time() - t1 if step in kde_rows else math.nan)
        out["s"].append(step * ds)
        if step == steps:
            out["dyn"].append(t_drift)
            break
        t = time.process_time()
        if scheme == "em":
            th = th - ds * (th @ Hs + g) + math.sqrt(2 * LAM * ds) * rng.standard_normal((H, p))
        else:
            th = _ou_step(th, Hs, g, ds, rng)
        out["dyn"].append(t_drift + time.process_time() - t)
    return out


def token_drift_probe(family: str, H: int, repeats: int = 2) -> dict[str, float]:
    """CPU of one token-solve drift at H heads from ρ₀ (best of ``repeats``), and its deviation from the closed form.

    The deviation is max |∇δR/δρ_token − ∇δR/δρ_closed| / max |∇δR/δρ_closed| at the heads: if it is small,
    the two drifts give the same dynamics, and the closed-form runs' steps to a gap hold for the token drift.
    """
    rng = np.random.default_rng((27, H, 0, len(RHO0[family])))
    th = np.asarray(RHO0[family]) + math.sqrt(VAR0) * rng.standard_normal((H, len(RHO0[family])))
    tok = TokenDrift(family)
    best = math.inf
    for _ in range(repeats):
        t = time.process_time()
        gradR, _ = tok(th)
        best = min(best, time.process_time() - t)
    Hs, g = drift(family, th)
    closed = th @ Hs + g - LAM2 * th
    return {"cpu": best, "dev": float(np.max(np.abs(gradR - closed)) / np.max(np.abs(closed)))}


def reach_index(gap: list[float], tol: float) -> int:
    """Index of the first row from which |gap| ≤ tol for the rest of the run (len(gap): not reached)."""
    g = np.abs(np.asarray(gap))
    bad = np.nonzero(~(g <= tol))[0]
    return 0 if len(bad) == 0 else int(bad[-1]) + 1


def reach_time(gap: list[float], times: list[float], tol: float) -> float:
    """The time of :func:`reach_index`'s row (NaN: not reached)."""
    i = reach_index(gap, tol)
    return float(times[i]) if i < len(gap) else math.nan
