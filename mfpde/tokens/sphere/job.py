"""The sphere's part of the ``transport`` job (``tokens.domain = "sphere"``, theory §9; interface.md).

The job itself (DIR, config, report, resolution check) is :func:`mfpde.jobs.transport.transport_job`'s; this
module gives it the domain's protocol: :func:`check`, :func:`describe`, :func:`solve`, :func:`picture`,
:func:`summary` and :data:`PICTURE`, each taking the sphere's section of the config
(:class:`~mfpde.tokens.sphere.config.Section`).

The DG solver (``tokens.solver = "dg"``) runs on an icosahedral mesh distributed over the ranks, its kernel by one
allreduce of the harmonic coefficients per stage (:mod:`mfpde.tokens.sphere.kernel`); the flow solver (``"flow"``)
is replicated on every rank. The job writes into DIR: ``config.toml``; ``report.json`` (per sample: ``solver``,
``kernel``, mass, positivity, ``substeps``, at the output depths ``t``, ``clusters_t`` and ``harmonics`` (power per
degree ℓ = 0..L), ``merge_times``, ``clusters_T``, ``cluster_centres_T``, ``solve_cpu_s``; DG also ``noise``
and, unnormalised, ``free_energy_t``: E(μ) of theory §10 at the output depths); ``tokens.noise`` τ > 0 takes DG0
with the Scharfetter–Gummel flux (:mod:`mfpde.tokens.sphere.noise`); ``resolution_check`` (the counts again at half the
labels or one refinement fewer, :mod:`mfpde.tokens.resolution`) and the report's ``warnings`` where they
differ; ``fields/mu_0.bp`` (μ_t on the sphere at the output depths) and ``plots/sphere_0.png`` (Mollweide views of
μ_t at up to four depths, clusters marked, each title the report's count there).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from mpi4py import MPI

import numpy as np

from mfpde.errors import ConfigError, NumericalError
from mfpde.fields import FieldFiles
from mfpde.tokens.depths import kept_outputs, output_depths
from mfpde.tokens.resolution import merge_times
from mfpde.tokens.sphere.config import Section, mesh_cells, particles
from mfpde.tokens.sphere.diag import cell_clusters, measure_power
from mfpde.tokens.sphere.picture import pick_panels, sphere_figure

__all__ = ["PICTURE", "REPORT_DEGREE", "check", "describe", "initial_density", "picture", "solve", "solve_dg",
           "solve_flow", "sphere_velocity_of", "summary"]

logger = logging.getLogger(__name__)
#: The highest degree ℓ of the reported powers (the kernel's own degree if lower).
REPORT_DEGREE = 32
#: The DG solver's kernel: the Bessel tail of its series below this (L = 23 instead of 28 at β = 9: 1.5× less work).
DG_KERNEL_TOL = 1e-10
#: ``sphere_noise``: the noise's degrees ℓ = 1..NOISE_DEGREE (:func:`~mfpde.tokens.sphere.data.noise_modes`).
NOISE_DEGREE = 16


class _HeadSum:
    """The velocities of several heads, summed (each a :class:`~mfpde.tokens.sphere.velocity.SphereVelocity`)."""

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts
        self.kernel = "+".join(sorted({p.kernel for p in parts}))
        self.attention = parts[0].attention  # the config's, the same for every head

    def update(self, x: Any, w: Any) -> None:
        for p in self.parts:
            p.update(x, w)

    def velocity(self, x: Any) -> Any:
        return sum(p.velocity(x) for p in self.parts)


def sphere_velocity_of(sec: Section, comm: MPI.Comm) -> Any:
    """The velocity of the section's heads (one kernel per head, chosen by β, the attention and the solver).

    The series' degree L is cut where its Bessel tail falls below :data:`DG_KERNEL_TOL` for the DG solver (whose own
    error is O(h^{p+1}), far above it) and below 1e-14 for the flow solver (spectrally accurate). The flow solver
    tells the kernel its particle count: few particles take the direct sum (:func:`~mfpde.tokens.sphere.kernel.
    choose_kernel`).
    """
    from mfpde.tokens.sphere.kernel import DEFAULT_TOL, sphere_velocity

    flow = sec.solver == "flow"
    tol = DEFAULT_TOL if flow else DG_KERNEL_TOL
    points = particles(sec.labels) if flow else None
    parts = [sphere_velocity(b, sec.attention, comm, c=c, tol=tol, points=points)
             for b, c in zip(sec.betas, sec.couplings, strict=True) if c != 0.0]
    if not parts:  # every head has c = 0: μ does not move; the kernel of the first head still names it
        parts = [sphere_velocity(sec.betas[0], sec.attention, comm, c=0.0, tol=tol, points=points)]
    return parts[0] if len(parts) == 1 else _HeadSum(parts)


def initial_density(sec: Section) -> Any:
    """μ_0 as a function of unit vectors (m, 3) → (m,): ``sphere_modes`` or the seeded ``sphere_noise``."""
    from mfpde.tokens.sphere.data import modes_density, noise_modes

    modes = sec.modes if sec.kind == "sphere_modes" else noise_modes(sec.amplitude, sec.seed, NOISE_DEGREE)
    return lambda x: modes_density(modes, x)


def _kernel_degree(vel: Any) -> int | None:
    """The degree L of the kernel's series (the largest over the heads); None for the direct sum alone."""
    degrees = [int(p.L) for p in getattr(vel, "parts", [vel]) if getattr(p, "L", None) is not None]
    return max(degrees) if degrees else None


