"""Read any GPU array through DLPack or ``__cuda_array_interface__``: pointer, shape, strides,
dtype, device. No framework is imported to read an operand.

DLPack comes first: its dtype codes are unambiguous (CAI cannot tell bfloat16 from other
2-byte types) and its ``stream=`` handshake orders the producer's work before ours.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

from . import _cuda, _dlpack, _dtypes, _frameworks
from ._address import readable_range
from ._cuda import cudart
from ._errors import CudaError, NvblasltArgumentError, NvblasltTypeError, NvblasltValueError
from ._frameworks import Framework, framework_of
from ._memory import wait_for
from ._strides import c_strides, element_range
from ._streams import dlpack_stream

_MAX_NDIM = 64  # far beyond any matmul operand; a capsule claiming more is malformed
_MAX_EXTENT = 1 << 62


@dataclass(slots=True)
class Operand:
    obj: object  # the caller's array, kept alive while nvblaslt uses its memory
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    dtype: _dtypes.DType
    device: int
    readonly: bool
    kind: str  # the name of its package's adapter (see ``framework``)
    host: bool = False  # in host memory (NumPy, CPU torch): staged to the GPU before use
    conjugated: bool = False  # a PyTorch lazy-conjugate view: the memory holds the unconjugated values

    @property
    def alignment(self) -> int:
        """The largest power of two (up to 256) dividing the pointer: what kernels may assume."""
        return min(256, self.ptr & -self.ptr) if self.ptr else 256

    @property
    def framework(self) -> Framework:
        """The adapter of the array's package: the one results are returned in."""
        return _frameworks.BY_NAME[self.kind]

    def describe(self) -> str:
        return f"{type(self.obj).__name__} of shape {self.shape}, dtype {self.dtype.name}, strides {self.strides}"




