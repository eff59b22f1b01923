"""Device memory: results in the caller's framework, nvblaslt's own array type, workspace.

Results are column-major per matrix (cuBLASLt's native order, so the bias runs along rows
of D as the epilogs define it): an (..., M, N) array with strides (..., 1, M).
CuPy and PyTorch results come from their own pools on their current stream (their adapters in
``_frameworks`` allocate them); every other caller gets memory from cuda-bindings' stream-ordered
allocator in a ``DeviceArray``, handed to JAX or Numba zero-copy.
"""

from __future__ import annotations

import math
import weakref

from . import _cuda, _dlpack, _strides
from ._cuda import cudart
from ._dtypes import DType
from ._frameworks import Allocate, Framework


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
    """nvblaslt's own GPU array, in which results come back where no package allocates them.

    ``matmul`` and ``Matmul.execute`` return their results in the operands' package. CuPy and
    PyTorch results come from those packages' own memory pools; JAX and Numba results are made
    here and handed over zero-copy; for any other package (objects that only export DLPack or
    ``__cuda_array_interface__``, such as cuda.core's), and for a dtype a package's pool does not
    have, the result is a ``DeviceArray``. Any package that reads DLPack or the CUDA array
    interface can take it zero-copy.

    Its memory comes from the CUDA stream-ordered allocator (``cudaMallocAsync``) on the stream
    the work ran on, and is freed when the last reference to it goes: stream-ordered where that
    stream is the legacy default stream, and otherwise after ``cudaDeviceSynchronize`` (the stream
    may no longer exist by then), which waits for the whole GPU. A consumer that passes its own
    stream to ``__dlpack__`` is ordered after the work that wrote the array; the CUDA array
    interface names that stream (``"stream"``).

    Parameters
    ----------
    buffer : DeviceBuffer
        The device memory (nvblaslt's internal owner of one ``cudaMallocAsync`` allocation);
        kept alive by the array.
    shape : tuple of int
        The array's shape.
    strides : tuple of int
        Its strides, in elements (not bytes).
    dtype : DType
        Its element type (nvblaslt's internal description of a dtype: ``dtype.name`` is
        ``"float32"``, ``"bfloat16"``, …).
    device : int
        The GPU the memory is on.
    stream : int, default 0
        The ``cudaStream_t`` whose work writes the array.

    Attributes
    ----------
    shape : tuple of int
        The shape.
    strides_elements : tuple of int
        The strides in elements.
    dtype : DType
        The element type.
    device : int
        The GPU.
    ptr : int
        The address of the first element.
    ndim, size : int
        The number of dimensions and of elements.

    Notes
    -----
    nvblaslt makes these itself; a caller has no need to construct one. It implements
    ``__dlpack__`` / ``__dlpack_device__`` (DLPack, with the ``stream=`` handshake) and
    ``__cuda_array_interface__`` (version 3), and has no arithmetic of its own.

    Examples
    --------
    On a GPU, with operands that only export the CUDA array interface:

    .. code-block:: python

        import cupy
        import nvblaslt

        class Exported:                        # an array of no package nvblaslt knows
            def __init__(self, array):
                self.__cuda_array_interface__ = array.__cuda_array_interface__

        x = cupy.random.rand(64, 32, dtype=cupy.float32)
        w = cupy.random.rand(32, 16, dtype=cupy.float32)
        d = nvblaslt.matmul(Exported(x), Exported(w))   # x and w stay alive while d is computed
        d                                      # <nvblaslt.DeviceArray shape=(64, 16) dtype=float32 device=0>
        cupy.from_dlpack(d)                    # zero-copy, into any package that reads DLPack
    """

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
            wait_for(self._stream, 0 if stream in (1, 2) else stream)
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


def wait_for(producer: int, consumer: int) -> None:
    """Make ``consumer`` wait for the work queued so far on ``producer``."""
    if producer == consumer:
        return
    event = _cuda.check(cudart.cudaEventCreateWithFlags(cudart.cudaEventDisableTiming), "cudaEventCreate")
    _cuda.check(cudart.cudaEventRecord(event, producer), "cudaEventRecord")
    _cuda.check(cudart.cudaStreamWaitEvent(consumer, event, 0), "cudaStreamWaitEvent")
    _cuda.check(cudart.cudaEventDestroy(event), "cudaEventDestroy")



def own_allocator(shape: tuple[int, ...], strides: tuple[int, ...], dtype: DType, device: int) -> Allocate:
    """An ``Allocate`` for DeviceArrays of any ``shape`` and element ``strides``, in memory from
    the stream-ordered allocator on the stream the work runs on."""
    size = _strides.span_elements(shape, strides) * dtype.itemsize

    def allocate_own(stream: int, framework_stream: int):
        buffer = DeviceBuffer(size, stream)
        return DeviceArray(buffer, shape, strides, dtype, device, stream), buffer.pointer
    return allocate_own


def strided_allocator(framework: Framework, shape: tuple[int, ...], strides: tuple[int, ...], dtype: DType,
                      device: int) -> Allocate:
    """``allocate(stream, framework_stream) -> (array, pointer)`` for results of any ``shape`` and
    element ``strides``, for work on ``stream``: in ``framework``'s pool where it has one for the
    dtype (see ``Framework.pool_allocator``), else nvblaslt's own DeviceArrays."""
    allocate = framework.pool_allocator(shape, strides, dtype, device)
    return allocate if allocate is not None else own_allocator(shape, strides, dtype, device)
