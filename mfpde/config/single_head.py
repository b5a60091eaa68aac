"""The single head of the domains of Dirac heads: ``tokens.beta`` and ``tokens.coupling`` folded into ``heads.init``.

On the circle, the sphere and the hypersphere the heads are given either as ``heads.init`` (Diracs [[β, c], ...]) or
as the single head (β, K) by ``tokens.beta`` and ``tokens.coupling``; the config holds ``heads.init`` only
(:func:`fold_single_head`). A ``--set`` of one way replaces the file's other (:func:`later_heads_win`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from mfpde.config.schema import Heads
from mfpde.errors import ConfigError

__all__ = ["fold_single_head", "later_heads_win"]


def fold_single_head(raw: dict[str, Any], sections: dict[str, Any]) -> None:
    """``tokens.beta`` (and ``tokens.coupling``) off the box: heads.init becomes the single head (β, K), K = 1 unset.

    ``tokens.coupling`` sets K where the file has ``tokens.beta``. ``heads.init`` given as well, in the same source,
    is refused: two sources of β (a ``--set`` of one has already replaced the file's other, :func:`later_heads_win`).
    The config holds heads.init only: tokens.beta and tokens.coupling are unset after.

    Raises:
        ConfigError: β < 0, a box domain, ``tokens.coupling`` without ``tokens.beta``, or heads.init given as well
            (two sources of β).
    """
    tok = sections.get("tokens")
    if tok is None or not (math.isfinite(tok.beta) or math.isfinite(tok.coupling)):
        return
    key = "tokens.beta" if math.isfinite(tok.beta) else "tokens.coupling"
    if tok.domain == "box":
        raise ConfigError(f"{key}: only for the domains of Dirac heads (the circle, the sphere, the hypersphere); "
                          "boxes take heads.init")
    if not math.isfinite(tok.beta):
        raise ConfigError("tokens.coupling: needs tokens.beta (together they are the single head (β, K)); or give "
                          "heads.init = {kind = 'diracs', points = [[β, K]], weights = [1.0]}")
    if tok.beta < 0:
        raise ConfigError(f"tokens.beta: must be >= 0, got {tok.beta:g}")
    coupling = tok.coupling if math.isfinite(tok.coupling) else 1.0
    heads_raw = raw.get("heads", {})
    if isinstance(heads_raw, dict) and "init" in heads_raw:
        raise ConfigError(f"{key}: heads.init is given too; set β and K in one of them (tokens.beta = β with "
                          "tokens.coupling = K is heads.init = {kind = 'diracs', points = [[β, K]], weights = [1.0]})")
    heads = sections.get("heads", Heads())
    sections["heads"] = dataclasses.replace(heads, init={"kind": "diracs", "points": [[tok.beta, coupling]],
                                                         "weights": [1.0]})
    # folded into heads.init (config.toml has that)
    sections["tokens"] = dataclasses.replace(tok, beta=math.nan, coupling=math.nan)


#: The two ways to give the heads of a domain of Dirac heads: the single head (β, K), or heads.init.
_SINGLE_HEAD, _HEADS_INIT = ("tokens.beta", "tokens.coupling"), "heads.init"


def later_heads_win(raw: dict[str, Any], overridden: list[str]) -> None:
    """An override of the heads replaces the file's other way of giving them (the later word wins).

    ``--set heads.init=...`` on a file with ``tokens.beta`` (or ``tokens.coupling``) drops the file's single head;
    ``--set tokens.beta=...`` on a file with ``heads.init`` drops the file's heads.init. Both given in the file, or
    both by ``--set``, are still refused (:func:`fold_single_head`).
    """
    init = any(k == _HEADS_INIT or k.startswith(_HEADS_INIT + ".") for k in overridden)
    single = any(k in _SINGLE_HEAD for k in overridden)
    tokens, heads = raw.get("tokens"), raw.get("heads")
    if init and not single and isinstance(tokens, dict):
        for k in _SINGLE_HEAD:
            tokens.pop(k.split(".")[1], None)
    if single and not init and isinstance(heads, dict):
        heads.pop("init", None)
