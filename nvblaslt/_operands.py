"""Read any GPU array through DLPack or ``__cuda_array_interface__``: pointer, shape, strides,
dtype, device. No framework is imported to read an operand.

DLPack comes first: its dtype codes are unambiguous (CAI cannot tell bfloat16 from other
2-byte types) and its ``stream=`` handshake orders the producer's work before ours.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from cuda.bindings import runtime as cudart

from . import _cuda, _dlpack, _dtypes
from ._errors import NvblasltTypeError, NvblasltValueError
from ._memory import DeviceArray, _wait
from ._streams import dlpack_stream

# Top-level module of an array's type -> the framework results are returned in.
_KINDS = {"cupy": "cupy", "torch": "torch", "jax": "jax", "jaxlib": "jax", "numba": "numba"}


@dataclass(slots=True)
class Operand:
    obj: object  # the caller's array, kept alive while nvblaslt uses its memory
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    dtype: _dtypes.DType
    device: int
    readonly: bool
    kind: str  # cupy, torch, jax, numba or protocol

    @property
    def alignment(self) -> int:
        """The largest power of two (up to 256) dividing the pointer: what kernels may assume."""
        return min(256, self.ptr & -self.ptr) if self.ptr else 256

    def describe(self) -> str:
        return f"{type(self.obj).__name__} of shape {self.shape}, dtype {self.dtype.name}, strides {self.strides}"


_kind_by_type: dict[type, str] = {DeviceArray: "protocol"}


def kind_of(obj) -> str:
    """The framework results are returned in, from the array's type (remembered per type)."""
    cls = type(obj)
    kind = _kind_by_type.get(cls)
    if kind is None:
        kind = _kind_by_type[cls] = _KINDS.get(cls.__module__.partition(".")[0], "protocol")
    return kind


def _compact_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))


def _read_dlpack(obj, name: str, stream: int) -> Operand:
    device_type, device_id = obj.__dlpack_device__()
    if device_type not in (_dlpack.KDL_CUDA, _dlpack.KDL_CUDA_MANAGED):
        where = {_dlpack.KDL_CPU: "host (kDLCPU)", _dlpack.KDL_CUDA_HOST: "pinned host (kDLCUDAHost)"}
        raise NvblasltTypeError(
            f"{name}: expected an array in GPU memory, got a {type(obj).__name__} on the "
            f"{where.get(device_type, f'DLPack device type {device_type}')}"
        )
    try:
        capsule = obj.__dlpack__(stream=dlpack_stream(stream), max_version=(1, 0))
    except TypeError:  # a producer from before DLPack 1.0
        capsule = obj.__dlpack__(stream=dlpack_stream(stream))
    tensor, readonly = _dlpack.read_capsule(capsule)
    dtype = _dtypes.from_dlpack(tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes)
    if dtype is None:
        raise NvblasltTypeError(
            f"{name}: unsupported dtype (DLPack code {tensor.dtype.code}, {tensor.dtype.bits} bits, "
            f"{tensor.dtype.lanes} lanes); expected one of {', '.join(d.name for d in _dtypes.ALL)}"
        )
    shape, strides = _dlpack.tensor_shape(tensor)
    return Operand(obj, (tensor.data or 0) + tensor.byte_offset, shape, strides or _compact_strides(shape),
                   dtype, device_id, readonly, kind_of(obj))


def _pointer_device(pointer: int, name: str) -> int:
    error, attributes = cudart.cudaPointerGetAttributes(pointer)
    if error != _cuda.SUCCESS or attributes.type not in (cudart.cudaMemoryType.cudaMemoryTypeDevice,
                                                         cudart.cudaMemoryType.cudaMemoryTypeManaged):
        raise NvblasltTypeError(f"{name}: expected a pointer to GPU memory, got 0x{pointer:x} (not device memory)")
    return attributes.device


