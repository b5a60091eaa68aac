"""The circle's part of the ``transport`` job (``tokens.domain = "circle"``, theory §9; interface.md).

The job itself (DIR, config, report, resolution check) is :func:`mfpde.jobs.transport.transport_job`'s; this
module gives it the domain's protocol: :func:`check`, :func:`describe`, :func:`solve`, :func:`picture`,
:func:`summary` and :data:`PICTURE`, each taking the circle's section of the config
(:class:`~mfpde.tokens.circle.config.Section`).

The 1-D density is small: every rank runs the same solve on the whole circle (replicated, so the report is the
same on any number of ranks); only the ParaView field is distributed: a DOLFINx mesh of the circle (a closed
polygon of n edges in R², vertex j at (cos jh, sin jh)) carries μ_t as a DG_p function, each rank filling its
owned cells from the replicated nodal array and writing them once (:class:`mfpde.fields.FieldWriter`).

Two solvers (``tokens.solver``): ``"dg"`` (:mod:`mfpde.tokens.circle.dg`, upwind DG on cells) and ``"flow"``
(:mod:`mfpde.tokens.circle.flow`, the flow map on quantile labels). The job writes into DIR: ``config.toml``,
``report.json`` (per sample: ``solver``, mass, positivity, ``fourier``, ``t``, ``clusters_t`` and ``merge_times``
at the output depths, ``clusters_T``, ``cluster_angles_T``, ``w1_uniform_T``, ``cdf_T`` at the 1024 angles 2πj/1024,
``solve_cpu_s``; DG also ``noise`` and, unnormalised, ``free_energy_t`` (E(μ) of theory §10); the flow solver
also ``labels``, ``rtol``, ``integrator``, ``reconstruction_T``; ``resolution_check``: the counts again at half
the labels or cells, :mod:`mfpde.tokens.resolution`, and the report's ``warnings`` where they differ),
``fields/mu_0.bp`` and ``plots/space_depth_0.png`` (θ against t, log colour).
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any

from mpi4py import MPI

import numpy as np

from mfpde.errors import NumericalError
from mfpde.fields import FieldFiles
from mfpde.heads import HeadMeasure
from mfpde.tokens.circle.dg import CircleMesh, _lagrange
from mfpde.tokens.circle.diag import (
    cdf_at,
    clusters_cdf,
    fourier,
    initial_density,
    moments,
    w1_circle,
)
from mfpde.tokens.circle.noise import circle_operator, free_energy
from mfpde.tokens.circle.work import check_dg_work, dg_substep_estimate
from mfpde.tokens.depths import LogProgress, kept_outputs, output_depths
from mfpde.tokens.resolution import merge_times

if TYPE_CHECKING:
    from mfpde.tokens.circle.config import Section

__all__ = ["PICTURE", "check", "circle_heads", "circle_solve", "describe", "dolfinx_circle", "picture", "solve",
           "summary"]

logger = logging.getLogger(__name__)
#: The number of Fourier modes in the report (at most the mesh's Nyquist number).
FOURIER_MODES = 32
#: The picture's bins at most (the flow solver's 1024 bins are averaged in groups: a collapsed cluster stays visible).
PICTURE_BINS = 256
#: A DG run of at least this many sub-steps gets the hint to use the flow solver.
HINT_SUBSTEPS = 10_000
#: The angles of the reported CDF, 2πj/1024 (:data:`mfpde.tokens.circle.flow.CDF_POINTS`).
_ANGLES = 2 * math.pi * np.arange(1024) / 1024


def circle_heads(sec: Section, comm: MPI.Comm) -> HeadMeasure:
    """The reduced ρ₀ of ``[heads]``: β = a of the scalar family (Diracs, or a Gaussian on the Θ mesh).

    Heads of c = 0 are dropped, unless every head has c = 0: then they are kept (μ does not move; the flow map's
    force needs a head to name its kernel).
    """
    from mfpde.heads import dirac_heads
    from mfpde.params.family import make_family
    from mfpde.params.theta import theta_space

    h = sec.heads
    family = make_family(h.family, h.a)
    if h.init["kind"] == "diracs":
        heads = dirac_heads(family, h.init["points"], h.init["weights"])
        return heads if len(heads.a) else dirac_heads(family, h.init["points"], h.init["weights"], keep_zero=True)
    theta = theta_space(comm, h, family)
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
    geo = msh.geometry.x[msh.geometry.dofmaps[0][:nloc]]  # (nloc, 2, 3): the two vertices of each owned cell
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


#: The picture of the transport job, under DIR/plots.
PICTURE = "space_depth_0.png"


def check(sec: Section, comm: MPI.Comm) -> None:
    """Refuse, before DIR, a DG transport whose sub-steps cannot end (:func:`mfpde.tokens.circle.work.check_dg_work`).

    Raises:
        ConfigError: naming the key.
    """
    if sec.solver != "flow":
        check_dg_work(sec, circle_heads(sec, comm))


def describe(sec: Section) -> str:
    """The transport job's first log line: the solver, its resolution, β, T."""
    flow = sec.solver == "flow"
    how = f"M = {sec.labels} labels, rtol {sec.rtol:g}" if flow else f"n = {sec.cells}, DG{sec.degree}"
    return (f"transport on the circle by {'the flow map' if flow else 'DG'}: {how}, β = "
            f"{np.round(_betas(sec), 6).tolist()}, T = {sec.depth.T:g} ({sec.depth.spacing} depths)")


