"""What the run job leaves in DIR besides fields and the report.

Checkpoints, ``history.csv``, plots and ``predictions.csv``.

The rows themselves are :mod:`mfpde.training.history`'s.

Formats are those of interface.md and :mod:`mfpde.io`; the checkpoint holds ρ per layer block in the
rank-independent Θ order, so a run resumes on any number of ranks.
"""

from __future__ import annotations

import csv
import io
import logging
import os
import tomllib
from pathlib import Path
from typing import Any, NamedTuple

from mpi4py import MPI

import dolfinx.fem
import numpy as np

from mfpde.config.rules import token_space_fingerprint
from mfpde.errors import ConfigError
from mfpde.io import append_records, load_checkpoint, read_records, save_checkpoint, write_atomic
from mfpde.params.densities import gibbs
from mfpde.plots import FIGURES, RhoSeries, TokenSeries, plot_run
from mfpde.training.history import HISTORY_KEYS
from mfpde.training.objective import Snapshots
from mfpde.training.problem import CoupledProblem
from mfpde.training.report import certificate_bound, rate_block

__all__ = ["Resumed", "Snapshot", "append_history", "cut_appended", "load_resume", "save_state", "start_history",
           "write_plots", "write_predictions"]

logger = logging.getLogger(__name__)


#: A field snapshot: (training step, ρ per layer block, shape (n_layers, N_θ), global Θ order).
Snapshot = tuple[int, np.ndarray]
_REQUIRED = {"rho", "theta", "step", "history_keys"}
#: ``history``, ``snap_step``, ``snap_rho``: the rows and snapshots inside ``state.npz`` (older checkpoints);
#: ``n_history``, ``n_snapshots``: how many records of the append-only files below are valid (today's).
_OPTIONAL = {"history", "snap_step", "snap_rho", "wall_s", "n_history", "n_snapshots", "omega"}
#: The append-only files of the checkpoint: history rows, and ρ snapshots as (step, ρ of every block).
HISTORY_FILE, SNAPSHOT_FILE = "history.f8", "snapshots.f8"


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


#: Config sections and keys that a resumed run may change: how long it trains and what it writes.
RESUME_MAY_CHANGE = ("training.steps", "training.tape_memory", "output.")  # the tape: memory, not results


