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
