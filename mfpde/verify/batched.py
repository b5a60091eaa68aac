"""Checks of the batched d = 2 training gradient, the path of the default job (theory §3; plan §7 item 3).

* ``batched_gradient_d2``: ∂R/∂c of a d = 2 DG0 problem on an off-centre box with the ``linear`` readout (b ≠ 0),
  Gaussian data, scalar heads, for the weight-tied, the depth-indexed (L = 2) and the single-layer model, taken
  by the batched solver (:mod:`mfpde.tokens.box.batch`, samples as rows of one array), against

  - finite differences of R itself (Taylor remainder |R(c + εδ) − R(c) − ε ∂R/∂c·δ| of slope 2 ± 0.1), and
  - the per-sample solver (DOLFINx Functions, the PETSc mass solve, the velocity operator per sample) to the
    round-off of the operations (the depth-indexed model's two blocks get different heads, so that the two
    solvers must apply them at the same depth steps): |ΔD| ≤ 2κγ_n max|D|,
    n = 2 · steps · n_s · 3 · (4·5·9 + 28 + N_y) roundings a value (three stages of the facet sums, the
    velocity's N_y-term sums; twice for the reverse pass) and κ = 10 the amplification through a few depth
    steps of a positive CFL-limited scheme (as the tests bound it).

The check runs on each rank alone (the batched path needs a token mesh on one rank); every rank computes
the same numbers.
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

import numpy as np

from mfpde import config as C
from mfpde.fitting import fit_order
from mfpde.heads import HeadMeasure
from mfpde.training.problem import CoupledProblem
from mfpde.verify.registry import Outcome, Series, register

__all__ = ["batched_config"]

KAPPA = 10.0
U = float(np.finfo(np.float64).eps) / 2


def batched_config(model: str) -> C.Config:
    """The d = 2 problem of ``batched_gradient_d2``: 3 Gaussian samples, 12×12 DG0 cells on an off-centre box."""
    raw: dict[str, Any] = {
        "tokens": {"dim": 2, "box": [[-2.3, 1.9], [-1.8, 2.4]], "cells": [12, 12], "degree": 0},
        "depth": {"T": 1.0, "steps": 4, "model": model},
        "heads": {"family": "scalar", "box": [[-2.0, 2.0], [-2.0, 2.0]], "cells": [5, 5],
                  "init": {"kind": "gaussian", "mean": [0.4, 0.6], "cov": [[0.2, 0.0], [0.0, 0.2]]}},
        "data": {"kind": "gaussian", "mean": [[0.1, 0.2], [-0.2, 0.1], [0.3, -0.2]],
                 "cov": [[[0.06, 0.01], [0.01, 0.05]]] * 3, "target": [1.0, -0.5, 0.3]},
        "loss": {"readout": "linear", "w": [1.0, -2.0], "b": 0.4},
        "training": {"regularization": "entropic", "lambda": 0.01, "lambda2": 0.1, "ds": 0.1, "steps": 1},
        "output": {"every": 1, "fields": False, "plots": False, "checkpoint_every": 10**6},
    }
    if model == "depth-indexed":
        raw["depth"]["layers"] = 2
    return C.from_dict(raw)


def _risk(cp: CoupledProblem, heads: list[HeadMeasure]) -> float:
    y = cp.objective.predict(cp.problem.train, heads)
    t = np.array([s.target for s in cp.problem.train])
    return float(0.5 * np.mean((y - t) ** 2))


def _case(model: str) -> tuple[bool, str, Series, float]:
    cp = CoupledProblem.from_config(batched_config(model), MPI.COMM_SELF)
    obj = cp.objective
    if obj.batch is None:
        return False, f"{model}: the batched path was not taken", Series([1.0], [1.0], "ε", 2.0, 0.0), 0.0
    heads = cp.heads()  # depth-indexed: the blocks start equal; made unequal, so that a block-order bug shows
    heads = heads[:1] + [HeadMeasure(h.a, h.c * np.linspace(1.5, 0.5, len(h.c))) for h in heads[1:]]
    g = obj.gradient(heads)
    batch, obj.batch = obj.batch, None
    g_ref = obj.gradient(heads)  # the per-sample solver
    obj.batch = batch
    cells = int(np.prod(cp.sec.tokens.cells))
    n = 2 * cp.sec.depth.steps * 2 * 3 * (4 * 5 * 9 + 28 + cells)
    tol = 2 * KAPPA * n * U / (1 - n * U)
    diff = max(float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300)) for a, b in zip(g.D, g_ref.D, strict=True))
    rng = np.random.default_rng(7)
    delta = [rng.standard_normal(len(h.c)) for h in heads]
    pred = sum(float(d @ D) for d, D in zip(delta, g.D, strict=True))
    eps = [0.1 / 2.0**k for k in range(5)]
    errs = []
    for e in eps:
        moved = [HeadMeasure(h.a, h.c + e * d) for h, d in zip(heads, delta, strict=True)]
        errs.append(abs(_risk(cp, moved) - g.risk - e * pred))
    slope = fit_order(eps, errs)
    ok = diff <= tol and abs(slope - 2.0) < 0.1 and abs(pred) > 1e-8
    line = (f"{model}: Taylor slope {slope:.3f}, |ΔD| per-sample {diff:.1e} ≤ {tol:.1e} of max|D|")
    return ok, line, Series(eps, errs, "ε", 2.0, slope, model), slope


@register("batched_gradient_d2", "§3 (discrete adjoint); §2, §1.4 (D); default job's path",
          "finite differences of R; the per-sample solver to round-off", budget_s=120.0, distributed=False)
def check_batched_gradient_d2(quick: bool) -> Outcome:
    """Taylor slope 2 ± 0.1 and per-sample agreement to round-off, three models (the row: the worst slope)."""
    ok, lines, series, worst = True, [], [], 2.0
    for model in ("weight-tied", "depth-indexed", "shallow"):
        good, line, s, slope = _case(model)
        ok &= good
        lines.append(line)
        series.append(s)
        worst = slope if abs(slope - 2.0) > abs(worst - 2.0) else worst
    return Outcome(worst, 2.0, "< 0.1; per-sample |ΔD| ≤ 2κγ_n max|D|", ok, "; ".join(lines), series, 0.1)
