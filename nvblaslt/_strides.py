"""Strided-array arithmetic, in elements: C-order strides, the span an array touches, the one
stride that walks its batch dimensions, and whether two arrays' memory overlaps.

Strides are non-negative here: ``_operands`` refuses negative strides over any extent above one
in GPU arrays, every array nvblaslt makes has positive strides, and host arrays with negative
strides are only read through ``element_range`` (``_host`` packs them densely for the GPU).
"""

from __future__ import annotations

from typing import Protocol

from ._errors import NvblasltValueError


class _Item(Protocol):
    @property
    def itemsize(self) -> int: ...


class Strided(Protocol):
    """What the byte-level functions read: an ``Operand`` or anything laid out like one."""

    @property
    def ptr(self) -> int: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def strides(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> _Item: ...


def c_strides(shape: tuple[int, ...], unit: int = 1) -> tuple[int, ...]:
    """Element strides of a C-order (row-major, last index fastest) array of ``unit``-element items."""
    strides: list[int] = []
    step = unit
    for extent in reversed(shape):
        strides.insert(0, step)
        step *= max(extent, 1)
    return tuple(strides)


def span_elements(shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """Elements from the first to the last one a strided array touches (0 for an empty array)."""
    if not shape:
        return 1
    if 0 in shape:
        return 0
    return sum((n - 1) * s for n, s in zip(shape, strides)) + 1


def element_range(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, int]:
    """(lowest, highest) element offset from element 0 that a strided array touches; the lowest is
    below 0 only where a stride is negative. (0, 0) for an empty array."""
    if 0 in shape:
        return 0, 0
    low = sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
    high = sum((n - 1) * s for n, s in zip(shape, strides) if s > 0)
    return low, high


def extent_bytes(array: Strided) -> int:
    """Bytes from an array's pointer to the end of the last element it touches."""
    return span_elements(array.shape, array.strides) * array.dtype.itemsize


def overlaps(x: Strided, y: Strided) -> bool:
    """Whether the memory spans of two arrays share a byte."""
    return x.ptr < y.ptr + extent_bytes(y) and y.ptr < x.ptr + extent_bytes(x)


def batch_order(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    """The batch axes of extent above one, from the largest stride to the smallest: the order memory
    nests them in. C order (``0, 1, …``) is the only one ``batch_stride`` walks; equal strides keep it."""
    return tuple(sorted((i for i, n in enumerate(shape) if n != 1), key=lambda i: -strides[i]))


def batch_stride(shape: tuple[int, ...], strides: tuple[int, ...], name: str, what: str | None = None,
                 of: str | None = None) -> int:
    """The one stride that walks the (C-order) batch dimensions, or 0 when all are broadcast. ``what``
    names the array in a refusal ("C", "the bias"; ``name`` if None), ``of`` after "batch axis order of"
    ("operand C"; ``what`` if None)."""
    what = what or name
    dims = [(n, s) for n, s in zip(shape, strides) if n != 1]
    if all(s == 0 for _, s in dims):
        return 0
    given = f"batch dimensions {shape} with element strides {strides}"
    if any(s < 0 for _, s in dims):
        raise NvblasltValueError(f"{name}: {given}: batch strides must be positive (or all 0 to broadcast)")
    order, partial = batch_order(shape, strides), any(s == 0 for _, s in dims)  # partial: broadcast on some axes
    if not partial and order != tuple(sorted(order)):
        raise NvblasltValueError(f"{name}: The batch axis order of {of or what} {order} (its batch axes by decreasing "
                                 f"stride) must match with that of the other operands: nvblaslt walks every batch in "
                                 f"C order {tuple(sorted(order))}; got {given}")
    if partial or any(s_outer != s_inner * n_inner for (_, s_outer), (n_inner, s_inner) in zip(dims, dims[1:])):
        why = "a batch axis is broadcast (stride 0) and another not" if partial else "one stride cannot walk it"
        raise NvblasltValueError(f"{name}: The batch layout for {what} corresponding to shape {shape} (its batch "
                                 f"dimensions) with element strides {strides} is currently not supported because it is "
                                 f"not tileable: {why} (cuBLASLt batches are strided)")
    return dims[-1][1]
