"""PyTorch as a first-class user: a fused ``Linear`` (+ bias, + ReLU or tanh-GELU) that trains.

``linear(x, weight, bias=None, activation=None)`` is ``nn.functional.linear`` followed by the
activation, as one cuBLASLt call; ``FusedLinear`` is the ``nn.Module`` with ``nn.Linear``'s
parameters, init and ``state_dict`` keys; ``fuse(model)`` turns ``nn.Sequential(Linear, ReLU, …)``
stacks into a ``FusedSequential`` of them. Both are torch custom ops (``torch.ops.nvblaslt.linear``
and ``linear_backward``) with fake implementations and a registered autograd formula, so they work
under ``torch.compile(fullgraph=True)``, in CUDA graphs and with ``gradcheck``. On CUDA the GEMMs
are nvblaslt's; on any other device the same math runs as torch ops.

How one layer y = act(x Wᵀ + b) maps onto cuBLASLt, for x (T, in), W (out, in):

- forward: D = W @ xᵀ is (out, T) column-major, the same memory as y (T, out) row-major, and the
  bias runs along D's rows as the epilogs need: RELU_BIAS, or GELU_AUX_BIAS keeping the GELU
  pre-activation for the backward pass (RELU_AUX_BIAS, keeping the ReLU bitmask, when the next
  layer's GEMM takes the ReLU's backward).
- backward, weight and bias: dW = dzᵀ x as D = xᵀ @ dz, (in, out) column-major = dW row-major;
  BGRADB (B = dz row-major, summed over T) gives the bias gradient in the same call.
- backward, input: dx = dz W as D = Wᵀ @ dzᵀ, (in, T) column-major = dx row-major.

Across two layers of a ``FusedSequential`` the activation's backward can move into the next layer's
input-gradient GEMM: DRELU / DGELU with the previous layer's aux (the ReLU bitmask, the GELU
pre-activation) give the gradient w.r.t. its pre-activation, and DRELU_BGRAD / DGELU_BGRAD its bias
gradient in the same call (``backward=`` chooses; by default what measured fastest: see
``FusedSequential``). The gradient travels on a *link*: each linked layer also returns ``link``
(T, out) and ``link_bias`` (out,), zero tensors of zero strides (one element of memory) standing for
``z - stopgrad(z)``. The next layer reads x's value but declares its dependence through the
link, so autograd stays exact even when the activation output has other consumers (their
gradient arrives on the output and goes through the activation's derivative as torch ops).

GELU here is cuBLASLt's tanh form; exact (erf) GELU is refused, never approximated.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import cast

import torch
from torch import Tensor, nn

from . import CublasLtError, Matmul, MatmulEpilog, NvblasltTypeError, NvblasltValueError, matmul

__all__ = ["FusedLinear", "FusedSequential", "autotune", "fuse", "linear"]

# ---- activations ------------------------------------------------------------------------------------

_ALIASES = {None: "none", "none": "none", "identity": "none", "relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu"}
_EXACT_GELU = ("gelu_erf", "gelu_exact", "gelu_none", "exact_gelu")
_EXACT_GELU_HINT = ("cuBLASLt fuses only the tanh approximation of GELU; use activation='gelu' "
                    "(nn.GELU(approximate='tanh')) or keep the exact GELU outside the fused layer")


def _activation(value, argument: str = "activation") -> str:
    """The canonical name of an activation: 'none', 'relu' or 'gelu' (tanh form)."""
    key = value.lower() if isinstance(value, str) else value
    if key in _EXACT_GELU:
        raise NvblasltValueError(f"{argument}: {value!r} asks for exact (erf) GELU; {_EXACT_GELU_HINT}")
    try:
        return _ALIASES[key]
    except (KeyError, TypeError):
        raise NvblasltValueError(f"{argument}: expected None, 'relu' or 'gelu' (the tanh form), got {value!r}") from None


# ---- layouts shared by every implementation and the fake one ------------------------------------------

def _relu_aux_ld_bytes(features) -> int:
    return -(-features // 128) * 16  # cuBLASLt: a multiple of 128 bits


def _gelu_aux_ld(features) -> int:
    return -(-features // 8) * 8  # cuBLASLt: a multiple of 8 elements


def _aux_layout(activation: str, keep_aux: bool, tokens, features) -> tuple[tuple, tuple, bool]:
    """(shape, strides, is_bitmask) of the aux the forward keeps: what cuBLASLt returns for D
    (features, tokens): the ReLU bitmask (int8, leading dimension a multiple of 128 bits) or the
    GELU pre-activation (leading dimension a multiple of 8), column-major. Empty otherwise."""
    if not keep_aux or activation == "none":
        return (0,), (1,), activation == "relu"
    ld = _relu_aux_ld_bytes(features) if activation == "relu" else _gelu_aux_ld(features)
    return (ld, tokens), (1, ld), activation == "relu"


def _empty_aux(x: Tensor, activation: str, keep_aux: bool, features) -> Tensor:
    shape, strides, bitmask = _aux_layout(activation, keep_aux, x.shape[0], features)
    return x.new_empty_strided(shape, strides, dtype=torch.int8 if bitmask else x.dtype)


def _links(x: Tensor, features, keep_aux: bool, real: bool = True) -> tuple[Tensor, Tensor]:
    """(link, link_bias): zeros of shapes (T, features) and (features,) with zero strides (one element of
    memory each) when the forward keeps its aux for a backward pass, else empty. Their values are never
    read; their gradients are what matters (see the module docstring)."""
    if not keep_aux:
        return x.new_empty(0), x.new_empty(0)
    if not real:
        return x.new_empty_strided((x.shape[0], features), (0, 0)), x.new_empty_strided((features,), (0,))
    return _own(x.new_zeros((1, 1)).expand(x.shape[0], features)), _own(x.new_zeros(1).expand(features))


def _own(t: Tensor) -> Tensor:
    """``t``, or a tensor sharing its memory that is not a view. A custom op's outputs must not be views:
    autograd forbids in-place ops on views made inside a custom Function (``y += r`` would fail)."""
    if t._base is None:
        return t
    return t.new_empty(0).set_(t.untyped_storage(), t.storage_offset(), t.shape, t.stride())


def _row_major(t: Tensor) -> Tensor:
    """``t`` as a contiguous (row-major) tensor that is not a view; copies only when ``t`` is laid out otherwise."""
    return _own(t) if t.is_contiguous() else t.contiguous()


def _unused(x: Tensor) -> Tensor:
    return x.new_empty(0)


# ---- the same math as torch ops: CPU (and every non-CUDA device), and float64 where cuBLASLt refuses ----

def _activate(z: Tensor, activation: str) -> Tensor:
    if activation == "relu":
        return torch.relu(z)
    if activation == "gelu":
        return nn.functional.gelu(z, approximate="tanh")
    return z


def _pack_relu_mask(positive: Tensor, aux: Tensor) -> None:
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


def _forward_composite(x, weight, bias, activation, keep_aux):
    z = torch.addmm(bias, x, weight.t()) if bias is not None else torch.mm(x, weight.t())
    out = _activate(z, activation)
    aux = _empty_aux(x, activation, keep_aux, weight.shape[0])
    if aux.numel():
        if activation == "relu":
            _pack_relu_mask(z > 0, aux)
        else:
            aux.zero_()
            aux[: z.shape[1]].copy_(z.T)
    return out, aux


def _gelu_input(aux: Tensor, features: int) -> Tensor:
    """The pre-activation z (T, features) inside a GELU aux (ld, T)."""
    return aux[:features].T


def _activation_backward(grad: Tensor, activation: str, out, aux, features: int) -> Tensor:
    """grad ⊙ act'(z), from what the forward kept: the output for ReLU (z > 0 ⇔ out > 0), the aux for GELU."""
    if activation == "relu":
        return torch.ops.aten.threshold_backward(grad, out, 0)
    if activation == "gelu":
        return torch.ops.aten.gelu_backward(grad, _gelu_input(aux, features), approximate="tanh")
    return grad


