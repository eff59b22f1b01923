"""Read any GPU array through DLPack or ``__cuda_array_interface__``: pointer, shape, strides,
dtype, device. No framework is imported to read an operand.

DLPack comes first: its dtype codes are unambiguous (CAI cannot tell bfloat16 from other
2-byte types) and its ``stream=`` handshake orders the producer's work before ours.
"""

from __future__ import annotations

import math
import sys
import weakref
from dataclasses import dataclass

from cuda.bindings import runtime as cudart

from . import _cuda, _dlpack, _dtypes
from ._errors import CudaError, NvblasltTypeError, NvblasltValueError
from ._memory import DeviceArray, _wait, c_strides
from ._streams import dlpack_stream

# Top-level module of an array's type -> the framework results are returned in.
KINDS = {"cupy": "cupy", "torch": "torch", "jax": "jax", "jaxlib": "jax", "numba": "numba", "numpy": "numpy"}
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
    kind: str  # cupy, torch, jax, numba, numpy or protocol
    host: bool = False  # in host memory (NumPy, CPU torch): staged to the GPU before use
    conjugated: bool = False  # a PyTorch lazy-conjugate view: the memory holds the unconjugated values

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
        kind = _kind_by_type[cls] = KINDS.get(cls.__module__.partition(".")[0], "protocol")
    return kind


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


def _check_memory(pointer: int, shape, strides, dtype, name: str) -> None:
    """The memory an array claims must be addressable: a non-NULL, element-aligned pointer whose
    last element lies below 2**64, and no negative strides (nvblaslt reads none)."""
    if not math.prod(shape):
        return
    if not pointer:
        raise NvblasltValueError(f"{name}: NULL data pointer for a non-empty array of shape {shape}")
    if pointer % dtype.itemsize:
        raise NvblasltValueError(f"{name}: pointer 0x{pointer:x} is not aligned to its {dtype.itemsize}-byte elements")
    if any(s < 0 for n, s in zip(shape, strides) if n > 1):
        raise NvblasltValueError(f"{name}: negative strides are not supported, got shape {shape} with element "
                                 f"strides {strides}")
    last = pointer + sum((n - 1) * s for n, s in zip(shape, strides)) * dtype.itemsize + dtype.itemsize
    if last > 1 << 64:
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
        raise NvblasltTypeError(
            f"{name}: unsupported dtype (DLPack code {tensor.dtype.code}, {tensor.dtype.bits} bits, "
            f"{tensor.dtype.lanes} lanes); expected one of {', '.join(d.name for d in _dtypes.ALL)}"
        )
    shape, strides = _dlpack.tensor_shape(tensor)
    shape, strides = _checked_layout(shape, strides or c_strides(shape), name)
    pointer = (tensor.data or 0) + tensor.byte_offset
    _check_memory(pointer, shape, strides, dtype, name)
    return Operand(obj, pointer, shape, strides, dtype, device_id if not host else -1, readonly, kind_of(obj), host)


def _pointer_device(pointer: int, name: str) -> int:
    error, attributes = cudart.cudaPointerGetAttributes(pointer)
    if error not in (_cuda.SUCCESS, cudart.cudaError_t.cudaErrorInvalidValue):
        _cuda.check((error, None), f"cudaPointerGetAttributes for {name}")  # no driver or GPU: say so
    if error != _cuda.SUCCESS or attributes.type not in (cudart.cudaMemoryType.cudaMemoryTypeDevice,
                                                         cudart.cudaMemoryType.cudaMemoryTypeManaged):
        raise NvblasltTypeError(f"{name}: expected a pointer to GPU memory, got 0x{pointer:x} (not device memory)")
    return attributes.device


