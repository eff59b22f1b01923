"""A mixture-of-experts layer in flax NNX trained with optax: top-1 routing, tokens sorted by expert,
and every expert's MLP (up-projection, GELU, down-projection) as two grouped GEMMs over its share
(nvblaslt.jax.nn.MoEExperts on nvblaslt.jax.ragged_dot).

On a GPU with cuBLASLt 13.4 or newer (NVBLASLT_LIBRARY; see docs/guide/grouped.md) the grouped GEMMs
are cuBLASLt's, in bfloat16; elsewhere the same layer runs on jax.lax.ragged_dot, and says so. Prints
what it checks: the experts' gradients against jax.grad of a plain loop over the experts (with an
expert that gets no token, and rows past the groups' total), and the loss falling.

    python examples/jax_moe.py [--device cpu] [--steps 200]      (needs JAX, flax and optax)
"""

import argparse
import functools
import sys

try:
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx
except ImportError as missing:
    sys.exit(f"this example needs JAX, flax and optax (pip install -e '.[flax]'): {missing}")

import nvblaslt
from nvblaslt.jax.nn import MoEExperts

parser = argparse.ArgumentParser()
parser.add_argument("--device", choices=["auto", "cpu"], default="auto",
                    help="cpu: jax.lax.ragged_dot as the grouped GEMM, even where there is a GPU")
parser.add_argument("--steps", type=int, default=200)
args = parser.parse_args()


def cublaslt_grouped_gemm() -> bool:
    if args.device != "auto" or jax.default_backend() != "gpu":
        return False
    try:
        return nvblaslt.library().version >= 130400
    except nvblaslt.NvblasltError:
        return False


if cublaslt_grouped_gemm():
    ragged_dot, dtype, tolerance = nvblaslt.jax.ragged_dot, jnp.bfloat16, 3e-2
    print("grouped GEMMs: nvblaslt.jax.ragged_dot (cuBLASLt), bfloat16")
else:
    # full float32: XLA's default precision on a GPU multiplies float32 in TF32, far from the loop's 1e-4
    ragged_dot, dtype, tolerance = functools.partial(jax.lax.ragged_dot, precision="highest"), jnp.float32, 1e-4
    print(f"grouped GEMMs: jax.lax.ragged_dot on {jax.default_backend()}, float32 "
          f"(nvblaslt's needs a GPU and cuBLASLt 13.4 or newer)")

EXPERTS, FEATURES, HIDDEN, TOKENS = 8, 64, 128, 1024


class MoE(nnx.Module):
    """Top-1 routing to EXPERTS two-layer MLPs, run as two grouped GEMMs."""

    def __init__(self, rngs: nnx.Rngs):
        self.router = nnx.Linear(FEATURES, EXPERTS, rngs=rngs)
        self.experts = MoEExperts(EXPERTS, FEATURES, HIDDEN, activation="gelu", dtype=dtype, ragged_dot=ragged_dot,
                                  rngs=rngs)

    def __call__(self, x):
        probabilities = jax.nn.softmax(self.router(x), axis=-1)
        expert = jnp.argmax(probabilities, axis=-1)
        order = jnp.argsort(expert, stable=True)                       # tokens sorted by expert
        sizes = jnp.bincount(expert, length=EXPERTS).astype(jnp.int32)  # the offsets stay on the device
        out = self.experts(x[order], sizes)
        unsorted = jnp.zeros_like(out).at[order].set(out)
        return unsorted.astype(jnp.float32) * jnp.take_along_axis(probabilities, expert[:, None], axis=-1)


def plain_experts(up, down, x, sizes):
    """The experts as a loop of dense jnp GEMMs, each row masked to its expert's group."""
    ends = jnp.cumsum(sizes)
    rows = jnp.arange(x.shape[0])[:, None]
    out = jnp.zeros((x.shape[0], down.shape[-1]), jnp.float32)
    for e in range(up.shape[0]):
        inside = (rows >= ends[e] - sizes[e]) & (rows < ends[e])
        z = jnp.dot(x, up[e], precision="highest")
        out += jnp.where(inside, jnp.dot(jax.nn.gelu(z, approximate=True), down[e], precision="highest"), 0)
    return out


# 1. the grouped block's gradients against the plain loop's, with an empty expert and 24 rows past the total
model = MoE(nnx.Rngs(0))
x = jax.random.normal(jax.random.key(1), (256, FEATURES)).astype(dtype)
sizes = jnp.array([40, 0, 17, 64, 33, 16, 50, 12], jnp.int32)
target = jax.random.normal(jax.random.key(2), (256, FEATURES))
up, down = model.experts.up[...], model.experts.down[...]


def grouped_loss(up, down):
    block = MoEExperts(EXPERTS, FEATURES, HIDDEN, dtype=dtype, ragged_dot=ragged_dot, rngs=nnx.Rngs(0))
    block.up[...], block.down[...] = up, down
    return ((block(x, sizes).astype(jnp.float32) - target) ** 2).mean()


def plain_loss(up, down):
    return ((plain_experts(up.astype(dtype).astype(jnp.float32), down.astype(dtype).astype(jnp.float32),
                           x.astype(jnp.float32), sizes) - target) ** 2).mean()


grouped = jax.jit(jax.grad(grouped_loss, argnums=(0, 1)))(up, down)
plain = jax.grad(plain_loss, argnums=(0, 1))(up, down)
worst = max(float(jnp.linalg.norm(g - p) / jnp.linalg.norm(p)) for g, p in zip(grouped, plain))
print(f"experts' gradients match jax.grad of the plain loop (an empty expert, rows past the total): "
      f"{worst < tolerance} (largest relative difference {worst:.1e})")

# 2. training: the layer learns a fixed random map
teacher = jax.random.normal(jax.random.key(3), (FEATURES, FEATURES)) / FEATURES ** 0.5
optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)


@nnx.jit
def train_step(model, optimizer, x):
    loss, grads = nnx.value_and_grad(lambda m: ((m(x) - jnp.tanh(x.astype(jnp.float32) @ teacher)) ** 2).mean())(model)
    optimizer.update(model, grads)
    return loss


losses = [float(train_step(model, optimizer, jax.random.normal(jax.random.key(10 + step), (TOKENS, FEATURES))
                           .astype(dtype))) for step in range(args.steps)]
first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
print(f"loss {first:.4f} (first 10 steps) → {last:.4f} (last 10): loss falls: {last < 0.7 * first}")
