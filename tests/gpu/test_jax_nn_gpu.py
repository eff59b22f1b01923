"""nvblaslt.jax.nn (flax NNX) on a GPU: FusedDense / FusedMLP against the same network of nnx.Linear
layers (forward and gradients, float32), an optax step under nnx.jit, and autotune() inside jit."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")

pytestmark = pytest.mark.gpu

if not any(d.platform == "gpu" for d in jax.devices()):
    pytest.skip("JAX sees no GPU", allow_module_level=True)

import nvblaslt.jax as nj  # noqa: E402
from nvblaslt.jax.nn import FusedDense, FusedMLP  # noqa: E402


class Plain(nnx.Module):
    """The same network from nnx.Linear, seeded alike (so its parameters start equal)."""

    def __init__(self, widths, activation, rngs):
        self.layers = nnx.List([nnx.Linear(i, o, rngs=rngs, precision="highest") for i, o in zip(widths, widths[1:])])
        self.act = jax.nn.relu if activation == "relu" else (lambda z: jax.nn.gelu(z, approximate=True))

    def __call__(self, x):
        for index, layer in enumerate(self.layers):
            x = layer(x)
            x = self.act(x) if index < len(self.layers) - 1 else x
        return x


def relative(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_fused_mlp_matches_nnx_linear_layers(activation):
    widths = (64, 96, 80, 16)
    fused, plain = FusedMLP(widths, activation=activation, rngs=nnx.Rngs(0)), Plain(widths, activation, nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (4, 32, 64))
    assert relative(nnx.jit(lambda m, x: m(x))(fused, x), plain(x)) < 1e-5

    def loss(model, x):
        return (model(x) ** 2).mean()

    got = nnx.jit(nnx.grad(loss))(fused, x)
    want = nnx.grad(loss)(plain, x)
    for index in range(len(widths) - 1):
        for name in ("kernel", "bias"):
            assert relative(got["layers"][index][name][...], want["layers"][index][name][...]) < 1e-4, (index, name)


def test_fused_dense_trains_with_optax_and_autotune_applies_inside_jit():
    layer = FusedDense(64, 32, activation="gelu", dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(layer, optax.sgd(1e-2), wrt=nnx.Param)
    x = jax.random.normal(jax.random.key(2), (256, 64))

    @nnx.jit
    def step(layer, optimizer, x):
        loss, grads = nnx.value_and_grad(lambda m: (m(x).astype(jnp.float32) ** 2).mean())(layer)
        optimizer.update(layer, grads)
        return loss

    first = float(step(layer, optimizer, x))
    with nj.autotune(search=False, iterations=2):  # the plans made again and timed, on XLA's stream
        tuned = float(jax.block_until_ready(step(layer, optimizer, x)))
    before = nj.python_entries()
    losses = [float(step(layer, optimizer, x)) for _ in range(20)]
    assert losses[-1] < tuned < first
    assert (nj.python_entries() - before) % 20 == 0  # the same GEMMs every step: nothing planned again
