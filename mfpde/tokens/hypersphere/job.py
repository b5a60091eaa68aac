"""The hypersphere's part of the ``transport`` job (``tokens.domain = "hypersphere"``, theory §11; interface.md).

The job itself (DIR, config, report, resolution check) is :func:`mfpde.jobs.transport.transport_job`'s; this
module gives it the domain's protocol: :func:`check`, :func:`head`, :func:`describe`, :func:`solve`,
:func:`picture`, :func:`summary` and :data:`PICTURE`, each taking the hypersphere's section of the config
(:class:`~mfpde.tokens.hypersphere.config.Section`).

Zonal tokens on S^{d−1}: the flow map on Gauss labels (``tokens.solver = "flow"``, noise-free, spectral while the
map is smooth) or the finite volumes in the polar angle (``"dg"``, degree 0: upwind, Scharfetter–Gummel with
``tokens.noise``), replicated on every rank (a 1-D problem). The job writes into DIR: ``config.toml`` and
``report.json`` (``samples[0]``: ``solver``, ``dim``, ``mass_error``, ``min_mass``, ``harmonics = {t, l, power}``
(μ̂_ℓ² of each degree in the orthonormal zonal basis of the normalised measure, ℓ = 0..REPORT_DEGREE), ``clusters_t``,
``merge_times``, ``clusters_T``, ``solve_cpu_s``, ``resolution_check``: the counts again at half the labels or
cells, :mod:`mfpde.tokens.resolution`, and the report's ``warnings`` where they differ) and
``plots/hypersphere_0.png`` (μ_t against the polar angle).
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
from mfpde.tokens.hypersphere import transport as tr
from mfpde.tokens.hypersphere.config import Section
from mfpde.tokens.hypersphere.zonal import orthonormal_basis
from mfpde.tokens.resolution import merge_times

__all__ = ["FV_SECONDS_PER_CELL", "FV_SECONDS_PER_STEP", "REPORT_DEGREE", "PICTURE", "check", "check_fv_work",
           "describe", "head", "initial_density", "picture", "solve", "summary"]

logger = logging.getLogger(__name__)
#: The highest degree ℓ of the reported powers.
REPORT_DEGREE = 16
#: The optimistic cost of a finite-volume step (three stages): measured 92, 131, 206, 2543 µs a step at 16, 64,
#: 256, 1024 cells (d = 16, one head, one core; the velocity is an O(n²) sum), i.e. at least 92 µs plus 0.8 µs a
#: cell; charged half the fixed part and a quarter of the least per-cell part.
FV_SECONDS_PER_STEP, FV_SECONDS_PER_CELL = 5e-5, 2e-7


def check_fv_work(sec: Section) -> None:
    """Refuse, before DIR or any array, finite volumes whose steps cannot end (:func:`mfpde.limits.check_work`).

    The bound: :func:`~mfpde.tokens.hypersphere.transport.substeps_at_least` (the CFL rule at the state-free
    bound of the drift, τ(d−2) cot θ at the face next to a pole: ≈ T τ d/(cfl h²) with noise) times
    :data:`FV_SECONDS_PER_STEP` plus :data:`FV_SECONDS_PER_CELL` per cell.

    Raises:
        ConfigError: naming tokens.cells (or tokens.dim, depth.T) and the step bound.
    """
    from mfpde.limits import check_work

    n, d, tau = sec.cells, sec.dim, sec.noise
    steps = tr.substeps_at_least(sec.heads, d, sec.attention, tau, n, sec.depth.T, sec.cfl)
    key = "tokens.cells" if n > 1000 else "tokens.dim" if tau > 0 else "depth.T"
    check_work(steps * (FV_SECONDS_PER_STEP + FV_SECONDS_PER_CELL * n), key,
               f"at least {steps:.3g} finite-volume steps of {n} cells (the CFL rule at the drift τ(d−2) cot θ next to "
               f"a pole: ≈ T τ d/(cfl h²), d = {d}, τ = {tau:g}, T = {sec.depth.T:g}, cfl = {sec.cfl:g}), at "
               f"{FV_SECONDS_PER_STEP:g} s a step and {FV_SECONDS_PER_CELL:g} s a cell")


def initial_density(sec: Section) -> Any:
    """ν_0(z) = |S^{d−1}| μ_0 (a callable on arrays): ``zonal_modes`` 1 + Σ a P_ℓ(z), ``zonal_cap`` ∝ e^{κ z}."""
    d, da = sec.dim, sec
    if da.kind == "zonal_modes":
        lmax = int(max(m[0] for m in da.modes))
        norm = orthonormal_basis(np.ones(1), lmax, d)[0]

        def modes(z: np.ndarray) -> np.ndarray:
            V = orthonormal_basis(np.asarray(z, float).ravel(), lmax, d) / norm
            return (1.0 + sum(a * V[:, int(ll)] for ll, a in da.modes)).reshape(np.shape(z))

        return modes
    kappa = float(da.amplitude)
    return lambda z: np.exp(kappa * (np.asarray(z, float) - 1.0))  # the mass is normalised by the solvers


#: The picture of the transport job, under DIR/plots.
PICTURE = "hypersphere_0.png"
#: How the job saves it (matplotlib's savefig options).
SAVEFIG = {"dpi": 110}


def check(sec: Section, comm: MPI.Comm) -> None:
    """Refuse, before DIR, noise on the flow map and finite volumes whose steps cannot end.

    Raises:
        ConfigError: ``tokens.noise`` > 0 with the flow solver; the work of the finite volumes.
    """
    if sec.noise > 0 and sec.solver != "dg":
        raise ConfigError(f"tokens.noise: {sec.noise:g} > 0 needs tokens.solver = 'dg' (the Scharfetter–Gummel finite "
                          "volumes): the flow map has no noise")
    if sec.solver == "dg":
        check_fv_work(sec)


def head(sec: Section) -> dict[str, Any]:
    """The report's head fields of the hypersphere: ``dim``."""
    return {"dim": sec.dim}


