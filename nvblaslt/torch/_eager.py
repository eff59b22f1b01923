"""Eager calls that skip the custom ops' dispatch.

A call through ``torch.ops.nvblaslt.*`` passes torch's Python custom-op machinery (the autograd
wrapper, a redispatch, output alias checks) before it reaches nvblaslt: about 100 µs on an H200's host,
five times the whole ``torch.mm`` of a decode step. The ops are what torch.compile, export, fake
tensors, dispatch modes, functorch transforms and ``torch.jit.trace`` see, and they stay the path for
all of those. Where none of them can observe the call (plain tensors, eager mode, no mode or
transform active), the ops' own implementation runs directly, and their own autograd formula through
a ``torch.autograd.Function`` when a gradient is wanted: the same results and gradients, without the
dispatch.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

PLAIN = (torch.Tensor, nn.Parameter)  # tensor types whose calls may skip the op


# The queries of plain_eager(), bound once for the hot paths that inline them (each lookup through torch's
# modules costs as much as the call). Dynamo knows is_compiling by the function object, alias or not.
is_compiling: Callable[[], bool] = torch.compiler.is_compiling
# Dynamo's tracing alone, one Python call less (is_compiling also asks is_scripting and export's flag): for a
# hot path whose other checks refuse what export traces (fake tensors, and its dispatch and function modes)
is_dynamo_compiling: Callable[[], bool] = getattr(torch.compiler, "is_dynamo_compiling", None) or is_compiling
is_tracing: Callable[[], bool] = getattr(torch._C, "_is_tracing", None) or torch.jit.is_tracing
dispatch_modes: Callable[[], int] = torch._C._len_torch_dispatch_stack
function_modes: Callable[[], bool] = torch._C._is_torch_function_mode_enabled
functorch_transforms: Callable[[], bool] = torch._C._are_functorch_transforms_active


def plain_eager() -> bool:
    """``direct()``'s half that reads no tensor: eager mode, no torch dispatch or function mode, no
    functorch transform, no ``torch.jit.trace``."""
    if is_compiling():  # first: dynamo folds it, and traces nothing below
        return False
    return not (dispatch_modes() or function_modes() or functorch_transforms() or is_tracing())


def direct(*tensors: Tensor | None) -> bool:
    """Whether a call on these tensors may skip the op: ``plain_eager()``, and every tensor a plain
    ``Tensor`` or ``Parameter`` (no subclass) with data (not on the meta device)."""
    if not plain_eager():
        return False
    # meta tensors have no data: the ops' fake implementations give their shapes (a loop: a generator
    # costs a microsecond a call, a tenth of a decode step's host time)
    for t in tensors:
        if t is not None and (type(t) not in PLAIN or t.is_meta):
            return False
    return True


def wants_grad(*tensors: Tensor | None) -> bool:
    """Whether autograd records a call on these tensors."""
    if not torch.is_grad_enabled():
        return False
    for t in tensors:
        if t is not None and t.requires_grad:
            return True
    return False


def autograd_function(name: str, implementation: Callable[..., Any], setup_context: Callable[..., None],
                      backward: Callable[..., Any]) -> type[torch.autograd.Function]:
    """A ``torch.autograd.Function`` running an op's implementation with the op's own autograd formula
    (``setup_context`` and ``backward`` as ``register_autograd`` takes them).

    Its ``forward`` takes ``ctx`` and calls ``setup_context`` itself: a Function with a separate
    ``setup_context`` has every ``apply`` bind its arguments through ``inspect.signature`` (PyTorch
    2.11), about a fifth of a grouped GEMM's host time under autograd."""

    def forward(ctx: Any, *inputs: Any) -> Any:
        output = implementation(*inputs)
        setup_context(ctx, inputs, output)
        return output

    def run_backward(ctx: Any, *grads: Any) -> Any:
        return backward(ctx, *grads)

    # types.new_class, not type(): the docs build imports this module against a stand-in torch (no torch installed)
    body = {"forward": staticmethod(forward), "backward": staticmethod(run_backward)}
    return types.new_class(name, (torch.autograd.Function,), {}, lambda namespace: namespace.update(body))
