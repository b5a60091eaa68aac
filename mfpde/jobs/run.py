"""The ``run`` job (interface.md): train ρ by splitting and write history, checkpoints, fields, plots, report.

Each training step evaluates the token half at ρ_s (every sample forward in depth, taped, and its discrete
adjoint backward: R, δR/δρ and Φ_s = δR/δρ + (λ₂/2)|θ|², theory §3, §4), records a history row every
``output.every`` steps and a checkpoint every ``output.checkpoint_every`` steps, then advances ρ by the
splitting scheme of :mod:`mfpde.training.splitting`. The last evaluation also gives, once, what the
final outputs need: ŷ of the training samples (accuracy), ∂ŷ^i/∂c (the NTK) and μ_T fields. The held-out
samples are transported once. Every output step also writes the plots (:mod:`mfpde.plots`: loss, ρ_s
with its Gibbs measure, μ_t of a few training samples of each class), so a run that fails has them.

A numerical failure stops the run with the last good ρ restored and checkpointed, and a report with
status "failed" (the CLI turns it into exit status 3).
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mpi4py import MPI

import numpy as np

from mfpde import signals
from mfpde.config import Config
from mfpde.config.keys import to_toml
from mfpde.errors import ConfigError, InputRefused, NumericalError
from mfpde.fields import FieldFiles, FieldWriter
from mfpde.io import write_report
from mfpde.jobs.records import (
    Resumed,
    Snapshot,
    append_history,
    check_resume_config,
    load_resume,
    save_state,
    start_history,
    write_plots,
    write_predictions,
)
from mfpde.jobs.scaffold import JobDir, refuse_finished
from mfpde.progress import Progress, ProgressFactory
from mfpde.tokens.box.adjoint import Gradient
from mfpde.tokens.box.tape import TapeTooSmall
from mfpde.training.history import classification, history_columns, history_row, plot_samples
from mfpde.training.objective import Snapshots, ntk_gram
from mfpde.training.problem import CoupledProblem
from mfpde.training.report import OUTFLOW_WARN, accuracy_block, run_report
from mfpde.training.theory import deep_rate, ntk_summary

__all__ = ["Progress", "RunResult", "run_job", "run_training", "train"]

logger = logging.getLogger(__name__)


@dataclass
class RunResult:
    """What a run produced.

    Attributes:
        status: ``"ok"``, ``"failed"`` or ``"interrupted"`` (by a signal: the checkpoint is at ``steps_done``);
            steps_done: the last training step reached.
        report: the report written to ``report.json``; history: the history rows.
        out: the output directory; error: the failure message ("" when ok).
        timings: wall seconds per splitting sub-flow (the timing monitor).
        rho: the nodal values of the last ρ (the trained one, or the last good one of a failed run) per layer
            block, shape (L, N_θ), a density on Θ (∫ρ = 1), on every rank.
        theta_points: the Θ nodes of ``rho``'s columns, shape (N_θ, p).
    """

    status: str
    steps_done: int
    report: dict[str, Any]
    history: list[dict[str, float]]
    out: Path
    error: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    rho: np.ndarray | None = None
    theta_points: np.ndarray | None = None


def run_job(cfg: Config, out: Path, resume: bool = False, comm: MPI.Comm = MPI.COMM_WORLD,
            progress: ProgressFactory | None = None, overwrite: bool = True) -> RunResult:
    """Validate the input, load the checkpoint if resuming, prepare DIR, write the config, and :func:`train`.

    Args:
        cfg: the config.
        out: the output directory.
        resume: continue from ``out/checkpoint``.
        comm: the ranks.
        progress: makes the progress display, or None.
        overwrite: replace a finished run in ``out`` (``report.json`` with status "ok"); the CLI passes its
            ``--overwrite`` flag, so that ``mfpde run`` refuses one unless told (or ``--resume``).

    Raises:
        ConfigError: invalid input, a missing or incompatible checkpoint, a finished run in ``out`` without
            ``overwrite`` or ``resume`` (nothing is written).
    """
    t0 = time.perf_counter()
    out = Path(out)
    if not (resume or overwrite):
        refuse_finished(out, comm)
    with signals.stage("set-up"):  # a signal ends the set-up at once (signals.py): no checkpoint to write yet
        cp = CoupledProblem.from_config(cfg, comm)
        before = check_resume_config(to_toml(cfg), out, comm) if resume else None
        r = load_resume(cp, out) if resume else Resumed(0, [], [], 0.0)
        notes = []
        if resume and before is not None and before != cfg.training.steps:
            notes.append(f"--resume: training.steps = {cfg.training.steps} differs from the checkpoint's run "
                         f"({before}): training continues from step {r.step} to step {cfg.training.steps}")
            logger.warning("%s", notes[-1])
        t0 -= r.wall_s  # wall time accumulates over resumed runs (up to their last checkpoint)
        JobDir(cfg, out, comm, "run", keep=resume)  # DIR as a transaction, the resolved config
    with signals.deferred():  # a first signal stops the run after its current step (signals.py)
        return train(cp, out, r.step, r.history, t0, progress, r.snapshots,
                     {"from_step": r.step, "previous_steps": before, "steps": cfg.training.steps, "notes": notes}
                     if resume else None)


def run_training(cfg: Config, out: Path, resume: bool = False, comm: MPI.Comm = MPI.COMM_WORLD,
                 quiet: bool = False) -> int:
    """:func:`run_job` without progress display, returning the exit status of interface.md (0 or 3).

    ``quiet`` is accepted for compatibility; a library call never shows progress.

    Raises:
        ConfigError: invalid input (exit status 2).
    """
    return 0 if run_job(cfg, out, resume, comm).status == "ok" else 3


def train(cp: CoupledProblem, out: Path, step0: int = 0, history: list[dict[str, float]] | None = None,
          t0: float | None = None, progress: ProgressFactory | None = None,
          rho_snapshots: list[Snapshot] | None = None, resumed: dict[str, Any] | None = None) -> RunResult:
    """Train from step ``step0`` to ``training.steps``, writing into ``out`` (prepared by the caller).

    Args:
        cp: the coupled problem (ρ at step ``step0``).
        out: the output directory.
        step0: the step a resumed run starts at (0 for a new run).
        history: the history rows before ``step0``.
        t0: ``time.perf_counter()`` at the start of the job (wall times are measured from it).
        progress: makes the progress display, or None.
        rho_snapshots: the ρ snapshots written to ``fields/rho.bp`` before ``step0`` (a resumed run rewrites
            them first, so that the file holds every output step, as after an uninterrupted run).
        resumed: a resumed run's ``from_step``, ``previous_steps`` (the checkpoint's run's ``training.steps``),
            ``steps`` and ``notes`` (warnings), recorded in the report's ``resumed`` block.

    Returns:
        The result; ``report.json``, ``history.csv`` and the checkpoint are written whatever the status. Under
        :func:`mfpde.signals.deferred` (as :func:`run_job` calls it) a signal stops the loop before the next step
        on every rank: status "interrupted", the checkpoint at that step.
    """
    sec, comm = cp.sec, cp.comm
    tr, oc = sec.training, sec.output
    t0 = time.perf_counter() if t0 is None else t0
    history = [] if history is None else history
    splitting = cp.splitting()
    rho_snaps = [] if rho_snapshots is None else rho_snapshots
    writer = FieldWriter(comm, out / "fields" / "rho.bp", cp.rhos) if oc.fields else None
    if writer is not None and rho_snaps:  # a new VTX file starts empty: write the earlier snapshots again
        now = cp.state.values()
        for st, values in rho_snaps:
            for k, r in enumerate(cp.rhos):
                cp.theta.set_values(r, values[k])
            writer.write(st * tr.ds)
        cp.state.restore(now)
    columns = history_columns(cp)
    start_history(out, history, columns, comm)  # a resumed run's rows: a line torn by a killed job is repaired
    yhat0: dict[str, np.ndarray] = {}  # ŷ of ρ₀ per split, kept from step 0
    yhat_test: dict[str, np.ndarray] = {}
    bar = progress(tr.steps, step0) if progress is not None else None
    status, fail_msg, last, agreed, outflow = "ok", "", None, False, 0.0
    step, grad = step0, None
    last_plot: tuple[Snapshots, np.ndarray] | None = None
    try:
        for step in range(step0, tr.steps + 1):
            if sig := signals.requested(comm):  # every rank stops before the same step: checkpoint and report
                done = f"{step} training step{'' if step == 1 else 's'}"
                status, fail_msg = "interrupted", f"{signals.name(sig)} after {done}"
                save_state(cp, out, step, history, rho_snaps, time.perf_counter() - t0)
                break
            heads = cp.heads()
            output = step % oc.every == 0 or step == tr.steps
            snaps: Snapshots = {}
            keep = plot_samples(cp) if oc.plots and output else []  # μ_t of the last output step: for the plots
            try:
                if step == tr.steps:  # the last evaluation also gives the final outputs of the training set
                    grad = cp.objective.gradient(heads, per_sample=True, fields=_fields(cp, out), tag="train",
                                                 snapshots=snaps, snapshot=keep)
                else:
                    grad = cp.objective.gradient(heads, snapshots=snaps, snapshot=keep)
            except TapeTooSmall as e:  # in a fresh run's first evaluation nothing is computed yet: a refusal
                if step == 0:
                    raise InputRefused(str(e)) from e
                raise
            if not np.isfinite(grad.risk) or not all(np.all(np.isfinite(d)) for d in grad.D):
                raise NumericalError("non-finite risk or first variation")
            outflow = cp.objective.max_outflow  # of the training samples (history_row's held-out ones follow)
            cp.state.set_potentials(heads, grad.D)
            last = cp.state.values()
            if output:
                row = history_row(cp, grad, step, step * tr.ds, time.perf_counter() - t0,
                                  _fields(cp, out) if step == tr.steps else None, yhat_test)
                if step == 0:
                    yhat0.update(train=grad.yhat.copy(), **yhat_test)
                bad = [k for k, v in row.items() if not np.isfinite(v)]
                if bad:  # e.g. an extreme training.lambda2: never a status "ok" with inf/NaN in the history
                    raise NumericalError(f"non-finite {', '.join(bad)}")
                history.append(row)
                append_history(out, row, columns, comm)
                if writer is not None:
                    _write(writer, step * tr.ds, cp, out, step, history, rho_snaps, time.perf_counter() - t0)
                if writer is not None or oc.plots:
                    rho_snaps.append((step, np.stack([cp.theta.gather_values(r) for r in cp.rhos])))
                last_plot = (snaps, grad.yhat)  # drawn at the end, when the run stops, or every plots_every steps
                if oc.plots and oc.plots_every > 0 and step % oc.plots_every == 0 and step < tr.steps:
                    write_plots(cp, out, history, rho_snaps, snaps, grad.yhat)
                logger.info("step %d s=%.4g risk=%.6g F=%.6g min_rho=%.3g |grad|=%.3g", step, step * tr.ds,
                            row["risk"], row["free_energy"], row["min_rho"], row["grad_norm"])
            if step > 0 and (step % oc.checkpoint_every == 0 or step == tr.steps):
                save_state(cp, out, step, history, rho_snaps, time.perf_counter() - t0)
            if step == tr.steps:
                break
            splitting.step(tr.ds)
            if bar is not None:
                bar.update(1)
        agreed = True
    except NumericalError as e:  # SolverError included
        status, fail_msg = "failed", f"{e} (training step {step}, s = {step * tr.ds:.6g})"
        if last is not None:
            cp.state.restore(last)
        save_state(cp, out, step, history, rho_snaps, time.perf_counter() - t0)
        agreed = True
    except ConfigError:  # raised on every rank (the solves' refusals cross the rank groups): close the files first
        agreed = True
        raise
    finally:
        # Closing the VTX file is collective: after an unexpected exception on one rank (a bug; the CLI aborts
        # the job) the others wait in another collective, and closing here would hang this rank with them.
        if writer is not None and (agreed or comm.size == 1):
            writer.close()
        if bar is not None:
            bar.close()
    report = run_report(cp, history, status, step, time.perf_counter() - t0)
    report["final"]["token_outflow"] = outflow
    report["tape"] = reduced_tape(cp.objective.tape_stats, comm, cp.objective.tokens.comm.rank == 0)
    if outflow > OUTFLOW_WARN:
        report["warnings"].append(f"tokens.box: up to {outflow:.3g} of a sample's token mass left Ω (the largest over "
                                  "the training samples at the last step): enlarge tokens.box")
    if resumed is not None:
        report["resumed"] = {k: v for k, v in resumed.items() if k != "notes"}
        report["warnings"] += resumed["notes"]
    if status != "ok":
        report["error" if status == "failed" else "interrupted_by"] = fail_msg
        if oc.plots and last_plot is not None and agreed:  # the plots of the last output step
            write_plots(cp, out, history, rho_snaps, *last_plot)
        write_report(out, report, comm)
        return RunResult(status, step, report, history, out, fail_msg, splitting.timings, *_rho(cp))
    assert grad is not None
    _final_outputs(cp, out, report, grad, yhat0, yhat_test)
    if oc.plots:  # drawn once, at the end (the deep λ = λ₂ = 0 rate comes from the final NTK)
        write_plots(cp, out, history, rho_snaps, snaps, grad.yhat, report["rate"])
    report["wall_s"] = time.perf_counter() - t0  # the final outputs (NTK, held-out samples, plots) included
    write_report(out, report, comm)
    acc = report.get("accuracy", {})
    logger.info("done: %d steps, risk %.6g, free energy %.6g%s -> %s", step, report["final"]["risk"],
                report["final"]["free_energy"],
                "".join(f", {k} accuracy {acc[k]:.3f} (ρ_0: {v0:.3f}, ρ_0 or its sign flip: {b:.3f})"
                        for k, b in acc.get("initial_best_sign", {}).items()
                        if (v0 := acc["initial"].get(k)) is not None),
                out)
    for w in report["warnings"]:
        if not (resumed and w in resumed["notes"]):  # logged when the run resumed
            logger.warning("warning: %s", w)
    logger.debug("splitting sub-flow wall times: %s", splitting.timings)
    return RunResult(status, step, report, history, out, "", splitting.timings, *_rho(cp))


def _rho(cp: CoupledProblem) -> tuple[np.ndarray, np.ndarray]:
    """The global nodal values of ρ per layer block, shape (L, N_θ), and the Θ nodes, shape (N_θ, p)."""
    return np.stack([cp.theta.gather_values(r) for r in cp.rhos]), cp.theta.points


def _write(writer: FieldWriter, t: float, cp: CoupledProblem, out: Path, step: int, history: list[dict[str, float]],
           rho_snaps: list[Snapshot], wall: float) -> None:
    """Write ρ to ``fields/rho.bp``; if it cannot be written (a full disk), checkpoint ρ of this step and raise.

    Raises:
        ConfigError: on every rank, naming the file (:meth:`mfpde.fields.FieldWriter.write`).
    """
    try:
        writer.write(t)
    except ConfigError:
        with contextlib.suppress(ConfigError):  # the checkpoint is small: it may fit where the fields did not
            save_state(cp, out, step, history[:-1], rho_snaps, wall)
        raise


def _fields(cp: CoupledProblem, out: Path) -> FieldFiles | None:
    return FieldFiles(out) if cp.sec.output.fields else None


def _final_outputs(cp: CoupledProblem, out: Path, report: dict[str, Any], grad: Gradient,
                   yhat0: dict[str, np.ndarray], yhat_test: dict[str, np.ndarray]) -> None:
    """NTK, ``predictions.csv``, and the accuracy on classification data (of ρ₀ and of the final ρ).

    The training and the held-out samples were solved (μ_T written) by the last step's gradient and history row
    (``yhat_test``: its held-out ŷ); ``yhat0`` holds ŷ of ρ₀ from step 0 (computed here for a resumed run).
    """
    sec, pb = cp.sec, cp.problem
    heads = cp.heads()
    assert grad.Dy is not None
    K = ntk_gram(cp.theta, cp.rhos, heads, grad.Dy)
    n = len(pb.train)
    ntk = ntk_summary(K, n, sec.training.steps * sec.training.ds)
    report["final"]["ntk_min_eigenvalue"] = ntk["min_eigenvalue"]
    report["final"]["ntk"] = ntk
    st, rate = cp.state, report["rate"]
    deep_unregularised = not pb.shallow and st.lam == 0 and st.lam2 == 0
    if "warning" in ntk:  # a warning where theory §5.5 is the theorem the run relies on
        (logger.warning if deep_unregularised else logger.debug)("%s", ntk["warning"])
    if deep_unregularised:  # theory §5.5: the local rate from the NTK
        theory, kind = deep_rate(ntk, n)
        rate.pop("theory_reason", None)
        rate["theory"] = theory
        rate["theory_kind" if theory is not None else "theory_reason"] = kind
    targets = {"train": np.array([s.target for s in pb.train]), "test": np.array([s.target for s in pb.test])}
    yhat = {"train": grad.yhat, **yhat_test}  # the held-out ŷ of the last history row (classification data)
    if "train" not in yhat0:  # a resumed run: ŷ of ρ₀ once more
        now = cp.state.values()
        cp.state.restore([cp.theta.gaussian(sec.heads.init["mean"], sec.heads.init["cov"]).x.array
                          for _ in cp.rhos])
        heads0 = cp.heads()
        yhat0.update({k: cp.objective.predict(v, heads0) for k, v in (("train", pb.train), ("test", pb.test))
                      if k in yhat})
        cp.state.restore(now)
    write_predictions(out, targets, yhat0, yhat, cp.comm)
    if classification(cp):
        report["accuracy"], warnings = accuracy_block(targets, yhat0, yhat)
        report["warnings"] += warnings


#: The tape's numbers that are the largest over the ranks (a rank's memory, its checkpoint spacing); the others
#: (sub-steps, segments, recomputed sub-steps) are counts summed over the samples of every group of ranks.
TAPE_MAX = ("tape_bytes", "budget_bytes", "checkpoint_every")


def reduced_tape(stats: dict[str, int], comm: MPI.Comm, leader: bool) -> dict[str, int]:
    """The ``tape`` block of the run report over all ranks (collective): it was rank 0's samples alone.

    Counts are summed over the groups of ranks that share a token mesh (each group's ``leader`` counts its samples
    once), so they are the same on any number of ranks; the bytes and the checkpoint spacing are the largest rank's
    (a rank's own memory: these depend on how the samples and the token mesh are distributed).
    """
    every = comm.allgather((dict(stats), leader))
    keys = sorted({k for d, _ in every for k in d})
    return {k: int(max(d.get(k, 0) for d, _ in every)) if k in TAPE_MAX else
            int(sum(d.get(k, 0) for d, lead in every if lead)) for k in keys}
