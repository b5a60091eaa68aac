"""The config rules of the circle domain (``tokens.domain = "circle"``, theory §9), for :func:`mfpde.config.validate`.

On the circle the token space is the angle θ ∈ [0, 2π): ``tokens.cells = [n]`` (n ≥ 8), any DG degree 0..6,
``tokens.attention`` "softmax" or "unnormalised"; the heads are the scalar family, whose a is the inverse
temperature β (a Dirac at (β, 1) is the single head of the literature); the data are ``circle_modes`` or
``circle_noise``; the model is weight-tied. ``tokens.solver`` is "dg" (cells) or "flow" (the flow map on
``tokens.labels`` quantile labels at tolerance ``tokens.rtol``); ``depth.spacing = "log"`` spaces the output
depths geometrically over ``depth.decades`` decades below ``depth.T``. Errors name the key
(:class:`~mfpde.errors.ConfigError`, exit 2). The job reads the circle's :class:`Section` of the config
(:func:`section`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mfpde.domains import Found
from mfpde.tokens.resolution import Coarser

if TYPE_CHECKING:  # the config is the caller's: the domains stand below it
    from mfpde.config.schema import Depth, Heads, Output

__all__ = ["CIRCLE_KINDS", "KINDS", "MAX_CIRCLE_CELLS", "MAX_LABELS", "SOLVERS", "Section", "check", "coarser",
           "section"]

#: The data kinds of the circle.
CIRCLE_KINDS = ("circle_modes", "circle_noise")
KINDS = CIRCLE_KINDS
#: The largest circle mesh (the kernels hold (p+2)(p+1)(n/2+1) complex numbers per head).
MAX_CIRCLE_CELLS = 2**20
#: The circle's solvers: upwind DG on cells, the flow map on quantile labels.
SOLVERS = ("dg", "flow")
#: The largest inverse temperature on the circle: past it the kernel's Fourier series needs more than ≈ 600 terms
#: (the flow solver) and e^β I_k(β) overflows for unnormalised attention past 700.
MAX_BETA = {"softmax": 1e4, "unnormalised": 700.0}
#: The most output depths of a circle run (each keeps a 1024-point CDF and 32 Fourier moduli in memory).
MAX_OUTPUTS = 100_000
#: The flow solver's tolerance range: below 1e-12 its stiff phase grinds (round-off in the collapsed state), and
#: scipy's DOP853 refuses less than 100 ε.
RTOL_RANGE = (1e-12, 1e-2)
#: The most labels of the flow solver: its stiff phase holds a few dense M × M Jacobians (8M² bytes each: 128 MiB).
MAX_LABELS = 4096


@dataclass(frozen=True)
class Section:
    """The circle's section of the config: what its transport job and solvers read (built by :func:`section`).

    Attributes:
        attention, solver, degree, cfl, labels, rtol, noise: the keys of ``[tokens]``.
        cells: n, of ``tokens.cells = [n]``.
        kind, modes, amplitude, seed: the keys of ``[data]``.
        heads: the ``[heads]`` section (a general ρ₀ on Θ: Diracs, or a Gaussian on the Θ mesh).
        depth, output: the ``[depth]`` and ``[output]`` sections (the output depths read them).
    """

    attention: str
    solver: str
    cells: int
    degree: int
    cfl: float
    labels: int
    rtol: float
    noise: float
    kind: str
    modes: list[list[float]]
    amplitude: float
    seed: int
    heads: Heads
    depth: Depth
    output: Output


def section(cfg: Any) -> Section:
    """The circle's section of a validated config."""
    t, da = cfg.tokens, cfg.data
    return Section(t.attention, t.solver, t.cells[0], t.degree, t.cfl, t.labels, t.rtol, t.noise, da.kind, da.modes,
                   da.amplitude, da.seed, cfg.heads, cfg.depth, cfg.output)