def _betas(sec: Section) -> list[float]:
    """The inverse temperatures of ``heads.init`` as given (Diracs' a, a Gaussian's mean a)."""
    h = sec.heads
    return [p[0] for p in h.init["points"]] if h.init["kind"] == "diracs" else [h.init["mean"][0]]


def solve(sec: Section, comm: MPI.Comm, fields: FieldFiles | None, bar: Any, data_cells: int | None = None
          ) -> tuple[dict[str, Any], Any]:
    """The transport job's solve (:func:`circle_solve` under ρ₀): (the sample block, what :func:`picture` draws)."""
    heads = circle_heads(sec, comm)
    block, pictures, _ = circle_solve(sec, heads, comm, fields, bar, data_cells)
    return block, (pictures, heads.a, heads.c)


def picture(sec: Section, block: dict[str, Any], panels: Any) -> Any:
    """The figure of θ against t, the merges and the stiff integrator's switch marked (rank 0)."""
    from mfpde.plots import circle_title, space_depth_figure

    pictures, a, c = panels
    dens = np.array(pictures)
    if dens.shape[1] > PICTURE_BINS and dens.shape[1] % PICTURE_BINS == 0:  # a collapsed cluster in one bin of
        dens = dens.reshape(len(dens), PICTURE_BINS, -1).mean(axis=2)  # 1024 would be narrower than a pixel
    switch = (block.get("integrator") or {}).get("switch_t")
    marks = {"clusters merge": block["merge_times"], "stiff integrator from here": [switch] if switch else []}
    return space_depth_figure(np.array(block["t"]), dens, 2 * math.pi / dens.shape[1],
                              log_depth=sec.depth.spacing == "log", marks=marks,
                              title=circle_title(a, c, sec.noise))


def summary(sec: Section, block: dict[str, Any]) -> str:
    """The transport job's last log line."""
    how = (f"{block['substeps']} steps" if sec.solver == "flow" else f"mass error {block['mass_error']:.3g}, min "
           f"{block['min_density']:.3g}, {block['substeps']} sub-steps")
    return (f"circle ({sec.solver}): {how}, clusters at T: {block['clusters_T']} at "
            f"{np.round(block['cluster_angles_T'], 3).tolist()}, merges at "
            f"{[float(f'{m:.4g}') for m in block['merge_times']]}, W1(μ_T, uniform) {block['w1_uniform_T']:.4g}, "
            f"solve {block['solve_cpu_s']:.3g} CPU s")


#: μ at depths 0 and T as arrays: (values (n,), angles of the points (n,), quadrature weights (n,), DG degree).
Density = tuple[Any, Any, Any, int]


