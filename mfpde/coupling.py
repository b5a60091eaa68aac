"""The main job: training ρ by splitting the coupled token / adjoint / parameter system (theory §4).

Each training step solves the token half (with ρ_s frozen, transport every sample forward in depth,
taped, and solve its discrete adjoint backward, :mod:`mfpde.adjoint`, giving δR/δρ_s on the Θ dofs) and
the parameter half (:mod:`mfpde.fokker_planck`), composed by

* **Lie** (first order in Δs): with Φ_s = δR/δρ_s + (λ₂/2)|θ|² frozen, one step of the parameter
  Fokker–Planck equation: implicit Scharfetter–Gummel for λ > 0 (positive, conservative, free energy of
  the frozen Φ non-increasing for every Δs), explicit upwind with CFL sub-steps for λ = 0;
* **Strang** (second order in Δs): B(Δs/2) A(Δs) B(Δs/2) with B the linear Ornstein–Uhlenbeck part
  ∇·(ρλ₂θ) + λΔρ, exact in time, and A the Wasserstein transport by ∇δR/δρ[ρ] by SSP-RK2, δR/δρ
  recomputed at each stage (see :meth:`CoupledProblem.strang_step`). Costs two gradients per step.

Depth-indexed models carry one ρ per layer block, each with its own Fokker–Planck step, coupled only
through R (theory §1.4 (D)).

Samples are spread over MPI ranks: the ranks form min(size, n) groups, each owning a token mesh on a
sub-communicator; risks and first variations are summed with one ``allreduce``.
"""

from __future__ import annotations

import contextlib
import csv
import logging
import math
import sys
import time
from pathlib import Path

from mpi4py import MPI

import dolfinx.fem
import dolfinx.io
import numpy as np
import ufl

from mfpde import __version__
from mfpde.adjoint import DiscreteAdjoint, Gradient, dyhat_dmu, first_variation_values
from mfpde.attention import HeadMeasure, make_family
from mfpde.config import Config, to_toml
from mfpde.data import Sample, fill_density, load_samples
from mfpde.errors import ConfigError, NumericalError
from mfpde.fokker_planck import ParameterFokkerPlanck
from mfpde.heads import theta_space
from mfpde.io import load_checkpoint, prepare_output_dir, save_checkpoint, write_atomic, write_report
from mfpde.mesh import make_domain
from mfpde.transport import TokenTransport, readout_function

logger = logging.getLogger(__name__)


