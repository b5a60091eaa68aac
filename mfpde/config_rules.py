"""Config rules beyond single values, for :func:`mfpde.config.validate` and :func:`mfpde.config.from_dict`.

* :func:`check_input_file`: a file key (``data.path``, ``tokens.mesh``, ``heads.mesh``, the config file) names a
  regular file; a directory, a FIFO, a socket or a device is named as such (opening a FIFO would block).
* :func:`check_applies`: a key given in the config that the problem does not use (``data.samples`` with
  ``data.split``, ``heads.a`` with the scalar family, ``tokens.box`` on the circle) is refused, with why.

Errors are :class:`~mfpde.errors.ConfigError` naming the key (exit status 2).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from mfpde.errors import ConfigError, ConfigErrors

__all__ = ["check_applies", "check_input_file"]

#: What a path is, by the file-type bits of its ``stat`` (a regular file is what a key wants).
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def check_input_file(key: str, path: str | Path, what: str = "file") -> None:
    """Refuse a path that is missing or not a regular file, saying which (never opens it).

    Args:
        key: the config key (or "config file") named in the message.
        path: the path given.
        what: what the key wants, for the message (e.g. "an .npz file").

    Raises:
        ConfigError: ``"<key>: '<path>' not found"``, or ``"... is a directory, not <what>"`` (FIFO, ...).
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ConfigError(f"{key}: {str(path)!r} not found") from None
    except OSError as e:  # permission denied on a parent, a name too long, a loop of links
        raise ConfigError(f"{key}: {str(path)!r} cannot be read: {e.strerror or e}") from None
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    raise ConfigError(f"{key}: {str(path)!r} is {kind}, not {what}")


def check_applies(raw: dict[str, Any], cfg: Any) -> None:  # a Config: importing it would be a cycle
    """Refuse a key given (in ``raw``, the parsed TOML with the overrides) that the problem ``cfg`` does not use.

    Each was dropped without a word: ``data.samples`` and ``data.test_samples`` when ``data.split`` takes every
    image of the pair, ``heads.a`` with the scalar family (whose a is a parameter), ``tokens.box`` and
    ``tokens.cell`` on the circle (whose cells are ``tokens.cells = [n]``). Keys of another data kind, readout or
    regulariser are not refused: ``--set data.kind=...`` on a file is how a file is reused.

    Raises:
        ConfigError: naming the key and what makes it not apply (:class:`~mfpde.errors.ConfigErrors` for several).
    """
    t, h, da = cfg.tokens, cfg.heads, cfg.data
    split = da.kind == "digits" and 0 < da.split < 1
    rules = (
        ("data", "samples", split, f"data.split = {da.split:g} takes every image of the pair, that fraction for "
         "training; set data.split = 0 to draw data.samples and data.test_samples"),
        ("data", "test_samples", split, f"data.split = {da.split:g} takes every image of the pair, the rest for "
         "testing; set data.split = 0 to draw data.samples and data.test_samples"),
        ("heads", "a", h.family == "scalar", "the scalar family's a is a parameter (θ = (a, v)); heads.a is the "
         "fixed a of heads.family = 'value'"),
        ("tokens", "box", t.domain == "circle", "the circle has no box (the angle in [0, 2π), its cells "
         "tokens.cells = [n])"),
        ("tokens", "cell", t.domain == "circle", "the circle's cells are intervals of the angle"),
    )
    found = [f"{sec}.{key}: does not apply: {why}" for sec, key, unused, why in rules
             if unused and isinstance(raw.get(sec), dict) and key in raw[sec]]
    if len(found) == 1:
        raise ConfigError(found[0])
    if found:
        raise ConfigErrors(found)
