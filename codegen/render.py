"""Render the model into a Python module with the jinja2 template."""

from __future__ import annotations

from pathlib import Path

import jinja2

from . import __version__
from .annotations import CALLBACK, POINTER_TO, VOID_POINTER, typed_functions
from .model import Bindings

TEMPLATES = Path(__file__).parent / "templates"


def _hex_if_flag(value: int) -> str:
    return hex(value) if value > 9 else str(value)


def _pystr(value: str | None) -> str:
    return "None" if value is None else f'"{value}"'


def render(bindings: Bindings) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["hex_if_flag"] = _hex_if_flag
    env.filters["pystr"] = _pystr
    text = env.get_template("bindings.py.j2").render(
        version=bindings.version,
        version_text=".".join(map(str, bindings.version)),
        generator_version=__version__,
        sources=bindings.sources,
        declarations=bindings.declarations,
        functions=bindings.functions,
        constants=bindings.constants,
        attributes=bindings.attributes,
        typed_functions=typed_functions(bindings),
        pointer_to=POINTER_TO,
        void_pointer=VOID_POINTER,
        callback=CALLBACK,
    )
    return _tidy_blank_lines(text)


def _tidy_blank_lines(text: str) -> str:
    """At most two blank lines in a row, as PEP 8 has it; the template cannot know."""
    out, blanks = [], 0
    for line in text.splitlines():
        blanks = blanks + 1 if not line.strip() else 0
        if blanks <= 2:
            out.append(line.rstrip())
    return "\n".join(out).rstrip() + "\n"