def _report_degree(vel: Any) -> int:
    """The highest reported degree: the kernels' series degree, capped at :data:`REPORT_DEGREE`.

    A direct sum counts with the degree its series would have (the flow solver's tolerance), so that the report
    is the same whichever kernel the particle count and the transform backend pick.
    """
    from mfpde.tokens.sphere.kernel import DEFAULT_TOL, harmonic_degree

    L = max(int(p.L) if getattr(p, "L", None) is not None else harmonic_degree(float(p.beta), DEFAULT_TOL)
            for p in getattr(vel, "parts", [vel]))
    return int(min(REPORT_DEGREE, L)) if L else REPORT_DEGREE


#: Bytes per DG value (a cell's (p + 1)(p + 2)/2) of the sphere's DG transport, about half the measured slope of the
#: peak RSS (``mfpde transport demos/sphere.toml``, one depth step: DG1 at refine 4 / 5 316 / 803 MB, 10.6 kB a value;
#: DG3 627 / 2054 MB, 9.3 kB a value): a lower bound whatever the kernel's degree.
BYTES_PER_DG_VALUE = 5000.0


def check_dg_memory(sec: Section, size: int) -> None:
    """Refuse, before DIR or any array, a DG transport on the sphere that cannot fit this node (limits.check_memory).

    Refine 8 at DG3 (1.3·10⁶ cells, 1.3·10⁷ values) needs at least 66 GB a rank (measured: about 120 GB).

    Raises:
        ConfigError: naming tokens.refine, the estimate and the node's memory.
    """
    from mfpde.limits import BASE_BYTES, check_memory

    values = 20.0 * 4.0**sec.refine * (sec.degree + 1) * (sec.degree + 2) / 2
    check_memory({"base": BASE_BYTES, "tokens.refine": values * BYTES_PER_DG_VALUE / max(size, 1)}, "tokens.refine",
                 f"{sec.refine} (DG{sec.degree}, {values:.3g} values)")


#: The picture of the transport job, under DIR/plots.
PICTURE = "sphere_0.png"
#: How the job saves it (matplotlib's savefig options).
SAVEFIG = {"dpi": 110, "bbox_inches": "tight"}


