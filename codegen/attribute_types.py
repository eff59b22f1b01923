"""The value type of every descriptor attribute, read from the header's doc comments.

cuBLASLt states each attribute's type in prose at the end of the member's comment
("int64_t, default: 0", "array of uint32_t", "Bias case: const void *"). We read only
that type; the comment text stays in the header.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from . import recipe
from .model import Alias, AttributeType, Enum

# Looks up a typedef name of the headers: the enum or bound alias it names, or None.
Resolve = Callable[[str], Enum | Alias | None]

# An optional "Label: " (as in "Forward pass: void *"), an optional "array of ", a type
# name, an optional pointer star; then the end of the phrase.
_TYPE_PHRASE = re.compile(
    r"^(?:[A-Z][\w ]*:\s+)?(?P<array>array of\s+)?(?P<const>const\s+)?"
    r"(?P<base>[A-Za-z_]\w*)(?P<ptr>\s*\*)?(?=[\s,;(]|$)"
)


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


def _value_ctype(base: str, pointer: bool, resolve: Resolve) -> str | None:
    if pointer:
        return "ctypes.c_void_p"
    if base in recipe.LIBC_TYPEDEFS:
        return recipe.LIBC_TYPEDEFS[base]
    scalar = recipe.C_SCALARS.get((base,))
    if scalar is not None:
        return None if base == "void" else scalar  # a bare void is no value
    declared = resolve(base)
    if isinstance(declared, Enum):
        return "ctypes.c_int32"  # attribute buffers hold enums as 32-bit integers
    if isinstance(declared, Alias):
        return declared.ctype
    return None


def parse_type_phrase(line: str, resolve: Resolve) -> tuple[str, bool, str] | None:
    """(ctypes expression, is_array, C spelling) if the line states a type."""
    match = _TYPE_PHRASE.match(line)
    if not match:
        return None
    base, pointer = match.group("base"), bool(match.group("ptr"))
    ctype = _value_ctype(base, pointer, resolve)
    if ctype is None:
        return None
    spelling = f"{match.group('const') or ''}{base}{' *' if pointer else ''}"
    return ctype, bool(match.group("array")), spelling


def read_attribute_types(header_text: str, resolve: Resolve) -> dict[str, list[AttributeType]]:
    """{attribute enum name: [AttributeType per member]}; fails on any member left untyped.

    ``resolve`` looks up the headers' typedef names (the parser's declarations)."""
    tables: dict[str, list[AttributeType]] = {}
    missing, conflicting = [], []
    for match in re.finditer(r"typedef\s+enum\s*\w*\s*\{(.*?)\}\s*(\w+)\s*;", header_text, re.S):
        body, enum_name = match.groups()
        enum = resolve(enum_name)
        if not recipe.ATTRIBUTE_ENUM.match(enum_name) or not isinstance(enum, Enum):
            continue
        comments = _member_comments(body)
        table = []
        for member in enum.members:
            override = recipe.ATTRIBUTE_TYPE_OVERRIDES.get(member.c_name)
            lines = [override] if override else _comment_lines(comments.get(member.c_name, ""))
            found = {t for t in (parse_type_phrase(line, resolve) for line in lines) if t}
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
