"""The one builder: from the box's section of the config to the objects every command solves with.

The section is :func:`mfpde.tokens.box.config.section`'s (a run's: :func:`mfpde.training.config.section`).

``mfpde transport`` and ``mfpde run`` (and later ``verify``) both call :func:`build`: the token mesh and
solver, the head family, the Θ space and ρ₀, the samples and the readout are made here and nowhere
else. The CLI only parses and reports; the jobs (:mod:`mfpde.jobs.transport`, :mod:`mfpde.jobs.run`)
only solve and write.

Samples can be split over groups of ranks (``run``: each group owns a token mesh on a sub-communicator and
transports its share of the samples, theory-free parallelism over independent samples), or all ranks can
share one distributed token mesh (``transport``).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from mfpde.errors import ConfigError, NumericalError
from mfpde.heads import HeadMeasure, dirac_heads
from mfpde.limits import check_resources
from mfpde.mesh import make_domain
from mfpde.params.family import HeadFamily, make_family
from mfpde.params.theta import ThetaSpace, theta_space
from mfpde.tokens.box.config import Section
from mfpde.tokens.box.data import MU0_CACHE_BYTES, Sample, initial_measures, load_samples
from mfpde.tokens.box.readout import Readout, readout_function
from mfpde.tokens.box.transport import TokenTransport
from mfpde.tokens.rk import SCHEMES

__all__ = ["Problem", "SampleGroups", "build"]

logger = logging.getLogger(__name__)


#: Split communicators by (parent handle, number of groups): a problem built again on the same ranks reuses
#: its group's communicator instead of splitting anew. Nothing frees a split communicator, and MPICH has
#: 2048 context ids a process: a test suite or ``mfpde verify`` that builds hundreds of problems ran out
#: (the process then ended with status 15 and no message).
_SPLITS: dict[tuple[int, int], MPI.Comm] = {}


def _split(comm: MPI.Comm, n_groups: int) -> MPI.Comm:
    """The split of comm into n_groups groups by rank mod n_groups (collective the first time, cached after).

    Keyed by the parent's handle: a parent communicator must outlive the problems built on it.
    """
    key = (comm.py2f(), n_groups)
    if key not in _SPLITS:
        _SPLITS[key] = comm.Split(comm.rank % n_groups, comm.rank)
    return _SPLITS[key]


class SampleGroups:
    """The split of samples over groups of ranks, and the agreement of their failures.

    Args:
        comm: all ranks of the job.
        n_groups: number of groups (1: every rank works on every sample, on one distributed mesh).

    Attributes:
        comm: all ranks; n_groups: number of groups; color: this rank's group;
        tcomm: the communicator of this rank's group (its token mesh lives there).
    """

    def __init__(self, comm: MPI.Comm, n_groups: int, split: bool = True) -> None:
        self.comm, self.n_groups = comm, n_groups
        self.color = comm.rank % n_groups
        self.tcomm = _split(comm, n_groups) if split else comm

    def mine(self, samples: list[Sample]) -> list[int]:
        """Indices of the samples this rank's group works on (sample i goes to group i mod n_groups)."""
        return [i for i in range(len(samples)) if i % self.n_groups == self.color]

    @contextlib.contextmanager
    def collective_failure(self, error: type[Exception] = NumericalError) -> Iterator[None]:
        """Turn an ``error`` (or a ConfigError) raised in one rank group into the same on every rank.

        Groups solve independently; a failure in one must not leave the others waiting in the next
        reduction. The first message (by rank) is kept.
        """
        msg, kind = "", error  # the class raised on every rank (pickled by name): an InputRefused restores DIR
        try:
            yield
        except ConfigError as e:  # an input error found by a solve (a first depth step too long): exit 2 everywhere
            msg, kind = str(e), type(e)
        except error as e:
            msg = str(e)
        got = [(k, m) for k, m in self.comm.allgather((kind, msg)) if m]
        if got:
            try:
                exc = got[0][0](got[0][1])
            except TypeError:  # a ConfigError kind built otherwise (ConfigErrors): its message as a ConfigError
                exc = ConfigError(got[0][1])
            raise exc


@dataclass
class Problem:
    """Everything a solve needs, built once from the config by :func:`build`.

    Attributes:
        sec: the box's section of the config (:class:`~mfpde.tokens.box.config.Section`; a run's:
            :class:`mfpde.training.config.Section`); comm: all ranks.
        groups: the split of the samples over rank groups.
        tokens: the token solver of this rank's group (theory §1.3).
        family: the head family θ ↦ (a(θ), v(θ)) (theory §1.2).
        theta: the Θ space (P1 on the parameter mesh), or None for finitely many Dirac heads.
        heads0: the reduced initial head distribution ρ₀ (theory §1.3: V depends on ρ only through it).
        train, test: the samples (test is empty except for classification data).
        g: the readout, points (N, d) → (N,) (theory §2).
        mu0: per split (``"train"``, ``"test"``), the densities μ_0 of this group's samples
            (:meth:`SampleGroups.mine`, in that order), stacked, shape (n_mine, n_local); a split whose stack
            exceeds :data:`~mfpde.tokens.box.data.MU0_CACHE_BYTES` is not kept; kept for a run only
            (``split_samples``).
    """

    sec: Section
    comm: MPI.Comm
    groups: SampleGroups
    tokens: TokenTransport
    family: HeadFamily
    theta: ThetaSpace | None
    heads0: HeadMeasure
    train: list[Sample]
    test: list[Sample]
    g: Readout
    mu0: dict[str, npt.NDArray[np.float64]] = field(default_factory=dict)

    @property
    def shallow(self) -> bool:
        """Whether the model is the single residual layer (``depth.model = "shallow"``, theory §2)."""
        return self.sec.depth.model == "shallow"

    @property
    def n_layers(self) -> int:
        """Number of layer blocks, each with its own ρ (``depth.layers`` for depth-indexed models, else 1)."""
        return self.sec.depth.layers if self.sec.depth.model == "depth-indexed" else 1


