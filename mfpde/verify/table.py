"""The table of ``mfpde verify``: one row per check, the same cells in the terminal and in the docs."""

from __future__ import annotations

from typing import Any

__all__ = ["COLUMNS", "TABLE_WIDTH", "THRESHOLD_CHARS", "format_table", "table_cells"]


#: The widest table line :func:`format_table` prints (characters).
TABLE_WIDTH = 120

#: The longest threshold cell (a check that raised has its exception there; the whole text is in report.json).
THRESHOLD_CHARS = 240

#: The table's columns: heading, and the record's text for it (interface.md).
COLUMNS = ("check", "kind", "measured", "reference", "error", "threshold", "verdict", "s")


def _num(x: float | None, digits: int) -> str:
    return "" if x is None else f"{x:.{digits}g}"


def table_cells(r: dict[str, Any]) -> tuple[str, ...]:
    """One record's cells, in the order of :data:`COLUMNS` (an empty cell: no reference value, so no error).

    Records of reports written before the reference and error columns existed (``value`` only) still read:
    their reference and error cells are empty.
    """
    measured = r.get("measured", r.get("value"))
    kind = r.get("kind", "") + (f" [{r['unit']}]" if r.get("unit") else "")
    threshold = r["threshold"] if len(r["threshold"]) <= THRESHOLD_CHARS else r["threshold"][:THRESHOLD_CHARS - 1] + "…"
    return (r["name"], kind, "—" if measured is None else _num(measured, 4), _num(r.get("reference_value"), 4),
            _num(r.get("error"), 2), threshold, "pass" if r["passed"] else "FAIL", f"{r['wall_s']:.1f}")


def format_table(records: list[dict[str, Any]], width: int = TABLE_WIDTH) -> str:
    """The table of interface.md: check, kind, measured, reference, error, threshold, verdict, seconds.

    One kind per column: ``measured`` is of the kind (and unit) its row's ``kind`` names, ``reference`` its
    reference value (empty for a bound), ``error`` = |measured − reference| and ``threshold`` the condition of
    the verdict (on the error, or on the measured value when the reference is empty). The threshold wraps onto
    continuation lines in its column, so that no line is wider than ``width``. The theory sections are in
    ``report.json`` and the docs.
    """
    import textwrap

    rows = [table_cells(r) for r in records]
    k = COLUMNS.index("threshold")
    widths = [max(len(str(x)) for x in col) for col in zip(COLUMNS, *rows, strict=True)]
    room = max(width - (sum(widths) - widths[k]) - 2 * (len(COLUMNS) - 1), 20)
    widths[k] = min(widths[k], room)

    def line(cells: tuple[str, ...] | list[str]) -> str:
        return "  ".join(str(x).ljust(w) for x, w in zip(cells, widths, strict=True)).rstrip()

    lines = [line(COLUMNS), line(["-" * w for w in widths])]
    for row in rows:
        wrapped = textwrap.wrap(row[k], widths[k], break_on_hyphens=False) or [""]
        lines.append(line([*row[:k], wrapped[0], *row[k + 1:]]))
        lines += [line(["" if i != k else more for i in range(len(COLUMNS))]) for more in wrapped[1:]]
    return "\n".join(lines)
