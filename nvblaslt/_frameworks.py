"""One adapter per array package: what nvblaslt knows of PyTorch, CuPy, JAX, Numba and NumPy
beyond the DLPack and ``__cuda_array_interface__`` protocols that ``_operands`` reads every array
through. Any other array is the protocol-only adapter's.

An adapter finds its package's current stream, gives a cheap fingerprint and a layout reader for
the hot paths, allocates results in its package's pool, hands nvblaslt's own arrays back, and
makes host arrays. ``framework_of(array)`` says whose an array is. No package is imported here:
an adapter reaches its package through ``sys.modules``, which holds it while one of its arrays
exists (JAX and Numba's submodules are imported when a result is first handed back).
"""

from __future__ import annotations

import sys
from functools import cached_property
from typing import Any, Callable

from . import _cuda, _dlpack
from ._dtypes import DType
from ._errors import NvblasltValueError
from ._strides import c_strides, span_elements

Shape = tuple[int, ...]
# allocate(stream, framework_stream) -> (array, pointer): one result, on ``stream``; the package's pool
# allocates on its current stream (``framework_stream``)
Allocate = Callable[[int, int], tuple[Any, int]]
# read(arrays) -> (pointers, layout key) or None (see Framework.layout_reader)
ReadLayouts = Callable[[Any], "tuple[list, tuple] | None"]


def _no_stream() -> int:
    return 0


class Framework:
    """The protocol-only adapter, and what every other one starts from: nvblaslt's own memory for
    results, the legacy default stream, NumPy for host results."""

    name = "protocol"
    modules: tuple[str, ...] = ()  # top-level modules whose arrays are this package's
    has_pool = False  # results come from the package's own pool (else nvblaslt's memory, handed back)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<nvblaslt framework {self.name}>"

    # ---- the package's current stream: one source, three shapes for three callers
    def stream_getter(self, device: int | None) -> Callable[[], int]:
        """``current() -> int``: the package's current stream on ``device`` (None: the current
        device now), built once per plan (0: the package has no streams)."""
        return _no_stream

    @cached_property
    def stream_on(self) -> Callable[[int], int]:
        """``current(device) -> int``, for the function form's fast path, which has read the device."""
        return lambda device: 0

    @cached_property
    def stream_of(self) -> Callable[[Any], int]:
        """``current(array) -> int``: the current stream on ``array``'s device (the function form's default)."""
        return lambda array: 0

    # ---- reading
    def read_view(self, array, name: str, stream: int, read: Callable):
        """The Operand ``read(view, name, stream)`` gives for a view of ``array`` the protocols can
        export, where ``array`` itself cannot be read through them as it is; None: read ``array``."""
        return None

    # ---- the hot paths' readers
    @staticmethod
    def fingerprint(array) -> tuple | None:
        """A cheap identity of an array's memory and layout: (pointer, shape, strides, dtype,
        device; device -1: not to be reused), or None where the package has none. A hot path
        reuses what it read from the same object while the fingerprint matches (an array resized
        or re-pointed in place has another one)."""
        return None

    def layout_reader(self, cls: type) -> ReadLayouts | None:
        """For the function form's cache: ``read(arrays) -> (pointers, layout key) or None`` for
        arrays of type ``cls``, read straight off the arrays with no DLPack export; None where the
        package has none. The key holds each array's shape, strides, dtype, device and pointer
        alignment (0: 256 bytes or more); an array of another type, a CPU tensor or a lazy
        conjugate/negative view makes ``read`` give None (the checked path)."""
        return None

    # ---- results
    def pool_allocator(self, shape: Shape, strides: Shape, dtype: DType, device: int) -> Allocate | None:
        """An ``Allocate`` for arrays of this ``shape``, element ``strides`` and ``dtype`` in the
        package's pool, or None: the result is nvblaslt's own memory (``_memory``)."""
        return None

    def hand_back(self, array):
        """nvblaslt's own DeviceArray as the package's array, zero-copy."""
        return array

    def empty_host(self, shape: Shape, strides: Shape, dtype: DType):
        """An uninitialised host array with these element strides (NumPy's, for every package but PyTorch)."""
        import numpy as np

        base = np.empty(span_elements(shape, strides), dtype=np.dtype(dtype.name))
        return np.lib.stride_tricks.as_strided(base, shape, tuple(s * dtype.itemsize for s in strides))

    def host_pointer(self, array) -> int:
        """Where a host array's first element lives."""
        interface = getattr(array, "__array_interface__", None)
        if interface is not None:
            return interface["data"][0]
        capsule = array.__dlpack__()  # a host array that speaks DLPack alone; kept alive while its tensor is read
        tensor = _dlpack.read_capsule(capsule)[0]
        return (tensor.data or 0) + tensor.byte_offset


