"""Pages generated when the docs are built: the verification checks from the registry, the demos as pages.

* ``_generated/verify_checks.md``: one row per registered check of :mod:`mfpde.verify` (name, theory section,
  what it measures, the reference it is compared with, its kind, and the measured value, reference value,
  error, threshold and verdict of the last full run stored in ``_static/verify_last.json``, when that run had
  the check).
* ``_generated/demo_<name>.md``: each demo of ``demos/`` (jupytext light format: comment blocks are the
  text, the rest is code) as a page, with the output of its quick run stored in ``_static/demos/``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
GEN = DOCS / "_generated"


def _cell(text: str) -> str:
    """A table cell: no pipes or newlines, and a docstring's Sphinx roles (``:func:`name```) as code."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", str(text))
    return " ".join(text.replace("|", "\\|").split())


def check_rows() -> list[dict[str, Any]]:
    """The registered checks with what the docs say of each (in the registry's order).

    The measured, reference, error and threshold cells are those of the check's record in the last full run
    (``_static/verify_last.json``), the same cells as the terminal table (:func:`mfpde.verify.table.table_cells`);
    empty when that run did not have the check.
    """
    from mfpde.jobs.verify import _load_checks
    from mfpde.verify.registry import CHECKS
    from mfpde.verify.table import COLUMNS, table_cells

    _load_checks()
    last_path = DOCS / "_static" / "verify_last.json"
    last = {r["name"]: r for r in json.loads(last_path.read_text())["checks"]} if last_path.is_file() else {}
    rows = []
    for c in CHECKS.values():
        doc = (c.run.__doc__ or "").strip().split("\n\n")[0]
        r = last.get(c.name)
        cells = dict(zip(COLUMNS, table_cells(r), strict=True)) if r else {k: "" for k in COLUMNS}
        rows.append({"name": c.name, "section": c.section, "measures": doc, "reference": c.reference,
                     "kind": c.kind + (f" [{c.unit}]" if c.unit else ""), "measured": cells["measured"],
                     "reference_value": cells["reference"], "error": cells["error"], "threshold": cells["threshold"],
                     "verdict": cells["verdict"] or "—"})
    return rows


def _last_run(r: dict[str, Any]) -> str:
    """The last full run of one check in one cell: kind, measured value, reference and error, threshold, verdict."""
    if not r["measured"]:
        return "—"
    text = f"{r['kind']} {r['measured']}"
    if r["reference_value"]:
        text += f" against {r['reference_value']} (error {r['error']})"
    return text + f"; threshold {r['threshold']}: **{r['verdict']}**"


def verify_page() -> str:
    """The Markdown table of every check, three columns so that it fits a page.

    Its name; what it measures against what, and the theory section; the last full run's numbers (the cells of
    the terminal table in one line).
    """
    lines = ["| check | what is measured, against what (theory section) | last full run |", "|---|---|---|"]
    for r in check_rows():
        what = f"{r['measures']} *Compared with:* {r['reference']}. *Theory:* {r['section']}."
        lines.append("| " + " | ".join(_cell(x) for x in (f"`{r['name']}`", what, _last_run(r))) + " |")
    return "\n".join(lines) + "\n"


def demo_page(path: Path) -> str:
    """A jupytext light-format script as Markdown: ``# `` comment blocks as text, code in fences."""
    out: list[str] = []
    code: list[str] = []

    def flush() -> None:
        while code and not code[-1].strip():
            code.pop()
        while code and not code[0].strip():
            code.pop(0)
        if code:
            out.extend(["", "```python", *code, "```", ""])
        code.clear()

    for line in path.read_text().splitlines():
        if line.strip() in ("# +", "# -"):
            continue
        if line == "#" or line.startswith("# "):
            flush()
            out.append(line[2:])
        else:
            code.append(line)
    flush()
    text = "\n".join(out)
    text = re.sub(r"\n{3,}", "\n\n", text)
    text = text.strip() + f"\n\nThe script: `demos/{path.name}` (run it with `python3 demos/{path.name} --quick`).\n"
    name = path.stem.removeprefix("demo_")
    store = DOCS / "_static" / "demos"
    if (store / f"{name}.txt").is_file():  # stored by docs/store_demo_outputs.py (make demo-outputs)
        text += "\n## Output (quick mode)\n\nWhat the script printed and drew with `--quick` (coarse sizes):\n\n"
        text += "```text\n" + (store / f"{name}.txt").read_text().rstrip() + "\n```\n"
        if (store / f"{name}.png").is_file():
            text += f"\n![{name} (quick mode)](../_static/demos/{name}.png)\n"
    return text


def generate(app: object = None) -> None:
    """Write the generated pages (called when the builder starts)."""
    GEN.mkdir(exist_ok=True)
    (GEN / "verify_checks.md").write_text(verify_page())
    for demo in sorted((ROOT / "demos").glob("demo_*.py")):
        (GEN / f"{demo.stem}.md").write_text(demo_page(demo))


def setup(app: Any) -> dict[str, Any]:
    """Sphinx entry point."""
    app.connect("builder-inited", generate)
    return {"version": "1", "parallel_read_safe": True}
