"""Device memory: results in the caller's framework, nvblaslt's own array type, workspace.

Results are column-major per matrix (cuBLASLt's native order, so the bias runs along rows
of D as the epilogs define it): an (..., M, N) array with strides (..., 1, M).
CuPy and PyTorch results come from their own pools on their current stream; every other
caller gets memory from cuda-bindings' stream-ordered allocator in a ``DeviceArray``,
handed to JAX or Numba zero-copy.
"""

from __future__ import annotations

import math
import sys
import weakref

from cuda.bindings import runtime as cudart

from . import _cuda, _dlpack
from ._dtypes import DType


def _free_async(pointer: int, last_stream: list) -> None:
    """Free after the work that used the memory. On the legacy default stream that is stream order;
    a caller's stream may be destroyed by now (freeing on it would be undefined), and the per-thread
    default stream is another stream in the thread running a finalizer: wait for the device instead."""
    if last_stream[0] not in (0, 1):
        cudart.cudaDeviceSynchronize()
    if cudart.cudaFreeAsync(pointer, 0)[0] != _cuda.SUCCESS:
        cudart.cudaFree(pointer)


class DeviceBuffer:
    """Raw device memory from ``cudaMallocAsync``, freed stream-ordered when released: on the last
    stream that used it (``used_on``), so a kernel still queued there finishes first."""

    __slots__ = ("pointer", "size", "_last_stream", "_finalizer", "__weakref__")

    def __init__(self, size: int, stream: int = 0):
        self.size = size
        self._last_stream = [stream]
        self.pointer = _cuda.check(cudart.cudaMallocAsync(max(size, 1), stream), "cudaMallocAsync") if size else 0
        self._finalizer = weakref.finalize(self, _free_async, self.pointer, self._last_stream) if size else None

    def used_on(self, stream: int) -> None:
        """Record that work on ``stream`` uses this memory (callers order streams among themselves)."""
        self._last_stream[0] = stream

    def release(self) -> None:
        if self._finalizer is not None:
            self._finalizer()


class DeviceArray:
    """nvblaslt's own GPU array: a strided view of a DeviceBuffer, exporting DLPack and CAI."""

    def __init__(self, buffer: DeviceBuffer, shape, strides, dtype: DType, device: int, stream: int = 0):
        self.buffer = buffer
        self.shape = tuple(shape)
        self.strides_elements = tuple(strides)
        self.dtype = dtype
        self.device = device
        self._stream = stream

    @property
    def ptr(self) -> int:
        return self.buffer.pointer

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __dlpack_device__(self) -> tuple[int, int]:
        return _dlpack.KDL_CUDA, self.device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        # Our work was queued on self._stream; a consumer on another stream waits for it.
        if stream not in (None, -1) and stream != (self._stream or 1):
            _wait(self._stream, 0 if stream in (1, 2) else stream)
        return _dlpack.export(self.ptr, self.shape, self.strides_elements, self.dtype.dlpack, self.device, self)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {
            "shape": self.shape,
            "typestr": self.dtype.typestr or f"|V{self.dtype.itemsize}",
            "data": (self.ptr, False),
            "strides": tuple(s * self.dtype.itemsize for s in self.strides_elements),
            "version": 3,
            "stream": self._stream or 1,
        }

    def __repr__(self) -> str:
        return f"<nvblaslt.DeviceArray shape={self.shape} dtype={self.dtype.name} device={self.device}>"


def _wait(producer: int, consumer: int) -> None:
    """Make ``consumer`` wait for the work queued so far on ``producer``."""
    if producer == consumer:
        return
    event = _cuda.check(cudart.cudaEventCreateWithFlags(cudart.cudaEventDisableTiming), "cudaEventCreate")
    _cuda.check(cudart.cudaEventRecord(event, producer), "cudaEventRecord")
    _cuda.check(cudart.cudaStreamWaitEvent(consumer, event, 0), "cudaStreamWaitEvent")
    _cuda.check(cudart.cudaEventDestroy(event), "cudaEventDestroy")


