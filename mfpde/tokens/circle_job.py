"""The ``transport`` job on the circle (``tokens.domain = "circle"``, theory §9; interface.md).

The 1-D density is small: every rank runs the same solve on the whole circle (replicated, so the report is the
same on any number of ranks); only the ParaView field is distributed: a DOLFINx mesh of the circle (a closed
polygon of n edges in R², vertex j at (cos jh, sin jh)) carries μ_t as a DG_p function, each rank filling its
owned cells from the replicated nodal array and writing them once (:class:`mfpde.fields.FieldWriter`).

Writes into DIR: ``config.toml``, ``report.json`` (per sample: mass, positivity, ``fourier`` at every output
depth, ``clusters_T``, ``cluster_angles_T``, ``w1_uniform_T``), ``fields/mu_0.bp`` and
``plots/space_depth_0.png`` (θ against t, log colour).
"""

from __future__ import annotations

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
from mfpde.errors import NumericalError
from mfpde.io import prepare_output_dir, write_atomic, write_report
from mfpde.tokens.attention import HeadMeasure
from mfpde.tokens.circle import CircleMesh, CircleTransport, _lagrange
from mfpde.tokens.circle_diag import cdf_density, clusters, fourier, initial_density, w1_circle

__all__ = ["circle_heads", "circle_transport_job", "dolfinx_circle"]

logger = logging.getLogger(__name__)
#: The number of Fourier modes in the report (at most the mesh's Nyquist number).
FOURIER_MODES = 32


def circle_heads(cfg: Config, comm: MPI.Comm) -> HeadMeasure:
    """The reduced ρ₀ of ``[heads]``: β = a of the scalar family (Diracs, or a Gaussian on the Θ mesh)."""
    from mfpde.params.family import make_family
    from mfpde.params.theta import dirac_heads, theta_space

    h = cfg.heads
    family = make_family(h.family, h.a)
    if h.init["kind"] == "diracs":
        return dirac_heads(family, h.init["points"], h.init["weights"])
    theta = theta_space(comm, cfg, family)
    return theta.head_measure(theta.gaussian(h.init["mean"], h.init["cov"]))


def dolfinx_circle(comm: MPI.Comm, mesh: CircleMesh) -> tuple[Any, Any, Any]:
    """(the DOLFINx polygon mesh, its DG_p function ``mu``, a callable copying nodal values (n, p+1) into it)."""
    import basix.ufl
    import dolfinx.fem
    import dolfinx.mesh

    n = mesh.n
    if comm.rank == 0:
        ang = np.arange(n) * mesh.h
        x = np.stack([np.cos(ang), np.sin(ang)], axis=1)
        cells = np.stack([np.arange(n), (np.arange(n) + 1) % n], axis=1).astype(np.int64)
    else:
        x, cells = np.zeros((0, 2)), np.zeros((0, 2), np.int64)
    el = basix.ufl.element("Lagrange", "interval", 1, shape=(2,))
    msh = dolfinx.mesh.create_mesh(comm, cells, el, x)  # type: ignore[arg-type]
    W = dolfinx.fem.functionspace(msh, ("DG", mesh.degree))
    f = dolfinx.fem.Function(W, name="mu")
    nloc = msh.topology.index_map(1).size_local
    geo = msh.geometry.x[msh.geometry.dofmap[:nloc]]  # (nloc, 2, 3): the two vertices of each owned cell
    a0 = np.mod(np.arctan2(geo[:, 0, 1], geo[:, 0, 0]), 2 * math.pi)
    a1 = np.mod(np.arctan2(geo[:, 1, 1], geo[:, 1, 0]), 2 * math.pi)
    j0, j1 = np.rint(a0 / mesh.h).astype(int) % n, np.rint(a1 / mesh.h).astype(int) % n
    forward = j1 == (j0 + 1) % n
    idx = np.where(forward, j0, j1)  # the circle cell [jh, (j+1)h] of each DOLFINx cell
    ref = W.element.interpolation_points[:, 0]  # reference coordinate from vertex 0 to vertex 1
    dofs = W.dofmap.list[:nloc]
    s = np.where(forward[:, None], ref[None, :], 1.0 - ref[None, :])

    def fill(mu: Any) -> None:
        V = np.stack([_lagrange(mesh.s, si)[0] for si in s])  # (nloc, k, p+1)
        f.x.array[dofs] = np.einsum("ckq,cq->ck", V, mu[idx])
        f.x.scatter_forward()

    return msh, f, fill


