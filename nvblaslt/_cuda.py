"""The few CUDA runtime calls nvblaslt makes, through cuda-bindings."""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
from typing import Any

from ._errors import CudaError

_runtime: Any = None  # cuda.bindings.runtime, once imported


class _LazyRuntime:
    """``cuda.bindings.runtime``, imported when a call first needs it: its import is half the time of
    ``import nvblaslt``, and a user who only builds descriptors never needs it. The first attribute read
    imports it and rebinds every nvblaslt module's ``cudart`` name to the real module, so no call after
    the first goes through this object (one kept elsewhere answers from the module it holds)."""

    def __getattr__(self, name: str):
        global _runtime
        runtime = _runtime
        if runtime is None:
            runtime = _runtime = importlib.import_module("cuda.bindings.runtime")
            globals()["cudart"] = runtime  # first: a module importing it from here now gets the real one
            for module_name, module in list(sys.modules.items()):
                # nvblaslt's modules only, by name: touching another module can import it in full (a lazy
                # module's first attribute read: cupyx.scipy's took 0.4 s of the first call's 0.5)
                if module_name != "nvblaslt" and not module_name.startswith("nvblaslt."):
                    continue
                # the module's own dict: a module __getattr__ (nvblaslt.lt loads the library) must not run;
                # a None entry (a module blocked in sys.modules) has none
                namespace = getattr(module, "__dict__", None)
                if namespace is not None and namespace.get("cudart") is self:
                    namespace["cudart"] = runtime
        return getattr(runtime, name)


cudart = _LazyRuntime()
# cudaError_t is an int enum in every cuda-bindings release: comparing with 0 needs no import
SUCCESS = 0
# First-contact failures, said in a user's words after CUDA's own.
_HINTS = {
    "cudaErrorInsufficientDriver": "; no NVIDIA driver new enough for this CUDA runtime is loaded (is there a GPU "
                                   "and driver on this machine? `nvblaslt info` / `nvidia-smi` tell)",
    "cudaErrorNoDevice": "; no CUDA GPU is visible to this process (check CUDA_VISIBLE_DEVICES and `nvidia-smi`)",
    "cudaErrorMemoryAllocation": "; the GPU is out of memory (free arrays or plans, or use smaller problems)",
}


def check(result, call: str = "CUDA call"):
    """Unpack a cuda-bindings ``(error, *values)`` tuple, raising CudaError on failure."""
    error, *values = result
    if error != SUCCESS:
        _, text = cudart.cudaGetErrorString(error)
        hint = _HINTS.get(error.name, "")
        raise CudaError(f"{call} failed: {error.name} ({int(error)}): {text.decode()}{hint}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@contextlib.contextmanager
def on_device(device: int):
    """Make ``device`` current for the block (allocations and handles land there), then restore."""
    if not several_devices():  # one GPU (or none): there is nothing to switch
        yield
        return
    previous = current_device()
    if previous != device:
        check(cudart.cudaSetDevice(device), "cudaSetDevice")
    try:
        yield
    finally:
        if previous != device:
            check(cudart.cudaSetDevice(previous), "cudaSetDevice")


@functools.cache
def several_devices() -> bool:
    return device_count() > 1


def device_count() -> int:
    """GPUs visible to this process; 0 when there is no driver or no device."""
    error, count = cudart.cudaGetDeviceCount()
    return count if error == SUCCESS else 0


def current_device() -> int:
    return check(cudart.cudaGetDevice(), "cudaGetDevice")


def driver_version() -> int:
    return check(cudart.cudaDriverGetVersion(), "cudaDriverGetVersion")


def device_properties(device: int):
    return check(cudart.cudaGetDeviceProperties(device), "cudaGetDeviceProperties")


def compute_capability(device: int) -> tuple[int, int]:
    major = check(cudart.cudaDeviceGetAttribute(
        cudart.cudaDeviceAttr.cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute")
    minor = check(cudart.cudaDeviceGetAttribute(
        cudart.cudaDeviceAttr.cudaDevAttrComputeCapabilityMinor, device), "cudaDeviceGetAttribute")
    return major, minor


def is_capturing(stream: int) -> bool:
    """Whether ``stream`` is capturing a CUDA graph (then nothing may allocate or synchronize on it).
    The torch paths ask torch's own query instead, which builds no enum objects per answer."""
    error, status = cudart.cudaStreamIsCapturing(stream)
    return error == SUCCESS and status != cudart.cudaStreamCaptureStatus.cudaStreamCaptureStatusNone
