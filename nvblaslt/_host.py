"""Host operands (NumPy arrays, CPU torch tensors): staged to the GPU and results copied back,
as nvmath-python does. Copies go through pinned buffers, stream-ordered, with cuda-bindings."""

from __future__ import annotations

import ctypes
import sys

from cuda.bindings import runtime as cudart

from . import _cuda, _memory, _operands
from ._operands import Operand

_H2D = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
_D2H = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost


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
    return _memory.span_elements(shape, strides) * dtype.itemsize


def stage(op: Operand, device: int, stream: int) -> tuple[Operand, _memory.DeviceBuffer]:
    """A device copy of a host operand with the same strides; the buffer keeps it alive."""
    buffer = _memory.DeviceBuffer(_span_bytes(op.shape, op.strides, op.dtype), stream)
    refresh(op, buffer.pointer, stream)
    staged = Operand(op.obj, buffer.pointer, op.shape, op.strides, op.dtype, device, op.readonly, op.kind)
    return staged, buffer


def refresh(host: Operand, device_pointer: int, stream: int) -> None:
    """Copy a host operand's current values into its (staged) device copy; waits for ``stream``."""
    nbytes = _span_bytes(host.shape, host.strides, host.dtype)
    pinned = PinnedBuffer(nbytes)
    try:
        ctypes.memmove(pinned.pointer, host.ptr, nbytes)
        _cuda.check(cudart.cudaMemcpyAsync(device_pointer, pinned.pointer, nbytes, _H2D, stream), "cudaMemcpyAsync")
        _cuda.check(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")  # before the pinned copy goes
    finally:
        pinned.free()


def empty_like_layout(kind: str, template, shape: tuple[int, ...], strides: tuple[int, ...], dtype):
    """An uninitialised host array of ``kind`` (numpy or torch) with these element strides."""
    if kind == "torch":
        torch = sys.modules["torch"]
        return torch.empty_strided(shape, strides, dtype=getattr(torch, dtype.name))
    import numpy as np

    span = _memory.span_elements(shape, strides)
    base = np.empty(span, dtype=np.dtype(dtype.name))
    return np.lib.stride_tricks.as_strided(base, shape, tuple(s * dtype.itemsize for s in strides))


def host_pointer(array) -> int:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(array, torch.Tensor):
        return array.data_ptr()
    return array.__array_interface__["data"][0]


def copy_back(device_pointer: int, host_array, shape, strides, dtype, stream: int) -> None:
    """Device memory laid out like ``host_array`` -> ``host_array``; waits for ``stream``."""
    nbytes = _span_bytes(shape, strides, dtype)
    pinned = PinnedBuffer(nbytes)
    try:
        _cuda.check(cudart.cudaMemcpyAsync(pinned.pointer, device_pointer, nbytes, _D2H, stream), "cudaMemcpyAsync")
        _cuda.check(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        ctypes.memmove(host_pointer(host_array), pinned.pointer, nbytes)
    finally:
        pinned.free()


def to_host(result, kind: str, d_layout: tuple, aux_layouts: dict, stream: int, in_place=None):
    """Device results, D or ``(D, aux)``, copied back into new host arrays of the operands' package
    (``kind``: CPU torch, else NumPy), each laid out as ``(shape, strides, dtype)`` says; with
    ``in_place`` = (the host c, its staged device pointer), D goes back into c instead."""
    d, aux = (result if isinstance(result, tuple) else (result, None))
    host_kind = kind if kind == "torch" else "numpy"

    def back(array, shape, strides, dtype):
        host = empty_like_layout(host_kind, None, shape, strides, dtype)
        copy_back(_device_pointer(array), host, shape, strides, dtype, stream)
        return host

    if in_place is not None:
        c, c_pointer = in_place
        copy_back(c_pointer, c.obj, c.shape, c.strides, c.dtype, stream)
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
    fingerprint = _operands.fingerprint(array, _operands.kind_of(array))
    if fingerprint is not None:
        return fingerprint[0]
    return _operands.read(array, "result", 0).ptr
