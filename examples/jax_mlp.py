"""A flax NNX MLP trained with optax, every layer one fused cuBLASLt GEMM (nvblaslt.jax.nn.FusedMLP).

The forward runs RELU_BIAS / GELU_AUX_BIAS per layer; the backward puts each GELU's derivative into
the next layer's input-gradient GEMM (DGELU; ReLU's mask is XLA's) and each bias gradient into its
weight gradient's GEMM (BGRADA), all inside one jitted training step (--backward epilog: DRELU_BGRAD /
DGELU_BGRAD instead).
The data: points labelled by a random "teacher" network. Prints what it checks: the gradients
against jax.grad of the plain jnp expression, the loss falling, the held-out accuracy.

    python examples/jax_mlp.py [--activation relu|gelu] [--steps 300]
    (needs an NVIDIA GPU, JAX with CUDA, flax and optax: pip install -e ".[flax]")
"""

import argparse
import sys

import nvblaslt

try:  # a GPU, a driver and a cuBLASLt nvblaslt can use: asked before JAX starts on the GPU
    nvblaslt.Handle.for_device(0)
except nvblaslt.NvblasltError as missing:
    sys.exit(f"this example needs an NVIDIA GPU, its driver and cuBLASLt: {missing}")
try:
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx
except ImportError as missing:
    sys.exit(f"this example needs JAX, flax and optax (pip install -e '.[flax]'): {missing}")
if not any(device.platform == "gpu" for device in jax.devices()):
    sys.exit("this example needs JAX with CUDA (jax.devices() has no GPU): pip install 'jax[cuda13]'")

import nvblaslt.jax as nj
from nvblaslt.jax.nn import FusedMLP

parser = argparse.ArgumentParser()
parser.add_argument("--activation", choices=["relu", "gelu"], default="gelu")
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--backward", choices=["auto", "unfused", "bgradb", "epilog"], default="auto")
args = parser.parse_args()

WIDTHS, CLASSES, BATCH = (64, 256, 256, 10), 10, 256
keys = jax.random.split(jax.random.key(0), 4)


def teacher_labels(x):
    """A fixed random two-layer network's argmax: a task an MLP can learn, and no dataset to fetch."""
    w1 = jax.random.normal(keys[0], (WIDTHS[0], 128)) / 8
    w2 = jax.random.normal(keys[1], (128, CLASSES)) / 11
    return jnp.argmax(jnp.tanh(x @ w1) @ w2, axis=-1)


x_all = jax.random.normal(keys[2], (8192 + 2048, WIDTHS[0]))
y_all = teacher_labels(x_all)
x_train, y_train, x_test, y_test = x_all[:8192], y_all[:8192], x_all[8192:], y_all[8192:]

model = FusedMLP(WIDTHS, activation=args.activation, backward=args.backward, rngs=nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adam(2e-3), wrt=nnx.Param)


def loss_fn(model, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


@nnx.jit
def train_step(model, optimizer, x, y):
    loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
    optimizer.update(model, grads)
    return loss


def plain_loss(layers, x, y):
    """The same network as plain jnp: act(x @ kernel + bias) per layer, none after the last."""
    act = jax.nn.relu if args.activation == "relu" else (lambda z: jax.nn.gelu(z, approximate=True))
    for index, (kernel, bias) in enumerate(layers):
        x = jnp.dot(x, kernel, precision="highest") + bias
        x = act(x) if index < len(layers) - 1 else x
    return optax.softmax_cross_entropy_with_integer_labels(x, y).mean()


# 1. the fused backward's gradients against jax.grad of the jnp expression, on one batch, float32
x, y = x_train[:BATCH], y_train[:BATCH]
grads = nnx.jit(nnx.grad(loss_fn))(model, x, y)  # an nnx.State shaped as the model
fused = [(grads["layers"][i]["kernel"][...], grads["layers"][i]["bias"][...]) for i in range(len(WIDTHS) - 1)]
layers = [(layer.kernel[...], layer.bias[...]) for layer in model.layers]
plain = jax.grad(plain_loss)(layers, x, y)
worst = max(float(jnp.linalg.norm(f - p) / jnp.linalg.norm(p))
            for f, p in zip(jax.tree_util.tree_leaves(fused), jax.tree_util.tree_leaves(plain)))
print(f"FusedMLP {WIDTHS}, {args.activation}, backward={args.backward!r}, float32: gradients match jax.grad of the jnp expression: "
      f"{worst < 1e-3} (largest relative difference {worst:.1e})")

# 2. training: the loss falls, and the held-out accuracy says the network learned the teacher
losses = []
for step in range(args.steps):
    start = (step * BATCH) % len(x_train)
    if step == 1:
        entries = nj.python_entries()
    losses.append(float(train_step(model, optimizer, x_train[start:start + BATCH], y_train[start:start + BATCH])))
per_step = (nj.python_entries() - entries) / max(1, args.steps - 1)
first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
print(f"loss {first:.3f} (first 10 steps) → {last:.3f} (last 10): loss falls: {last < 0.5 * first}")
print(f"Python entries per training step: {per_step:g} (one per cuBLASLt GEMM)")
accuracy = float((jnp.argmax(nnx.jit(lambda m, x: m(x))(model, x_test), -1) == y_test).mean())
print(f"held-out accuracy after {args.steps} steps: {accuracy:.3f}")
