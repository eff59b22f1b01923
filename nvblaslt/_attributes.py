"""Typed get/set of descriptor attributes, driven by the generated ``ATTRIBUTES`` table.

The table gives each attribute's C value type (read from the header by codegen), so
``set_attribute(desc, EPILOGUE_AUX_LD, 256)`` packs an int64 and ``get_attribute``
returns a Python int; arrays (``ALGO_CAP_TILE_IDS``) come back as lists.

The bindings come from the newest release of each cuBLAS major, so an older library may
lack attributes the table lists. ``supported`` asks the library itself: a zero-size
GetAttribute answers CUBLAS_STATUS_INVALID_VALUE for an attribute it does not know, and the
size of one it knows (no GPU needed). Only what it knows is offered.
"""

from __future__ import annotations

import ctypes
import enum
import functools
import numbers
import operator
from collections.abc import Callable
from typing import Any

from ._errors import CublasLtError, NvblasltTypeError, NvblasltValueError
from ._loader import Library

# {member: (ctype of one element, is an array)} for one attribute enum
AttributeTable = dict[enum.IntEnum, tuple[Any, bool]]

_C_NAMES = {
    ctypes.c_int8: "int8_t", ctypes.c_uint8: "uint8_t", ctypes.c_int16: "int16_t", ctypes.c_uint16: "uint16_t",
    ctypes.c_int32: "int32_t", ctypes.c_uint32: "uint32_t", ctypes.c_int64: "int64_t", ctypes.c_uint64: "uint64_t",
    ctypes.c_float: "float", ctypes.c_double: "double", ctypes.c_void_p: "void *",
}


def _created(lib: Library, kind: str, *args: Any) -> tuple[Any, Callable[[], None]]:
    handle = ctypes.c_void_p()
    getattr(lib, f"{kind}Create")(ctypes.byref(handle), *args)
    return handle.value, lambda: getattr(lib, f"{kind}Destroy")(handle.value)


def _zeroed_algorithm(lib: Library) -> tuple[Any, Callable[[], None]]:
    return ctypes.byref(lib.api.cublasLtMatmulAlgo_t()), lambda: None


# One throwaway object per attribute enum to ask the library about. Algorithm capabilities
# are missing: they answer only for an algorithm cublasLtMatmulAlgoInit made, which needs a GPU.
_PROBE_OBJECTS: dict[str, Callable[[Library], tuple[Any, Callable[[], None]]]] = {
    "cublasLtMatmulDescAttributes_t": lambda lib: _created(
        lib, "cublasLtMatmulDesc", lib.api.CUBLAS_COMPUTE_32F, lib.api.CUDA_R_32F),
    "cublasLtMatrixLayoutAttribute_t": lambda lib: _created(lib, "cublasLtMatrixLayout", lib.api.CUDA_R_32F, 1, 1, 1),
    "cublasLtMatmulPreferenceAttributes_t": lambda lib: _created(lib, "cublasLtMatmulPreference"),
    "cublasLtMatrixTransformDescAttributes_t": lambda lib: _created(
        lib, "cublasLtMatrixTransformDesc", lib.api.CUDA_R_32F),
    "cublasLtEmulationDescAttributes_t": lambda lib: _created(lib, "cublasLtEmulationDesc"),
    "cublasLtMatmulAlgoConfigAttributes_t": _zeroed_algorithm,
}


def _knows(lib: Library, getter: str, handle: Any, attribute: enum.IntEnum, ctype: Any, is_array: bool) -> bool:
    """Whether the library answers for ``attribute`` with a value of the size the table gives it.
    The size matters: cuBLAS 13.0 answers for 38 of the matmul descriptor (EMULATION_DESCRIPTOR
    from 13.1 on, 8 bytes) with 4 bytes: one of its own, not that one."""
    written = ctypes.c_size_t()
    try:
        getattr(lib, getter)(handle, attribute, None, 0, ctypes.byref(written))
    except CublasLtError:
        return False
    size = ctypes.sizeof(ctype)
    return written.value % size == 0 if is_array else written.value == size


@functools.cache
def supported(lib: Library, enum_type: type[enum.IntEnum]) -> AttributeTable:
    """The typed table of one attribute enum, less the members ``lib`` does not know."""
    getter, _setter, types = lib.api.ATTRIBUTES[enum_type]
    if getter in lib.missing:
        return {}
    make = _PROBE_OBJECTS.get(enum_type.__name__)
    if make is None:
        return dict(types)
    try:
        handle, destroy = make(lib)
    except (AttributeError, CublasLtError):  # the library cannot make one: it has none of them
        return {}
    try:
        known = {member: spec for member, spec in types.items() if _knows(lib, getter, handle, member, *spec)}
    finally:
        destroy()
    # a library that answers for none of them did not understand the question: offer them all
    return known or dict(types)


