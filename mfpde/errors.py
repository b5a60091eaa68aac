"""The errors mfpde raises on purpose, and the exit status the CLI gives each (interface.md).

* :class:`ConfigError` (exit 2): invalid input: a config key, value, mesh, data file, output directory,
  checkpoint or PETSc option. The message names the key or file.
* :class:`ConfigErrors` (exit 2): several of those at once, each message naming its key; a
  :class:`ConfigError`.
* :class:`MeshError` (exit 2): a mesh file is missing, unreadable or of the wrong dimension; a
  :class:`ConfigError`.
* :class:`InputRefused` (exit 2): the input refused after the job started, before anything was computed;
  a :class:`ConfigError`.
* :class:`NumericalError` (exit 3): non-finite values, mass leaving the domain beyond the tolerance,
  positivity or mass lost, finite-time blow-up. The message says what, and where in depth or training.
* :class:`SolverError` (exit 3): a PETSc linear solve did not converge; a :class:`NumericalError`.

Anything else is a bug (exit 1). Errors are classified by type, never by their message.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ConfigError", "ConfigErrors", "InputRefused", "MeshError", "NumericalError", "SolverError"]


class ConfigError(ValueError):
    """Invalid input: a config key, value, mesh or data file. Exit status 2.

    Attributes:
        messages: one message per error, each naming its key (here the one message; :class:`ConfigErrors`
            has several), so that one handler serves both.
    """

    @property
    def messages(self) -> list[str]:
        """The one message of this error."""
        return [str(self)]


#: The most errors the message of :class:`ConfigErrors` lists (then "and N more"): 10⁵ unknown keys made one
#: line of 4 MB.
MAX_LISTED = 10


class ConfigErrors(ConfigError):
    """Several config errors at once (a config with two misspelt keys and a value out of range). Exit status 2.

    The message lists the first :data:`MAX_LISTED` and counts the rest; :attr:`messages` holds every one.

    Attributes:
        messages: one message per error, each naming its key.
    """

    def __init__(self, messages: list[str]) -> None:
        self._messages = list(messages)
        shown = self._messages[:MAX_LISTED]
        more = len(self._messages) - len(shown)
        super().__init__(f"{len(self._messages)} config errors: "
                         + "; ".join(f"({i}) {m}" for i, m in enumerate(shown, 1))
                         + (f"; and {more} more" if more else ""))

    @property
    def messages(self) -> list[str]:
        """One message per error."""
        return self._messages


class MeshError(ConfigError):
    """A mesh file is missing, unreadable or of the wrong dimension. Exit status 2."""


class InputRefused(ConfigError):
    """The input refused once the job has started, before anything was computed. Exit status 2.

    E.g. a first depth step that needs more CFL sub-steps than allowed, at the input's own velocity. The output
    directory is restored as it was (:mod:`mfpde.outdir`).
    """


class NumericalError(RuntimeError):
    """Numerical failure (non-finite values, a solver that did not converge, blow-up). Exit status 3.

    Attributes:
        partial: what the failed solver had computed up to its last good state (solver-specific), or None.
        block: the report block of that last good state, or None.
        blocks: where a job transports many samples, the report blocks of those done before the failed one, or None.
    """

    partial: Any = None
    block: Any = None
    blocks: Any = None


class SolverError(NumericalError):
    """A PETSc linear solve did not converge (KSP converged reason ≤ 0). Exit status 3."""
