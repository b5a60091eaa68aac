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

import csv
import io
import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpi4py import MPI

import numpy as np

from mfpde import signals
from mfpde.config import Config
from mfpde.errors import ConfigError, NumericalError
from mfpde.io import write_atomic, write_report

__all__ = ["check_twin", "twin_job"]

logger = logging.getLogger("mfpde")

#: Bytes per float64 of the attention's work arrays a seed, input, head and token pair holds at once (the logits,
#: the softmax and their cotangents, with one layer recomputed in the backward pass).
ATTENTION_BYTES = 8 * 4
#: Fraction of the node's memory one size's batch of seeds may take.
MEMORY_FRACTION = 0.5
#: Heads of the twin outside the Θ box (fraction, at the last step) above which the report names the box.
OUTSIDE_WARN = 1e-3
#: Outputs of the report: the sweeps and their quantities.
SWEEPS = ("heads", "tokens", "layers")


def _node_memory() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        return math.inf


def _limit_size(cfg: Config) -> int:
    """Tokens of the ``limit`` quadrature of the config's inputs (the most over the samples; no data read)."""
    from mfpde.twin.tokens import LIMIT_ORDER

    if cfg.data.kind == "digits":
        return 64 * LIMIT_ORDER**2
    if cfg.data.kind == "gaussian":
        return 24 if cfg.tokens.dim == 1 else 144
    return 0


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
    for ok, key, msg in rules:
        if not ok:
            raise ConfigError(f"{key}: {msg}")
    n = _samples_bound(cfg)
    H, N, L = max(tw.heads), max(max(tw.tokens), _limit_size(cfg)), 1 if shallow else max(tw.layers)
    heads_alike = h.family == "value"
    need = tw.seeds * n * (1 if heads_alike else H) * N * N * ATTENTION_BYTES + tw.seeds * n * N * L * t.dim * 8 * 4
    if need > MEMORY_FRACTION * _node_memory():
        raise ConfigError(f"twin.heads, twin.tokens: the largest twin (H = {H}, N = {N}, L = {L}, {tw.seeds} seeds, "
                          f"{n} inputs) needs about {need / 2**30:.3g} GiB, more than {MEMORY_FRACTION:g} of this "
                          f"node's {_node_memory() / 2**30:.3g} GiB: fewer heads, tokens or seeds")


def _samples_bound(cfg: Config) -> int:
    da = cfg.data
    if da.kind == "digits":
        return 400 if da.split > 0 else da.samples + da.test_samples  # a pair of digits: at most about 360 images
    if da.kind == "gaussian":
        return len(da.mean)
    return 1


@dataclass(frozen=True)
class Size:
    """One trained size: its sweep, H, N (0: the token limit), L."""

    sweep: str
    H: int
    N: int
    L: int

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.H, self.N, self.L)


def _sizes(cfg: Config) -> list[Size]:
    tw = cfg.twin
    shallow = cfg.depth.model == "shallow"
    Lmax = 1 if shallow else max(tw.layers)
    out = [Size("heads", H, 0, Lmax) for H in tw.heads]
    out += [Size("tokens", max(tw.heads), N, Lmax) for N in tw.tokens]
    if not shallow:
        out += [Size("layers", max(tw.heads), 0, L) for L in tw.layers]
    return out


def _spec(cfg: Config) -> Any:
    from mfpde.twin.network import NetworkSpec

    lo = cfg.loss
    return NetworkSpec(cfg.depth.model, cfg.heads.family, cfg.heads.a, cfg.depth.T,
                       cfg.depth.layers if cfg.depth.model == "depth-indexed" else 1, lo.readout,
                       tuple(lo.w) if lo.readout == "linear" else (), lo.b)


