"""The ``continuation`` job: the stationary states of noisy tokens (circle, sphere, S^{d−1}) against the coupling K.

Validates the keys it reads (:func:`check_continuation`), prepares DIR (:class:`~mfpde.jobs.scaffold.JobDir`),
continues the branches by :func:`mfpde.bifurcation.noisy_branches` on the domain's stationary problem
(:func:`mfpde.domains.stationary_problem`) and writes ``config.toml``, ``report.json`` (``branches``,
``bifurcations``; docs/continuation.md) and ``plots/bifurcation.png``. ``continuation.parameter = "lambda"`` on a
training config is the Gibbs branch of training (:func:`mfpde.jobs.gibbs.gibbs_job`).
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

from mpi4py import MPI

from mfpde.bifurcation import Stationary, noisy_branches
from mfpde.config import Config
from mfpde.config.rules import LN_TINY, continuation_range_rules
from mfpde.continuation import StepControl
from mfpde.continuation_newton import start_petsc
from mfpde.domains import domain_attribute, stationary_problem
from mfpde.errors import ConfigError, NumericalError
from mfpde.jobs.scaffold import JobDir

__all__ = ["DISCRETISATIONS", "MAX_POINTS_N", "PARAMETERS", "bifurcation_plot", "check_continuation",
           "continuation_job"]

logger = logging.getLogger(__name__)
#: The largest Gibbs exponent κΦ ≤ K e^β/(τβ) of a domain with log-density unknowns (its round-off 1e10 ε ≈ 2e-6).
LOG_EXPONENT_MAX = 1e10
#: The largest Gibbs exponent K e^β/(τβ) of the collocation of density unknowns (the circle's, the sphere's): ε times
#: it is the round-off of the density, against Newton's absolute tolerance 1e-12 (measured on the circle, 127 points:
#: 5e3 converges, 1e4 fails at the first step; β = 1e-5 and 1e-6 ended with exit 3 at K = 0.2). Above β ≈ 1.5 the
#: span rule (LN_TINY) is the stricter: this one refuses a small β at a large K/τ. The spectral discretisation
#: (the default) solves β = 1e-6.
DENSITY_EXPONENT_MAX = 1e4
#: The discretisations of the circle's and the sphere's stationary states (``continuation.discretisation``):
#: "spectral" (Fourier / Legendre coefficients, the kernel diagonal, numpy's Newton) and "collocation" (values at the
#: points, the collocated kernel, PETSc's SNES and SLEPc).
DISCRETISATIONS = ("spectral", "collocation")
#: The most collocation points (dense N × N matrices) and branch points.
MAX_POINTS_N = 1023
#: The continuation parameters: the coupling K (the v of the single Dirac head; β is its a) of noisy tokens, and the
#: entropic regularisation λ of training (:mod:`mfpde.jobs.gibbs`).
PARAMETERS = ("coupling", "lambda")


def check_continuation(cfg: Config) -> tuple[float, float]:
    """Check the keys the continuation reads; return (β, τ).

    Raises:
        ConfigError: naming the key: the domain, attention, noise, heads, or a ``[continuation]`` value.
    """
    c, t, h = cfg.continuation, cfg.tokens, cfg.heads
    rules = (
        (c.parameter in PARAMETERS, "continuation.parameter", f"must be one of {list(PARAMETERS)}, got "
         f"{c.parameter!r}"),
        (c.parameter != "lambda", "continuation.parameter", "'lambda' continues the training problem (a run "
         f"config: tokens.domain = 'box', heads.init a Gaussian); got tokens.domain = {t.domain!r}"),
        (t.attention == "unnormalised", "tokens.attention", "continuation needs 'unnormalised' (the gradient flow "
         "of theory §10)"),
        (t.noise > 0 and math.isfinite(t.noise), "tokens.noise", f"continuation needs τ > 0, got {t.noise:g}"),
        (h.init.get("kind") == "diracs" and len(h.init.get("points", [])) == 1, "heads.init",
         "continuation needs a single Dirac head [[β, K]] (tokens.beta = β sets it)"),
        *continuation_range_rules(c, "coupling"),
        (9 <= c.points <= MAX_POINTS_N, "continuation.points", f"must be in 9..{MAX_POINTS_N}, got {c.points}"),
        (getattr(c, "discretisation", "spectral") in DISCRETISATIONS, "continuation.discretisation",
         f"must be one of {list(DISCRETISATIONS)}, got {getattr(c, 'discretisation', '')!r}"),
    )
    for ok, key, msg in rules:
        if not ok:
            raise ConfigError(f"{key}: {msg}")
    beta = float(h.init["points"][0][0])
    if not 0 < beta <= 700:
        raise ConfigError(f"tokens.beta: continuation needs β (heads.init's a) in (0, 700], got {beta:g}")
    # the stationary density ∝ exp((K/τβ) e^{β cos} ∗ μ) spans e^{span} over the domain (μ of mass 1): past the
    # double range it is 0 on part of it, and the uniform branch's linearisation overflows
    k_max = max(c.start, c.stop)
    span = k_max * 2.0 * math.sinh(beta) / (t.noise * beta)
    key = "continuation.stop" if c.stop >= c.start else "continuation.start"
    if domain_attribute(t.domain, "LOG_DENSITY", False):
        # log-density unknowns take any span; the exponent κΦ ≤ K e^β/(τβ) itself must keep its digits
        expo = k_max * math.exp(beta) / (t.noise * beta)
        if not expo <= LOG_EXPONENT_MAX:
            raise ConfigError(f"{key}: K e^β/(τβ) = {expo:.3g} > {LOG_EXPONENT_MAX:.0e} at K = {k_max:g} (β = "
                              f"{beta:g}, τ = {t.noise:g}): the Gibbs exponent would lose its digits to round-off; "
                              "lower K or β, or raise tokens.noise")
    elif not span <= LN_TINY:
        raise ConfigError(f"{key}: K (e^β − e^−β)/(τβ) = {span:.3g} > {LN_TINY:.0f} at K = {k_max:g} (β = {beta:g}, "
                          f"τ = {t.noise:g}): the stationary density would underflow to 0 on part of the "
                          f"{t.domain}; lower K or β, or raise tokens.noise")
    elif (getattr(c, "discretisation", "spectral") == "collocation"
          and not (expo := k_max * math.exp(beta) / (t.noise * beta)) <= DENSITY_EXPONENT_MAX):
        raise ConfigError(f"tokens.beta: K e^β/(τβ) = {expo:.3g} > {DENSITY_EXPONENT_MAX:.0e} at K = {k_max:g} (β = "
                          f"{beta:g}, τ = {t.noise:g}): the collocation's Gibbs exponent's round-off (ε times it) "
                          "would exceed Newton's tolerance on the density, and no step converges; raise β or "
                          f"tokens.noise, lower {key}, or take continuation.discretisation = 'spectral'")
    return beta, float(t.noise)


def continuation_job(cfg: Config, out: Path, comm: MPI.Comm = MPI.COMM_WORLD) -> dict[str, Any]:
    """Validate, continue the branches (replicated on every rank), write the report and the diagram.

    ``continuation.parameter = "lambda"`` on a training config: :func:`mfpde.jobs.gibbs.gibbs_job`.

    Raises:
        ConfigError: invalid input (nothing written). NumericalError: no branch beyond its first point (the report
        has status "failed" and what was computed).
    """
    if cfg.continuation.parameter == "lambda" and cfg.tokens.domain == "box":
        from mfpde.jit_cache import repair_jit_cache

        start_petsc()
        repair_jit_cache()  # the command line leaves it to the continuation (mfpde.cli)
        from mfpde.jobs.gibbs import gibbs_job

        return gibbs_job(cfg, out, comm)
    beta, tau = check_continuation(cfg)
    c = cfg.continuation
    job = JobDir(cfg, out, comm, "continuation")
    P = stationary_problem(cfg, c.points, beta, tau)
    ctl = StepControl(c.step, c.step_min, c.step_max, min(c.start, c.stop), max(c.start, c.stop), c.max_points)
    fields = getattr(P, "report_fields", {})
    how = (f"{c.points} points, {fields['unknowns']} {fields['discretisation']} unknowns" if "unknowns" in fields
           else f"{c.points} collocation points")
    logger.info("continuation in K on the %s: β = %g, τ = %g, K from %g to %g, %s; K_c = τβ/λ_1(β) = %.10g",
                _where(P), beta, tau, c.start, c.stop, how, P.threshold(1))
    c0 = time.process_time()
    part = noisy_branches(P, c.start, c.stop, ctl)
    ok = any(len(b["parameter"]) > 1 for b in part["branches"])
    job.add_head(domain=P.domain, **getattr(P, "report_fields", {}), label=_where(P), parameter=c.parameter,
                 beta=beta, noise=tau, points=c.points)
    report = job.report("ok" if ok else "failed", **part, cpu_s=time.process_time() - c0)
    if cfg.output.plots and comm.rank == 0:  # before the report: an interruption here leaves no report (exit 4)
        bifurcation_plot(out / "plots" / "bifurcation.png", report)
    job.write(report)
    for b in part["branches"]:
        logger.info("branch (%s): %d points, K in [%.6g, %.6g]; %s", b["origin"], len(b["parameter"]),
                    min(b["parameter"]), max(b["parameter"]), b["stopped"])
    for w in part["warnings"]:
        logger.warning("%s", w)
    for e in part["bifurcations"]:
        if "parameter" in e:
            logger.info("%s at K = %.12g (mode %d)", e["kind"], e["parameter"], e["mode"])
        else:
            logger.info("%s: not found on the branch of mode %d (%s)", e["kind"], e["mode"], e["why"])
    if not ok:
        raise NumericalError("no branch was continued beyond its first point: " +
                             "; ".join(b["stopped"] for b in part["branches"]))
    return report


def _where(P: Stationary) -> str:
    """The domain in words: the problem's ``label`` ("hypersphere S^15") or its ``domain``."""
    return str(getattr(P, "label", P.domain))


def bifurcation_plot(path: Path, report: dict[str, Any]) -> None:
    """Each branch's amplitude against K (rank 0): :func:`mfpde.plot_continuation.bifurcation_figure`."""
    import matplotlib

    matplotlib.use("Agg")
    from mfpde.plot_continuation import bifurcation_figure

    fig = bifurcation_figure(report)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
