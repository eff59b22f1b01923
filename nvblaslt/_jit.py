"""Small CUDA kernels compiled at run time with NVRTC, through cuda-bindings.

nvblaslt ships no compiled code. Where a call needs a few device-side values that only the GPU
knows (grouped GEMM's per-group shapes and pointers, derived from offsets that stay on the GPU),
a kernel of a few lines is compiled from source on first use, for the device's own architecture,
and loaded context-independently (``cuLibraryLoadData``). libnvrtc comes with the cuBLAS 13 wheels
(``nvidia-cublas`` depends on ``nvidia-cuda-nvrtc``); cuda-bindings finds it.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from dataclasses import dataclass

from . import _cuda
from ._cuda import cudart
from ._errors import CudaError

_lock = threading.Lock()
_compiled: dict[tuple[str, str], bytes] = {}  # (source, arch) -> cubin
_loaded: dict[tuple[str, str, str], Kernel] = {}  # (source, arch, name) -> kernel
_bound = threading.local()  # the devices whose primary context this thread has made current


# A device function the kernels share: zero ``bytes`` at ``p``, 16-byte stores where aligned, every thread
# of the grid taking part (``thread`` of ``threads``); prepended to a kernel's source that calls it.
ZERO_SPAN_SOURCE = r"""
__device__ void zero_span(char* p, long long bytes, long long thread, long long threads) {
    long long head = (16 - (long long)((unsigned long long)p & 15)) & 15;
    head = head < bytes ? head : bytes;
    if (thread < head) p[thread] = 0;
    uint4* vectors = reinterpret_cast<uint4*>(p + head);
    const long long count = (bytes - head) / 16;
    for (long long i = thread; i < count; i += threads) vectors[i] = make_uint4(0, 0, 0, 0);
    const long long done = head + 16 * count;
    if (thread < bytes - done) p[done + thread] = 0;
}
"""


def _nvrtc_check(result, program, call: str):
    from cuda.bindings import nvrtc

    error, *values = result
    if error != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        log = ""
        if program is not None:
            _, size = nvrtc.nvrtcGetProgramLogSize(program)
            buffer = b" " * size
            nvrtc.nvrtcGetProgramLog(program, buffer)
            log = buffer.decode(errors="replace").strip("\x00 \n")
        raise CudaError(f"{call} failed: {error.name}{': ' + log if log else ''}")
    return values[0] if len(values) == 1 else (tuple(values) if values else None)


def compile_cubin(source: str, arch: str) -> bytes:
    """``source`` compiled for ``arch`` ("sm_90"): a cubin, cached for the process. Needs no GPU."""
    key = (source, arch)
    with _lock:
        if key in _compiled:
            return _compiled[key]
    try:
        from cuda.bindings import nvrtc
    except ImportError as error:  # pragma: no cover - cuda-bindings always has nvrtc
        raise CudaError(f"cuda.bindings.nvrtc: {error}") from error
    try:
        program = _nvrtc_check(nvrtc.nvrtcCreateProgram(source.encode(), b"nvblaslt.cu", 0, [], []), None,
                               "nvrtcCreateProgram")
    except RuntimeError as error:  # cuda-bindings could not load libnvrtc
        raise CudaError(f"NVRTC is not available ({error}); it comes with the cuBLAS 13 wheel "
                        f"(pip install nvidia-cuda-nvrtc)") from error
    try:
        options = [f"--gpu-architecture={arch}".encode(), b"-default-device", b"-std=c++17"]
        _nvrtc_check(nvrtc.nvrtcCompileProgram(program, len(options), options), program, "nvrtcCompileProgram")
        size = _nvrtc_check(nvrtc.nvrtcGetCUBINSize(program), program, "nvrtcGetCUBINSize")
        cubin = b" " * size
        _nvrtc_check(nvrtc.nvrtcGetCUBIN(program, cubin), program, "nvrtcGetCUBIN")
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    with _lock:
        _compiled[key] = cubin
    return cubin


def arch_of(device: int) -> str:
    major, minor = _cuda.compute_capability(device)
    return f"sm_{major}{minor}"


def _driver_check(result, call: str):
    from cuda.bindings import driver

    error, *values = result
    if error != driver.CUresult.CUDA_SUCCESS:
        _, text = driver.cuGetErrorString(error)
        raise CudaError(f"{call} failed: {error.name} ({int(error)}): {text.decode() if text else ''}")
    return values[0] if len(values) == 1 else (tuple(values) if values else None)


_streams: dict[int, object] = {}  # stream handle -> CUstream (a launch takes the object; making one costs)


@functools.cache
def _launcher() -> tuple:
    """(cuLaunchKernel, CUDA_SUCCESS, CUstream), looked up once rather than per launch."""
    from cuda.bindings import driver

    return driver.cuLaunchKernel, driver.CUresult.CUDA_SUCCESS, driver.CUstream


@dataclass
class Kernel:
    """A loaded kernel, launchable on any context of a device of its architecture."""

    name: str
    library: object  # CUlibrary: kept loaded for the process
    function: object  # its CUkernel as a CUfunction, which launches take (the driver API allows the cast)

    def launch(self, device: int, grid: int, block: int, stream: int, arguments: Arguments) -> None:
        """Queue the kernel on ``stream`` (of ``device``, current) with ``arguments``' values."""
        if device not in getattr(_bound, "devices", ()):
            # a context-independent kernel runs in the stream's context, or the current one for the
            # legacy / per-thread default streams: make the device's primary context current once
            _cuda.check(cudart.cudaSetDevice(device), "cudaSetDevice")
            _bound.devices = (*getattr(_bound, "devices", ()), device)
        launch, success, stream_type = _launcher()
        stream_object = _streams.get(stream)
        if stream_object is None:
            if len(_streams) >= 64:  # streams made and destroyed without end: keep the table small
                _streams.clear()
            stream_object = _streams[stream] = stream_type(stream)
        # the parameters are read (copied) by the launch itself, so arguments may change right after
        result = launch(self.function, grid, 1, 1, block, 1, 1, 0, stream_object, arguments.address, 0)
        if result[0] != success:
            _driver_check(result, f"cuLaunchKernel({self.name})")


class Arguments:
    """A kernel's arguments as C values of their own, and the ``void*[]`` of their addresses that
    ``cuLaunchKernel`` takes: a launch passes one integer, and an argument that changes between
    launches is one store (``set``), not a packing of every argument per call."""

    def __init__(self, types: tuple, values: tuple):
        if len(types) != len(values):
            raise ValueError(f"{len(values)} values for {len(types)} argument types")
        self.values = [kind(value) for kind, value in zip(types, values)]
        self.pointers = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in self.values))
        self.address = ctypes.addressof(self.pointers)

    def set(self, index: int, value: int) -> None:
        self.values[index].value = value


def kernel(source: str, name: str, device: int) -> Kernel:
    """The kernel ``name`` of ``source``, compiled for ``device``'s architecture and loaded once."""
    arch = arch_of(device)
    key = (source, arch, name)
    with _lock:
        if key in _loaded:
            return _loaded[key]
    from cuda.bindings import driver

    cubin = compile_cubin(source, arch)
    _driver_check(driver.cuInit(0), "cuInit")
    library = _driver_check(driver.cuLibraryLoadData(cubin, [], [], 0, [], [], 0), "cuLibraryLoadData")
    handle = _driver_check(driver.cuLibraryGetKernel(library, name.encode()), "cuLibraryGetKernel")
    loaded = Kernel(name, library, driver.CUfunction(int(handle)))
    with _lock:
        return _loaded.setdefault(key, loaded)


# the C types kernels' arguments go as
POINTER, INT32, INT64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
