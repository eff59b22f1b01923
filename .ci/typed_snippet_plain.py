"""A user's ordinary code, checked with plain ``mypy`` (CI's type-check step): results are used as the
caller's own arrays, with no cast and no annotation of nvblaslt's types. ``typed_snippet.py`` checks
the same surface under ``--strict``; ``tests/cpu/test_typing.py`` runs both where mypy is installed."""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from nvblaslt import Matmul, MatmulEpilog, grouped_matmul, lt, matmul
from nvblaslt.torch import FusedLinear, linear


def layer(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    y: torch.Tensor = matmul(x, w)
    z = matmul(x, w) + 1
    h, aux = matmul(x, w, epilog=MatmulEpilog.RELU_AUX_BIAS, epilog_inputs={"bias": bias})
    mask: torch.Tensor = aux["relu_aux"]
    g = matmul(x, w, epilog="gelu_bias", epilog_inputs={"bias": bias}).relu()
    with Matmul(x, w) as mm:
        mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        total = mm.execute().sum()
    with Matmul[torch.Tensor](x, w) as typed:
        typed.plan()
        again: torch.Tensor = typed.execute()
    fused = linear(x, w, bias, activation="relu") + FusedLinear(16, 16)(x)
    return y + z + h + mask.float() + g + total + again + fused


def on_the_host(a: np.ndarray, b: np.ndarray) -> float:
    d: np.ndarray = matmul(a, b)
    return float(matmul(a, b).T.sum() + d.sum())


def experts(tokens: torch.Tensor, weights: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return grouped_matmul(tokens, weights.transpose(1, 2), offs) * 2


def raw_descriptor() -> int:
    desc = lt.cublasLtMatmulDesc_t()
    lt.cublasLtMatmulDescCreate(ctypes.byref(desc), lt.CUBLAS_COMPUTE_32F, lt.CUDA_R_32F)
    lt.set_attribute(desc, lt.cublasLtMatmulDescAttributes_t.EPILOGUE, lt.CUBLASLT_EPILOGUE_RELU)
    return lt.cublasLtMatmulDescDestroy(desc) + lt.cublasLtGetVersion()