def _train_size(cfg: Config, size: Size, samples: tuple[list[Any], list[Any]], trace: list[int]) -> Any:
    """Train the seeds of one size (every rank may run any size: the numbers depend on the size only)."""
    import jax

    from mfpde.twin.network import make_network
    from mfpde.twin.tokens import draw_heads, input_tokens
    from mfpde.twin.train import Hyper, train_twin

    tw, tr, h = cfg.twin, cfg.training, cfg.heads
    spec = _spec(cfg)
    net = make_network(spec, size.L)
    S = tw.seeds
    train, test = samples
    sampling = "limit" if size.N == 0 else tw.sampling
    data: dict[str, Any] = {"y": np.array([s.target for s in train]), "y_test": np.array([s.target for s in test])}
    for split, ss in (("", train), ("_test", test)):
        if not ss:
            data["x" + split], data["w" + split] = np.zeros((0, 1, cfg.tokens.dim)), np.ones((0, 1))
            continue
        if sampling == "iid":  # each seed its own draws
            draws = [input_tokens(ss, size.N, "iid", np.random.default_rng([s, size.N, len(split)])) for s in range(S)]
            data["x" + split] = np.stack([x for x, _ in draws])
            data["w" + split] = np.stack([w for _, w in draws])
        else:
            data["x" + split], data["w" + split] = input_tokens(ss, size.N, sampling, np.random.default_rng(0))
    K = spec.blocks
    # heads and Brownian increments of a seed depend on (seed, H) only: the token and layer sweeps are paired
    theta0 = np.stack([draw_heads(h.init["mean"], h.init["cov"], np.asarray(h.box, float), (K, size.H),
                                  np.random.default_rng([s, size.H])) for s in range(S)])
    keys = jax.numpy.stack([jax.random.fold_in(jax.random.key(s), size.H) for s in range(S)])
    hyper = Hyper(tr.ds, tr.steps, cfg.output.every, tr.lam if tr.regularization == "entropic" else 0.0, tr.lambda2,
                  tw.optimizer, tw.lr)
    return train_twin(net, hyper, theta0, data, keys, trace=trace,
                      stop=lambda: signals.pending() != 0)


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


def _read_pde(out: Path, p: int, need_fields: bool = True) -> PdeRun:
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


#: Sections of a config that do not change the PDE's training (the comparison may differ there; output.every,
#: the steps the two are compared at, is checked on its own).
_NOT_THE_PROBLEM = ("twin", "output", "petsc")
_SECTION_ORDER = ("tokens", "data", "depth", "heads", "loss", "training")


def _shown(table: dict[str, Any], key: str) -> str:
    return repr(table[key]) if key in table else "(not set)"


def _same_problem(cfg: Config, pde_dir: Path) -> None:
    """Refuse a finished run whose config is not this one's problem (naming the first key that differs).

    Raises:
        ConfigError: no readable ``config.toml`` in ``pde_dir``, or a key of another value.
    """
    import json
    import tomllib

    from mfpde.config_keys import to_toml

    hint = f" (a twin's output: its PDE run is {str(pde_dir / 'pde')!r})" if (pde_dir / "pde").is_dir() else ""
    try:
        command = json.loads((pde_dir / "report.json").read_text()).get("command")
        theirs = tomllib.loads((pde_dir / "config.toml").read_text())
    except (OSError, ValueError, AttributeError):
        raise ConfigError(f"--pde {str(pde_dir)!r}: not a finished mfpde run (no readable report.json and "
                          f"config.toml){hint}") from None
    if command != "run":
        raise ConfigError(f"--pde {str(pde_dir)!r}: holds the result of `mfpde {command}`, not of `mfpde run`{hint}")
    mine = tomllib.loads(to_toml(cfg))
    first = ("domain", "kind", "model", "family", "dim", "readout")  # the keys that decide what the others mean
    for sec in [*_SECTION_ORDER, *sorted((set(mine) | set(theirs)) - set(_SECTION_ORDER))]:
        if sec in _NOT_THE_PROBLEM:
            continue
        a, b = mine.get(sec, {}), theirs.get(sec, {})
        for key in sorted(set(a) | set(b), key=lambda k: (k not in first, k)):
            if a.get(key) != b.get(key):
                raise ConfigError(f"--pde {str(pde_dir)!r}: {sec}.{key} = {_shown(b, key)} there, {_shown(a, key)} "
                                  "in this config: the twin compares with the PDE of the same problem")
    every = theirs.get("output", {}).get("every")
    if every != cfg.output.every:
        raise ConfigError(f"--pde {str(pde_dir)!r}: output.every = {every!r} there, {cfg.output.every} in this config: "
                          "the twin is compared with the PDE at the PDE's output steps (give the same output.every)")