def _read_interface(obj, interface: dict, name: str, protocol: str) -> tuple:
    """(pointer, shape, strides, dtype, readonly) from a CAI or NumPy array-interface dict."""
    if not isinstance(interface, dict):
        raise NvblasltTypeError(f"{name}: {protocol} is a {type(interface).__name__}, expected a dict")
    if interface.get("mask") is not None:
        raise NvblasltValueError(f"{name}: masked arrays are not supported ({protocol} has a mask)")
    typestr = interface.get("typestr")
    dtype = _dtypes.from_typestr(typestr) if isinstance(typestr, str) else None
    if dtype is None:
        raise NvblasltTypeError(
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
    _check_memory(pointer, shape, strides, dtype, name)
    return pointer, shape, strides, dtype, bool(data[1])


def _read_cai(obj, name: str, stream: int) -> Operand:
    interface = obj.__cuda_array_interface__
    pointer, shape, strides, dtype, readonly = _read_interface(obj, interface, name, "__cuda_array_interface__")
    producer_stream = interface.get("stream")
    if producer_stream is not None:  # CAI v3: order the producer's work before ours
        if isinstance(producer_stream, bool) or not isinstance(producer_stream, int) \
                or not 0 < producer_stream < 1 << 64:
            raise NvblasltValueError(f"{name}: __cuda_array_interface__ stream must be a non-zero int, got "
                                     f"{producer_stream!r}")
        _wait(0 if producer_stream in (1, 2) else producer_stream, stream)
    device = _pointer_device(pointer, name) if pointer else _cuda.current_device()
    return Operand(obj, pointer or 0, shape, strides, dtype, device, readonly, kind_of(obj))


def _read_host_interface(obj, name: str) -> Operand:
    pointer, shape, strides, dtype, readonly = _read_interface(obj, obj.__array_interface__, name,
                                                               "__array_interface__")
    return Operand(obj, pointer, shape, strides, dtype, -1, readonly, kind_of(obj), True)


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


def _torch_fingerprint(t):
    if t.is_conj() or t.is_neg():  # lazy views: only the checked path reads what their memory means
        return 0, None, None, None, -1
    return t.data_ptr(), t.shape, t.stride(), t.dtype, t.get_device()


def _cupy_fingerprint(x):
    memory = x.data  # its device_id is an int; x.device builds a Device object each time
    return memory.ptr, x.shape, x.strides, x.dtype, memory.device_id


# (pointer, shape, strides, dtype, device; device -1: not to be read by a hot path) per package
FINGERPRINTS = {"torch": _torch_fingerprint, "cupy": _cupy_fingerprint}


def fingerprint(obj, kind: str):
    """A cheap identity of a CuPy/PyTorch array's memory and shape, or None for other arrays.

    Lets a hot path reuse what it read from the same object before: an array that was resized
    or re-pointed in place has another fingerprint and is read again."""
    get = FINGERPRINTS.get(kind)
    return get(obj) if get is not None else None


def _torch_layouts(torch):
    tensor_types = (torch.Tensor, torch.nn.Parameter)  # subclasses with their own semantics take the checked path
    # the C methods called unbound: no bound method made and no instance dict searched per read
    tensor = torch.Tensor
    is_neg, is_conj, get_device, data_ptr, stride = (tensor.is_neg, tensor.is_conj, tensor.get_device,
                                                     tensor.data_ptr, tensor.stride)

    def layouts(arrays):
        pointers, layout = [], []
        for t in arrays:
            if t is None:
                pointers.append(None)
                layout.append(None)
                continue
            if type(t) not in tensor_types or is_neg(t):
                return None
            dtype = t.dtype
            if dtype.is_complex and is_conj(t):  # lazy views: only the checked path reads what their memory means
                return None
            device = get_device(t)
            if device < 0:  # a CPU tensor: host operands take the checked path
                return None
            pointer = data_ptr(t)
            pointers.append(pointer)
            layout.append((t.shape, stride(t), dtype, device, pointer & 255 and pointer & -pointer))
        return pointers, tuple(layout)
    return layouts


def _cupy_layouts(cupy):
    ndarray = cupy.ndarray

    def layouts(arrays):
        pointers, layout = [], []
        for x in arrays:
            if x is None:
                pointers.append(None)
                layout.append(None)
                continue
            if type(x) is not ndarray:
                return None
            memory = x.data
            pointer = memory.ptr
            pointers.append(pointer)
            layout.append((x.shape, x.strides, x.dtype, memory.device_id, pointer & 255 and pointer & -pointer))
        return pointers, tuple(layout)
    return layouts


_layout_readers: dict[type, object] = {}


def layout_reader(cls: type):
    """For the function form's cache: ``read(arrays) -> (pointers, layout key) or None`` for
    arrays of type ``cls`` (CuPy arrays, PyTorch CUDA tensors), read straight off the arrays with
    no DLPack export; None for every other type. The key holds each array's shape, strides,
    dtype, device and pointer alignment (0: 256 bytes or more); an array of another type, a CPU
    tensor or a lazy conjugate/negative view makes ``read`` give None (the checked path)."""
    reader = _layout_readers.get(cls)
    if reader is None and cls not in _layout_readers:
        package = sys.modules.get(cls.__module__.partition(".")[0])
        kind = KINDS.get(cls.__module__.partition(".")[0])
        if kind == "torch" and package is not None and issubclass(cls, package.Tensor):
            reader = _torch_layouts(package)
        elif kind == "cupy" and package is not None and cls is package.ndarray:
            reader = _cupy_layouts(package)
        _layout_readers[cls] = reader
    return reader


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
    identity = fingerprint(obj, kind)
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


def _torch_lazy_bits(tensor, name: str) -> Operand | None:
    """PyTorch's lazy conjugate and negative views keep unmodified memory plus a flag that DLPack
    refuses and ``__cuda_array_interface__`` ignores: read the memory, carry the conjugation."""
    is_neg = getattr(tensor, "is_neg", None)
    if is_neg is not None and is_neg():
        raise NvblasltValueError(f"{name}: a PyTorch negative-bit view (lazy negation) cannot be read as memory; "
                                 f"call .resolve_neg() first")
    is_conj = getattr(tensor, "is_conj", None)
    if is_conj is None or not is_conj():
        return None
    op = read(tensor.conj(), name, 0)  # the same memory without the flag
    op.obj, op.conjugated = tensor, True
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
    if kind_of(obj) == "torch":
        lazy = _torch_lazy_bits(obj, name)
        if lazy is not None:
            return lazy
        if getattr(obj, "requires_grad", False):
            # DLPack and the CAI refuse a tensor that requires grad; nvmath-python reads its memory (no
            # autograd through the call), and so does nvblaslt, through a detached view of it
            op = read(obj.detach(), name, stream)
            op.obj = obj
            return op
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
