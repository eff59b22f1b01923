"""Host operands (NumPy arrays, CPU torch tensors): staged to the GPU and results copied back,
as nvmath-python does. Copies go through pinned buffers, stream-ordered, with cuda-bindings."""

from __future__ import annotations

import dataclasses
import ctypes
import math

from . import _cuda, _memory, _operands
from ._cuda import cudart
from ._errors import NvblasltValueError
from ._frameworks import Framework, framework_of
from ._operands import Operand
from ._strides import c_strides, element_range, span_elements


class PinnedBuffer:
    """Page-locked host memory from ``cudaMallocHost``."""

    def __init__(self, size: int):
        self.size = size
        self.pointer = _cuda.check(cudart.cudaMallocHost(max(size, 1)), "cudaMallocHost")

    def free(self) -> None:
        if self.pointer:
            cudart.cudaFreeHost(self.pointer)
            self.pointer = 0


def _span_bytes(shape, strides, dtype) -> int:
    return span_elements(shape, strides) * dtype.itemsize


def _matrix_orders(shape) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Dense strides with row-major and with column-major matrices, batch axes outermost."""
    if len(shape) < 2:
        return c_strides(shape), c_strides(shape)
    m, n = shape[-2], shape[-1]
    return c_strides(shape), (*c_strides(shape[:-2], max(m * n, 1)), 1, max(m, 1))


def device_strides(op: Operand) -> tuple[int, ...]:
    """Element strides of a host operand's device copy: its own where it is already dense with
    row- or column-major matrices; otherwise (padded rows, steps, negative steps, broadcast axes,
    batch axes inside) packed so, keeping its matrices' order, as nvmath-python's dense copies are
    (cuBLASLt reads a broadcast column only with unit stride)."""
    shape, strides = op.shape, op.strides
    row_major, column_major = _matrix_orders(shape)
    for dense in (row_major, column_major):
        if all(s == d for n, s, d in zip(shape, strides, dense) if n > 1):
            return strides
    if len(shape) >= 2 and shape[-1] > 1 and (shape[-2] == 1 or 0 < abs(strides[-1]) < abs(strides[-2])):
        return row_major
    return column_major


def _numpy():
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - NumPy comes with every host-array package nvblaslt reads
        raise NvblasltValueError("a host operand with gaps, negative steps or broadcast axes needs NumPy to be "
                                 "packed for the GPU; install numpy or pass a dense array") from None
    return np


def _host_view(pointer: int, shape, strides, dtype):
    """A NumPy view of host memory: element 0 at ``pointer``, element ``strides`` (any sign)."""
    np = _numpy()
    low, high = element_range(shape, strides)
    nbytes = (high - low + 1) * dtype.itemsize
    raw = (ctypes.c_char * nbytes).from_address(pointer + low * dtype.itemsize)
    return np.ndarray(shape, dtype, buffer=raw, offset=-low * dtype.itemsize,
                      strides=tuple(s * dtype.itemsize for s in strides))


def _copy_strided(source: int, source_strides, target: int, target_strides, shape, itemsize: int) -> None:
    """Host memory to host memory, element by element layout (NumPy views of raw bytes)."""
    if not math.prod(shape):
        return
    np = _numpy()
    element = np.dtype((np.void, itemsize))
    _host_view(target, shape, target_strides, element)[...] = _host_view(source, shape, source_strides, element)


def _conjugate_strided(host: Operand, target: int, target_strides) -> None:
    """The complex conjugate of a host operand's values, written to host memory at ``target``."""
    if not math.prod(host.shape):
        return
    np = _numpy()
    dtype = np.dtype(host.dtype.name)
    np.conjugate(_host_view(host.ptr, host.shape, host.strides, dtype),
                 out=_host_view(target, host.shape, target_strides, dtype))


def device_layout(op: Operand, device: int) -> Operand:
    """The operand as its device copy will be laid out, before anything is copied (its pointer 0):
    what the checks read, so that a refused call copies nothing. Staging resolves a conjugate view."""
    return dataclasses.replace(op, ptr=0, strides=device_strides(op), device=device, host=False, conjugated=False)


