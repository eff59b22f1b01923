"""One bindings module from one set of headers: parse, then render; and its one-line summary."""

from __future__ import annotations

from .model import Bindings
from .parse import parse
from .render import render
from .sources import HeaderSet


def generate(headers: HeaderSet) -> tuple[str, Bindings]:
    """The module's text and the model it was rendered from."""
    bindings = parse(headers)
    return render(bindings), bindings


def summary(bindings: Bindings) -> str:
    enums = [d for d in bindings.declarations if d.kind == "enum"]
    structs = [d for d in bindings.declarations if d.kind == "struct"]
    members = sum(len(e.members) for e in enums)
    attrs = sum(len(a.types) for a in bindings.attributes)
    return (f"cuBLAS {'.'.join(map(str, bindings.version))}: {len(bindings.functions)} functions, "
            f"{len(enums)} enums ({members} members), {len(structs)} structs, "
            f"{len(bindings.constants)} constants, {attrs} typed attributes")
