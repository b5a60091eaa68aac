"""The config rules of the box domain (``tokens.domain = "box"``, theory §1–§3), for :func:`mfpde.config.validate`.

A box Ω ⊂ R^d (d = 1, 2) or a mesh of one, solved by upwind DG (``tokens.solver = "dg"``) on uniform depth steps
(``depth.spacing = "uniform"``) without noise; the data are ``gaussian``, ``digits`` or an ``.npz`` ``file``.
Ω itself (``tokens.dim``, ``tokens.box``, ``tokens.cells``, ``tokens.mesh``), ``tokens.degree`` and the data
against Ω (:func:`mfpde.config.data.check_data`) are checked by :func:`mfpde.config.validate`, in the order of its
tables. The box counts no clusters: it has no ``coarser`` (no resolution check). Errors name the key
(:class:`~mfpde.errors.ConfigError`, exit 2).
"""

from __future__ import annotations

from typing import Any

from mfpde.domains import Found, domain_of_kind

__all__ = ["KINDS", "check", "not_applying"]

#: The data kinds of the box.
KINDS = ("gaussian", "digits", "file")


def check(cfg: Any, reads_data: bool = True) -> None:
    """Check the box keys of a :class:`~mfpde.config.Config` with ``tokens.domain = "box"``.

    Refuse another domain's data kind, ``tokens.solver`` other than "dg", ``depth.spacing`` other than "uniform"
    and ``tokens.noise``.

    Raises:
        ConfigError: naming the key (:class:`~mfpde.errors.ConfigErrors`, naming each, for several).
    """
    t, da, d = cfg.tokens, cfg.data, cfg.depth
    f = Found()
    other = domain_of_kind(da.kind)
    f.need(other in (None, "box"), "data.kind", f"{da.kind!r} needs tokens.domain = {other!r}")
    off_box = "tokens.domain = 'circle', 'sphere' or 'hypersphere'"
    f.need(t.solver == "dg", "tokens.solver", f"{t.solver!r} needs {off_box} (boxes are solved by DG)")
    f.need(d.spacing == "uniform", "depth.spacing", f"{d.spacing!r} needs {off_box}")
    f.need(t.noise == 0, "tokens.noise", f"{t.noise:g} needs {off_box} (noise is not on boxes)")
    f.raise_all()


def not_applying(cfg: Any) -> list[tuple[str, str, bool, str]]:
    """(section, key, does not apply, why) for the keys of the other domains given on the box.

    ``tokens.attention = "unnormalised"`` on a box was softmax without a word: the box's attention is the softmax
    of its heads (theory §1).
    """
    off = "tokens.domain = 'circle', 'sphere' or 'hypersphere'"
    return [("tokens", "attention", True, f"the box's attention is the softmax over its heads; tokens.attention "
             f"chooses it on {off}"),
            ("tokens", "labels", True, f"tokens.labels counts the flow solver's labels ({off}); boxes are solved "
             "by DG"),
            ("tokens", "rtol", True, f"tokens.rtol is the flow solver's tolerance ({off}); boxes are solved by DG")]
