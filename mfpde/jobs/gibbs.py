"""``mfpde continuation`` with ``parameter = "lambda"``: the branch of Gibbs fixed points ρ = p_ρ against λ (theory §4).

The job: the keys it reads (:func:`check_gibbs`), DIR (:class:`~mfpde.jobs.scaffold.JobDir`), the report and the
diagram; the branches themselves are :func:`mfpde.training.gibbs.gibbs_branches`'.

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
import time
from pathlib import Path
from typing import Any

from mpi4py import MPI

import numpy as np

from mfpde.config import Config
from mfpde.config.rules import check_training, continuation_range_rules
from mfpde.continuation import StepControl
from mfpde.errors import ConfigError, NumericalError
from mfpde.jobs.scaffold import JobDir
from mfpde.training.gibbs import GibbsProblem, gibbs_branches

__all__ = ["MAX_UNKNOWNS", "check_gibbs", "gibbs_job", "gibbs_plot"]

logger = logging.getLogger(__name__)
#: The most unknowns L·N_θ (dense Jacobians, LU).
MAX_UNKNOWNS = 3000


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
    for key in ("start", "stop"):  # each end within the λ that training itself accepts (config.rules.check_training)
        trial = dataclasses.replace(cfg, training=dataclasses.replace(tr, lam=getattr(c, key)))
        try:
            check_training(trial)
        except ConfigError as e:
            why = str(e).removeprefix("training.lambda: ")
            raise ConfigError(f"continuation.{key}: λ = {getattr(c, key):g} is outside the λ training accepts: {why}"
                              ) from None


def gibbs_job(cfg: Config, out: Path, comm: MPI.Comm = MPI.COMM_WORLD) -> dict[str, Any]:
    """Validate, continue the branch (replicated on every rank), write the report and the diagram.

    Raises:
        ConfigError: invalid input (nothing written). NumericalError: no fixed point at ``start`` (the report has
        status "failed").
    """
    from mfpde.training.problem import CoupledProblem

    check_gibbs(cfg)
    c = cfg.continuation
    cp = CoupledProblem.from_config(cfg, comm)
    P = GibbsProblem(cp)
    if P.m > MAX_UNKNOWNS:
        raise ConfigError(f"heads.cells: continuation in λ uses dense Jacobians of L·N_θ unknowns, at most "
                          f"{MAX_UNKNOWNS}; got {P.m}")
    job = JobDir(cfg, out, comm, "continuation", parameter="lambda", model=cfg.depth.model,
                 family=cfg.heads.family, lambda2=cfg.training.lambda2, layers=P.n_layers, theta_nodes=P.n_theta)
    ctl = StepControl(c.step, c.step_min, c.step_max, min(c.start, c.stop), max(c.start, c.stop), c.max_points, "λ")
    logger.info("continuation in λ of the Gibbs fixed points ρ = p_ρ: %s model, %d block(s) of %d Θ nodes, %d "
                "distinct a; λ from %g to %g", cfg.depth.model, P.n_layers, P.n_theta, P.n_a, c.start, c.stop)
    c0 = time.process_time()
    part = gibbs_branches(P, c.start, c.stop, ctl)
    ok = bool(part["branches"])
    report = job.report("ok" if ok else "failed", **part, token_solves=P.evaluations, cpu_s=time.process_time() - c0)
    if cfg.output.plots and comm.rank == 0 and ok:
        gibbs_plot(out / "plots" / "bifurcation.png", report)
    job.write(report)
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
