"""Evaluate C integer constant expressions given as pycparser AST nodes."""

from __future__ import annotations

import re
from collections.abc import Mapping

from pycparser import c_ast

_INT_SUFFIX = re.compile(r"[uUlL]+$")

_BINARY = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: int(a / b),  # C truncates towards zero
    "%": lambda a, b: a - b * int(a / b),
    "<<": lambda a, b: a << b,
    ">>": lambda a, b: a >> b,
    "|": lambda a, b: a | b,
    "&": lambda a, b: a & b,
    "^": lambda a, b: a ^ b,
    "&&": lambda a, b: int(bool(a) and bool(b)),
    "||": lambda a, b: int(bool(a) or bool(b)),
    "==": lambda a, b: int(a == b),
    "!=": lambda a, b: int(a != b),
    "<": lambda a, b: int(a < b),
    ">": lambda a, b: int(a > b),
    "<=": lambda a, b: int(a <= b),
    ">=": lambda a, b: int(a >= b),
}

_UNARY = {
    "-": lambda a: -a,
    "+": lambda a: a,
    "~": lambda a: ~a,
    "!": lambda a: int(not a),
}


class ConstExprError(ValueError):
    pass


def parse_int_literal(text: str) -> int:
    digits = _INT_SUFFIX.sub("", text)
    if digits.lower().startswith("0x"):
        return int(digits, 16)
    if digits.lower().startswith("0b"):
        return int(digits, 2)
    if len(digits) > 1 and digits.startswith("0"):
        return int(digits, 8)
    return int(digits)


_UNSIGNED_BITS = {"uint8_t": 8, "uint16_t": 16, "uint32_t": 32, "uint64_t": 64, "size_t": 64}


def _unsigned_width(type_name: c_ast.Typename) -> int | None:
    """Bit width of an unsigned cast target (LP64), None for signed types."""
    names = getattr(getattr(type_name.type, "type", None), "names", [])
    if len(names) == 1 and names[0] in _UNSIGNED_BITS:
        return _UNSIGNED_BITS[names[0]]
    if "unsigned" in names:
        return 64 if "long" in names else {"char": 8, "short": 16}.get(names[-1], 32)
    return None


def evaluate(node: c_ast.Node, names: Mapping[str, int]) -> int:
    """Value of an integer constant expression; ``names`` resolves identifiers."""
    if isinstance(node, c_ast.Constant):
        if node.type == "char":
            return ord(node.value.strip("'"))
        if node.type in ("int", "unsigned int", "long int", "unsigned long int",
                         "long long int", "unsigned long long int") or node.type.endswith("int"):
            return parse_int_literal(node.value)
        raise ConstExprError(f"not an integer constant: {node.value!r}")
    if isinstance(node, c_ast.ID):
        if node.name not in names:
            raise ConstExprError(f"unknown name {node.name!r} in constant expression")
        return names[node.name]
    if isinstance(node, c_ast.UnaryOp):
        if node.op not in _UNARY:
            raise ConstExprError(f"unsupported unary operator {node.op!r}")
        return _UNARY[node.op](evaluate(node.expr, names))
    if isinstance(node, c_ast.BinaryOp):
        if node.op not in _BINARY:
            raise ConstExprError(f"unsupported binary operator {node.op!r}")
        return _BINARY[node.op](evaluate(node.left, names), evaluate(node.right, names))
    if isinstance(node, c_ast.TernaryOp):
        chosen = node.iftrue if evaluate(node.cond, names) else node.iffalse
        return evaluate(chosen, names)
    if isinstance(node, c_ast.Cast):
        value = evaluate(node.expr, names)
        bits = _unsigned_width(node.to_type)
        return value & ((1 << bits) - 1) if bits else value
    raise ConstExprError(f"unsupported expression node {type(node).__name__}")
