"""The pointwise Conv2d + bias + activation step (1×1, stride 1, no padding) on bound GEMMs.

In channels-last memory, x (N, C, H, W) is the (M = N·H·W, C) row-major matrix X, a 1×1 weight
(O, C, 1, 1), contiguous or channels-last, is W (O, C) row-major, and the output (N, O, H, W)
channels-last is Y (M, O) row-major. Each GEMM of the step therefore reads and writes the tensors'
own memory, and every tensor is made in its final shape, so the step makes no view:

- forward: Y = act(X Wᵀ + b), as D = W Xᵀ (O, M) column-major: RELU_BIAS, GELU_AUX_BIAS (the
  pre-activation kept for the backward pass), BIAS; without a bias, RELU / GELU / DEFAULT as D = X Wᵀ;
- backward: dZ = dY ⊙ act′ (a torch op, from the output for ReLU), dW = dZᵀ X as D = Xᵀ dZ with
  BGRADB giving db in the same call, dX = dZ W as D = Wᵀ dZᵀ.

These are the GEMM problems ``_conv_ops``' custom ops run through ``matmul()`` (so a tuned choice
applies to both), here as ``BoundGemm``s found under the input's shape, dtype, device and stream:
the step's host time is its launches, its outputs' allocation and one autograd node. It is the
conv ops' eager body for plain CUDA tensors; under ``create_graph`` the backward runs as the op,
which refuses a double backward by name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
from torch import Tensor

from .. import MatmulEpilog, _cuda
from . import _bound
from ._composite import aux_layout, unused
from ._eager import autograd_function
from ._tuning import contexts_open, tuning

_E = MatmulEpilog
_FORWARD = {  # (activation, has bias, keep aux) -> epilog, as _gemms' forward runs it
    ("none", False, False): _E.DEFAULT, ("none", True, False): _E.BIAS,
    ("relu", False, False): _E.RELU, ("relu", True, False): _E.RELU_BIAS,
    ("gelu", False, False): _E.GELU, ("gelu", True, False): _E.GELU_BIAS,
    ("gelu", False, True): _E.GELU_AUX, ("gelu", True, True): _E.GELU_AUX_BIAS,
}
_ELEMENTWISE = {_E.DEFAULT, _E.RELU, _E.GELU}  # no vector along D: D = X Wᵀ, row-major, as _gemms runs it
DTYPES = {torch.float16, torch.bfloat16, torch.float32}  # float64 goes to _gemms, which falls back by epilog
_raw_stream: Callable[[int], int] | None = getattr(torch._C, "_cuda_getCurrentRawStream", None)


# whether torch's current stream is capturing a graph (builds without the query have no bound steps)
_capturing: Callable[[], bool] = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) or (lambda: False)


_StreamGetter = Callable[[int], int]  # made once: a subscript per call cost a decode step 1 µs (H200 host)


def _current_stream(device: int) -> int:
    """torch's current stream on ``device`` (a bound step runs only where torch has the raw getter)."""
    return cast(_StreamGetter, _raw_stream)(device)


