"""nvblaslt.jax under ``jax.shard_map`` over two GPUs: a sharded fused dense forward and its gradients,
each shard against float64 and the whole against plain ``jnp``, each GPU's GEMMs launched on that GPU;
and a command-buffer step that stops entering Python."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

pytestmark = pytest.mark.gpu

GPUS = [d for d in jax.devices() if d.platform == "gpu"]
if len(GPUS) < 2:
    pytest.skip(f"needs two GPUs; JAX sees {len(GPUS)}", allow_module_level=True)

from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import nvblaslt.jax as nj  # noqa: E402

RNG = np.random.default_rng(20261129)
MESH = Mesh(np.array(GPUS[:2]), ("data",))


def rand(*shape, scale=1.0):
    return (scale * RNG.standard_normal(shape)).astype(np.float32)


def relu(z):
    return np.maximum(z, 0)


def forward64(x, w1, b1, w2, b2):
    return relu(x @ w1 + b1) @ w2 + b2


def grads64(x, w1, b1, w2, b2, dy):
    """The float64 gradients of sum(y * dy) for one shard's rows."""
    z1 = x @ w1 + b1
    h = relu(z1)
    dz1 = (dy @ w2.T) * (z1 > 0)
    return dz1 @ w1.T, x.T @ dz1, dz1.sum(0), h.T @ dy, dy.sum(0)


def test_sharded_dense_forward_and_gradients_per_shard():
    x, dy = rand(256, 64), rand(256, 48)
    w1, b1, w2, b2 = rand(64, 96, scale=0.1), rand(96), rand(96, 48, scale=0.1), rand(48)
    put = lambda a, spec: jax.device_put(a, NamedSharding(MESH, spec))  # noqa: E731
    xs, dys = put(x, P("data")), put(dy, P("data"))
    params = [put(a, P()) for a in (w1, b1, w2, b2)]

    def local(x, dy, w1, b1, w2, b2):
        def loss(x, w1, b1, w2, b2):
            y = nj.dense(x, [(w1, b1), (w2, b2)], ("relu", "none"))
            return jax.lax.psum((y * dy).sum(), "data"), y
        (_, y), g = jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True)(x, w1, b1, w2, b2)
        return y, g

    step = jax.jit(jax.shard_map(local, mesh=MESH, in_specs=(P("data"), P("data"), P(), P(), P(), P()),
                                 out_specs=(P("data"), (P("data"), P(), P(), P(), P()))))
    step(xs, dys, *params)[0].block_until_ready()  # plans made on each GPU
    before = [nj.python_entries(device=d.id) for d in GPUS[:2]]
    y, (dx, dw1, db1, dw2, db2) = step(xs, dys, *params)
    jax.block_until_ready((y, dx, dw1, db1, dw2, db2))
    after = [nj.python_entries(device=d.id) for d in GPUS[:2]]
    # every GPU launched its own shard's GEMMs: 2 forward, then per layer a weight and an input gradient
    assert [b - a for a, b in zip(before, after)] == [6, 6]

    sums = [np.zeros_like(a, dtype=np.float64) for a in (w1, b1, w2, b2)]
    for index, (y_shard, dx_shard) in enumerate(zip(y.addressable_shards, dx.addressable_shards)):
        assert y_shard.device == GPUS[index] and dx_shard.device == GPUS[index]  # each result where it was made
        rows = y_shard.index[0]
        x64, dy64 = x[rows].astype(np.float64), dy[rows].astype(np.float64)
        p64 = [a.astype(np.float64) for a in (w1, b1, w2, b2)]
        np.testing.assert_allclose(np.asarray(y_shard.data), forward64(x64, *p64), rtol=1e-4, atol=1e-4)
        want = grads64(x64, *p64, dy64)
        np.testing.assert_allclose(np.asarray(dx_shard.data), want[0], rtol=1e-4, atol=1e-4)
        for total, part in zip(sums, want[1:]):
            total += part
    for got, want in zip((dw1, db1, dw2, db2), sums):  # the replicated weights' gradients: summed over shards
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-3)

    def plain(x, w1, b1, w2, b2):
        h = jax.nn.relu(jnp.dot(x, w1, precision="highest") + b1)
        return ((jnp.dot(h, w2, precision="highest") + b2) * dy).sum()

    want = jax.grad(plain, argnums=(0, 1, 2, 3, 4))(x, w1, b1, w2, b2)
    for got, ref in zip((dx, dw1, db1, dw2, db2), want):
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-4, atol=1e-3)


def test_sharded_step_under_command_buffers_matches_and_counts_its_entries():
    """The same GEMMs traced inside command_buffers(): results equal the op-by-op step's, and the entries
    per step are printed (0 once XLA replays its command buffers)."""
    x, w, b = rand(512, 128), rand(128, 256, scale=0.1), rand(256)
    xs = jax.device_put(x, NamedSharding(MESH, P("data")))
    w, b = (jax.device_put(a, NamedSharding(MESH, P())) for a in (w, b))

    def layers(x, w, b):
        for _ in range(3):  # enough capturable operations for XLA to make a command buffer
            x = nj.dense(x, [(w, b)], "gelu")[:, :128] * 0.5
        return x

    plain = jax.jit(jax.shard_map(layers, mesh=MESH, in_specs=(P("data"), P(), P()), out_specs=P("data")))
    want = plain(xs, w, b)
    with nj.command_buffers():
        captured = jax.jit(jax.shard_map(lambda x, w, b: layers(x, w, b), mesh=MESH,
                                         in_specs=(P("data"), P(), P()), out_specs=P("data")))
        got = captured(xs, w, b)
    for _ in range(3):
        got = captured(xs, w, b).block_until_ready()
    before = nj.python_entries()
    for _ in range(3):
        got = captured(xs, w, b).block_until_ready()
    per_step = (nj.python_entries() - before) / 3
    print(f"python entries per step, 2 GPUs, command buffers: {per_step:g} (op by op: 6)")
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)  # the same plans