def build(sec: Section, comm: MPI.Comm = MPI.COMM_WORLD, split_samples: bool = False) -> Problem:
    """Build the token solver, the head family, Θ and ρ₀, the samples and the readout of the config.

    Every sample is filled into the token space once here, so that bad data is an input error before
    anything is written.

    Args:
        sec: the box's section of a validated config (:func:`mfpde.tokens.box.config.section`; a run's adds
            ``[training]``: :func:`mfpde.training.config.section`).
        comm: the ranks of the job.
        split_samples: split the training samples over min(size, n) groups of ranks, each with its own
            token mesh on a sub-communicator (``run``: ``sec`` is then training's section, whose
            ``training.steps`` the estimate of the work reads); else one token mesh distributed over ``comm``.

    Raises:
        ConfigError, MeshError: invalid input (exit status 2), on every rank; also a config that cannot fit
            in memory or end within a year (:func:`mfpde.limits.check_resources`).
        TypeError: ``sec`` is not a section (a whole config, say).
    """
    if not isinstance(sec, Section):
        raise TypeError(f"build takes the box's section of the config, not a {type(sec).__name__}: "
                        "build(mfpde.tokens.box.config.section(cfg), comm)")
    t, h = sec.tokens, sec.heads
    if t.domain != "box":
        raise ConfigError(f"tokens.domain: {t.domain!r} is solved by `mfpde transport` (and `mfpde continuation`) "
                          "only; `mfpde run` trains on a box")
    check_resources(sec, comm.size, "run" if split_samples else "transport")
    # a line before a set-up of seconds (a box of 10⁵ cells and more); below that it would only precede the result
    cells = (0 if t.mesh else math.prod(t.cells)) + (0 if h.mesh else math.prod(h.cells))
    logger.log(logging.INFO if cells >= 100_000 else logging.DEBUG,
               "set-up: token mesh %s, %s on %d rank(s) (meshes, spaces, forms, data)",
                t.mesh or "x".join(map(str, t.cells)) + " cells", "Θ mesh " + "x".join(map(str, h.cells)) + " cells"
                if h.init["kind"] == "gaussian" else "Dirac heads", comm.size)
    family = make_family(h.family, h.a)
    train, test = load_samples(sec)
    groups = SampleGroups(comm, min(comm.size, len(train)) if split_samples else 1, split=split_samples)
    tokens = TokenTransport(make_domain(groups.tcomm, t.dim, t.mesh, t.box, t.cells, t.cell), t.degree, t.cfl,
                            sec.token_options)
    tokens.scheme = SCHEMES[sec.depth.scheme]
    mu0: dict[str, npt.NDArray[np.float64]] = {}
    with groups.collective_failure(ConfigError):  # every sample filled once: bad data is an input error here
        for split, samples, which in (("train", train, "sample"), ("test", test, "held-out sample")):
            mine = groups.mine(samples)
            # global sizes: the ranks of a group agree on what is kept (filling is collective over the group)
            row = 8 * tokens.W.dofmap.index_map.size_global
            keep = split_samples and row * (len(mine) + sum(len(U) for U in mu0.values())) <= MU0_CACHE_BYTES
            per = max(1, MU0_CACHE_BYTES // 8 // max(row, 1))  # rows filled at a time when not kept
            parts, step = [], max(len(mine) if keep else per, 1)
            for j in range(0, len(mine), step):
                idx = mine[j:j + step]
                U = initial_measures([samples[i] for i in idx], tokens.W, [f"{which} {i}" for i in idx])
                if keep:
                    parts.append(U)
            if keep:
                mu0[split] = np.concatenate(parts) if parts else np.zeros((0, len(tokens.m)))
    if h.init["kind"] == "gaussian":
        theta = theta_space(comm, h, family)
        heads0 = theta.head_measure(theta.gaussian(h.init["mean"], h.init["cov"]))
    else:
        theta = None
        heads0 = dirac_heads(family, h.init["points"], h.init["weights"])
    g = readout_function(sec.loss.readout, sec.loss.w, sec.loss.b)
    return Problem(sec, comm, groups, tokens, family, theta, heads0, train, test, g, mu0)