def _weight_grad_composite(x, dz, bias_grad):
    dw = torch.mm(dz.t(), x)
    return dw, (dz.sum(0) if bias_grad else None)


def _input_grad_composite(weight, dz, prev_activation, x, prev_aux, prev_bias_grad):
    dx = torch.mm(dz, weight)
    dx = _activation_backward(dx, prev_activation, x, prev_aux, x.shape[1])
    return dx, (dx.sum(0) if prev_bias_grad else None)


# ---- CUDA: nvblaslt ----------------------------------------------------------------------------------

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
# float64 epilogs this process's cuBLASLt refused: those steps run as torch ops (see _fp64_refuses).
_refused_fp64: set[MatmulEpilog] = set()


_tuning: dict | None = None  # the active autotune() context's settings


@contextlib.contextmanager
def autotune(*, iterations: int = 5):
    """Search every GEMM the fused layers run inside this context (``Matmul.autotune(search=True)``:
    the heuristics' list and configurations beyond it, and for DRELU_BGRAD / DGELU_BGRAD the two-call
    form) and remember the winners on disk, so that later plans of the same problems start from them.
    Each distinct problem is searched once per context (layers of one shape share the winner).

    Run one training step inside it before the first ordinary step: the GEMMs run as usual, only
    slower. Plans that ``nvblaslt.matmul`` has already cached (per thread, the autograd engine's
    included) are not revisited; a new process picks the winners up. It matters: on the bench's MLP
    (H200, bf16, 8192 tokens) the heuristics' first picks leave the fused step 1.05× (ReLU) / 1.09×
    (GELU) the GEMM-only floor, searched plans 1.01× / 1.03× (``python -m nvblaslt._bench_mlp --search``)."""
    global _tuning
    previous, _tuning = _tuning, {"iterations": iterations, "searched": set()}
    try:
        yield
    finally:
        _tuning = previous


