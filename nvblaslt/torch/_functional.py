"""``linear()``: one fused layer as a function; and what every entry does before ``layer()``: name the
activation, cast as autocast would, check the arguments."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .. import NvblasltTypeError, NvblasltValueError
from . import _ops
from ._eager import (PLAIN, direct, dispatch_modes, function_modes, functorch_transforms, is_dynamo_compiling,
                     is_tracing)
from ._ops import eager_linear, layer
from ._pointwise import first_linear_inference, linear_inference
from ._tuning import chain_for, check_switch, invariant

# ---- activations ------------------------------------------------------------------------------------

_ALIASES = {None: "none", "none": "none", "identity": "none", "relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu"}
_EXACT_GELU = ("gelu_erf", "gelu_exact", "gelu_none", "exact_gelu")
EXACT_GELU_HINT = ("cuBLASLt fuses only the tanh approximation of GELU; use activation='gelu' "
                   "(nn.GELU(approximate='tanh')) or keep the exact GELU outside the fused layer")


def activation_name(value: str | None, argument: str = "activation") -> str:
    """The canonical name of an activation: 'none', 'relu' or 'gelu' (tanh form)."""
    key = value.lower() if isinstance(value, str) else value
    if key in _EXACT_GELU:
        raise NvblasltValueError(f"{argument}: {value!r} asks for exact (erf) GELU; {EXACT_GELU_HINT}")
    try:
        return _ALIASES[key]
    except (KeyError, TypeError):
        raise NvblasltValueError(f"{argument}: expected None, 'relu' or 'gelu' (the tanh form), got {value!r}") from None


# ---- the arguments ------------------------------------------------------------------------------------

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_tensors(x: object, weight: object, bias: object) -> None:
    """x, weight and bias (or None) must be tensors: checked before autocast reads their devices."""
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if not isinstance(t, Tensor) and not (name == "bias" and t is None):
            expected = "a torch.Tensor or None" if name == "bias" else "a torch.Tensor"
            raise NvblasltTypeError(f"{name}: expected {expected}, got {type(t).__module__}.{type(t).__qualname__}")


def _check(x: Tensor, weight: Tensor, bias: Tensor | None) -> None:
    if weight.dim() != 2:
        raise NvblasltValueError(f"weight: expected a 2-D (out_features, in_features) tensor, got shape "
                                 f"{tuple(weight.shape)}")
    if x.dim() == 0 or x.shape[-1] != weight.shape[1]:
        raise NvblasltValueError(f"x: expected shape (…, {weight.shape[1]}) to match weight's in_features, "
                                 f"got {tuple(x.shape)}")
    check_like_x(x, weight, bias)


def check_like_x(x: Tensor, weight: Tensor, bias: Tensor | None) -> None:
    """x a float tensor, weight and bias of its dtype and device, bias one value per output: the
    checks a Linear and a Conv2d layer share."""
    dtype, device = x.dtype, x.device
    if dtype not in _FLOATS:
        raise NvblasltTypeError(f"x: expected float16, bfloat16, float32 or float64, got {dtype}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        if t.dtype != dtype:
            raise NvblasltTypeError(f"{name}: expected dtype {dtype} (x's), got {t.dtype}")
        if t.device != device:
            raise NvblasltValueError(f"{name}: on {t.device}, but x is on {device}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
        raise NvblasltValueError(f"bias: expected shape ({weight.shape[0]},), got {tuple(bias.shape)}")


_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None)  # one call, where most find it off
# linear()'s fast path asks this: where torch has no single query, autocast counts as on (the checked path)
_autocast_on: Callable[[], bool] = _any_autocast if _any_autocast is not None else lambda: True


def autocast_inputs(x: Tensor, weight: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
    """Cast as autocast casts nn.Linear's and nn.Conv2d's inputs, when it is on for x's device."""
    if _any_autocast is not None and not _any_autocast():
        return x, weight, bias
    device = getattr(x, "device", None)
    if device is None or not torch.is_autocast_enabled(device.type):
        return x, weight, bias
    dtype = torch.get_autocast_dtype(device.type)
    return x.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype)


