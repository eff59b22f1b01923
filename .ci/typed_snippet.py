"""A user's code, checked with ``mypy --strict`` (CI's type-check step): nvblaslt's public surface is
typed, so calls type-check and results have the types the signatures promise."""

from __future__ import annotations

import numpy as np

import nvblaslt
from nvblaslt import HeuristicResult, Matmul, MatmulEpilog, MatmulOptions


def fused_layer(x: np.ndarray, w: np.ndarray, bias: np.ndarray) -> tuple[object, float, HeuristicResult]:
    y = nvblaslt.matmul(w, x, epilog=MatmulEpilog.RELU_BIAS, epilog_inputs={"bias": bias}, compute_type="tf32")
    with Matmul(w, x, options=MatmulOptions(blocking=True)) as mm:
        algorithms: list[HeuristicResult] = mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        timings = mm.autotune(iterations=3)
        milliseconds: float = timings[0][1]
        mm.execute(stream=0)
        mm.reset_operands(a=w, alpha=2.0)
    return y, milliseconds, algorithms[0]