def _problem_key(a: Tensor, b: Tensor, epilog: MatmulEpilog, inputs: dict | None) -> tuple:
    tensors = (a, b, *(inputs or {}).values())
    return epilog, tuple((t.shape, t.stride(), t.dtype, t.device) for t in tensors), tuple(inputs or ())


def _gemm(a: Tensor, b: Tensor, epilog: MatmulEpilog = _E.DEFAULT, inputs: dict | None = None):
    """(D, aux dict or None) of nvblaslt's function form: plans cached per thread, current torch stream."""
    tuning = _tuning
    if tuning is not None and _problem_key(a, b, epilog, inputs) not in tuning["searched"]:
        tuning["searched"].add(_problem_key(a, b, epilog, inputs))
        with Matmul(a, b) as plan:
            plan.plan(epilog=epilog, epilog_inputs=inputs)
            plan.autotune(iterations=tuning["iterations"], search=True)
            result = plan.execute()
    else:
        result = matmul(a, b, epilog=epilog, epilog_inputs=inputs)
    return result if isinstance(result, tuple) else (result, None)


def _fp64_refuses(dtype: torch.dtype, epilog: MatmulEpilog, error: CublasLtError | None = None) -> bool:
    """Whether to run this step as torch ops. Only float64 falls back, and only where cuBLASLt has no
    kernel (CUBLAS_STATUS_NOT_SUPPORTED); every other error propagates."""
    if dtype != torch.float64:
        return False
    if error is None:
        return epilog in _refused_fp64
    if error.status_name != "CUBLAS_STATUS_NOT_SUPPORTED":
        return False
    _refused_fp64.add(epilog)
    return True