def check_resume_config(new_toml: str, out: Path, comm: MPI.Comm) -> int | None:
    """Refuse a ``--resume`` whose config differs from the interrupted run's ``DIR/config.toml`` (collective).

    Only ``training.steps``, ``training.tape_memory`` (the gradient is bit-identical at any budget) and ``output.*``
    may change: a resumed run continues the same trajectory, and any
    other key (the model, the meshes, λ, the data) would join two different problems into one history.

    Returns:
        The interrupted run's ``training.steps`` (None if its config does not say), on every rank.

    Raises:
        ConfigError: on every rank, naming the first key that differs (and its two values).
    """
    err, steps = "", None
    if comm.rank == 0:
        old_path = out / "config.toml"
        if old_path.exists():
            try:
                old = _flatten(tomllib.loads(old_path.read_text()))
            except (OSError, tomllib.TOMLDecodeError) as e:
                old, err = {}, f"--resume: cannot read the interrupted run's {str(old_path)!r}: {e}"
            new = _flatten(tomllib.loads(new_toml))
            steps = old.get("training.steps")
            for key in sorted(set(old) & set(new)):  # older versions wrote unused keys too
                if err or key.startswith(RESUME_MAY_CHANGE):
                    continue
                if old.get(key) != new.get(key):
                    err = (f"--resume: {key} = {new.get(key)!r} differs from the interrupted run's {old.get(key)!r} "
                           f"({str(old_path)!r}); only training.steps, training.tape_memory and output.* may change")
    err, steps = comm.bcast((err, steps), root=0)
    if err:
        raise ConfigError(err)
    return steps if isinstance(steps, int) else None


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def load_resume(cp: CoupledProblem, out: Path) -> Resumed:
    """Load ρ, the step, the history rows and field snapshots before it from DIR/checkpoint (checked on rank 0).

    Returns:
        What the run continues from; ρ of ``cp`` is set from the checkpoint.

    Raises:
        ConfigError: no checkpoint, unreadable, non-finite, or written for another Θ mesh, layer count or token
            space Ω (:func:`~mfpde.config.rules.token_space_fingerprint`).
    """
    comm, theta, steps = cp.comm, cp.theta, cp.sec.training.steps
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
            elif "omega" in ck and str(ck["omega"]) != token_space_fingerprint(cp.sec):
                err = (f"--resume: the checkpoint was written for another token space Ω ({str(ck['omega'])}; now "
                       f"{token_space_fingerprint(cp.sec)}): tokens.box/cells/cell/degree/mesh must not change")
            elif not (np.all(np.isfinite(ck["rho"])) and np.all(ck["rho"] >= 0)):
                err = "--resume: the checkpoint holds non-finite or negative densities"
            elif not 0 <= int(ck["step"]) <= steps:
                err = f"--resume: checkpoint step {int(ck['step'])} is beyond training.steps = {steps}"
            else:
                _read_appended(ck, out / "checkpoint", ck["rho"].size)
                if ck["history"].size and ck["history"].shape[-1] != len(ck["history_keys"]):
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
    keys = ["neg_entropy" if k == "entropy" else k for k in ck["history_keys"].tolist()]  # ∫ρ log ρ, older name
    history = [h for h in (dict(zip(keys, row, strict=True)) for row in ck["history"]) if h["step"] < step0]
    snaps = [(int(st), r) for st, r in zip(ck.get("snap_step", []), ck.get("snap_rho", []), strict=True)
             if st < step0]
    wall = float(ck["wall_s"]) if "wall_s" in ck else (history[-1]["wall_s"] if history else 0.0)
    cut_appended(out, step0, comm)  # the rows and snapshots from step0 on are computed again
    logger.info("resuming from step %d", step0)
    return Resumed(step0, history, snaps, wall)


def _read_appended(ck: dict[str, np.ndarray], d: Path, n_rho: int) -> None:
    """Put the history rows and ρ snapshots of the append-only files into ``ck`` (as older checkpoints held them)."""
    if "n_history" not in ck:  # the rows and snapshots are in state.npz itself
        ck.setdefault("history", np.zeros((0, len(ck["history_keys"]))))
        return
    width = len(ck["history_keys"])
    ck["history"] = read_records(d / HISTORY_FILE, int(ck["n_history"]), width)
    snaps = read_records(d / SNAPSHOT_FILE, int(ck["n_snapshots"]), 1 + n_rho)
    ck["snap_step"] = snaps[:, 0].astype(np.int64)
    ck["snap_rho"] = snaps[:, 1:].reshape(len(snaps), *ck["rho"].shape)