class CoupledProblem:
    """Θ space, ρ per layer block, and the token solver of this rank's sample group.

    Raises:
        ConfigError: the config cannot be run (e.g. Dirac heads or Strang splitting).
    """

    def __init__(self, cfg: Config, comm: MPI.Comm = MPI.COMM_WORLD):
        if cfg.heads.init["kind"] != "gaussian":
            raise ConfigError("heads.init.kind: run trains a density ρ; use kind = \"gaussian\"")
        self.cfg, self.comm = cfg, comm
        self.family = make_family(cfg.heads.family, cfg.heads.a)
        t = cfg.tokens
        self.train, self.test = load_samples(cfg)
        n = len(self.train)
        self.n_groups = min(comm.size, n)
        self.color = comm.rank % self.n_groups
        self.tcomm = comm.Split(self.color, comm.rank)
        self.tt = TokenTransport(make_domain(self.tcomm, t.dim, t.mesh, t.box, t.cells, t.cell), t.degree, t.cfl,
                                 cfg.petsc.token)
        self.adj = DiscreteAdjoint(self.tt)
        self._validate_samples()
        h = cfg.heads
        self.theta = theta_space(comm, cfg, self.family)
        self.L = cfg.depth.layers if cfg.depth.model == "depth-indexed" else 1
        self.shallow = cfg.depth.model == "shallow"
        self.rhos = [self.theta.gaussian(h.init["mean"], h.init["cov"]) for _ in range(self.L)]
        for k, r in enumerate(self.rhos):
            r.name = f"rho_{k}" if self.L > 1 else "rho"
        self.lam = cfg.training.lam if cfg.training.regularization == "entropic" else 0.0
        try:
            self.fp = ParameterFokkerPlanck(self.theta.V, self.lam, cfg.petsc.param)
            self.fp0 = ParameterFokkerPlanck(self.theta.V, 0.0, cfg.petsc.param, prefix="mfpde_param_wgf_")
        except ConfigError:  # PETSc rejected petsc.param (the message names the key)
            raise
        except ValueError as e:  # an obtuse Θ mesh
            raise ConfigError(f"heads.mesh: {e}") from None
        logger.info("linear solvers: %s; %s", self.tt.mass_solver.describe(),
                    self.fp.solver.describe() if self.fp.solver is not None else "mfpde_param_: explicit (λ = 0)")
        self.phi_conf = dolfinx.fem.Function(self.theta.V, name="confinement")
        self.g = readout_function(cfg.loss.readout, cfg.loss.w, cfg.loss.b)
        self.dyhat = dyhat_dmu(self.tt, self.g)
        self.phis = [dolfinx.fem.Function(self.theta.V, name="Phi") for _ in range(self.L)]
        self.conf = 0.5 * cfg.training.lambda2 * (self.theta.x**2).sum(axis=1)  # (λ₂/2)|θ|² at local dofs
        self.phi_conf.x.array[:] = self.conf
        self.phi_risk = [dolfinx.fem.Function(self.theta.V) for _ in range(self.L)]
        # ∫ ρ |∇(Φ + λ log ρ)|² (the dissipation of F, theory §4), compiled once per layer
        self.dissipation = []
        for r, phi in zip(self.rhos, self.phis, strict=True):
            xi = phi + self.lam * ufl.ln(ufl.max_value(r, 1e-300))
            self.dissipation.append(dolfinx.fem.form(r * ufl.inner(ufl.grad(xi), ufl.grad(xi)) * ufl.dx))

    def _validate_samples(self) -> None:
        """Fill every sample of this rank group once, so bad data is an input error before anything runs.

        Raises:
            ConfigError: on every rank, if some group's sample has no mass on Ω or a point outside it.
        """
        u = dolfinx.fem.Function(self.tt.W)
        with self._collective_failure(ConfigError):
            for samples in (self.train, self.test):
                for i in self._mine(samples):
                    fill_density(samples[i], u, self.tt.mass)

    def heads(self) -> list[HeadMeasure]:
        """The reduced head measure of each layer's ρ, keeping every a of the Θ grid."""
        return [HeadMeasure.from_heads(self.family, self.theta.points, self.theta.gather(r), keep_zero=True)
                for r in self.rhos]

    @contextlib.contextmanager
    def _collective_failure(self, error: type[Exception] = NumericalError):
        """Turn an ``error`` raised in one rank group into the same ``error`` on every rank.

        Sample groups solve independently; a failure in one must not leave the others waiting in the
        next reduction.
        """
        msg = ""
        try:
            yield
        except error as e:
            msg = str(e)
        msgs = [m for m in self.comm.allgather(msg) if m]
        if msgs:
            raise error(msgs[0])

    def _mine(self, samples: list[Sample]) -> list[int]:
        return [i for i in range(len(samples)) if i % self.n_groups == self.color]

    def predict(self, samples: list[Sample], heads: list[HeadMeasure], fields: Path | None = None,
                tag: str = "") -> np.ndarray:
        """ŷ^i for the samples (forward only), shape (n,), on every rank.

        With ``fields``, μ_T of sample i is written to ``fields/mu_T_<tag><i>.bp`` (VTX, by its rank group).
        """
        y = np.zeros(len(samples))
        cfg = self.cfg
        with self._collective_failure():
            for i in self._mine(samples):
                u = dolfinx.fem.Function(self.tt.W, name="mu_T")
                fill_density(samples[i], u, self.tt.mass)
                rep = self.tt.solve(u, heads, cfg.depth.T, cfg.depth.steps, self.g,
                                    outflow_tol=cfg.tokens.outflow_tol, shallow=self.shallow)
                y[i] = rep.yhat if self.tcomm.rank == 0 else 0.0
                if fields is not None:
                    with dolfinx.io.VTXWriter(self.tcomm, fields / f"mu_T_{tag}{i}.bp", [u]) as w:
                        w.write(cfg.depth.T)
        return self.comm.allreduce(y, op=MPI.SUM)

    def gradient(self, heads: list[HeadMeasure], per_sample: bool = False) -> Gradient:
        """R(ρ), ŷ and ∂R/∂c per layer by forward + discrete adjoint over this rank's samples, reduced.

        With ``per_sample`` also ∂ŷ^i/∂c per sample (for the NTK, theory §5.5).
        """
        cfg, tt = self.cfg, self.tt
        n = len(self.train)
        na = [len(h.a) for h in heads]
        yhat = np.zeros(n)
        D = [np.zeros(k) for k in na]
        Dy = [np.zeros((n, k)) for k in na] if per_sample else None
        with self._collective_failure():
            for i in self._mine(self.train):
                u = dolfinx.fem.Function(tt.W)
                fill_density(self.train[i], u, tt.mass)
                tape: list = []
                rep = tt.solve(u, heads, cfg.depth.T, cfg.depth.steps, self.g, tape=tape,
                               outflow_tol=cfg.tokens.outflow_tol, shallow=self.shallow)
                _, gcs = self.adj.backward(tape, self.dyhat, self.L)
                root = self.tcomm.rank == 0
                r = rep.yhat - self.train[i].target
                if root:
                    yhat[i] = rep.yhat
                    for k in range(self.L):
                        if len(gcs[k]):
                            D[k] += r * gcs[k] / n
                            if Dy is not None:
                                Dy[k][i] = gcs[k]
        yhat = self.comm.allreduce(yhat, op=MPI.SUM)
        D = [self.comm.allreduce(x, op=MPI.SUM) for x in D]
        if Dy is not None:
            Dy = [self.comm.allreduce(x, op=MPI.SUM) for x in Dy]
        targets = np.array([s.target for s in self.train])
        return Gradient(float(0.5 * np.mean((yhat - targets) ** 2)), yhat, D, Dy)

    def ntk(self, heads: list[HeadMeasure] | None = None) -> np.ndarray:
        """The mean-field NTK Gram matrix K_ρ[i, j] = Σ_ℓ ∫ ∇_θ δŷ^i/δρ^ℓ · ∇_θ δŷ^j/δρ^ℓ dρ^ℓ (theory §5.5).

        δŷ^i/δρ(θ) = v(θ) ∂ŷ^i/∂c(a(θ)) comes from the discrete adjoint of each sample; its θ-gradient is
        that of the P1 interpolant on Θ, and the integral is assembled exactly for P1 ρ.

        Returns:
            K, shape (n, n), symmetric positive semi-definite, the same on every rank.
        """
        heads = heads if heads is not None else self.heads()
        grad = self.gradient(heads, per_sample=True)
        assert grad.Dy is not None
        n = len(self.train)
        K = np.zeros((n, n))
        for k in range(self.L):
            fs = []
            for i in range(n):
                f = dolfinx.fem.Function(self.theta.V)
                f.x.array[:] = first_variation_values(self.family, heads[k], grad.Dy[k][i], self.theta.x)
                fs.append(f)
            for i in range(n):
                for j in range(i, n):
                    form = dolfinx.fem.form(self.rhos[k] * ufl.inner(ufl.grad(fs[i]), ufl.grad(fs[j])) * ufl.dx)
                    K[i, j] += self.comm.allreduce(dolfinx.fem.assemble_scalar(form), op=MPI.SUM)
                    K[j, i] = K[i, j]
        return K

    def set_potentials(self, heads: list[HeadMeasure], grad: Gradient) -> None:
        """Φ^ℓ = δR/δρ^ℓ + (λ₂/2)|θ|² at the Θ dofs (theory §4 (FP))."""
        for k in range(self.L):
            dr = first_variation_values(self.family, heads[k], grad.D[k], self.theta.x)
            self.phis[k].x.array[:] = dr + self.conf

    def lie_step(self, ds: float) -> None:
        """Lie: one Fokker–Planck step of every ρ^ℓ with Φ^ℓ (set by :meth:`set_potentials`) frozen."""
        for k in range(self.L):
            self._check(self.fp.step(self.rhos[k], self.phis[k], ds), "Fokker–Planck step")

    @staticmethod
    def _check(info, what: str) -> None:
        """Stop on a ρ that lost its mass or positivity (ill-conditioned solves at extreme λ or Δs)."""
        if not (math.isfinite(info.mass) and abs(info.mass - 1.0) <= 1e-8 and info.min_rho >= 0.0):
            raise NumericalError(f"{what}: ρ has mass {info.mass:.6g}, min {info.min_rho:.3g} (expected 1 and >= 0)")

    def _risk_potentials(self) -> None:
        heads = self.heads()
        grad = self.gradient(heads)
        for k in range(self.L):
            self.phi_risk[k].x.array[:] = first_variation_values(self.family, heads[k], grad.D[k], self.theta.x)

    def strang_step(self, ds: float) -> None:
        """Strang: B(Δs/2) A(Δs) B(Δs/2), second order in Δs.

        B: ∂_s ρ = ∇·(ρ λ₂θ) + λΔρ, the linear Ornstein–Uhlenbeck part, exact in time
        (:meth:`ParameterFokkerPlanck.exact_step`); A: ∂_s ρ = ∇·(ρ ∇δR/δρ[ρ]), the Wasserstein transport by
        the risk, by SSP-RK2 (Heun) on the upwind generator with δR/δρ recomputed (forward + adjoint) at both
        stages, in sub-steps of at most half the CFL limit (positive and conservative).
        """
        for k in range(self.L):
            self._check(self.fp.exact_step(self.rhos[k], self.phi_conf, ds / 2), "Ornstein–Uhlenbeck half-step")
        self._risk_potentials()
        cfl = min(self.fp0.stability_limit(p) for p in self.phi_risk)
        nsub = 1 if not math.isfinite(cfl) else max(1, math.ceil(ds / (0.5 * cfl)))
        h = ds / nsub
        for j in range(nsub):
            if j > 0:
                self._risk_potentials()
            start = [r.x.array.copy() for r in self.rhos]
            for k in range(self.L):
                self._check(self.fp0.step(self.rhos[k], self.phi_risk[k], h), "transport step")
            self._risk_potentials()
            for k in range(self.L):
                self._check(self.fp0.step(self.rhos[k], self.phi_risk[k], h), "transport step")
                self.rhos[k].x.array[:] = 0.5 * (start[k] + self.rhos[k].x.array)
        for k in range(self.L):
            self._check(self.fp.exact_step(self.rhos[k], self.phi_conf, ds / 2), "Ornstein–Uhlenbeck half-step")

    def free_energy(self, risk: float) -> dict[str, float]:
        """F = R + (λ₂/2)∫|θ|²dρ + λ∫ρ log ρ (theory §2), summed over layer blocks, and its parts."""
        n, m, comm = self.theta.n_owned, self.theta.m[: self.theta.n_owned], self.comm
        ent = conf = mass = 0.0
        rmin = math.inf
        for r in self.rhos:
            x = r.x.array[:n]
            xl = np.where(x > 0, x * np.log(np.where(x > 0, x, 1.0)), 0.0)
            ent += comm.allreduce(float(m @ xl), op=MPI.SUM)
            conf += comm.allreduce(float(m @ (self.conf[:n] * x)), op=MPI.SUM)
            mass += comm.allreduce(float(m @ x), op=MPI.SUM) / self.L
            rmin = min(rmin, comm.allreduce(float(x.min()), op=MPI.MIN))
        return {"risk": risk, "free_energy": risk + conf + self.lam * ent, "entropy": ent, "mass_rho": mass,
                "min_rho": rmin}