def _checked_layout(shape, strides, name: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Extents and element strides as plain ints, refused when no real array could have them."""
    for what, values in (("shape", shape), ("strides", strides)):
        if any(isinstance(v, bool) or not isinstance(v, int) for v in values):
            raise NvblasltTypeError(f"{name}: {what} must be integers, got {tuple(values)!r}")
    if any(n < 0 for n in shape):
        raise NvblasltValueError(f"{name}: negative extent in shape {tuple(shape)}")
    if any(not -_MAX_EXTENT < v < _MAX_EXTENT for v in (*shape, *strides)) or math.prod(shape) >= _MAX_EXTENT:
        raise NvblasltValueError(f"{name}: shape {tuple(shape)} / strides {tuple(strides)} overflow 64-bit "
                                 f"addressing")
    return tuple(int(n) for n in shape), tuple(int(s) for s in strides)


def _check_memory(pointer: int, shape, strides, dtype, name: str, host: bool = False) -> None:
    """The memory an array claims must be addressable: a non-NULL, element-aligned pointer, every
    element from 0 to 2**64, and no negative strides in GPU memory (cuBLASLt reads none; a host
    array's are packed away when it is staged)."""
    if not math.prod(shape):
        return
    if not pointer:
        raise NvblasltValueError(f"{name}: NULL data pointer for a non-empty array of shape {shape}")
    if pointer % dtype.itemsize:
        raise NvblasltValueError(f"{name}: pointer 0x{pointer:x} is not aligned to its {dtype.itemsize}-byte elements")
    low, high = element_range(shape, strides)
    if low < 0 and not host:
        raise NvblasltValueError(f"{name}: expected non-negative strides in a GPU array (cuBLASLt reads none), got "
                                 f"shape {shape} with element strides {strides}; pass a copy (host arrays are "
                                 f"packed densely)")
    if pointer + low * dtype.itemsize < 0 or pointer + (high + 1) * dtype.itemsize > 1 << 64:
        raise NvblasltValueError(f"{name}: shape {shape} with strides {strides} from 0x{pointer:x} runs past the end "
                                 f"of the address space")


def _read_dlpack(obj, name: str, stream: int) -> Operand:
    device_type, device_id = obj.__dlpack_device__()
    host = device_type in (_dlpack.KDL_CPU, _dlpack.KDL_CUDA_HOST)
    if not host and device_type not in (_dlpack.KDL_CUDA, _dlpack.KDL_CUDA_MANAGED):
        raise NvblasltTypeError(f"{name}: expected an array in GPU or host memory, got a {type(obj).__name__} on "
                                f"DLPack device type {device_type}")
    if host:
        capsule = obj.__dlpack__()
    else:
        try:
            capsule = obj.__dlpack__(stream=dlpack_stream(stream), max_version=(1, 0))
        except TypeError:  # a producer from before DLPack 1.0
            capsule = obj.__dlpack__(stream=dlpack_stream(stream))
    tensor, readonly, version = _dlpack.read_capsule(capsule)
    if version is not None and version[0] != 1:
        raise NvblasltValueError(f"{name}: DLPack capsule of version {version[0]}.{version[1]}; nvblaslt reads "
                                 f"major version 1")
    if (tensor.device.device_type, tensor.device.device_id) != (device_type, device_id) and not (
            host and tensor.device.device_type in (_dlpack.KDL_CPU, _dlpack.KDL_CUDA_HOST)):
        raise NvblasltValueError(f"{name}: __dlpack_device__ says {(device_type, device_id)} but the capsule says "
                                 f"{(tensor.device.device_type, tensor.device.device_id)}")
    if not 0 <= tensor.ndim <= _MAX_NDIM:
        raise NvblasltValueError(f"{name}: DLPack tensor claims {tensor.ndim} dimensions (expected 0 to {_MAX_NDIM})")
    dtype = _dtypes.from_dlpack(tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes)
    if dtype is None:
        raise NvblasltArgumentError(
            f"{name}: unsupported dtype (DLPack code {tensor.dtype.code}, {tensor.dtype.bits} bits, "
            f"{tensor.dtype.lanes} lanes); expected one of {', '.join(d.name for d in _dtypes.ALL)}"
        )
    shape, strides = _dlpack.tensor_shape(tensor)
    shape, strides = _checked_layout(shape, strides or c_strides(shape), name)
    pointer = (tensor.data or 0) + tensor.byte_offset
    _check_memory(pointer, shape, strides, dtype, name, host)
    return Operand(obj, pointer, shape, strides, dtype, device_id if not host else -1, readonly,
                   framework_of(obj).name, host)


def _pointer_device(pointer: int, name: str) -> int:
    error, attributes = cudart.cudaPointerGetAttributes(pointer)
    if error in (cudart.cudaError_t.cudaErrorInsufficientDriver, cudart.cudaError_t.cudaErrorNoDevice):
        # no GPU to ask: the checks that need none (shapes, dtypes) still come first, and the first GPU
        # work says there is no GPU
        return 0
    if error not in (_cuda.SUCCESS, cudart.cudaError_t.cudaErrorInvalidValue):
        _cuda.check((error, None), f"cudaPointerGetAttributes for {name}")  # no driver or GPU: say so
    if error != _cuda.SUCCESS or attributes.type not in (cudart.cudaMemoryType.cudaMemoryTypeDevice,
                                                         cudart.cudaMemoryType.cudaMemoryTypeManaged):
        raise NvblasltTypeError(f"{name}: expected a pointer to GPU memory, got 0x{pointer:x} (not device memory)")
    return attributes.device


def _read_interface(obj, interface: dict, name: str, protocol: str, host: bool = False) -> tuple:
    """(pointer, shape, strides, dtype, readonly) from a CAI or (``host``) NumPy array-interface dict."""
    if not isinstance(interface, dict):
        raise NvblasltTypeError(f"{name}: {protocol} is a {type(interface).__name__}, expected a dict")
    if interface.get("mask") is not None:
        raise NvblasltValueError(f"{name}: masked arrays are not supported ({protocol} has a mask)")
    typestr = interface.get("typestr")
    dtype = _dtypes.from_typestr(typestr) if isinstance(typestr, str) else None
    if dtype is None:
        raise NvblasltArgumentError(
            f"{name}: unsupported {protocol} typestr {typestr!r}; expected one of "
            f"{', '.join(sorted(_dtypes.BY_TYPESTR))} (bfloat16 and fp8 need DLPack: the typestr cannot name them)"
        )
    shape = interface.get("shape")
    data = interface.get("data")
    if not isinstance(shape, (tuple, list)) or len(shape) > _MAX_NDIM:
        raise NvblasltTypeError(f"{name}: {protocol} shape must be a tuple of at most {_MAX_NDIM} ints, got {shape!r}")
    if not isinstance(data, (tuple, list)) or len(data) != 2 or isinstance(data[0], bool) \
            or not isinstance(data[0], int) or data[0] < 0:
        raise NvblasltTypeError(f"{name}: {protocol} data must be (pointer, read-only flag), got {data!r}")
    byte_strides = interface.get("strides")
    if byte_strides is None:
        shape, strides = _checked_layout(tuple(shape), c_strides(tuple(s if isinstance(s, int) else 1
                                                                                 for s in shape)), name)
    else:
        if not isinstance(byte_strides, (tuple, list)) or len(byte_strides) != len(shape):
            raise NvblasltTypeError(f"{name}: {protocol} strides {byte_strides!r} do not match shape {shape!r}")
        shape, byte_strides = _checked_layout(tuple(shape), tuple(byte_strides), name)
        if any(s % dtype.itemsize for s in byte_strides):
            raise NvblasltValueError(f"{name}: strides {byte_strides} (bytes) are not multiples of the item size")
        strides = tuple(s // dtype.itemsize for s in byte_strides)
    pointer = data[0]
    _check_memory(pointer, shape, strides, dtype, name, host)
    return pointer, shape, strides, dtype, bool(data[1])


_CAI_VERSIONS = range(4)  # the versions the CUDA Array Interface's specification defines


def _read_cai(obj, name: str, stream: int) -> Operand:
    interface = obj.__cuda_array_interface__
    version = interface.get("version") if isinstance(interface, dict) else None
    if version is not None and (isinstance(version, bool) or version not in _CAI_VERSIONS):
        raise NvblasltValueError(f"{name}: __cuda_array_interface__ version {version!r}; nvblaslt reads versions 0 to "
                                 f"3 (a later version may change what the fields mean)")
    pointer, shape, strides, dtype, readonly = _read_interface(obj, interface, name, "__cuda_array_interface__")
    producer_stream = interface.get("stream")
    if producer_stream is not None:  # CAI v3: order the producer's work before ours
        if isinstance(producer_stream, bool) or not isinstance(producer_stream, int) \
                or not 0 < producer_stream < 1 << 64:
            raise NvblasltValueError(f"{name}: __cuda_array_interface__ stream must be a non-zero int, got "
                                     f"{producer_stream!r}")
        wait_for(0 if producer_stream in (1, 2) else producer_stream, stream)
    device = _pointer_device(pointer, name) if pointer else _cuda.current_device()
    return Operand(obj, pointer or 0, shape, strides, dtype, device, readonly, framework_of(obj).name)


def _read_host_interface(obj, name: str) -> Operand:
    pointer, shape, strides, dtype, readonly = _read_interface(obj, obj.__array_interface__, name,
                                                               "__array_interface__", host=True)
    if math.prod(shape):  # its memory is read in this process (staged, or a scale read as a number): a bad
        low, high = element_range(shape, strides)  # pointer would crash it, so both ends are probed first
        if readable_range(pointer + low * dtype.itemsize, pointer + (high + 1) * dtype.itemsize) is False:
            raise NvblasltValueError(f"{name}: __array_interface__ data pointer 0x{pointer:x}: the memory of its "
                                     f"{shape} {dtype.name} elements cannot be read in this process")
    return Operand(obj, pointer, shape, strides, dtype, -1, readonly, framework_of(obj).name, True)


def is_host_array(obj) -> bool:
    """Whether ``obj`` lives in host memory (asked cheaply, before any framework stream is queried:
    a CPU-only PyTorch build cannot answer questions about CUDA streams)."""
    device = getattr(obj, "__dlpack_device__", None)
    if device is not None:
        try:
            return device()[0] in (_dlpack.KDL_CPU, _dlpack.KDL_CUDA_HOST)
        except Exception:  # noqa: BLE001 - an odd producer: let read() say what is wrong with it
            return False
    return hasattr(obj, "__array_interface__") and not hasattr(obj, "__cuda_array_interface__")


_recent: dict[int, tuple] = {}  # id(obj) -> (weakref, fingerprint, Operand)
_RECENT_SIZE = 256


def read_cached(obj, name: str, stream: int) -> Operand:
    """``read``, reusing the last read of the same CuPy/PyTorch array when its fingerprint matches.

    Only for work on the array's own framework stream, where no stream handshake is due."""
    entry = _recent.get(id(obj))
    fingerprint = framework_of(obj).fingerprint
    if entry is not None and entry[0]() is obj and entry[1] == fingerprint(obj):
        return Operand(obj, *entry[2])
    op = read(obj, name, stream)
    identity = fingerprint(obj)
    if identity is not None and identity[4] != -1:  # -1: a lazy view, whose memory only read() interprets
        try:
            reference = weakref.ref(obj)
        except TypeError:
            return op
        if len(_recent) >= _RECENT_SIZE:
            _recent.pop(next(iter(_recent)))
        # the fields without the array itself: the cache must not keep arrays alive
        fields = (op.ptr, op.shape, op.strides, op.dtype, op.device, op.readonly, op.kind, op.host, op.conjugated)
        _recent[id(obj)] = (reference, identity, fields)
    return op


def _has(obj, attribute: str) -> bool:
    """hasattr() that counts a property raising something other than AttributeError as present,
    so that reading it reports the failure instead of hasattr() propagating it."""
    try:
        return hasattr(obj, attribute)
    except Exception:  # noqa: BLE001
        return True


def read(obj, name: str, stream: int) -> Operand:
    """The operand ``name`` as nvblaslt sees it; raises before any pointer is used.

    GPU arrays are read through DLPack or ``__cuda_array_interface__``; host arrays (NumPy,
    CPU torch tensors) through DLPack or ``__array_interface__``, marked ``host`` for staging."""
    if obj is None:
        raise NvblasltTypeError(f"{name}: expected an array, got None")
    view = framework_of(obj).read_view(obj, name, stream, read)
    if view is not None:
        return view
    cls = type(obj)
    if hasattr(cls, "__dlpack__") and hasattr(cls, "__dlpack_device__"):
        try:
            return _read_dlpack(obj, name, stream)
        except (NvblasltTypeError, NvblasltValueError, CudaError):
            raise
        except Exception as exc:  # noqa: BLE001 - an exporter may raise anything: say it in our words
            if not (_has(obj, "__cuda_array_interface__") or _has(obj, "__array_interface__")):
                raise NvblasltValueError(f"{name}: the array refused to export through DLPack: "
                                         f"{type(exc).__name__}: {exc}") from exc
    if _has(obj, "__cuda_array_interface__"):
        try:
            return _read_cai(obj, name, stream)
        except (NvblasltTypeError, NvblasltValueError, CudaError):
            raise
        except Exception as exc:  # noqa: BLE001
            raise NvblasltValueError(f"{name}: unreadable __cuda_array_interface__: {type(exc).__name__}: "
                                     f"{exc}") from exc
    if _has(obj, "__array_interface__"):
        try:
            return _read_host_interface(obj, name)
        except (NvblasltTypeError, NvblasltValueError):
            raise
        except Exception as exc:  # noqa: BLE001
            raise NvblasltValueError(f"{name}: unreadable __array_interface__: {type(exc).__name__}: {exc}") from exc
    raise NvblasltTypeError(
        f"{name}: expected an array exporting __dlpack__, __cuda_array_interface__ or __array_interface__ "
        f"(CuPy, PyTorch, JAX, Numba, NumPy, …), got {cls.__module__}.{cls.__qualname__}"
    )
