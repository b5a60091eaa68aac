"""The commands' progress: a tqdm bar with an ETA on a terminal (rank 0 only), the log lines written above it."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Protocol

from mpi4py import MPI

__all__ = ["BAR_FORMAT", "Bar", "Progress", "ProgressFactory", "bar_wanted", "progress"]

logger = logging.getLogger("mfpde")


class Progress(Protocol):
    """A progress display (e.g. a tqdm bar): one ``update`` per training step, then ``close``."""

    def update(self, n: int = 1) -> object:
        """Advance by n steps."""
        ...

    def close(self) -> None:
        """Finish the display."""
        ...


#: Makes a progress display from (total steps, steps already done); the CLI's is a tqdm bar.
ProgressFactory = Callable[[int, int], Progress]


#: The progress bar: steps done of the total, elapsed time, ETA (tqdm's estimate of the remaining time), rate.
BAR_FORMAT = ("{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} steps "
              "[{elapsed} elapsed, ETA {remaining}, {rate_fmt}{postfix}]")


class Bar:
    """A tqdm bar on stderr with the ``mfpde`` log lines written above it (``logging_redirect_tqdm``) until closed."""

    def __init__(self, total: int, initial: int, desc: str = "mfpde run", unit: str = "step") -> None:
        from tqdm import tqdm  # only on a terminal
        from tqdm.contrib.logging import logging_redirect_tqdm

        self._redirect = logging_redirect_tqdm(loggers=[logger])
        self._redirect.__enter__()
        self._bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr,
                         bar_format=BAR_FORMAT.replace(" steps ", f" {unit}s "))

    def update(self, n: int = 1) -> object:
        """Advance by n training steps."""
        return self._bar.update(n)

    def describe(self, text: str) -> None:
        """Show what runs now after the counts (verify: the check's name)."""
        self._bar.set_postfix_str(text)

    def close(self) -> None:
        """Close the bar and give the log lines their handler back."""
        self._bar.close()
        self._redirect.__exit__(None, None, None)


def bar_wanted(quiet: bool) -> bool:
    """Whether to show a tqdm bar: on a terminal, rank 0 only, not with ``--quiet``."""
    return not (quiet or MPI.COMM_WORLD.rank != 0 or not sys.stderr.isatty())


def progress(quiet: bool, desc: str = "mfpde run") -> ProgressFactory | None:
    """A tqdm bar with an ETA on a terminal (rank 0 only), else None (a log line per output step is printed instead).

    While the bar is shown, log lines go through ``tqdm.write`` so they do not break it.
    """
    if not bar_wanted(quiet):
        return None
    return lambda total, initial: Bar(total, initial, desc)