def check(sec: Section, comm: MPI.Comm) -> None:
    """Refuse, before DIR, noise on the flow solver or DG above degree 0, and DG that cannot fit this node.

    Raises:
        ConfigError: ``tokens.noise`` > 0 with the flow solver or a degree other than 0; ``tokens.refine`` too fine.
    """
    if sec.noise > 0 and (sec.solver != "dg" or sec.degree != 0):
        raise ConfigError(f"tokens.noise: {sec.noise:g} > 0 needs tokens.solver = 'dg' and tokens.degree = 0 on the "
                          f"sphere (finite volumes with the Scharfetter–Gummel flux), got {sec.solver!r}, {sec.degree}")
    if sec.solver == "dg":
        check_dg_memory(sec, comm.size)


def describe(sec: Section) -> str:
    """The transport job's first log line: the solver, its resolution, β, attention, T."""
    how = (f"the flow map ({particles(sec.labels)} particles, rtol {sec.rtol:g})" if sec.solver == "flow" else
           f"DG{sec.degree} on {mesh_cells(sec.refine)} cells")
    return (f"transport on the sphere by {how}: β = {np.round(sec.betas, 6).tolist()}, {sec.attention} "
            f"attention, T = {sec.depth.T:g}")


def solve(sec: Section, comm: MPI.Comm, fields: FieldFiles | None, bar: Any) -> tuple[dict[str, Any], Any]:
    """The transport job's solve by ``tokens.solver``: :func:`solve_flow` or :func:`solve_dg`."""
    return (solve_flow if sec.solver == "flow" else solve_dg)(sec, comm, fields, bar)


def picture(sec: Section, block: dict[str, Any], panels: Any) -> Any:
    """The figure of Mollweide views of μ_t at up to four depths, clusters marked (rank 0)."""
    ts, snaps, centres = panels
    return sphere_figure(ts, snaps, centres, f"μ_t on S² ({block['solver']}, {sec.attention}, β = "
                         f"{', '.join(f'{b:g}' for b in sec.betas)})", collapsed=block["solver"] == "flow")


def summary(sec: Section, block: dict[str, Any]) -> str:
    """The transport job's last log line."""
    return (f"sphere ({sec.solver}): mass error {block['mass_error']:.3g}, min {block['min_density']:.3g}, "
            f"{block['substeps']} sub-steps, clusters at T: {block['clusters_T']}, merges at "
            f"{[float(f'{m:.4g}') for m in block['merge_times']]}, solve {block['solve_cpu_s']:.3g} CPU s")


class _Series:
    """What the report keeps at each output depth: t, the degree powers, the clusters; and the pictured panels."""

    def __init__(self, n_out: int) -> None:
        self.t: list[float] = []
        self.power: list[list[float]] = []
        self.counts: list[int] = []
        self.centres: list[list[list[float]]] = []
        self.panels = set(pick_panels(n_out))
        self.snaps: list[tuple[Any, Any]] = []
        self.snap_t: list[float] = []
        self.snap_centres: list[list[list[float]]] = []

    def add(self, depth: float, power: Any, count: int, centres: list[list[float]], snap: Any) -> None:
        if len(self.t) in self.panels and snap is not None:
            self.snaps.append(snap)
            self.snap_t.append(depth)
            self.snap_centres.append(centres)
        self.t.append(depth)
        self.power.append([float(p) for p in power])
        self.counts.append(count)
        self.centres.append(centres)

    def block(self, L: int, cpu: float) -> dict[str, Any]:
        return {"t": self.t, "clusters_t": self.counts, "merge_times": merge_times(np.array(self.t), self.counts),
                "clusters_T": self.counts[-1] if self.counts else 0,
                "cluster_centres_T": self.centres[-1] if self.centres else [],
                "harmonics": {"t": self.t, "l": list(range(L + 1)), "power": self.power}, "solve_cpu_s": cpu}


