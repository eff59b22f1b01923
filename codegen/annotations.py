"""Type annotations of the bound functions, from their ctypes types: what ctypes accepts for each
argument and what it returns, spelled for a type checker.

The generated module declares the functions with these annotations in a ``TYPE_CHECKING`` block:
at run time the library's exports are bound instead (``nvblaslt._loader``), and ``nvblaslt.lt``
shows type checkers the declarations.
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass

from .model import Bindings, Function

_INTEGERS = frozenset(f"ctypes.c_{name}" for name in (
    "byte", "ubyte", "short", "ushort", "int", "uint", "long", "ulong", "longlong", "ulonglong", "size_t", "ssize_t",
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"))
_FLOATS = frozenset({"ctypes.c_float", "ctypes.c_double"})
_POINTER = re.compile(r"ctypes\.POINTER\((.+)\)")

# The names the annotations use, defined by the template's TYPE_CHECKING block.
VOID_POINTER = "_VoidPointer"  # void * and handles: an address, None, or a ctypes object that is or holds one
POINTER_TO = "_PointerTo"  # T *: a pointer or array of T, a T (passed by reference), byref() of one, or None
CALLBACK = "_Callback"  # a function pointer: a CFUNCTYPE instance (ctypes takes no None here)


class AnnotationError(ValueError):
    pass


@dataclass
class TypedFunction:
    name: str
    params: list[str]  # "name: annotation", positional only (ctypes takes no keywords)
    returns: str
    prototype: str


class Annotator:
    """Annotations for the ctypes expressions of one bindings model (its aliases resolved)."""

    def __init__(self, bindings: Bindings):
        self.aliases = {d.name: d.ctype for d in bindings.declarations if d.kind == "alias"}
        self.structs = {d.name for d in bindings.declarations if d.kind == "struct"}

    def argument(self, ctype: str) -> str:
        """What ctypes accepts for a parameter of this type."""
        target = self.aliases.get(ctype, ctype)
        if target == "ctypes.c_void_p":
            return VOID_POINTER
        if target.startswith("ctypes.CFUNCTYPE("):
            return CALLBACK
        if target == "ctypes.c_char_p":
            return "typing.Optional[bytes]"
        pointer = _POINTER.fullmatch(target)
        if pointer:
            return f"{POINTER_TO}[{self.element(pointer[1])}]"
        if target in self.structs:
            return target
        return self._scalar(ctype, target)

    def result(self, ctype: str, returns_status: bool) -> str:
        """What a call returns: a checked status is 0 (any other raises CublasLtError)."""
        if returns_status:
            return "int"
        target = self.aliases.get(ctype, ctype)
        if target == "None":
            return "None"
        if target in ("ctypes.c_void_p", "ctypes.c_char_p"):  # NULL comes back as None
            return "typing.Optional[int]" if target == "ctypes.c_void_p" else "typing.Optional[bytes]"
        return self._scalar(ctype, target)

    def element(self, ctype: str) -> str:
        """The ctypes class a pointer points to, as a type."""
        target = self.aliases.get(ctype, ctype)
        if target.startswith("ctypes.CFUNCTYPE("):
            return "CFuncPtr"
        pointer = _POINTER.fullmatch(target)
        if pointer:
            return f"ctypes._Pointer[{self.element(pointer[1])}]"
        return ctype  # a ctypes class, a struct, or an alias of one (a type alias to the checker)

    @staticmethod
    def _scalar(ctype: str, target: str) -> str:
        if target in _INTEGERS:
            return "int"
        if target in _FLOATS:
            return "float"
        if target == "ctypes.c_char":
            return "bytes"
        raise AnnotationError(f"no annotation for the ctypes type {ctype} ({target}): add it to codegen/annotations.py")

    def function(self, function: Function) -> TypedFunction:
        params = [f"{_identifier(name)}: {self.argument(ctype)}"
                  for name, ctype in zip(function.param_names, function.argtypes)]
        return TypedFunction(function.name, params, self.result(function.restype, function.returns_status),
                             function.prototype)


def _identifier(name: str) -> str:
    """A C parameter name that is a Python keyword gets an underscore (the names are for reading only)."""
    return f"{name}_" if keyword.iskeyword(name) else name


def typed_functions(bindings: Bindings) -> list[TypedFunction]:
    annotator = Annotator(bindings)
    return [annotator.function(f) for f in bindings.functions]
