"""nvblaslt: fused cuBLASLt GEMM epilogs and descriptor-level cuBLASLt from pure Python.

High level: ``matmul``, ``Matmul`` and ``MatmulEpilog`` work on any GPU array (DLPack or
``__cuda_array_interface__``). Low level: ``nvblaslt.lt`` is the whole generated C API,
and ``Handle``/``MatmulDesc``/``MatrixLayout``/``MatmulPreference`` own descriptors with
typed attributes. libcublasLt is loaded on first use. PyTorch users: ``nvblaslt.torch``.

The documentation site (``docs/``, built with Sphinx) has the user guide and an API reference of
every name in ``__all__``.
"""

from typing import TYPE_CHECKING

from ._descriptors import (
    Algorithm,
    GroupedMatrixLayout,
    Handle,
    HeuristicResult,
    MatmulDesc,
    MatmulPreference,
    MatrixLayout,
    heuristics,
)
from ._errors import (
    CublasLtError,
    CudaError,
    LibraryNotFoundError,
    NvblasltAlgorithmError,
    NvblasltArgumentError,
    NvblasltError,
    NvblasltStateError,
    NvblasltTypeError,
    NvblasltUnsupportedError,
    NvblasltValueError,
)
from ._epilogs import MatmulEpilog
from ._loader import Library, library, load
from ._function_form import clear_plan_cache, matmul
from ._options import (MatmulEpilogPreferences, MatmulOptions, MatmulPlanPreferences, MatmulQuantizationScales,
                       qualifiers_dtype)
from ._plan import Matmul
from ._memory import DeviceArray
from ._logging import set_log_level
from ._tuning_db import TuningDatabase, load_tuning, unload_tuning

from ._version import __version__  # written once, in _version.py (pyproject reads it too)

if TYPE_CHECKING:  # imported on first use (__getattr__ below); named here for type checkers
    from ._grouped import GroupedMatmul
    from ._grouped_function import clear_grouped_plans, grouped_matmul
    from ._tune import tune

# Public names whose modules `import nvblaslt` leaves for their first use: grouped GEMM's modules, with the
# autotune engine and the statistics module they import, are a quarter of the import beside CuPy, and a plain
# matmul never needs them.
_LAZY = {"GroupedMatmul": "_grouped", "grouped_matmul": "_grouped_function", "clear_grouped_plans": "_grouped_function",
         "tune": "_tune"}

__all__ = [
    "Algorithm", "CublasLtError", "CudaError", "DeviceArray", "GroupedMatmul", "GroupedMatrixLayout", "Handle",
    "HeuristicResult", "Library",
    "LibraryNotFoundError", "Matmul", "MatmulDesc", "MatmulEpilog", "MatmulEpilogPreferences", "MatmulOptions",
    "MatmulPlanPreferences", "MatmulPreference", "MatmulQuantizationScales",
    "MatrixLayout", "NvblasltAlgorithmError", "NvblasltArgumentError", "NvblasltError", "NvblasltStateError",
    "NvblasltTypeError", "NvblasltUnsupportedError", "NvblasltValueError", "TuningDatabase", "clear_grouped_plans",
    "clear_plan_cache", "grouped_matmul", "heuristics",
    "library", "load", "load_tuning", "lt", "matmul", "set_log_level", "tune", "unload_tuning",
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value  # read from the namespace from now on
        return value
    if name == "matrix_qualifiers_dtype":  # NumPy is imported only by those who ask for it
        return qualifiers_dtype.get()
    if name == "lt":  # loads the library: deferred so that `import nvblaslt` stays cheap
        import importlib

        return importlib.import_module("nvblaslt.lt")
    raise AttributeError(f"module 'nvblaslt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
