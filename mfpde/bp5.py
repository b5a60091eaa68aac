"""Checks of an ADIOS2 BP5 directory (what ``dolfinx.io.VTXWriter`` writes) before ADIOS2 reads it.

ADIOS2's reader trusts the files: on a ``.bp`` whose ``data.0`` was cut it read past the end (a hang when
halved, a segfault when 8 bytes short), on an empty ``md.idx`` it crashed, on a halved one it read 2 of 7 steps
without a word. :func:`check_bp5` reads the layout that the BP5 engine writes (ADIOS2's ``bp5dbg`` tool reads it
the same way) and raises :class:`~mfpde.errors.ConfigError` naming the file that does not hold what the others
promise:

* ``md.idx``: a 64-byte header (``ADIOS-BP v2…``, byte 36 the endianness, 37 the BP version 5, 38 the minor
  version, 39 whether a writer still has the file open), then records of one type byte, a little-endian uint64
  length and that many bytes: ``w`` (writer count, aggregator count, subfile count, then each writer's subfile),
  ``s`` (a step: its metadata position and size in ``md.0``, the flush count F, then per writer 2F + 1 uint64:
  the positions and sizes of its flushes and the position of its data in its ``data.<subfile>``), ``m``.
* ``md.0``: one record per step, its size (uint64) then the record, which starts with 2 sizes per writer.
* ``mmd.0``: records of an id length and an info length (uint64 each), then the id and the info.

The index must list every step of ``md.0`` (same count, same positions), each file must end where its last
record does, and every data position must lie inside its subfile. How far each writer's data of a step reaches
is known only from its arrays' block sizes, which ADIOS2 reads from the (checked) metadata:
:func:`check_data_extent` checks it. BP5 places a writer's arrays one after the other, each aligned to its
element size; the VTX arrays are 8-byte (geometry, connectivity, point ids, values) but for the 1-byte
``vtkGhostType``, written before the point ids. So a writer's data of a step spans at least the bytes of its
8-byte arrays plus its 1-byte ones rounded up to 8. Measured on the files of :mod:`mfpde.fields`: exactly
where ``data.0`` ends for the μ of ``transport``; 8 bytes short of it for ``rho.bp`` and ``mu_T_*.bp``, whose
VTK counts (``NumberOfNodes``, ``NumberOfEntities`` or ``NumberOfCells``, 4 bytes each) are in the data too. A
cut of at most those 8 bytes at the end of a data file is therefore not seen, but harmless: ADIOS2 reads the
counts from the metadata, and such a file read back the same arrays (checked by cutting 1 and 8 bytes of a
3-rank ``rho.bp`` and a 1-rank ``mu_T_*.bp``); any longer cut is seen.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mfpde.errors import ConfigError

__all__ = ["Layout", "check_bp5", "check_data_extent"]

HEADER = 64
_U64 = struct.Struct("<Q")


def _damaged(f: Path, why: str) -> ConfigError:
    return ConfigError(f"{str(f)!r}: damaged .bp file ({why}); write it again")


def _records(f: Path, data: bytes, start: int, parse: Callable[[bytes, int], int], what: str) -> int:
    """Walk data from start by parse(data, pos) → next pos; the number of records. Raises if they overrun."""
    pos, n = start, 0
    while pos < len(data):
        try:
            nxt = parse(data, pos)
        except struct.error:
            nxt = len(data) + 1
        if nxt > len(data) or nxt <= pos:
            raise _damaged(f, f"{what} {n} runs past the end of the file ({len(data)} bytes)")
        pos, n = nxt, n + 1
    return n


@dataclass
class Layout:
    """Where a checked BP5 directory keeps its data.

    Attributes:
        subfiles: per writer (rank), the ``data.<subfile>`` it writes to.
        positions: per step, per writer, the byte where that writer's data of the step starts in its subfile.
    """

    subfiles: list[int]
    positions: list[list[int]]


def check_bp5(path: Path) -> Layout:
    """Check that the BP5 directory path is whole (the index, the metadata, the data positions); its layout.

    Raises:
        ConfigError: naming the file that is missing, too short, or does not match the others.
    """
    files = {name: path / name for name in ("md.idx", "md.0", "mmd.0")}
    for f in files.values():
        if not f.is_file():
            raise ConfigError(f"{str(f)!r}: missing (not a whole .bp file written by mfpde)")
    idx_file = files["md.idx"]
    idx = idx_file.read_bytes()
    if len(idx) < HEADER or not idx.startswith(b"ADIOS-BP v2"):
        raise _damaged(idx_file, f"{len(idx)} bytes, no ADIOS-BP index header")
    if idx[37] != 5 or idx[36] != 0:
        raise ConfigError(f"{str(idx_file)!r}: BP version {idx[37]} ({'big' if idx[36] else 'little'}-endian); "
                          "mfpde reads the little-endian BP5 files it writes")
    minor = idx[38]
    writers: list[int] = []  # each writer's subfile
    steps: list[tuple[int, int, list[int]]] = []  # metadata position and size, each writer's data position

    def record(data: bytes, pos: int) -> int:
        kind, length = chr(data[pos]), _U64.unpack_from(data, pos + 1)[0]
        body = data[pos + 9: pos + 9 + length]
        if len(body) < length:
            return len(data) + 1
        if kind == "w":
            n = _U64.unpack_from(body, 0)[0]
            writers[:] = struct.unpack_from(f"<{n}Q", body, 24)
        elif kind == "s":
            head = 8 if minor != 2 else 0  # minor versions after 2 put the step's time first
            mdpos, mdsize, flushes = struct.unpack_from("<3Q", body, head)
            per = 2 * flushes + 1
            if not writers or head + 24 + 8 * per * len(writers) > length:
                return len(data) + 1
            locs = struct.unpack_from(f"<{per * len(writers)}Q", body, head + 24)
            steps.append((mdpos, mdsize, [locs[per * w + per - 1] for w in range(len(writers))]))
        return pos + 9 + length

    _records(idx_file, idx, HEADER, record, "index record")
    md_file = files["md.0"]
    md = md_file.read_bytes()
    sizes: list[tuple[int, int]] = []

    def md_record(data: bytes, pos: int) -> int:
        size = _U64.unpack_from(data, pos)[0]
        sizes.append((pos, size + 8))
        return pos + 8 + size

    n_md = _records(md_file, md, 0, md_record, "metadata record")
    if n_md != len(steps) or any(s[:2] != m for s, m in zip(steps, sizes, strict=False)):
        raise _damaged(idx_file if n_md > len(steps) else md_file,
                       f"the index lists {len(steps)} steps, {md_file.name} holds {n_md}")
    for mdpos, mdsize, _ in steps:
        inner = struct.unpack_from(f"<{2 * len(writers)}Q", md, mdpos + 8) if mdsize >= 8 + 16 * len(writers) else ()
        if not inner or 16 * len(writers) + sum(inner) != mdsize - 8:
            raise _damaged(md_file, f"the metadata record at byte {mdpos} does not match its {len(writers)} writers")
    mmd_file = files["mmd.0"]
    mmd = mmd_file.read_bytes()
    if _records(mmd_file, mmd, 0, lambda d, p: p + 16 + sum(struct.unpack_from("<2Q", d, p)), "record") == 0:
        raise _damaged(mmd_file, "empty")
    if not steps:
        raise _damaged(idx_file, "no step")
    for sub in sorted(set(writers)):
        f = path / f"data.{sub}"
        size = f.stat().st_size if f.is_file() else -1
        far = max(ls[w] for _, _, ls in steps for w in range(len(writers)) if writers[w] == sub)
        if far > size:
            raise _damaged(f, f"{max(size, 0)} bytes, the index has data at byte {far}")
    return Layout(list(writers), [ls for _, _, ls in steps])


def check_data_extent(path: Path, layout: Layout, nbytes: list[dict[int, int]]) -> None:
    """Check that each writer's data of each step ends inside its subfile.

    Args:
        path: the ``.bp`` directory, checked by :func:`check_bp5`.
        layout: what :func:`check_bp5` returned.
        nbytes: per step, per writer, the bytes of its arrays (from the metadata: a lower bound, padding left out).

    Raises:
        ConfigError: a ``data.<subfile>`` ends before the data its index and metadata promise.
    """
    size = {sub: (path / f"data.{sub}").stat().st_size for sub in set(layout.subfiles)}
    for k, (locs, counts) in enumerate(zip(layout.positions, nbytes, strict=True)):
        for w, n in counts.items():
            sub = layout.subfiles[w] if w < len(layout.subfiles) else -1
            if sub < 0 or locs[w] + n > size[sub]:
                f = path / f"data.{sub}"
                raise _damaged(f, f"{size.get(sub, 0)} bytes, step {k} of writer {w} reaches byte {locs[w] + n}")
