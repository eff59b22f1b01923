"""Host operands (NumPy arrays, CPU torch tensors): staged to the GPU and results copied back,
as nvmath-python does. Copies go through pinned buffers, stream-ordered, with cuda-bindings."""

from __future__ import annotations

import ctypes
import sys

from cuda.bindings import runtime as cudart

from . import _cuda, _memory
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


def stage(op: Operand, device: int, stream: int) -> tuple[Operand, _memory.DeviceBuffer]:
    """A device copy of a host operand with the same strides; the buffer keeps it alive."""
    nbytes = _memory.span_elements(op.shape, op.strides) * op.dtype.itemsize
    buffer = _memory.DeviceBuffer(nbytes, stream)
    pinned = PinnedBuffer(nbytes)
    try:
        ctypes.memmove(pinned.pointer, op.ptr, nbytes)
        _cuda.check(cudart.cudaMemcpyAsync(buffer.pointer, pinned.pointer, nbytes, _H2D, stream), "cudaMemcpyAsync")
        _cuda.check(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")  # before the pinned copy goes
    finally:
        pinned.free()
    staged = Operand(op.obj, buffer.pointer, op.shape, op.strides, op.dtype, device, op.readonly, op.kind)
    return staged, buffer


def refresh(host: Operand, device_pointer: int, stream: int) -> None:
    """Copy a host operand's current values into its staged device copy again."""
    nbytes = _memory.span_elements(host.shape, host.strides) * host.dtype.itemsize
    pinned = PinnedBuffer(nbytes)
    try:
        ctypes.memmove(pinned.pointer, host.ptr, nbytes)
        _cuda.check(cudart.cudaMemcpyAsync(device_pointer, pinned.pointer, nbytes, _H2D, stream), "cudaMemcpyAsync")
        _cuda.check(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
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
    nbytes = _memory.span_elements(shape, strides) * dtype.itemsize
    pinned = PinnedBuffer(nbytes)
    try:
        _cuda.check(cudart.cudaMemcpyAsync(pinned.pointer, device_pointer, nbytes, _D2H, stream), "cudaMemcpyAsync")
        _cuda.check(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        ctypes.memmove(host_pointer(host_array), pinned.pointer, nbytes)
    finally:
        pinned.free()
