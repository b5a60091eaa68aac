"""The config rules of the hypersphere domain (``tokens.domain = "hypersphere"``, theory §11).

Tokens on S^{d−1} ⊂ R^d, ``tokens.dim = d`` (2 ≤ d ≤ 4096), with ZONAL data: μ depends on z = x·e only, and the
equation is one-dimensional in the polar angle θ = arccos z. ``tokens.cells = [n]`` cells in θ ∈ [0, π] for the
finite-volume solver (``tokens.solver = "dg"``, degree 0: upwind, Scharfetter–Gummel with ``tokens.noise``), or
the flow map (``"flow"``) on ``tokens.labels`` Gauss labels of μ_0 at tolerance ``tokens.rtol``;
``tokens.attention`` "softmax" or "unnormalised"; Dirac heads of the scalar family (``tokens.beta = β`` the single
head (β, 1)). Data: ``zonal_modes`` (``data.modes = [[degree, amplitude], ...]``: ν_0 = 1 + Σ amplitude·P_ℓ(z), P_ℓ
the Gegenbauer polynomial of S^{d−1} normalised to P_ℓ(1) = 1) or ``zonal_cap`` (the von Mises–Fisher cap
ν_0 ∝ e^{κ z}, κ = ``data.amplitude``). Errors name the key (:class:`~mfpde.errors.ConfigError`, exit 2).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from mfpde.domains import Found, check_dirac_heads
from mfpde.tokens.resolution import Coarser

__all__ = ["DIM_RANGE", "KINDS", "Section", "check", "coarser", "keys", "modes_minimum", "not_applying", "section"]

@dataclass(frozen=True)
class Section:
    """The hypersphere's section of the config: what its transport job and solvers read (built by :func:`section`).

    Attributes:
        dim, attention, solver, cells, cfl, labels, rtol, noise: the keys of ``[tokens]`` (``cells``: n in θ).
        heads: the Dirac heads as rows (β_h, c_h, w_h): ``tokens.beta`` (with ``tokens.coupling``), or heads.init's
            points [[β, c], ...] and weights.
        kind, modes, amplitude: the keys of ``[data]``.
        depth, output: the ``[depth]`` and ``[output]`` sections (the output depths read them).
    """

    dim: int
    attention: str
    solver: str
    cells: int
    cfl: float
    labels: int
    rtol: float
    noise: float
    heads: tuple[tuple[float, float, float], ...]
    kind: str
    modes: list[list[float]]
    amplitude: float
    depth: Any
    output: Any


def section(cfg: Any) -> Section:
    """The hypersphere's section of a validated config."""
    t, h, da = cfg.tokens, cfg.heads, cfg.data
    heads = tuple((float(p[0]), float(p[1]), float(w)) for p, w in zip(h.init["points"], h.init["weights"],
                                                                         strict=True))
    return Section(t.dim, t.attention, t.solver, t.cells[0], t.cfl, t.labels, t.rtol, t.noise, heads, da.kind,
                   da.modes, da.amplitude, cfg.depth, cfg.output)


#: The stationary problem's unknowns are log-densities: a Gibbs density spanning more than the double range is
#: fine (the continuation's underflow guard does not apply).
LOG_DENSITY = True
#: The data kinds of the hypersphere.
KINDS = ("zonal_modes", "zonal_cap")
#: The ambient dimensions d of S^{d−1}.
DIM_RANGE = (2, 4096)
#: The largest Gegenbauer degree of a data mode.
MAX_MODE_DEGREE = 64
#: The largest cap concentration κ (e^{κ z} in doubles).
MAX_CAP = 700.0
#: The most cells in θ (each holds one value; the velocity is an O(n²) sum per stage).
MAX_CELLS = 20_000
#: The flow solver's label range and tolerance range (as on the circle).
LABELS_RANGE = (8, 4096)
RTOL_RANGE = (1e-12, 1e-2)
#: The inverse temperatures allowed (e^β overflows for unnormalised attention past 700).
MAX_BETA = {"softmax": 700.0, "unnormalised": 700.0}


def modes_minimum(modes: list[list[float]], d: int, samples: int = 4001) -> float:
    """The minimum over z ∈ [−1, 1] of ν_0 = 1 + Σ amplitude·P_ℓ(z) (P_ℓ(1) = 1), on a fine grid and the ends."""
    from mfpde.tokens.hypersphere.zonal import orthonormal_basis

    z = np.cos(np.linspace(0.0, math.pi, samples))
    lmax = int(max(m[0] for m in modes))
    V = orthonormal_basis(z, lmax, d) / orthonormal_basis(np.ones(1), lmax, d)[0]
    nu = 1.0 + sum(a * V[:, int(ll)] for ll, a in modes)
    return float(np.min(nu))


