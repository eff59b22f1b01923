"""The custom ops ``nvblaslt::linear`` and ``nvblaslt::linear_backward``: their implementations (nvblaslt's
GEMMs on CUDA, torch ops elsewhere), fake implementations and autograd formula, and ``layer()``, the
one call into them.

Across two layers of a ``FusedSequential`` the activation's backward can move into the next layer's
input-gradient GEMM: DRELU / DGELU with the previous layer's aux (the ReLU bitmask, the GELU
pre-activation) give the gradient w.r.t. its pre-activation, and DRELU_BGRAD / DGELU_BGRAD its bias
gradient in the same call. The gradient travels on a *link*: each linked layer also returns ``link``
(T, out) and ``link_bias`` (out,), zero tensors of zero strides (one element of memory) standing for
``z - stopgrad(z)``. The next layer reads x's value but declares its dependence through the
link, so autograd stays exact even when the activation output has other consumers (their
gradient arrives on the output and goes through the activation's derivative as torch ops).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._composite import (activation_backward, empty_aux, forward_composite, input_grad_composite, links, unused,
                         weight_grad_composite)
from ._eager import autograd_function, direct, wants_grad
from ._gemms import forward_cuda, forward_inference, input_grad_cuda, weight_grad_cuda

_LINEAR_SCHEMA = ("(Tensor x, Tensor weight, Tensor? bias, str activation, bool keep_aux, Tensor? prev_aux, "
                  "str prev_activation, Tensor? link, Tensor? link_bias) -> (Tensor, Tensor, Tensor, Tensor)")
_BACKWARD_SCHEMA = ("(Tensor? grad_out, Tensor? grad_link, Tensor x, Tensor weight, Tensor? out, Tensor aux, "
                    "str activation, bool bias_grad, Tensor? prev_aux, str prev_activation, bool prev_bias_grad, "
                    "bool input_grad, bool weight_grad) -> (Tensor, Tensor, Tensor, Tensor)")


def uses_cublaslt(x: Tensor) -> bool:
    """CUDA tensors go to nvblaslt; every other device runs the same math as torch ops."""
    return x.is_cuda


def _linear_impl(x, weight, bias, activation, keep_aux, prev_aux, prev_activation, link, link_bias):
    """(out, aux, link, link_bias) for a 2-D x; ``prev_*`` and the links only carry the backward pass."""
    forward = forward_cuda if uses_cublaslt(x) else forward_composite
    out, aux = forward(x, weight, bias, activation, keep_aux)
    return out, aux, *links(x, weight.shape[0], keep_aux and activation != "none")


@torch.library.custom_op("nvblaslt::linear", mutates_args=(), schema=_LINEAR_SCHEMA)
def _linear_op(x, weight, bias, activation, keep_aux, prev_aux, prev_activation, link, link_bias):
    return _linear_impl(x, weight, bias, activation, keep_aux, prev_aux, prev_activation, link, link_bias)


@_linear_op.register_fake
def _linear_fake(x, weight, bias, activation, keep_aux, prev_aux, prev_activation, link, link_bias):
    features = weight.shape[0]
    return (x.new_empty((x.shape[0], features)), empty_aux(x, activation, keep_aux, features),
            *links(x, features, keep_aux and activation != "none", real=False))


def _backward(grad_out, grad_link, x, weight, out, aux, activation, bias_grad, prev_aux, prev_activation,
              prev_bias_grad, input_grad, weight_grad, *, cuda: bool):
    """The backward pass of one layer; the GEMMs are nvblaslt's (``cuda``) or torch's."""
    features = weight.shape[0]
    parts = []
    if grad_out is not None:
        parts.append(activation_backward(grad_out, activation, out, aux, features))
    if grad_link is not None:
        parts.append(grad_link)
    dz = parts[0] if len(parts) == 1 else (parts[0] + parts[1] if parts else x.new_zeros((x.shape[0], features)))
    dz = dz.contiguous()
    weight_grad_fn, input_grad_fn = ((weight_grad_cuda, input_grad_cuda) if cuda else
                                     (weight_grad_composite, input_grad_composite))
    dw = db = dx = dprev_b = None
    if weight_grad:
        dw, db = weight_grad_fn(x, dz, bias_grad)
    elif bias_grad:
        db = dz.sum(0)
    if input_grad:
        dx, dprev_b = input_grad_fn(weight, dz, prev_activation, x, prev_aux, prev_bias_grad)
    return tuple(unused(x) if t is None else t for t in (dx, dw, db, dprev_b))


def linear_backward_impl(grad_out, grad_link, x, weight, out, aux, activation, bias_grad, prev_aux,
                          prev_activation, prev_bias_grad, input_grad, weight_grad):
    """(grad_input, grad_weight, grad_bias, grad_prev_bias); empty tensors for what was not asked for.
    grad_input is w.r.t. x, or w.r.t. the previous layer's pre-activation when ``prev_activation`` is set."""
    cuda = uses_cublaslt(x) and x.numel() > 0 and weight.numel() > 0
    return _backward(grad_out, grad_link, x, weight, out, aux, activation, bias_grad, prev_aux, prev_activation,
                     prev_bias_grad, input_grad, weight_grad, cuda=cuda)


@torch.library.custom_op("nvblaslt::linear_backward", mutates_args=(), schema=_BACKWARD_SCHEMA)
def _linear_backward_op(grad_out, grad_link, x, weight, out, aux, activation, bias_grad, prev_aux,
                        prev_activation, prev_bias_grad, input_grad, weight_grad):
    return linear_backward_impl(grad_out, grad_link, x, weight, out, aux, activation, bias_grad, prev_aux,
                                 prev_activation, prev_bias_grad, input_grad, weight_grad)