def circle_solve(sec: Section, heads: HeadMeasure, comm: MPI.Comm, fields: FieldFiles | None = None,
                 bar: Any = None, data_cells: int | None = None
                 ) -> tuple[dict[str, Any], list[Any], tuple[Density, Density]]:
    """Solve the circle problem of ``sec`` by ``tokens.solver`` (replicated on every rank of ``comm``).

    Args:
        sec: the circle's section of the config (:func:`mfpde.tokens.circle.config.section`).
        heads: the reduced ρ₀ (:func:`circle_heads`).
        comm: the ranks.
        fields: a directory to write ``fields/mu_0.bp`` into, or None.
        bar: a progress display (``update()`` per output depth) or None.
        data_cells: the cells ``circle_noise`` is drawn on, a multiple of ``tokens.cells`` (default: those).

    Returns:
        (the report's sample block, the densities pictured at the output depths (bins or cells), (μ_0, μ_T)).

    Raises:
        NumericalError: a failed solve; its ``block`` attribute holds the block up to the last good output.
    """
    depths = output_depths(sec)
    keep = kept_outputs(sec)
    if bar is None:  # no bar (not a terminal, or the Python API): a log line at every tenth of the outputs
        bar = LogProgress(len(keep) - 1, depths[keep], "circle")
    if sec.solver == "flow":
        out = _solve_flow(sec, heads, depths[keep], bar)
        if fields is not None:
            _write_flow_fields(comm, fields, out[0]["t"], out[1])
        return out
    return _solve_dg(sec, heads, depths, keep, fields, comm, bar, data_cells)


def _summary(ts: list[float], cdfs: list[Any], amps: list[list[float]], cpu: float) -> dict[str, Any]:
    """The report fields both solvers share, from the CDFs at the CDF_POINTS angles at every output depth."""
    counts, angles = [], []
    for F in cdfs:
        n, a = clusters_cdf(F)
        counts.append(n)
        angles.append(a)
    F_T = np.asarray(cdfs[-1], float)
    return {"t": [float(x) for x in ts], "clusters_t": counts, "merge_times": merge_times(np.array(ts), counts),
            "clusters_T": counts[-1], "cluster_angles_T": angles[-1],
            "fourier": {"t": [float(x) for x in ts], "k": list(range(1, len(amps[0]) + 1)), "abs": amps},
            "w1_uniform_T": w1_circle(F_T, _ANGLES / (2 * math.pi)),
            "cdf_T": (F_T - F_T[0]).tolist(), "solve_cpu_s": cpu}