def _forward_cuda(x, weight, bias, activation, keep_aux):
    tokens, features = x.shape[0], weight.shape[0]
    epilog = _FORWARD_EPILOGS[activation, bias is not None, keep_aux and activation != "none"]
    if x.numel() == 0 or features == 0 or _fp64_refuses(x.dtype, epilog):
        return _forward_composite(x, weight, bias, activation, keep_aux)
    x, weight = x.detach(), weight.detach()  # DLPack refuses tensors that require grad
    try:
        if bias is None and epilog in (_E.DEFAULT, _E.RELU, _E.GELU):
            d, extra = _gemm(x, weight.T, epilog)  # elementwise epilog: either orientation; this one is y itself
            out = _row_major(d)
        else:  # the bias runs along D's rows: D = W xᵀ is (features, tokens)
            d, extra = _gemm(weight, x.T, epilog, None if bias is None else {"bias": bias.detach()})
            out = _row_major(d.T)
    except CublasLtError as error:
        if _fp64_refuses(x.dtype, epilog, error):
            return _forward_composite(x, weight, bias, activation, keep_aux)
        raise
    if not extra:
        return out, _empty_aux(x, activation, keep_aux, features)
    aux = next(iter(extra.values()))
    if aux.dtype != torch.int8 and activation == "relu":
        aux = aux.view(torch.int8)  # nvmath-python returns the bitmask as uint8
    expected = _empty_aux(x, activation, keep_aux, features) if aux.stride() != (1, aux.shape[0]) else None
    if expected is not None:  # another layout than cuBLASLt's own: keep ours, which the fake impl promises
        aux = expected.copy_(aux)
    return out, _own(aux)


def _weight_grad_cuda(x, dz, bias_grad):
    epilog = _E.BGRADB if bias_grad else _E.DEFAULT
    if not _fp64_refuses(x.dtype, epilog):
        try:
            d, extra = _gemm(x.detach().T, dz, epilog)  # B = dz row-major: what BGRADB has kernels for
            return _row_major(d.T), (_own(extra["bgradb"].reshape(-1)) if bias_grad else None)
        except CublasLtError as error:
            if not _fp64_refuses(x.dtype, epilog, error):
                raise
    return _weight_grad_composite(x, dz, bias_grad)


def _input_grad_cuda(weight, dz, prev_activation, x, prev_aux, prev_bias_grad):
    weight = weight.detach()
    if prev_activation == "none":
        epilog, aux_key, bias_key, inputs = _E.DEFAULT, None, None, None
    else:
        epilog, aux_key, bias_key = _INPUT_GRAD_EPILOGS[prev_activation, prev_bias_grad]
        inputs = {aux_key: prev_aux}
    # cuBLASLt reads out of bounds for aux epilogs with K = 1; nvblaslt refuses them
    if not (aux_key and weight.shape[0] == 1) and not _fp64_refuses(dz.dtype, epilog):
        try:
            d, extra = _gemm(weight.T, dz.T, epilog, inputs)  # A = Wᵀ column-major
            dx = _row_major(d.T)
            if bias_key:
                return dx, _own(extra[bias_key].reshape(-1))
            return dx, (dx.sum(0) if prev_bias_grad else None)
        except CublasLtError as error:
            if not _fp64_refuses(dz.dtype, epilog, error):
                raise
    return _input_grad_composite(weight, dz, prev_activation, x, prev_aux, prev_bias_grad)


# ---- the custom ops ----------------------------------------------------------------------------------

_LINEAR_SCHEMA = ("(Tensor x, Tensor weight, Tensor? bias, str activation, bool keep_aux, Tensor? prev_aux, "
                  "str prev_activation, Tensor? link, Tensor? link_bias) -> (Tensor, Tensor, Tensor, Tensor)")
_BACKWARD_SCHEMA = ("(Tensor? grad_out, Tensor? grad_link, Tensor x, Tensor weight, Tensor? out, Tensor aux, "
                    "str activation, bool bias_grad, Tensor? prev_aux, str prev_activation, bool prev_bias_grad, "
                    "bool input_grad, bool weight_grad) -> (Tensor, Tensor, Tensor, Tensor)")