def _read_cai(obj, name: str, stream: int) -> Operand:
    interface = obj.__cuda_array_interface__
    if interface.get("mask") is not None:
        raise NvblasltValueError(f"{name}: masked arrays are not supported (__cuda_array_interface__ has a mask)")
    dtype = _dtypes.from_typestr(interface["typestr"])
    if dtype is None:
        raise NvblasltTypeError(
            f"{name}: unsupported __cuda_array_interface__ typestr {interface['typestr']!r}; expected one of "
            f"{', '.join(sorted(_dtypes.BY_TYPESTR))} (bfloat16 and fp8 need DLPack: CAI cannot name them)"
        )
    shape = tuple(interface["shape"])
    pointer, readonly = interface["data"]
    byte_strides = interface.get("strides")
    if byte_strides is None:
        strides = _compact_strides(shape)
    else:
        if any(s % dtype.itemsize for s in byte_strides):
            raise NvblasltValueError(f"{name}: strides {byte_strides} (bytes) are not multiples of the item size")
        strides = tuple(s // dtype.itemsize for s in byte_strides)
    producer_stream = interface.get("stream")
    if producer_stream is not None:  # CAI v3: order the producer's work before ours
        _wait(0 if producer_stream in (1, 2) else producer_stream, stream)
    device = _pointer_device(pointer, name) if pointer else _cuda.current_device()
    return Operand(obj, pointer or 0, shape, strides, dtype, device, bool(readonly), kind_of(obj))


def fingerprint(obj, kind: str):
    """A cheap identity of a CuPy/PyTorch array's memory and shape, or None for other arrays.

    Lets a hot path reuse what it read from the same object before: an array that was resized
    or re-pointed in place has another fingerprint and is read again."""
    if kind == "torch":
        return obj.data_ptr(), obj.shape, obj.stride(), obj.dtype, obj.get_device()
    if kind == "cupy":
        return obj.data.ptr, obj.shape, obj.strides, obj.dtype, obj.device.id
    return None


_recent: dict[int, tuple] = {}  # id(obj) -> (weakref, fingerprint, Operand)
_RECENT_SIZE = 256


def read_cached(obj, name: str, stream: int) -> Operand:
    """``read``, reusing the last read of the same CuPy/PyTorch array when its fingerprint matches.

    Only for work on the array's own framework stream, where no stream handshake is due."""
    entry = _recent.get(id(obj))
    kind = kind_of(obj)
    if entry is not None and entry[0]() is obj and entry[1] == fingerprint(obj, kind):
        return Operand(obj, *entry[2])
    op = read(obj, name, stream)
    if kind in ("torch", "cupy"):
        try:
            reference = weakref.ref(obj)
        except TypeError:
            return op
        if len(_recent) >= _RECENT_SIZE:
            _recent.pop(next(iter(_recent)))
        # the fields without the array itself: the cache must not keep arrays alive
        fields = (op.ptr, op.shape, op.strides, op.dtype, op.device, op.readonly, op.kind)
        _recent[id(obj)] = (reference, fingerprint(obj, kind), fields)
    return op


def read(obj, name: str, stream: int) -> Operand:
    """The operand ``name`` as nvblaslt sees it; raises before any pointer is used."""
    if obj is None:
        raise NvblasltTypeError(f"{name}: expected a GPU array, got None")
    cls = type(obj)
    if hasattr(cls, "__dlpack__") and hasattr(cls, "__dlpack_device__"):
        try:
            return _read_dlpack(obj, name, stream)
        except NvblasltTypeError:
            raise
        except (BufferError, RuntimeError, TypeError, ValueError) as exc:
            if not hasattr(obj, "__cuda_array_interface__"):
                raise NvblasltValueError(f"{name}: the array refused to export through DLPack: {exc}") from exc
    if hasattr(obj, "__cuda_array_interface__"):
        try:
            return _read_cai(obj, name, stream)
        except (AttributeError, KeyError, TypeError, ValueError, RuntimeError) as exc:
            if isinstance(exc, (NvblasltTypeError, NvblasltValueError)):
                raise
            raise NvblasltValueError(f"{name}: unreadable __cuda_array_interface__: {exc}") from exc
    raise NvblasltTypeError(
        f"{name}: expected a GPU array exporting __dlpack__ or __cuda_array_interface__ "
        f"(CuPy, PyTorch, JAX, Numba, …), got {cls.__module__}.{cls.__qualname__}"
    )
