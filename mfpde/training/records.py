"""What a run leaves in DIR besides fields and plots: checkpoints, ``history.csv`` and ``report.json``.

Formats are those of interface.md and :mod:`mfpde.io`; the checkpoint holds ρ per layer block in the
rank-independent Θ order, so a run resumes on any number of ranks.
"""

from __future__ import annotations

import csv
import io
import logging
import math
from pathlib import Path
from typing import Any, NamedTuple

from mpi4py import MPI

import numpy as np

from mfpde import __version__
from mfpde.errors import ConfigError
from mfpde.io import load_checkpoint, save_checkpoint, write_atomic
from mfpde.tokens.adjoint import Gradient
from mfpde.training.problem import CoupledProblem
from mfpde.training.theory import fit_rate, theoretical_rate

__all__ = ["HISTORY_KEYS", "Resumed", "Snapshot", "history_row", "load_resume", "run_report", "save_state",
           "write_history"]

logger = logging.getLogger(__name__)

#: The columns of ``history.csv`` (interface.md).
HISTORY_KEYS = ["step", "s", "risk", "free_energy", "entropy", "mass_rho", "min_rho", "grad_norm", "wall_s"]


#: A field snapshot: (training step, ρ per layer block, shape (n_layers, N_θ), global Θ order).
Snapshot = tuple[int, np.ndarray]
_REQUIRED = {"rho", "theta", "step", "history_keys", "history"}
_OPTIONAL = {"snap_step", "snap_rho", "wall_s"}  # absent from checkpoints written before issue 14


class Resumed(NamedTuple):
    """What a resumed run continues from.

    Attributes:
        step: the training step of the checkpoint; history: the history rows before it;
        snapshots: the ρ snapshots written to ``fields/rho.bp`` before it (rewritten on resume, so that
        the file keeps every snapshot); wall_s: the wall seconds of the runs before, up to the checkpoint.
    """

    step: int
    history: list[dict[str, float]]
    snapshots: list[Snapshot]
    wall_s: float


def load_resume(cp: CoupledProblem, out: Path) -> Resumed:
    """Load ρ, the step, the history rows and field snapshots before it from DIR/checkpoint (checked on rank 0).

    Returns:
        What the run continues from; ρ of ``cp`` is set from the checkpoint.

    Raises:
        ConfigError: no checkpoint, unreadable, non-finite, or written for another Θ mesh or layer count.
    """
    comm, theta, steps = cp.comm, cp.theta, cp.cfg.training.steps
    ck, err = None, ""
    if comm.rank == 0:
        try:
            ck = load_checkpoint(out)
            if ck is None:
                err = f"--resume: no checkpoint in {out / 'checkpoint'}"
            elif not _REQUIRED <= set(ck) <= _REQUIRED | _OPTIONAL:
                err = "--resume: the checkpoint is incomplete"
            elif ck["rho"].shape != (cp.state.n_layers, len(theta.points)) or not np.allclose(ck["theta"],
                                                                                             theta.points):
                err = "--resume: the checkpoint was written for another Θ mesh (heads.box/cells/mesh) or layer count"
            elif not (np.all(np.isfinite(ck["rho"])) and np.all(ck["rho"] >= 0)):
                err = "--resume: the checkpoint holds non-finite or negative densities"
            elif not 0 <= int(ck["step"]) <= steps:
                err = f"--resume: checkpoint step {int(ck['step'])} is beyond training.steps = {steps}"
            elif ck["history"].size and ck["history"].shape[-1] != len(ck["history_keys"]):
                err = "--resume: the checkpoint's history is malformed"
        except ConfigError as e:
            err = str(e)
        except (TypeError, ValueError, IndexError) as e:  # arrays of the wrong kind in a readable file
            err = f"--resume: checkpoint {str(out / 'checkpoint' / 'state.npz')!r} is malformed: {e}"
    ck, err = comm.bcast((ck, err), root=0)
    if err:
        raise ConfigError(err)
    assert ck is not None
    for k, r in enumerate(cp.rhos):
        theta.set_values(r, ck["rho"][k])
    step0 = int(ck["step"])
    keys = ck["history_keys"].tolist()
    history = [h for h in (dict(zip(keys, row, strict=True)) for row in ck["history"]) if h["step"] < step0]
    snaps = [(int(st), r) for st, r in zip(ck.get("snap_step", []), ck.get("snap_rho", []), strict=True)
             if st < step0]
    wall = float(ck["wall_s"]) if "wall_s" in ck else (history[-1]["wall_s"] if history else 0.0)
    logger.info("resuming from step %d", step0)
    return Resumed(step0, history, snaps, wall)


