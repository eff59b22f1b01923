"""The types of the public surface's arguments, as the signatures name them.

Arrays are any package's (DLPack, ``__cuda_array_interface__``, ``__array_interface__``), so an
array is ``Any`` to a type checker; results come back in the operands' package: D, or
``(D, outputs)`` when the epilog has outputs (or ``result_amax`` is set).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    from ._epilogs import MatmulEpilog
    from ._options import MatmulOptions, MatmulPlanPreferences, MatmulQuantizationScales

Array = Any  # any GPU or host array nvblaslt reads
Number = Union[int, float, complex]
ScalarLike = Union[Number, Any]  # a number, or a one-element host array of one
Stream = Union[int, Any]  # a cudaStream_t, or a CuPy / PyTorch / cuda.core / cuda.bindings stream
EpilogLike = Union["MatmulEpilog", str, int, None]
Options = Union["MatmulOptions", dict[str, Any], None]
Preferences = Union["MatmulPlanPreferences", dict[str, Any], None]
QuantizationScales = Union["MatmulQuantizationScales", dict[str, Any], None]
Result = Union[Array, tuple[Array, dict[str, Array]]]  # D, or (D, outputs)
