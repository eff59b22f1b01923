"""float64 references for GPU results: shared by the GPU tests and the fuzz script."""

from __future__ import annotations

import math
import sys

import numpy as np


def host(x) -> np.ndarray:
    """float64 copy of any array nvblaslt returns (torch, CuPy, JAX, DeviceArray)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64).cpu().numpy()
    if hasattr(x, "get"):
        return x.get().astype(np.float64)
    if type(x).__module__.startswith("jax"):
        return np.asarray(x, dtype=np.float64)
    if hasattr(x, "__cuda_array_interface__"):
        import cupy

        return host(cupy.asarray(x))
    return np.asarray(x, dtype=np.float64)


def rel_error(out, ref) -> float:
    out = np.asarray(out, dtype=np.float64)
    assert np.isfinite(out).all(), "NaN or Inf in the result"
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def gelu_grad(x):
    inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)
    t = np.tanh(inner)
    return 0.5 * (1 + t) + 0.5 * x * (1 - t**2) * math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * x**2)


def unpack_relu_mask(mask: np.ndarray, m: int) -> np.ndarray:
    """(…, ld_bytes, N) bitmask -> (…, M, N) booleans; bit r%8 of byte r//8 is row r."""
    bits = np.unpackbits(mask.astype(np.uint8), axis=-2, bitorder="little")
    return bits[..., :m, :].astype(bool)


# ---- helpers for the differential test and the stress script (nvmath_diff.py, gpu_stress.py) --------
def _torch():
    return sys.modules.get("torch")


def host_exact(x) -> np.ndarray:
    """An exact float64 (or complex128) host copy of any array: torch (CPU or GPU, bf16/fp8, lazy
    conjugate views), CuPy, NumPy, or anything exporting DLPack/CAI (through CuPy)."""
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        t = x.detach()
        if t.is_conj():
            t = t.resolve_conj()
        if t.is_complex():
            return t.to(torch.complex128).cpu().numpy()
        if t.dtype.itemsize == 1 and t.is_floating_point():  # fp8: through float32
            t = t.to(torch.float32)
        return t.to(torch.float64).cpu().numpy()
    if type(x).__module__.startswith("cupy"):
        x = x.get()
    elif type(x).__module__.startswith("jax"):
        x = np.asarray(x)
    elif not isinstance(x, np.ndarray) and hasattr(x, "__cuda_array_interface__"):
        import cupy

        x = cupy.asarray(x).get()
    x = np.asarray(x)
    return x.astype(np.complex128 if np.iscomplexobj(x) else np.float64)


def host_bits(x) -> np.ndarray:
    """A host copy of an 8-bit integer array (the ReLU bitmask), as uint8."""
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        return x.detach().cpu().contiguous().view(torch.uint8).numpy()
    if type(x).__module__.startswith("cupy"):
        x = x.get()
    return np.ascontiguousarray(np.asarray(x)).view(np.uint8)


def package_of(x) -> str:
    """Which package and memory space an array belongs to: numpy, cupy, torch-cuda, torch-cpu, …"""
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        return "torch-cpu" if x.device.type == "cpu" else f"torch-{x.device.type}"
    return type(x).__module__.partition(".")[0]


def dtype_name(x) -> str:
    dtype = getattr(x, "dtype", None)
    return str(dtype).rpartition(".")[2] if dtype is not None else type(x).__name__


def element_strides(x) -> tuple:
    """Strides in elements (torch, CuPy, NumPy)."""
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        return tuple(x.stride())
    itemsize = x.dtype.itemsize
    return tuple(s // itemsize for s in x.strides)


def unpack_relu_bits(mask: np.ndarray, m: int) -> np.ndarray:
    """(…, ld_bytes, N) uint8 bitmask -> (…, M, N) booleans (``unpack_relu_mask`` for any int dtype)."""
    bits = np.unpackbits(np.ascontiguousarray(mask, dtype=np.uint8), axis=-2, bitorder="little")
    return bits[..., :m, :].astype(bool)
