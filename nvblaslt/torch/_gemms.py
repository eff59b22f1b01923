"""The CUDA path: each step of a layer as one nvblaslt GEMM with its epilog.

How one layer y = act(x Wᵀ + b) maps onto cuBLASLt, for x (T, in), W (out, in):

- forward: D = W @ xᵀ is (out, T) column-major, the same memory as y (T, out) row-major, and the
  bias runs along D's rows as the epilogs need: RELU_BIAS, or GELU_AUX_BIAS keeping the GELU
  pre-activation for the backward pass (RELU_AUX_BIAS, keeping the ReLU bitmask, when the next
  layer's GEMM takes the ReLU's backward).
- backward, weight and bias: dW = dzᵀ x as D = xᵀ @ dz, (in, out) column-major = dW row-major;
  BGRADB (B = dz row-major, summed over T) gives the bias gradient in the same call.
- backward, input: dx = dz W as D = Wᵀ @ dzᵀ, (in, T) column-major = dx row-major; with the previous
  layer's aux, DRELU / DGELU (and DRELU_BGRAD / DGELU_BGRAD its bias gradient) run that layer's
  activation backward in the same call.

float64 steps cuBLASLt has no kernel for run as torch ops (``_composite``); every other error propagates.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import CublasLtError, Matmul, MatmulEpilog, matmul
from ._composite import (empty_aux, forward_composite, input_grad_composite, own, row_major,
                         weight_grad_composite)
from ._pointwise import inference as bound_inference
from ._tuning import first_search, invariant_options

_E = MatmulEpilog
_FORWARD_EPILOGS = {  # (activation, has bias, keep aux) -> epilog
    ("none", False, False): _E.DEFAULT, ("none", True, False): _E.BIAS,
    ("relu", False, False): _E.RELU, ("relu", False, True): _E.RELU_AUX,
    ("relu", True, False): _E.RELU_BIAS, ("relu", True, True): _E.RELU_AUX_BIAS,
    ("gelu", False, False): _E.GELU, ("gelu", False, True): _E.GELU_AUX,
    ("gelu", True, False): _E.GELU_BIAS, ("gelu", True, True): _E.GELU_AUX_BIAS,
}
_INPUT_GRAD_EPILOGS = {  # (previous activation, its bias gradient wanted) -> (epilog, aux key, bias-gradient key)
    ("relu", False): (_E.DRELU, "relu_aux", None), ("relu", True): (_E.DRELU_BGRAD, "relu_aux", "drelu_bgrad"),
    ("gelu", False): (_E.DGELU, "gelu_aux", None), ("gelu", True): (_E.DGELU_BGRAD, "gelu_aux", "dgelu_bgrad"),
}
_ELEMENTWISE = {_E.DEFAULT, _E.RELU, _E.GELU}  # epilogs with no vector along D's rows or columns
# float64 epilogs this process's cuBLASLt refused: those steps run as torch ops (see fp64_refuses).
refused_fp64: set[MatmulEpilog] = set()


def _problem_key(a: Tensor, b: Tensor, epilog: MatmulEpilog, inputs: dict | None) -> tuple:
    tensors = (a, b, *(inputs or {}).values())
    return epilog, tuple((t.shape, t.stride(), t.dtype, t.device) for t in tensors), tuple(inputs or ())


def _gemm(a: Tensor, b: Tensor, epilog: MatmulEpilog = _E.DEFAULT, inputs: dict | None = None,
          tokens: str | None = None):
    """(D, aux dict or None) of nvblaslt's function form: plans cached per thread, current torch stream;
    searched first when an ``autotune()`` context has not seen the problem yet. ``tokens``: which extent of
    D ("rows"/"columns") the batch is, for a batch-invariant call (``_tuning.invariant``)."""
    options = invariant_options(tokens)
    iterations = first_search(lambda: _problem_key(a, b, epilog, inputs))  # the key only while tuning
    if iterations is not None:
        with Matmul(a, b, options=options) as plan:
            plan.plan(epilog=epilog, epilog_inputs=inputs)
            plan.autotune(iterations=iterations, search=True)
            result = plan.execute()
    else:
        result = matmul(a, b, epilog=epilog, epilog_inputs=inputs) if options is None else \
            matmul(a, b, epilog=epilog, epilog_inputs=inputs, options=options)
    return result if isinstance(result, tuple) else (result, None)


def fp64_refuses(dtype: torch.dtype, epilog: MatmulEpilog, error: CublasLtError | None = None) -> bool:
    """Whether to run this step as torch ops. Only float64 falls back, and only where cuBLASLt has no
    kernel (CUBLAS_STATUS_NOT_SUPPORTED); every other error propagates."""
    if dtype != torch.float64:
        return False
    if error is None:
        return epilog in refused_fp64
    if error.status_name != "CUBLAS_STATUS_NOT_SUPPORTED":
        return False
    refused_fp64.add(epilog)
    return True


def _data(t):
    """``t`` without autograd where autograd is on (a view of a tensor that requires grad would be recorded).
    With it off (no_grad(), inference, an autograd Function's forward) ``t`` itself: views of it are not
    recorded, and nvblaslt reads a tensor that requires grad as it is (1 µs a parameter less, H200 host)."""
    return t.detach() if t is not None and t.requires_grad and torch.is_grad_enabled() else t


def _forward_gemm(x, weight, bias, epilog):
    """(y, extra outputs) of y = epilog(x Wᵀ + b) as one GEMM, y (tokens, features) row-major or a
    transposed view; None where the step runs as torch ops (nothing to compute, or float64 without a kernel)."""
    if x.numel() == 0 or weight.shape[0] == 0 or (x.dtype == torch.float64 and fp64_refuses(x.dtype, epilog)):
        return None
    x, weight, bias = _data(x), _data(weight), _data(bias)
    try:
        if bias is None and epilog in _ELEMENTWISE:
            return _gemm(x, weight.T, epilog, tokens="rows")  # elementwise epilog: either orientation; this is y
        # the bias runs along D's rows: D = W xᵀ is (features, tokens), y's memory
        d, extra = _gemm(weight, x.T, epilog, None if bias is None else {"bias": bias}, tokens="columns")
        return d.T, extra
    except CublasLtError as error:
        if fp64_refuses(x.dtype, epilog, error):
            return None
        raise


def forward_cuda(x, weight, bias, activation, keep_aux):
    features = weight.shape[0]
    found = _forward_gemm(x, weight, bias, _FORWARD_EPILOGS[activation, bias is not None,
                                                            keep_aux and activation != "none"])
    if found is None:
        return forward_composite(x, weight, bias, activation, keep_aux)
    y, extra = found
    out = row_major(y)
    if not extra:
        return out, empty_aux(x, activation, keep_aux, features)
    aux = next(iter(extra.values()))
    if aux.dtype != torch.int8 and activation == "relu":
        aux = aux.view(torch.int8)  # nvmath-python returns the bitmask as uint8
    expected = empty_aux(x, activation, keep_aux, features) if aux.stride() != (1, aux.shape[0]) else None
    if expected is not None:  # another layout than cuBLASLt's own: keep ours, which the fake impl promises
        aux = expected.copy_(aux)
    return out, own(aux)


def forward_inference(x, weight, bias, activation, *, cuda: bool):
    """The forward's output alone, for a call autograd does not record (plain eager, no gradient wanted):
    ``forward_cuda`` without what only a backward pass or a custom op's outputs need (an aux, a
    view-free result). Off CUDA (``cuda`` False), the same math as torch ops."""
    if cuda:  # a bound GEMM where it can run bound: no layout read, D made in its final shape
        y = bound_inference(x, weight, bias, activation)
        if y is not None:
            return y
    found = _forward_gemm(x, weight, bias, _FORWARD_EPILOGS[activation, bias is not None, False]) if cuda else None
    if found is None:
        return forward_composite(x, weight, bias, activation, False)[0]
    y = found[0]
    # row-major, as the op returns it (D's order follows the operands': one input feature reads as column-major x)
    return y if y.is_contiguous() else y.contiguous()


def weight_grad_cuda(x, dz, bias_grad):
    epilog = _E.BGRADB if bias_grad else _E.DEFAULT
    if not fp64_refuses(x.dtype, epilog):
        try:
            d, extra = _gemm(x.detach().T, dz, epilog)  # B = dz row-major: what BGRADB has kernels for
            return row_major(d.T), (own(extra["bgradb"].reshape(-1)) if bias_grad else None)
        except CublasLtError as error:
            if not fp64_refuses(x.dtype, epilog, error):
                raise
    return weight_grad_composite(x, dz, bias_grad)


def input_grad_cuda(weight, dz, prev_activation, x, prev_aux, prev_bias_grad):
    weight = weight.detach()
    if prev_activation == "none":
        epilog, aux_key, bias_key, inputs = _E.DEFAULT, None, None, None
    else:
        epilog, aux_key, bias_key = _INPUT_GRAD_EPILOGS[prev_activation, prev_bias_grad]
        inputs = {aux_key: prev_aux}
    # cuBLASLt reads out of bounds for aux epilogs with K = 1; nvblaslt refuses them
    if not (aux_key and weight.shape[0] == 1) and not fp64_refuses(dz.dtype, epilog):
        try:
            d, extra = _gemm(weight.T, dz.T, epilog, inputs)  # A = Wᵀ column-major
            dx = row_major(d.T)
            if bias_key:
                return dx, own(extra[bias_key].reshape(-1))
            return dx, (dx.sum(0) if prev_bias_grad else None)
        except CublasLtError as error:
            if not fp64_refuses(dz.dtype, epilog, error):
                raise
    return input_grad_composite(weight, dz, prev_activation, x, prev_aux, prev_bias_grad)
