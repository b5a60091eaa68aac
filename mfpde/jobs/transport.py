"""The ``transport`` job (interface.md): every sample μ_0^i transported to μ_T^i under ρ₀, and its report.

On the box, built by :func:`mfpde.problem.build` (one token mesh distributed over all ranks); writes ``config.toml``,
``fields/mu_<i>.bp`` (μ_t every ``output.every`` depth steps), ``plots/tokens.png`` (μ_0 and μ_T of the first
samples) and ``report.json`` into DIR. On every other domain, :func:`domain_transport` by the domain's package.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mpi4py import MPI

import dolfinx.fem
import numpy as np

from mfpde import signals
from mfpde.config import Config
from mfpde.errors import NumericalError
from mfpde.fields import FieldWriter, ended
from mfpde.jobs.scaffold import JobDir
from mfpde.plots import TokenSeries, plot_run
from mfpde.problem import Problem, build
from mfpde.tokens.box.data import fill_density
from mfpde.tokens.box.shallow import solve_shallow
from mfpde.tokens.box.transport import TransportReport
from mfpde.tokens.depths import LogProgress, kept_outputs, output_depths
from mfpde.tokens.resolution import Quiet, resolution_check

__all__ = ["domain_transport", "run_transport", "sample_report", "transport_job", "transport_sample"]

logger = logging.getLogger(__name__)


def transport_job(cfg: Config, out: Path, comm: MPI.Comm = MPI.COMM_WORLD, progress: Any = None) -> dict[str, Any]:
    """Validate the input, prepare DIR, write the resolved config and run :func:`run_transport`.

    ``progress``: a factory progress(total, initial) of a display with ``update()`` and ``close()`` (the CLI's tqdm
    bar on a terminal), used by the circle's depth loop.

    Returns:
        The report (also written to ``DIR/report.json``).

    Raises:
        ConfigError: invalid input (nothing is written).
        NumericalError: a solve failed (``report.json`` has status "failed").
    """
    with ended():  # a writer open when the job raises: closed or abandoned before DIR is settled (fields.py)
        return _job(cfg, out, comm, progress)


def _job(cfg: Config, out: Path, comm: MPI.Comm, progress: Any) -> dict[str, Any]:
    if cfg.tokens.domain != "box":  # the circle (theory §8), the sphere (§9), S^{d−1} (§11): each by its package
        return domain_transport(cfg, out, comm, progress)
    with signals.stage("set-up"):  # the line of an interruption says that nothing was computed
        pb = build(cfg, comm)
        JobDir(cfg, out, comm, "transport")  # DIR as a transaction, the resolved config
    logger.info("transport: %d samples, d = %d, %d depth steps -> %s", len(pb.train) + len(pb.test),
                cfg.tokens.dim, cfg.depth.steps, out)
    return run_transport(pb, out)


def domain_transport(cfg: Config, out: Path, comm: MPI.Comm = MPI.COMM_WORLD, progress: Any = None) -> dict[str, Any]:
    """The ``transport`` job of a domain other than the box, by the ``job`` module of its package.

    That module (:mod:`mfpde.domains`) gives ``check(cfg, comm)`` (refusals before DIR), ``describe(cfg)`` and
    ``summary(cfg, block)`` (the first and last log lines), ``solve(cfg, comm, fields, bar, **options)`` (the
    sample block and the panels of the picture; :class:`NumericalError` with the block so far), ``picture(path,
    cfg, block, panels)`` and ``PICTURE`` (its file under ``plots/``), and optionally ``head(cfg)`` (the report's
    head fields of the domain). Here: DIR and the config (:class:`~mfpde.jobs.scaffold.JobDir`), the progress,
    the resolution check of the cluster counts (:mod:`mfpde.tokens.resolution`, by the domain's ``coarser``), the
    picture and the report (``samples``, ``warnings``).

    Raises:
        ConfigError: invalid input (nothing written). NumericalError: a failed solve (status "failed", the block
        up to the last good output depth).
    """
    from mfpde.domains import domain_attribute, domain_job

    dom = domain_job(cfg.tokens.domain)
    dom.check(cfg, comm)
    head = dom.head(cfg) if hasattr(dom, "head") else {}
    job = JobDir(cfg, out, comm, "transport", domain=cfg.tokens.domain, **head)
    logger.info("%s -> %s", dom.describe(cfg), out)
    keep = kept_outputs(cfg)
    bar = progress(len(keep) - 1, 0) if progress is not None else None
    if bar is None:
        bar = LogProgress(len(keep) - 1, output_depths(cfg)[keep], cfg.tokens.domain)
    try:
        block, panels = dom.solve(cfg, comm, out if cfg.output.fields else None, bar)
    except NumericalError as e:
        partial = getattr(e, "block", None)
        job.failed(f"sample 0: {e}", [partial] if partial else [])
        raise NumericalError(f"sample 0: {e}") from None
    finally:
        bar.close()
    coarser = domain_attribute(cfg.tokens.domain, "coarser", lambda c: None)
    warnings = resolution_check(block, coarser(cfg), lambda c, **kw: dom.solve(c, comm, None, Quiet(), **kw)[0])
    if cfg.output.plots and comm.rank == 0:  # before the report: an interruption here leaves no report (exit 4)
        dom.picture(out / "plots" / dom.PICTURE, cfg, block, panels)
    report = job.finish(samples=[block], warnings=warnings)
    logger.info("%s", dom.summary(cfg, block))
    return report


def sample_report(rep: TransportReport) -> dict[str, Any]:
    """The per-sample block of the transport report (interface.md)."""
    return {"mass_T": rep.mass_T, "mass_error": rep.mass_error, "min_density": rep.min_density,
            "outflow": rep.outflow, "mean_T": rep.mean_T, "cov_T": rep.cov_T, "yhat": rep.yhat,
            "substeps": rep.substeps}


def run_transport(pb: Problem, out: Path, write_fields: bool = True) -> dict[str, Any]:
    """Transport every sample μ_0^i to μ_T^i under ρ₀ and report its moments (theory §1.3 (F)).

    Writes ``fields/mu_<i>.bp`` (μ_t every ``output.every`` depth steps) and ``report.json`` into DIR as the job
    prepared it (:meth:`JobDir.existing <mfpde.jobs.scaffold.JobDir.existing>`: the report's head and wall time).

    Raises:
        NumericalError: a solve failed; ``report.json`` then has status "failed" and the samples done.
    """
    job = JobDir.existing(out, pb.comm, "transport")
    samples: list[dict[str, Any]] = []
    try:
        _transport_samples(pb, out, write_fields, samples)
    except NumericalError as e:
        job.failed(f"sample {len(samples)}: {e}", samples)
        raise NumericalError(f"sample {len(samples)}: {e}") from None
    return job.finish(samples=samples)


def transport_sample(pb: Problem, i: int, writer_path: Path | None = None,
                     on_initial: Callable[[dolfinx.fem.Function], None] | None = None
                     ) -> tuple[dolfinx.fem.Function, TransportReport]:
    """Transport sample ``i`` (of ``pb.train + pb.test``) to depth T under ρ₀ (collective over ``pb.comm``).

    Args:
        pb: the problem (:func:`mfpde.problem.build`).
        i: the sample's index in ``pb.train + pb.test``.
        writer_path: if given, μ_t is written there (a ``.bp`` directory) every ``output.every`` depth steps.
        on_initial: called with μ_0 before it is transported (e.g. to copy it).

    Returns:
        μ_T (a DG function on the token mesh, a density: mass per unit volume) and the solve's report.

    Raises:
        NumericalError: the solve failed.
    """
    cfg, tokens = pb.cfg, pb.tokens
    u = dolfinx.fem.Function(tokens.W, name="mu")
    fill_density((pb.train + pb.test)[i], u, tokens.mass)
    if on_initial is not None:
        on_initial(u)
    writer = None
    if writer_path is not None:
        writer = FieldWriter(pb.comm, writer_path, [u])
        writer.write(0.0)

    def cb(step: int, t: float, u: dolfinx.fem.Function) -> None:
        if writer is not None and (step % cfg.output.every == 0 or step == cfg.depth.steps):
            writer.write(t)

    if pb.shallow:
        rep = solve_shallow(tokens, u, pb.heads0, cfg.depth.T, pb.g)
    else:
        rep = tokens.solve(u, pb.heads0, cfg.depth.T, cfg.depth.steps, pb.g, cb, outflow_tol=cfg.tokens.outflow_tol)
    if writer is not None:
        writer.close()
    return u, rep


#: How many samples ``plots/tokens.png`` of the transport job shows (the first ones).
N_PLOTTED = 4


def _transport_samples(pb: Problem, out: Path, write_fields: bool, samples: list[dict[str, Any]]) -> None:
    """Transport each sample in turn, appending its report block to ``samples``; then ``plots/tokens.png``."""
    cfg, quad = pb.cfg, pb.tokens.quad
    series = TokenSeries(np.zeros((0, cfg.tokens.dim)), np.zeros(0), [0.0, cfg.depth.T])
    for i, s in enumerate(pb.train + pb.test):
        path = out / "fields" / f"mu_{i}.bp" if write_fields and cfg.output.fields else None
        first: list[np.ndarray] = []
        keep = cfg.output.plots and i < N_PLOTTED

        def initial(u0: dolfinx.fem.Function, first: list[np.ndarray] = first) -> None:
            first.append(quad.gather(u0))

        u, rep = transport_sample(pb, i, path, initial if keep else None)
        if keep:
            series.weights.append(np.stack([first[0], quad.gather(u)]))
            series.labels.append(f"sample {i} (y = {s.target:+g})")
            series.yhat.append(rep.yhat)
        block = sample_report(rep)
        block["target"] = s.target
        samples.append(block)
        logger.info("sample %d: mass_T %.12g, outflow %.3g, min %.3g, yhat %.6g, mean %s", i, rep.mass_T,
                    rep.outflow, rep.min_density, rep.yhat, np.round(rep.mean_T, 6).tolist())
    if series.weights:
        ones = dolfinx.fem.Function(pb.tokens.W)
        ones.x.array[:] = 1.0
        series.points, series.mass = quad.points, quad.gather(ones)
        if pb.comm.rank == 0:
            try:
                plot_run(out, [], {}, None, series, figures=("tokens",))
            except Exception as e:  # noqa: BLE001  a plot never fails the job
                logger.warning("plots/tokens.png not written: %s: %s", type(e).__name__, e)