def circle_transport_job(cfg: Config, out: Path, comm: MPI.Comm = MPI.COMM_WORLD) -> dict[str, Any]:
    """Validate, prepare DIR, transport the circle sample and write the report (and fields, picture).

    Returns:
        The report (also in ``DIR/report.json``).

    Raises:
        ConfigError: invalid input (nothing is written). NumericalError: a failed solve (status "failed").
    """
    t, da = cfg.tokens, cfg.data
    mesh = CircleMesh(t.cells[0], t.degree)
    heads = circle_heads(cfg, comm)
    mu0 = initial_density(mesh, da.kind, da.modes, da.amplitude, da.seed)
    prepare_output_dir(out, comm)
    write_atomic(out / "config.toml", to_toml(cfg), comm)
    logger.info("transport on the circle: n = %d, DG%d, %s, β = %s, T = %g -> %s", mesh.n, mesh.degree,
                t.attention, np.round(heads.a, 6).tolist(), cfg.depth.T, out)
    t0 = time.perf_counter()
    op = CircleTransport(mesh, t.attention, t.cfl)
    K = min(FOURIER_MODES, mesh.n * (mesh.degree + 1) // 2)
    ts: list[float] = []
    amps: list[list[float]] = []
    picture: list[Any] = []
    writer, fill = None, None
    if cfg.output.fields:
        from mfpde.fields import FieldWriter

        _, f, fill = dolfinx_circle(comm, mesh)
        writer = FieldWriter(comm, out / "fields" / "mu_0.bp", [f])

    def cb(step: int, depth: float, mu: Any) -> None:
        if step % cfg.output.every == 0 or step == cfg.depth.steps:
            ts.append(depth)
            amps.append(fourier(mesh, mu, K).tolist())
            picture.append(mesh.cell_means(mu))
            if writer is not None and fill is not None:
                fill(mu)
                writer.write(depth)

    try:
        rep = op.solve(mu0, heads, cfg.depth.T, cfg.depth.steps, cb)
    except NumericalError as e:
        write_report(out, {"status": "failed", "command": "transport", "version": __version__, "domain": "circle",
                           "comm_size": comm.size, "wall_s": time.perf_counter() - t0, "samples": [],
                           "error": f"sample 0: {e}"}, comm)
        raise NumericalError(f"sample 0: {e}") from None
    finally:
        if writer is not None:
            writer.close()
    n_cl, angles = clusters(mesh, rep.mu_T)
    M = mesh.n * max(1, math.ceil(2**14 / mesh.n))
    w1 = w1_circle(cdf_density(mesh, rep.mu_T, M), lambda th: th / (2 * math.pi))
    block = {"mass_T": rep.mass_T, "mass_error": rep.mass_error, "min_density": rep.min_density, "outflow": 0.0,
             "substeps": rep.substeps, "limited_cells": rep.limited_cells,
             "fourier": {"t": ts, "k": list(range(1, K + 1)), "abs": amps},
             "clusters_T": n_cl, "cluster_angles_T": angles, "w1_uniform_T": w1}
    report = {"status": "ok", "command": "transport", "version": __version__, "domain": "circle",
              "comm_size": comm.size, "wall_s": time.perf_counter() - t0, "samples": [block]}
    write_report(out, report, comm)
    if cfg.output.plots and comm.rank == 0:
        space_depth_plot(out / "plots" / "space_depth_0.png", np.array(ts), np.array(picture), mesh.h)
    logger.info("circle: mass error %.3g, min %.3g, %d sub-steps, %d clusters at %s, W1(μ_T, uniform) %.4g",
                rep.mass_error, rep.min_density, rep.substeps, n_cl, np.round(angles, 3).tolist(), w1)
    return report


def space_depth_plot(path: Path, ts: Any, dens: Any, h: float) -> None:
    """θ against t, colour = cell-mean density on a log scale (rank 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.colors
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4))
    theta = (np.arange(dens.shape[1] + 1)) * h
    tt = np.concatenate([ts, [ts[-1] + (ts[-1] - ts[-2] if len(ts) > 1 else 1.0)]])
    pos = dens[dens > 0]
    lo = max(float(pos.min()) if pos.size else 1e-12, 1e-8 * float(dens.max()))
    im = ax.pcolormesh(tt, theta, np.maximum(dens.T, lo), norm=matplotlib.colors.LogNorm(lo, float(dens.max())),
                       cmap="magma", shading="flat")
    fig.colorbar(im, ax=ax, label="density μ_t(θ)")
    ax.set_xlabel("depth t")
    ax.set_ylabel("θ")
    ax.set_title("tokens on the circle")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