def unsupported(lib: Library) -> dict[str, list[str]]:
    """{attribute enum name: members the bindings list but ``lib`` does not know}, where any."""
    missing = {}
    for enum_type, (_getter, _setter, types) in lib.api.ATTRIBUTES.items():
        names = [m.name for m in types if m not in supported(lib, enum_type)]
        if names:
            missing[enum_type.__name__] = names
    return missing


def attribute_spec(lib: Library, attribute: enum.IntEnum) -> tuple[str, str | None, Any, bool]:
    """(getter, setter, ctype, is_array) for one attribute enum member."""
    table = lib.api.ATTRIBUTES.get(type(attribute))
    if table is None:
        raise NvblasltTypeError(
            f"attribute: expected a member of one of {sorted(t.__name__ for t in lib.api.ATTRIBUTES)}, "
            f"got {attribute!r} ({type(attribute).__name__})"
        )
    getter, setter, _types = table
    spec = supported(lib, type(attribute)).get(attribute)
    if spec is None:
        raise NvblasltValueError(
            f"{attribute.name}: cuBLASLt {'.'.join(map(str, lib.version_tuple))} ({lib.path}) does not know this "
            f"{type(attribute).__name__} member; it comes from the cuBLAS "
            f"{'.'.join(map(str, lib.api.CUBLAS_VERSION))} headers"
        )
    ctype, is_array = spec
    return getter, setter, ctype, is_array


def _integer(attribute: enum.IntEnum, value: Any, expected: str) -> int:
    """``value`` as a Python int (NumPy integers count, bool does not), or an error naming the attribute."""
    if isinstance(value, bool):
        raise NvblasltTypeError(f"{attribute.name}: expected {expected}, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise NvblasltTypeError(f"{attribute.name}: expected {expected}, got {value!r}") from None


def _pack(attribute: enum.IntEnum, ctype: Any, is_array: bool, value: Any) -> Any:
    if is_array:
        values = [_pack(attribute, ctype, False, v).value for v in value]
        return (ctype * len(values))(*values)
    if ctype is ctypes.c_void_p:
        if value is None:
            return ctypes.c_void_p(None)
        pointer = _integer(attribute, value, "a pointer as int or None")
        if not 0 <= pointer < 2 ** (8 * ctypes.sizeof(ctypes.c_void_p)):
            raise NvblasltValueError(f"{attribute.name}: expected a pointer (an address, not negative), got {pointer}")
        return ctypes.c_void_p(pointer)
    if ctype in (ctypes.c_float, ctypes.c_double):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise NvblasltTypeError(f"{attribute.name}: expected a number ({_C_NAMES[ctype]}), got {value!r}")
        return ctype(float(value))
    number = _integer(attribute, value, f"an integer ({_C_NAMES[ctype]})")
    bits = 8 * ctypes.sizeof(ctype)
    low, high = (0, 2**bits - 1) if ctype(-1).value > 0 else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    if not low <= number <= high:
        raise NvblasltValueError(f"{attribute.name}: expected {_C_NAMES[ctype]} in [{low}, {high}], got {number}")
    return ctype(number)


def set_attribute(lib: Library, handle: Any, attribute: enum.IntEnum, value: Any) -> None:
    _getter, setter, ctype, is_array = attribute_spec(lib, attribute)
    if setter is None:
        raise NvblasltTypeError(f"{attribute.name} is read-only")
    buffer = _pack(attribute, ctype, is_array, value)
    getattr(lib, setter)(handle, attribute, ctypes.byref(buffer), ctypes.sizeof(buffer))


def attribute_size(lib: Library, handle: Any, attribute: enum.IntEnum) -> int:
    """The size in bytes the library reports for an attribute (a zero-size query)."""
    getter, _setter, _ctype, _is_array = attribute_spec(lib, attribute)
    written = ctypes.c_size_t()
    getattr(lib, getter)(handle, attribute, None, 0, ctypes.byref(written))
    return written.value


def get_attribute(lib: Library, handle: Any, attribute: enum.IntEnum) -> Any:
    getter, _setter, ctype, is_array = attribute_spec(lib, attribute)
    written = ctypes.c_size_t()
    if is_array:
        size = attribute_size(lib, handle, attribute)
        buffer = (ctype * (size // ctypes.sizeof(ctype)))()
    else:
        buffer = ctype()
    getattr(lib, getter)(handle, attribute, ctypes.byref(buffer), ctypes.sizeof(buffer), ctypes.byref(written))
    return list(buffer) if is_array else buffer.value