def _refined_config(cfg: Config) -> Config | None:
    """The config on twice the token cells per axis (fields, no plots), or None where it cannot be refined."""
    import tomllib

    from mfpde.config import from_dict
    from mfpde.config_keys import to_toml

    if cfg.tokens.mesh:
        logger.warning("warning: tokens.mesh: a mesh file is not refined here: the PDE's own discretisation error "
                       "is not estimated (no gap is flagged)")
        return None
    raw = tomllib.loads(to_toml(cfg))
    raw["tokens"]["cells"] = [2 * c for c in cfg.tokens.cells]
    raw["output"].update(fields=True, plots=False)
    raw.pop("twin", None)
    try:
        return from_dict(raw, source=cfg.source)
    except ConfigError as e:
        logger.warning("warning: no refined PDE run for the discretisation error: %s", e)
        return None


def _reusable(cfg: Config, candidate: Path) -> bool:
    """Whether ``candidate`` holds a finished run of ``cfg`` (the refined PDE beside a ``--pde`` run of a twin)."""
    try:
        _same_problem(cfg, candidate)
        return True
    except ConfigError:
        return False


def _run_pde(cfg: Config | None, out: Path, comm: MPI.Comm) -> Path | None:
    """Run the PDE of ``cfg`` into ``out`` (None: nothing to run)."""
    from mfpde.training.driver import run_job

    if cfg is None:
        return None
    r = run_job(cfg, out, comm=comm)
    if r.status != "ok":
        raise NumericalError(f"the PDE run in {out} failed: {r.error}")
    return out


#: The least order in h of the PDE's outputs (DG0 upwind is first order; DG1 second, so p = 1 over-estimates there).
PDE_ORDER = 1.0


def _pde_error(run: PdeRun, refined: PdeRun | None) -> dict[str, float]:
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


def _expected(sweep: str, quantity: str, sampling: str) -> float | None:
    """The theory's exponent (theory §12) of a gap, or None where it states none."""
    if sweep == "heads":
        return -1.0 if quantity == "risk_bias" else -0.5
    if sweep == "tokens":
        return -0.5 if sampling == "iid" else None
    return -1.0


