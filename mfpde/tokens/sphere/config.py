"""The config rules of the sphere domain (``tokens.domain = "sphere"``, theory §9), for :func:`mfpde.config.validate`.

On the sphere the token space is the unit sphere S² ⊂ R³: an icosahedral mesh of ``tokens.refine = r`` (20·4^r
triangles), DG of ``tokens.degree`` 0..3, ``tokens.attention`` "softmax" or "unnormalised"; the heads are the
scalar family, whose a is the inverse temperature β (``tokens.beta = β`` is the single head (β, 1)); the data
are ``sphere_modes`` (μ_0 = 1/4π + Σ amplitude·Y_ℓm, real orthonormal Y_ℓm) or ``sphere_noise`` (a seeded random
start); the model is weight-tied. ``tokens.solver`` is "dg" (cells) or "flow" (the flow map on a spherical
quadrature of μ_0 with ``tokens.labels`` nodes at tolerance ``tokens.rtol``). ``tokens.noise`` τ ≥ 0: ``mfpde
continuation`` computes the zonal stationary states of noisy tokens; ``mfpde transport`` takes τ > 0 with DG0 only
(:func:`mfpde.tokens.sphere.job.check` refuses other degrees and the flow solver). Errors name the key
(:class:`~mfpde.errors.ConfigError`, exit 2).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from mfpde.domains import Found, check_dirac_heads
from mfpde.tokens.resolution import Coarser

__all__ = ["KINDS", "MAX_DEGREE", "MAX_MODE_DEGREE", "Section", "check", "coarser", "mesh_cells", "mesh_memory",
           "particles", "section"]

#: The data kinds of the sphere.
KINDS = ("sphere_modes", "sphere_noise")
#: The DG degrees of the sphere solver.
MAX_DEGREE = 3
#: The highest degree ℓ of a data mode (the harmonic kernel and the data hold (ℓ+1)² coefficients per point).
MAX_MODE_DEGREE = 64
#: The most refinements of the icosahedron (20·4^12 ≈ 3.4·10⁸ cells: past any node; the memory check decides).
MAX_REFINE = 12
#: Bytes per DG degree of freedom of a sphere run (mesh, spaces, the stage vectors, the kernel's points), a lower
#: bound measured on the DG1 solver.
BYTES_PER_DOF = 1500.0
#: The inverse temperatures allowed: e^β overflows for unnormalised attention past 700. Softmax past β ≈ 10 takes
#: the tilted kernel (:mod:`~mfpde.tokens.sphere.tilted`), whose K ≈ 8β²/ρ² centres (ρ ≈ 10.4) make an update cost
#: O(n K L²) and its work arrays 5K·2048 doubles: at β = 200, K = 2947, 0.24 GB and ~2 ms per point and update; at
#: β = 1000, K = 73600, 6 GB and ~50 ms per point (a DG run of 320 cells did not finish its first depth step in 5 min).
MAX_BETA = {"softmax": 200.0, "unnormalised": 700.0}
#: The flow solver's tolerance range (as on the circle).
RTOL_RANGE = (1e-12, 1e-2)
#: The flow solver's node count range (its quadrature of μ_0; the stiff phase holds dense Jacobians).
LABELS_RANGE = (32, 20_000)


@dataclass(frozen=True)
class Section:
    """The sphere's section of the config: what its transport job and solvers read (built by :func:`section`).

    Attributes:
        attention, solver, refine, degree, cfl, labels, rtol, noise: the keys of ``[tokens]``.
        betas, couplings: the Dirac heads (β_h, c_h): ``tokens.beta`` (with ``tokens.coupling``), or heads.init's
            points [[β, v], ...] with c = v times the head's weight (the weights normalised to sum 1); a head of
            c = 0 is kept.
        kind, modes, amplitude, seed: the keys of ``[data]``.
        depth, output: the ``[depth]`` and ``[output]`` sections (the output depths read them).
    """

    attention: str
    solver: str
    refine: int
    degree: int
    cfl: float
    labels: int
    rtol: float
    noise: float
    betas: tuple[float, ...]
    couplings: tuple[float, ...]
    kind: str
    modes: list[list[float]]
    amplitude: float
    seed: int
    depth: Any
    output: Any


def section(cfg: Any) -> Section:
    """The sphere's section of a validated config."""
    from mfpde.heads import dirac_heads
    from mfpde.params.family import make_family

    t, h, da = cfg.tokens, cfg.heads, cfg.data
    heads = dirac_heads(make_family(h.family, h.a), h.init["points"], h.init["weights"], keep_zero=True)
    return Section(t.attention, t.solver, t.refine, t.degree, t.cfl, t.labels, t.rtol, t.noise,
                   tuple(float(b) for b in heads.a), tuple(float(c) for c in heads.c), da.kind, da.modes,
                   da.amplitude, da.seed, cfg.depth, cfg.output)


