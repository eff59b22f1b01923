"""The few CUDA runtime calls nvblaslt makes, through cuda-bindings."""

from __future__ import annotations

import contextlib
import functools

from cuda.bindings import runtime as cudart

from ._errors import CudaError

SUCCESS = cudart.cudaError_t.cudaSuccess


def check(result, call: str = "CUDA call"):
    """Unpack a cuda-bindings ``(error, *values)`` tuple, raising CudaError on failure."""
    error, *values = result
    if error != SUCCESS:
        _, text = cudart.cudaGetErrorString(error)
        raise CudaError(f"{call} failed: {error.name} ({int(error)}): {text.decode()}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@contextlib.contextmanager
def on_device(device: int):
    """Make ``device`` current for the block (allocations and handles land there), then restore."""
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