def _compare(cfg: Config, sizes: list[Size], hist: dict[tuple[int, int, int], Any], pde: PdeRun,
             err: dict[str, float]) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """Gaps per size, seed and output step; the fitted exponents; the history rows; the summary per size."""
    from mfpde.twin.compare import ProjectedDensity, fit_gaps

    tw = cfg.twin
    n_out = min(len(pde.steps), min(len(h.steps) for h in hist.values()))
    for h in hist.values():  # the same output steps on both sides (--pde checks output.every)
        if not np.array_equal(h.steps[:n_out], pde.steps[:n_out]):
            raise ConfigError(f"the PDE's output steps {pde.steps[:n_out].tolist()} are not the twin's "
                              f"{h.steps[:n_out].tolist()} (output.every)")
    proj = ([ProjectedDensity(pde.rho_points, pde.rho[k]) for k in range(n_out)]
            if pde.rho and len(pde.rho) >= n_out else [])
    rows: list[dict[str, Any]] = []
    final: dict[tuple[str, int, int, int], dict[str, Any]] = {}
    for sz in sizes:
        h = hist[sz.key]
        ref = hist.get((sz.H, 0, sz.L)) if sz.sweep == "tokens" else None
        S = h.risk.shape[0]
        w1 = np.full((S, n_out), np.nan)
        if proj and h.heads.shape[-1] == pde.rho_points.shape[1]:
            for k in range(n_out):
                for s in range(S):
                    w1[s, k] = proj[k].w1(h.heads[k, s, 0])
        gap = h.risk[:, :n_out] - pde.risk[None, :n_out]
        yg = np.mean(np.abs(h.yhat[:, n_out - 1] - pde.yhat[None]), axis=1)
        final[(sz.sweep, *sz.key)] = {
            "risk": gap[:, -1], "rho_w1": w1[:, -1], "yhat": yg,
            "paired_risk": (h.risk[:, n_out - 1] - ref.risk[:, n_out - 1]) if ref is not None else None,
            "paired_yhat": (np.mean(np.abs(h.yhat[:, n_out - 1] - ref.yhat[:, n_out - 1]), axis=1)
                            if ref is not None else None),
            "signed_yhat": np.mean(h.yhat[:, n_out - 1] - pde.yhat[None], axis=1)}
        for s in range(S):
            for k in range(n_out):
                rows.append({"sweep": sz.sweep, "heads": sz.H, "tokens": sz.N, "layers": sz.L, "seed": s,
                             "step": int(h.steps[k]), "s": h.steps[k] * cfg.training.ds, "risk": h.risk[s, k],
                             "test_risk": h.test_risk[s, k], "train_accuracy": h.train_acc[s, k],
                             "test_accuracy": h.test_acc[s, k], "pde_risk": pde.risk[k],
                             "pde_test_accuracy": pde.test_acc[k], "risk_gap": gap[s, k],
                             "rho_w1": w1[s, k], "yhat_gap": yg[s] if k == n_out - 1 else math.nan})
    exps: dict[str, Any] = {}
    n_last = n_out - 1
    for sweep in SWEEPS:
        mine = [sz for sz in sizes if sz.sweep == sweep]
        if not mine:
            continue
        xs = [sz.H if sweep == "heads" else sz.N if sweep == "tokens" else sz.L for sz in mine]
        got = [final[(sweep, *sz.key)] for sz in mine]
        q: dict[str, Any] = {}
        if sweep == "heads":
            q["risk"] = fit_gaps(xs, np.stack([g["risk"] for g in got]), err["risk"], -0.5)
            q["risk_bias"] = fit_gaps(xs, np.stack([g["risk"] for g in got]), err["risk"], -1.0, signed=True)
            if not np.all(np.isnan([g["rho_w1"] for g in got])):
                q["rho_w1"] = fit_gaps(xs, np.stack([g["rho_w1"] for g in got]), err["rho_w1"], -0.5)
            q["yhat"] = fit_gaps(xs, np.stack([g["yhat"] for g in got]), err["yhat"], -0.5)
        elif sweep == "tokens":
            e = _expected(sweep, "risk", tw.sampling)
            q["risk"] = fit_gaps(xs, np.stack([g["paired_risk"] for g in got]), 0.0, e)
            q["yhat"] = fit_gaps(xs, np.stack([g["paired_yhat"] for g in got]), 0.0, e)
        else:  # e_L ≈ (R_L − R_L')/(1 − L/L') for the next L' (exact for e_L = C/L), paired seeds
            order = np.argsort(xs)
            Ls = [xs[i] for i in order]
            r = [hist[mine[i].key].risk[:, n_last] for i in order]
            y = [hist[mine[i].key].yhat[:, n_last] for i in order]
            if len(Ls) >= 2:
                q["risk"] = fit_gaps(Ls[:-1], np.stack([(r[k] - r[k + 1]) / (1 - Ls[k] / Ls[k + 1])
                                                        for k in range(len(Ls) - 1)]), 0.0, -1.0, signed=True)
                q["yhat"] = fit_gaps(Ls[:-1], np.stack([np.mean(y[k] - y[k + 1], axis=1) / (1 - Ls[k] / Ls[k + 1])
                                                        for k in range(len(Ls) - 1)]), 0.0, -1.0, signed=True)
        exps[sweep] = q
    summary = {f"{sz.sweep}:H={sz.H},N={sz.N or 'limit'},L={sz.L}": {
        "risk_mean": float(hist[sz.key].risk[:, n_out - 1].mean()),
        "risk_se": float(hist[sz.key].risk[:, n_out - 1].std(ddof=1) / math.sqrt(tw.seeds)),
        "test_accuracy_mean": float(np.nanmean(hist[sz.key].test_acc[:, n_out - 1]))
        if np.isfinite(hist[sz.key].test_acc[:, n_out - 1]).any() else None,
        "train_accuracy_mean": float(hist[sz.key].train_acc[:, n_out - 1].mean()),
        "risk_seeds": hist[sz.key].risk[:, n_out - 1].tolist(), "cpu_s": hist[sz.key].cpu_s} for sz in sizes}
    return exps, rows, summary


def _mu_atoms(mu: Any, i: int) -> tuple[np.ndarray, np.ndarray]:
    """μ_T of training input i as atoms: the cell centroids, each with the cell's mass (the field's integral)."""
    x, c, v = np.asarray(mu.points[i]), np.asarray(mu.cells[i]), np.asarray(mu.values[i], float)
    d = 1 if np.allclose(x[:, 1:], 0.0) else 2
    p = x[c][:, :, :d]
    if d == 1:
        size = np.abs(p[:, -1, 0] - p[:, 0, 0])
    else:
        q = x[c]
        size = 0.5 * np.linalg.norm(np.sum(np.cross(q, np.roll(q, -1, axis=1)), axis=1), axis=1)
    dens = v if mu.cell_data else v[c].mean(axis=1)
    return p.mean(axis=1), np.maximum(dens * size, 0.0)