@_linear_backward_op.register_fake
def _linear_backward_fake(grad_out, grad_link, x, weight, out, aux, activation, bias_grad, prev_aux,
                          prev_activation, prev_bias_grad, input_grad, weight_grad):
    empty = unused(x)
    tokens, features, inputs = x.shape[0], weight.shape[0], x.shape[1]
    return (x.new_empty((tokens, inputs)) if input_grad else empty,
            x.new_empty((features, inputs)) if weight_grad else empty,
            x.new_empty((features,)) if bias_grad else empty,
            x.new_empty((inputs,)) if input_grad and prev_bias_grad else empty)


# argument positions of nvblaslt::linear
_X, _WEIGHT, _BIAS, _PREV_AUX, _LINK, _LINK_BIAS = 0, 1, 2, 5, 7, 8


def _setup_context(ctx, inputs, output):
    x, weight, bias, activation, keep_aux, prev_aux, prev_activation, link, link_bias = inputs
    out, aux = output[0], output[1]
    ctx.set_materialize_grads(False)  # None, not zeros, for outputs nobody used: the links tell which path ran
    ctx.mark_non_differentiable(aux)
    ctx.save_for_backward(x, weight, out if activation == "relu" else None, aux, prev_aux)
    ctx.activation, ctx.prev_activation = activation, prev_activation if link is not None else "none"
    ctx.has_bias, ctx.linked = bias is not None, link is not None
    ctx.prev_has_bias = link_bias is not None


def _linear_autograd(ctx, grad_out, grad_aux, grad_link, grad_link_bias):
    if grad_out is None and grad_link is None:
        return (None,) * 9
    x, weight, out, aux, prev_aux = ctx.saved_tensors
    needs = ctx.needs_input_grad
    bias_grad = ctx.has_bias and needs[_BIAS]
    grad_bias = None
    if bias_grad and grad_out is None and grad_link_bias is not None:
        # the whole gradient came over the link, and the next layer's *_BGRAD epilog already summed it
        grad_bias, bias_grad = grad_link_bias, False
    input_grad = needs[_LINK] if ctx.linked else needs[_X]
    prev_bias_grad = ctx.prev_has_bias and needs[_LINK_BIAS]
    arguments = (grad_out, grad_link, x, weight, out, aux, ctx.activation, bias_grad, prev_aux, ctx.prev_activation,
                 prev_bias_grad, input_grad, needs[_WEIGHT])
    # the backward op has no autograd of its own: under create_graph it runs as the op, which says so
    if not torch.is_grad_enabled() and direct(grad_out, grad_link, x, weight, out, aux, prev_aux):
        dx, dw, db, dprev_b = linear_backward_impl(*arguments)
    else:
        dx, dw, db, dprev_b = torch.ops.nvblaslt.linear_backward(*arguments)
    grads = [None] * 9
    grads[_LINK if ctx.linked else _X] = dx if input_grad else None
    grads[_WEIGHT] = dw if needs[_WEIGHT] else None
    grads[_BIAS] = db if bias_grad else grad_bias
    grads[_LINK_BIAS] = dprev_b if prev_bias_grad else None
    return tuple(grads)


_linear_op.register_autograd(_linear_autograd, setup_context=_setup_context)
_Linear = autograd_function("Linear", _linear_impl, _setup_context, _linear_autograd)


def eager_linear(x2: Tensor, weight: Tensor, bias: Tensor | None, activation: str) -> Tensor:
    """``layer()``'s output for an unlinked call that autograd records and ``direct()`` lets skip the op:
    for a caller that has checked what ``wants_grad()`` and ``direct()`` check."""
    return _Linear.apply(x2, weight, bias, activation, activation == "gelu", None, "none", None, None)[0]


def layer(x2: Tensor, weight: Tensor, bias: Tensor | None, activation: str, state: Any,
          chain: str | None = None) -> tuple[Tensor, Any]:
    """One layer on 2-D x; ``state`` is the previous layer's (activation, aux, link, link_bias) or None.
    ``chain``: where this layer's activation backward runs — None: in its own backward, as torch ops on
    its output (ReLU) or kept pre-activation (GELU); ``"epilog"`` / ``"bgradb"``: in the next layer's
    input-gradient GEMM (DRELU_BGRAD / DGELU_BGRAD, or DRELU / DGELU with BGRADB here for the bias
    gradient), through the link this layer returns. Returns (out, state for the next layer)."""
    carried = state[1:] if state is not None else ()  # the previous layer's aux and links, where linked
    grad = wants_grad(x2, weight, bias, *carried[1:])
    # plain eager: the op's own code, no dispatch; without a gradient, the forward's GEMM alone
    eager = direct(x2, weight, bias, *carried)
    if eager and not grad:
        return forward_inference(x2, weight, bias, activation, cuda=uses_cublaslt(x2)), None
    linked = grad and activation != "none" and chain is not None
    keep_aux = linked or (grad and activation == "gelu")  # ReLU's own backward reads its output instead
    prev_activation, prev_aux, link, link_bias = state if state is not None else ("none", None, None, None)
    arguments = (x2, weight, bias, activation, keep_aux, prev_aux, prev_activation, link, link_bias)
    if eager:
        out, aux, out_link, out_link_bias = _Linear.apply(*arguments)
    else:
        out, aux, out_link, out_link_bias = torch.ops.nvblaslt.linear(*arguments)
    if not linked:
        return out, None
    return out, (activation, aux, out_link, out_link_bias if bias is not None and chain == "epilog" else None)
