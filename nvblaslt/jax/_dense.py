"""``dense``: a stack of Dense + activation layers (flax's kernel (in, out) orientation) as fused GEMMs,
with a backward that runs each activation's derivative inside the next layer's input-gradient GEMM.

How each step maps onto cuBLASLt, for x (T, in), kernel (in, out), all buffers row-major:

- forward: D = kernelᵀ @ xᵀ, (out, T) column-major = y (T, out) row-major; the bias runs along D's
  rows as the epilogs need it (RELU_BIAS / GELU_BIAS; RELU_AUX_BIAS keeping the ReLU bitmask for
  the layer above's backward, GELU_AUX_BIAS keeping the pre-activation).
- weight and bias gradient: D = dzᵀ @ x, (out, in) column-major = dkernel (in, out). Where a fused
  epilog made dz, BGRADA sums dzᵀ over T into the bias gradient in the same call (cuBLASLt's BGRADB of
  the transposed product); where XLA made dz through ReLU's mask (unfused), XLA sums it inside the fusion
  that made it, and the top layer's dy too: on an H200 BGRADA ran as a kernel of its own after this GEMM
  (75 µs at 8192 × 16384), the fused sum cost nothing measurable.
- input gradient: D = kernel @ dzᵀ, (in, T) column-major = dx (T, in); with the layer below's aux,
  DRELU_BGRAD / DGELU_BGRAD turn it into that layer's dz and sum its bias gradient in the same call
  (``backward="epilog"``), or DRELU / DGELU leave the bias sum to that layer's BGRADA ("bgradb"), or
  XLA applies the activation's backward ("unfused"). Below the first layer, dx = dz @ kernelᵀ.

The operands' transposes are flags on XLA's buffers (no copy); the results' transposes cancel
against the ones that make them the caller's arrays.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from .._epilogs import MatmulEpilog
from .._errors import NvblasltTypeError, NvblasltValueError
from ._bridge import vary_alike
from ._gemm import backward_epilog, gemm, keeping_aux
from ._matmul import activation_backward

ACTIVATIONS = ("none", "relu", "gelu")
BACKWARDS = ("auto", "unfused", "bgradb", "epilog")
# What "auto" runs, from python -m nvblaslt.bench.jax (H200, cuBLASLt 13.1, bf16, 8192 tokens, 4096↔16384, tuned
# plans): DRELU_BGRAD and DGELU_BGRAD left the step 1.13× and 1.22× the GEMM-only floor; cuBLASLt runs them as
# the GEMM plus a separate epilogue kernel. ReLU's mask applied by XLA, and DGELU without the bias sum, each with
# the bias gradient from the weight gradient's BGRADA, are the torch layer's choices for the same reason.
AUTO_BACKWARD = {"relu": "unfused", "gelu": "bgradb"}
# Which bias gradients XLA sums (python tools/probe_jax_kernels.py, H200, cuBLASLt 13.1, the bench's step): a dz
# XLA makes through ReLU's mask, in the select's own fusion (no cost measured, against BGRADA's kernel of its own
# after the weight-gradient GEMM, 75–95 µs at 8192 × 16384), and the step's incoming dy (20 µs at 8192 × 4096).
# After GELU's elementwise backward XLA summed in a pass of its own (188 µs), and a GEMM's dz (no activation) would
# need a pass of its own too: BGRADA sums those.


def dense(x, layers, activations, *, backward: str = "auto"):
    """y = actₙ(… act₁(x @ kernel₁ + bias₁) … @ kernelₙ + biasₙ) as one fused GEMM per layer.

    Parameters
    ----------
    x : jax.Array
        (…, in) on a GPU.
    layers : sequence of (kernel, bias)
        kernel (in, out) as flax lays it out; bias (out,) or None.
    activations : str or sequence of str
        "none", "relu" or "gelu" (cuBLASLt's tanh GELU), one per layer or one for all.
    backward : str, default "auto"
        Where each activation's backward and bias gradient run: "epilog" (DRELU_BGRAD / DGELU_BGRAD in
        the next layer's input-gradient GEMM), "bgradb" (DRELU / DGELU there, the bias gradient from the
        weight-gradient GEMM's BGRADA), "unfused" (the activation's backward by XLA; the bias gradient
        summed in the same XLA fusion after ReLU's mask, by BGRADA after GELU's), "auto" (ReLU unfused,
        GELU bgradb: the fastest measured).

    Returns
    -------
    jax.Array
        (…, out) of the last layer. ``jax.grad`` runs the backward described in the module.

    Raises
    ------
    NvblasltValueError
        An unknown activation, or not one per layer; an unknown ``backward``.

    Examples
    --------
    On a GPU:

    .. code-block:: python

        layers = [(w1, b1), (w2, b2)]              # w (in, out), b (out,): flax.linen.Dense's params
        loss = lambda x, layers: (nvblaslt.jax.dense(x, layers, "relu") ** 2).sum()
        grads = jax.jit(jax.grad(loss, argnums=1))(x, layers)   # the ReLU mask and bias sums by XLA
    """
    layers = tuple((kernel, bias) for kernel, bias in layers)
    if isinstance(activations, str):
        activations = (activations,) * len(layers)
    activations = tuple(activations)
    if len(activations) != len(layers) or not layers:
        raise NvblasltValueError(f"activations: expected one per layer ({len(layers)}), got {len(activations)}")
    for activation in activations:
        if activation not in ACTIVATIONS:
            raise NvblasltValueError(f"activations: expected one of {ACTIVATIONS}, got {activation!r}")
    if backward not in BACKWARDS:
        raise NvblasltValueError(f"backward: expected one of {BACKWARDS}, got {backward!r}")
    if not hasattr(x, "shape") or x.ndim < 1:
        raise NvblasltTypeError(f"x: expected an array of shape (…, in), got {type(x).__name__}")
    lead = x.shape[:-1]
    chains = tuple(_chain(backward, activation) for activation in activations)
    # under shard_map, the custom VJP's inputs vary alike, so that its gradients have their inputs' types
    x2, layers = vary_alike((x.reshape((-1, x.shape[-1])), layers))
    y = _stack((activations, chains), x2, layers)
    return y.reshape((*lead, y.shape[-1]))


def _layer_forward(x2, kernel, bias, epilog):
    d, aux = gemm(kernel, x2, epilog=epilog, epilog_inputs=None if bias is None else {"bias": bias},
                  a_transposed=True, b_transposed=True)
    return jnp.swapaxes(d, -1, -2), next(iter(aux.values()), None)


def _plain_epilog(activation: str, bias: bool) -> MatmulEpilog:
    if activation == "none":
        return MatmulEpilog.BIAS if bias else MatmulEpilog.DEFAULT
    return MatmulEpilog.__members__[f"{activation.upper()}{'_BIAS' if bias else ''}"]


def _chain(backward: str, activation: str) -> str:
    """Where this activation's backward runs: "unfused", "bgradb" or "epilog" ("auto" resolved)."""
    return AUTO_BACKWARD.get(activation, "unfused") if backward == "auto" else backward


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _stack(static, x2, layers):
    activations, _ = static
    for (kernel, bias), activation in zip(layers, activations):
        x2, _ = _layer_forward(x2, kernel, bias, _plain_epilog(activation, bias is not None))
    return x2