def _uses_cublaslt(x: Tensor) -> bool:
    """CUDA tensors go to nvblaslt; every other device runs the same math as torch ops."""
    return x.is_cuda


@torch.library.custom_op("nvblaslt::linear", mutates_args=(), schema=_LINEAR_SCHEMA)
def _linear_op(x, weight, bias, activation, keep_aux, prev_aux, prev_activation, link, link_bias):
    """(out, aux, link, link_bias) for a 2-D x; ``prev_*`` and the links only carry the backward pass."""
    forward = _forward_cuda if _uses_cublaslt(x) else _forward_composite
    out, aux = forward(x, weight, bias, activation, keep_aux)
    return out, aux, *_links(x, weight.shape[0], keep_aux and activation != "none")


@_linear_op.register_fake
def _linear_fake(x, weight, bias, activation, keep_aux, prev_aux, prev_activation, link, link_bias):
    features = weight.shape[0]
    return (x.new_empty((x.shape[0], features)), _empty_aux(x, activation, keep_aux, features),
            *_links(x, features, keep_aux and activation != "none", real=False))


def _backward(grad_out, grad_link, x, weight, out, aux, activation, bias_grad, prev_aux, prev_activation,
              prev_bias_grad, input_grad, weight_grad, *, cuda: bool):
    """The backward pass of one layer; the GEMMs are nvblaslt's (``cuda``) or torch's."""
    features = weight.shape[0]
    parts = []
    if grad_out is not None:
        parts.append(_activation_backward(grad_out, activation, out, aux, features))
    if grad_link is not None:
        parts.append(grad_link)
    dz = parts[0] if len(parts) == 1 else (parts[0] + parts[1] if parts else x.new_zeros((x.shape[0], features)))
    dz = dz.contiguous()
    weight_grad_fn, input_grad_fn = ((_weight_grad_cuda, _input_grad_cuda) if cuda else
                                     (_weight_grad_composite, _input_grad_composite))
    dw = db = dx = dprev_b = None
    if weight_grad:
        dw, db = weight_grad_fn(x, dz, bias_grad)
    elif bias_grad:
        db = dz.sum(0)
    if input_grad:
        dx, dprev_b = input_grad_fn(weight, dz, prev_activation, x, prev_aux, prev_bias_grad)
    return tuple(_unused(x) if t is None else t for t in (dx, dw, db, dprev_b))


@torch.library.custom_op("nvblaslt::linear_backward", mutates_args=(), schema=_BACKWARD_SCHEMA)
def _linear_backward_op(grad_out, grad_link, x, weight, out, aux, activation, bias_grad, prev_aux,
                        prev_activation, prev_bias_grad, input_grad, weight_grad):
    """(grad_input, grad_weight, grad_bias, grad_prev_bias); empty tensors for what was not asked for.
    grad_input is w.r.t. x, or w.r.t. the previous layer's pre-activation when ``prev_activation`` is set."""
    cuda = _uses_cublaslt(x) and x.numel() > 0 and weight.numel() > 0
    return _backward(grad_out, grad_link, x, weight, out, aux, activation, bias_grad, prev_aux, prev_activation,
                     prev_bias_grad, input_grad, weight_grad, cuda=cuda)


@_linear_backward_op.register_fake
def _linear_backward_fake(grad_out, grad_link, x, weight, out, aux, activation, bias_grad, prev_aux,
                          prev_activation, prev_bias_grad, input_grad, weight_grad):
    unused = _unused(x)
    tokens, features, inputs = x.shape[0], weight.shape[0], x.shape[1]
    return (x.new_empty((tokens, inputs)) if input_grad else unused,
            x.new_empty((features, inputs)) if weight_grad else unused,
            x.new_empty((features,)) if bias_grad else unused,
            x.new_empty((inputs,)) if input_grad and prev_bias_grad else unused)


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
    dx, dw, db, dprev_b = torch.ops.nvblaslt.linear_backward(
        grad_out, grad_link, x, weight, out, aux, ctx.activation, bias_grad, prev_aux, ctx.prev_activation,
        prev_bias_grad, input_grad, needs[_WEIGHT])
    grads = [None] * 9
    grads[_LINK if ctx.linked else _X] = dx if input_grad else None
    grads[_WEIGHT] = dw if needs[_WEIGHT] else None
    grads[_BIAS] = db if bias_grad else grad_bias
    grads[_LINK_BIAS] = dprev_b if prev_bias_grad else None
    return tuple(grads)


