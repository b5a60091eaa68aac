"""FFCx's JIT cache on clusters and in containers: a damaged entry repaired, an unusable cache named in one line.

Called by :mod:`mfpde.cli` and :mod:`mfpde.jobs.continuation` only:

* :func:`jit_cache_problem`: an exception caused by a damaged or unusable FFCx cache (a truncated ``.so``,
  a ``.c`` left by a killed compile, a read-only cache lacking a module) becomes one line naming the cache
  and the fix, instead of a traceback.
* :func:`repair_jit_cache`: a damaged FFCx cache entry (a ``.c`` left by a killed compile, a truncated ``.so``)
  is moved aside into ``<cache>/damaged/`` and compiled again, under an ``flock`` per entry, so that the jobs
  sharing a cache wait for one compile instead of seeing each other's half-written files; the compiler is
  given :data:`JIT_QUIET_FLAGS` (the generated C declares quadrature tables some kernels do not use).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sys
import time
from pathlib import Path
from types import TracebackType

__all__ = ["JIT_QUIET_FLAGS", "jit_cache_problem", "repair_jit_cache"]

logger = logging.getLogger(__name__)

#: C compiler flags added to FFCx's ``cffi_extra_compile_args`` (after DOLFINx's and the user's): the generated
#: kernels declare quadrature weights they do not all use, and gcc's warnings about them reached the user's
#: terminal on a cold cache.
JIT_QUIET_FLAGS = ("-Wno-unused-variable", "-Wno-unused-const-variable", "-Wno-unused-but-set-variable")


def _entry_files(cache: Path, module: str) -> list[Path]:
    """The files of one FFCx cache entry: ``<module>.c``, ``.c.cached``, ``.o`` and the compiled module."""
    return [p for p in cache.glob(module + ".*") if not p.name.endswith(".lock")]


def _move_aside(cache: Path, module: str, why: str) -> None:
    """Rename the files of a damaged entry into ``<cache>/damaged/`` (atomic; a process that loaded it keeps it)."""
    aside = cache / "damaged"
    aside.mkdir(exist_ok=True)
    stamp = f"{os.getpid()}-{time.time_ns()}"
    for p in _entry_files(cache, module):
        with contextlib.suppress(FileNotFoundError):
            os.replace(p, aside / f"{p.name}.{stamp}")
    logger.info("FFCx JIT cache entry %s was damaged (%s): moved to %s and compiled again", module, why, aside)


def repair_jit_cache() -> None:
    """Wrap FFCx's cache lookup so that a damaged entry is moved aside and compiled again (call before JIT).

    FFCx marks a compile in progress by the ``.c`` file and a finished one by ``.c.cached``; a job killed
    in between left a ``.c`` that made every later job wait and fail (TimeoutError), and a truncated ``.so``
    failed to import. Here each lookup of an entry holds ``flock`` on ``<cache>/<module>.lock`` until its
    compile has ended, so among mfpde jobs sharing a cache a ``.c`` without its ``.c.cached`` is always a dead
    compile: it is moved aside, as is an entry whose module does not import, and FFCx compiles it again.
    A plain FFCx process compiling the same entry at that moment does not take the lock and is not covered.
    """
    import ffcx.codegeneration.jit as jit

    if getattr(jit, "_mfpde_repair", False):
        return
    lookup, compile_forms, compile_expressions = jit.get_cached_module, jit.compile_forms, jit.compile_expressions
    held: list[int] = []

    def get_cached_module(module_name, object_names, cache_dir, timeout):
        cache = Path(cache_dir)
        cache.mkdir(parents=True, exist_ok=True)
        fd = os.open(cache / f"{module_name}.lock", os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)  # released by compile_* below, or by the kernel if this process dies
        held.append(fd)
        c = cache / f"{module_name}.c"
        if c.exists() and not c.with_suffix(".c.cached").exists():
            _move_aside(cache, module_name, "a compile that never finished")
        try:
            return lookup(module_name, object_names, cache, timeout)
        except (ImportError, OSError, AttributeError, TimeoutError) as e:
            _move_aside(cache, module_name, f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
            sys.modules.pop(module_name, None)
            return lookup(module_name, object_names, cache, timeout)

    def locked(fn):
        def run(*args, **kwargs):
            kwargs["cffi_extra_compile_args"] = [*(kwargs.get("cffi_extra_compile_args") or []), *JIT_QUIET_FLAGS]
            n = len(held)
            try:
                return fn(*args, **kwargs)
            finally:
                while len(held) > n:
                    os.close(held.pop())

        return run

    jit.get_cached_module = get_cached_module
    jit.compile_forms, jit.compile_expressions = locked(compile_forms), locked(compile_expressions)
    jit._mfpde_repair = True  # type: ignore[attr-defined]


def _jit_frames(tb: TracebackType | None) -> bool:
    """Whether a traceback passes through FFCx's JIT (the cache lookup, load and compile)."""
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.replace(os.sep, "/").endswith("ffcx/codegeneration/jit.py"):
            return True
        tb = tb.tb_next
    return False


def jit_cache_problem(e: BaseException) -> str:
    """One line for an exception caused by a damaged or unusable FFCx JIT cache, else "".

    Recognised: ImportError (a truncated module), TimeoutError (a ``.c`` left by a killed compile) and
    OSError (a read-only cache) raised inside FFCx's JIT, and DOLFINx's "JIT compilation failed on rank 0"
    / "JIT cache load failed" on the other ranks of an MPI job. Compiler and form errors are not.
    """
    chain: list[BaseException] = []
    x: BaseException | None = e
    while x is not None and len(chain) < 10:
        chain.append(x)
        x = x.__cause__ or x.__context__
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fenics"
    cause: BaseException | None = next((x for x in chain if isinstance(x, ImportError | TimeoutError | OSError)
                                        and _jit_frames(x.__traceback__)), None)
    for x in chain if cause is None else ():
        msg = str(x)
        if not isinstance(x, RuntimeError):
            continue
        if msg.startswith("Failed JIT compilation of form:") and (str(cache) in msg or "timed out" in msg):
            cause = x  # rank 0 of an MPI job: DOLFINx re-raises the cache error as a message
        elif msg.startswith(("JIT compilation failed on rank", "JIT cache load failed")):
            cause = x  # the other ranks
    if cause is None:
        return ""
    what = f" ({type(cause).__name__}: {str(cause).splitlines()[0][:200]})"
    return (f"the FFCx JIT cache {str(cache)!r} is damaged or unusable{what}: remove it, or set XDG_CACHE_HOME "
            "to an empty directory, and run again")