def _token_w1(sizes: list[Size], hist: dict[tuple[int, int, int], Any], pde: PdeRun) -> dict[str, Any]:
    """W1 (d = 1) or sliced W1 (d = 2) between the twins' token clouds at depth T and the PDE's μ_T.

    Per traced input (the mean over seeds), for the largest heads size and each tokens size.
    """
    from mfpde.twin.compare import w1_tokens

    if pde.mu_T is None:
        return {}
    out: dict[str, Any] = {}
    picks = [sz for sz in sizes if sz.sweep == "tokens"] + [max((s for s in sizes if s.sweep == "heads"),
                                                               key=lambda s: s.H, default=None)]
    for sz in picks:
        if sz is None:
            continue
        h = hist[sz.key]
        if h.tokens_T.size == 0:
            continue
        vals = []
        for i in range(h.tokens_T.shape[1]):
            pts, mass = _mu_atoms(pde.mu_T, i)
            vals.append(float(np.mean([w1_tokens(h.tokens_T[s, i], h.token_weights[s, i], pts, mass)
                                       for s in range(h.tokens_T.shape[0])])))
        out[f"H={sz.H},N={sz.N or 'limit'},L={sz.L}"] = vals
    return out


def _warnings(cfg: Config, sizes: list[Size], hist: dict[tuple[int, int, int], Any], pde: PdeRun,
              exps: dict[str, Any]) -> list[str]:
    """Where the limit is the wrong model, or the discretisation decides the answer: say so."""
    out = []
    box = np.asarray(cfg.heads.box, float)
    worst = 0.0
    for sz in sizes:
        th = hist[sz.key].heads[-1]
        outside = np.any((th < box[:, 0]) | (th > box[:, 1]), axis=-1)
        worst = max(worst, float(outside.mean()))
    if worst > OUTSIDE_WARN:
        edge = _boundary_mass(pde)
        out.append(f"heads.box: up to {worst:.3g} of the twin's heads are outside Θ at the last step (particles have "
                   f"no box; the PDE's ρ has a no-flux boundary, mass {edge:.3g} in its boundary cells): the gaps "
                   "stop falling where the box, not the model, decides ρ; enlarge heads.box")
    outflow = float(pde.report.get("final", {}).get("token_outflow", 0.0) or 0.0)
    if outflow > 1e-3:
        out.append(f"tokens.box: up to {outflow:.3g} of a sample's token mass left Ω in the PDE (the twin's tokens are "
                   "never lost): enlarge tokens.box")
    key = {"heads": "twin.heads", "tokens": "twin.tokens", "layers": "twin.layers"}
    for sweep, q in exps.items():
        if q and all(fit["note"] == "a single size: no exponent" for fit in q.values()):
            out.append(f"{key[sweep]}: a single size: no exponents of the {sweep} sweep")
            continue
        for name, fit in q.items():
            if fit["note"]:
                out.append(f"{key[sweep]}: {name}: {fit['note']}")
    return out


def _boundary_mass(pde: PdeRun) -> float:
    """The PDE's ρ mass in the cells at the boundary of Θ at the last step (nodal values × cell size)."""
    if not pde.rho:
        return math.nan
    pts, r = pde.rho_points, np.maximum(pde.rho[-1], 0.0)
    lo, hi = pts.min(axis=0), pts.max(axis=0)
    h = np.array([np.diff(np.unique(np.round(pts[:, j], 12))).min() for j in range(pts.shape[1])])
    edge = np.any((pts <= lo + 1.5 * h) | (pts >= hi - 1.5 * h), axis=1)
    return float((r[edge].sum()) / r.sum())


#: A twin whose risk ends above this multiple of the largest of its own initial risk and the PDE's has diverged.
DIVERGED = 10.0


