"""Refuse at the door what cannot run: sizes that cannot fit, work that cannot end, densities off their domain.

The estimates are deliberately optimistic (a lower bound on memory and time), so that only a config that
cannot run on any machine is refused; the message names the key to change.

* Memory (:func:`memory_estimate`): the interpreter and libraries, plus bytes per token cell and
  degree-of-freedom block, plus bytes per Θ cell and vertex, summed per rank, against the node's physical
  memory. Calibrated by the peak RSS of ``mfpde run --set training.steps=1`` (set-up, two evaluations of the
  first variation, one splitting step; the default digits problem, DG0, d = 2, one rank), each constant
  below every slope measured, so that the sum stays a lower bound:

  ============================================  =========================================================
  varied (the rest as the default)              peak RSS
  ============================================  =========================================================
  tokens.cells [16,16], [100,100], [200,200]    199, 377, 914 MB: 17.9 kB per token cell (Θ of 289 nodes)
  the same with heads.cells [8,8] / [32,32]     12.4 / 31 kB per token cell (81 / 1089 Θ nodes: it grows
                                                with Θ; at no Θ node about 10 kB)
  heads.cells [16,16], [128,128], [256,256]     199, 324, 701 MB: 7.7 kB per Θ cell
  data.split 0.2 / 0.8, tokens.cells [200,200]  914.0 / 914.1 MB: no measurable cost per sample (< 1 kB)
  ============================================  =========================================================

  A run is charged :data:`BYTES_PER_CELL_RUN` per token cell (a quarter of the 10 kB intercept, and below the
  2.8 kB per cell of a [1000, 1000] run's set-up), :data:`BYTES_PER_THETA_CELL` per Θ cell and
  :data:`BASE_BYTES` for the interpreter, DOLFINx and PETSc (the smallest run holds 197 MB); a transport,
  with no adjoint and no Θ, :data:`BYTES_PER_CELL_D` per cell (by dimension) plus :data:`BYTES_PER_BLOCK` per cell
  and DG block, from the peak RSS of ``mfpde transport`` with fields and plots on (set-up, one depth step, the
  writer and the plot) at two sizes each (d = 2 DG0 and DG1, d = 1 DG1). Samples add no term. The measured RSS
  of a run is 1.3 to 3.6 times the estimate on the runs above (tests/test_resources.py checks a modest run and
  a transport within 4 times), up to 7 times on large token meshes, where the measured 17.9 kB a cell dominates
  the 2.5 kB charged.
* Time: each depth (sub-)step of each transport costs at least :data:`SECONDS_PER_STEP` plus
  :data:`SECONDS_PER_CELL` per cell; a run does a forward and an adjoint solve per training sample and
  step. More than :data:`MAX_SECONDS` (a year), even spread over every rank, is refused.
* A Gaussian ρ₀ or datum with less than :data:`MIN_MASS_INSIDE` of its mass inside its box (Θ or Ω) would
  be silently truncated and renormalised into another density: refused.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from mfpde.errors import ConfigError

__all__ = ["check_box", "check_gaussian_inside", "check_integer", "check_memory", "check_resolved", "check_resources",
           "check_work", "gaussian_box_mass", "memory_estimate", "node_memory_bytes"]

#: Bytes per token cell of a transport whatever its degree (the mesh, its facets, the forms' data, the owned-cell
#: submesh of the fields, the plots' gathers), by dimension d, and per (degree + 1)^d block of DG values (the vectors
#: of the stages and the writer). Below the slopes of the peak RSS measured (tests/test_resources.py): d = 2, DG0:
#: 2.5 kB a cell ([200, 200] 296 MB, [400, 400] 596 MB; 2.1 to 2.5 kB without fields and plots, to [800, 800]);
#: d = 2, DG1: 3.43 kB ([200, 200] 330 MB, [400, 400] 742 MB); d = 1, DG1: 1.55 kB ([10⁵] 321 MB, [4·10⁵] 787 MB).
#: d = 3 is charged as d = 2 (a lower bound: it has more facets a cell).
BYTES_PER_CELL_D = {1: 900.0, 2: 2100.0, 3: 2100.0}
BYTES_PER_BLOCK = 300.0
#: The earlier charge of a transport, 1 kB a cell and block: [5000, 5000] in d = 2 was let through at 25 GB where it
#: needs at least 60 GB (kept for the record; no longer used).
BYTES_PER_CELL = 1000.0
#: The same for a run (the adjoint, the coupling to Θ, the first variation): measured 10 to 31 kB.
BYTES_PER_CELL_RUN = 2500.0
#: Bytes per Θ cell (the mesh, P1 space and forms, distributed; measured 7.7 kB) and per Θ vertex (gathered on
#: every rank).
BYTES_PER_THETA_CELL, BYTES_PER_THETA_POINT = 5000.0, 200.0
#: Bytes of every rank before any mesh: Python, numpy, DOLFINx, PETSc and MPI (measured 197 MB).
BASE_BYTES = 150e6
#: Optimistic cost of one depth step (Python and PETSc overhead) and of one cell in it, in seconds.
SECONDS_PER_STEP, SECONDS_PER_CELL = 1e-4, 1e-8
#: The work refused: more than a year of wall time at the optimistic speed, over all ranks.
MAX_SECONDS = 3.2e7
#: Largest coordinate of a box (non-dimensional; beyond it squares and exponentials of the kernel overflow).
MAX_COORD = 1e12
#: A Gaussian with less of its mass inside its box is refused.
MIN_MASS_INSIDE = 0.5
#: A Gaussian ρ₀ needs a standard deviation of at least this many Θ cell widths (1/√6: the P1 interpolant's variance
#: σ² + h²/6 at most twice σ²).
RHO0_CELLS_PER_SIGMA = 1.0 / math.sqrt(6.0)
#: Largest magnitude of an integer in a config (beyond it sizes and counts overflow float64 and int64).
MAX_INT = 2**63 - 1


def check_integer(key: str, value: int | float) -> int | float:
    """Refuse an integer beyond ±:data:`MAX_INT` (a 400-digit ``training.steps`` overflowed ``float()``).

    The message counts the digits from the bit length: a hexadecimal literal of 4000 digits is an int of more
    decimal digits than CPython converts to a string (``sys.get_int_max_str_digits``).

    Raises:
        ConfigError: naming ``key``.
    """
    if isinstance(value, int) and abs(value) > MAX_INT:  # its digits from its bits: str() of > 4300 digits raises
        digits = math.floor(abs(value).bit_length() * math.log10(2)) + 1
        raise ConfigError(f"{key}: integer of about {digits} digits is too large (at most {MAX_INT})")
    return value


def check_resolved(cfg: Any) -> None:  # a Config: importing it would be a cycle
    """Refuse (``mfpde transport`` and ``run``) data samples and a ρ₀ narrower than their cells resolve.

    A Gaussian ρ₀ is checked by :func:`_check_rho0_resolved`; the data as follows.

    A Gaussian whose smallest standard deviation sqrt(λ_min(Σ)) is below the widest token cell is sampled at
    a few nodes and renormalised into another density: the transport then gave a wrong ŷ with status "ok"
    (0.509, 1.091 or 0.0 instead of 0.609 for ``demos/transport_small.toml`` on boxes ±100, ±1000, ±1e6). At
    one cell per standard deviation ŷ is within 1% (0.6049). Library calls (:func:`mfpde.tokens.box.problem.build`) are
    not checked: tests of exact discrete properties run on tiny meshes on purpose.

    Raises:
        ConfigError: naming the sample and ``tokens.cells`` / ``tokens.box``, or ``heads.init.cov``.
    """
    _check_rho0_resolved(cfg.heads)
    t, da = cfg.tokens, cfg.data
    if t.mesh or da.kind != "gaussian":
        return
    h = max((hi - lo) / n for (lo, hi), n in zip(t.box, t.cells, strict=True))
    for i, cov in enumerate(da.cov):
        sigma = math.sqrt(max(float(np.linalg.eigvalsh(np.asarray(cov, dtype=float))[0]), 0.0))
        if not sigma >= h:
            raise ConfigError(f"tokens.cells: data sample {i} (standard deviation {sigma:.3g}) is narrower than a "
                              f"token cell ({h:.3g} wide) and cannot be resolved: refine tokens.cells or shrink "
                              "tokens.box")


def _check_rho0_resolved(h: Any) -> None:
    """Refuse a Gaussian ρ₀ narrower than :data:`RHO0_CELLS_PER_SIGMA` Θ cells per standard deviation.

    The P1 interpolant of N(m, σ²) on cells of width h has, along an axis, the variance σ² + h²/6 (the hat
    functions' own); below σ = h/√6 the ρ₀ a run starts from is more than twice as broad in variance as the
    one asked for (``heads.init.cov = [[1e-8]]`` ran with a ρ₀ 6.7·10⁵ times too broad: one Θ cell).

    Raises:
        ConfigError: naming ``heads.init.cov`` and the Θ cell width.
    """
    if h.mesh or h.init.get("kind") != "gaussian":
        return
    width = max((hi - lo) / n for (lo, hi), n in zip(h.box, h.cells, strict=True))
    sigma = math.sqrt(max(float(np.linalg.eigvalsh(np.asarray(h.init["cov"], dtype=float))[0]), 0.0))
    if not sigma >= RHO0_CELLS_PER_SIGMA * width:
        raise ConfigError(f"heads.init.cov: ρ₀ (smallest standard deviation {sigma:.3g}) is narrower than the Θ "
                          f"cells ({width:.3g} wide) resolve: its P1 interpolant would be more than twice as broad "
                          f"in variance; needs a standard deviation >= {RHO0_CELLS_PER_SIGMA * width:.3g} "
                          "(refine heads.cells or shrink heads.box)")


def check_matrix(key: str, m: list[list[float]], n: int) -> None:
    """Check an n×n symmetric positive definite matrix (a covariance) of the config key ``key``.

    Raises:
        ConfigError: naming the key: wrong shape, non-finite, not symmetric or not positive definite.
    """
    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise ConfigError(f"{key}: {msg}")

    need(len(m) == n and all(len(r) == n for r in m), f"must be {n}x{n}")
    a = np.asarray(m, dtype=float)
    need(bool(np.all(np.isfinite(a))), "must be finite")
    need(np.allclose(a, a.T), "must be symmetric")
    need(bool(np.all(np.linalg.eigvalsh(a) > 0)), "must be positive definite")


def check_box(key: str, box: Sequence[Sequence[float]], cells: Sequence[int]) -> None:
    """Refuse a box whose coordinates are absurd or whose cells are too small to tell apart.

    Raises:
        ConfigError: a bound beyond ±:data:`MAX_COORD`, or a cell width below 1e-10 of the coordinates.
    """
    for (lo, hi), n in zip(box, cells, strict=False):
        if max(abs(lo), abs(hi)) > MAX_COORD:
            raise ConfigError(f"{key}: bounds beyond ±{MAX_COORD:g} are not supported (rescale), got {[lo, hi]}")
        if n >= 1 and (hi - lo) / n <= 1e-10 * max(abs(lo), abs(hi), 1.0):
            raise ConfigError(f"{key}: cells of width {(hi - lo) / n:.3g} cannot be resolved at {[lo, hi]}")


def _normal_interval(lo: float, hi: float, m: float, s: float) -> float:
    """P(lo < X < hi) for X ~ N(m, s²), by erfc of the standardised ends (no cancellation in either tail)."""
    a, b = (lo - m) / (s * math.sqrt(2.0)), (hi - m) / (s * math.sqrt(2.0))
    if a > 0:  # both ends in the upper tail: difference of the small upper tails
        return 0.5 * (math.erfc(a) - math.erfc(b))
    return 0.5 * (math.erfc(-b) - math.erfc(-a)) if b < 0 else 1.0 - 0.5 * (math.erfc(-a) + math.erfc(b))


def gaussian_box_mass(mean: Sequence[float], cov: Sequence[Sequence[float]], box: Sequence[Sequence[float]]) -> float:
    """The probability that N(mean, cov) puts on the box ∏ [lo_j, hi_j] (p = 1 or 2).

    p = 1 and a diagonal covariance: products of normal intervals (``math.erfc``); a correlated p = 2 Gaussian:
    ``scipy.stats.multivariate_normal`` (imported only then: scipy.stats costs about a second of start-up).
    """
    m = np.asarray(mean, dtype=float)
    c = np.asarray(cov, dtype=float)
    lo = np.array([b[0] for b in box], dtype=float)
    hi = np.array([b[1] for b in box], dtype=float)
    if np.count_nonzero(c - np.diag(np.diag(c))) == 0:
        return math.prod(_normal_interval(lo[j], hi[j], m[j], math.sqrt(c[j, j])) for j in range(len(m)))
    import scipy.stats

    mvn = scipy.stats.multivariate_normal(m, c)
    return float(mvn.cdf(hi, lower_limit=lo))


def check_gaussian_inside(key: str, mean: Sequence[float], cov: Sequence[Sequence[float]],
                          box: Sequence[Sequence[float]], where: str) -> None:
    """Refuse a Gaussian with less than :data:`MIN_MASS_INSIDE` of its mass in ``box``.

    Raises:
        ConfigError: naming ``key`` and the fraction inside.
    """
    frac = gaussian_box_mass(mean, cov, box)
    if not frac >= MIN_MASS_INSIDE:
        raise ConfigError(f"{key}: only {100 * frac:.3g}% of the Gaussian's mass lies in {where}; it would be "
                          f"truncated and renormalised (move the mean inside or enlarge {where})")


def node_memory_bytes() -> float:
    """Physical memory of this node in bytes (inf if unknown)."""
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return math.inf


def _samples(cfg: Any) -> tuple[int, int]:
    """(training samples, held-out samples) of the config."""
    da = cfg.data
    n_train = len(da.mean) if da.kind == "gaussian" else da.samples if da.kind == "digits" else 1
    n_test = da.test_samples if da.kind == "digits" else 0
    if da.kind == "digits" and da.split > 0:  # at most 365 images in a pair of scikit-learn's digits
        n_train, n_test = max(2, round(365 * da.split)), 365 - max(2, round(365 * da.split))
    return n_train, n_test


def memory_estimate(cfg: Any, size: int, command: str) -> dict[str, float]:  # a Config: importing it is a cycle
    """A lower bound of the peak memory of each rank, in bytes, by what it is for (module docstring).

    Args:
        cfg: the validated :class:`~mfpde.config.Config`.
        size: the number of MPI ranks.
        command: ``"run"`` or ``"transport"``.

    Returns:
        Bytes per rank, keyed by the config key that sizes them (``"tokens.cells"``, ``"heads.cells"``) and
        ``"base"``; their sum is the estimate.
    """
    t, h = cfg.tokens, cfg.heads
    cells = float(np.prod(np.asarray(t.cells, dtype=float))) if not t.mesh else 0.0
    groups = min(size, _samples(cfg)[0]) if command == "run" else 1
    blocks = (t.degree + 1) ** t.dim
    per_cell = (BYTES_PER_CELL_RUN * blocks if command == "run" else
                BYTES_PER_CELL_D.get(t.dim, BYTES_PER_CELL_D[3]) + BYTES_PER_BLOCK * blocks)
    est = {"base": BASE_BYTES, "tokens.cells": cells * per_cell / max(size // groups, 1), "heads.cells": 0.0}
    if command == "run" and not h.mesh and h.init.get("kind") == "gaussian":
        tc = float(np.prod(np.asarray(h.cells, dtype=float)))
        points = float(np.prod(np.asarray(h.cells, dtype=float) + 1))
        est["heads.cells"] = tc * BYTES_PER_THETA_CELL / size + points * BYTES_PER_THETA_POINT
    return est


def check_resources(cfg: Any, size: int, command: str) -> None:  # a section: importing it would be a cycle
    """Refuse a config whose memory cannot fit on a node or whose work cannot end within a year.

    Args:
        cfg: the box's section of a validated config (:class:`mfpde.tokens.box.config.Section`; for ``"run"``
            training's, :class:`mfpde.training.config.Section`, whose ``training.steps`` it reads), or the config.
        size: the number of MPI ranks.
        command: ``"run"`` (samples split over rank groups, forward and adjoint every training step) or
            ``"transport"`` (one mesh over all ranks, one forward solve per sample).

    Raises:
        ConfigError: naming the key that dominates the estimate.
    """
    t = cfg.tokens
    mem = node_memory_bytes()
    cells = float(np.prod(np.asarray(t.cells, dtype=float))) if not t.mesh else 0.0
    n_train, n_test = _samples(cfg)
    groups = min(size, n_train) if command == "run" else 1
    est = memory_estimate(cfg, size, command)
    key = max(("tokens.cells", "heads.cells"), key=lambda k: est[k])
    check_memory(est, key, str(getattr(cfg, key.split(".")[0]).cells), mem)
    _check_run_work(cfg, size, command, cells, n_train, n_test, groups)


def check_memory(est: dict[str, float], key: str, value: str, mem: float | None = None) -> None:
    """Refuse, before anything is allocated, an estimate of a rank's peak memory beyond this node's memory.

    The one memory ceiling of every command: ``run`` and the box's ``transport`` (:func:`memory_estimate`), the
    sphere's DG solver (:func:`mfpde.tokens.sphere.job.check_dg_memory`).

    Args:
        est: bytes per rank by what they are for (their sum is the estimate).
        key: the config key that sizes the largest part (the message names it first).
        value: its value, as the message shows it.
        mem: the node's memory in bytes (this node's if None).

    Raises:
        ConfigError: the sum exceeds ``mem``.
    """
    mem = node_memory_bytes() if mem is None else mem
    total = sum(est.values())
    if total > mem:
        parts = ", ".join(f"{k} {v / 1e9:.3g} GB" for k, v in est.items() if v > 0)
        raise ConfigError(f"{key}: {value} needs at least {total / 1e9:.3g} GB per rank ({parts}), more than the "
                          f"{mem / 1e9:.3g} GB of this node")


def check_work(seconds: float, key: str, what: str) -> None:
    """Refuse, before anything is allocated, a job whose optimistic wall time exceeds :data:`MAX_SECONDS` (a year).

    The one ceiling of every command's work (``run`` and box ``transport`` here; the circle's DG solver in
    :mod:`mfpde.tokens.circle.job`): each passes a lower bound of its wall time (its sub-steps counted at the
    optimistic :data:`SECONDS_PER_STEP` plus :data:`SECONDS_PER_CELL` per value a sub-step updates), so that only a
    job that cannot end on any machine is refused.

    Args:
        seconds: the lower bound of the wall time.
        key: the config key that sizes it (the message names it first).
        what: how the bound is made, for the message ("at least 1e18 DG sub-steps of 7.3e6 values").

    Raises:
        ConfigError: ``seconds`` exceeds :data:`MAX_SECONDS` (or is not finite).
    """
    if not seconds <= MAX_SECONDS:
        years = f"more than {seconds / 3.15e7:.3g} years" if math.isfinite(seconds) else "an unbounded time"
        raise ConfigError(f"{key}: the job would take {years} even at an optimistic speed ({what}; "
                          f"refused beyond {MAX_SECONDS / 3.15e7:.3g} year of wall time)")


def _check_run_work(cfg: Any, size: int, command: str, cells: float, n_train: int, n_test: int,
                    groups: int) -> None:
    """The work of a box ``run`` or ``transport`` (:func:`check_resources`) against :func:`check_work`'s ceiling."""
    t, d = cfg.tokens, cfg.depth
    training_steps = cfg.training.steps if command == "run" else 0  # a transport's section has no [training]
    solves = (training_steps + 1) * 2 * n_train + n_test if command == "run" else n_train + n_test
    steps = 1 if d.model == "shallow" else d.steps
    sub = max(1.0, 0.4 / t.cfl)  # sub-cycling grows as the CFL factor shrinks
    seconds = solves * steps * sub * (SECONDS_PER_STEP + SECONDS_PER_CELL * cells / max(size // groups, 1)) / groups
    if seconds > MAX_SECONDS:
        factors = {"depth.steps": steps / 100, "tokens.cfl": sub, "tokens.cells": cells / 400,
                   "data.samples": (n_train + n_test) / 40}
        if command == "run":
            factors["training.steps"] = (training_steps + 1) / 200
        key = max(factors, key=lambda k: factors[k])
        check_work(seconds, key, f"{SECONDS_PER_STEP:g} s per depth step: depth.steps = {d.steps}, tokens.cfl = "
                   f"{t.cfl:g}, tokens.cells = {t.cells}, {n_train + n_test} samples")
