"""From a :class:`~mfpde.config.Config` to solver objects, and the ``transport`` job.

The CLI only parses and reports; this module assembles meshes, spaces, initial data and solvers.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from mpi4py import MPI

import dolfinx.fem
import dolfinx.io
import numpy as np

from mfpde import __version__
from mfpde.attention import HeadMeasure, make_family
from mfpde.config import Config
from mfpde.data import Sample, fill_density, load_samples
from mfpde.errors import NumericalError
from mfpde.heads import dirac_heads, theta_space
from mfpde.io import write_report
from mfpde.mesh import make_domain
from mfpde.transport import Readout, TokenTransport, TransportReport, readout_function

logger = logging.getLogger(__name__)


@dataclass
class Problem:
    """Everything a solve needs, built once from the config."""

    cfg: Config
    comm: MPI.Comm
    tokens: TokenTransport
    heads0: HeadMeasure
    train: list[Sample]
    test: list[Sample]
    g: Readout


def build(cfg: Config, comm: MPI.Comm = MPI.COMM_WORLD) -> Problem:
    """Build the token solver, the reduced initial ρ and the samples from the config.

    Raises:
        ConfigError, MeshError: invalid input (exit status 2).
    """
    t, h = cfg.tokens, cfg.heads
    tok_dom = make_domain(comm, t.dim, t.mesh, t.box, t.cells, t.cell)
    tokens = TokenTransport(tok_dom, t.degree, t.cfl, cfg.petsc.token)
    family = make_family(h.family, h.a)
    if h.init["kind"] == "gaussian":
        theta = theta_space(comm, cfg, family)
        heads0 = theta.head_measure(theta.gaussian(h.init["mean"], h.init["cov"]))
    else:
        heads0 = dirac_heads(family, h.init["points"], h.init["weights"])
    train, test = load_samples(cfg)
    u = dolfinx.fem.Function(tokens.W)
    for s in train + test:  # bad data is an input error before anything is written
        fill_density(s, u, tokens.mass)
    g = readout_function(cfg.loss.readout, cfg.loss.w, cfg.loss.b)
    return Problem(cfg, comm, tokens, heads0, train, test, g)


def sample_report(rep: TransportReport) -> dict:
    """The per-sample block of the transport report (interface.md)."""
    return {"mass_T": rep.mass_T, "mass_error": rep.mass_error, "min_density": rep.min_density,
            "outflow": rep.outflow, "mean_T": rep.mean_T, "cov_T": rep.cov_T, "yhat": rep.yhat,
            "substeps": rep.substeps}


def run_transport(pb: Problem, out: Path, write_fields: bool = True) -> dict:
    """The ``transport`` job: transport every sample μ_0^i to μ_T^i under ρ_0 and report its moments.

    Writes ``fields/mu_<i>.bp`` (μ_t every ``output.every`` depth steps) and ``report.json``.

    Raises:
        NumericalError: a solve failed; ``report.json`` then has status "failed" and the samples done.
    """
    t0 = time.perf_counter()
    samples: list[dict] = []
    try:
        _transport_samples(pb, out, write_fields, samples)
    except NumericalError as e:
        write_report(out, {"status": "failed", "command": "transport", "version": __version__,
                           "comm_size": pb.comm.size, "wall_s": time.perf_counter() - t0, "samples": samples,
                           "error": f"sample {len(samples)}: {e}"}, pb.comm)
        raise NumericalError(f"sample {len(samples)}: {e}") from None
    report = {"status": "ok", "command": "transport", "version": __version__, "comm_size": pb.comm.size,
              "wall_s": time.perf_counter() - t0, "samples": samples}
    write_report(out, report, pb.comm)
    return report


def _transport_samples(pb: Problem, out: Path, write_fields: bool, samples: list[dict]) -> None:
    """Transport each sample in turn, appending its report block to ``samples``."""
    cfg, tt = pb.cfg, pb.tokens
    for i, s in enumerate(pb.train + pb.test):
        u = dolfinx.fem.Function(tt.W, name="mu")
        fill_density(s, u, tt.mass)
        writer = None
        if write_fields and cfg.output.fields:
            writer = dolfinx.io.VTXWriter(pb.comm, out / "fields" / f"mu_{i}.bp", [u])
            writer.write(0.0)

        def cb(step: int, t: float, u: dolfinx.fem.Function, writer=writer) -> None:
            if writer is not None and (step % cfg.output.every == 0 or step == cfg.depth.steps):
                writer.write(t)

        rep = tt.solve(u, pb.heads0, cfg.depth.T, cfg.depth.steps, pb.g, cb, outflow_tol=cfg.tokens.outflow_tol,
                       shallow=cfg.depth.model == "shallow")
        if writer is not None:
            writer.close()
        block = sample_report(rep)
        block["target"] = s.target
        samples.append(block)
        logger.info("sample %d: mass_T %.12g, outflow %.3g, min %.3g, yhat %.6g, mean %s", i, rep.mass_T,
                    rep.outflow, rep.min_density, rep.yhat, np.round(rep.mean_T, 6).tolist())