def solve_dg(sec: Section, comm: MPI.Comm, fields: FieldFiles | None, bar: Any) -> tuple[dict[str, Any], Any]:
    """The DG solve of the section on the distributed icosahedral mesh: (the report's sample block, the panels)."""
    from mfpde.tokens.sphere.dg import SphereDG, growth_step_cap
    from mfpde.tokens.sphere.mesh import edge_lengths, geometry_order, icosphere

    t = sec
    vel = sphere_velocity_of(sec, comm)
    L = _report_degree(vel)
    mesh = icosphere(comm, t.refine, geometry_order(t.degree))
    betas, cs = np.asarray(sec.betas), np.asarray(sec.couplings)
    cap = min(growth_step_cap(b, t.attention, c) for b, c in zip(sec.betas, sec.couplings, strict=True))
    if t.noise > 0:  # DG0 with the Scharfetter–Gummel flux (theory §10)
        from mfpde.tokens.sphere.noise import NoisySphereFV

        op: SphereDG = NoisySphereFV(mesh, vel, t.noise, t.cfl, max_dt=cap)
    else:
        op = SphereDG(mesh, t.degree, vel, t.cfl, max_dt=cap)
    energy: list[float] | None = [] if t.attention == "unnormalised" else None  # E(μ) of theory §10 (USA)
    mu0 = op.project(initial_density(sec))
    mu0.x.array[:] /= op.mass(mu0)  # a probability on the mesh (the faceted sphere's area is below 4π: O(h²))
    depths = output_depths(sec)
    keep = set(kept_outputs(sec))
    series = _Series(len(keep))
    radius = 2.0 * edge_lengths(mesh)[1]
    centres = _gather(comm, op.cell_centres())
    writer = None
    if fields is not None:
        import dolfinx.fem

        f = dolfinx.fem.Function(op.V, name="mu")
        writer = fields.open("mu_0", [f])
    cpu = [0.0]

    def cb(step: int, depth: float, mu: Any) -> None:
        c0 = time.process_time()
        if step in keep:
            x, w = op.quadrature(mu)
            power = measure_power(x, w, L, comm)
            means = _gather(comm, op.cell_means(mu))
            found = cell_clusters(centres, means, radius) if comm.rank == 0 else None
            count, at = comm.bcast(found, root=0)
            series.add(depth, power, count, at, (centres, means) if comm.rank == 0 else None)
            if energy is not None:
                from mfpde.tokens.sphere.noise import free_energy

                energy.append(free_energy(op, mu, (betas, cs), t.noise))
            if writer is not None:
                f.x.array[:] = mu.x.array
                writer.write(depth)
            if step > 0:
                bar.update()
        cpu[0] += time.process_time() - c0

    try:
        rep = op.solve(mu0, float(depths[-1]), len(depths) - 1, cb, depths=depths)
    except NumericalError as e:
        if series.t:
            e.block = {"solver": "dg", "kernel": vel.kernel, **series.block(L, math.nan)}
        raise
    finally:
        if writer is not None:
            writer.close()
    block = {"solver": "dg", "kernel": vel.kernel, "kernel_degree": _kernel_degree(vel), "refine": t.refine,
             "cells": 20 * 4**t.refine, "degree": t.degree, "mass_0": rep.mass_0, "mass_T": rep.mass_T,
             "mass_error": rep.mass_error,
             "min_density": rep.min_density, "substeps": rep.substeps, "limited_cells": rep.limited_cells,
             "noise": t.noise, **({"free_energy_t": energy} if energy is not None else {}),
             **series.block(L, rep.solve_cpu_s)}
    return block, (series.snap_t, series.snaps, series.snap_centres)


def _gather(comm: MPI.Comm, a: Any) -> Any:
    """The owned rows of every rank concatenated in rank order on rank 0 (None on the others)."""
    parts = comm.gather(np.asarray(a), root=0)
    return np.concatenate(parts) if parts is not None else None


#: The flow solver's fields: μ on the cells of the icosahedron refined this many times (5120 cells).
FLOW_FIELD_REFINE = 4


