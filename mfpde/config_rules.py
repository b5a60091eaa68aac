"""Config rules beyond single values, for :func:`mfpde.config.validate` and :func:`mfpde.config.from_dict`.

* :func:`check_input_file`: a file key (``data.path``, ``tokens.mesh``, ``heads.mesh``, the config file) names a
  regular file; a directory, a FIFO, a socket or a device is named as such (opening a FIFO would block).
* :func:`check_applies`: a key given in the config that the problem does not use (``data.samples`` with
  ``data.split``, ``heads.a`` with the scalar family, ``tokens.box`` on the circle) is refused, with why
  (:func:`mfpde.config_keys.in_use` says which keys are used).

Errors are :class:`~mfpde.errors.ConfigError` naming the key (exit status 2).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from mfpde.errors import ConfigError

__all__ = ["check_input_file"]

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