def check(cfg: Any, reads_data: bool = True) -> None:
    """Check the circle keys of a :class:`~mfpde.config.Config` with ``tokens.domain = "circle"``.

    Raises:
        ConfigError: naming the key (:class:`~mfpde.errors.ConfigErrors`, naming each, for several): an unknown
            attention, box or sphere data on the circle, cells not [n], a degree out of 0..6, a head family other
            than scalar, modes not [[k, amplitude, phase], ...] with integers k ≥ 1 and a density that is negative
            somewhere.
    """
    t, da, h, d = cfg.tokens, cfg.data, cfg.heads, cfg.depth
    f = Found()
    f.need(t.attention in ("softmax", "unnormalised"), "tokens.attention",
           f"must be 'softmax' or 'unnormalised', got {t.attention!r}")
    if f.need(math.isfinite(t.noise) and t.noise >= 0, "tokens.noise", f"must be >= 0 and finite, got {t.noise:g}"):
        f.need(t.noise == 0 or (t.solver == "dg" and t.degree == 0), "tokens.noise",
               f"{t.noise:g} > 0 needs tokens.solver = 'dg' and tokens.degree = 0 (the Scharfetter–Gummel scheme)")
    f.need(t.solver in SOLVERS, "tokens.solver", f"must be 'dg' or 'flow', got {t.solver!r}")
    if t.solver == "flow":
        f.need(8 <= t.labels <= MAX_LABELS, "tokens.labels", f"must be in 8..{MAX_LABELS} (the stiff phase holds "
               f"dense labels × labels Jacobians), got {t.labels}")
        f.need(RTOL_RANGE[0] <= t.rtol < RTOL_RANGE[1], "tokens.rtol",
               f"must be in [{RTOL_RANGE[0]:g}, {RTOL_RANGE[1]:g}), got {t.rtol:g}")
    if cfg.output.every >= 1 and d.steps >= 1:
        n_out = d.steps // cfg.output.every + 2
        f.need(n_out <= MAX_OUTPUTS, "depth.steps", f"{d.steps} steps with output.every = {cfg.output.every} keep "
               f"{n_out} output depths on the circle (at most {MAX_OUTPUTS}: each holds a 1024-point CDF)")
    if h.init.get("kind") == "diracs" and t.attention in MAX_BETA:
        betas = [p[0] for p in h.init.get("points", []) if isinstance(p, list | tuple) and p]
        bad = [b for b in betas if isinstance(b, int | float) and not 0 <= b <= MAX_BETA[t.attention]]
        f.need(not bad, "tokens.beta", f"β (heads.init's a) must be in [0, {MAX_BETA[t.attention]:g}] with "
               f"{t.attention} attention on the circle, got {bad}")
    if t.solver == "flow" and h.init.get("kind") != "diracs" and not h.mesh and h.box and len(h.box[0]) == 2:
        # a Gaussian ρ₀ on the Θ box: its heads are the box's nodes, β = a over the box's a-axis
        f.need(h.box[0][0] >= 0, "heads.init", f"the flow solver takes inverse temperatures β >= 0, and the Gaussian "
               f"heads.init spans heads.box's a-axis {h.box[0]} (tokens.beta unset): set tokens.beta = β (the single "
               "head) or a heads.box with a >= 0")
    f.need(d.spacing in ("uniform", "log"), "depth.spacing", f"must be 'uniform' or 'log', got {d.spacing!r}")
    if d.spacing == "log":
        f.need(0 < d.decades <= 30, "depth.decades", f"must be in (0, 30], got {d.decades:g}")
    f.need(da.kind in CIRCLE_KINDS, "data.kind", f"must be 'circle_modes' or 'circle_noise', got {da.kind!r}")
    f.need(t.dim == 1, "tokens.dim", "the circle is 1-dimensional (the angle): leave tokens.dim = 1")
    f.need(not t.mesh, "tokens.mesh", "the circle mesh is built from tokens.cells = [n]; no mesh file")
    cells_ok = f.need(len(t.cells) == 1 and 8 <= t.cells[0] <= MAX_CIRCLE_CELLS, "tokens.cells",
                      f"on the circle needs [n] with 8 <= n <= {MAX_CIRCLE_CELLS}, got {t.cells}")
    f.need(0 <= t.degree <= 6, "tokens.degree", f"on the circle must be in 0..6, got {t.degree}")
    f.need(h.family == "scalar", "heads.family", "the circle takes the scalar family: a is the inverse temperature β")
    f.need(d.model == "weight-tied", "depth.model", "the circle solves the weight-tied model only")
    if da.kind == "circle_modes":
        if not f.need(len(da.modes) >= 1 and all(len(m) == 3 for m in da.modes), "data.modes",
                      "needs rows [k, amplitude, phase]"):
            return f.raise_all()
        if t.solver == "flow":
            f.need(sum(abs(a) for _, a, _ in da.modes) < 1.0, "data.modes", "the flow solver needs a density > 0 "
                   "everywhere (its labels are the quantiles of μ_0): amplitudes summing to less than 1")
        n = t.cells[0] if cells_ok else MAX_CIRCLE_CELLS
        for i, (k, a, ph) in enumerate(da.modes):
            f.need(float(k).is_integer() and 1 <= k <= n // 2, f"data.modes[{i}]",
                   f"k must be an integer in 1..{n // 2} (tokens.cells/2: finer modes alias on {n} cells), got {k}")
            f.need(math.isfinite(a) and math.isfinite(ph), f"data.modes[{i}]", "amplitude and phase must be finite")
        f.need(sum(abs(a) for _, a, _ in da.modes) <= 1.0, "data.modes",
               "the amplitudes must sum to at most 1 in absolute value (a density >= 0)")
    else:
        f.need(0 <= da.amplitude < 1, "data.amplitude", f"must be in [0, 1), got {da.amplitude}")
        f.need(da.seed >= 0, "data.seed", "must be >= 0")
    f.raise_all()