# ---- the entries --------------------------------------------------------------------------------------


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, activation: str | None = None, *,
           batch_invariant: bool = False) -> Tensor:
    """``activation(x @ weight.T + bias)`` as one fused cuBLASLt call on CUDA, autograd-aware.

    ``nn.functional.linear`` followed by the activation. On CUDA tensors the forward pass is one
    cuBLASLt call (RELU_BIAS, GELU_AUX_BIAS, BIAS or a plain GEMM); the backward pass runs the
    activation's derivative as a torch op and BGRADB for the bias gradient (a ``FusedSequential`` can
    also move the activation's backward into the next layer's GEMM). Tensors on any other device run
    the same math as torch ops. Under autocast the inputs are cast as autocast casts ``nn.Linear``'s.
    It is the torch custom op ``torch.ops.nvblaslt.linear``, so it works under
    ``torch.compile(fullgraph=True)``, in CUDA graphs and with ``gradcheck``.

    Parameters
    ----------
    x : torch.Tensor
        (…, in_features): any leading shape.
    weight : torch.Tensor
        (out_features, in_features), of ``x``'s dtype and device.
    bias : torch.Tensor or None, optional
        (out_features,), of ``x``'s dtype and device.
    activation : {None, "relu", "gelu"}, optional
        ``"gelu"`` is the tanh approximation (``nn.GELU(approximate="tanh")``), the one cuBLASLt
        fuses; exact GELU (``"gelu_erf"``) is refused. ``"none"`` / ``"identity"`` mean None.
    batch_invariant : bool, default False
        Row i of the result bitwise the same whatever the number of rows (on the same GPU and
        cuBLASLt): the forward GEMM runs with ``MatmulOptions(batch_invariant=…)``, one algorithm
        pinned for every token count. It acts where the call runs (eagerly, or when a compiled graph
        runs the op), not on the backward pass.

    Returns
    -------
    torch.Tensor
        (…, out_features), of ``x``'s dtype (float16, bfloat16, float32 or float64) and device.

    Raises
    ------
    NvblasltTypeError
        ``x`` or ``weight`` is not a tensor (``bias`` neither a tensor nor None), the dtypes are not
        one floating type, or ``batch_invariant`` is not a bool.
    NvblasltValueError
        The shapes do not match, the tensors are on different devices, or ``activation`` is unknown
        or exact GELU.

    See Also
    --------
    FusedLinear : the same as an ``nn.Module``.

    Examples
    --------
    >>> import torch
    >>> from nvblaslt.torch import linear
    >>> x, weight, bias = torch.ones(2, 3), torch.full((4, 3), 0.5), -torch.arange(4.0)
    >>> linear(x, weight, bias, activation="relu")
    tensor([[1.5000, 0.5000, 0.0000, 0.0000],
            [1.5000, 0.5000, 0.0000, 0.0000]])
    >>> linear(x, weight, activation="gelu_erf")
    Traceback (most recent call last):
        ...
    nvblaslt.NvblasltValueError: activation: 'gelu_erf' asks for exact (erf) GELU; ...
    """
    key = grad = None
    # The fast path: a plain eager call like one already checked (see _Checked) runs with no check its key
    # proves. plain_eager() and the autocast query inlined, dynamo's query first (it folds it, and traces
    # nothing below; export's fake tensors and modes fail the type and mode checks); a decode step's Python
    # is most of its host time, so every call here counts.
    if batch_invariant is False and not is_dynamo_compiling() and type(x) in PLAIN and type(weight) in PLAIN \
            and (bias is None or type(bias) in PLAIN) and (activation is None or type(activation) is str) \
            and not (_autocast_on() or dispatch_modes() or function_modes() or functorch_transforms()
                     or is_tracing()):
        grad = _grad_enabled() and (x.requires_grad or weight.requires_grad or
                                    (bias is not None and bias.requires_grad))
        x_device = x.device
        key = ("linear", activation, grad, x.shape, x.dtype, x_device, x.is_contiguous(), weight.shape, weight.dtype,
               weight.device, weight.is_contiguous(),
               None if bias is None else (bias.shape, bias.dtype, bias.device, bias.is_contiguous()))
        if grad:
            found = _checked.grad_calls.get(key)
            if found is not None:
                return _linear_recorded(x, weight, bias, *found)
        else:
            out = linear_inference(key, x, weight, bias, x_device)
            if out is not None:
                return out
    activation = activation_name(activation)
    _check_tensors(x, weight, bias)
    x, weight, bias = autocast_inputs(x, weight, bias)
    _check(x, weight, bias)
    if check_switch(batch_invariant):
        with invariant(True):
            return _linear(x, weight, bias, activation)
    if key is not None:  # every check passed: the fast path takes like calls from now on
        out = _first_call(key, bool(grad), x, weight, bias, activation)
        if out is not None:
            return out
    return _linear(x, weight, bias, activation)