def mesh_cells(refine: int) -> int:
    """The cells of the icosahedral mesh refined ``refine`` times: 20·4^r."""
    return 20 * 4**refine


def mesh_memory(refine: int, degree: int, size: int = 1) -> float:
    """A lower bound of the bytes per rank of a DG run on the sphere (``BYTES_PER_DOF`` per degree of freedom)."""
    return mesh_cells(refine) * (degree + 1) * (degree + 2) / 2 * BYTES_PER_DOF / max(size, 1)


def check(cfg: Any, reads_data: bool = True) -> None:
    """Check the sphere keys of a :class:`~mfpde.config.Config` with ``tokens.domain = "sphere"``.

    Raises:
        ConfigError: naming the key (:class:`~mfpde.errors.ConfigErrors`, naming each, for several): an unknown
            attention or solver, ``tokens.refine`` < 0 or past this node's memory, a degree out of 0..3, data of
            another domain, modes not [[ℓ, m, amplitude], ...] with integers 1 ≤ ℓ ≤ 64, |m| ≤ ℓ, a μ_0 negative
            somewhere, a head family other than scalar, a depth model other than weight-tied.
    """
    from mfpde.limits import node_memory_bytes

    t, da, d = cfg.tokens, cfg.data, cfg.depth
    f = Found()
    f.need(t.attention in MAX_BETA, "tokens.attention", f"must be 'softmax' or 'unnormalised', got {t.attention!r}")
    f.need(t.solver in ("dg", "flow"), "tokens.solver", f"must be 'dg' or 'flow', got {t.solver!r}")
    # noisy tokens: transport with DG0 only (checked by the transport job: continuation takes any degree)
    f.need(math.isfinite(t.noise) and t.noise >= 0, "tokens.noise", f"must be >= 0 and finite, got {t.noise:g}")
    if t.solver == "flow":
        f.need(LABELS_RANGE[0] <= t.labels <= LABELS_RANGE[1], "tokens.labels",
               f"on the sphere must be in {LABELS_RANGE[0]}..{LABELS_RANGE[1]} (the nodes of μ_0's quadrature), "
               f"got {t.labels}")
        f.need(RTOL_RANGE[0] <= t.rtol < RTOL_RANGE[1], "tokens.rtol",
               f"must be in [{RTOL_RANGE[0]:g}, {RTOL_RANGE[1]:g}), got {t.rtol:g}")
    if f.need(0 <= t.refine <= MAX_REFINE, "tokens.refine", f"must be in 0..{MAX_REFINE}, got {t.refine}") \
            and f.need(0 <= t.degree <= MAX_DEGREE, "tokens.degree", f"on the sphere must be in 0..{MAX_DEGREE}, "
                       f"got {t.degree}") and t.solver == "dg":
        need, have = mesh_memory(t.refine, t.degree), node_memory_bytes()
        f.need(need < have, "tokens.refine", f"{t.refine} ({mesh_cells(t.refine)} cells of DG{t.degree}) needs at "
               f"least {need / 1e9:.3g} GB, more than the {have / 1e9:.3g} GB of this node")
    check_dirac_heads(f, cfg, MAX_BETA, "sphere")
    f.need(d.model == "weight-tied", "depth.model", "the sphere solves the weight-tied model only")
    f.need(d.spacing in ("uniform", "log"), "depth.spacing", f"must be 'uniform' or 'log', got {d.spacing!r}")
    if d.spacing == "log":
        f.need(0 < d.decades <= 30, "depth.decades", f"must be in (0, 30], got {d.decades:g}")
    if not f.need(da.kind in KINDS, "data.kind", f"must be 'sphere_modes' or 'sphere_noise', got {da.kind!r}"):
        return f.raise_all()
    if da.kind == "sphere_modes":
        _check_modes(f, da.modes, reads_data)
    else:
        f.need(0 <= da.amplitude < 1, "data.amplitude", f"must be in [0, 1), got {da.amplitude}")
        f.need(da.seed >= 0, "data.seed", "must be >= 0")
    f.raise_all()


