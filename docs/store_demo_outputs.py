"""Run every demo in quick mode and store its figure and printed output for the docs (``make demo-outputs``).

Each ``demos/demo_<name>.py`` runs with ``--quick`` in a temporary directory; its top-level PNG
(``out_demo_<name>/*.png``) goes to ``docs/_static/demos/<name>.png`` and its standard output to
``docs/_static/demos/<name>.txt``. The demo pages of the docs show them under "Output (quick mode)".
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "docs" / "_static" / "demos"


def main() -> None:
    """Run each demo quick and store its figure and output."""
    STORE.mkdir(parents=True, exist_ok=True)
    for demo in sorted((ROOT / "demos").glob("demo_*.py")):
        name = demo.stem.removeprefix("demo_")
        with tempfile.TemporaryDirectory() as tmp:
            r = subprocess.run([sys.executable, str(demo), "--quick"], cwd=tmp, capture_output=True, text=True,
                               env={**os.environ, "MFPDE_DEMO_QUICK": "1"}, check=True)
            (STORE / f"{name}.txt").write_text(r.stdout.replace(str(ROOT) + "/", ""))  # paths relative to the repo
            pngs = sorted((Path(tmp) / f"out_{demo.stem}").glob("*.png"))
            if pngs:
                shutil.copy(pngs[0], STORE / f"{name}.png")
        print(f"{demo.name}: stored", file=sys.stderr)


if __name__ == "__main__":
    main()
