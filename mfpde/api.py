"""The public Python API: configs, problems, a transport and a training run, results as numpy arrays.

A thin layer over what the ``mfpde`` commands run (:mod:`mfpde.config`, :mod:`mfpde.tokens.box.problem`,
:mod:`mfpde.jobs.transport`, :mod:`mfpde.jobs.run`, :mod:`mfpde.io`). Every function is collective under
MPI (call it on every rank of ``comm``); the arrays it returns are global and the same on every rank.
Import ``mpi4py`` before anything of DOLFINx, as these functions do::

    import mfpde
    cfg = mfpde.load_config("demos/transport_small.toml")
    mu = mfpde.transport(cfg)                   # sample 0 under ρ₀
    mu.mu_T.values, mu.mu_T.points              # density of μ_T and where (cell centres for DG0)
    run = mfpde.train(mfpde.load_config(overrides=["training.steps=5"]), "out/api-run")
    run.rho, run.theta_points, run.history["risk"]
"""

from __future__ import annotations

import copy
import math
import shutil
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from mfpde.config import Config, from_dict, load
from mfpde.spaces import lumped_mass

__all__ = ["TokenField", "TrainingResult", "TransportResult", "build_problem", "load_config", "make_config",
           "train", "transport"]

Array = npt.NDArray[np.float64]

if TYPE_CHECKING:  # dolfinx is imported only when a problem is built
    import dolfinx.fem

    from mfpde.tokens.box.problem import Problem


def _merge(base: dict[str, Any], sections: dict[str, dict[str, Any]]) -> dict[str, Any]:
    raw = copy.deepcopy(base)
    for name, table in sections.items():
        if not isinstance(table, dict):
            from mfpde.errors import ConfigError

            raise ConfigError(f"[{name}] must be a table (a dict of keys), got {table!r}")
        raw.setdefault(name, {}).update(copy.deepcopy(table))
    return raw


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                **sections: dict[str, Any]) -> Config:
    """Load a TOML config as ``mfpde run``/``transport`` do, with overrides.

    Args:
        path: the TOML file, or None for the embedded default of ``mfpde run`` (the digits problem).
        overrides: ``"section.key=VALUE"`` strings in TOML value syntax, as ``--set`` takes them.
        **sections: tables merged over the file's, e.g. ``training={"steps": 5}``.

    Returns:
        The validated, frozen config.

    Raises:
        ConfigError: a missing file, invalid TOML, an unknown key (with a suggestion) or a bad value.
    """
    cfg = load(path, list(overrides))
    if not sections:
        return cfg
    from mfpde.config.keys import to_toml

    return from_dict(_merge(tomllib.loads(to_toml(cfg)), sections), source=cfg.source)  # keys in use: the others
    # would be given keys that do not apply (refused); left out they take their defaults, unused as before


def make_config(**sections: dict[str, Any]) -> Config:
    """Build a config from keyword arguments, one dict per TOML section, over the schema's defaults.

    Example: ``make_config(tokens={"cells": [100]}, depth={"steps": 25}, heads={"family": "value"})``.
    Keys not given take the defaults of the config reference (not those of the embedded default run).

    Raises:
        ConfigError: an unknown section or key, or a bad value.
    """
    return from_dict(_merge({}, sections), source="<python>")


def build_problem(cfg: Config, comm: MPI.Comm = MPI.COMM_WORLD) -> Problem:
    """The token solver, Θ, ρ₀, the samples and the readout of ``cfg`` (:func:`mfpde.tokens.box.problem.build`).

    One token mesh distributed over ``comm`` (as ``mfpde transport`` builds it).
    """
    from mfpde.tokens.box.config import section
    from mfpde.tokens.box.problem import build

    return build(section(cfg), comm)


@dataclass
class TokenField:
    """A token density on Ω as arrays: its values at the degrees of freedom and where they are.

    Attributes:
        values: the density (mass per unit length, area) at each degree of freedom, shape (n,).
        points: the coordinates of the degrees of freedom, shape (n, d): the cell centres for DG0 (the
            default), the cell vertices (once per cell) for DG1. Sorted by coordinates.
        degree: the DG degree (0: one value per cell).
        weights: the lumped-mass quadrature weights m_i = ∫ φ_i of the degrees of freedom, shape (n,): the
            quadrature the solver uses (theory §1.3), exact for the mass, so ∫ f dμ ≈ Σ_i m_i μ_i f(x_i).
    """

    values: Array
    points: Array
    degree: int
    weights: Array

    @property
    def mass(self) -> float:
        """∫ μ = Σ_i m_i μ_i (exact for the discrete density)."""
        return float(self.weights @ self.values)

    @property
    def mean(self) -> Array:
        """The mean of μ/∫μ by the lumped quadrature, shape (d,) (as the report's ``mean_T``)."""
        return (self.weights * self.values) @ self.points / self.mass


def _gather(u: dolfinx.fem.Function, comm: MPI.Comm) -> TokenField:
    """The owned degrees of freedom of u on every rank, joined and sorted by coordinates."""
    W = u.function_space
    n = W.dofmap.index_map.size_local
    d = W.mesh.geometry.dim
    vals = np.concatenate(comm.allgather(np.array(u.x.array[:n], dtype=float)))
    pts = np.concatenate(comm.allgather(np.array(W.tabulate_dof_coordinates()[:n, :d], dtype=float)))
    wts = np.concatenate(comm.allgather(np.array(lumped_mass(W)[:n], dtype=float)))
    order = np.lexsort(np.round(pts, 10).T[::-1])
    return TokenField(vals[order], pts[order], W.ufl_element().basix_element.degree, wts[order])