class Step:
    """The bound GEMMs of one layer shape on one stream: the forward's, made with the step, and the
    backward's two (the weight and bias gradient, the input gradient), made at first use. ``x`` is a
    channels-last (N, C, H, W) image, or a row-major (M, C) matrix (a linear layer's input)."""

    __slots__ = ("gemms", "out_shape", "out_strides", "x_strides", "aux_shape", "aux_strides", "aux_dtype",
                 "transposed", "rows", "stream", "built", "captured")  # stream: the one its plans were made on

    def __init__(self, x: Tensor, weight: Tensor, bias: Tensor | None, activation: str, keep_aux: bool,
                 stream: int, out_shape: tuple[int, ...] | None = None) -> None:
        o = weight.shape[0]
        self.out_shape: tuple[int, ...]
        self.out_strides: tuple[int, ...]
        self.x_strides: tuple[int, ...]
        if x.dim() == 4:
            n, c, h, w = x.shape
            m = n * h * w
            self.out_shape, self.out_strides = (n, o, h, w), (h * w * o, 1, w * o, o)
            self.x_strides = (h * w * c, 1, w * c, c)
        else:
            m, c = x.shape
            self.out_shape, self.out_strides, self.x_strides = (m, o), (o, 1), (c, 1)
            if out_shape is not None:  # a linear layer's N-D input: the output made in its final shape, row-major
                self.out_shape, self.out_strides = out_shape, _row_major_strides(out_shape)
        self.rows, self.stream = m, stream
        self.aux_shape, self.aux_strides, bitmask = aux_layout(activation, keep_aux, m, o)
        self.aux_dtype = torch.int8 if bitmask else x.dtype
        epilog = _FORWARD[activation, bias is not None, keep_aux]
        rows, weights = x.detach().as_strided((m, c), (c, 1)), weight.detach().as_strided((o, c), (c, 1))
        self.transposed = epilog not in _ELEMENTWISE
        if not self.transposed:
            forward = _bound.bind(rows, weights.T, epilog, None, stream, ((m, o), (o, 1)))
        else:
            outputs = ("EPILOGUE_AUX_POINTER",) if keep_aux else ()
            inputs, attributes = ({"bias": bias.detach()}, ("BIAS_POINTER",)) if bias is not None else (None, ())
            forward = _bound.bind(weights, rows.T, epilog, inputs, stream, ((o, m), (1, o)), attributes + outputs)
        # forward; dW = dZᵀ X with and without BGRADB; dX = dZ W (None: not made yet, or cannot be bound)
        self.gemms: list[_bound.Bound | None] = [forward, None, None, None]
        self.built = [True, False, False, False]
        self.captured = False  # a CUDA graph ran it: kept for the thread's life (_bound.keep_captured)

    def mark_captured(self) -> None:
        """A CUDA graph ran this step: kept for the thread's life (``_bound.keep_captured``)."""
        if not self.captured:
            self.captured = True
            _bound.keep_captured(self)

    def backward_gemm(self, index: int, x: Tensor, weight: Tensor, dz: Tensor) -> _bound.Bound | None:
        """The backward's GEMM ``index`` (1: dW, 2: dW with db, 3: dX), made on first use from this call's
        tensors; None where it cannot be bound, a graph is being captured (planning allocates), or an
        ``autotune()`` context would search it (``_gemms``' path does)."""
        if tuning():
            return None
        if not self.built[index]:
            if _cuda.is_capturing(_current_stream(x.get_device())):
                return None
            o, m, c = weight.shape[0], self.rows, weight.shape[1]
            dz_rows = dz.as_strided((m, o), (o, 1))
            if index == 3:
                weights = weight.detach().as_strided((o, c), (c, 1))
                self.gemms[3] = _bound.bind(weights.T, dz_rows.T, _E.DEFAULT, None, self.stream, ((c, m), (1, c)))
            else:  # B = dZ row-major: what BGRADB has kernels for
                rows = x.detach().as_strided((m, c), (c, 1))
                with_bias = index == 2
                self.gemms[index] = _bound.bind(rows.T, dz_rows, _E.BGRADB if with_bias else _E.DEFAULT, None,
                                                self.stream, ((c, o), (1, c)), ("BIAS_POINTER",) if with_bias else ())
            self.built[index] = True
        return self.gemms[index]


def _forward(x: Tensor, weight: Tensor, bias: Tensor | None, activation: str, keep_aux: bool, step: Step,
             stream: int):
    out = x.new_empty_strided(step.out_shape, step.out_strides)
    vectors: tuple[int, ...]
    if keep_aux:
        aux = x.new_empty_strided(step.aux_shape, step.aux_strides, dtype=step.aux_dtype)
        vectors = (bias.data_ptr(), aux.data_ptr()) if bias is not None else (aux.data_ptr(),)
    else:
        aux = None
        vectors = (bias.data_ptr(),) if bias is not None else ()
    _launch_forward(step, x.data_ptr(), weight.data_ptr(), out.data_ptr(), stream, vectors)
    return out, aux


def _launch_forward(step: Step, x: int, weight: int, out: int, stream: int, vectors: tuple[int, ...]) -> None:
    # a step whose forward cannot be bound is never run
    gemm: _bound.Bound = step.gemms[0]  # type: ignore[assignment]
    if step.transposed:  # D = W Xᵀ
        gemm(weight, x, out, stream, *vectors)
    else:  # D = X Wᵀ
        gemm(x, weight, out, stream)


def _row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, stride = [], 1
    for extent in reversed(shape):
        strides.append(stride)
        stride *= max(extent, 1)
    return tuple(reversed(strides))


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, activation, keep_aux, step, _ = inputs
    out, aux = output
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(aux) if aux is not None else None
    ctx.save_for_backward(x, weight, out if activation == "relu" else None, aux)
    ctx.activation, ctx.has_bias, ctx.step = activation, bias is not None, step


def _derivative(grad: Tensor, ctx, out: Tensor | None, aux: Tensor | None) -> Tensor:
    """dZ = dY ⊙ act′, channels-last: from the output for ReLU, the kept pre-activation for GELU."""
    activation = ctx.activation
    if activation == "relu":
        dz = torch.ops.aten.threshold_backward(grad, out, 0)
    elif activation == "gelu":
        n, o, h, w = ctx.step.out_shape
        kept = cast(Tensor, aux)  # a GELU forward under autograd keeps its pre-activation
        ld = kept.shape[0]
        pre = kept.as_strided((n, o, h, w), (h * w * ld, 1, w * ld, ld))
        dz = torch.ops.aten.gelu_backward(grad, pre, approximate="tanh")
    else:
        return grad
    return dz if dz.is_contiguous(memory_format=torch.channels_last) else \
        dz.contiguous(memory_format=torch.channels_last)