def _field_mesh(comm: MPI.Comm) -> tuple[Any, Any, Any]:
    """The flow solver's field mesh: (its DG0 space, this rank's cell centres, all cells' centres on every rank)."""
    from mfpde.tokens.sphere.dg import SphereDG
    from mfpde.tokens.sphere.mesh import icosphere
    from mfpde.tokens.sphere.velocity import RotationVelocity

    op = SphereDG(icosphere(comm, FLOW_FIELD_REFINE), 0, RotationVelocity([0.0, 0.0, 0.0]))
    own = op.cell_centres()
    return op.V, own, np.concatenate(comm.allgather(own))


def solve_flow(sec: Section, comm: MPI.Comm, fields: FieldFiles | None, bar: Any) -> tuple[dict[str, Any], Any]:
    """The flow map of the section on the quadrature particles of μ_0 (replicated): (the sample block, the panels).

    ``tokens.labels`` sets the particle count: N = ⌈√(labels/2)⌉ Gauss–Legendre nodes in cos ϑ, 2N² particles.
    Clusters are groups of particles closer than 10⁻³ rad holding at least 1% of the mass
    (:func:`~mfpde.tokens.sphere.flow.clusters`); the fields and the picture show the particles smoothed by a von
    Mises–Fisher kernel as wide as the particles' spacing π/N (:func:`~mfpde.tokens.sphere.diag.kde`, κ = (N/π)²).
    """
    from mfpde.tokens.sphere.diag import kde
    from mfpde.tokens.sphere.flow import SphereFlow

    t = sec
    vel = sphere_velocity_of(sec, comm)
    L = _report_degree(vel)
    N = max(1, math.ceil(math.sqrt(t.labels / 2)))
    depths = output_depths(sec)
    keep = kept_outputs(sec)
    ts = depths[keep]
    flow = SphereFlow(vel, nodes=N, rtol=t.rtol, L=L)
    series = _Series(len(ts))

    def tick(i: int, depth: float) -> None:
        if i > 0:
            bar.update()

    def block_of(sol: Any) -> dict[str, Any]:
        for k, depth in enumerate(sol.t):
            masses, centres = sol.clusters[k]
            series.add(float(depth), sol.power[k], len(masses), np.asarray(centres).tolist(), None)
        return {"solver": "flow", "kernel": vel.kernel, "kernel_degree": _kernel_degree(vel), "labels": 2 * N * N,
                "rtol": t.rtol, "mass_0": 1.0, "mass_T": float(np.sum(sol.w)),
                "mass_error": abs(float(np.sum(sol.w)) - 1.0),
                "min_density": 0.0, "substeps": int(sol.integrator["explicit_steps"] + sol.integrator["stiff_steps"]),
                "integrator": sol.integrator, **series.block(L, sol.solve_cpu_s)}

    try:
        sol = flow.solve(initial_density(sec), float(depths[-1]), ts, callback=tick)
    except NumericalError as e:
        part = getattr(e, "partial", None)
        if part is not None and len(part.t):
            e.block = block_of(part)
        raise
    block = block_of(sol)
    V, own, centres = _field_mesh(comm)
    kappa = (N / math.pi) ** 2
    if fields is not None:
        import dolfinx.fem

        f = dolfinx.fem.Function(V, name="mu")
        writer = fields.open("mu_0", [f])
        try:
            for depth, x in zip(sol.t, sol.x, strict=True):
                f.x.array[:len(own)] = kde(x, sol.w, own, kappa)
                f.x.scatter_forward()
                writer.write(float(depth))
        finally:
            writer.close()
    pick = pick_panels(len(sol.t))
    panels = ([float(sol.t[i]) for i in pick], [(centres, kde(sol.x[i], sol.w, centres, kappa)) for i in pick],
              [np.asarray(sol.clusters[i][1]).tolist() for i in pick])
    return block, panels

