"""Sphinx configuration of the CARDSegment documentation (built with warnings as errors:
``sphinx-build -W --keep-going docs docs/build/html``, as ``Testing/run-tests.sh`` does)."""

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent
sys.path.insert(0, str(DOCS / "_ext"))
# the engine and the training tools from the checkout, installed or not
sys.path.insert(0, str(REPO / "Training"))
sys.path.insert(0, str(REPO / "CARDSegment"))

project = "CARDSegment"
author = "The CARDSegment authors"
copyright = "CARDSegment authors, Apache-2.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinxarg.ext",
    "cardseg_docs",
]
myst_enable_extensions = ["colon_fence", "dollarmath", "amsmath", "deflist"]
myst_heading_anchors = 3
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["build", "_ext", "_data", "tools", "README.md"]
html_theme = "furo"
html_title = "CARDSegment"
html_static_path = []
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
# the engine's docstrings name many private helpers and third-party types: those references stay
# plain text rather than failing the build
nitpicky = False
# "--option" stays two hyphens in running text and in the generated tables
smartquotes = False
