"""The rules of the ``[data]`` section: its kinds against the token space, a data file against this node's memory."""

from __future__ import annotations

import math

import numpy as np

from mfpde.config.rules import check_input_file, require
from mfpde.config.schema import Config
from mfpde.domains import DOMAINS, data_kinds
from mfpde.errors import ConfigError
from mfpde.limits import check_gaussian_inside, check_matrix


def check_data(cfg: Config) -> None:
    """The data section against the token space (each check depends on the one before)."""
    t, da = cfg.tokens, cfg.data
    require(da.kind in (kinds := tuple(k for d in DOMAINS for k in data_kinds(d))), "data.kind", f"must be in {kinds}")
    if da.kind == "gaussian":
        n = len(da.mean)
        require(n >= 1 and all(len(m) == t.dim for m in da.mean), "data.mean", f"rows of length d={t.dim}")
        require(len(da.cov) == n, "data.cov", f"needs one {t.dim}x{t.dim} matrix per sample ({n})")
        for i, c in enumerate(da.cov):
            check_matrix(f"data.cov[{i}]", c, t.dim)
            if not t.mesh:
                check_gaussian_inside(f"data (sample {i}: data.mean[{i}], data.cov[{i}])", da.mean[i], c, t.box,
                                      "tokens.box (Ω)")
        require(len(da.target) == n, "data.target", f"needs one target per sample ({n})")
    elif da.kind == "digits":
        require(t.dim == 2, "data.kind", "digits are images on the unit square: needs tokens.dim = 2")
        require(len(da.classes) == 2 and all(0 <= c <= 9 for c in da.classes) and da.classes[0] != da.classes[1],
                 "data.classes", "two distinct digits 0..9")
        require(da.samples >= 2, "data.samples", "must be >= 2")
        require(da.seed >= 0, "data.seed", "must be >= 0")
        require(da.test_samples >= 0, "data.test_samples", "must be >= 0")
        require(len(da.origin) == 2 and all(np.isfinite(da.origin)), "data.origin", "needs 2 finite numbers")
    elif da.kind == "file":
        require(bool(da.path), "data.path", "needs the .npz file of the samples (data.kind = 'file')")
        check_input_file("data.path", da.path, "an .npz file")
        check_npz_fits("data.path", da.path)


def check_npz_fits(key: str, path: str) -> None:
    """Refuse an ``.npz`` whose headers claim arrays past this node's memory, before anything is loaded.

    A header claiming 2·10¹¹ elements raised numpy's ``_ArrayMemoryError`` (exit 1, a traceback): the arrays are
    read as float64 (8 bytes per element, whatever the stored type) and all of them at once.

    Raises:
        ConfigError: naming the key, the file, the arrays' shapes and the memory of this node.
    """
    from mfpde.io import npz_array_sizes
    from mfpde.limits import node_memory_bytes

    sizes = npz_array_sizes(path)
    need = sum(8 * math.prod(shape) for shape, _ in sizes.values())
    have = node_memory_bytes()
    if need > have:
        shapes = ", ".join(f"{k} {shape}" for k, (shape, _) in sizes.items())
        raise ConfigError(f"{key}: {str(path)!r} claims arrays of {need / 1e9:.3g} GB as float64 ({shapes}), more than "
                          f"the {have / 1e9:.3g} GB of this node")
