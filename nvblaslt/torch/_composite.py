"""The layer's math as torch ops, and the layouts every implementation shares.

The ops run this math on every device but CUDA, and on CUDA for the float64 steps cuBLASLt refuses.
The CUDA path and the fake implementations take the aux and link layouts from here, so all three
promise the same shapes and strides.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .._epilogs import gelu_aux_ld, relu_aux_ld_bytes

# ---- layouts shared by every implementation and the fake one ------------------------------------------


def aux_layout(activation: str, keep_aux: bool, tokens, features) -> tuple[tuple, tuple, bool]:
    """(shape, strides, is_bitmask) of the aux the forward keeps: what cuBLASLt returns for D
    (features, tokens): the ReLU bitmask (int8, leading dimension a multiple of 128 bits) or the
    GELU pre-activation (leading dimension a multiple of 8), column-major. Empty otherwise."""
    if not keep_aux or activation == "none":
        return (0,), (1,), activation == "relu"
    ld = relu_aux_ld_bytes(features) if activation == "relu" else gelu_aux_ld(features)
    return (ld, tokens), (1, ld), activation == "relu"


def empty_aux(x: Tensor, activation: str, keep_aux: bool, features) -> Tensor:
    shape, strides, bitmask = aux_layout(activation, keep_aux, x.shape[0], features)
    return x.new_empty_strided(shape, strides, dtype=torch.int8 if bitmask else x.dtype)


def links(x: Tensor, features, keep_aux: bool, real: bool = True) -> tuple[Tensor, Tensor]:
    """(link, link_bias): zeros of shapes (T, features) and (features,) with zero strides (one element of
    memory each) when the forward keeps its aux for a backward pass, else empty. Their values are never
    read; their gradients are what matters (see ``nvblaslt.torch._ops``)."""
    if not keep_aux:
        return x.new_empty(0), x.new_empty(0)
    if not real:
        return x.new_empty_strided((x.shape[0], features), (0, 0)), x.new_empty_strided((features,), (0,))
    return own(x.new_zeros((1, 1)).expand(x.shape[0], features)), own(x.new_zeros(1).expand(features))


def own(t: Tensor) -> Tensor:
    """A tensor with ``t``'s memory, shape and strides that is not a view. A custom op's outputs must not be
    views: autograd forbids in-place ops on views made inside a custom Function (``y += r`` would fail).
    PyTorch has no public test for a view, so every tensor gets a new header (no copy, about 2 µs)."""
    return t.new_empty(0).set_(t.untyped_storage(), t.storage_offset(), t.shape, t.stride())


def row_major(t: Tensor) -> Tensor:
    """``t`` as a contiguous (row-major) tensor that is not a view; copies only when ``t`` is laid out otherwise."""
    return own(t) if t.is_contiguous() else t.contiguous()


def unused(x: Tensor) -> Tensor:
    return x.new_empty(0)


# ---- the math ------------------------------------------------------------------------------------------


def activate(z: Tensor, activation: str) -> Tensor:
    if activation == "relu":
        return torch.relu(z)
    if activation == "gelu":
        return nn.functional.gelu(z, approximate="tanh")
    return z


def pack_relu_mask(positive: Tensor, aux: Tensor) -> None:
    """Write the bitmask of ``positive`` (T, features) into ``aux`` (ld_bytes, T) as cuBLASLt lays it out:
    bit i of byte j in column t is element (8j + i, t) of D."""
    tokens, features = positive.shape
    ld_bytes = aux.shape[0]
    bits = positive.new_zeros((tokens, ld_bytes * 8), dtype=torch.uint8)
    bits[:, :features] = positive
    weights = torch.ones(8, dtype=torch.uint8, device=positive.device) << torch.arange(8, dtype=torch.uint8,
                                                                                        device=positive.device)
    packed = (bits.view(tokens, ld_bytes, 8) * weights).sum(-1, dtype=torch.uint8)
    aux.T.copy_(packed.view(torch.int8))


def forward_composite(x, weight, bias, activation, keep_aux):
    z = torch.addmm(bias, x, weight.t()) if bias is not None else torch.mm(x, weight.t())
    out = activate(z, activation)
    aux = empty_aux(x, activation, keep_aux, weight.shape[0])
    if aux.numel():
        if activation == "relu":
            pack_relu_mask(z > 0, aux)
        else:
            aux.zero_()
            aux[: z.shape[1]].copy_(z.T)
    return out, aux


def _gelu_input(aux: Tensor, features: int) -> Tensor:
    """The pre-activation z (T, features) inside a GELU aux (ld, T)."""
    return aux[:features].T


def activation_backward(grad: Tensor, activation: str, out, aux, features: int) -> Tensor:
    """grad ⊙ act'(z), from what the forward kept: the output for ReLU (z > 0 ⇔ out > 0), the aux for GELU."""
    if activation == "relu":
        return torch.ops.aten.threshold_backward(grad, out, 0)
    if activation == "gelu":
        return torch.ops.aten.gelu_backward(grad, _gelu_input(aux, features), approximate="tanh")
    return grad


def weight_grad_composite(x, dz, bias_grad):
    dw = torch.mm(dz.t(), x)
    return dw, (dz.sum(0) if bias_grad else None)


def input_grad_composite(weight, dz, prev_activation, x, prev_aux, prev_bias_grad):
    dx = torch.mm(dz, weight)
    dx = activation_backward(dx, prev_activation, x, prev_aux, x.shape[1])
    return dx, (dx.sum(0) if prev_bias_grad else None)
