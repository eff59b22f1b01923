"""The custom ops ``nvblaslt::conv2d`` and ``nvblaslt::conv2d_backward``: their implementations (the
convolution of ``_im2col`` around ``nvblaslt::linear`` / ``nvblaslt::linear_backward``, which run
nvblaslt's GEMMs on CUDA and torch ops elsewhere), fake implementations and autograd formula, and
``fused_conv()``, the one call into them.

Epilogs, through the linear ops: RELU_BIAS / GELU_AUX_BIAS / BIAS / a plain GEMM forward; BGRADB for the
weight and bias gradients in one call; a plain GEMM for the input gradient. The activation's derivative
runs as a torch op, from the output for ReLU. The autograd formula keeps x, the weight and the output
(GELU: its pre-activation): cols is recomputed from x where the weight gradient needs it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ._composite import aux_layout, forward_composite, own, unused
from ._eager import autograd_function, direct, wants_grad
from ._gemms import forward_cuda, forward_inference
from ._im2col import Geometry, backward, forward, weight_format
from ._ops import linear_backward_impl, uses_cublaslt
from . import _pointwise as pointwise

_CONV_SCHEMA = ("(Tensor x, Tensor weight, Tensor? bias, str activation, bool keep_aux, int[] stride, "
                "int[] padding, int[] dilation) -> (Tensor, Tensor)")
_BACKWARD_SCHEMA = ("(Tensor grad_out, Tensor x, Tensor weight, Tensor? out, Tensor aux, str activation, "
                    "bool bias_grad, int[] stride, int[] padding, int[] dilation, bool input_grad, "
                    "bool weight_grad) -> (Tensor, Tensor, Tensor)")


def geometry(weight: Tensor, stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int]) -> Geometry:
    """The op's geometry: the kernel from the weight, the rest from its int[] arguments."""
    kernel = (weight.shape[2], weight.shape[3])
    return Geometry(kernel, (stride[0], stride[1]), (padding[0], padding[1]), (dilation[0], dilation[1]))


# ---- the GEMMs: nvblaslt's linear steps on (M, K) cols -----------------------------------------------------
# The implementations of nvblaslt::linear / nvblaslt::linear_backward, called directly: inside a convolution
# (its op, or its eager autograd Function) nothing can observe the inner GEMMs, so their op dispatch
# (about 100 µs of host time each on an H200's host) would buy nothing.


def linear_gemm(cols: Tensor, weight_matrix: Tensor, bias: Tensor | None, activation: str,
                keep_aux: bool) -> tuple[Tensor, Tensor]:
    """act(cols Wᵀ + b) and its aux: one cuBLASLt call with its epilog on CUDA, torch ops elsewhere."""
    gemm = forward_cuda if uses_cublaslt(cols) else forward_composite
    return gemm(cols, weight_matrix, bias, activation, keep_aux)


def inference_gemm(cols: Tensor, weight_matrix: Tensor, bias: Tensor | None, activation: str,
                   keep_aux: bool) -> tuple[Tensor, None]:
    """act(cols Wᵀ + b) alone, for a forward no backward pass will follow (no aux, no view-free output)."""
    return forward_inference(cols, weight_matrix, bias, activation, cuda=uses_cublaslt(cols)), None