_grad_enabled = torch._C.is_grad_enabled


class _Checked(threading.local):
    """The fast path's record of calls with a gradient that passed every check, by key: what of a call
    decides its checks and its path (the raw ``activation``, whether autograd records it, each tensor's
    shape, dtype, device and contiguity). What no key can prove is read on every call: the tensors'
    types, eager mode, autocast, grad mode and ``requires_grad``. Calls without a gradient keep their key
    with their bound step (``_pointwise.linear_inference``); these hold nothing but a few names."""

    def __init__(self) -> None:
        self.grad_calls: dict[tuple, tuple[str, tuple[int, ...] | None]] = {}


_checked = _Checked()
_GRAD_CALLS = 256  # the record starts over past this many: a loop over many shapes re-checks each once


def _first_call(key: tuple, grad: bool, x: Tensor, weight: Tensor, bias: Tensor | None,
                activation: str) -> Tensor | None:
    """A checked call that the fast path may take from now on: run and kept under ``key`` (None: the
    bound step cannot run it, and ``_linear`` runs it as before)."""
    if grad:
        if not direct(x, weight, bias):  # meta tensors: the op's fake implementation
            return None
        calls = _checked.grad_calls
        if len(calls) >= _GRAD_CALLS:
            calls.clear()
        found = calls[key] = (activation, None if x.dim() == 2 else (*x.shape[:-1], weight.shape[0]))
        return _linear_recorded(x, weight, bias, *found)
    if not _ops.uses_cublaslt(x) or not x.is_contiguous():
        return None
    return first_linear_inference(key, x, weight, bias, activation)


def _linear_recorded(x: Tensor, weight: Tensor, bias: Tensor | None, activation: str,
                     out_shape: tuple[int, ...] | None) -> Tensor:
    """``_linear`` of a checked plain eager call that autograd records (``out_shape``: x's leading shape
    and the output features, for an x that is not 2-D)."""
    if out_shape is None:
        return eager_linear(x.contiguous(), weight, bias, activation)
    return eager_linear(x.reshape(-1, x.shape[-1]).contiguous(), weight, bias, activation).reshape(out_shape)


def _linear(x: Tensor, weight: Tensor, bias: Tensor | None, activation: str) -> Tensor:
    if x.dim() == 2:  # the common case: no reshape either way
        return layer(x.contiguous(), weight, bias, activation, None)[0]
    lead = x.shape[:-1]
    out, _ = layer(x.reshape(-1, x.shape[-1]).contiguous(), weight, bias, activation, None)
    return out.reshape(*lead, weight.shape[0])


def linked_layer(x2: Tensor, weight: Tensor, bias: Tensor | None, activation: str, state: Any,
                 backward: str) -> tuple[Tensor, Any]:
    """One ``FusedLinear`` of a ``FusedSequential`` on 2-D x: (out, the link state for the next layer),
    taking the previous layer's; ``backward`` is the sequence's (one of ``BACKWARDS``)."""
    _check_tensors(x2, weight, bias)
    x2, weight, bias = autocast_inputs(x2, weight, bias)
    _check(x2, weight, bias)
    return layer(x2, weight, bias, activation, state, chain_for(backward, activation))