#: The continuation's rule on its collocation points (predicate, what it asks).
POINTS_RULE = (lambda n: n % 2 == 1, "odd (no Nyquist mode of the collocation)")


def stationary(cfg: Any, points: int, beta: float, noise: float) -> Any:
    """The discrete stationary problem of noisy tokens here, by ``continuation.discretisation``.

    "spectral" (CircleSpectral: Fourier coefficients, the kernel diagonal, numpy's Newton) or "collocation"
    (CircleStationary: values at the collocation points, PETSc's SNES).
    """
    if getattr(cfg.continuation, "discretisation", "spectral") == "collocation":
        from mfpde.tokens.circle.stationary import CircleStationary

        return CircleStationary(points, beta, noise)
    from mfpde.tokens.circle.spectral import CircleSpectral

    return CircleSpectral(points, beta, noise)


def coarser(sec: Section) -> Coarser | None:
    """The resolution check's section (:mod:`mfpde.tokens.resolution`): half the flow's labels, or DG on half the cells.

    None where there is none: fewer than 8 labels or cells, a data mode that would alias on half the cells, or
    ``circle_noise`` on an odd number of cells (the coarser solve draws the noise on the job's cells and takes each
    pair's mean: the same data, coarser).
    """
    if sec.solver == "flow":
        half = sec.labels // 2
        if half < 8:
            return None
        return Coarser(dataclasses.replace(sec, labels=half), "tokens.labels", f"{half} labels", f"{sec.labels} labels")
    n = sec.cells
    half = n // 2
    if half < 8 or (sec.kind == "circle_modes" and any(k > half // 2 for k, _, _ in sec.modes)) or (
            sec.kind == "circle_noise" and n % 2):
        return None
    return Coarser(dataclasses.replace(sec, cells=half), "tokens.cells", f"{half} cells", f"{n} cells",
                   {"data_cells": n})
