"""Flax NNX layers on nvblaslt's fused GEMMs: ``FusedDense``, ``FusedMLP`` and ``MoEExperts``.

Flax NNX is the API flax 0.12 documents first (Linen stays supported, new code is pointed to NNX):
a layer is a Python object holding its ``nnx.Param``s, trained with ``nnx.Optimizer`` over optax.
``FusedDense`` names and shapes its parameters as ``flax.nnx.Linear`` does (``kernel`` (in, out),
``bias`` (out,)), so weights move between the two. A ``FusedMLP`` runs its layers as one
``nvblaslt.jax.dense`` stack, which is what puts each activation's backward into the next layer's
GEMM (DGELU by default, DRELU_BGRAD / DGELU_BGRAD on request); separate ``FusedDense`` layers each run their own backward.

Needs flax (``pip install 'nvblaslt[flax]'``); ``import nvblaslt.jax`` alone never imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

try:
    from flax import nnx
    from flax.nnx.nn.dtypes import promote_dtype
except ImportError as missing:  # the layers only: nvblaslt.jax's functions need no flax
    raise ImportError(f"nvblaslt.jax.nn needs flax 0.12 or newer (pip install 'nvblaslt[flax]'): {missing}",
                      name="flax") from missing

from .._errors import NvblasltTypeError, NvblasltValueError
from ._dense import ACTIVATIONS, BACKWARDS, dense
from ._ragged import ragged_dot as nvblaslt_ragged_dot

# flax.nnx.Linear's defaults, so that a FusedDense starts where an nnx.Linear would
default_kernel_init = nnx.initializers.lecun_normal()
default_bias_init = nnx.initializers.zeros_init()
# the experts' (g, in, out) kernels: fan-in along `in`, one independent draw per expert
default_experts_init = nnx.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))

# the activation between a MoE block's two grouped GEMMs, run by XLA (grouped GEMMs have no epilogs)
EXPERT_ACTIVATIONS: dict[str, Callable[[Any], Any]] = {
    "none": lambda z: z,
    "relu": jax.nn.relu,
    "gelu": lambda z: jax.nn.gelu(z, approximate=True),
    "silu": jax.nn.silu,
}


def _positive(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise NvblasltValueError(f"{name}: expected a positive int, got {value!r}")
    return value


def _activation(value, name: str, allowed) -> str:
    if value not in allowed:
        raise NvblasltValueError(f"{name}: expected one of {tuple(allowed)}, got {value!r}")
    return value


class FusedDense(nnx.Module):
    """``activation(x @ kernel + bias)`` as one cuBLASLt GEMM with a fused epilog (``flax.nnx.Linear``'s
    parameters and arguments, plus ``activation``).

    Parameters
    ----------
    in_features, out_features : int
        The kernel is (in_features, out_features), the bias (out_features,).
    activation : str, default "none"
        "none", "relu" or "gelu" (cuBLASLt's tanh GELU), fused into the GEMM's epilog.
    use_bias : bool, default True
    dtype : dtype, optional
        The computation's dtype; None promotes the input's and the parameters' dtypes as
        ``nnx.Linear`` does. bfloat16 with float32 parameters is the usual mixed precision.
    param_dtype : dtype, default float32
    kernel_init, bias_init : initializers, default nnx.Linear's
    rngs : nnx.Rngs

    Raises
    ------
    NvblasltValueError
        A feature count that is not a positive int, an unknown activation.

    Examples
    --------
    On a GPU:

    .. code-block:: python

        from flax import nnx
        from nvblaslt.jax.nn import FusedDense

        layer = FusedDense(784, 256, activation="relu", dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
        y = nnx.jit(lambda layer, x: layer(x))(layer, x)     # RELU_BIAS, one cuBLASLt call
    """

    def __init__(self, in_features: int, out_features: int, *, activation: str = "none", use_bias: bool = True,
                 dtype=None, param_dtype=jnp.float32, kernel_init=default_kernel_init, bias_init=default_bias_init,
                 rngs: nnx.Rngs):
        self.in_features = _positive(in_features, "in_features")
        self.out_features = _positive(out_features, "out_features")
        self.activation = _activation(activation, "activation", ACTIVATIONS)
        self.dtype = dtype
        self.kernel = nnx.Param(kernel_init(rngs.params(), (in_features, out_features), param_dtype))
        self.bias = nnx.Param(bias_init(rngs.params(), (out_features,), param_dtype)) if use_bias else None

    def parameters(self, x) -> tuple:
        """The input and the layer's parameters in the computation's dtype.

        Parameters
        ----------
        x : jax.Array
            (…, in_features).

        Returns
        -------
        tuple
            (x, (kernel, bias)), promoted as ``nnx.Linear`` promotes them; bias is None without one.
        """
        bias = None if self.bias is None else self.bias[...]
        x, kernel, bias = promote_dtype((x, self.kernel[...], bias), dtype=self.dtype)
        return x, (kernel, bias)

    def __call__(self, x):
        """The layer's output, ``activation(x @ kernel + bias)``.

        Parameters
        ----------
        x : jax.Array
            (…, in_features), on a GPU.

        Returns
        -------
        jax.Array
            (…, out_features).
        """
        _check_features(x, self.in_features)
        x, layer = self.parameters(x)
        return dense(x, [layer], self.activation)


class FusedMLP(nnx.Module):
    """A stack of ``FusedDense`` layers run as one ``nvblaslt.jax.dense`` call, whose backward can run each
    activation's derivative (and bias gradient) inside the next layer's input-gradient GEMM.

    Parameters
    ----------
    features : sequence of int
        The widths, input first: (784, 256, 10) is two layers.
    activation : str, default "relu"
        After every layer but the last: "none", "relu" or "gelu".
    last_activation : str, default "none"
        After the last layer.
    backward : str, default "auto"
        Where each activation's backward runs, as ``nvblaslt.jax.dense`` takes it ("auto", "unfused",
        "bgradb", "epilog").
    use_bias, dtype, param_dtype, kernel_init, bias_init, rngs
        As ``FusedDense`` takes them, for every layer.

    Raises
    ------
    NvblasltValueError
        Fewer than two widths, a width that is not a positive int, an unknown activation.

    Examples
    --------
    On a GPU:

    .. code-block:: python

        model = FusedMLP((784, 512, 512, 10), activation="gelu", dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
        loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)   # DGELU and BGRADA inside
        optimizer.update(model, grads)
    """

    def __init__(self, features: Sequence[int], *, activation: str = "relu", last_activation: str = "none",
                 backward: str = "auto", use_bias: bool = True, dtype=None, param_dtype=jnp.float32, kernel_init=default_kernel_init,
                 bias_init=default_bias_init, rngs: nnx.Rngs):
        features = tuple(features) if isinstance(features, Sequence) else None
        if features is None or len(features) < 2:
            raise NvblasltValueError("features: expected a sequence of at least two widths (input first)")
        _activation(activation, "activation", ACTIVATIONS)
        _activation(last_activation, "last_activation", ACTIVATIONS)
        self.backward = _activation(backward, "backward", BACKWARDS)
        self.layers = nnx.List([
            FusedDense(n_in, n_out, activation=activation if index < len(features) - 2 else last_activation,
                       use_bias=use_bias, dtype=dtype, param_dtype=param_dtype, kernel_init=kernel_init,
                       bias_init=bias_init, rngs=rngs)
            for index, (n_in, n_out) in enumerate(zip(features, features[1:]))])

    def __call__(self, x):
        """The stack's output, its layers as one ``nvblaslt.jax.dense`` call.

        Parameters
        ----------
        x : jax.Array
            (…, features[0]), on a GPU.

        Returns
        -------
        jax.Array
            (…, features[-1]).
        """
        _check_features(x, self.layers[0].in_features)
        x, first = self.layers[0].parameters(x)
        layers = [first, *(layer.parameters(x)[1] for layer in self.layers[1:])]
        return dense(x, layers, tuple(layer.activation for layer in self.layers), backward=self.backward)


class MoEExperts(nnx.Module):
    """A mixture-of-experts block's experts: ``down[e] @ act(up[e] @ x)`` for each token's expert ``e``,
    as two grouped GEMMs (``nvblaslt.jax.ragged_dot``) over tokens sorted by expert.

    Parameters
    ----------
    num_experts, features, hidden : int
        ``up`` is (num_experts, features, hidden), ``down`` (num_experts, hidden, features).
    activation : str, default "gelu"
        Between the GEMMs, run by XLA: "none", "relu", "gelu" (tanh) or "silu".
    dtype : dtype, optional
        The GEMMs' dtype (bfloat16 or float16 for cuBLASLt's grouped GEMM); None takes the input's.
    param_dtype : dtype, default float32
    kernel_init : initializer, default LeCun normal over each expert's fan-in
    ragged_dot : callable, optional
        The grouped GEMM, ``jax.lax.ragged_dot``'s signature: ``nvblaslt.jax.ragged_dot`` (needs
        cuBLASLt 13.4 or newer) by default; ``jax.lax.ragged_dot`` runs the same block without it.
    rngs : nnx.Rngs

    Raises
    ------
    NvblasltValueError
        A size that is not a positive int, an unknown activation.
    NvblasltTypeError
        ``ragged_dot`` that is not callable.

    Examples
    --------
    On a GPU with cuBLASLt 13.4 or newer:

    .. code-block:: python

        experts = MoEExperts(8, 1024, 4096, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
        out = experts(tokens_sorted_by_expert, group_sizes)      # (tokens, 1024)
    """

    def __init__(self, num_experts: int, features: int, hidden: int, *, activation: str = "gelu", dtype=None,
                 param_dtype=jnp.float32, kernel_init=default_experts_init,
                 ragged_dot: Callable | None = None, rngs: nnx.Rngs):
        _positive(num_experts, "num_experts")
        self.features = _positive(features, "features")
        _positive(hidden, "hidden")
        self.activation = _activation(activation, "activation", EXPERT_ACTIVATIONS)
        if ragged_dot is not None and not callable(ragged_dot):
            raise NvblasltTypeError(f"ragged_dot: expected a callable (jax.lax.ragged_dot's signature), got "
                                    f"{type(ragged_dot).__name__}")
        self.ragged_dot = nvblaslt_ragged_dot if ragged_dot is None else ragged_dot
        self.dtype = dtype
        self.up = nnx.Param(kernel_init(rngs.params(), (num_experts, features, hidden), param_dtype))
        self.down = nnx.Param(kernel_init(rngs.params(), (num_experts, hidden, features), param_dtype))

    def __call__(self, x, group_sizes):
        """Each token through its expert: ``down[e] @ act(up[e] @ x)``.

        Parameters
        ----------
        x : jax.Array
            (tokens, features), its rows sorted by expert.
        group_sizes : jax.Array
            (num_experts,) integers: each expert's row count, in order.

        Returns
        -------
        jax.Array
            (tokens, features); rows past the groups' total are zeros.
        """
        _check_features(x, self.features)
        x, up, down = promote_dtype((x, self.up[...], self.down[...]), dtype=self.dtype)
        hidden = EXPERT_ACTIVATIONS[self.activation](self.ragged_dot(x, up, group_sizes))
        return self.ragged_dot(hidden.astype(x.dtype), down, group_sizes)


def _check_features(x, expected: int) -> None:
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) < 1 or shape[-1] != expected:
        raise NvblasltValueError(f"x: expected an array of shape (…, {expected}), got "
                                 f"{shape if shape is not None else type(x).__name__}")


__all__ = ["EXPERT_ACTIVATIONS", "FusedDense", "FusedMLP", "MoEExperts"]