def _check_modes(f: Found, modes: list[list[float]], minimum: bool = True) -> None:
    """Rows [ℓ, m, amplitude] with integers 1 ≤ ℓ ≤ MAX_MODE_DEGREE, |m| ≤ ℓ, finite amplitudes, μ_0 ≥ 0."""
    if not f.need(len(modes) >= 1 and all(len(m) == 3 for m in modes), "data.modes",
                  "needs rows [l, m, amplitude] (real orthonormal Y_lm)"):
        return
    ok = True
    for i, (ll, m, a) in enumerate(modes):
        ok &= f.need(float(ll).is_integer() and 1 <= ll <= MAX_MODE_DEGREE, f"data.modes[{i}]",
                     f"l must be an integer in 1..{MAX_MODE_DEGREE}, got {ll}")
        ok &= f.need(float(m).is_integer() and abs(m) <= ll, f"data.modes[{i}]",
                     f"m must be an integer with |m| <= l = {ll:g}, got {m}")
        ok &= f.need(math.isfinite(a), f"data.modes[{i}]", f"the amplitude must be finite, got {a}")
    if ok and minimum:  # μ_0's minimum over S² (an optimisation) only where the command reads the data
        from mfpde.tokens.sphere.data import modes_minimum

        low = modes_minimum(modes)
        f.need(low >= 0, "data.modes", f"μ_0 = 1/4π + Σ amplitude·Y_lm is negative somewhere (its minimum is "
               f"{low:.3g}): lower the amplitudes")


#: The continuation's rule on its collocation points (predicate, what it asks).
POINTS_RULE = (lambda n: True, "")


def stationary(cfg: Any, points: int, beta: float, noise: float) -> Any:
    """The discrete stationary problem of noisy tokens here, by ``continuation.discretisation``.

    "spectral" (SphereSpectral: Legendre coefficients, the kernel diagonal, numpy's Newton) or "collocation"
    (SphereStationary: values at the collocation points, PETSc's SNES).
    """
    if getattr(cfg.continuation, "discretisation", "spectral") == "collocation":
        from mfpde.tokens.sphere.stationary import SphereStationary

        return SphereStationary(points, beta, noise)
    from mfpde.tokens.sphere.spectral import SphereSpectral

    return SphereSpectral(points, beta, noise)


def particles(labels: int) -> int:
    """The flow solver's particles for ``tokens.labels``: 2N², N = ⌈√(labels/2)⌉."""
    return 2 * math.ceil(math.sqrt(labels / 2)) ** 2


def coarser(sec: Section) -> Coarser | None:
    """The resolution check's section (:mod:`mfpde.tokens.resolution`): half the labels, or one refinement fewer.

    None where there is none: DG on the icosahedron itself (refine 0), the flow solver below twice the fewest labels
    it takes (:data:`LABELS_RANGE`). The flow's resolutions are named by their particles (2N² of them for
    ``tokens.labels``, :func:`particles`).
    """
    if sec.solver == "flow":
        half = sec.labels // 2
        if half < LABELS_RANGE[0] or particles(half) >= particles(sec.labels):
            return None
        return Coarser(dataclasses.replace(sec, labels=half), "tokens.labels", f"{particles(half)} particles",
                       f"{particles(sec.labels)} particles")
    if sec.refine < 1:
        return None
    return Coarser(dataclasses.replace(sec, refine=sec.refine - 1), "tokens.refine",
                   f"{mesh_cells(sec.refine - 1)} cells", f"{mesh_cells(sec.refine)} cells")