_linear_op.register_autograd(_linear_autograd, setup_context=_setup_context)


# ---- the public functions and modules ------------------------------------------------------------------

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check(x: Tensor, weight: Tensor, bias: Tensor | None) -> None:
    if not isinstance(x, Tensor):
        raise NvblasltTypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if not isinstance(weight, Tensor) or weight.dim() != 2:
        raise NvblasltValueError(f"weight: expected a 2-D (out_features, in_features) tensor, got "
                                 f"{getattr(weight, 'shape', type(weight).__name__)}")
    if x.dim() == 0 or x.shape[-1] != weight.shape[1]:
        raise NvblasltValueError(f"x: expected shape (…, {weight.shape[1]}) to match weight's in_features, "
                                 f"got {tuple(x.shape)}")
    if x.dtype not in _FLOATS:
        raise NvblasltTypeError(f"x: expected float16, bfloat16, float32 or float64, got {x.dtype}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        if t.dtype != x.dtype:
            raise NvblasltTypeError(f"{name}: expected dtype {x.dtype} (x's), got {t.dtype}")
        if t.device != x.device:
            raise NvblasltValueError(f"{name}: on {t.device}, but x is on {x.device}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise NvblasltValueError(f"bias: expected shape ({weight.shape[0]},), got {tuple(bias.shape)}")


def _autocast(x, weight, bias):
    """Cast as autocast casts nn.Linear's inputs, when it is on for x's device."""
    device = getattr(x, "device", None)
    if device is None or not torch.is_autocast_enabled(device.type):
        return x, weight, bias
    device = device.type
    dtype = torch.get_autocast_dtype(device)
    return x.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype)


def _wants_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _layer(x2, weight, bias, activation, state, chain=None):
    """One layer on 2-D x; ``state`` is the previous layer's (activation, aux, link, link_bias) or None.
    ``chain``: where this layer's activation backward runs — None: in its own backward, as torch ops on
    its output (ReLU) or kept pre-activation (GELU); ``"epilog"`` / ``"bgradb"``: in the next layer's
    input-gradient GEMM (DRELU_BGRAD / DGELU_BGRAD, or DRELU / DGELU with BGRADB here for the bias
    gradient), through the link this layer returns. Returns (out, state for the next layer)."""
    grad = _wants_grad(x2, weight, bias, *(state[2:] if state else ()))
    linked = grad and activation != "none" and chain is not None
    keep_aux = linked or (grad and activation == "gelu")  # ReLU's own backward reads its output instead
    prev_activation, prev_aux, link, link_bias = state if state is not None else ("none", None, None, None)
    out, aux, out_link, out_link_bias = torch.ops.nvblaslt.linear(
        x2, weight, bias, activation, keep_aux, prev_aux, prev_activation, link, link_bias)
    if not linked:
        return out, None
    return out, (activation, aux, out_link, out_link_bias if bias is not None and chain == "epilog" else None)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, activation: str | None = None) -> Tensor:
    """``activation(x @ weight.T + bias)`` as one fused cuBLASLt call on CUDA, autograd-aware.

    ``x`` is (…, in_features), ``weight`` (out_features, in_features), ``bias`` (out_features,),
    all of one dtype (float16, bfloat16, float32, float64). ``activation``: None, ``"relu"`` or
    ``"gelu"`` — the tanh approximation, which cuBLASLt fuses; exact GELU (``"gelu_erf"``) is
    refused with NvblasltValueError. The backward pass runs the activation's derivative as a torch op
    and BGRADB for the bias gradient; a ``FusedSequential`` can also move the activation's backward
    into the next layer's GEMM."""
    activation = _activation(activation)
    x, weight, bias = _autocast(x, weight, bias)
    _check(x, weight, bias)
    lead = x.shape[:-1]
    out, _ = _layer(x.reshape(-1, x.shape[-1]).contiguous(), weight, bias, activation, None)
    return out.reshape(*lead, weight.shape[0])


