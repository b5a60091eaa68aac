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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from mpi4py import MPI

import numpy as np

from mfpde import signals
from mfpde.config import Config
from mfpde.config_keys import to_toml
from mfpde.errors import ConfigError, NumericalError
from mfpde.fields import FieldWriter
from mfpde.io import prepare_output_dir, write_atomic, write_report
from mfpde.tokens.adjoint import Gradient
from mfpde.training.objective import Snapshots, ntk_gram
from mfpde.training.problem import CoupledProblem
from mfpde.training.records import (
    Resumed,
    Snapshot,
    check_resume_config,
    classification,
    history_row,
    load_resume,
    plot_samples,
    run_report,
    save_state,
    write_history,
    write_plots,
)
from mfpde.training.theory import deep_rate, ntk_summary

__all__ = ["Progress", "RunResult", "run_job", "run_training", "train"]

logger = logging.getLogger(__name__)


class Progress(Protocol):
    """A progress display (e.g. a tqdm bar): one ``update`` per training step, then ``close``."""

    def update(self, n: int = 1) -> object:
        """Advance by n steps."""
        ...

    def close(self) -> None:
        """Finish the display."""
        ...


#: Makes a progress display from (total steps, steps already done); the CLI's is a tqdm bar.
ProgressFactory = Callable[[int, int], Progress]


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
            progress: ProgressFactory | None = None) -> RunResult:
    """Validate the input, load the checkpoint if resuming, prepare DIR, write the config, and :func:`train`.

    Raises:
        ConfigError: invalid input, a missing or incompatible checkpoint (nothing is written).
    """
    t0 = time.perf_counter()
    with signals.stage("set-up"):  # a signal ends the set-up at once (signals.py): no checkpoint to write yet
        cp = CoupledProblem(cfg, comm)
        out = Path(out)
        if resume:
            check_resume_config(to_toml(cfg), out, comm)
        r = load_resume(cp, out) if resume else Resumed(0, [], [], 0.0)
        t0 -= r.wall_s  # wall time accumulates over resumed runs (up to their last checkpoint)
        prepare_output_dir(out, comm, keep=resume)
        write_atomic(out / "config.toml", to_toml(cfg), comm)
    with signals.deferred():  # a first signal stops the run after its current step (signals.py)
        return train(cp, out, r.step, r.history, t0, progress, r.snapshots)


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
          rho_snapshots: list[Snapshot] | None = None) -> RunResult:
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

    Returns:
        The result; ``report.json``, ``history.csv`` and the checkpoint are written whatever the status. Under
        :func:`mfpde.signals.deferred` (as :func:`run_job` calls it) a signal stops the loop before the next step
        on every rank: status "interrupted", the checkpoint at that step.
    """
    cfg, comm = cp.cfg, cp.comm
    tr, oc = cfg.training, cfg.output
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
    bar = progress(tr.steps, step0) if progress is not None else None
    status, fail_msg, last, agreed = "ok", "", None, False
    step, grad = step0, None
    plotted: dict[str, Any] = {}
    try:
        for step in range(step0, tr.steps + 1):
            if sig := signals.requested(comm):  # every rank stops before the same step: checkpoint and report
                status, fail_msg = "interrupted", f"{signals.name(sig)} before training step {step}"
                save_state(cp, out, step, history, rho_snaps, time.perf_counter() - t0)
                break
            heads = cp.heads()
            output = step % oc.every == 0 or step == tr.steps
            snaps: Snapshots = {}
            keep = plot_samples(cp) if oc.plots and output else []
            if step == tr.steps:  # the last evaluation also gives the final outputs of the training set
                grad = cp.objective.gradient(heads, per_sample=True, fields=_fields(cp, out), tag="train_",
                                             snapshots=snaps, snapshot=keep)
            else:
                grad = cp.objective.gradient(heads, snapshots=snaps, snapshot=keep)
            if not np.isfinite(grad.risk) or not all(np.all(np.isfinite(d)) for d in grad.D):
                raise NumericalError("non-finite risk or first variation")
            cp.state.set_potentials(heads, grad.D)
            last = cp.state.values()
            if output:
                row = history_row(cp, grad, step, step * tr.ds, time.perf_counter() - t0,
                                  _fields(cp, out) if step == tr.steps else None)
                bad = [k for k, v in row.items() if not np.isfinite(v)]
                if bad:  # e.g. an extreme training.lambda2: never a status "ok" with inf/NaN in the history
                    raise NumericalError(f"non-finite {', '.join(bad)}")
                history.append(row)
                if writer is not None:
                    _write(writer, step * tr.ds, cp, out, step, history, rho_snaps, time.perf_counter() - t0)
                if writer is not None or oc.plots:
                    rho_snaps.append((step, np.stack([cp.theta.gather_values(r) for r in cp.rhos])))
                if oc.plots:
                    plotted = write_plots(cp, out, history, rho_snaps, snaps, grad.yhat)
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
    finally:
        # Closing the VTX file is collective: after an unexpected exception on one rank (a bug; the CLI aborts
        # the job) the others wait in another collective, and closing here would hang this rank with them.
        if writer is not None and (agreed or comm.size == 1):
            writer.close()
        if bar is not None:
            bar.close()
    write_history(out, history, comm)
    report = run_report(cp, history, status, step, time.perf_counter() - t0)
    if status != "ok":
        report["error" if status == "failed" else "interrupted_by"] = fail_msg
        write_report(out, report, comm)
        return RunResult(status, step, report, history, out, fail_msg, splitting.timings, *_rho(cp))
    assert grad is not None
    _final_outputs(cp, out, history, report, grad)
    if oc.plots and report["rate"] != plotted:  # the deep λ = λ₂ = 0 rate comes from the final NTK
        write_plots(cp, out, history, rho_snaps, snaps, grad.yhat, report["rate"])
    report["wall_s"] = time.perf_counter() - t0  # the final outputs (NTK, held-out samples, plots) included
    write_report(out, report, comm)
    acc = report.get("accuracy", {})
    logger.info("done: %d steps, risk %.6g, free energy %.6g%s -> %s", step, report["final"]["risk"],
                report["final"]["free_energy"], "".join(f", {k} accuracy {v:.3f} (ρ_0: {v0:.3f})" for k, v in
                                                        acc.items() if (v0 := acc["initial"].get(k)) is not None),
                out)
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


def _fields(cp: CoupledProblem, out: Path) -> Path | None:
    return out / "fields" if cp.cfg.output.fields else None


def _final_outputs(cp: CoupledProblem, out: Path, history: list[dict[str, float]], report: dict[str, Any],
                   grad: Gradient) -> None:
    """NTK, accuracy on classification data (of ρ_0 and of the final ρ from the first and the last history row).

    The training and the held-out samples were solved (μ_T written) by the last step's gradient and history row.
    """
    cfg, pb = cp.cfg, cp.problem
    heads = cp.heads()
    assert grad.Dy is not None
    K = ntk_gram(cp.theta, cp.rhos, heads, grad.Dy)
    n = len(pb.train)
    ntk = ntk_summary(K, n, cfg.training.steps * cfg.training.ds)
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
    acc: dict[str, Any] = {"train": float(np.mean(np.sign(grad.yhat) == np.sign([s.target for s in pb.train])))}
    if pb.test:  # the last history row (step = training.steps, every run's last) transported them
        assert history and history[-1]["step"] == cfg.training.steps and "test_accuracy" in history[-1]
        acc["test"] = history[-1]["test_accuracy"]
    if classification(cp):
        h0 = history[0] if history and history[0]["step"] == 0 else {}
        acc["initial"] = {k: h0[f"{k}_accuracy"] for k in ("train", "test") if f"{k}_accuracy" in h0}
        report["accuracy"] = acc
