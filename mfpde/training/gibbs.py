"""The self-consistent Gibbs measures ρ = p_ρ of entropic training as a problem F(ρ, λ) = 0 (theory §4, §5.4).

The stationary states of the parameter Fokker–Planck equation (theory §4 (FP)) solve ρ = p_ρ with the proximal
Gibbs measure p_ρ ∝ exp(−Φ_ρ/λ), Φ_ρ = δR/δρ(ρ) + (λ₂/2)|θ|². On the Θ mesh the unknown is the vector of nodal
values ρ_i of every layer block's P1 density (in the rank-independent order of :attr:`ThetaSpace.points`, blocks
one after the other, L·N_θ unknowns) and

    F(ρ, λ) = ρ − p_ρ,    p_i = e^{−Φ_i/λ} / Σ_j m_j e^{−Φ_j/λ}    (per block, m the lumped masses).

Why this form and not log ρ + Φ/λ + log Z: (i) its root is exactly the fixed point of ``mfpde run``'s Lie step
(the EAFE generator of :mod:`mfpde.params.fokker_planck` is in detailed balance with the nodal Gibbs density
e^{−Φ/λ}, and a frozen-potential step leaves nothing else in place), so time stepping converges to the very
vector continued here; (ii) Σ m F = Σ m ρ − 1, so the mass is an equation, not a constraint; (iii) F is bounded by
max p, whereas log p reaches −Φ/λ ≈ −10³ in the tails and would dominate the arclength norm. ρ_i may become
negative inside a Newton iteration, which F (linear in ρ through the reduced heads) does not mind.

Φ depends on ρ only through the reduced heads c_k = Σ_{a(θ_i) = a_k} m_i ρ_i v(θ_i) (:class:`HeadMeasure`), N_a
numbers per block, and δR/δρ(θ_i) = v(θ_i) D(a(θ_i)), D = ∂R/∂c from the forward solve and the discrete adjoint
(:meth:`Objective.gradient`). So the Jacobian is exact up to the Hessian H = ∂D/∂c ((L·N_a)², by forward
differences of the adjoint gradient in c: L·N_a forward + adjoint solves; exact to round-off where R is quadratic
in c, the single layer, and to ~1e-7 elsewhere, which leaves Newton's convergence quadratic to that factor):

    ∂F/∂ρ = I + λ⁻¹ (diag p − p (m p)ᵀ) ∂Φ/∂ρ,   ∂Φ/∂ρ = diag(v) Pᵀ H P diag(m v),   ∂F/∂λ = −p (Φ − ⟨Φ⟩_p)/λ²,

P the (N_a, N_θ) incidence of a(θ_i) = a_k. Stability: −∂F/∂ρ is the linearisation of the flow ρ̇ = p_ρ − ρ, a
gradient flow of F_λ(ρ) = R + (λ₂/2)∫|θ|²ρ + λ∫ρ log ρ (as the Fokker–Planck flow is, in another metric):
−∂F/∂ρ = −Π (Π⁻¹ + H_ρ/λ) on mass-zero perturbations, with Π = diag p − p(mp)ᵀ ≥ 0, so its eigenvalues have the
signs of −Hess F_λ (Sylvester's inertia) and a fixed point is stable iff it is a local minimiser of F_λ, for both
flows. (Σ m e = 0 for the eigenvector of the mass direction: its eigenvalue is −1.) For the single layer R is
convex in c, Π ∂Φ/∂ρ has non-negative eigenvalues and every eigenvalue of −∂F/∂ρ is ≤ −1.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from mfpde.continuation import Branch, Newton, StepControl, branch_direction, continue_branch, tangent
from mfpde.errors import NumericalError
from mfpde.heads import HeadMeasure
from mfpde.training.problem import CoupledProblem

__all__ = ["FD_STEP", "GibbsProblem", "gibbs_branches", "gibbs_residual_norm", "gibbs_start"]

Array = npt.NDArray[np.float64]
#: The forward-difference step of H = ∂D/∂c, relative to max(1, |c|): truncation O(h) ≈ 1e-7 against round-off
#: ε|D|/h ≈ 2e-9 (for the single layer D is affine in c and only the round-off remains).
FD_STEP = 1e-7
#: Reduced heads c whose (R, D, H) are kept (the branch's points are revisited for their stability).
CACHE = 512
#: The most branch points followed from one branch.
MAX_SWITCHES = 2
#: Damped fixed-point steps before the first Newton solve, and how many times they are repeated if it fails.
PICARD_STEPS, PICARD_ROUNDS = 20, 5


class GibbsProblem:
    """F(ρ, λ) = ρ − p_ρ on the Θ nodes of every layer block and its Jacobian (module docstring).

    Satisfies :class:`mfpde.continuation.Problem` with K = λ. Every call is collective over the ranks of
    ``cp`` (the token solves) and returns the same arrays on every rank.

    Args:
        cp: the coupled problem (its ρ and training.lambda are not used: ρ and λ are the arguments). A token solve
            that fails (:class:`NumericalError`, on every rank) makes F and its Jacobian NaN there, which Newton
            treats as not converging; the reason is kept in ``last_failure``.
        fd_step: the relative step of the central differences of ∂R/∂c.

    Attributes:
        m: number of unknowns L·N_θ; n_layers: L; points: the Θ nodes (N_θ, p); mass: lumped masses (N_θ,);
        evaluations: forward + adjoint passes so far.
    """

    def __init__(self, cp: CoupledProblem, fd_step: float = FD_STEP) -> None:
        th = cp.theta
        self.cp, self.fd_step = cp, fd_step
        self.n_layers = cp.problem.n_layers
        self.points = th.points
        self.n_theta = len(th.points)
        self.m = self.n_layers * self.n_theta
        self.mass = th._allgather(th.m[: th.n_owned])[th.order]
        self.lam2 = cp.sec.training.lambda2
        self.conf = 0.5 * self.lam2 * (self.points**2).sum(axis=1)
        a = cp.family.a(self.points)
        self.v = cp.family.v(self.points)
        self.a_keys, self.inv = np.unique(np.round(a, 12), return_inverse=True)
        self.n_a = len(self.a_keys)
        self.evaluations = 0
        #: The last token solve's failure ("" if none): F is NaN there, and Newton fails on it.
        self.last_failure = ""
        self._cache: dict[bytes, dict[str, object]] = {}

    # -- the map ρ ↦ c ↦ (R, D) ↦ Φ -----------------------------------------------------------------------------
    def blocks(self, u: Array) -> Array:
        """The nodal values per block, shape (L, N_θ)."""
        return np.asarray(u, dtype=float).reshape(self.n_layers, self.n_theta)

    def heads_c(self, u: Array) -> Array:
        """The reduced heads per block, shape (L, N_a): c_k = Σ_{a(θ_i) = a_k} m_i ρ_i v(θ_i)."""
        c = np.zeros((self.n_layers, self.n_a))
        for k, r in enumerate(self.blocks(u)):
            np.add.at(c[k], self.inv, self.mass * r * self.v)
        return c

    def _solve(self, c: Array) -> tuple[float, Array]:
        """(R, D = ∂R/∂c (L, N_a)) at the reduced heads c: one forward + adjoint pass over the samples."""
        heads = [HeadMeasure(self.a_keys.copy(), ck.copy()) for ck in c]
        self.evaluations += 1
        try:
            g = self.cp.objective.gradient(heads)
        except NumericalError as e:  # on every rank: the token solve failed at this ρ (mass leaving Ω, ...)
            self.last_failure = str(e)
            return math.nan, np.full((self.n_layers, self.n_a), math.nan)
        return float(g.risk), np.stack([np.asarray(d, dtype=float) for d in g.D])

    def _gradient(self, c: Array) -> tuple[float, Array]:
        """:meth:`_solve`, cached by c."""
        entry = self._entry(c)
        if "D" not in entry:
            entry["risk"], entry["D"] = self._solve(c)
        return entry["risk"], entry["D"]  # type: ignore[return-value]

    def _entry(self, c: Array) -> dict[str, object]:
        key = c.tobytes()
        if key not in self._cache:
            if len(self._cache) >= CACHE:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = {}
        return self._cache[key]

    def potential(self, u: Array) -> tuple[Array, float]:
        """(Φ = δR/δρ + (λ₂/2)|θ|² per block (L, N_θ), R) at ρ = u."""
        risk, D = self._gradient(self.heads_c(u))
        return self.v[None, :] * D[:, self.inv] + self.conf[None, :], risk

    def hessian(self, u: Array) -> Array:
        """H = ∂D/∂c, shape (L·N_a, L·N_a), by forward differences (cached)."""
        c = self.heads_c(u)
        D0 = self._gradient(c)[1].ravel()
        entry = self._entry(c)
        if "H" in entry:
            return entry["H"]  # type: ignore[return-value]
        h = self.fd_step * max(1.0, float(np.abs(c).max()))
        n = self.n_layers * self.n_a
        H = np.zeros((n, n))
        flat = c.ravel()
        for j in range(n):
            e = np.zeros(n)
            e[j] = h
            H[:, j] = (self._solve((flat + e).reshape(c.shape))[1].ravel() - D0) / h
        entry["H"] = H
        return H

    # -- the Gibbs measure and the residual ---------------------------------------------------------------------
    def log_gibbs(self, phi: Array, lam: float) -> Array:
        """The log-Gibbs density log p per block (L, N_θ), p ∝ e^{−Φ/λ}, Σ m p = 1, in the log domain (no underflow)."""
        e = -(phi - phi.min(axis=1, keepdims=True)) / lam
        return e - np.log(np.exp(e) @ self.mass)[:, None]

    def gibbs(self, u: Array, lam: float) -> Array:
        """p_ρ per block, shape (L, N_θ)."""
        return np.exp(self.log_gibbs(self.potential(u)[0], lam))

    def residual(self, u: Array, K: float) -> Array:
        """F(ρ, λ) = ρ − p_ρ, shape (L·N_θ,)."""
        return np.asarray(u, dtype=float) - self.gibbs(u, K).ravel()

    def jacobian(self, u: Array, K: float) -> tuple[Array, Array]:
        """(∂F/∂ρ (m, m), ∂F/∂λ (m,)) (module docstring)."""
        lam, N, na = K, self.n_theta, self.n_a
        phi = self.potential(u)[0]
        p = np.exp(self.log_gibbs(phi, lam))
        H = self.hessian(u)
        Ju = np.eye(self.m)
        JK = np.zeros(self.m)
        mv = self.mass * self.v
        for k in range(self.n_layers):
            pk = p[k]
            Pi = np.diag(pk) - np.outer(pk, self.mass * pk)  # ∂p/∂Φ = −Π/λ
            for j in range(self.n_layers):
                # ∂Φ_k/∂ρ_j = diag(v) Pᵀ H_kj P diag(m v): (N, N)
                Hkj = H[k * na:(k + 1) * na, j * na:(j + 1) * na]
                dphi = self.v[:, None] * Hkj[self.inv][:, self.inv] * mv[None, :]
                Ju[k * N:(k + 1) * N, j * N:(j + 1) * N] += Pi @ dphi / lam
            mean_phi = float(self.mass @ (pk * phi[k]))
            JK[k * N:(k + 1) * N] = -pk * (phi[k] - mean_phi) / lam**2
        return Ju, JK

    # -- what a branch point reports ------------------------------------------------------------------------------
    def certificate(self, u: Array, lam: float) -> float:
        """λ KL(ρ ‖ p_ρ) = λ Σ_blocks Σ_i m_i ρ_i log(ρ_i/p_i) over the ρ_i > 0 (0 at a fixed point; theory §5.4)."""
        rho = self.blocks(u)
        logp = self.log_gibbs(self.potential(u)[0], lam)
        pos = rho > 0
        terms = np.where(pos, rho * (np.log(np.where(pos, rho, 1.0)) - logp), 0.0)
        return float(lam * (terms @ self.mass).sum())

    def free_energy(self, u: Array, lam: float) -> tuple[float, float]:
        """(F_λ = R + (λ₂/2)Σ m|θ|²ρ + λ Σ m ρ log ρ, R), summed over blocks (lumped quadrature; 0 log 0 = 0)."""
        rho = self.blocks(u)
        risk = self.potential(u)[1]
        pos = rho > 0
        ent = float((np.where(pos, rho * np.log(np.where(pos, rho, 1.0)), 0.0) @ self.mass).sum())
        return risk + float((rho @ (self.mass * self.conf)).sum()) + lam * ent, risk

    def moments(self, u: Array) -> tuple[Array, Array]:
        """(mean (L, p), variance Σ_j Cov_jj (L,)) of ρ per block, Σ m ρ normalised."""
        rho = self.blocks(u)
        w = rho * self.mass[None, :]
        w = w / w.sum(axis=1, keepdims=True)
        mean = w @ self.points
        var = np.array([float(wk @ ((self.points - mk) ** 2).sum(axis=1)) for wk, mk in zip(w, mean, strict=True)])
        return mean, var

    def order_parameter(self, u: Array) -> float:
        """ā = ∫ v dρ averaged over the blocks (the value mean: the order parameter of the diagram)."""
        return float(np.mean(self.blocks(u) @ (self.mass * self.v)))

    def stability(self, u: Array, lam: float, count: int = 2, solver: str = "slepc"
                  ) -> tuple[npt.NDArray[np.complex128], bool]:
        """(the ``count`` leading eigenvalues of −∂F/∂ρ (complex), stable?) (module docstring).

        (NaN, False) where the Jacobian is not finite (a token solve failed).
        """
        from mfpde.stability import leading_eigenpairs, linearly_stable

        J = self.jacobian(u, lam)[0]
        if not np.all(np.isfinite(J)):  # a token solve of ∂D/∂c failed: unknown, not stable
            return np.full(1, complex(math.nan)), False
        vals, _ = leading_eigenpairs(-J, min(count, self.m), solver)
        return vals, linearly_stable(vals)

    def inner_weights(self) -> Array:
        """W of the arclength inner product: the lumped masses for ρ (per block), 1 for λ, shape (m+1,)."""
        return np.concatenate([np.tile(self.mass, self.n_layers), [1.0]])

    def initial(self) -> Array:
        """ρ₀ of ``heads.init`` (the Gaussian of the config) per block, flattened (m,)."""
        return np.concatenate([self.cp.theta.gather_values(r) for r in self.cp.rhos])

    def picard(self, u: Array, lam: float, its: int, damping: float = 0.5) -> Array:
        """``its`` damped fixed-point steps ρ ← (1 − θ)ρ + θ p_ρ (a start for Newton far from the branch)."""
        for _ in range(its):
            u = (1 - damping) * u + damping * self.gibbs(u, lam).ravel()
        return u


def gibbs_residual_norm(P: GibbsProblem, u: Array, lam: float) -> float:
    """‖F(ρ, λ)‖ in the lumped L² norm (Σ_blocks Σ m F²)^{1/2}."""
    r = P.blocks(P.residual(u, lam))
    return math.sqrt(float((r**2 @ P.mass).sum()))


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _block(P: GibbsProblem, br: Branch, origin: str, solver: str) -> dict[str, Any]:
    rows: dict[str, list[Any]] = {k: [] for k in ("certificate", "risk", "free_energy", "mean", "variance",
                                                  "order_parameter", "residual", "leading_eigenvalue", "stable",
                                                  "min_rho")}
    for u, lam in zip(br.u, br.K, strict=True):
        vals, ok = P.stability(u, lam, 2, solver)
        F, R = P.free_energy(u, lam)
        mean, var = P.moments(u)
        for k, v in (("certificate", P.certificate(u, lam)), ("risk", R), ("free_energy", F),
                     ("mean", mean.tolist()), ("variance", var.tolist()), ("order_parameter", P.order_parameter(u)),
                     ("residual", gibbs_residual_norm(P, u, lam)), ("leading_eigenvalue", _finite(float(vals[0].real))),
                     ("stable", ok), ("min_rho", float(np.min(u)))):
            rows[k].append(v)
    return {"origin": origin, "parameter": list(br.K), **rows, "stopped": br.stopped, "early": br.early}


def gibbs_start(P: GibbsProblem, newton: Newton, lam: float) -> np.ndarray | None:
    """The fixed point at λ (Newton at fixed λ after damped fixed-point steps from ρ₀), or None."""
    a = np.zeros(P.m + 1)
    a[-1] = 1.0
    u = P.initial()
    for _ in range(PICARD_ROUNDS):
        u = P.picard(u, lam, PICARD_STEPS)
        x = newton.solve(np.concatenate([u, [lam]]), a, lam)
        if x is not None:
            return x
    return None


def gibbs_branches(P: GibbsProblem, start: float, stop: float, ctl: StepControl, solver: str = "slepc"
                   ) -> dict[str, Any]:
    """The branch through the fixed point at λ = ``start`` towards ``stop``, and those from its branch points.

    Returns:
        {"branches": [blocks], "bifurcations": [...], "newton_iterations": int} (the report's part); no branch
        when Newton found no fixed point at ``start``.
    """
    W = P.inner_weights()
    branches: list[dict[str, Any]] = []
    bifs: list[dict[str, Any]] = []
    with Newton(P, P.m) as newton:
        x0 = gibbs_start(P, newton, start)
        if x0 is None:
            return {"branches": [], "bifurcations": [], "newton_iterations": newton.its,
                    "stopped": f"Newton found no fixed point at λ = continuation.start = {start:g}"
                    + (f" (a token solve failed: {P.last_failure})" if P.last_failure else "")}
        e = np.zeros(P.m + 1)
        e[-1] = 1.0 if stop > start else -1.0
        todo = [(x0, tangent(P, x0, e, W), f"fixed point at λ = {start:.6g}")]
        while todo:
            x, t, origin = todo.pop(0)
            P.last_failure = ""
            with np.errstate(all="ignore"):  # NaN where a token solve failed: Newton fails there, the branch ends
                br = continue_branch(P, newton, x, t, W, ctl, regular_start=True)
            if br.early and P.last_failure:
                br.stopped += f" (a token solve failed on the way: {P.last_failure})"
            i = len(branches)
            for ev in br.events:
                bifs.append({"kind": ev.kind, "parameter": ev.K, "mode": None, "branch": i,
                             "order_parameter": P.order_parameter(ev.u)})
                if ev.kind == "branch_point" and i == 0 and len(todo) < MAX_SWITCHES:
                    xb = np.concatenate([ev.u, [ev.K]])
                    todo.append((xb, branch_direction(P, xb, ev.tangent, W), f"branch point at λ = {ev.K:.6g}"))
            branches.append(_block(P, br, origin, solver))
        its = newton.its
    return {"branches": branches, "bifurcations": bifs, "newton_iterations": its}
