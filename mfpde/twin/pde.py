"""The PDE side of ``mfpde twin``: the runs it compares with, read back, and their own discretisation error.

A run of the config (or a finished one, ``--pde``) and the same run on twice the token cells per axis (Richardson:
the error of the first), read from their ``report.json``, ``history.csv``, ``predictions.csv`` and fields. Their
configs, and the check that a finished run is of the twin's problem, are the job's (:mod:`mfpde.jobs.twin_runs`).
"""

from __future__ import annotations

import csv
import io
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mfpde.errors import ConfigError

__all__ = ["PDE_ORDER", "PdeRun", "pde_error", "read_pde"]

logger = logging.getLogger("mfpde")


@dataclass
class PdeRun:
    """What the comparison reads of a finished PDE run."""

    out: Path
    steps: np.ndarray  # output steps
    risk: np.ndarray
    test_risk: np.ndarray
    test_acc: np.ndarray
    yhat: np.ndarray  # ŷ of the training inputs at the last step
    rho_points: np.ndarray  # Θ nodes (N_θ, p)
    rho: list[np.ndarray]  # ρ_s at each output step (block 0)
    mu_T: Any  # the VTX field of μ_T of the training inputs (or None)
    report: dict[str, Any]


def read_pde(out: Path, p: int, need_fields: bool = True) -> PdeRun:
    """Read ``history.csv``, ``predictions.csv``, ``report.json`` and the fields of a finished ``mfpde run``.

    Raises:
        ConfigError: a missing or unfinished run, naming the file.
    """
    import json

    from mfpde.io import read_vtx

    try:
        report = json.loads((out / "report.json").read_text())
        rows = list(csv.DictReader(io.StringIO((out / "history.csv").read_text())))
        preds = list(csv.DictReader(io.StringIO((out / "predictions.csv").read_text())))
    except (OSError, ValueError) as e:
        raise ConfigError(f"--pde {str(out)!r}: not a finished mfpde run ({e})") from None
    if report.get("status") != "ok":
        raise ConfigError(f"--pde {str(out)!r}: the run's status is {report.get('status')!r}, not 'ok'")

    def col(k: str) -> np.ndarray:
        return np.array([float(r.get(k) or "nan") for r in rows])

    yhat = np.array([float(r["yhat_final"]) for r in preds if r["split"] == "train"])
    rho_pts, rho = np.zeros((0, p)), []
    mu = None
    if need_fields:
        blocks = int(report.get("rho_blocks", 0) or 0)
        try:
            f = read_vtx(out / "fields" / "rho.bp")
        except ConfigError:  # a depth-indexed run writes one ρ per block: the first block's
            f = read_vtx(out / "fields" / "rho.bp", "rho_0")
        del blocks
        rho_pts = np.asarray(f.points[-1])[:, :p]
        rho = [np.asarray(v, float)[: len(rho_pts)] for v in f.values]
        mpath = out / "fields" / "mu_T_train.bp"
        mu = read_vtx(mpath) if mpath.is_dir() else None
    return PdeRun(out, col("step"), col("risk"), col("test_risk"), col("test_accuracy"), yhat, rho_pts, rho, mu,
                  report)


#: The least order in h of the PDE's outputs (DG0 upwind is first order; DG1 second, so p = 1 over-estimates there).
PDE_ORDER = 1.0


def pde_error(run: PdeRun, refined: PdeRun | None) -> dict[str, float]:
    """The PDE's own discretisation error of the risk (last step), ŷ (mean over inputs) and ρ (W1), by Richardson.

    With v_h − v = K h^p + o(h^p), p ≥ :data:`PDE_ORDER`: |v_h − v| ≤ |v_h − v_{h/2}| 2^p/(2^p − 1) (the error
    of the config's run, the reference of every gap, from the run on twice the cells). No refined run: NaN
    (nothing is flagged).
    """
    from mfpde.twin.compare import rho_quadrature, w1_heads

    if refined is None:
        return {"risk": math.nan, "yhat": math.nan, "rho_w1": math.nan}
    f = 2**PDE_ORDER / (2**PDE_ORDER - 1)
    risk = f * abs(float(run.risk[-1] - refined.risk[-1]))
    yhat = f * float(np.mean(np.abs(run.yhat - refined.yhat)))
    out = {"risk": risk, "yhat": yhat, "rho_w1": math.nan}
    if refined.rho and run.rho:  # the refined run's ρ (the same Θ mesh) by its quadrature, as weighted heads
        q, wq = rho_quadrature(refined.rho_points, refined.rho[-1])
        out["rho_w1"] = f * w1_heads(q, run.rho_points, run.rho[-1], weights=wq)
    return out