def _fit_rate(s: np.ndarray, gap: np.ndarray) -> float:
    """Exponential rate c of gap(s) ≈ C e^{−c s}, by least squares on log gap over its decaying part."""
    ok = gap > max(1e-3 * gap[0], 1e-14) if len(gap) else gap
    if ok.sum() < 3:
        return math.nan
    return float(-np.polyfit(s[ok], np.log(gap[ok]), 1)[0])


def run_training(cfg: Config, out: Path, resume: bool = False, comm: MPI.Comm = MPI.COMM_WORLD,
                 quiet: bool = False) -> int:
    """The ``run`` command (interface.md): train ρ, write history, plots, fields, checkpoints, report.

    Returns:
        0 on success, 3 on numerical failure (report status "failed", last good state checkpointed).

    Raises:
        ConfigError: invalid input (exit status 2).
    """
    t0 = time.perf_counter()
    pb = CoupledProblem(cfg, comm)
    tr, oc = cfg.training, cfg.output
    out = Path(out)
    step0, history = 0, []
    if resume:
        step0, history = _resume(pb, out)
        if history:  # wall time accumulates over resumed runs
            t0 -= history[-1]["wall_s"]
    prepare_output_dir(out, comm, keep=resume)
    write_atomic(out / "config.toml", to_toml(cfg), comm)
    writer = None
    if oc.fields:
        writer = dolfinx.io.VTXWriter(comm, out / "fields" / "rho.bp", pb.rhos)
    status, fail_msg, last = "ok", "", None
    bar = None
    if not quiet and comm.rank == 0 and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=tr.steps, initial=step0, desc="mfpde run", file=sys.stderr)
    step = step0
    try:
        for step in range(step0, tr.steps + 1):
            heads = pb.heads()
            grad = pb.gradient(heads)
            if not np.isfinite(grad.risk) or not all(np.all(np.isfinite(d)) for d in grad.D):
                raise NumericalError("non-finite risk or first variation")
            pb.set_potentials(heads, grad)
            last = [r.x.array.copy() for r in pb.rhos]
            if step % oc.every == 0 or step == tr.steps:
                row = _history_row(pb, grad, step, step * tr.ds, time.perf_counter() - t0)
                history.append(row)
                if writer is not None:
                    writer.write(step * tr.ds)
                logger.info("step %d s=%.4g risk=%.6g F=%.6g min_rho=%.3g |grad|=%.3g", step, step * tr.ds,
                            row["risk"], row["free_energy"], row["min_rho"], row["grad_norm"])
            if step > 0 and (step % oc.checkpoint_every == 0 or step == tr.steps):
                _checkpoint(pb, out, step, history)
            if step == tr.steps:
                break
            if tr.splitting == "lie":
                pb.lie_step(tr.ds)
            else:
                pb.strang_step(tr.ds)
            if bar is not None:
                bar.update(1)
    except NumericalError as e:  # SolverError included
        status, fail_msg = "failed", f"{e} (training step {step}, s = {step * tr.ds:.6g})"
        if last is not None:
            for r, a in zip(pb.rhos, last, strict=True):
                r.x.array[:] = a
        _checkpoint(pb, out, step, history)
    finally:
        if writer is not None:
            writer.close()
        if bar is not None:
            bar.close()
    _write_history(out, history, comm)
    report = _report(pb, history, status, step, time.perf_counter() - t0)
    if status == "failed":
        report["error"] = fail_msg
        write_report(out, report, comm)
        if comm.rank == 0:
            print(f"mfpde: numerical failure: {fail_msg}; last good state in {out / 'checkpoint'}", file=sys.stderr)
        return 3
    _final_outputs(pb, out, history, report)
    write_report(out, report, comm)
    acc = report.get("accuracy", {})
    logger.info("done: %d steps, risk %.6g, free energy %.6g%s -> %s", step, report["final"]["risk"],
                report["final"]["free_energy"],
                "".join(f", {k} accuracy {v:.3f}" for k, v in acc.items()), out)
    return 0


