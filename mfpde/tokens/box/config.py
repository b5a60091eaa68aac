"""The config rules of the box domain (``tokens.domain = "box"``, theory §1–§3), for :func:`mfpde.config.validate`.

A box Ω ⊂ R^d (d = 1, 2) or a mesh of one, solved by upwind DG (``tokens.solver = "dg"``) on uniform depth steps
(``depth.spacing = "uniform"``) without noise; the data are ``gaussian``, ``digits`` or an ``.npz`` ``file``.
Ω itself (``tokens.dim``, ``tokens.box``, ``tokens.cells``, ``tokens.mesh``), ``tokens.degree`` and the data
against Ω (:func:`mfpde.config.data.check_data`) are checked by :func:`mfpde.config.validate`, in the order of its
tables. The box counts no clusters: it has no ``coarser`` (no resolution check). Errors name the key
(:class:`~mfpde.errors.ConfigError`, exit 2). The box's transport and its problem (:mod:`mfpde.tokens.box.problem`)
read the box's :class:`Section` of the config (:func:`section`); training's adds ``[training]`` to it
(:class:`mfpde.training.config.Section`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mfpde.domains import Found, domain_of_kind

if TYPE_CHECKING:  # the config is the caller's: the domains stand below it
    from mfpde.config.schema import Data, Depth, Heads, Loss, Output, Tokens

__all__ = ["KINDS", "Section", "check", "not_applying", "section"]

#: The data kinds of the box.
KINDS = ("gaussian", "digits", "file")


@dataclass(frozen=True)
class Section:
    """The box's section of the config: what its transport and its problem read (built by :func:`section`).

    The box's problem is the training problem's forward half, so its section is whole config sections rather
    than single keys.

    Attributes:
        tokens: the ``[tokens]`` section (Ω, its mesh and DG space, the CFL factor, ``outflow_tol``).
        depth: the ``[depth]`` section (T, the depth steps, the model and its layers, the depth scheme).
        heads: the ``[heads]`` section (the family, Θ and ρ₀).
        data: the ``[data]`` section (the samples).
        loss: the ``[loss]`` section (the readout).
        output: the ``[output]`` section (``every``, ``fields``, ``plots``).
        token_options: ``petsc.token`` (the token mass solver's PETSc options).
    """

    tokens: Tokens
    depth: Depth
    heads: Heads
    data: Data
    loss: Loss
    output: Output
    token_options: dict[str, Any]


def section(cfg: Any) -> Section:
    """The box's section of a validated config."""
    return Section(cfg.tokens, cfg.depth, cfg.heads, cfg.data, cfg.loss, cfg.output, dict(cfg.petsc.token))


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
