"""The box's part of the ``transport`` job (``tokens.domain = "box"``, theory §1.3 (F); interface.md).

The job itself (DIR, config, report) is the ``transport`` job's; this module gives it the domain's protocol
(:mod:`mfpde.domains`): :func:`check` (the problem built before DIR: bad data is refused with nothing written),
:func:`describe`, :func:`solve`, :func:`picture` and :data:`PICTURE`.

Every sample μ_0^i (``train`` and ``test``) is transported to μ_T^i under ρ₀ on one token mesh distributed over all
ranks (:func:`mfpde.tokens.box.problem.build`), one after the other: a sample block each (:func:`sample_report` and its
``target``) and a log line each. Into DIR: ``fields/mu_<i>.bp`` (μ_t every ``output.every`` depth steps) and
``plots/tokens.png`` (μ_0 and μ_T of the first :data:`N_PLOTTED` samples). The report's head has no ``domain``
(:data:`NAMED`), there is no progress display of the output depths (:data:`PROGRESS`), no last log line (no
``summary``) and no resolution check (the box counts no clusters).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from mpi4py import MPI

import dolfinx.fem
import numpy as np

from mfpde.errors import NumericalError
from mfpde.fields import FieldFiles
from mfpde.plots import TokenSeries, tokens_figure
from mfpde.tokens.box.config import Section
from mfpde.tokens.box.data import fill_density
from mfpde.tokens.box.problem import Problem, build
from mfpde.tokens.box.shallow import solve_shallow
from mfpde.tokens.box.transport import TransportReport

__all__ = ["N_PLOTTED", "NAMED", "PICTURE", "PROGRESS", "check", "describe", "picture", "sample_report", "solve",
           "transport_sample"]

logger = logging.getLogger(__name__)

#: The picture of the transport job, under DIR/plots.
PICTURE = "tokens.png"
#: How many samples ``plots/tokens.png`` of the transport job shows (the first ones).
N_PLOTTED = 4
#: The report's head names no domain.
NAMED = False
#: No progress display of the output depths: a log line per sample.
PROGRESS = False


def check(sec: Section, comm: MPI.Comm) -> Problem:
    """Build the problem (mesh, spaces, ρ₀, every sample filled once), before DIR.

    Raises:
        ConfigError, MeshError: invalid input (exit status 2), on every rank.
    """
    return build(sec, comm)


def describe(sec: Section, setup: Problem) -> str:
    """The transport job's first log line: the samples, d, the depth steps."""
    return (f"transport: {len(setup.train) + len(setup.test)} samples, d = {sec.tokens.dim}, {sec.depth.steps} depth "
            "steps")


def solve(sec: Section, comm: MPI.Comm, fields: FieldFiles | None, bar: Any, setup: Problem
          ) -> tuple[list[dict[str, Any]], TokenSeries | None]:
    """Transport every sample in turn (collective over ``comm``): (the sample blocks, what :func:`picture` draws).

    Args:
        sec: the box's section (``setup``'s).
        comm: the ranks (``setup``'s).
        fields: the job's fields (each sample's μ_t as the field ``mu_<i>``), or None.
        bar: unused (:data:`PROGRESS`).
        setup: the problem (:func:`check`).

    Raises:
        NumericalError: a solve failed; its ``blocks`` hold the blocks of the samples done before it.
    """
    samples: list[dict[str, Any]] = []
    try:
        return samples, _transport_samples(setup, fields, samples)
    except NumericalError as e:
        e.blocks = samples
        raise


def picture(sec: Section, block: list[dict[str, Any]], panels: TokenSeries | None) -> Any:
    """The figure of μ_0 and μ_T of the first samples (``plots/tokens.png``; rank 0), None without samples drawn."""
    return tokens_figure(panels) if panels is not None and panels.weights else None


def sample_report(rep: TransportReport) -> dict[str, Any]:
    """The per-sample block of the transport report (interface.md)."""
    return {"mass_T": rep.mass_T, "mass_error": rep.mass_error, "min_density": rep.min_density,
            "outflow": rep.outflow, "mean_T": rep.mean_T, "cov_T": rep.cov_T, "yhat": rep.yhat,
            "substeps": rep.substeps}


def transport_sample(pb: Problem, i: int, fields: FieldFiles | None = None,
                     on_initial: Callable[[dolfinx.fem.Function], None] | None = None
                     ) -> tuple[dolfinx.fem.Function, TransportReport]:
    """Transport sample ``i`` (of ``pb.train + pb.test``) to depth T under ρ₀ (collective over ``pb.comm``).

    Args:
        pb: the problem (:func:`mfpde.tokens.box.problem.build`).
        i: the sample's index in ``pb.train + pb.test``.
        fields: if given, μ_t is written to its field ``mu_<i>`` every ``output.every`` depth steps.
        on_initial: called with μ_0 before it is transported (e.g. to copy it).

    Returns:
        μ_T (a DG function on the token mesh, a density: mass per unit volume) and the solve's report.

    Raises:
        NumericalError: the solve failed.
    """
    sec, tokens = pb.sec, pb.tokens
    u = dolfinx.fem.Function(tokens.W, name="mu")
    fill_density((pb.train + pb.test)[i], u, tokens.mass)
    if on_initial is not None:
        on_initial(u)
    writer = None
    if fields is not None:
        writer = fields.open(f"mu_{i}", [u])
        writer.write(0.0)

    def cb(step: int, t: float, u: dolfinx.fem.Function) -> None:
        if writer is not None and (step % sec.output.every == 0 or step == sec.depth.steps):
            writer.write(t)

    if pb.shallow:
        rep = solve_shallow(tokens, u, pb.heads0, sec.depth.T, pb.g)
    else:
        rep = tokens.solve(u, pb.heads0, sec.depth.T, sec.depth.steps, pb.g, cb, outflow_tol=sec.tokens.outflow_tol)
    if writer is not None:
        writer.close()
    return u, rep


def _transport_samples(pb: Problem, fields: FieldFiles | None, samples: list[dict[str, Any]]) -> TokenSeries | None:
    """Transport each sample in turn, appending its report block to ``samples``; the picture's series, if any."""
    sec, quad = pb.sec, pb.tokens.quad
    series = TokenSeries(np.zeros((0, sec.tokens.dim)), np.zeros(0), [0.0, sec.depth.T])
    for i, s in enumerate(pb.train + pb.test):
        first: list[np.ndarray] = []
        keep = sec.output.plots and i < N_PLOTTED

        def initial(u0: dolfinx.fem.Function, first: list[np.ndarray] = first) -> None:
            first.append(quad.gather(u0))

        u, rep = transport_sample(pb, i, fields, initial if keep else None)
        if keep:
            series.weights.append(np.stack([first[0], quad.gather(u)]))
            series.labels.append(f"sample {i} (y = {s.target:+g})")
            series.yhat.append(rep.yhat)
        block = sample_report(rep)
        block["target"] = s.target
        samples.append(block)
        logger.info("sample %d: mass_T %.12g, outflow %.3g, min %.3g, yhat %.6g, mean %s", i, rep.mass_T,
                    rep.outflow, rep.min_density, rep.yhat, np.round(rep.mean_T, 6).tolist())
    if not series.weights:
        return None
    ones = dolfinx.fem.Function(pb.tokens.W)  # the lumped masses (collective)
    ones.x.array[:] = 1.0
    series.points, series.mass = quad.points, quad.gather(ones)
    return series
