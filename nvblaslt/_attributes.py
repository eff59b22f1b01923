"""Typed get/set of descriptor attributes, driven by the generated ``ATTRIBUTES`` table.

The table gives each attribute's C value type (read from the header by codegen), so
``set_attribute(desc, EPILOGUE_AUX_LD, 256)`` packs an int64 and ``get_attribute``
returns a Python int; arrays (``ALGO_CAP_TILE_IDS``) come back as lists.
"""

from __future__ import annotations

import ctypes
import enum

from ._errors import NvblasltTypeError, NvblasltValueError
from ._loader import Library


_C_NAMES = {
    ctypes.c_int8: "int8_t", ctypes.c_uint8: "uint8_t", ctypes.c_int16: "int16_t", ctypes.c_uint16: "uint16_t",
    ctypes.c_int32: "int32_t", ctypes.c_uint32: "uint32_t", ctypes.c_int64: "int64_t", ctypes.c_uint64: "uint64_t",
    ctypes.c_float: "float", ctypes.c_double: "double", ctypes.c_void_p: "void *",
}


def attribute_spec(lib: Library, attribute: enum.IntEnum):
    """(getter, setter, ctype, is_array) for one attribute enum member."""
    table = lib.api.ATTRIBUTES.get(type(attribute))
    if table is None:
        raise NvblasltTypeError(
            f"attribute: expected a member of one of {sorted(t.__name__ for t in lib.api.ATTRIBUTES)}, "
            f"got {attribute!r} ({type(attribute).__name__})"
        )
    getter, setter, types = table
    ctype, is_array = types[attribute]
    return getter, setter, ctype, is_array


def _pack(attribute, ctype, is_array, value):
    if is_array:
        values = list(value)
        return (ctype * len(values))(*values)
    if ctype is ctypes.c_void_p:
        if value is not None and not isinstance(value, int):
            raise NvblasltTypeError(f"{attribute.name}: expected a pointer as int or None, got {value!r}")
        return ctypes.c_void_p(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise NvblasltTypeError(f"{attribute.name}: expected a number ({_C_NAMES[ctype]}), got {value!r}")
    if ctype not in (ctypes.c_float, ctypes.c_double) and not isinstance(value, int):
        raise NvblasltTypeError(f"{attribute.name}: expected an integer ({_C_NAMES[ctype]}), got {value!r}")
    if ctype not in (ctypes.c_float, ctypes.c_double):
        bits = 8 * ctypes.sizeof(ctype)
        low, high = (0, 2**bits - 1) if ctype(-1).value > 0 else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        if not low <= value <= high:
            raise NvblasltValueError(f"{attribute.name}: expected {_C_NAMES[ctype]} in [{low}, {high}], got {value}")
    return ctype(value)


def set_attribute(lib: Library, handle, attribute: enum.IntEnum, value) -> None:
    _getter, setter, ctype, is_array = attribute_spec(lib, attribute)
    if setter is None:
        raise NvblasltTypeError(f"{attribute.name} is read-only")
    buffer = _pack(attribute, ctype, is_array, value)
    getattr(lib, setter)(handle, attribute, ctypes.byref(buffer), ctypes.sizeof(buffer))


def attribute_size(lib: Library, handle, attribute: enum.IntEnum) -> int:
    """The size in bytes the library reports for an attribute (a zero-size query)."""
    getter, _setter, _ctype, _is_array = attribute_spec(lib, attribute)
    written = ctypes.c_size_t()
    getattr(lib, getter)(handle, attribute, None, 0, ctypes.byref(written))
    return written.value


def get_attribute(lib: Library, handle, attribute: enum.IntEnum):
    getter, _setter, ctype, is_array = attribute_spec(lib, attribute)
    written = ctypes.c_size_t()
    if is_array:
        size = attribute_size(lib, handle, attribute)
        buffer = (ctype * (size // ctypes.sizeof(ctype)))()
    else:
        buffer = ctype()
    getattr(lib, getter)(handle, attribute, ctypes.byref(buffer), ctypes.sizeof(buffer), ctypes.byref(written))
    return list(buffer) if is_array else buffer.value
