"""The config schema: one frozen dataclass per TOML section, with the defaults (``mfpde.config`` loads and checks it).

Keys and meanings are the contract of ``interface.md`` (section "Config") and the reference of docs/config.md.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEPTH_SCHEMES", "FAMILY_DEFAULTS", "Config", "Continuation", "Data", "Depth", "Heads", "Loss", "Output",
           "Petsc", "Tokens", "Training", "Twin"]


#: The depth integrators of the token transport (``depth.scheme``): SSP Runge–Kutta of order ≥ 3, by their names
#: in :data:`mfpde.tokens.rk.SCHEMES`.
DEPTH_SCHEMES = ("ssp_rk3", "ssp_rk3_4", "ssp_rk4_10")


@dataclass(frozen=True)
class Tokens:
    """Token space Ω ⊂ R^d and its density space (DG of ``degree`` on ``cells``)."""

    dim: int = 1
    domain: str = "box"  # or "circle" (θ ∈ [0, 2π), theory §8) or "sphere" (S² ⊂ R³, theory §9)
    attention: str = "softmax"
    box: list[list[float]] = field(default_factory=lambda: [[-4.0, 4.0]])
    mesh: str = ""
    cells: list[int] = field(default_factory=lambda: [400])
    refine: int = 2  # sphere: the icosahedron refined r times, 20·4^r cells
    degree: int = 0
    cell: str = "quadrilateral"  # d = 2 boxes: "quadrilateral" (tensor grid, fast kernel) or "triangle"
    cfl: float = 0.4
    outflow_tol: float = 1e-2  # mass allowed to leave Ω (fraction of ∫μ_0) before a run stops with exit 3
    solver: str = "dg"  # circle, sphere: "dg" (upwind DG on cells) or "flow" (the flow map on labels of μ_0)
    labels: int = 128  # solver "flow": the number M of labels of μ_0 (circle: quantiles; sphere: quadrature nodes)
    rtol: float = 1e-10  # circle, solver "flow": the integrators' relative (and absolute, radians) tolerance
    beta: float = math.nan  # circle, sphere: β of the single head, heads.init = Diracs [[β, 1]] (unset: heads.init)
    coupling: float = math.nan  # with beta: K of the single head, heads.init = Diracs [[β, K]] (unset: K = 1)
    noise: float = 0.0  # circle, DG0: τ ≥ 0 of ∂_t μ + ∂_θ(μ u) = τ ∂²_θ μ (theory §10; Scharfetter–Gummel flux)


@dataclass(frozen=True)
class Depth:
    """Depth interval [0, T] and the number of depth steps.

    ``model``: "weight-tied" (one ρ at every depth), "depth-indexed" (one ρ per block of ``layers``), or "shallow":
    one residual attention layer, μ_T = μ_0 − T ∇·(μ_0 V[μ_0; ρ]): ŷ linear in ρ, R convex (theory §2, §5.4).
    """

    T: float = 1.0
    steps: int = 100
    spacing: str = "uniform"  # output depths T·j/steps, or "log" (circle): T·10^{−decades(1 − j/steps)} and 0
    decades: float = 6.0  # spacing "log": the decades of depth the output depths span below T
    model: str = "weight-tied"
    layers: int = 1
    scheme: str = "ssp_rk3"  # the box transport's depth integrator (one of DEPTH_SCHEMES)


#: Θ defaults per head family (of dimension p): ``value`` (θ = v) has the v-axis of ``scalar``'s (θ = (a, v)).
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "scalar": {"box": [[-2.0, 2.0], [-2.0, 2.0]], "cells": [48, 48],
               "init": {"kind": "gaussian", "mean": [0.5, 1.0], "cov": [[0.01, 0.0], [0.0, 0.01]]}},
    "value": {"box": [[-2.0, 2.0]], "cells": [80], "init": {"kind": "gaussian", "mean": [1.0], "cov": [[0.01]]}},
}
_FAMILY_KEYS = ("box", "mesh", "cells", "init")


@dataclass(frozen=True)
class Heads:
    """Head family, Θ ⊂ R^p and ρ_0; ``box``, ``cells``, ``init`` left out take the family's :data:`FAMILY_DEFAULTS`."""

    family: str = "scalar"
    a: float = 0.5
    box: list[list[float]] = field(default_factory=lambda: copy.deepcopy(FAMILY_DEFAULTS["scalar"]["box"]))
    mesh: str = ""
    cells: list[int] = field(default_factory=lambda: copy.deepcopy(FAMILY_DEFAULTS["scalar"]["cells"]))
    degree: int = 1
    init: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(FAMILY_DEFAULTS["scalar"]["init"]))


