"""``mfpde twin``: finite transformers (H heads, N tokens, L layers) beside the PDE, and their rates (theory §12).

The job (collective): check the ``[twin]`` section; run the PDE of the config into ``DIR/pde`` (or read a
finished run, ``--pde``) and the same PDE on twice the token cells per axis into ``DIR/pde-refined`` (Richardson:
the PDE's own discretisation error); train every size's seeds (the sizes split over the ranks, each size's numbers
independent of the rank that trains it); compare at every output step; fit the exponents; write ``report.json``,
``history.csv`` and ``plots/``.

Sweeps (each size swept with the other two at their limit or largest value):

* ``heads``: H from ``twin.heads`` at the token limit (a quadrature of μ_0, :mod:`mfpde.twin.tokens`) and the
  largest L: the risk gap |R_H − R(ρ_s)| of one seed and W1(ρ^H_s, ρ_s) (expected H^{−1/2}), the seed-mean bias
  |E R_H − R(ρ_s)| (expected H^{−1}), the mean gap of ŷ per input;
* ``tokens``: N from ``twin.tokens`` at the largest H and L, against the same network at the token limit with the
  same heads and Brownian increments (paired, so that the heads' own fluctuation cancels): expected N^{−1/2} for
  i.i.d. tokens;
* ``layers``: L from ``twin.layers`` at the largest H and the token limit, with the same heads and Brownian
  increments at every L: the depth error e_L = (R_L − R_L')/(1 − L/L') of each L against the next L' (exact for
  e_L = C/L; the heads' fluctuation, common to both, cancels; the gap to the PDE itself is in the history),
  expected L^{−1} (Euler in depth).

A gap not above twice the PDE's own discretisation error is flagged and left out of its fit.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from mpi4py import MPI

import numpy as np

from mfpde import signals
from mfpde.config import Config
from mfpde.errors import ConfigError, NumericalError
from mfpde.io import write_atomic, write_report
from mfpde.jobs.run import run_job
from mfpde.jobs.scaffold import refuse_finished
from mfpde.jobs.twin_runs import pde_config, reusable, same_problem
from mfpde.twin.config import Section as TwinSection
from mfpde.twin.pde import pde_error, read_pde
from mfpde.twin.report import compare, diverged, history_csv, token_w1, twin_warnings
from mfpde.twin.sizes import Size, network_spec, sweep_sizes, train_size

__all__ = ["Size", "check_twin", "network_spec", "sweep_sizes", "train_size", "twin_job"]

logger = logging.getLogger("mfpde")

#: Bytes per float64 of the attention's work arrays a seed, input, head and token pair holds at once (the logits,
#: the softmax and their cotangents, with one layer recomputed in the backward pass).
ATTENTION_BYTES = 8 * 4
#: Fraction of the node's memory one size's batch of seeds may take.
MEMORY_FRACTION = 0.5


def _node_memory() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        return math.inf


def check_twin(cfg: Config) -> None:
    """Refuse, naming the key, a ``[twin]`` section or a config the twin cannot mirror.

    Raises:
        ConfigError: the first problem found.
    """
    tw, t, d, h = cfg.twin, cfg.tokens, cfg.depth, cfg.heads
    shallow = d.model == "shallow"
    rules = [
        (t.domain == "box", "tokens.domain", f"the twin mirrors token boxes (d = 1, 2), not {t.domain!r}"),
        (cfg.data.kind in ("digits", "gaussian", "file"), "data.kind",
         f"the twin draws tokens from digits, Gaussian or file data, not {cfg.data.kind!r}"),
        (h.init.get("kind") == "gaussian", "heads.init",
         "the twin draws its heads from a Gaussian ρ₀ (kind 'gaussian')"),
        (not h.mesh, "heads.mesh", "the twin needs a box Θ (heads.box), not a mesh file"),
        (len(tw.heads) >= 1 and all(x >= 1 for x in tw.heads), "twin.heads",
         f"needs a non-empty list of head counts H >= 1, got {tw.heads}"),
        (len(tw.tokens) >= 1 and all(x >= 1 for x in tw.tokens), "twin.tokens",
         f"needs a non-empty list of token counts N >= 1, got {tw.tokens}"),
        (shallow or (len(tw.layers) >= 1 and all(x >= 1 for x in tw.layers)), "twin.layers",
         f"needs a non-empty list of layer counts L >= 1, got {tw.layers}"),
        (shallow or d.model != "depth-indexed" or all(x % d.layers == 0 for x in tw.layers), "twin.layers",
         f"each L must be a multiple of depth.layers = {d.layers} (the blocks of heads), got {tw.layers}"),
        (tw.seeds >= 2, "twin.seeds", f"needs at least 2 seeds (a standard error), got {tw.seeds}"),
        (tw.sampling in ("iid", "quantile"), "twin.sampling", f"must be 'iid' or 'quantile', got {tw.sampling!r}"),
        (tw.optimizer in ("langevin", "sgd", "adam"), "twin.optimizer",
         f"must be 'langevin', 'sgd' or 'adam', got {tw.optimizer!r}"),
        (tw.lr > 0 and math.isfinite(tw.lr), "twin.lr", f"must be > 0, got {tw.lr:g}"),
        (tw.trace >= 0, "twin.trace", f"must be >= 0, got {tw.trace}"),
        (cfg.training.steps >= 1, "training.steps", "the twin needs at least one training step"),
    ]
    for key, sizes in (("twin.heads", tw.heads), ("twin.tokens", tw.tokens), ("twin.layers", tw.layers)):
        rules.append((len(set(sizes)) == len(sizes) or (key == "twin.layers" and shallow), key,
                      f"lists a size twice ({sizes}): each size is one point of the fit"))
    found = [f"{key}: {msg}" for ok, key, msg in rules if not ok]
    if len(found) == 1:
        raise ConfigError(found[0])
    if found:
        from mfpde.errors import ConfigErrors

        raise ConfigErrors(found)


def _check_places(out: Path, pde_dir: Path | None) -> None:
    """Refuse a ``--pde`` run that the new result in ``out`` would move aside or write into.

    Raises:
        ConfigError: ``out`` is the PDE run's directory, inside it, or holds it.
    """
    if pde_dir is None:
        return
    o, d = out.resolve(), pde_dir.resolve()
    if o == d or d in o.parents or o in d.parents:
        raise ConfigError(f"--pde {str(pde_dir)!r} and --out {str(out)!r}: the twin's result would replace or write "
                          "into the PDE run it compares with; give another --out")


def _memory_check(sec: TwinSection, samples: tuple[list[Any], list[Any]]) -> None:
    """Refuse, before anything is allocated, a size whose batch of seeds would not fit the node's memory.

    Raises:
        ConfigError: naming twin.heads and twin.tokens, with the estimate.
    """
    from mfpde.twin.tokens import input_tokens

    n = max(len(samples[0]), len(samples[1]), 1)
    limit = max(input_tokens(samples[0][:8], 1, "limit", np.random.default_rng(0))[1].shape[1], 1)
    worst, what = 0.0, ""
    for sz in sweep_sizes(sec):
        N = sz.N or limit
        H = 1 if sec.heads.family == "value" else sz.H
        need = sec.twin.seeds * n * (H * N * N * ATTENTION_BYTES + (sz.L + 4) * N * sec.tokens.dim * 8 * 4)
        if need > worst:
            worst, what = need, f"H = {sz.H}, N = {N}, L = {sz.L}"
    if worst > MEMORY_FRACTION * _node_memory():
        raise ConfigError(f"twin.heads, twin.tokens: the largest twin ({what}, {sec.twin.seeds} seeds, {n} inputs) "
                          f"needs about {worst / 2**30:.3g} GiB, more than {MEMORY_FRACTION:g} of this node's "
                          f"{_node_memory() / 2**30:.3g} GiB: fewer heads, tokens or seeds")


def _label(sz: Size) -> str:
    return f"H = {sz.H}, N = {sz.N or 'limit'}, L = {sz.L}"


def twin_job(cfg: Config, out: Path, comm: MPI.Comm = MPI.COMM_WORLD, pde_dir: Path | None = None,
             overwrite: bool = True) -> int:
    """Run ``mfpde twin``: the PDE (or ``pde_dir``), the twins, the comparison. Returns the exit status (0, 3, 4).

    ``overwrite``: replace a finished twin in ``out`` (the command refuses one without ``--overwrite``).

    Raises:
        ConfigError: invalid input (nothing of the twin computed; DIR's previous result kept).
    """
    from mfpde.outdir import prepare_output_dir
    from mfpde.tokens.box.data import load_samples
    from mfpde.twin.config import section

    t0 = time.perf_counter()
    check_twin(cfg)
    sec = section(cfg)
    p = 1 if cfg.heads.family == "value" else 2
    notes: list[str] = []
    with signals.stage("set-up"):
        train, test = load_samples(sec)
        _memory_check(sec, (train, test))
        _check_places(out, pde_dir)
        fine_cfg, _ = pde_config(cfg, False)
        ref_cfg, why = pde_config(cfg, True)
        if why:
            notes.append(why)
        reuse = None
        if pde_dir is not None:
            same_problem(cfg, pde_dir)  # refused before DIR is touched
            read_pde(pde_dir, p)
            candidate = pde_dir.parent / "pde-refined"
            reuse = candidate if ref_cfg is not None and candidate.is_dir() and reusable(ref_cfg, candidate) else None
        if not overwrite:
            refuse_finished(out, comm)
        prepare_output_dir(out, comm)  # the previous result, its pde/ and pde-refined/ too, moved aside
        from mfpde.config.keys import to_toml

        write_atomic(out / "config.toml", to_toml(cfg), comm)
    with signals.deferred():  # from here a signal ends the training of the current size; the rest is written
        fine_dir = pde_dir or out / "pde"
        c0 = time.process_time()
        if pde_dir is None:
            logger.info("twin: the PDE run -> %s", fine_dir)
            run_pde(fine_cfg, fine_dir, comm)
        pde_cpu = comm.allreduce(time.process_time() - c0, op=MPI.SUM) if pde_dir is None else math.nan
        if reuse is not None:
            logger.info("twin: the PDE on twice the token cells: %s (a finished run of it)", reuse)
            ref_dir: Path | None = reuse
        else:
            logger.info("twin: the PDE on twice the token cells (its own discretisation error) -> %s",
                        out / "pde-refined")
            ref_dir = run_pde(ref_cfg, out / "pde-refined", comm)
        sizes = sweep_sizes(sec)
        unique = list(dict.fromkeys(sz.key for sz in sizes))
        trace = list(range(min(cfg.twin.trace, len(train))))
        mine: dict[tuple[int, int, int], Any] = {}
        for i, key in enumerate(unique):
            if i % comm.size != comm.rank or signals.pending():
                continue
            sz = next(s for s in sizes if s.key == key)
            t1, c1 = time.perf_counter(), time.process_time()
            mine[key] = train_size(sec, sz, (train, test), trace)
            mine[key].cpu_s = time.process_time() - c1
            r = mine[key].risk[:, -1]
            logger.info("twin: %s, %d seeds: risk %.6g, standard error %.2g (%.1f s)%s", _label(sz), cfg.twin.seeds,
                        r.mean(), r.std(ddof=1) / math.sqrt(len(r)), time.perf_counter() - t1,
                        " (diverged)" if mine[key].diverged else "")
        gathered = comm.gather(mine, root=0)
        sig = signals.requested(comm)
        outcome: tuple[int, str] | None = None
        try:
            if comm.rank == 0:
                assert gathered is not None
                hist: dict[tuple[int, int, int], Any] = {}
                for g in gathered:
                    hist.update(g)
                classify = cfg.data.kind == "digits" or (cfg.data.kind == "file" and all(
                    abs(s.target) == 1 for s in train + test))  # as the run reports accuracies
                for h in hist.values() if not classify else ():
                    h.train_acc, h.test_acc = np.full_like(h.risk, np.nan), np.full_like(h.risk, np.nan)
                outcome = (_finish(cfg, sec, out, sizes, hist, fine_dir, ref_dir, pde_cpu, sig, notes, t0, p), "")
        except ConfigError as e:  # a PDE run that cannot be read back: every rank says so
            outcome = (2, str(e))
            raise
        finally:
            code, msg = comm.bcast(outcome if comm.rank == 0 else None, root=0) or (1, "rank 0 failed")
    if msg and comm.rank != 0:
        raise ConfigError(msg)
    return int(code)


def _finish(cfg: Config, sec: TwinSection, out: Path, sizes: list[Size], hist: dict[tuple[int, int, int], Any],
            fine_dir: Path, ref_dir: Path | None, pde_cpu: float, sig: int, notes: list[str], t0: float, p: int) -> int:
    """Compare, write ``report.json``, ``history.csv`` and the plots (rank 0); the exit status."""
    from mfpde.plots import save_figure
    from mfpde.twin.plots import twin_figures

    pde = read_pde(fine_dir, p)
    refined = read_pde(ref_dir, p) if ref_dir is not None else None
    n_out = len(pde.steps)
    trained = {k: h for k, h in hist.items() if len(h.steps) == n_out and not h.failed}  # to the last step
    failed = [(sz, hist[sz.key].failed) for sz in sizes if sz.key in hist and hist[sz.key].failed]
    blown = [sz for sz in sizes if sz.key in trained and diverged(trained[sz.key], pde)]
    lost = {d.key for d in blown}
    complete = [sz for sz in sizes if sz.key in trained and sz.key not in lost
                and (sz.sweep != "tokens" or (sz.H, 0, sz.L) in trained and (sz.H, 0, sz.L) not in lost)]
    n_unique = len({sz.key for sz in sizes})
    status, error = "ok", ""
    if sig:
        status, error = "interrupted", f"{signals.name(sig)}: {len(trained)} of {n_unique} sizes trained to the end"
    elif failed:
        sz, why = failed[0]
        status, error = "failed", f"the twin of {_label(sz)}: {why}"
    elif trained and not complete and len(lost) == len(trained):
        status, error = "failed", ("every size of the twin diverged: the Euler–Maruyama step is not stable at "
                                   f"training.ds = {cfg.training.ds:g} for these networks")
    err = pde_error(pde, refined)
    report: dict[str, Any] = {"status": status, "command": "twin", "config": str(cfg.source),
                              "pde": {"dir": str(fine_dir), "refined_dir": str(ref_dir) if ref_dir else None,
                                      "risk_final": float(pde.risk[-1]), "discretisation_error": err,
                                      "risk_refined": float(refined.risk[-1]) if refined is not None else None,
                                      "cpu_s": pde_cpu},
                              "twin": {"optimizer": cfg.twin.optimizer, "sampling": cfg.twin.sampling,
                                       "seeds": cfg.twin.seeds}}
    exps, rows, summary = compare(sec, complete, trained, pde, err) if complete else ({}, [], {})
    report["exponents"] = exps
    report["tokens_T_w1"] = token_w1(complete, trained, pde) if complete else {}
    report["sizes"] = summary
    report["warnings"] = notes + (twin_warnings(sec, complete, trained, pde, exps) if complete else [])
    report["diverged"] = sorted({_label(sz) for sz in blown})
    for lab in reversed(report["diverged"]):
        h = trained[next(sz.key for sz in blown if _label(sz) == lab)]
        report["warnings"].insert(0, f"training.ds: the twin of {lab} diverged (its risk grew to "
                                  f"{np.nanmax(h.risk):.3g}): the Euler–Maruyama step Δs is not stable for this "
                                  "finite network (the PDE's implicit step is); left out of the comparison")
    if error:
        report["error" if status == "failed" else "interrupted_by"] = error
    report["wall_s"] = time.perf_counter() - t0
    if rows:
        write_atomic(out / "history.csv", history_csv(rows), MPI.COMM_SELF)
    if cfg.output.plots and complete:
        for name, fig in twin_figures(sec, complete, trained, pde, exps).items():
            save_figure(fig, out / "plots" / name, dpi=110)
    write_report(out, report, MPI.COMM_SELF)
    for sweep, q in exps.items():
        for name, f in q.items():
            if f["slope"] is not None:
                logger.info("twin: %s %s exponent %.3f ± %.3f (expected %s)", sweep, name, f["slope"], f["se"],
                            "none" if f["expected"] is None else f"{f['expected']:g}")
    for w in report["warnings"]:
        logger.warning("warning: %s", w)
    logger.info("twin: done (%s) -> %s", status, out)
    if status == "failed":
        print(f"mfpde: numerical failure: {error}; report.json and what was finished in {out}", file=sys.stderr)
        return 3
    if status == "interrupted":
        print(f"mfpde: interrupted by {error}: report.json and what was finished in {out}", file=sys.stderr)
        return signals.EXIT_INTERRUPTED
    return 0


def run_pde(cfg: Config | None, out: Path, comm: MPI.Comm) -> Path | None:
    """Run the PDE of ``cfg`` into ``out`` (None: nothing to run)."""
    from mfpde import signals
    from mfpde.errors import InputRefused

    if cfg is None:
        return None
    try:
        r = run_job(cfg, out, comm=comm)
    except InputRefused:
        raise
    except ConfigError as e:  # refused by the PDE's set-up (a datum outside Ω, ...): nothing of the twin computed
        raise InputRefused(str(e)) from None
    if r.status == "interrupted":
        raise signals.Interrupted(signals.requested(comm) or signals.pending())
    if r.status != "ok":
        raise NumericalError(f"the PDE run in {out} failed: {r.error}")
    return out