def _resume(pb: CoupledProblem, out: Path) -> tuple[int, list[dict]]:
    """Load ρ, the step and the history rows before it from DIR/checkpoint; validated on rank 0.

    Raises:
        ConfigError: no checkpoint, unreadable, non-finite, or written for another Θ mesh or layer count.
    """
    comm = pb.comm
    ck, err = None, ""
    if comm.rank == 0:
        try:
            ck = load_checkpoint(out)
            if ck is None:
                err = f"--resume: no checkpoint in {out / 'checkpoint'}"
            elif set(ck) != {"rho", "theta", "step", "history_keys", "history"}:
                err = "--resume: the checkpoint is incomplete"
            elif ck["rho"].shape != (pb.L, len(pb.theta.points)) or not np.allclose(ck["theta"], pb.theta.points):
                err = "--resume: the checkpoint was written for another Θ mesh (heads.box/cells/mesh) or layer count"
            elif not (np.all(np.isfinite(ck["rho"])) and np.all(ck["rho"] >= 0)):
                err = "--resume: the checkpoint holds non-finite or negative densities"
            elif not 0 <= int(ck["step"]) <= pb.cfg.training.steps:
                err = f"--resume: checkpoint step {int(ck['step'])} is beyond training.steps = {pb.cfg.training.steps}"
        except ConfigError as e:
            err = str(e)
    ck, err = comm.bcast((ck, err), root=0)
    if err:
        raise ConfigError(err)
    for k, r in enumerate(pb.rhos):
        pb.theta.set_values(r, ck["rho"][k])
    step0 = int(ck["step"])
    keys = ck["history_keys"].tolist()
    history = [h for h in (dict(zip(keys, row, strict=True)) for row in ck["history"]) if h["step"] < step0]
    logger.info("resuming from step %d", step0)
    return step0, history


