"""Input token measures μ_0^i and targets y^i: Gaussians, scikit-learn's digits, point clouds from a file.

Each sample is turned into a DG density on the token mesh with mass 1 (theory §2):

* ``gaussian``: N(m, Σ) evaluated at the DG nodes, renormalised to mass 1;
* ``digits``: the 8×8 image as a piecewise-constant density on the unit square (pixel (i, j) covers
  [j/8, (j+1)/8] × [1 − (i+1)/8, 1 − i/8] of the square [0, 1]² + ``data.origin``; zero outside it, so Ω
  may be larger), evaluated at cell midpoints, then normalised;
* ``file``: points with weights deposited into the cell that contains them (DG0 value w/|cell|, then
  interpolated into DG_k exactly), so the deposited mass equals Σ w exactly.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpi4py import MPI

import dolfinx.fem
import dolfinx.geometry
import numpy as np
import numpy.typing as npt
from dolfinx import cpp as _cpp

from mfpde.errors import ConfigError
from mfpde.spaces import lumped_mass

if TYPE_CHECKING:
    from mfpde.tokens.box.config import Section

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Sample:
    """One input token measure and its target.

    Attributes:
        kind: ``"gaussian"``, ``"image"`` or ``"points"``.
        params: kind-specific arrays (``mean``/``cov``; ``image`` (8, 8); ``points`` (N, d)/``weights`` (N,)).
        target: the label y.
    """

    kind: str
    params: dict[str, Any]
    target: float


def bundled_digits() -> tuple[Array, Array]:
    """scikit-learn's bundled handwritten digits as ``sklearn.datasets.load_digits`` gives them.

    Read from scikit-learn's data file without importing scikit-learn (its import, with scipy.stats, is about a
    second of every run's start-up).

    Returns:
        The images, shape (1797, 8, 8), intensities 0..16, and their digits, shape (1797,) int.
    """
    import gzip
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("data.kind = 'digits' needs scikit-learn's bundled digits: scikit-learn is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    with gzip.open(path, "rt") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)


def load_samples(sec: Section) -> tuple[list[Sample], list[Sample]]:
    """Training and test samples of the ``[data]`` section of the box's section.

    Raises:
        ConfigError: a data file is missing, unreadable or malformed, or holds non-finite or negative data.
    """
    da, d = sec.data, sec.tokens.dim
    if da.kind == "gaussian":
        train = [Sample("gaussian", {"mean": np.asarray(m, float), "cov": np.asarray(c, float)}, float(y))
                 for m, c, y in zip(da.mean, da.cov, da.target, strict=True)]
        return train, []
    if da.kind == "digits":
        images, target = bundled_digits()
        c0, c1 = da.classes
        idx = np.flatnonzero((target == c0) | (target == c1))
        if not (da.split == 0 or 0 < da.split < 1):
            raise ConfigError(f"data.split: must be 0 (use data.samples) or in (0, 1), got {da.split}")
        idx = np.random.default_rng(da.seed).permutation(idx)
        n_train = max(2, round(da.split * len(idx))) if da.split > 0 else da.samples
        need = n_train + (len(idx) - n_train if da.split > 0 else da.test_samples)
        if need > len(idx):
            raise ConfigError(f"data.samples + data.test_samples = {need} exceeds the {len(idx)} images of "
                              f"classes {da.classes}")
        mk = [Sample("image", {"image": images[i], "origin": tuple(da.origin)}, 1.0 if target[i] == c1 else -1.0)
              for i in idx[:need]]
        return mk[:n_train], mk[n_train:]
    path = Path(da.path)
    try:
        with open(path, "rb") as f:  # np.load's own error on a text file is its advice on pickles
            magic = f.read(6)
    except OSError as e:
        raise ConfigError(f"data.path {str(path)!r}: cannot be read: {e.strerror or e}") from None
    if magic == b"\x93NUMPY":
        raise ConfigError(f"data.path {str(path)!r}: an .npy file (one array); the samples are an .npz file of "
                          "points, weights and target (numpy.savez)")
    if magic and not magic.startswith(b"PK"):
        raise ConfigError(f"data.path {str(path)!r}: not an .npz file (a zip archive of points, weights and target "
                          "written by numpy.savez)")
    try:
        with np.load(path) as f:
            pts, wts, tgt = (np.asarray(f[k], dtype=float) for k in ("points", "weights", "target"))
    except (OSError, KeyError, ValueError, TypeError, AttributeError, EOFError, zipfile.BadZipFile) as e:
        raise ConfigError(f"data.path {str(path)!r}: cannot read points/weights/target from an .npz: {e}") from None
    if pts.ndim != 3 or pts.shape[2] != d or wts.shape != pts.shape[:2] or tgt.shape != (pts.shape[0],):
        raise ConfigError(f"data.path {str(path)!r}: expected points (n, N, {d}), weights (n, N), target (n,); "
                          f"got {pts.shape}, {wts.shape}, {tgt.shape}")
    if pts.shape[0] < 1 or pts.shape[1] < 1:
        raise ConfigError(f"data.path {str(path)!r}: needs at least one sample with at least one point")
    finite = np.isfinite(pts).all(axis=(1, 2)) & np.isfinite(wts).all(axis=1) & np.isfinite(tgt)
    if not finite.all():
        i = int(np.flatnonzero(~finite)[0])
        raise ConfigError(f"data.path {str(path)!r}: sample {i}: non-finite points, weights or target")
    bad = (wts < 0).any(axis=1) | (wts.sum(axis=1) <= 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ConfigError(f"data.path {str(path)!r}: sample {i}: weights must be >= 0 with a positive sum")
    return [Sample("points", {"points": p, "weights": w}, float(y)) for p, w, y in zip(pts, wts, tgt, strict=True)], []


#: Bytes per rank of initial densities μ_0 kept for the whole run (:class:`mfpde.tokens.box.problem.Problem`
#: ``mu0``, one stacked array per split; beyond it each solve fills its batch again: interpolating costs more than the
#: single-layer model's solve).
MU0_CACHE_BYTES = 512 * 2**20


def _cell_values(sample: Sample, x: Array) -> Array:
    """The DG0 values of an image sample at the cell midpoints x, shape (3, n_cells) → (n_cells,)."""
    img = np.asarray(sample.params["image"], dtype=float)
    x0, y0 = sample.params.get("origin", (0.0, 0.0))
    xs, ys = x[0] - x0, x[1] - y0
    inside = (xs >= 0) & (xs <= 1) & (ys >= 0) & (ys <= 1)
    j = np.clip(np.floor(8 * xs).astype(int), 0, 7)
    i = np.clip(np.floor(8 * (1 - ys)).astype(int), 0, 7)
    return np.where(inside, img[i, j], 0.0)  # zero outside the unit square


def initial_measures(samples: list[Sample], W: dolfinx.fem.FunctionSpace, names: list[str] | None = None) -> Array:
    """The densities μ_0 of the samples with mass 1 on the DG space W, stacked (one space, one work function).

    The same numbers as :func:`fill_density` for each sample with the lumped mass of W (bit for bit): images are
    evaluated at the DG0 cell midpoints (``interpolation_coords``, computed once), then interpolated into W;
    Gaussians are interpolated into W; point clouds are deposited. The masses are one reduction over W's ranks.
    Collective over W's communicator.

    Args:
        samples: the input measures (any mix of kinds).
        W: a DG space on the token mesh.
        names: a name per sample for error messages (default ``sample <index>``).

    Returns:
        The local dofs (owned and ghost) of every μ_0, shape (len(samples), n_local).

    Raises:
        ConfigError: a measure has no mass on Ω, or a point lies outside Ω (the first such sample, named).
    """
    msh = W.mesh
    tdim = msh.topology.dim
    Q = W if W.element.basix_element.degree == 0 else dolfinx.fem.functionspace(msh, ("DG", 0))
    u, u0 = dolfinx.fem.Function(W), dolfinx.fem.Function(Q)
    imap = msh.topology.index_map(tdim)
    cells = np.arange(imap.size_local + imap.num_ghosts, dtype=np.int32)
    x = None
    U = np.empty((len(samples), len(u.x.array)))
    names = names or [f"sample {i}" for i in range(len(samples))]
    for k, sample in enumerate(samples):
        try:
            if sample.kind == "gaussian":
                u.interpolate(_gaussian(sample, msh.geometry.dim))
                U[k] = u.x.array
                continue
            if sample.kind == "image":
                if x is None:  # what Function.interpolate evaluates a callable at
                    x = _cpp.fem.interpolation_coords(Q.element._cpp_object, msh.geometry._cpp_object, cells)
                u0._cpp_object.interpolate_f(np.asarray(_cell_values(sample, x), dtype=np.float64), cells)
            else:
                _deposit(u0, sample.params["points"], sample.params["weights"])
        except ConfigError as e:
            raise ConfigError(f"{e} ({names[k]})") from None
        if Q is W:
            U[k] = u0.x.array
        else:
            u.interpolate(u0)
            U[k] = u.x.array
    m, n = lumped_mass(W), W.dofmap.index_map.size_local
    local = np.array([float(m[:n] @ U[k, :n]) for k in range(len(U))])  # per row: the dot of TokenTransport.mass
    mass = np.empty_like(local)
    msh.comm.Allreduce(local, mass, op=MPI.SUM)
    for k, sample in enumerate(samples):
        if not (np.isfinite(mass[k]) and mass[k] > 0):
            raise ConfigError(f"data ({sample.kind}): the input density has no mass on the token domain "
                              f"({names[k]})")
    U /= mass[:, None]
    return U


def _gaussian(sample: Sample, d: int) -> Callable[[Array], Array]:
    m, prec = sample.params["mean"], np.linalg.inv(sample.params["cov"])

    def density(x: Array) -> Array:
        xc = x[:d] - m[:, None]
        return np.exp(-0.5 * np.einsum("in,ij,jn->n", xc, prec, xc))
    return density


def fill_density(sample: Sample, u: dolfinx.fem.Function, mass_of: Callable[[dolfinx.fem.Function], float]
                 ) -> None:
    """Set the DG function u to the density of ``sample`` with mass 1.

    Args:
        sample: the input measure.
        u: a DG function on the token mesh (overwritten).
        mass_of: callable u ↦ ∫ u (the token solver's mass, reduced over ranks).

    Raises:
        ConfigError: the measure has no mass on Ω, or a point lies outside Ω.
    """
    W = u.function_space
    Q = dolfinx.fem.functionspace(W.mesh, ("DG", 0))
    u0 = dolfinx.fem.Function(Q)
    if sample.kind == "gaussian":
        u.interpolate(_gaussian(sample, W.mesh.geometry.dim))
    else:
        if sample.kind == "image":
            u0.interpolate(lambda x: _cell_values(sample, x))  # DG0: evaluated at cell midpoints
        else:
            _deposit(u0, sample.params["points"], sample.params["weights"])
        u.interpolate(u0)
    mass = mass_of(u)
    if not (np.isfinite(mass) and mass > 0):
        raise ConfigError(f"data ({sample.kind}): the input density has no mass on the token domain")
    u.x.array[:] /= mass


def _deposit(u0: dolfinx.fem.Function, points: Array, weights: Array) -> None:
    """Deposit weighted points into the DG0 function u0 (value w/|cell|), preserving Σ w exactly.

    A point on a cell boundary (a vertex or facet shared by cells, possibly of different ranks) goes to the
    candidate cell of smallest original cell index, once across all ranks: a rule every partition agrees on,
    so the deposit does not depend on the number of ranks.

    Raises:
        ConfigError: a point lies outside the mesh.
    """
    msh = u0.function_space.mesh
    tdim, d = msh.topology.dim, msh.geometry.dim
    nloc = msh.topology.index_map(tdim).size_local
    pts3 = np.zeros((len(points), 3))
    pts3[:, :d] = points
    tree = dolfinx.geometry.bb_tree(msh, tdim, padding=1e-12)
    cand = dolfinx.geometry.compute_collisions_points(tree, pts3)
    coll = dolfinx.geometry.compute_colliding_cells(msh, cand, pts3)
    big = np.iinfo(np.int64).max
    owner = np.repeat(np.arange(len(points)), np.diff(coll.offsets))
    cells = np.asarray(coll.array, dtype=np.int32)
    keep = cells < nloc
    owner, cells = owner[keep], cells[keep]
    # the original (input) cell index: the same on any partition, unlike the global index of the index map
    gcell = np.asarray(msh.topology.original_cell_index, dtype=np.int64)[cells]
    glob = np.full(len(points), big, dtype=np.int64)
    np.minimum.at(glob, owner, gcell)
    best = np.empty_like(glob)
    msh.comm.Allreduce(glob, best, op=MPI.MIN)
    if np.any(best == big):
        bad = int(np.flatnonzero(best == big)[0])
        raise ConfigError(f"data: point {points[bad].tolist()} lies outside the token domain")
    mine = gcell == best[owner]  # this rank holds the chosen cell of that point
    Q = u0.function_space
    dofs = Q.dofmap.list[cells[mine], 0]
    vals = np.zeros(len(u0.x.array))
    np.add.at(vals, dofs, weights[owner[mine]])
    vol = lumped_mass(Q)
    u0.x.array[:] = vals / vol
    u0.x.scatter_forward()