# ---- PyTorch ---------------------------------------------------------------------------------------
def _torch_layouts(torch) -> ReadLayouts:
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


class _Torch(Framework):
    name = "torch"
    modules = ("torch",)
    has_pool = True

    @staticmethod
    def fingerprint(array) -> tuple:
        if array.is_conj() or array.is_neg():  # lazy views: only the checked path reads what their memory means
            return 0, None, None, None, -1
        return array.data_ptr(), array.shape, array.stride(), array.dtype, array.get_device()

    def read_view(self, array, name: str, stream: int, read: Callable):
        # Lazy conjugate and negative views keep unmodified memory plus a flag that DLPack refuses and
        # ``__cuda_array_interface__`` ignores: read the memory, carry the conjugation.
        is_neg = getattr(array, "is_neg", None)
        if is_neg is not None and is_neg():
            raise NvblasltValueError(f"{name}: a PyTorch negative-bit view (lazy negation) cannot be read as memory; "
                                     f"call .resolve_neg() first")
        is_conj = getattr(array, "is_conj", None)
        if is_conj is not None and is_conj():
            op = read(array.conj(), name, 0)  # the same memory without the flag
            op.obj, op.conjugated = array, True
            return op
        if getattr(array, "requires_grad", False):
            # DLPack and the CAI refuse a tensor that requires grad; nvmath-python reads its memory (no
            # autograd through the call), and so does nvblaslt, through a detached view of it
            op = read(array.detach(), name, stream)
            op.obj = array
            return op
        return None

    @cached_property
    def _raw_stream(self):
        """PyTorch's current-stream getter that builds no Stream object, or None on builds without it."""
        torch = sys.modules["torch"]
        return getattr(torch._C, "_cuda_getCurrentRawStream", None)

    def stream_getter(self, device: int | None) -> Callable[[], int]:
        torch, raw = sys.modules["torch"], self._raw_stream
        if device is None:
            device = torch.cuda.current_device()
        if raw is not None:
            return lambda: raw(device)
        return lambda: torch.cuda.current_stream(device).cuda_stream

    @cached_property
    def stream_on(self) -> Callable[[int], int]:
        torch, raw = sys.modules["torch"], self._raw_stream
        if raw is not None:
            return raw
        return lambda device: torch.cuda.current_stream(device).cuda_stream

    @cached_property
    def stream_of(self) -> Callable[[Any], int]:
        torch, raw = sys.modules["torch"], self._raw_stream
        if raw is not None:
            return lambda array: raw(array.get_device())
        return lambda array: torch.cuda.current_stream(array.device).cuda_stream

    def layout_reader(self, cls: type) -> ReadLayouts | None:
        torch = sys.modules.get("torch")
        return _torch_layouts(torch) if torch is not None and issubclass(cls, torch.Tensor) else None

    def pool_allocator(self, shape: Shape, strides: Shape, dtype: DType, device: int) -> Allocate:
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

    def empty_host(self, shape: Shape, strides: Shape, dtype: DType):
        torch = sys.modules["torch"]
        return torch.empty_strided(shape, strides, dtype=getattr(torch, dtype.name))

    def host_pointer(self, array) -> int:
        return array.data_ptr()


# ---- CuPy ------------------------------------------------------------------------------------------
def _cupy_layouts(cupy) -> ReadLayouts:
    # kept apart from PyTorch's reader: one loop per package, with no per-array branch on the package
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