def save_state(cp: CoupledProblem, out: Path, step: int, history: list[dict[str, float]],
               snapshots: list[Snapshot] | None = None, wall: float = 0.0) -> None:
    """Write the checkpoint, atomically and durably, in O(size of ρ) per call.

    ``checkpoint/state.npz`` holds ρ per block (global, Θ order), the Θ points, the step, the history keys, the
    wall seconds so far (``wall_s``) and how many history rows (``n_history``) and ρ snapshots (``n_snapshots``)
    are valid; the rows and snapshots not yet on disk are appended to ``history.f8`` and ``snapshots.f8`` first
    (each written once: the files are a prefix of ``history`` and ``snapshots``, cut back on resume).

    Raises:
        ConfigError: on every rank, if rank 0 could not write (a full disk).
    """
    snapshots = snapshots or []
    rho = np.stack([cp.theta.gather_values(r) for r in cp.rhos])
    keys = list(history[0].keys()) if history else list(HISTORY_KEYS)
    err, d = "", out / "checkpoint"
    if cp.comm.rank == 0:
        try:
            d.mkdir(parents=True, exist_ok=True)
            for name, rows in ((HISTORY_FILE, [[h[k] for k in keys] for h in history]),
                               (SNAPSHOT_FILE, [np.concatenate([[st], v.ravel()]) for st, v in snapshots])):
                width = len(keys) if name == HISTORY_FILE else 1 + rho.size
                done = min((d / name).stat().st_size // (8 * width), len(rows)) if (d / name).exists() else 0
                append_records(d / name, np.array(rows[done:], dtype=float).reshape(-1, width), done)
        except OSError as e:
            err = f"cannot write the checkpoint in {str(d)!r}: {e.strerror or e}"
    err = cp.comm.bcast(err, root=0)
    if err:
        raise ConfigError(err)
    save_checkpoint(out, {"rho": rho, "theta": cp.theta.points, "omega": np.array(token_space_fingerprint(cp.sec)),
                          "step": np.array(step), "history_keys": np.array(keys),
                          "n_history": np.array(len(history)), "n_snapshots": np.array(len(snapshots)),
                          "wall_s": np.array(wall)}, cp.comm)


def cut_appended(out: Path, step0: int, comm: MPI.Comm) -> None:
    """Cut the append-only checkpoint files back to the rows and snapshots before ``step0`` (a resumed run)."""
    if comm.rank != 0:
        return
    d = out / "checkpoint"
    with np.load(d / "state.npz") as z:
        if "n_history" not in z.files:
            return
        keys, n_rho = z["history_keys"].tolist(), z["rho"].size
    for name, w in ((HISTORY_FILE, len(keys)), (SNAPSHOT_FILE, 1 + n_rho)):
        rows = read_records(d / name, (d / name).stat().st_size // (8 * w), w) if (d / name).exists() else None
        if rows is not None:
            col = keys.index("step") if name == HISTORY_FILE else 0
            with open(d / name, "rb+") as f:
                f.truncate(int(np.sum(rows[:, col] < step0)) * 8 * w)
                os.fsync(f.fileno())


def _history_lines(rows: list[dict[str, float]], keys: list[str], header: bool) -> str:
    """Rows of ``history.csv`` (12 significant digits), with the header line first if asked."""
    buf = io.StringIO()
    w = csv.writer(buf)
    if header:
        w.writerow(keys)
    for h in rows:
        w.writerow([int(h["step"]) if k == "step" else f"{h[k]:.12g}" for k in keys])
    return buf.getvalue()


def start_history(out: Path, history: list[dict[str, float]], keys: list[str], comm: MPI.Comm) -> None:
    """Write ``history.csv``: the header (``keys``) and the rows so far (a resumed run's), atomically from rank 0.

    A resumed run thereby repairs a file torn by a killed job (a last line cut mid-row) and drops the rows
    after its checkpoint, which it computes again.

    Raises:
        ConfigError: on every rank, if rank 0 could not write.
    """
    write_atomic(out / "history.csv", _history_lines(history, keys, True), comm)


def append_history(out: Path, row: dict[str, float], keys: list[str], comm: MPI.Comm) -> None:
    """Append ``row`` to ``history.csv`` (started by :func:`start_history`) and flush it to disk (rank 0).

    Called at every output step, so ``tail -f`` follows a run; a line torn by a killed job is repaired by
    :func:`start_history` on ``--resume``.

    Raises:
        ConfigError: on every rank, if rank 0 could not write (a full disk).
    """
    err, path = "", out / "history.csv"
    if comm.rank == 0:
        try:
            with open(path, "a", newline="") as f:
                f.write(_history_lines([row], keys, False))
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            err = f"cannot write {str(path)!r}: {e.strerror or e}"
    err = comm.bcast(err, root=0)
    if err:
        raise ConfigError(err)


def write_plots(cp: CoupledProblem, out: Path, history: list[dict[str, float]], rho_snaps: list[Snapshot],
                snaps: Snapshots, yhat: np.ndarray, rate: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the plots of the current output step (collective: gathers on every rank, each figure drawn by one).

    Figure k of :data:`~mfpde.plots.FIGURES` is drawn on rank k mod size, so that on 2 or more ranks the
    figures are drawn at the same time (they cost a third of a small run's wall time on one rank). A plot
    that fails is logged as a warning (by rank 0, for every rank): it never stops the run nor leaves the
    other ranks waiting.

    Args:
        cp: the coupled problem (ρ and Φ of the current step).
        out: the output directory (plots go to ``out/plots``).
        history: the history rows so far.
        rho_snaps: (step, ρ per block, shape (n_layers, N_θ)) at the output steps so far.
        snaps: μ_t of the samples of :func:`plot_samples` (this rank group's; gathered here).
        yhat: ŷ of the training samples, shape (n,).
        rate: the report's rate block (default: :func:`rate_block` of ``history``).

    Returns:
        The rate block drawn.
    """
    st, pb, sec = cp.state, cp.problem, cp.sec
    rate = rate_block(cp, history) if rate is None else rate
    p = np.stack([cp.theta.gather_values(gibbs(cp.theta.V, phi, st.lam)) for phi in st.phis]) if st.lam > 0 else None
    ones = dolfinx.fem.Function(pb.tokens.W)
    ones.x.array[:] = 1.0
    mass = pb.tokens.quad.gather(ones)  # the lumped mass of each token node (density = weight / mass)
    comm = cp.comm
    mine = tuple(f for k, f in enumerate(FIGURES) if k % comm.size == comm.rank)
    merged = cp.objective.gather_snapshots(snaps, root=FIGURES.index("tokens") % comm.size)
    rho = tok = None
    if "rho" in mine:
        rho = RhoSeries(cp.theta.points, [k * sec.training.ds for k, _ in rho_snaps], [v for _, v in rho_snaps], p)
    if "tokens" in mine:
        tok = TokenSeries(pb.tokens.quad.points, mass, cp.objective.snapshot_depths)
        for i in sorted(merged):
            y = pb.train[i].target
            name = f"class {sec.data.classes[int(y > 0)]}" if sec.data.kind == "digits" else f"sample {i}"
            tok.weights.append(np.stack(merged[i]))
            tok.labels.append(f"{name} (y = {y:+g})")
            tok.yhat.append(float(yhat[i]))
    error = None
    if mine:
        try:
            plot_run(out, history, rate, rho, tok, st.lam, certificate_bound(cp)[0], figures=mine)
        except Exception as e:  # noqa: BLE001  a plot never stops a run, nor leaves the other ranks waiting
            error = f"{', '.join(mine)} on rank {comm.rank}: {type(e).__name__}: {e}"
    for err in filter(None, comm.gather(error, root=0) or []):
        logger.warning("plots not written at step %d: %s", int(history[-1]["step"]), err)
    return rate


def write_predictions(out: Path, targets: dict[str, np.ndarray], yhat0: dict[str, np.ndarray],
                      yhat: dict[str, np.ndarray], comm: MPI.Comm) -> None:
    """Write ``predictions.csv``: ``sample, split, target, yhat_initial, yhat_final`` (ŷ of ρ₀ and of ρ_S).

    ``sample`` is the index within its split (its "time" in ``fields/mu_T_<split>.bp``); 17 significant digits.
    """
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["sample", "split", "target", "yhat_initial", "yhat_final"])
    for k in ("train", "test"):
        for i, t in enumerate(targets.get(k, [])):
            w.writerow([i, k, f"{t:.17g}", f"{yhat0[k][i]:.17g}" if k in yhat0 else "", f"{yhat[k][i]:.17g}"])
    write_atomic(out / "predictions.csv", buf.getvalue(), comm)
