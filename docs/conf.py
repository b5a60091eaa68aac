"""Sphinx configuration of the mfpde documentation (``make docs``: sphinx-build -W, warnings are errors)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

import mfpde  # noqa: E402

project = "mfpde"
author = "the mfpde developers"
copyright = "2026, the mfpde developers"  # noqa: A001
release = version = mfpde.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "mfpde_docs"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "_generated/*.part.md"]
myst_enable_extensions = ["colon_fence", "dollarmath", "amsmath"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header"]  # theory.md starts its numbered sections at level 2 under a level-1 title
html_theme = "alabaster"
html_static_path = ["_static"]
# a text column of about 900 px (alabaster's default 940 px page leaves 660 px), so that the tables of the
# verification, circle and benchmark pages fit; a table wider still scrolls inside the page (_static/custom.css)
html_theme_options = {"description": "finite elements for the mean-field transformer and its training",
                      "page_width": "1180px", "body_max_width": "none"}

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"  # no second "Parameters" list of a dataclass's fields
autodoc_typehints_format = "short"  # NDArray[float64], not numpy._typing._array_like.NDArray[numpy.float64]
autodoc_preserve_defaults = True  # comm=MPI.COMM_WORLD, not <mpi4py.MPI.Intracomm object>
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True
# an attribute's type would print as numpy._typing._array_like.NDArray[...]; the docstrings give the shapes
napoleon_attr_annotations = False
nitpicky = False