class _CuPy(Framework):
    name = "cupy"
    modules = ("cupy",)
    has_pool = True

    @staticmethod
    def fingerprint(array) -> tuple:
        memory = array.data  # its device_id is an int; array.device builds a Device object each time
        return memory.ptr, array.shape, array.strides, array.dtype, memory.device_id

    def stream_getter(self, device: int | None) -> Callable[[], int]:
        cuda = sys.modules["cupy"].cuda
        return lambda: cuda.get_current_stream().ptr  # CuPy's current stream is that of the current device

    @cached_property
    def stream_on(self) -> Callable[[int], int]:
        get_current_stream = sys.modules["cupy"].cuda.get_current_stream
        return lambda device: get_current_stream().ptr

    @cached_property
    def stream_of(self) -> Callable[[Any], int]:
        get_current_stream = sys.modules["cupy"].cuda.get_current_stream
        return lambda array: get_current_stream().ptr

    def layout_reader(self, cls: type) -> ReadLayouts | None:
        cupy = sys.modules.get("cupy")
        return _cupy_layouts(cupy) if cupy is not None and cls is cupy.ndarray else None

    def pool_allocator(self, shape: Shape, strides: Shape, dtype: DType, device: int) -> Allocate | None:
        if dtype.typestr is None:  # bfloat16, fp8: no NumPy dtype for CuPy to hold them in
            return None
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


# ---- JAX, Numba, NumPy -----------------------------------------------------------------------------
class _Jax(Framework):
    name = "jax"
    modules = ("jax", "jaxlib")

    def hand_back(self, array):
        import jax.dlpack

        return jax.dlpack.from_dlpack(array)


class _Numba(Framework):
    name = "numba"
    modules = ("numba",)

    def hand_back(self, array):
        import numba.cuda

        return numba.cuda.as_cuda_array(array)


class _NumPy(Framework):
    name = "numpy"
    modules = ("numpy",)

    def read_view(self, array, name: str, stream: int, read: Callable):
        refuse_masked(array, name)  # DLPack and the array interface export the data without the mask
        return None


def refuse_masked(value, name: str) -> None:
    """Refuse a NumPy masked array with masked elements: nvblaslt would multiply the values under the
    mask. One with nothing masked is read as its data (nvmath-python reads every masked array so)."""
    ma = sys.modules.get("numpy.ma")  # not imported: no masked array can exist
    if ma is None or not isinstance(value, ma.MaskedArray):
        return
    masked = int(ma.count_masked(value))
    if masked:
        raise NvblasltValueError(f"{name}: expected an array without masked elements, got a NumPy masked array "
                                 f"with {masked} of {value.size} elements masked (the values under the mask would be "
                                 f"used); pass its .filled(value) or its .data")


TORCH, CUPY, JAX, NUMBA, NUMPY, PROTOCOL = _Torch(), _CuPy(), _Jax(), _Numba(), _NumPy(), Framework()
BY_NAME: dict[str, Framework] = {f.name: f for f in (TORCH, CUPY, JAX, NUMBA, NUMPY, PROTOCOL)}
BY_MODULE: dict[str, Framework] = {module: f for f in BY_NAME.values() for module in f.modules}

_by_type: dict[type, Framework] = {}


_fast_readers: dict[type, tuple | None] = {}  # array type -> (framework, read layouts, current stream on a device)


def fast_reader(array) -> tuple | None:
    """For the function forms' fast paths: ``(framework, read layouts, current stream on a device)``
    for arrays of ``array``'s type (found once per type), or None where its package has no layout
    reader (``Framework.layout_reader``)."""
    cls = type(array)
    try:
        return _fast_readers[cls]
    except KeyError:
        framework = framework_of(array)
        read = framework.layout_reader(cls)
        path = _fast_readers[cls] = None if read is None else (framework, read, framework.stream_on)
        return path


def framework_of(array) -> Framework:
    """The adapter of ``array``'s package, from the top-level module of its type (remembered per
    type); the protocol-only adapter for every other type, nvblaslt's DeviceArray included."""
    framework = _by_type.get(type(array))
    return framework if framework is not None else _detect(type(array))


def _detect(cls: type) -> Framework:
    framework = _by_type[cls] = BY_MODULE.get(cls.__module__.partition(".")[0], PROTOCOL)
    return framework
