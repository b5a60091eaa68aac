"""PETSc's start, for the CLI: options PETSc cannot read while it starts are an input error naming them.

PETSc reads ``PETSC_OPTIONS`` and the ``.petscrc`` files when petsc4py is first imported (``PetscInitialize``);
an error there (``PETSC_OPTIONS="-options_file /etc/passwd"``, a damaged ``.petscrc``) printed PETSc's error stack
of a dozen lines and ended in a petsc4py traceback (exit 1). :func:`start_petsc` imports it with file descriptor 2
captured and turns such an error into one :class:`~mfpde.errors.ConfigError` (exit 2).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable

from mfpde.errors import ConfigError

__all__ = ["start_petsc"]


def start_petsc(init: Callable[[], None], env: dict[str, str] | None = None) -> None:
    """Start PETSc with file descriptor 2 captured; a no-op if PETSc is imported already.

    ``init`` (e.g. :func:`mfpde.signals.quiet_petsc`) runs first, then petsc4py's PETSc is imported.

    PETSc reads ``PETSC_OPTIONS`` and the ``.petscrc`` files while it starts; an error there printed PETSc's error
    stack (a dozen lines) and ended in a petsc4py traceback (exit 1).

    Raises:
        ConfigError: PETSc did not start: PETSc's reason, naming ``PETSC_OPTIONS`` if it is set.
    """
    if "petsc4py.PETSc" in sys.modules:
        return
    env = dict(os.environ) if env is None else env
    failed: BaseException | None = None
    sys.stderr.flush()
    with tempfile.TemporaryFile() as buf:
        saved = os.dup(2)
        os.dup2(buf.fileno(), 2)
        try:
            init()
            from petsc4py import PETSc  # noqa: F401
        except Exception as e:  # petsc4py.PETSc.Error, which cannot be named before the import succeeds
            failed = e
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        buf.seek(0)
        text = buf.read().decode(errors="replace")
    if failed is None:
        sys.stderr.write(text)  # PETSc's own warnings at start, if any, as they were
        return
    lines = [ln.split("PETSC ERROR:", 1)[1].strip() for ln in text.splitlines() if "PETSC ERROR:" in ln]
    told = [ln for ln in lines[1:] if ln][:3]  # PETSc's kind and message, before "See https://petsc.org/..."
    told = told[:next((i for i, ln in enumerate(told) if ln.startswith("See ")), len(told))]
    reason = ": ".join(told) or str(failed)
    where = "PETSC_OPTIONS" if env.get("PETSC_OPTIONS", "").strip() else "PETSc's options (.petscrc files)"
    raise ConfigError(f"{where}: PETSc could not start: {reason}")