def describe(sec: Section) -> str:
    """The transport job's first log line: the solver, its resolution, the heads, attention, T."""
    t = sec
    what = (f"the flow map on {t.labels} Gauss labels (rtol {t.rtol:g})" if t.solver == "flow"
            else f"finite volumes on {t.cells} cells in the polar angle, τ = {t.noise:g}")
    return (f"transport on the hypersphere S^{t.dim - 1} by {what}: heads "
            f"{[(round(b, 6), round(c, 6)) for b, c, _ in t.heads]}, {t.attention} attention, T = {t.depth.T:g}")


def picture(sec: Section, block: dict[str, Any], panels: Any) -> Any:
    """The figure of the distribution of the polar angle at up to five depths (rank 0)."""
    theta, masses = panels
    return _figure(np.asarray(block["harmonics"]["t"]), theta, masses, sec.solver, sec.dim)


def summary(sec: Section, block: dict[str, Any]) -> str:
    """The transport job's last log line."""
    return (f"hypersphere ({sec.solver}): mass error {block['mass_error']:.3g}, min mass "
            f"{block['min_mass']:.3g}, clusters at T: {block['clusters_T']}, merges at "
            f"{[float(f'{m:.4g}') for m in block['merge_times']]}, solve {block['solve_cpu_s']:.3g} CPU s")


def solve(sec: Section, comm: MPI.Comm, fields: FieldFiles | None, bar: Any) -> tuple[dict[str, Any], tuple[Any, Any]]:
    """The zonal sample of the section by ``tokens.solver`` (replicated): (the sample block, (θ, masses) per depth).

    The hypersphere writes no fields (``fields`` is not used): its state is the 1-D array of the report.

    Raises:
        NumericalError: the solve failed (overflow, a step that does not end).
    """
    t, d = sec, sec.dim
    depths = output_depths(sec)[kept_outputs(sec)]
    heads = sec.heads
    nu0 = initial_density(sec)

    def advanced(i: int, _t: float) -> None:
        if i > 0:
            bar.update()

    c0 = time.process_time()
    try:
        with np.errstate(over="raise", invalid="raise"):
            if t.solver == "flow":
                res = tr.flow(nu0, heads, d, t.attention, depths, t.labels, t.rtol)
                z, masses = res.z, np.broadcast_to(res.masses, res.z.shape)
                theta = np.arccos(np.clip(z, -1.0, 1.0))
                steps = 0
            else:
                cells = tr.finite_volume(nu0, heads, d, t.attention, t.noise, t.cells, depths, t.cfl,
                                         callback=advanced)
                masses, theta = cells.masses, np.broadcast_to(cells.theta, cells.masses.shape)
                z, steps = np.cos(theta), cells.steps
    except (FloatingPointError, RuntimeError, ValueError) as e:
        raise NumericalError(f"the hypersphere's {t.solver} solve failed: {e}") from None
    solve_cpu = time.process_time() - c0
    power = tr.degree_power(z, masses, d, REPORT_DEGREE)
    bins = t.cells if t.solver != "flow" else max(8, masses.shape[1] // 8)  # a few labels a bin
    counts = [tr.clusters(theta[i], masses[i], d, bins) for i in range(len(depths))]
    total = masses.sum(axis=1)
    block = {"solver": t.solver, "dim": d, "mass_error": float(np.abs(total - total[0]).max()),
             "min_mass": float(masses.min()), "substeps": int(steps),
             "harmonics": {"t": [float(x) for x in depths], "l": list(range(REPORT_DEGREE + 1)),
                           "power": power.tolist()},
             "clusters_t": counts, "merge_times": merge_times(depths, counts), "clusters_T": counts[-1],
             "solve_cpu_s": solve_cpu}
    return block, (theta, masses)


def _figure(depths: np.ndarray, theta: np.ndarray, masses: np.ndarray, solver: str, d: int) -> Any:
    """The cumulative distribution of the polar angle at up to five depths (labels and cells alike)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    picks = sorted({int(round(i)) for i in np.linspace(0, len(depths) - 1, min(5, len(depths)))})
    for k, i in enumerate(picks):
        order = np.argsort(theta[i])
        ax.step(theta[i][order], np.cumsum(masses[i][order]) / masses[i].sum(), where="post", color=f"C{k}",
                label=f"t = {depths[i]:.3g}")
    ax.set_xlim(0, math.pi)
    ax.set_xlabel("polar angle θ = arccos(x·e)")
    ax.set_ylabel("μ_t(angle ≤ θ)")
    ax.set_title(f"zonal tokens on S^{d - 1} ({solver}): the distribution of the polar angle")
    ax.legend(fontsize=8)
    return fig