def _as_op(ctx, grad_out: Tensor, x: Tensor, weight: Tensor, out: Tensor | None, aux: Tensor | None,
           bias_grad: bool) -> tuple:
    """The backward as ``nvblaslt::conv2d_backward`` computes it (its ``matmul()`` calls)."""
    needs = ctx.needs_input_grad
    dx, dw, db = torch.ops.nvblaslt.conv2d_backward(grad_out, x, weight, out, aux if aux is not None else unused(x),
                                                    ctx.activation, bias_grad,
                                                    [1, 1], [0, 0], [1, 1], needs[0], needs[1])
    return dx if needs[0] else None, dw if needs[1] else None, db if bias_grad else None, None, None, None, None


def _backward(ctx, grad_out: Tensor | None, grad_aux=None):
    if grad_out is None:
        return (None,) * 7
    x, weight, out, aux = ctx.saved_tensors
    needs = ctx.needs_input_grad
    bias_grad = ctx.has_bias and needs[2]
    if torch.is_grad_enabled():  # create_graph: the op's backward, which says it has no derivative of its own
        return _as_op(ctx, grad_out, x, weight, out, aux, bias_grad)
    step = ctx.step
    grad = grad_out if grad_out.is_contiguous(memory_format=torch.channels_last) else \
        grad_out.contiguous(memory_format=torch.channels_last)
    dz = _derivative(grad, ctx, out, aux)
    if dz.data_ptr() & 255:  # a gradient at an offset (a slice of a cat): the plans assume 256-byte alignment
        return _as_op(ctx, grad_out, x, weight, out, aux, bias_grad)
    weight_gemm = step.backward_gemm(2 if bias_grad else 1, x, weight, dz) if needs[1] else None
    input_gemm = step.backward_gemm(3, x, weight, dz) if needs[0] else None
    if (needs[1] and weight_gemm is None) or (needs[0] and input_gemm is None):
        return _as_op(ctx, grad_out, x, weight, out, aux, bias_grad)
    stream = _current_stream(x.get_device())  # autograd runs it on the forward's stream (a capture's, in one)
    dx = dw = db = None
    if weight_gemm is not None:
        dw = weight.new_empty_strided(weight.shape, weight.stride())
        if bias_grad:
            db = weight.new_empty((weight.shape[0],))
            weight_gemm(x.data_ptr(), dz.data_ptr(), dw.data_ptr(), stream, db.data_ptr())
        else:
            weight_gemm(x.data_ptr(), dz.data_ptr(), dw.data_ptr(), stream)
    elif bias_grad:
        db = dz.sum((0, 2, 3))
    if input_gemm is not None:
        dx = x.new_empty_strided(x.shape, step.x_strides)
        input_gemm(weight.data_ptr(), dz.data_ptr(), dx.data_ptr(), stream)
    return dx, dw, db, None, None, None, None


_PointwiseConv = autograd_function("PointwiseConv2d", _forward, _setup_context, _backward)


def conv(x: Tensor, weight: Tensor, bias: Tensor | None, activation: str, grad: bool) -> Tensor | None:
    """The pointwise step of checked plain CUDA tensors (x channels-last; weight and bias of its dtype and
    device), recorded by autograd when ``grad``; None where it cannot run bound (see ``_bound_step``): the
    caller then runs the ops' path, which says what is wrong where anything is."""
    keep_aux = grad and activation == "gelu"
    found = _bound_step(x, weight, bias, activation, keep_aux)
    if found is None:
        return None
    step, stream = found
    if grad:
        return _PointwiseConv.apply(x, weight, bias, activation, keep_aux, step, stream)[0]
    return _forward(x, weight, bias, activation, False, step, stream)[0]


def inference(x: Tensor, weight: Tensor, bias: Tensor | None, activation: str) -> Tensor | None:
    """act(x Wᵀ + b), (M, O) row-major, for a row-major x (M, C) no backward pass will follow (a linear
    layer's, or a convolution's im2col columns), on a bound GEMM; None where it cannot run bound."""
    if x.stride() != (x.shape[1], 1):
        return None
    found = _bound_step(x, weight, bias, activation, False)
    if found is None:
        return None
    step, stream = found
    return _forward(x, weight, bias, activation, False, step, stream)[0]


