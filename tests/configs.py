"""Config files the tests build on (importable like ``roundoff``: pytest puts tests/ on sys.path)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The deep (weight-tied) digits problem, 6 vs 7, 20 + 40 images (demos/digits_deep.toml): the base of the tests'
#: small coupled runs. The embedded default of ``mfpde run`` (the shallow model on all images of 0 vs 6) is tested
#: as such in test_coupling.py; the other tests shrink this one.
DEEP = str(ROOT / "demos" / "digits_deep.toml")
