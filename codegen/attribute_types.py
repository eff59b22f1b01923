"""The value type of every descriptor attribute, read from the header's doc comments.

cuBLASLt states each attribute's type in prose at the end of the member's comment
("int64_t, default: 0", "array of uint32_t", "Bias case: const void *"). We read only
that type; the comment text stays in the header.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from . import recipe
from .model import AttributeType

if TYPE_CHECKING:
    from .parse import _Walker

# An optional "Label: " (as in "Forward pass: void *"), an optional "array of ", a type
# name, an optional pointer star; then the end of the phrase.
_TYPE_PHRASE = re.compile(
    r"^(?:[A-Z][\w ]*:\s+)?(?P<array>array of\s+)?(?P<const>const\s+)?"
    r"(?P<base>[A-Za-z_]\w*)(?P<ptr>\s*\*)?(?=[\s,;(]|$)"
)
_SCALARS = {"float": "ctypes.c_float", "double": "ctypes.c_double", "int": "ctypes.c_int"}


class AttributeTypeError(RuntimeError):
    pass


def _member_comments(body: str) -> dict[str, str]:
    """{member name: the doc comment just before it} for one enum body."""
    comments = {}
    for match in re.finditer(r"(/\*\*(?:(?!\*/).)*\*/)?\s*([A-Z_][A-Z0-9_]*)\s*(?:=[^,]*)?,?", body, re.S):
        if match.group(2):
            comments[match.group(2)] = match.group(1) or ""
    return comments


def _comment_lines(comment: str) -> list[str]:
    lines = comment.removeprefix("/**").removesuffix("*/").splitlines()
    return [line.strip().lstrip("*").strip() for line in lines]


def _resolve(base: str, pointer: bool, walker: _Walker) -> str | None:
    if pointer:
        return "ctypes.c_void_p"
    if base in recipe.LIBC_TYPEDEFS:
        return recipe.LIBC_TYPEDEFS[base]
    if base in _SCALARS:
        return _SCALARS[base]
    if base in walker.enums:
        return "ctypes.c_int32"
    if base in walker.emitted_aliases:
        return walker.emitted_aliases[base].ctype
    return None


def parse_type_phrase(line: str, walker: _Walker) -> tuple[str, bool, str] | None:
    """(ctypes expression, is_array, C spelling) if the line states a type."""
    match = _TYPE_PHRASE.match(line)
    if not match:
        return None
    base, pointer = match.group("base"), bool(match.group("ptr"))
    ctype = _resolve(base, pointer, walker)
    if ctype is None:
        return None
    spelling = f"{match.group('const') or ''}{base}{' *' if pointer else ''}"
    return ctype, bool(match.group("array")), spelling


def read_attribute_types(header_text: str, walker: _Walker) -> dict[str, list[AttributeType]]:
    """{attribute enum name: [AttributeType per member]}; fails on any member left untyped."""
    tables: dict[str, list[AttributeType]] = {}
    missing, conflicting = [], []
    for match in re.finditer(r"typedef\s+enum\s*\w*\s*\{(.*?)\}\s*(\w+)\s*;", header_text, re.S):
        body, enum_name = match.groups()
        if not recipe.ATTRIBUTE_ENUM.match(enum_name) or enum_name not in walker.enums:
            continue
        comments = _member_comments(body)
        table = []
        for member in walker.enums[enum_name].members:
            override = recipe.ATTRIBUTE_TYPE_OVERRIDES.get(member.c_name)
            lines = [override] if override else _comment_lines(comments.get(member.c_name, ""))
            found = {t for t in (parse_type_phrase(line, walker) for line in lines) if t}
            kinds = {(ctype, is_array) for ctype, is_array, _ in found}
            if not kinds:
                missing.append(member.c_name)
                continue
            if len(kinds) > 1:
                conflicting.append(f"{member.c_name}: {sorted(s for *_, s in found)}")
                continue
            (ctype, is_array), = kinds
            spelling = " or ".join(sorted({s for *_, s in found}))
            table.append(AttributeType(member.c_name, ctype, is_array, spelling))
        tables[enum_name] = table
    if missing or conflicting:
        raise AttributeTypeError(
            "attribute value types not stated in a form codegen reads; add them to "
            "codegen/recipe.py ATTRIBUTE_TYPE_OVERRIDES:\n"
            + "".join(f"  no type: {m}\n" for m in missing)
            + "".join(f"  conflicting: {c}\n" for c in conflicting)
        )
    return tables
