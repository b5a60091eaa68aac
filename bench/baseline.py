"""The code of an earlier commit, checked out beside this tree for a side-by-side benchmark."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def baseline_tree(rev: str | None) -> Iterator[Path | None]:
    """A detached ``git worktree`` of commit ``rev`` in a temporary directory, removed on exit.

    Yields None for ``rev`` None or "none". A benchmark imports the tree first through ``PYTHONPATH``.
    """
    if rev is None or rev == "none":
        yield None
        return
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base), rev], check=True)
        try:
            yield base
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=True)