def _checkpoint(pb: CoupledProblem, out: Path, step: int, history: list[dict]) -> None:
    rho = np.stack([pb.theta.gather_values(r) for r in pb.rhos])
    keys = list(history[0].keys()) if history else []
    save_checkpoint(out, {"rho": rho, "theta": pb.theta.points, "step": np.array(step), "history_keys": np.array(keys),
                          "history": np.array([[h[k] for k in keys] for h in history])}, pb.comm)


def _history_row(pb: CoupledProblem, grad: Gradient, step: int, s: float, wall: float) -> dict[str, float]:
    fe = pb.free_energy(grad.risk)
    gn = sum(pb.comm.allreduce(dolfinx.fem.assemble_scalar(f), op=MPI.SUM) for f in pb.dissipation)
    return {"step": step, "s": s, "risk": fe["risk"], "free_energy": fe["free_energy"], "entropy": fe["entropy"],
            "mass_rho": fe["mass_rho"], "min_rho": fe["min_rho"], "grad_norm": math.sqrt(max(gn, 0.0)),
            "wall_s": wall}


def _write_history(out: Path, history: list[dict], comm: MPI.Comm) -> None:
    import io

    keys = ["step", "s", "risk", "free_energy", "entropy", "mass_rho", "min_rho", "grad_norm", "wall_s"]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(keys)
    for h in history:
        w.writerow([int(h["step"]) if k == "step" else f"{h[k]:.12g}" for k in keys])
    write_atomic(out / "history.csv", buf.getvalue(), comm)