def _diverged(h: Any, pde: PdeRun) -> bool:
    """Whether a size's explicit training blew up (its final risk far above where it and the PDE started)."""
    top = DIVERGED * max(float(np.nanmax(h.risk[:, 0])), float(np.nanmax(pde.risk)))
    return bool(h.diverged or np.any(~np.isfinite(h.risk[:, -1])) or np.nanmax(h.risk[:, -1]) > top)


def _write_history(out: Path, rows: list[dict[str, Any]], comm: MPI.Comm) -> None:
    if not rows:
        return
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: (f"{v:.12g}" if isinstance(v, float) else v) for k, v in r.items()})
    write_atomic(out / "history.csv", buf.getvalue(), comm)


def twin_job(cfg: Config, out: Path, comm: MPI.Comm = MPI.COMM_WORLD, pde_dir: Path | None = None,
             overwrite: bool = True) -> int:
    """Run ``mfpde twin``: the PDE (or ``pde_dir``), the twins, the comparison. Returns the exit status (0, 3, 4).

    ``overwrite``: replace a finished twin in ``out`` (the command refuses one without ``--overwrite``).

    Raises:
        ConfigError: invalid input (nothing computed; DIR's previous result kept).
    """
    from mfpde.outdir import prepare_output_dir
    from mfpde.tokens.box.data import load_samples
    from mfpde.training.driver import _refuse_finished
    from mfpde.twin.plots import twin_plots

    t0 = time.perf_counter()
    check_twin(cfg)
    p = 1 if cfg.heads.family == "value" else 2
    with signals.stage("set-up"):
        train, test = load_samples(cfg)
        reuse = None
        if pde_dir is not None:
            _same_problem(cfg, pde_dir)  # refused before DIR is touched
            _read_pde(pde_dir, p)
            candidate = pde_dir.parent / "pde-refined"
            ref_cfg = _refined_config(cfg) if candidate.is_dir() else None
            reuse = candidate if ref_cfg is not None and _reusable(ref_cfg, candidate) else None
        if not overwrite:
            _refuse_finished(out, comm)
        prepare_output_dir(out, comm)
        if pde_dir is not None and comm.rank == 0:  # a previous twin's own PDE runs in DIR are not this result's
            import shutil

            keep = {pde_dir.resolve(), *([reuse.resolve()] if reuse is not None else [])}
            for stale in (out / "pde", out / "pde-refined"):
                if stale.is_dir() and stale.resolve() not in keep:
                    shutil.rmtree(stale, ignore_errors=True)
        from mfpde.config_keys import to_toml

        write_atomic(out / "config.toml", to_toml(cfg), comm)
    status, error = "ok", ""
    with signals.deferred():
        fine_dir = pde_dir or out / "pde"
        c0 = time.process_time()
        if pde_dir is None:
            logger.info("twin: the PDE run -> %s", fine_dir)
            _run_pde(cfg, fine_dir, comm)
        pde_cpu = comm.allreduce(time.process_time() - c0, op=MPI.SUM) if pde_dir is None else math.nan
        ref_cfg = _refined_config(cfg)
        if reuse is not None:
            logger.info("twin: the PDE on twice the token cells: %s (a finished run of it)", reuse)
            ref_dir: Path | None = reuse
        else:
            logger.info("twin: the PDE on twice the token cells (its own discretisation error) -> %s",
                        out / "pde-refined")
            ref_dir = _run_pde(ref_cfg, out / "pde-refined", comm) if not signals.requested(comm) else None
        pde = _read_pde(fine_dir, p) if comm.rank == 0 else None
        refined = _read_pde(ref_dir, p) if comm.rank == 0 and ref_dir is not None else None
        sizes = _sizes(cfg)
        unique = list(dict.fromkeys(sz.key for sz in sizes))
        trace = list(range(min(cfg.twin.trace, len(train))))
        mine: dict[tuple[int, int, int], Any] = {}
        for i, key in enumerate(unique):
            if i % comm.size != comm.rank or signals.pending():
                continue
            sz = next(s for s in sizes if s.key == key)
            t1, c1 = time.perf_counter(), time.process_time()
            mine[key] = _train_size(cfg, sz, (train, test), trace)
            mine[key].cpu_s = time.process_time() - c1
            r = mine[key].risk[:, -1]
            logger.info("twin: H=%d N=%s L=%d, %d seeds: risk %.6g, standard error %.2g (%.1f s)%s", sz.H,
                        sz.N or "limit", sz.L, cfg.twin.seeds, r.mean(), r.std(ddof=1) / math.sqrt(len(r)),
                        time.perf_counter() - t1, "" if np.all(np.isfinite(r)) and r.max() < 1e6 else " (diverged)")
        gathered = comm.gather(mine, root=0)
        sig = signals.requested(comm)
    if comm.rank != 0:
        return int(comm.bcast(None, root=0))
    assert gathered is not None and pde is not None
    hist: dict[tuple[int, int, int], Any] = {}
    for g in gathered:
        hist.update(g)
    failed = [h.failed for h in hist.values() if h.failed]
    done = [sz for sz in sizes if sz.key in hist and len(hist[sz.key].steps) == len(hist[next(iter(hist))].steps)]
    if sig:
        status, error = "interrupted", f"{signals.name(sig)}: {len(hist)} of {len(unique)} sizes finished"
    elif failed:
        status, error = "failed", failed[0]
    elif hist and all(_diverged(h, pde) for h in hist.values()):
        status, error = "failed", ("every size of the twin diverged: the Euler–Maruyama step is not stable at "
                                   f"training.ds = {cfg.training.ds:g} for these networks")
    err = _pde_error(pde, refined)
    report: dict[str, Any] = {"status": status, "command": "twin", "config": str(cfg.source),
                              "pde": {"dir": str(fine_dir), "refined_dir": str(ref_dir) if ref_dir else None,
                                      "risk_final": float(pde.risk[-1]), "discretisation_error": err,
                                      "risk_refined": float(refined.risk[-1]) if refined is not None else None,
                                      "cpu_s": pde_cpu},
                              "twin": {"optimizer": cfg.twin.optimizer, "sampling": cfg.twin.sampling,
                                       "seeds": cfg.twin.seeds}}
    diverged = [sz for sz in done if _diverged(hist[sz.key], pde)]
    lost = {d.key for d in diverged}
    complete = [sz for sz in done if not hist[sz.key].failed and sz not in diverged
                and (sz.sweep != "tokens" or (sz.H, 0, sz.L) in hist and (sz.H, 0, sz.L) not in lost)]
    exps, rows, summary = _compare(cfg, complete, hist, pde, err) if complete else ({}, [], {})
    report["exponents"] = exps
    report["tokens_T_w1"] = _token_w1(complete, hist, pde) if complete else {}
    report["sizes"] = summary
    report["warnings"] = _warnings(cfg, complete, hist, pde, exps) if complete else []
    report["diverged"] = [f"{sz.sweep}:H={sz.H},N={sz.N or 'limit'},L={sz.L}" for sz in diverged]
    for sz in diverged:
        report["warnings"].insert(0, f"training.ds: the twin of H = {sz.H}, N = {sz.N or 'limit'}, L = {sz.L} diverged "
                                  f"(its risk grew to {np.nanmax(hist[sz.key].risk[:, -1]):.3g}): the Euler–Maruyama "
                                  "step Δs is not stable for this finite network (the PDE's implicit step is); left "
                                  "out of the comparison")
    if error:
        report["error" if status == "failed" else "interrupted_by"] = error
    report["wall_s"] = time.perf_counter() - t0
    _write_history(out, rows, MPI.COMM_SELF)
    if cfg.output.plots and complete:
        twin_plots(out / "plots", cfg, complete, hist, pde, exps)
    write_report(out, report, MPI.COMM_SELF)
    for sweep, q in exps.items():
        for name, f in q.items():
            if f["slope"] is not None:
                logger.info("twin: %s %s exponent %.3f ± %.3f (expected %s)", sweep, name, f["slope"], f["se"],
                            "none" if f["expected"] is None else f"{f['expected']:g}")
    for w in report["warnings"]:
        logger.warning("warning: %s", w)
    code = 0 if status == "ok" else 3 if status == "failed" else signals.EXIT_INTERRUPTED
    logger.info("twin: done (%s) -> %s", status, out)
    if status == "failed":
        print(f"mfpde: numerical failure: {error}; report.json and what was finished in {out}", file=sys.stderr)
    elif status == "interrupted":
        print(f"mfpde: interrupted by {error}: report.json and what was finished in {out}", file=sys.stderr)
    return int(comm.bcast(code, root=0))