def save_state(cp: CoupledProblem, out: Path, step: int, history: list[dict[str, float]],
               snapshots: list[Snapshot] | None = None, wall: float = 0.0) -> None:
    """Write ``checkpoint/state.npz``, atomically and durably.

    It holds ρ per block (global, Θ order), the Θ points, the step, the history rows, the ρ snapshots of
    ``fields/rho.bp`` (``snap_step``, ``snap_rho``) and the wall seconds so far (``wall_s``).
    """
    snapshots = snapshots or []
    rho = np.stack([cp.theta.gather_values(r) for r in cp.rhos])
    keys = list(history[0].keys()) if history else []
    snap_rho = np.stack([v for _, v in snapshots]) if snapshots else np.zeros((0, *rho.shape))
    save_checkpoint(out, {"rho": rho, "theta": cp.theta.points, "step": np.array(step), "history_keys": np.array(keys),
                          "history": np.array([[h[k] for k in keys] for h in history]),
                          "snap_step": np.array([st for st, _ in snapshots], dtype=np.int64), "snap_rho": snap_rho,
                          "wall_s": np.array(wall)}, cp.comm)


def history_row(cp: CoupledProblem, grad: Gradient, step: int, s: float, wall: float) -> dict[str, float]:
    """One row of ``history.csv`` for the current ρ and its gradient (potentials already set). Collective."""
    fe = cp.state.free_energy(grad.risk)
    gn = cp.state.dissipation_norm()
    return {"step": step, "s": s, "risk": fe["risk"], "free_energy": fe["free_energy"], "entropy": fe["entropy"],
            "mass_rho": fe["mass_rho"], "min_rho": fe["min_rho"], "grad_norm": gn, "wall_s": wall}


def write_history(out: Path, history: list[dict[str, float]], comm: MPI.Comm) -> None:
    """Write ``history.csv`` (12 significant digits) atomically from rank 0."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(HISTORY_KEYS)
    for h in history:
        w.writerow([int(h["step"]) if k == "step" else f"{h[k]:.12g}" for k in HISTORY_KEYS])
    write_atomic(out / "history.csv", buf.getvalue(), comm)


def run_report(cp: CoupledProblem, history: list[dict[str, float]], status: str, step: int,
               wall: float) -> dict[str, Any]:
    """The ``run`` report of interface.md without the final outputs (NTK, accuracy). Collective.

    ``final`` takes risk, free energy, mass and min of ρ from the last history row, and ρ's moments and
    Gibbs residual from :func:`mfpde.params.free_energy.diagnostics` against the last Φ.
    """
    st = cp.state
    final = dict(history[-1]) if history else {}
    diag = [st.fp.diagnostics(r, phi) for r, phi in zip(st.rhos, st.phis, strict=True)]
    one = st.n_layers == 1
    fin: dict[str, Any] = {"risk": final.get("risk"), "free_energy": final.get("free_energy"),
                           "mass_rho": final.get("mass_rho"), "min_rho": final.get("min_rho"),
                           "rho_mean": diag[0]["mean"] if one else [d["mean"] for d in diag],
                           "rho_cov": diag[0]["cov"] if one else [d["cov"] for d in diag]}
    if st.lam > 0:
        g = [d["l1_gibbs"] for d in diag]
        fin["gibbs_residual_l1"] = g[0] if one else g
    s = np.array([h["s"] for h in history])
    F = np.array([h["free_energy"] for h in history])
    rate: dict[str, Any] = {"fitted": fit_rate(s, F - F.min()) if len(F) > 2 else math.nan, "theory": None}
    theory, kind = theoretical_rate(cp.family.name, st.lam, st.lam2, st.risk_oscillation())
    if theory is not None:
        rate["theory"], rate["theory_kind"] = theory, kind
    return {"status": status, "command": "run", "version": __version__, "comm_size": cp.comm.size,
            "wall_s": wall, "steps_done": step, "final": fin, "rate": rate}