def _report(pb: CoupledProblem, history: list[dict], status: str, step: int, wall: float) -> dict:
    cfg = pb.cfg
    final = dict(history[-1]) if history else {}
    diag = [pb.fp.diagnostics(r, phi) for r, phi in zip(pb.rhos, pb.phis, strict=True)]
    one = pb.L == 1
    fin = {"risk": final.get("risk"), "free_energy": final.get("free_energy"), "mass_rho": final.get("mass_rho"),
           "min_rho": final.get("min_rho"),
           "rho_mean": diag[0]["mean"] if one else [d["mean"] for d in diag],
           "rho_cov": diag[0]["cov"] if one else [d["cov"] for d in diag]}
    if pb.lam > 0:
        g = [d["l1_gibbs"] for d in diag]
        fin["gibbs_residual_l1"] = g[0] if one else g
    s = np.array([h["s"] for h in history])
    F = np.array([h["free_energy"] for h in history])
    rate = {"fitted": _fit_rate(s, F - F.min()) if len(F) > 2 else math.nan, "theory": None}
    if pb.lam > 0 and cfg.training.lambda2 > 0 and pb.family.name == "value":
        # δR/δρ = v D is linear in θ: every Gibbs measure p_ρ is Gaussian with α = λ₂/λ (theory §5.4, §6.2).
        rate["theory"] = 2 * cfg.training.lambda2
        rate["theory_kind"] = "2 λ₂: Gaussian Gibbs measures, α = λ₂/λ (theory §5.4)"
    elif pb.lam > 0 and cfg.training.lambda2 > 0:
        # Holley–Stroock + Bakry–Émery (theory §5.4): c ≥ 2λ₂ exp(−osc δR/δρ / λ).
        n = pb.theta.n_owned
        osc = 0.0
        for phi in pb.phis:
            dr = phi.x.array[:n] - pb.conf[:n]
            hi = pb.comm.allreduce(float(dr.max()), op=MPI.MAX)
            lo = pb.comm.allreduce(float(dr.min()), op=MPI.MIN)
            osc = max(osc, hi - lo)
        rate["theory"] = 2 * cfg.training.lambda2 * math.exp(-osc / pb.lam)
        rate["theory_kind"] = "lower bound 2 λ₂ exp(−osc δR/δρ / λ) (theory §5.4)"
    report = {"status": status, "command": "run", "version": __version__, "comm_size": pb.comm.size,
              "wall_s": wall, "steps_done": step, "final": fin, "rate": rate}
    return report


def _final_outputs(pb: CoupledProblem, out: Path, history: list[dict], report: dict) -> None:
    """Accuracy on classification data, μ_T fields and plots."""
    cfg = pb.cfg
    heads = pb.heads()
    K = pb.ntk(heads)
    report["final"]["ntk_min_eigenvalue"] = float(np.linalg.eigvalsh(K)[0]) if K.size else None
    fields = out / "fields" if cfg.output.fields else None
    acc = {}
    for name, samples in (("train", pb.train), ("test", pb.test)):
        if samples:
            yh = pb.predict(samples, heads, fields, tag=f"{name}_")
            t = np.array([s.target for s in samples])
            acc[name] = float(np.mean(np.sign(yh) == np.sign(t)))
    if cfg.data.kind == "digits":
        report["accuracy"] = acc
    if cfg.output.plots:
        from mfpde.plots import plot_run

        plot_run(pb, out, history, report, heads)