@dataclass(frozen=True)
class Data:
    """Input token measures μ_0^i and targets y^i."""

    kind: str = "gaussian"
    mean: list[list[float]] = field(default_factory=lambda: [[0.3]])
    cov: list[list[list[float]]] = field(default_factory=lambda: [[[0.25]]])
    target: list[float] = field(default_factory=lambda: [1.0])
    classes: list[int] = field(default_factory=lambda: [0, 1])
    samples: int = 40
    test_samples: int = 40
    seed: int = 0
    origin: list[float] = field(default_factory=lambda: [0.0, 0.0])  # digits: lower-left corner of the image square
    split: float = 0.0  # digits: if > 0, all images of the pair, this fraction for training (samples ignored)
    path: str = ""
    modes: list[list[float]] = field(default_factory=list)  # circle_modes: [[k, amplitude, phase], ...]; sphere_modes:
    # [[l, m, amplitude], ...]
    amplitude: float = 0.01  # circle_noise, sphere_noise: standard deviation of the noise (times the uniform density)


@dataclass(frozen=True)
class Loss:
    """Readout g and loss ℓ: ŷ = ∫ g dμ_T, ℓ(ŷ, y) = ½ (ŷ − y)²."""

    readout: str = "mean"
    loss: str = "squared"
    w: list[float] = field(default_factory=lambda: [1.0])
    b: float = 0.0


@dataclass(frozen=True)
class Training:
    """Regularisation and the training-time stepping of the parameter Fokker–Planck equation."""

    regularization: str = "entropic"
    # ``lambda`` is a Python keyword: the TOML key "lambda" maps to this field.
    lam: float = 0.05
    lambda2: float = 0.5
    ds: float = 0.05
    steps: int = 200
    splitting: str = "lie"
    tape_memory: str | int = "auto"  # bytes per rank for the adjoint's tape (a size string, or "auto")


@dataclass(frozen=True)
class Output:
    """What is written and how often."""

    every: int = 10
    fields: bool = True
    plots: bool = True
    plots_every: int = 0  # run: also draw the plots every k training steps (0: at the end, or when a run stops)
    checkpoint_every: int = 20


@dataclass(frozen=True)
class Petsc:
    """PETSc options per sub-solver (prefixes ``mfpde_token_``, ``mfpde_param_``)."""

    token: dict[str, Any] = field(default_factory=dict)
    param: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Continuation:
    """``mfpde continuation``: the parameter, its range and the step control (pseudo-arclength, weighted norm)."""

    parameter: str = "coupling"  # K, the v of the single Dirac head (β is its a)
    start: float = 0.5
    stop: float = 3.0
    step: float = 0.05  # the initial arclength step
    step_min: float = 1e-6  # a failed Newton correction below it ends the branch
    step_max: float = 0.25
    max_points: int = 400  # per branch
    points: int = 127  # N, odd: the collocation points of the stationary equation
    discretisation: str = "spectral"  # circle, sphere: "spectral" (Fourier / Legendre coefficients) or "collocation"


@dataclass(frozen=True)
class Twin:
    """``mfpde twin``: the sizes of the finite networks trained beside the PDE, and their training.

    Each list is swept with the other two sizes at their largest value (tokens: the token limit itself, a
    quadrature of μ_0, when H or L is swept).
    """

    heads: list[int] = field(default_factory=lambda: [4, 16, 64, 256])  # H, heads per layer (block)
    tokens: list[int] = field(default_factory=lambda: [16, 64, 256])  # N, tokens per input
    sampling: str = "iid"  # the N tokens of an input: "iid" draws from μ_0 or "quantile" (stratified) draws
    layers: list[int] = field(default_factory=lambda: [2, 4, 8, 16])  # L (not for depth.model = "shallow")
    seeds: int = 8  # independent networks per size (>= 2: a standard error)
    optimizer: str = "langevin"  # "langevin" (theory §4's particle system), "sgd" (no noise) or "adam"
    lr: float = 0.01  # optimizer "adam": its learning rate
    trace: int = 2  # training inputs whose token clouds at depth T are compared with μ_T


@dataclass(frozen=True)
class Config:
    """The whole problem. Build it with :func:`load` or :func:`from_dict`."""

    tokens: Tokens = field(default_factory=Tokens)
    depth: Depth = field(default_factory=Depth)
    heads: Heads = field(default_factory=Heads)
    data: Data = field(default_factory=Data)
    loss: Loss = field(default_factory=Loss)
    training: Training = field(default_factory=Training)
    output: Output = field(default_factory=Output)
    petsc: Petsc = field(default_factory=Petsc)
    continuation: Continuation = field(default_factory=Continuation)
    twin: Twin = field(default_factory=Twin)
    source: str = ""  # where it came from (file path or "<default>"): not a TOML key


_ALIASES = {("training", "lambda"): "lam"}
_ALIASES_BACK = {(s, v): k for (s, k), v in _ALIASES.items()}
