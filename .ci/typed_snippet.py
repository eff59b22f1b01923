"""A user's code, checked with ``mypy --strict`` (CI's type-check step): nvblaslt's public surface is
typed, so calls type-check and results have the types the signatures promise.

``matmul()`` is typed as its operand ``a``'s type, or ``(D, aux)`` for an epilog with outputs;
``Matmul`` as what its type parameter says ``execute()`` returns; ``nvblaslt.lt``'s functions as
ctypes takes and returns their C types. ``typed_snippet_plain.py`` is the same surface as ordinary
code uses it, under plain mypy.

For ``nvblaslt.torch``, with torch installed (CI installs its CPU build for this check) the tensors are
torch's own types and ``assert_type`` checks that return types are inferred, not ``Any``. Without torch
they are ``Any``, and the calls still check against nvblaslt.torch's own annotations."""

from __future__ import annotations

import ctypes

import numpy as np
import torch
from torch import nn
from typing_extensions import assert_type

import nvblaslt
from nvblaslt import GroupedMatmul, HeuristicResult, Matmul, MatmulEpilog, MatmulOptions, lt
from nvblaslt.torch import (AUTO_BACKWARD, BACKWARDS, FusedLinear, FusedSequential, GroupedLinear, autotune, fuse,
                            grouped_mm, linear)


def fused_layer(x: np.ndarray, w: np.ndarray, bias: np.ndarray) -> tuple[object, float, HeuristicResult]:
    y = nvblaslt.matmul(w, x, epilog=MatmulEpilog.RELU_BIAS, epilog_inputs={"bias": bias}, compute_type="tf32")
    with Matmul(w, x, options=MatmulOptions(blocking=True)) as mm:
        algorithms: list[HeuristicResult] = mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        timings = mm.autotune(iterations=3)
        milliseconds: float = timings[0][1]
        mm.execute(stream=0)
        mm.reset_operands(a=w, alpha=2.0)
    return y, milliseconds, algorithms[0]


def typed_results(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, epilog: MatmulEpilog) -> torch.Tensor:
    Aux = dict[str, torch.Tensor]
    y = assert_type(nvblaslt.matmul(x, w), torch.Tensor)
    assert_type(nvblaslt.matmul(x, w, epilog="relu_bias", epilog_inputs={"bias": bias}), torch.Tensor)
    d, aux = assert_type(nvblaslt.matmul(x, w, epilog=MatmulEpilog.GELU_AUX_BIAS, epilog_inputs={"bias": bias}),
                         tuple[torch.Tensor, Aux])
    assert_type(nvblaslt.matmul(x, w, epilog="DRELU_BGRAD", epilog_inputs={"relu_aux": aux["gelu_aux"]}),
                tuple[torch.Tensor, Aux])
    assert_type(nvblaslt.matmul(x, w, epilog=epilog), torch.Tensor | tuple[torch.Tensor, Aux])  # known at run time
    with Matmul[torch.Tensor](x, w) as plain, Matmul[tuple[torch.Tensor, Aux]](x, w) as with_outputs:
        plain.plan(epilog="RELU")
        with_outputs.plan(epilog="RELU_AUX")
        relu_aux = with_outputs.execute()[1]["relu_aux"]
        return assert_type(plain.execute(), torch.Tensor) + y + d + relu_aux


def raw_descriptor() -> int:
    desc = lt.cublasLtMatmulDesc_t()
    assert_type(lt.cublasLtMatmulDescCreate(ctypes.byref(desc), lt.CUBLAS_COMPUTE_32F, lt.CUDA_R_32F), int)
    lt.set_attribute(desc, lt.cublasLtMatmulDescAttributes_t.EPILOGUE_AUX_LD, 512)
    name = assert_type(lt.cublasLtGetStatusName(0), "bytes | None")
    return lt.cublasLtMatmulDescDestroy(desc) + len(name or b"")


def fused_model(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    y = assert_type(linear(x, weight, bias, activation="relu"), torch.Tensor)
    layer = FusedLinear(16, 32, activation="gelu", device="cpu", dtype=torch.float32)
    assert_type(layer.forward(y), torch.Tensor)
    assert_type(FusedLinear.from_linear(nn.Linear(16, 32), "relu"), FusedLinear)
    width: int = layer.in_features
    stack = FusedSequential(layer, FusedLinear(32, width), backward="epilog")
    backward: str = stack.backward
    model = assert_type(fuse(nn.Sequential(nn.Linear(16, 32), nn.ReLU()), backward=BACKWARDS[0]), nn.Module)
    picked: str | None = AUTO_BACKWARD[backward]
    with autotune(iterations=3):
        out: torch.Tensor = stack.forward(y) if picked is None else model(y)
    return out


def experts(tokens: torch.Tensor, weights: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    hidden = nvblaslt.grouped_matmul(tokens, weights.transpose(1, 2), offs, check_offsets=True)
    with GroupedMatmul(tokens, weights.transpose(1, 2), offs) as plan:
        found: list[HeuristicResult] = plan.plan(limit=4)
        fastest: float = plan.autotune(iterations=3)[0][1]
        plan.execute(tokens, weights.transpose(1, 2), offs)
    layer = GroupedLinear(8, 64, 128, dtype=torch.bfloat16)
    assert_type(layer.forward(tokens, offs), torch.Tensor)
    out = assert_type(grouped_mm(tokens, weights.transpose(1, 2), offs, out_dtype=torch.float32), torch.Tensor)
    return out if found and fastest and hidden is not None else layer(tokens, offs)