def linear_gemm_backward(dy: Tensor, cols: Tensor | None, weight_matrix: Tensor, out: Tensor | None, aux: Tensor,
                         activation: str, bias_grad: bool, input_grad: bool,
                         weight_grad: bool) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(dcols, dW, db): dz = dy ⊙ act′, then dW = dzᵀ cols (BGRADB for db) and dcols = dz W."""
    if cols is None:  # no weight gradient: the step reads only cols' shape, so no im2col for it
        cols = dy.new_zeros(()).expand(dy.shape[0], weight_matrix.shape[1])
    dcols, dw, db, _ = linear_backward_impl(dy, None, cols, weight_matrix, out, aux, activation, bias_grad, None,
                                            "none", False, input_grad, weight_grad)
    return (dcols if input_grad else None), (dw if weight_grad else None), (db if bias_grad else None)


# ---- the custom ops ---------------------------------------------------------------------------------------


def _conv2d_impl(x, weight, bias, activation, keep_aux, stride, padding, dilation):
    """(out (N, O, OH, OW) channels-last, aux) for x (N, C, H, W) channels-last."""
    out, aux = forward(x, weight, bias, activation, keep_aux, geometry(weight, stride, padding, dilation),
                       linear_gemm)
    return own(out), aux


_conv2d_op = torch.library.custom_op("nvblaslt::conv2d", mutates_args=(), schema=_CONV_SCHEMA)(_conv2d_impl)


def _channels_last(t: Tensor, shape: Sequence) -> Tensor:
    return torch.empty(tuple(shape), dtype=t.dtype, device=t.device, memory_format=torch.channels_last)


@_conv2d_op.register_fake
def _conv2d_fake(x, weight, bias, activation, keep_aux, stride, padding, dilation):
    n, _, h, w = x.shape
    features = weight.shape[0]
    oh, ow = geometry(weight, stride, padding, dilation).output_size(h, w)
    shape, strides, bitmask = aux_layout(activation, keep_aux, n * oh * ow, features)
    aux = x.new_empty_strided(shape, strides, dtype=torch.int8 if bitmask else x.dtype)
    return _channels_last(x, (n, features, oh, ow)), aux


def _conv2d_backward_impl(grad_out, x, weight, out, aux, activation, bias_grad, stride, padding, dilation,
                          input_grad, weight_grad):
    """(grad_x channels-last, grad_weight in the weight's format, grad_bias); empty for what was not asked for."""
    dx, dw, db = backward(grad_out, x, weight, out, aux, activation, bias_grad, input_grad, weight_grad,
                          geometry(weight, stride, padding, dilation), linear_gemm_backward)
    return tuple(unused(x) if t is None else own(t) for t in (dx, dw, db))


_conv2d_backward_op = torch.library.custom_op("nvblaslt::conv2d_backward", mutates_args=(),
                                              schema=_BACKWARD_SCHEMA)(_conv2d_backward_impl)


@_conv2d_backward_op.register_fake
def _conv2d_backward_fake(grad_out, x, weight, out, aux, activation, bias_grad, stride, padding, dilation,
                          input_grad, weight_grad):
    empty = unused(x)
    return (_channels_last(x, x.shape) if input_grad else empty,
            torch.empty_like(weight, memory_format=weight_format(weight)) if weight_grad else empty,
            x.new_empty((weight.shape[0],)) if bias_grad else empty)


_X, _WEIGHT, _BIAS = 0, 1, 2  # argument positions of nvblaslt::conv2d


def _setup_context(ctx, inputs, output):
    x, weight, bias, activation, keep_aux, stride, padding, dilation = inputs
    out, aux = output
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(aux)
    ctx.save_for_backward(x, weight, out if activation == "relu" else None, aux)
    ctx.activation, ctx.has_bias = activation, bias is not None
    ctx.geometry = (stride, padding, dilation)


def _conv2d_autograd(ctx, grad_out, grad_aux):
    if grad_out is None:
        return (None,) * 8
    x, weight, out, aux = ctx.saved_tensors
    needs = ctx.needs_input_grad
    bias_grad = ctx.has_bias and needs[_BIAS]
    arguments = (grad_out, x, weight, out, aux, ctx.activation, bias_grad, *ctx.geometry, needs[_X], needs[_WEIGHT])
    # the backward op has no autograd of its own: under create_graph it runs as the op, which says so
    if not torch.is_grad_enabled() and direct(grad_out, x, weight, out, aux):
        dx, dw, db = _conv2d_backward_impl(*arguments)
    else:
        dx, dw, db = torch.ops.nvblaslt.conv2d_backward(*arguments)
    return (dx if needs[_X] else None, dw if needs[_WEIGHT] else None, db if bias_grad else None,
            None, None, None, None, None)


_conv2d_op.register_autograd(_conv2d_autograd, setup_context=_setup_context)
_Conv2d = autograd_function("Conv2d", _conv2d_impl, _setup_context, _conv2d_autograd)


def fused_conv(x: Tensor, weight: Tensor, bias: Tensor | None, activation: str, g: Geometry) -> Tensor:
    """One fused convolution of checked arguments (x channels-last): the output, channels-last. The forward
    keeps GELU's pre-activation only when a backward pass will need it. In plain eager mode (``direct``) the
    op's own implementation runs without its dispatch: a pointwise convolution on CUDA as ``_pointwise``'s
    bound step (where it can run bound), any other as an
    autograd Function with the op's formula when a gradient is wanted, else the forward's GEMM alone."""
    grad = wants_grad(x, weight, bias)
    if direct(x, weight, bias):
        if g.pointwise and x.is_cuda:
            out = pointwise.conv(x, weight, bias, activation, grad)
            if out is not None:
                return out
        if not grad:
            return forward(x, weight, bias, activation, False, g, inference_gemm)[0]
        out, _ = _Conv2d.apply(x, weight, bias, activation, activation == "gelu", list(g.stride),
                               list(g.padding), list(g.dilation))
        return out
    out, _ = torch.ops.nvblaslt.conv2d(x, weight, bias, activation, grad and activation == "gelu",
                                       list(g.stride), list(g.padding), list(g.dilation))
    return out
