"""Which cuBLASLt has grouped GEMM, and what to do where the loaded one has not (no GPU needed)."""

from __future__ import annotations

from ._errors import NvblasltUnsupportedError
from ._loader import Library

# cuBLASLt's grouped mode: the API from 13.2, Hopper kernels from 13.4 (cublasLtGetVersion numbers)
API_VERSION = 130200
MIN_VERSION = 130400
UPGRADE = ("pip install 'nvidia-cublas>=13.4'; where a framework pins an older one (PyTorch does), install it beside: "
           "pip install --no-deps --target DIR 'nvidia-cublas>=13.4', then, after importing the framework, "
           "nvblaslt.load('DIR/nvidia/cu13/lib/libcublasLt.so.13', process_wide=True) before nvblaslt's first call, "
           "or set NVBLASLT_LIBRARY to that file (docs/install.md)")


def require_grouped(lib: Library, needed: int = MIN_VERSION) -> None:
    """Refuse, before any call, a library without cuBLASLt's grouped GEMM."""
    if lib.version < needed or not hasattr(lib, "cublasLtGroupedMatrixLayoutCreate"):
        major, minor = divmod(needed // 100, 100)
        raise NvblasltUnsupportedError(
            f"grouped GEMM needs cuBLASLt {major}.{minor} or newer; the loaded library is "
            f"{'.'.join(map(str, lib.version_tuple))} ({lib.path}): {UPGRADE}")
