"""``mfpde continuation`` with ``parameter = "lambda"``: the branch of Gibbs fixed points ρ = p_ρ against λ (theory §4).

On a ``run`` config (the training problem; :class:`~mfpde.training.gibbs.GibbsProblem`) the fixed point at
λ = ``continuation.start`` is found by Newton (after a few damped fixed-point steps from ``heads.init``), then
continued by pseudo-arclength towards ``stop`` (:func:`mfpde.continuation.continue_branch`: folds and branch points
located; at a branch point the job follows the bifurcating branch too, :func:`~mfpde.continuation.branch_direction`).
At every point: λ, the certificate λ KL(ρ ‖ p_ρ), the risk, the free energy F_λ, the mean and variance of ρ per
block, ā = ∫ v dρ (the order parameter), the residual, the leading eigenvalues of −∂F/∂ρ and the stable flag.

Writes into DIR: ``config.toml``, ``report.json`` (``branches``, ``bifurcations``; docs/continuation.md) and
``plots/bifurcation.png`` (ā, the variance of ρ and R against λ).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import Any

from mpi4py import MPI

import numpy as np

from mfpde import __version__
from mfpde.config import Config
from mfpde.config_keys import to_toml
from mfpde.config_rules import check_training, continuation_range_rules
from mfpde.continuation import (
    Branch,
    Newton,
    StepControl,
    branch_direction,
    continue_branch,
    tangent,
)
from mfpde.errors import ConfigError, NumericalError
from mfpde.io import write_atomic, write_report
from mfpde.outdir import prepare_output_dir
from mfpde.training.gibbs import GibbsProblem, gibbs_residual_norm

__all__ = ["MAX_UNKNOWNS", "check_gibbs", "gibbs_branches", "gibbs_job"]

logger = logging.getLogger(__name__)
#: The most unknowns L·N_θ (dense Jacobians, LU) and the most branch points followed from one branch.
MAX_UNKNOWNS, MAX_SWITCHES = 3000, 2
#: Damped fixed-point steps before the first Newton solve, and how many times they are repeated if it fails.
PICARD_STEPS, PICARD_ROUNDS = 20, 5


def check_gibbs(cfg: Config) -> None:
    """Check the keys the λ continuation reads.

    Raises:
        ConfigError: naming the key: not a training (``run``) config, the λ range (both ends > 0, distinct), the
        step control, or a Θ grid too large for dense Jacobians.
    """
    c, t, h, tr = cfg.continuation, cfg.tokens, cfg.heads, cfg.training
    rules = (
        (t.domain == "box" and h.init.get("kind") == "gaussian", "continuation.parameter",
         f"'lambda' continues the training problem (a run config: tokens.domain = 'box', heads.init a Gaussian); "
         f"got tokens.domain = {t.domain!r}, heads.init.kind = {h.init.get('kind')!r}"),
        (tr.regularization == "entropic", "training.regularization", "continuation in λ needs 'entropic'"),
        *continuation_range_rules(c, "λ"),
    )
    for ok, key, msg in rules:
        if not ok:
            raise ConfigError(f"{key}: {msg}")
    for key in ("start", "stop"):  # each end within the λ that training itself accepts (config_rules.check_training)
        trial = dataclasses.replace(cfg, training=dataclasses.replace(tr, lam=getattr(c, key)))
        try:
            check_training(trial)
        except ConfigError as e:
            why = str(e).removeprefix("training.lambda: ")
            raise ConfigError(f"continuation.{key}: λ = {getattr(c, key):g} is outside the λ training accepts: {why}"
                              ) from None


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


def _start(P: GibbsProblem, newton: Newton, lam: float) -> np.ndarray | None:
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
        x0 = _start(P, newton, start)
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


def gibbs_job(cfg: Config, out: Path, comm: MPI.Comm = MPI.COMM_WORLD) -> dict[str, Any]:
    """Validate, continue the branch (replicated on every rank), write the report and the diagram.

    Raises:
        ConfigError: invalid input (nothing written). NumericalError: no fixed point at ``start`` (the report has
        status "failed").
    """
    from mfpde.training.problem import CoupledProblem

    check_gibbs(cfg)
    c = cfg.continuation
    cp = CoupledProblem(cfg, comm)
    P = GibbsProblem(cp)
    if P.m > MAX_UNKNOWNS:
        raise ConfigError(f"heads.cells: continuation in λ uses dense Jacobians of L·N_θ unknowns, at most "
                          f"{MAX_UNKNOWNS}; got {P.m}")
    prepare_output_dir(out, comm)
    write_atomic(out / "config.toml", to_toml(cfg), comm)
    ctl = StepControl(c.step, c.step_min, c.step_max, min(c.start, c.stop), max(c.start, c.stop), c.max_points, "λ")
    logger.info("continuation in λ of the Gibbs fixed points ρ = p_ρ: %s model, %d block(s) of %d Θ nodes, %d "
                "distinct a; λ from %g to %g", cfg.depth.model, P.n_layers, P.n_theta, P.n_a, c.start, c.stop)
    t0, c0 = time.perf_counter(), time.process_time()
    part = gibbs_branches(P, c.start, c.stop, ctl)
    ok = bool(part["branches"])
    report = {"status": "ok" if ok else "failed", "command": "continuation", "version": __version__,
              "parameter": "lambda", "model": cfg.depth.model, "family": cfg.heads.family,
              "lambda2": cfg.training.lambda2, "layers": P.n_layers, "theta_nodes": P.n_theta, "comm_size": comm.size,
              **part, "token_solves": P.evaluations, "wall_s": time.perf_counter() - t0,
              "cpu_s": time.process_time() - c0}
    if cfg.output.plots and comm.rank == 0 and ok:
        gibbs_plot(out / "plots" / "bifurcation.png", report)
    write_report(out, report, comm)
    for b in part["branches"]:
        logger.info("branch (%s): %d points, λ in [%.6g, %.6g], max λ KL(ρ‖p_ρ) = %.2e; %s", b["origin"],
                    len(b["parameter"]), min(b["parameter"]), max(b["parameter"]), max(b["certificate"]), b["stopped"])
    for e in part["bifurcations"]:
        logger.info("%s at λ = %.12g", e["kind"], e["parameter"])
    if not ok:
        raise NumericalError(part["stopped"])
    return report


def gibbs_plot(path: Path, report: dict[str, Any]) -> None:
    """ā = ∫ v dρ, the variance of ρ and the risk against λ (rank 0).

    Stable solid, unstable dashed, folds (×) and branch points (○) marked.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12.8, 4.0), layout="constrained")
    axes = fig.subplots(1, 3)
    for ax, key, label in ((axes[0], "order_parameter", "ā = ∫ v dρ"),
                           (axes[1], "variance", "variance of ρ (trace, mean over blocks)"),
                           (axes[2], "risk", "risk R(ρ)")):
        for i, b in enumerate(report["branches"]):
            lam, st = np.array(b["parameter"]), np.array(b["stable"])
            y = np.array([np.mean(x) for x in b[key]]) if key == "variance" else np.array(b[key])
            for j in range(len(lam) - 1):
                ax.plot(lam[j:j + 2], y[j:j + 2], color=f"C{i}", ls="-" if st[j] and st[j + 1] else "--")
            ax.plot([], [], color=f"C{i}", label=b["origin"])
        if key == "order_parameter":
            for e in report["bifurcations"]:
                ax.plot(e["parameter"], e["order_parameter"], "x" if e["kind"] == "fold" else "o", color="k", ms=7,
                        mfc="none")
        ax.set_xscale("log")
        ax.set_xlabel("entropic regularisation λ")
        ax.set_ylabel(label)
    axes[0].plot([], [], "k-", label="stable")
    axes[0].plot([], [], "k--", label="unstable")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Gibbs fixed points ρ = p_ρ: {report['model']} model, λ₂ = {report['lambda2']:g}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
