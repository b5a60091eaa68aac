"""The ``transport`` job (interface.md): every sample μ_0^i transported to μ_T^i under ρ₀, and its report.

One path for every domain (:func:`domain_transport`): the domain's package (:mod:`mfpde.domains`) checks and
solves, this module prepares DIR, writes the resolved ``config.toml``, runs the resolution check, the picture and
``report.json``, and every file of the job: the fields the domain names (``fields/<name>.bp``, through a
:class:`~mfpde.fields.FieldFiles` of DIR) and its picture (the figure its ``picture`` returns, saved as
``plots/<PICTURE>``): the box's ``fields/mu_<i>.bp`` of every sample and ``plots/tokens.png``, the other
domains' ``fields/mu_0.bp`` and their pictures.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from mpi4py import MPI

from mfpde import signals
from mfpde.config import Config
from mfpde.errors import NumericalError
from mfpde.fields import FieldFiles, ended
from mfpde.jobs.scaffold import JobDir
from mfpde.tokens.box import job as box_job
from mfpde.tokens.box.job import sample_report, transport_sample
from mfpde.tokens.box.problem import Problem
from mfpde.tokens.depths import LogProgress, kept_outputs, output_depths
from mfpde.tokens.resolution import Quiet, resolution_check

__all__ = ["domain_transport", "run_transport", "sample_report", "transport_job", "transport_sample"]

logger = logging.getLogger(__name__)


def transport_job(cfg: Config, out: Path, comm: MPI.Comm = MPI.COMM_WORLD, progress: Any = None) -> dict[str, Any]:
    """Validate the input, prepare DIR, write the resolved config and transport (:func:`domain_transport`).

    ``progress``: a factory progress(total, initial) of a display with ``update()`` and ``close()`` (the CLI's tqdm
    bar on a terminal), used by the depth loop of a domain with one sample.

    Returns:
        The report (also written to ``DIR/report.json``).

    Raises:
        ConfigError: invalid input (nothing is written).
        NumericalError: a solve failed (``report.json`` has status "failed").
    """
    with ended():  # a writer open when the job raises: closed or abandoned before DIR is settled (fields.py)
        return domain_transport(cfg, out, comm, progress)


def domain_transport(cfg: Config, out: Path, comm: MPI.Comm = MPI.COMM_WORLD, progress: Any = None) -> dict[str, Any]:
    """The ``transport`` job of any domain, by the ``job`` module of its package.

    That module (:mod:`mfpde.domains`) gives, each function taking the domain's section of ``cfg``
    (:func:`~mfpde.domains.domain_section`, built here once): ``check(sec, comm)`` (refusals before DIR; it may
    return the domain's set-up, then given to ``describe`` and ``solve`` as ``setup``), ``describe(sec)`` (the
    first log line), ``solve(sec, comm, fields, bar, **options)`` (the sample block, or a list of them, and the
    panels of the picture; :class:`NumericalError` with the failed sample's ``block`` so far, or the ``blocks`` done
    before it), ``picture(sec, block, panels)`` (the figure, or None) and ``PICTURE`` (its file under ``plots/``;
    optionally ``SAVEFIG``, matplotlib's options for it), and optionally ``summary(sec, block)`` (the last log
    line), ``head(sec)`` (the report's head fields of the domain), ``NAMED = False`` (no ``domain`` in the head) and
    ``PROGRESS = False`` (no progress display). Here: DIR and the config
    (:class:`~mfpde.jobs.scaffold.JobDir`), the progress, the resolution check of the cluster counts
    (:mod:`mfpde.tokens.resolution`, by the domain's ``coarser``, where it has one), the picture and the report
    (``samples``, ``warnings`` where the resolution was checked).

    Raises:
        ConfigError: invalid input (nothing written). NumericalError: a failed solve (status "failed", the blocks
        up to the last good output depth).
    """
    from mfpde.domains import domain_job, domain_section

    dom = domain_job(cfg.tokens.domain)
    with signals.stage("set-up"):  # the line of an interruption says that nothing was computed
        sec = domain_section(cfg)
        setup = dom.check(sec, comm)
        head: dict[str, Any] = {"domain": cfg.tokens.domain} if getattr(dom, "NAMED", True) else {}
        head.update(dom.head(sec) if hasattr(dom, "head") else {})
        job = JobDir(cfg, out, comm, "transport", **head)
    options = {} if setup is None else {"setup": setup}
    logger.info("%s -> %s", dom.describe(sec, **options), out)
    bar = None
    if getattr(dom, "PROGRESS", True):
        keep = kept_outputs(sec)
        bar = progress(len(keep) - 1, 0) if progress is not None else None
        if bar is None:
            bar = LogProgress(len(keep) - 1, output_depths(sec)[keep], cfg.tokens.domain)
    fields = FieldFiles(out) if cfg.output.fields else None
    return _transport(dom, sec, cfg.tokens.domain, out, comm, job, fields, bar, options)


def run_transport(pb: Problem, out: Path, write_fields: bool = True) -> dict[str, Any]:
    """Transport every sample of a built box problem into a DIR prepared already (a test's), and its report.

    Writes ``fields/mu_<i>.bp`` (μ_t every ``output.every`` depth steps; not without ``write_fields``),
    ``plots/tokens.png`` and ``report.json`` (:meth:`JobDir.existing <mfpde.jobs.scaffold.JobDir.existing>`: the
    report's head and wall time).

    Raises:
        NumericalError: a solve failed; ``report.json`` then has status "failed" and the samples done.
    """
    job = JobDir.existing(out, pb.comm, "transport")
    fields = FieldFiles(out) if write_fields and pb.sec.output.fields else None
    return _transport(box_job, pb.sec, pb.sec.tokens.domain, out, pb.comm, job, fields, None, {"setup": pb})


def _transport(dom: Any, sec: Any, domain: str, out: Path, comm: MPI.Comm, job: JobDir, fields: FieldFiles | None,
               bar: Any, options: dict[str, Any]) -> dict[str, Any]:
    """Solve, check the resolution, draw the picture and write the report (the job's part after its first line).

    ``sec``: the section of the config of the ``domain`` (:func:`mfpde.domains.domain_section`), which its functions
    take.
    """
    from mfpde.domains import domain_attribute

    try:
        result, panels = dom.solve(sec, comm, fields, bar, **options)
    except NumericalError as e:
        done = list(e.blocks or [])
        what = f"sample {len(done)}: {e}"
        job.failed(what, [*done, e.block] if e.block else done)
        raise NumericalError(what) from None
    finally:
        if bar is not None:
            bar.close()
    blocks = result if isinstance(result, list) else [result]
    more: dict[str, Any] = {}
    coarser = domain_attribute(domain, "coarser", None)
    if coarser is not None:  # the domains that count clusters

        more["warnings"] = resolution_check(blocks[0], coarser(sec),  # one sample: its block
                                            lambda c, **kw: dom.solve(c, comm, None, Quiet(), **kw)[0])
    if sec.output.plots and comm.rank == 0:  # before the report: an interruption here leaves no report (exit 4)
        _picture(dom, sec, result, panels, out / "plots" / dom.PICTURE)
    report = job.finish(samples=blocks, **more)
    if hasattr(dom, "summary"):
        logger.info("%s", dom.summary(sec, result))
    return report


def _picture(dom: Any, sec: Any, result: Any, panels: Any, path: Path) -> None:
    """The domain's figure saved as ``path`` (rank 0). A plot never fails the job: a failure is a warning."""
    from mfpde.plots import save_figure

    try:
        fig = dom.picture(sec, result, panels)
        if fig is not None:
            save_figure(fig, path, **getattr(dom, "SAVEFIG", {}))
    except Exception as e:  # noqa: BLE001  a plot never fails the job
        logger.warning("plots/%s not written: %s: %s", path.name, type(e).__name__, e)
