"""Small configs of theory §6.2 (d = 1, Gaussian data) shared by the checks and the tests.

Every config here has a closed form: the deep value model (theory §6.2, :func:`mfpde.exact.value_yhat`),
the single residual layer (:func:`mfpde.exact.shallow_yhat`), and their Gaussian training laws.
"""

from __future__ import annotations

from typing import Any

from mfpde import config as C

__all__ = ["A_FIXED", "M0", "S0", "gaussian_config"]

#: Two Gaussian input samples N(m₀, σ₀²) in d = 1, and the fixed A = aI of the value family.
M0, S0, A_FIXED = (0.3, -0.5), (0.25, 0.1), 0.5


def gaussian_config(family: str = "value", n: int = 1, targets: tuple[float, ...] = (1.0,), model: str = "weight-tied",
                    reg: str = "tikhonov", lam: float = 0.0, lam2: float = 0.0, ds: float = 0.05, steps: int = 10,
                    splitting: str = "lie", token_cells: int = 80, token_degree: int = 0, theta_cells: int = 80,
                    theta_box: float = 2.0, mean: tuple[float, ...] = (0.4,), var: float = 0.05,
                    token_box: float = 4.0) -> C.Config:
    """A d = 1 problem with n Gaussian samples (the first n of :data:`M0`, :data:`S0`) and a Gaussian ρ₀.

    Args:
        family: ``"value"`` (θ = v, p = 1) or ``"scalar"`` (θ = (a, v), p = 2; ``mean`` then has length 2).
        n: number of samples.
        targets: y^i, length n.
        model: ``depth.model`` (``"weight-tied"``, ``"shallow"``).
        reg: ``training.regularization``.
        lam: λ.
        lam2: λ₂.
        ds: Δs.
        steps: training steps.
        splitting: ``"lie"`` or ``"strang"``.
        token_cells: cells of the token interval [−L, L] (depth steps = cells/4).
        token_degree: DG degree of the token density.
        theta_cells: cells per axis of Θ = [−b, b]^p.
        theta_box: b.
        mean: mean of ρ₀, length p.
        var: variance of ρ₀ per axis.
        token_box: L.

    Returns:
        The validated config (no fields, plots or checkpoints; a history row every step).
    """
    p = 1 if family == "value" else 2
    raw: dict[str, Any] = {
        "tokens": {"dim": 1, "box": [[-token_box, token_box]], "cells": [token_cells], "degree": token_degree},
        "depth": {"T": 1.0, "steps": max(token_cells // 4, 1), "model": model},
        "heads": {"family": family, **({"a": A_FIXED} if p == 1 else {}),  # a is θ's first component for scalar
                  "box": [[-theta_box, theta_box]] * p, "cells": [theta_cells] * p,
                  "init": {"kind": "gaussian", "mean": list(mean),
                           "cov": [[var if i == j else 0.0 for j in range(p)] for i in range(p)]}},
        "data": {"kind": "gaussian", "mean": [[m] for m in M0[:n]], "cov": [[[s]] for s in S0[:n]],
                 "target": list(targets)},
        "loss": {"readout": "mean"},
        "training": {"regularization": reg, "lambda": lam, "lambda2": lam2, "ds": ds, "steps": steps,
                     "splitting": splitting},
        "output": {"every": 1, "fields": False, "plots": False, "checkpoint_every": 10**6},
    }
    return C.from_dict(raw)