def check(cfg: Any, reads_data: bool = True) -> None:
    """Check the hypersphere keys of a :class:`~mfpde.config.Config` with ``tokens.domain = "hypersphere"``.

    Raises:
        ConfigError: naming the key (:class:`~mfpde.errors.ConfigErrors` for several): ``tokens.dim`` not an
            integer in 2..4096, data of another domain or not zonal, modes not [[degree, amplitude], ...] with
            integer degrees 1..64 and ν_0 ≥ 0, a cap κ outside [0, 700], cells not [n], a degree other than 0,
            an unknown solver or attention, heads other than scalar Diracs, a depth model other than weight-tied.
    """
    t, da, d = cfg.tokens, cfg.data, cfg.depth
    f = Found()
    dim_ok = f.need(isinstance(t.dim, int) and DIM_RANGE[0] <= t.dim <= DIM_RANGE[1], "tokens.dim",
                    f"on the hypersphere S^(d-1) must be an integer d in {DIM_RANGE[0]}..{DIM_RANGE[1]}, got {t.dim}")
    f.need(t.attention in MAX_BETA, "tokens.attention", f"must be 'softmax' or 'unnormalised', got {t.attention!r}")
    f.need(t.solver in ("dg", "flow"), "tokens.solver", f"must be 'dg' or 'flow', got {t.solver!r}")
    # noise with the flow map: refused by the transport job (continuation reads τ at any solver)
    f.need(math.isfinite(t.noise) and t.noise >= 0, "tokens.noise", f"must be >= 0 and finite, got {t.noise:g}")
    if t.solver == "flow":
        f.need(LABELS_RANGE[0] <= t.labels <= LABELS_RANGE[1], "tokens.labels",
               f"must be in {LABELS_RANGE[0]}..{LABELS_RANGE[1]}, got {t.labels}")
        f.need(RTOL_RANGE[0] <= t.rtol < RTOL_RANGE[1], "tokens.rtol",
               f"must be in [{RTOL_RANGE[0]:g}, {RTOL_RANGE[1]:g}), got {t.rtol:g}")
    else:
        f.need(len(t.cells) == 1 and 8 <= t.cells[0] <= MAX_CELLS, "tokens.cells",
               f"on the hypersphere needs [n] (cells in the polar angle) with 8 <= n <= {MAX_CELLS}, got {t.cells}")
        f.need(t.degree == 0, "tokens.degree", f"the hypersphere's finite volumes are degree 0, got {t.degree}")
    f.need(not t.mesh, "tokens.mesh", "the hypersphere's cells are intervals of the polar angle; no mesh file")
    check_dirac_heads(f, cfg, MAX_BETA, "hypersphere")
    f.need(d.model == "weight-tied", "depth.model", "the hypersphere solves the weight-tied model only")
    f.need(d.spacing in ("uniform", "log"), "depth.spacing", f"must be 'uniform' or 'log', got {d.spacing!r}")
    if d.spacing == "log":
        f.need(0 < d.decades <= 30, "depth.decades", f"must be in (0, 30], got {d.decades:g}")
    if not f.need(da.kind in KINDS, "data.kind", f"the hypersphere takes zonal data, 'zonal_modes' or "
                  f"'zonal_cap', got {da.kind!r}"):
        return f.raise_all()
    if da.kind == "zonal_modes":
        ok = f.need(len(da.modes) >= 1 and all(len(m) == 2 for m in da.modes), "data.modes",
                    "needs rows [degree, amplitude] (Gegenbauer degrees of zonal data: no order m on the hypersphere)")
        for i, m in enumerate(da.modes if ok else []):
            ok &= f.need(float(m[0]).is_integer() and 1 <= m[0] <= MAX_MODE_DEGREE, f"data.modes[{i}]",
                         f"the degree must be an integer in 1..{MAX_MODE_DEGREE}, got {m[0]}")
            ok &= f.need(math.isfinite(m[1]), f"data.modes[{i}]", f"the amplitude must be finite, got {m[1]}")
        if ok and dim_ok:
            low = modes_minimum(da.modes, t.dim)
            f.need(low >= 0, "data.modes", f"ν_0 = 1 + Σ amplitude·P_l(z) is negative somewhere (its minimum is "
                   f"{low:.3g}): lower the amplitudes")
    else:
        f.need(0 <= da.amplitude <= MAX_CAP, "data.amplitude", f"the cap's concentration κ (ν_0 ∝ e^(κ z)) must be "
               f"in [0, {MAX_CAP:g}], got {da.amplitude}")
    f.raise_all()


def keys(cfg: Any) -> dict[str, bool]:
    """Whether each key the hypersphere decides is used (the resolved config.toml keeps these)."""
    t, da = cfg.tokens, cfg.data
    flow = t.solver == "flow"
    return {"tokens.box": False, "tokens.cell": False, "tokens.refine": False, "tokens.mesh": False,
            "tokens.dim": True, "tokens.cells": not flow, "tokens.attention": True, "tokens.solver": True,
            "tokens.labels": flow, "tokens.rtol": flow, "tokens.noise": True, "tokens.degree": not flow,
            "tokens.cfl": not flow, "depth.spacing": True, "data.modes": da.kind == "zonal_modes",
            "data.amplitude": da.kind == "zonal_cap", "data.seed": False, "depth.scheme": False}


def not_applying(cfg: Any) -> list[tuple[str, str, bool, str]]:
    """(section, key, does not apply, why) for the keys of other domains given on the hypersphere."""
    why = {"box": "the box's", "cell": "the box's", "mesh": "a mesh domain's"}
    return [("tokens", k, True, f"tokens.{k} is {w}; the hypersphere's cells are tokens.cells = [n] in the polar "
             "angle") for k, w in why.items()]


#: The continuation's rule on its collocation points (predicate, what it asks).
POINTS_RULE = (lambda n: True, "")


def stationary(cfg: Any, points: int, beta: float, noise: float) -> Any:
    """The discrete stationary problem of noisy tokens here (HypersphereStationary)."""
    from mfpde.tokens.hypersphere.stationary import HypersphereStationary

    return HypersphereStationary(points, beta, noise, cfg.tokens.dim)


def coarser(sec: Section) -> Coarser | None:
    """The resolution check's section (:mod:`mfpde.tokens.resolution`): half the labels or cells (None below 8)."""
    flow = sec.solver == "flow"
    key, n = ("tokens.labels", sec.labels) if flow else ("tokens.cells", sec.cells)
    if n // 2 < 8:
        return None
    what = "labels" if flow else "cells"
    half = dataclasses.replace(sec, labels=n // 2) if flow else dataclasses.replace(sec, cells=n // 2)
    return Coarser(half, key, f"{n // 2} {what}", f"{n} {what}")