def strided_allocator(kind: str, shape: tuple[int, ...], strides: tuple[int, ...], dtype: DType, device: int):
    """``allocate(stream, framework_stream) -> (array, pointer)`` for arrays of any ``shape`` and
    element ``strides`` in ``kind``'s framework, for work on ``stream``. The framework's pool
    allocates on its current stream (``framework_stream``); when our stream differs, the array is
    tied to ours so the pool does not hand it out again while our kernel may run."""
    if kind == "torch":
        torch = sys.modules["torch"]
        # new_empty_strided on a template skips parsing dtype and device on every call
        new_empty_strided = torch.empty(0, dtype=getattr(torch, dtype.name),
                                        device=torch.device("cuda", device)).new_empty_strided

        def allocate_torch(stream: int, framework_stream: int):
            array = new_empty_strided(shape, strides)
            if stream != framework_stream:
                if stream in (0, 1):  # the legacy default stream: torch knows it as its default stream
                    array.record_stream(torch.cuda.default_stream(device))
                elif stream == 2:  # the per-thread default stream has no torch object: the caller orders it
                    pass
                else:
                    array.record_stream(torch.cuda.ExternalStream(stream, device=device))
            return array, array.data_ptr()
        return allocate_torch
    if kind == "cupy" and dtype.typestr is not None:
        cupy = sys.modules["cupy"]
        ndarray, alloc, numpy_dtype = cupy.ndarray, cupy.cuda.alloc, sys.modules["numpy"].dtype(dtype.name)
        nbytes = max(span_elements(shape, strides), 1) * dtype.itemsize
        byte_strides: tuple[int, ...] | None = tuple(s * dtype.itemsize for s in strides)
        # a dense C- or F-order result is asked for by its order, which CuPy lays out faster than it
        # checks given strides (0.2 µs a call, H200 host)
        order = "C"
        if len(shape) > 1 and 0 not in shape:  # (CuPy's strides for empty extents differ from ours)
            if strides == c_strides(shape):
                byte_strides = None
            elif strides == c_strides(shape[::-1])[::-1]:
                byte_strides, order = None, "F"

        def cupy_empty():  # one constructor over pool memory (CuPy has no empty_strided)
            # a dtype object, not a name, and strides positional: 0.4 µs less a call (H200 host)
            return ndarray(shape, numpy_dtype, alloc(nbytes), byte_strides, order)

        def allocate_cupy(stream: int, framework_stream: int):
            with cupy.cuda.Device(device):
                if stream != framework_stream:  # CuPy's pool keeps blocks per stream: allocate on ours
                    with cupy.cuda.ExternalStream(stream):
                        array = cupy_empty()
                else:
                    array = cupy_empty()
            return array, array.data.ptr

        def allocate_cupy_one_gpu(stream: int, framework_stream: int):
            if stream != framework_stream:
                return allocate_cupy(stream, framework_stream)
            memory = alloc(nbytes)  # cupy_empty() inlined: the hot path of execute() on CuPy arrays
            return ndarray(shape, numpy_dtype, memory, byte_strides, order), memory.ptr
        return allocate_cupy if _cuda.several_devices() else allocate_cupy_one_gpu
    size = (sum((n - 1) * s for n, s in zip(shape, strides)) + 1) * dtype.itemsize

    def allocate_own(stream: int, framework_stream: int):
        buffer = DeviceBuffer(size, stream)
        return DeviceArray(buffer, shape, strides, dtype, device, stream), buffer.pointer
    return allocate_own


def to_framework(kind: str, array):
    """Hand a DeviceArray to the caller's framework, zero-copy."""
    if not isinstance(array, DeviceArray):
        return array
    if kind == "jax":
        import jax.dlpack

        return jax.dlpack.from_dlpack(array)
    if kind == "numba":
        import numba.cuda

        return numba.cuda.as_cuda_array(array)
    return array


def span_elements(shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """Elements from the first to the last one a (non-negatively) strided array touches."""
    if not shape:
        return 1
    if 0 in shape:
        return 0
    return sum((n - 1) * s for n, s in zip(shape, strides)) + 1


def c_strides(shape: tuple[int, ...], unit: int = 1) -> tuple[int, ...]:
    """Element strides of a C-order (row-major, last index fastest) array of ``unit``-element items."""
    strides: list[int] = []
    step = unit
    for extent in reversed(shape):
        strides.insert(0, step)
        step *= max(extent, 1)
    return tuple(strides)
