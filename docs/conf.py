"""Sphinx configuration of nvblaslt's documentation site.

    pip install -e ".[docs,cu13]"
    sphinx-build -W --keep-going -b html docs build/html     # the site, warnings as errors
    sphinx-build -W -b doctest docs build/doctest           # its examples (none needs a GPU)

The API reference imports the real package; the doctests build descriptors with the real libcublasLt,
which needs no GPU. Examples that need a GPU are plain code blocks, never doctests. Neither torch nor JAX
is needed: where one is missing, autodoc reads ``nvblaslt.torch`` or ``nvblaslt.jax`` (and flax for
``nvblaslt.jax.nn``) against a stand-in (so the docs never pull a CUDA build of torch); where it is installed
(CI's CPU builds), the real one is used.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's nvblaslt, also without an editable install

import importlib.util  # noqa: E402

import docutils.nodes  # noqa: E402
import sphinx.application  # noqa: E402

import nvblaslt  # noqa: E402

project = "nvblaslt"
author = "the nvblaslt authors"
copyright = "the nvblaslt authors, Apache-2.0"  # noqa: A001 - Sphinx's name
release = nvblaslt.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.doctest",
    "sphinx.ext.viewcode",
    "numpydoc",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "build", "Thumbs.db", ".DS_Store"]
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3

# autodoc: the signatures as written (the public surface is annotated), members in source order
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autodoc_class_signature = "mixed"
# the framework layers' own frameworks, where they are not installed: autodoc reads those modules against a stand-in
# (flax: nvblaslt.jax.nn's layers subclass flax.nnx.Module)
autodoc_mock_imports = [name for name in ("torch", "jax", "flax") if importlib.util.find_spec(name) is None]
if autodoc_mock_imports:
    # nvblaslt.jax registers its rules at import (batching.primitive_batchers[p] = rule): let the stand-in take them
    importlib.import_module("sphinx.ext.autodoc.mock")._MockObject.__setitem__ = lambda self, key, value: None

# numpydoc renders the sections; it does not validate docstrings, and the reference lists members itself
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_validation_checks: set[str] = set()
numpydoc_xref_param_type = False

# doctests: no GPU. A docstring's or page's example that needs one is a code block, not a doctest.
# torch and jax are None where they are not installed: their examples then skip (`:skipif: torch is None` on a
# page; setup() below marks the framework layers' own docstring examples)
doctest_global_setup = """
import nvblaslt
try:
    import torch
except ImportError:
    torch = None
try:
    import jax
except ImportError:
    jax = None
"""
trim_doctest_flags = True

html_theme = "alabaster"
html_title = f"nvblaslt {release}"
html_theme_options = {
    "description": "Fused cuBLASLt GEMM epilogs from pure Python, on any GPU array",
    "fixed_sidebar": True,
    "page_width": "1180px",
    "sidebar_width": "250px",
}
html_static_path: list[str] = []


def _skip_examples_of_missing_frameworks(app: object, doctree: docutils.nodes.document) -> None:
    for node in doctree.findall(docutils.nodes.doctest_block):
        source = (node.source or "").replace("\\", "/")
        for name in autodoc_mock_imports:
            if f"nvblaslt/{name}/" in source:
                node["skipif"] = f"{name} is None"


def setup(app: sphinx.application.Sphinx) -> None:
    app.connect("doctree-read", _skip_examples_of_missing_frameworks)