class FusedLinear(nn.Module):
    """``nn.Linear`` followed by an activation, fused: the same parameters (``weight``, ``bias``), init
    and ``state_dict`` keys as ``nn.Linear(in_features, out_features, bias)``, so its checkpoints load.

    ``activation``: None, ``"relu"`` or ``"gelu"`` (tanh form). Inputs of any leading shape."""

    __constants__ = ["in_features", "out_features", "activation"]
    in_features: int
    out_features: int
    weight: Tensor
    bias: Tensor | None

    def __init__(self, in_features: int, out_features: int, bias: bool = True, activation: str | None = None,
                 device=None, dtype=None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.in_features, self.out_features = in_features, out_features
        self.activation = _activation(activation)
        self.weight = nn.Parameter(torch.empty((out_features, in_features), **factory))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, **factory))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``nn.Linear``'s init, drawing the same random numbers."""
        nn.Linear.reset_parameters(cast(nn.Linear, self))

    @classmethod
    def from_linear(cls, linear: nn.Linear, activation: str | None = None) -> FusedLinear:
        """A FusedLinear sharing ``linear``'s parameters (not copies: optimizers holding them still work)."""
        fused = cls.__new__(cls)
        nn.Module.__init__(fused)
        fused.in_features, fused.out_features = linear.in_features, linear.out_features
        fused.activation = _activation(activation)
        fused.weight = linear.weight
        fused.bias = linear.bias
        fused.train(linear.training)
        return fused

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias, self.activation)

    def _chain(self, x2: Tensor, state, backward: str):
        """forward on 2-D x, taking and giving the link state a FusedSequential threads through."""
        x2, weight, bias = _autocast(x2, self.weight, self.bias)
        _check(x2, weight, bias)
        chain = _AUTO_BACKWARD[self.activation] if backward == "auto" else None if backward == "unfused" else backward
        return _layer(x2, weight, bias, self.activation, state, chain)

    def extra_repr(self) -> str:
        text = f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
        return text + (f", activation={self.activation!r}" if self.activation != "none" else "")


BACKWARDS = ("auto", "unfused", "bgradb", "epilog")
# What "auto" picks, from the training-step bench (H200, cuBLASLt 13.1, bf16, 8192 tokens, widths 4096/16384):
# cuBLASLt runs DRELU, DRELU_BGRAD and DGELU_BGRAD there as the GEMM plus a separate epilogue kernel
# (0.2-0.75 ms a call, slower than torch's threshold_backward or a row sum), while DGELU is fused into the
# GEMM (+2-5 %) and BGRADB costs nothing or one short reduction kernel.
_AUTO_BACKWARD = {"none": None, "relu": None, "gelu": "bgradb"}