def _fusable(activation: str, chain: str, next_kernel) -> bool:
    """The layer above takes this activation's backward in its input-gradient GEMM: asked for, and
    possible (cuBLASLt reads out of bounds for aux epilogs with K = 1, which nvblaslt refuses)."""
    return activation != "none" and chain != "unfused" and next_kernel is not None and next_kernel.shape[1] > 1


def _stack_fwd(static, x2, layers):
    activations, chains = static
    inputs, kept = [], []
    count = len(layers)
    for index, ((kernel, bias), activation) in enumerate(zip(layers, activations)):
        inputs.append(x2)
        next_kernel = layers[index + 1][0] if index + 1 < count else None
        if activation == "gelu" or _fusable(activation, chains[index], next_kernel):
            epilog = keeping_aux(activation, bias is not None)
        else:
            epilog = _plain_epilog(activation, bias is not None)
        x2, aux = _layer_forward(x2, kernel, bias, epilog)
        kept.append(aux)
    return x2, (tuple(inputs), tuple(kept), x2, layers)


def _stack_bwd(static, residuals, dy):
    activations, chains = static
    inputs, kept, y, layers = residuals
    count = len(layers)
    dz = activation_backward(dy, activations[-1], y, _pre_activation(kept[-1], y.shape[-1]))
    grads = [None] * count
    bias_grad = None  # the bias gradient of the layer below, where its backward ran fused
    summed_by_xla = activations[-1] in ("relu", "none")  # dz is XLA's ReLU mask, or the step's incoming dy
    dx = None
    for index in reversed(range(count)):
        kernel, bias = layers[index]
        x2 = inputs[index]
        if bias is not None and bias_grad is None and summed_by_xla:
            bias_grad = _summed_over_tokens(dz).astype(bias.dtype)
        dz = dz.astype(kernel.dtype)
        if bias is not None and bias_grad is None:
            dkernel, sums = gemm(dz, x2, epilog=MatmulEpilog.BGRADA, a_transposed=True)
            bias_grad = sums["bgrada"].astype(bias.dtype)
        else:
            dkernel, _ = gemm(dz, x2, a_transposed=True)
        grads[index] = (jnp.swapaxes(dkernel, -1, -2), None if bias is None else bias_grad)
        bias_grad = None
        summed_by_xla = index > 0 and activations[index - 1] == "relu"  # XLA's mask, unless an epilog makes dz
        below = activations[index - 1] if index else "none"
        if index and _fusable(below, chains[index - 1], kernel):
            below_bias = layers[index - 1][1] is not None and chains[index - 1] == "epilog"
            epilog = backward_epilog(below, below_bias)
            key = f"{below}_aux"
            d, extra = gemm(kernel, dz, epilog=epilog, epilog_inputs={key: kept[index - 1]}, b_transposed=True)
            dz, summed_by_xla = jnp.swapaxes(d, -1, -2), False
            if below_bias:
                bias_grad = extra[f"d{below}_bgrad"].astype(layers[index - 1][1].dtype)
            continue
        dx, _ = gemm(dz, kernel, b_transposed=True)
        if index:
            below_output = inputs[index]  # the layer below's output is this layer's input
            dz = activation_backward(dx, below, below_output, _pre_activation(kept[index - 1], dx.shape[-1]))
    return dx.astype(inputs[0].dtype), tuple(grads)


def _summed_over_tokens(dz):
    """The bias gradient of a dz XLA made through ReLU's mask, or of the step's dy: summed in float32 at
    least, as BGRADA sums (float64 and complex stay what they are: float32 would round or drop a part)."""
    return jnp.sum(dz, axis=0, dtype=jnp.promote_types(dz.dtype, jnp.float32))


def _pre_activation(aux, features: int):
    """The GELU input a GELU_AUX epilog kept, (ld, T) with rows past ``features`` padding, as (T, features)."""
    return None if aux is None else jnp.swapaxes(aux[:features, :], -1, -2)


_stack.defvjp(_stack_fwd, _stack_bwd)