def stage(op: Operand, device: int, stream: int) -> tuple[Operand, _memory.DeviceBuffer]:
    """A device copy of a host operand (see ``device_strides``); the buffer keeps it alive. A lazy
    conjugate view is copied conjugated: the copy holds the values it means, and needs no OP_C."""
    strides = device_strides(op)
    buffer = _memory.DeviceBuffer(_span_bytes(op.shape, strides, op.dtype), stream)
    refresh(op, buffer.pointer, strides, stream)
    staged = Operand(op.obj, buffer.pointer, op.shape, strides, op.dtype, device, op.readonly, op.kind)
    return staged, buffer


def refresh(host: Operand, device_pointer: int, strides: tuple[int, ...], stream: int) -> None:
    """Copy a host operand's current values (conjugated, for a lazy conjugate view) into its device
    copy, laid out with element ``strides``; waits for ``stream``."""
    nbytes = _span_bytes(host.shape, strides, host.dtype)
    pinned = PinnedBuffer(nbytes)
    try:
        if host.conjugated:
            _conjugate_strided(host, pinned.pointer, strides)
        elif strides == host.strides:
            ctypes.memmove(pinned.pointer, host.ptr, nbytes)
        else:
            _copy_strided(host.ptr, host.strides, pinned.pointer, strides, host.shape, host.dtype.itemsize)
        _cuda.check(cudart.cudaMemcpyAsync(device_pointer, pinned.pointer, nbytes,
                                           cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync")
        _cuda.check(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")  # before the pinned copy goes
    finally:
        pinned.free()


def copy_back(device_pointer: int, host_array, shape, strides, dtype, stream: int, device_strides=None) -> None:
    """Device memory laid out with ``device_strides`` (default: the host array's ``strides``) ->
    ``host_array``; waits for ``stream``."""
    device_strides = strides if device_strides is None else device_strides
    nbytes = _span_bytes(shape, device_strides, dtype)
    pinned = PinnedBuffer(nbytes)
    try:
        _cuda.check(cudart.cudaMemcpyAsync(pinned.pointer, device_pointer, nbytes,
                                           cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync")
        _cuda.check(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        if device_strides == tuple(strides):
            ctypes.memmove(framework_of(host_array).host_pointer(host_array), pinned.pointer, nbytes)
        else:
            _copy_strided(pinned.pointer, device_strides, framework_of(host_array).host_pointer(host_array), strides,
                          shape, dtype.itemsize)
    finally:
        pinned.free()


def to_host(result, framework: Framework, d_layout: tuple, aux_layouts: dict, stream: int, in_place=None):
    """Device results, D or ``(D, aux)``, copied back into new host arrays of the operands' package
    (``framework``'s host arrays: CPU torch, else NumPy), each laid out as ``(shape, strides, dtype)``
    says; with ``in_place`` = (the host c, its staged device pointer and strides), D goes back into c."""
    d, aux = (result if isinstance(result, tuple) else (result, None))

    def back(array, shape, strides, dtype):
        host = framework.empty_host(shape, strides, dtype)
        copy_back(_device_pointer(array), host, shape, strides, dtype, stream)
        return host

    if in_place is not None:
        c, c_pointer, c_device_strides = in_place
        copy_back(c_pointer, c.obj, c.shape, c.strides, c.dtype, stream, c_device_strides)
        d_host = c.obj
    else:
        d_host = back(d, *d_layout)
    if aux is None:
        return d_host
    return d_host, {k: back(v, *aux_layouts[k]) for k, v in aux.items()}


def _device_pointer(array) -> int:
    """Where a device result lives: nvblaslt's own array, or one of a GPU package's."""
    if isinstance(array, _memory.DeviceArray):
        return array.ptr
    fingerprint = framework_of(array).fingerprint(array)
    if fingerprint is not None:
        return fingerprint[0]
    return _operands.read(array, "result", 0).ptr