@dataclass
class TransportResult:
    """One sample transported through depth [0, T] under ρ₀.

    Attributes:
        mu_0: the token density at depth 0.
        mu_T: the token density at depth T.
        yhat: the readout ŷ = ∫ g dμ_T.
        report: the sample's block of the ``transport`` report (``mass_T``, ``mass_error``, ``outflow``,
            ``min_density``, ``mean_T`` (d,), ``cov_T`` (d, d), ``yhat``, ``substeps``).
    """

    mu_0: TokenField
    mu_T: TokenField
    yhat: float
    report: dict[str, Any]


def transport(cfg: Config | Problem, sample: int = 0, comm: MPI.Comm = MPI.COMM_WORLD) -> TransportResult:
    """Transport one input sample to depth T under ρ₀, as ``mfpde transport`` does (no files written).

    Args:
        cfg: a config, or a problem from :func:`build_problem` (to transport several samples of one build).
        sample: the index into the training then the held-out samples.
        comm: the ranks (used when ``cfg`` is a config).

    Raises:
        ConfigError: invalid input, or a config on the sphere (its transport is the command's);
            IndexError: no such sample; NumericalError: the solve failed.

    On the circle (``tokens.domain = "circle"``, either ``tokens.solver``) the points are angles (n, 1), ``yhat`` is
    NaN (no readout), and ``report`` is the sample block of ``mfpde transport`` (``cdf_T``, ``clusters_t``,
    ``solve_cpu_s``, ...); the flow solver's μ is the density on 1024 equal bins of its reconstructed CDF.
    """
    from mfpde.environment import blas_threads
    from mfpde.jobs.transport import sample_report, transport_sample

    if isinstance(cfg, Config) and cfg.tokens.domain == "circle":
        if sample != 0:
            raise IndexError(f"sample {sample}: the circle problem has one sample")
        from mfpde.tokens.circle.config import section
        from mfpde.tokens.circle.job import circle_heads, circle_solve

        sec = section(cfg)
        with blas_threads(comm):
            block, _, (d0, dT) = circle_solve(sec, circle_heads(sec, comm), comm)

        def field(d: Any) -> TokenField:
            return TokenField(np.asarray(d[0], float), np.asarray(d[1], float)[:, None], d[3], np.asarray(d[2], float))

        return TransportResult(field(d0), field(dT), math.nan, block)
    if isinstance(cfg, Config) and cfg.tokens.domain == "sphere":  # build_problem would take it for a box
        from mfpde.errors import ConfigError

        raise ConfigError("tokens.domain: 'sphere' is solved by the command `mfpde transport CONFIG --out DIR` "
                          "(its report.json and fields); mfpde.transport takes boxes and the circle")
    pb = build_problem(cfg, comm) if isinstance(cfg, Config) else cfg
    n = len(pb.train) + len(pb.test)
    if not 0 <= sample < n:
        raise IndexError(f"sample {sample}: the problem has {n} samples")
    first: list[TokenField] = []
    with blas_threads(pb.comm):  # as the commands: one BLAS thread per process unless the user chose
        u, rep = transport_sample(pb, sample, on_initial=lambda u0: first.append(_gather(u0, pb.comm)))
    return TransportResult(first[0], _gather(u, pb.comm), rep.yhat, sample_report(rep))


@dataclass
class TrainingResult:
    """A training run (``mfpde run``) as arrays.

    Attributes:
        status: ``"ok"`` or ``"failed"``; error: why it failed ("" when ok).
        rho: the nodal values of the trained ρ_S (the last good one if failed) per layer block, shape (L, N_θ);
            a probability density on Θ.
        theta_points: the Θ nodes, shape (N_θ, p) (p = 2: columns a, v for ``scalar`` heads).
        history: each column of ``history.csv`` (``step``, ``s``, ``risk``, ``free_energy``, ...), shape (rows,).
        report: what ``report.json`` holds; out: the output directory.
    """

    status: str
    rho: Array
    theta_points: Array
    history: dict[str, Array]
    report: dict[str, Any]
    out: Path
    error: str = ""


def train(cfg: Config, out: str | Path | None = None, resume: bool = False,
          comm: MPI.Comm = MPI.COMM_WORLD) -> TrainingResult:
    """Train ρ as ``mfpde run`` does, writing its outputs (report, history, plots, fields) into ``out``.

    Args:
        cfg: the config (:func:`load_config`, :func:`make_config`).
        out: the output directory; None: a temporary one, removed on return (only the arrays remain). A finished
            run there is replaced (``mfpde run`` refuses that without ``--overwrite``).
        resume: continue from ``out/checkpoint``.
        comm: the ranks.

    Returns:
        The result; a numerical failure is ``status == "failed"`` (not an exception), as exit status 3 is.

    Raises:
        ConfigError: invalid input, or another job holds ``out``.
    """
    from mfpde.environment import OutputLock, blas_threads
    from mfpde.jobs.run import run_job

    if out is None:  # rank 0's temporary directory (one host)
        tmp = Path(comm.bcast(tempfile.mkdtemp(prefix="mfpde-") if comm.rank == 0 else None, root=0))
        try:
            return train(cfg, tmp / "run", resume, comm)
        finally:
            comm.barrier()
            if comm.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
    with OutputLock(Path(out), comm), blas_threads(comm):  # one BLAS thread per process, as ``mfpde run``
        r = run_job(cfg, Path(out), resume=resume, comm=comm)
    keys = list(r.history[0]) if r.history else []
    history = {k: np.array([row.get(k, np.nan) for row in r.history], dtype=float) for k in keys}
    assert r.rho is not None and r.theta_points is not None
    return TrainingResult(r.status, r.rho, r.theta_points, history, r.report, r.out, r.error)