class FusedSequential(nn.Sequential):
    """``nn.Sequential`` that can fuse across consecutive ``FusedLinear`` layers (``nn.Identity`` between
    them is skipped): a layer's activation backward can run in the next layer's input-gradient GEMM.
    Any other module in between ends the chain.

    ``backward``: where each layer's activation backward and bias gradient are computed —
    ``"epilog"``: DRELU_BGRAD / DGELU_BGRAD in the next layer's input-gradient GEMM, one call for both;
    ``"bgradb"``: DRELU / DGELU there, the bias gradient by BGRADB in the layer's own weight-gradient GEMM;
    ``"unfused"``: the activation backward as a torch op in the layer's own backward (ReLU from its
    output, no bitmask kept), then BGRADB, as a standalone ``FusedLinear`` does;
    ``"auto"`` (default): ``"unfused"`` for ReLU and ``"bgradb"`` for GELU, the fastest measured
    (H200, cuBLASLt 13.1: see ``python -m nvblaslt._bench_mlp``). The results agree to rounding."""

    def __init__(self, *args, backward: str = "auto"):
        super().__init__(*args)
        self.backward = backward

    @property
    def backward(self) -> str:
        return self._backward

    @backward.setter
    def backward(self, value: str) -> None:
        if value not in BACKWARDS:
            raise NvblasltValueError(f"backward: expected one of {BACKWARDS}, got {value!r}")
        self._backward = value

    def forward(self, x: Tensor) -> Tensor:
        state = None  # the previous FusedLinear's link, while the chain lasts
        lead = None  # x's leading shape while x is held flattened to 2-D
        for module in self:
            if isinstance(module, FusedLinear):
                if lead is None:
                    lead = x.shape[:-1]
                    x = x.reshape(-1, x.shape[-1]).contiguous()
                x, state = module._chain(x, state, self._backward)
            elif isinstance(module, nn.Identity):
                continue
            else:
                if lead is not None:
                    x, lead = x.reshape(*lead, x.shape[-1]), None
                state = None
                x = module(x)
        return x if lead is None else x.reshape(*lead, x.shape[-1])


def _activation_of(module: nn.Module, where: str) -> str | None:
    """'relu' / 'gelu' for an activation module fusable after a Linear, None for any other module."""
    if isinstance(module, nn.ReLU):
        return "relu"
    if isinstance(module, nn.GELU):
        if module.approximate == "tanh":
            return "gelu"
        raise NvblasltValueError(f"{where}: nn.GELU(approximate={module.approximate!r}) is exact (erf) GELU; "
                                 f"{_EXACT_GELU_HINT}")
    return None


def fuse(module: nn.Module, *, backward: str = "auto") -> nn.Module:
    """Fused layers in place of ``nn.Linear`` (+ ``nn.ReLU`` / ``nn.GELU(approximate="tanh")``).

    An ``nn.Sequential`` becomes a ``FusedSequential``: each Linear followed by an activation becomes
    one ``FusedLinear`` and the activation's slot an ``nn.Identity``, so ``state_dict`` keys stay those
    of the original. Parameters are shared with ``module``, not copied. Other modules are converted
    in place, child by child, and returned. An exact GELU after a Linear is refused (NvblasltValueError).
    ``backward``: as ``FusedSequential``'s, for every one made."""
    if backward not in BACKWARDS:
        raise NvblasltValueError(f"backward: expected one of {BACKWARDS}, got {backward!r}")
    return _fuse(module, backward, "module")


def _fuse(module: nn.Module, backward: str, where: str) -> nn.Module:
    if isinstance(module, (FusedLinear, FusedSequential)):
        return module
    if isinstance(module, nn.Linear):
        return FusedLinear.from_linear(module)
    if isinstance(module, nn.Sequential):
        items = list(module._modules.items())
        converted: OrderedDict[str, nn.Module] = OrderedDict()
        index = 0
        while index < len(items):
            name, child = items[index]
            if isinstance(child, nn.Linear) and not isinstance(child, FusedLinear):
                activation = None
                if index + 1 < len(items):
                    next_name, next_child = items[index + 1]
                    activation = _activation_of(next_child, f"{where}[{next_name}]")
                converted[name] = FusedLinear.from_linear(child, activation)
                if activation is not None:
                    converted[next_name] = nn.Identity()
                    index += 1
            else:
                converted[name] = _fuse(child, backward, f"{where}[{name}]")
            index += 1
        fused = FusedSequential(converted, backward=backward)
        fused.train(module.training)
        return fused
    for name, child in list(module.named_children()):
        setattr(module, name, _fuse(child, backward, f"{where}.{name}"))
    return module

