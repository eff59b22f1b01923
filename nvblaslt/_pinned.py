"""The enums the core pins when it is imported, before any library is loaded: the epilogs, the compute
types, the matrix orders and the operations. Named here once, from the newest generated module; every
other value is read from the loaded library's own module (``Library.api``).

``tests/cpu/test_pinned_enums.py`` checks each against every generated module the package ships, so a
release whose bindings renumber or drop one of these fails a test instead of a call."""

from ._generated.cublaslt_13 import cublasComputeType_t, cublasLtEpilogue_t, cublasLtOrder_t, cublasOperation_t

PINNED = {"cublasLtEpilogue_t": cublasLtEpilogue_t, "cublasComputeType_t": cublasComputeType_t,
          "cublasLtOrder_t": cublasLtOrder_t, "cublasOperation_t": cublasOperation_t}

__all__ = ["PINNED", "cublasComputeType_t", "cublasLtEpilogue_t", "cublasLtOrder_t", "cublasOperation_t"]