def _solve_dg(sec: Section, heads: HeadMeasure, depths: Any, keep: list[int], out: FieldFiles | None, comm: MPI.Comm,
              bar: Any, data_cells: int | None = None) -> tuple[dict[str, Any], list[Any], tuple[Density, Density]]:
    mesh = CircleMesh(sec.cells, sec.degree)
    mu0 = initial_density(mesh, sec.kind, sec.modes, sec.amplitude, sec.seed, data_cells)
    lo, hi = dg_substep_estimate(sec, heads, mesh)
    logger.info("DG sub-steps: at least %d (the growth cap), at most %d (the step rule at the velocity bound)", lo, hi)
    if lo >= HINT_SUBSTEPS:
        logger.info("this DG run takes at least %d sub-steps: tokens.solver = 'flow' solves the circle on quantile "
                       "labels without a CFL rule (seconds to any depth)", lo)
    op = circle_operator(mesh, sec)  # upwind DG, or DG0 with the Scharfetter–Gummel flux for tokens.noise > 0
    K = min(FOURIER_MODES, mesh.n * (mesh.degree + 1) // 2)
    ts: list[float] = []
    amps: list[list[float]] = []
    cdfs: list[Any] = []
    picture: list[Any] = []
    energy: list[float] | None = [] if sec.attention == "unnormalised" else None  # E(μ) of theory §10 (USA)
    keep_set = set(keep)
    writer, fill = None, None
    if out is not None:
        _, f, fill = dolfinx_circle(comm, mesh)
        writer = out.open("mu_0", [f])
    cpu = [0.0, time.process_time()]  # CPU of the outputs, to subtract

    def cb(step: int, depth: float, mu: Any) -> None:
        c0 = time.process_time()
        if step in keep_set:
            ts.append(depth)
            amps.append(fourier(mesh, mu, K).tolist())
            cdfs.append(cdf_at(mesh, mu, _ANGLES))
            picture.append(mesh.cell_means(mu))
            if energy is not None:
                energy.append(free_energy(mesh, mu, heads, sec.noise))
            if writer is not None and fill is not None:
                fill(mu)
                writer.write(depth)
            if bar is not None and step > 0:
                bar.update()
        cpu[0] += time.process_time() - c0

    try:
        rep = op.solve(mu0, heads, sec.depth.T, len(depths) - 1, cb, depths=depths)
    except NumericalError as e:
        if ts:
            e.block = {"solver": "dg", **_summary(ts, cdfs, amps, time.process_time() - cpu[1] - cpu[0])}
        raise
    finally:
        if writer is not None:
            writer.close()
    solve_cpu = time.process_time() - cpu[1] - cpu[0]
    block = {"solver": "dg", "mass_T": rep.mass_T, "mass_error": rep.mass_error, "min_density": rep.min_density,
             "outflow": 0.0, "substeps": rep.substeps, "limited_cells": rep.limited_cells, "noise": sec.noise,
             **({"free_energy_t": energy} if energy is not None else {}), **_summary(ts, cdfs, amps, solve_cpu)}

    def density(mu: Any) -> Density:
        return mu.ravel().copy(), mesh.nodes.ravel(), np.broadcast_to(mesh.h * mesh.w, mu.shape).ravel(), mesh.degree

    return block, picture, (density(mu0), density(rep.mu_T))


def _labels(sec: Section) -> Any:
    from mfpde.tokens.circle.flow import modes_labels, noise_labels

    if sec.kind == "circle_modes":
        return modes_labels(sec.modes, sec.labels)
    mesh = CircleMesh(sec.cells, 0)  # the same cell values as the DG solver's data
    return noise_labels(initial_density(mesh, sec.kind, sec.modes, sec.amplitude, sec.seed)[:, 0], sec.labels)


def _solve_flow(sec: Section, heads: HeadMeasure, ts: Any,
                bar: Any) -> tuple[dict[str, Any], list[Any], tuple[Density, Density]]:
    from mfpde.tokens.circle.flow import CDF_POINTS, FlowMap

    c0 = time.process_time()
    fm = FlowMap(_labels(sec), heads.a, heads.c, sec.attention)

    def tick(i: int, depth: float) -> None:
        if bar is not None and i > 0:
            bar.update()

    def block_of(sol: Any, cpu: float) -> dict[str, Any]:
        amps = [np.abs(moments(x, 1.0 / fm.M, FOURIER_MODES)).tolist() for x in sol.X]
        m = np.diff(np.concatenate([sol.cdf[-1], [sol.cdf[-1][0] + 1.0]]))
        st = sol.stats
        return {"solver": "flow", "labels": fm.M, "rtol": sec.rtol, "mass_T": 1.0, "mass_error": 0.0,
                "min_density": float(m.min() * CDF_POINTS / (2 * math.pi)), "outflow": 0.0,
                "substeps": int(st["explicit_steps"] + st["stiff_steps"]), "integrator": st,
                "reconstruction_T": sol.reconstruction[-1], **_summary(list(sol.t), list(sol.cdf), amps, cpu)}

    try:
        sol = fm.solve(np.asarray(ts, float), sec.rtol, callback=tick)
    except NumericalError as e:
        part = getattr(e, "partial", None)
        if part is not None and len(part.t):
            e.block = block_of(part, time.process_time() - c0)
        raise
    cpu = time.process_time() - c0
    pictures = [np.diff(np.concatenate([F, [F[0] + 1.0]])) * CDF_POINTS / (2 * math.pi) for F in sol.cdf]
    block = block_of(sol, cpu)
    h = 2 * math.pi / CDF_POINTS
    centres, w = (np.arange(CDF_POINTS) + 0.5) * h, np.full(CDF_POINTS, h)
    F0, _ = fm._cdf(fm.labels.X0, fm.labels.L0)
    mu0 = np.diff(np.concatenate([F0, [F0[0] + 1.0]])) / h
    return block, pictures, ((mu0, centres, w, 0), (pictures[-1], centres, w, 0))


def _write_flow_fields(comm: MPI.Comm, out: FieldFiles, ts: list[float], pictures: list[Any]) -> None:
    """μ_t of the flow solver as DG0 on the polygon of CDF_POINTS edges (the bin densities), one step per output."""
    mesh = CircleMesh(len(pictures[0]), 0)
    _, f, fill = dolfinx_circle(comm, mesh)
    with out.open("mu_0", [f]) as writer:  # closed, or abandoned on a signal
        for depth, dens in zip(ts, pictures, strict=True):
            fill(np.asarray(dens)[:, None])
            writer.write(depth)
