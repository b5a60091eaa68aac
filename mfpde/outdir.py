"""The output directory of a job as one transaction: a refused run loses nothing of the previous result.

:func:`prepare_output_dir` (after the input is validated) moves the previous result of DIR (``report.json``,
``history.csv``, ``config.toml``, ``fields/``, ``plots/`` and, unless resuming, ``checkpoint/``) into
``DIR/.mfpde-previous/``, so that nothing stale looks like a result of the new run. When the job ends,
:func:`settle_output_dir` (called by :class:`mfpde.environment.OutputLock` on exit):

* the input refused after the directory was prepared but before anything was computed
  (:class:`~mfpde.errors.InputRefused`, exit 2: e.g. a first depth step that would need more CFL sub-steps than
  allowed, at the input's own velocity), or a job ended by a signal or a crash without a result of its own (no
  ``report.json``, no checkpoint): what it wrote is removed and the previous result is moved back, as it was;
* anything else (success, a numerical failure with its last good state, an interruption with its checkpoint, a
  full disk with the steps written so far): the previous result is deleted.

A job killed outright leaves ``.mfpde-previous/`` behind with its own partial output in DIR; the next job in DIR
removes that output and keeps ``.mfpde-previous/`` as the previous result. Only rank 0 touches the
file system; the others agree on its outcome, with one exception: a signal that reached another rank alone
leaves rank 0 in a collective of the solve, and the CLI ends the job from that rank (``MPI_Abort``) after a grace;
that rank first settles DIR in rank 0's stead (:func:`settle_for_rank0`), where the lock ``DIR/.mfpde.lock`` still
names rank 0 (rank 0 removes it once it has settled DIR itself), and removes the lock: an interruption on
any rank leaves DIR as a signal to rank 0 does (no lock, no ``config.toml``, no ``fields/`` of its own).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import socket
from pathlib import Path

from mpi4py import MPI

from mfpde.errors import ConfigError, InputRefused, NumericalError

__all__ = ["NOT_A_FOLDER", "PREVIOUS", "RESERVED_TREES", "RESULT", "SYSTEM_DIRS", "prepare_output_dir", "reserved",
           "settle_for_rank0", "settle_output_dir"]

#: The folder of DIR where the previous result waits until the new job ends.
PREVIOUS = ".mfpde-previous"
#: The files and folders of DIR that make a result.
RESULT = ("report.json", "history.csv", "predictions.csv", "config.toml", "fields", "plots", "checkpoint", "pde",
          "pde-refined")
#: The directories prepared by this process (rank 0) and not yet settled: DIR → resumed (its checkpoint kept).
_pending: dict[Path, bool] = {}
#: The same on the other ranks: DIR → (resumed, rank 0's "pid host" line of the lock), for :func:`settle_for_rank0`.
_elsewhere: dict[Path, tuple[bool, str]] = {}
#: The name of the lock file of DIR (:class:`mfpde.environment.OutputLock`).
LOCK = ".mfpde.lock"


#: Directories never used as DIR themselves: the system's own and the roots of users' and mounts' trees (mfpde
#: clears DIR's fields/, plots/ and checkpoint/ before a run); their subdirectories may be (/tmp/run1, /home/me/run1).
SYSTEM_DIRS = frozenset({"/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media",
                         "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/snap", "/srv", "/sys", "/tmp", "/usr",
                         "/var", "/var/tmp"})
#: The trees the filesystem hierarchy (FHS 3.0) reserves for the system: programs and libraries (/usr, /bin, /sbin,
#: /lib*, /boot), configuration (/etc), the kernel's and devices' virtual files (/proc, /sys, /dev, /run) and
#: programs' state (/var/lib, /var/cache, /var/log, /var/spool, /var/mail, /var/opt, /var/backups). Neither they nor
#: any directory below them is a DIR (``--out /usr/lib`` wrote its report, history and checkpoint there).
RESERVED_TREES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot", "/etc", "/proc", "/sys",
                  "/dev", "/run", "/var/lib", "/var/cache", "/var/log", "/var/spool", "/var/mail", "/var/opt",
                  "/var/backups")


def reserved(real: Path, home: Path | None = None) -> str:
    """What the resolved directory ``real`` is, if mfpde must not write its files there; ``""`` if it may.

    Refused: the root of a file system, the home directory, a directory of :data:`SYSTEM_DIRS` and any directory in
    a tree of :data:`RESERVED_TREES` (except below the home directory, where a system account's home may lie).
    """
    if real == Path(real.anchor):
        return "the root of the file system"
    if home is not None and real == home:
        return "the home directory"
    if str(real) in SYSTEM_DIRS:
        return "a system directory"
    if home is not None and home != Path(home.anchor) and home in real.parents:
        return ""
    tree = next((t for t in RESERVED_TREES if real == Path(t) or Path(t) in real.parents), "")
    return f"in {tree}, which the filesystem hierarchy reserves for the system" if tree else ""


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


#: Why DIR cannot be a file (``--out`` names the folder the results are written into).
NOT_A_FOLDER = "a file, not a folder (mfpde writes a folder of results there: give a folder's path)"


def prepare_output_dir(out: Path, comm: MPI.Comm = MPI.COMM_WORLD, keep: bool = False) -> None:
    """Make DIR writable and move a previous result aside (see the module), so that nothing stale looks new.

    Args:
        out: DIR.
        comm: the job's ranks (rank 0 works, every rank agrees).
        keep: resuming: ``checkpoint/`` stays where it is.

    Raises:
        ConfigError: on every rank: DIR is a file or not writable, or a file is where mfpde writes a folder.
    """
    out = Path(out)
    err = ""
    if comm.rank == 0:
        try:
            if out.exists() and not out.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, NOT_A_FOLDER)
            out.mkdir(parents=True, exist_ok=True)
            probe = out / ".mfpde-write-test"
            probe.write_text("")
            probe.unlink()
            for sub in ("fields", "plots", "checkpoint"):  # a file where mfpde writes a directory
                if (out / sub).exists() and not (out / sub).is_dir():
                    err = f"--out {str(out)!r}: {str(out / sub)!r} is not a directory (move it away)"
            if not err:
                prev = out / PREVIOUS
                names = [n for n in RESULT if (out / n).exists() and not (keep and n == "checkpoint")]
                if prev.exists():  # a job killed outright: DIR holds its partial output, prev the result before it
                    for n in names:
                        _remove(out / n)
                elif names:
                    prev.mkdir()
                    for n in names:
                        os.replace(out / n, prev / n)
                _pending[out.resolve()] = keep
        except OSError as e:
            err = f"--out {str(out)!r}: {e.strerror or e}"
    err, holder = comm.bcast((err, f"{os.getpid()} {socket.gethostname()}"), root=0)
    if err:
        raise ConfigError(err)
    if comm.rank != 0:
        with contextlib.suppress(OSError, RuntimeError):
            _elsewhere[out.resolve()] = (keep, holder)


def settle_output_dir(out: Path, exc: BaseException | None) -> None:
    """End DIR's transaction (rank 0; no collective: it runs on the way out of any error).

    Args:
        out: DIR.
        exc: how the job ended: None (done), or the exception that ended it. The previous result is moved back
            (and what the job wrote removed) on an :class:`~mfpde.errors.InputRefused`, and on a signal or a crash
            (any exception but a :class:`~mfpde.errors.ConfigError` or :class:`~mfpde.errors.NumericalError`,
            which keep their last good state: a full disk keeps the steps written) that left no result of its
            own (no ``report.json``, no ``checkpoint/state.npz``); otherwise the previous result is deleted.
            Nothing happens if this process did not prepare DIR.
    """
    key = Path(out).resolve()
    if key not in _pending:
        return
    kept = _pending.pop(key)
    prev = key / PREVIOUS
    result = (key / "report.json").exists() or (key / "checkpoint" / "state.npz").exists()
    kept_state = exc is None or (isinstance(exc, ConfigError | NumericalError) and not isinstance(exc, InputRefused))
    with contextlib.suppress(OSError):
        if isinstance(exc, InputRefused) or not (result or kept_state):
            for n in RESULT:
                if n == "checkpoint" and kept:
                    continue
                _remove(key / n)
                if (prev / n).exists():
                    os.replace(prev / n, key / n)
        _remove(prev)


def settle_for_rank0(exc: BaseException) -> bool | None:
    """Settle, from a rank other than 0, the DIRs that rank 0 prepared and has not settled (the module).

    Called by the CLI on a rank that ends the job alone (a signal that reached it only) just before
    ``MPI_Abort``: rank 0 waits in a collective meanwhile and would be killed with DIR unsettled (the lock,
    ``config.toml`` and ``fields/`` left behind). A DIR whose lock no longer names rank 0 was settled by rank 0.

    Returns:
        None where this rank knows of no DIR prepared by rank 0 (rank 0 itself, a set-up not that far); else
        whether it settled one here (False: rank 0 had settled them, so it got the signal too).
    """
    if not _elsewhere:
        return None
    done = False
    for key, (keep, holder) in list(_elsewhere.items()):
        _elsewhere.pop(key)
        lock = key / LOCK
        try:
            if lock.read_text().strip() != holder:
                continue
        except OSError:  # no lock: rank 0 settled DIR and removed it
            continue
        _pending[key] = keep
        settle_output_dir(key, exc)
        with contextlib.suppress(OSError):
            lock.unlink()
        done = True
    return done