def linear_inference(key: tuple, x: Tensor, weight: Tensor, bias: Tensor | None,
                     x_device: torch.device) -> Tensor | None:
    """``linear()``'s fast path without a gradient: act(x Wᵀ + b) in x's leading shape, on the step
    ``first_linear_inference`` kept under ``key`` (what of the call decides its path, checked on that
    first call: shapes, dtypes, devices, contiguity, activation). What the key cannot prove is checked
    here: x on CUDA (``x_device``, x's), the current stream and device, no lazy negation (a neg-bit view),
    256-byte aligned pointers, no ``autotune()`` or ``invariant()`` context, a graph capture. None where the
    step is not found or cannot run: the checked path. One frame: the launch is inlined (``_launch_forward``),
    and a linear step is transposed exactly where it has a bias (no aux kept: D = W Xᵀ with the bias along
    D's rows)."""
    if x_device.type != "cuda" or _raw_stream is None or contexts_open():
        return None
    device: int = x_device.index  # a CUDA device has an index
    stream = _raw_stream(device)
    step = _bound.find(key, stream)
    if step is None:
        return None
    gemm: _bound.Bound | None = step.gemms[0]
    if gemm is None:  # kept, but its forward could not be bound (see _bound.bind): the checked path
        return None
    several = _several if _several is not None else _several_devices()
    if several and torch.cuda.current_device() != device:
        return None
    if x.is_neg() or weight.is_neg() or (bias is not None and bias.is_neg()):
        return None  # a lazy negation: its memory holds the values unnegated (the checked path refuses it)
    x_pointer, weight_pointer = x.data_ptr(), weight.data_ptr()
    if bias is None:
        if (x_pointer | weight_pointer) & 255:
            return None
        bias_pointer = 0
    else:
        bias_pointer = bias.data_ptr()
        if (x_pointer | weight_pointer | bias_pointer) & 255:
            return None
    if not step.captured and _capturing():
        step.mark_captured()  # a replay reads its workspace: never dropped
    out = x.new_empty_strided(step.out_shape, step.out_strides)
    if bias is None:  # D = X Wᵀ
        gemm(x_pointer, weight_pointer, out.data_ptr(), stream)
    else:  # D = W Xᵀ
        gemm(weight_pointer, x_pointer, out.data_ptr(), stream, bias_pointer)
    return out


def first_linear_inference(key: tuple, x: Tensor, weight: Tensor, bias: Tensor | None,
                           activation: str) -> Tensor | None:
    """``linear_inference``'s first call for ``key``, on a contiguous CUDA x (…, C) and weight and bias
    ``linear()`` has checked: its step made where it can run bound (see ``_bound_step``), kept under
    ``key``, and run; None where it cannot run bound."""
    x2 = x.view(-1, x.shape[-1])
    out_shape = None if x.dim() == 2 else (*x.shape[:-1], weight.shape[0])
    found = _bound_step(x2, weight, bias, activation, False, key, out_shape)
    if found is None:
        return None
    step, stream = found
    return _forward(x2, weight, bias, activation, False, step, stream)[0]


def _bound_step(x: Tensor, weight: Tensor, bias: Tensor | None, activation: str, keep_aux: bool,
                linear_key: tuple | None = None, out_shape: tuple[int, ...] | None = None) -> tuple[Step, int] | None:
    """(this layer shape's step, the current stream), or None where the plans would not be the ones
    ``_gemms`` runs (inside ``autotune()`` or ``invariant()``), or where a GEMM cannot run bound: an empty
    operand, a lazy negation, another dtype, a weight or bias laid out otherwise, a pointer aligned to less
    than 256 bytes, another current device, a first call inside a graph capture."""
    if x.dtype not in DTYPES or _raw_stream is None or contexts_open() \
            or x.numel() == 0 or weight.numel() == 0:  # nothing to multiply: _gemms' torch ops
        return None
    if not weight.is_contiguous() or (bias is not None and bias.stride()[0] != 1 and bias.shape[0] > 1):
        return None
    if x.is_neg() or weight.is_neg() or (bias is not None and bias.is_neg()):
        return None  # a lazy negation: a GEMM on its memory would miss the sign (matmul() refuses it by name)
    if (x.data_ptr() | weight.data_ptr() | (0 if bias is None else bias.data_ptr())) & 255:
        return None
    device = x.get_device()
    if _several_devices() and torch.cuda.current_device() != device:
        return None
    stream = _current_stream(device)
    key = linear_key if linear_key is not None else \
        (x.shape, x.dtype, device, weight.shape[0], bias is None, activation, keep_aux)
    step = _bound.step(key, stream, lambda: Step(x, weight, bias, activation, keep_aux, stream, out_shape))
    if step is None or step.gemms[0] is None:
        return None
    if not step.captured and _capturing():
        step.mark_captured()  # a replay reads its workspace: never dropped
    return step, stream


_several: bool | None = None  # more than one GPU visible, read on first use (not at import)


def _several_devices() -> bool:
    global _several
    if _several is None:
        _several = torch.cuda.device_count() > 1
    return _several
