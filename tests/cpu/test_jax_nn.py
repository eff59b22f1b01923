"""nvblaslt.jax.nn (flax NNX layers) with JAX's CPU build: parameters as nnx.Linear lays them out,
shapes and the fused backward traced, the MoE block's numerics with jax.lax.ragged_dot, refusals by name,
and a clear ImportError without flax."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
nnx = pytest.importorskip("flax.nnx")

from nvblaslt import NvblasltTypeError, NvblasltValueError  # noqa: E402

from tests import skips  # noqa: E402

skips.without_library()

import nvblaslt.jax as nj  # noqa: E402
from nvblaslt.jax.nn import FusedDense, FusedMLP, MoEExperts  # noqa: E402

S = jax.ShapeDtypeStruct


def test_fused_dense_starts_where_nnx_linear_does():
    linear, fused = nnx.Linear(32, 48, rngs=nnx.Rngs(3)), FusedDense(32, 48, activation="relu", rngs=nnx.Rngs(3))
    ours, theirs = nnx.state(fused, nnx.Param), nnx.state(linear, nnx.Param)
    assert jax.tree_util.tree_structure(ours) == jax.tree_util.tree_structure(theirs)
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
        np.testing.assert_array_equal(a, b)
    assert FusedDense(32, 48, use_bias=False, rngs=nnx.Rngs(0)).bias is None


@pytest.mark.parametrize("activation, mode, backward", [("relu", "epilog", "DRELU_BGRAD"), ("gelu", "epilog", "DGELU_BGRAD"),
                                                        ("gelu", "auto", "DGELU")])
def test_fused_mlp_runs_one_dense_stack_with_the_fused_backward(activation, mode, backward):
    model = FusedMLP((32, 64, 48, 16), activation=activation, backward=mode, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    x = S((2, 8, 32), jnp.float32)

    def forward(state, x):
        return nnx.merge(graphdef, state)(x)

    y = jax.eval_shape(forward, state, x)
    assert (y.shape, y.dtype) == ((2, 8, 16), jnp.bfloat16)  # dtype=bfloat16 computes in bfloat16
    assert str(jax.make_jaxpr(forward)(state, x)).count("nvblaslt_gemm") == 3  # one GEMM per layer

    def grads(state, x):
        return nnx.grad(lambda m, x: m(x).astype(jnp.float32).sum())(nnx.merge(graphdef, state), x)

    got = jax.eval_shape(grads, state, x)
    shapes = {path: (leaf.shape, leaf.dtype) for path, leaf in jax.tree_util.tree_leaves_with_path(got)}
    params = {path: (leaf.shape, leaf.dtype) for path, leaf in
              jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param))}
    assert shapes == params  # float32 gradients for float32 parameters, each shaped as its parameter
    jaxpr = str(jax.make_jaxpr(grads)(state, x))
    assert jaxpr.count(f"MatmulEpilog.{backward}:") == 2
    # the hidden layers' bias gradients: BGRADA below DGELU, the fused epilog's own with DRELU_BGRAD / DGELU_BGRAD;
    # the top layer's (no activation) is XLA's sum of its dz
    assert jaxpr.count("MatmulEpilog.BGRADA:") == (2 if backward == "DGELU" else 0)


def test_fused_dense_promotes_dtypes_as_nnx_linear_does():
    layer = FusedDense(16, 8, rngs=nnx.Rngs(0))  # float32 parameters, no dtype: bfloat16 input → float32
    graphdef, state = nnx.split(layer)
    y = jax.eval_shape(lambda s, x: nnx.merge(graphdef, s)(x), state, S((4, 16), jnp.bfloat16))
    assert (y.shape, y.dtype) == ((4, 8), jnp.float32)


def test_moe_experts_match_a_loop_over_the_experts_with_xla_ragged_dot():
    experts = MoEExperts(4, 16, 24, activation="gelu", ragged_dot=jax.lax.ragged_dot, rngs=nnx.Rngs(1))
    sizes = np.array([5, 0, 9, 3])  # an empty expert, and 3 rows past the total
    x = jax.random.normal(jax.random.key(0), (20, 16), jnp.float32)
    got = np.asarray(experts(x, jnp.asarray(sizes, jnp.int32)), np.float64)
    up, down = (np.asarray(p[...], np.float64) for p in (experts.up, experts.down))
    xs = np.asarray(x, np.float64)
    want = np.zeros((20, 16))
    start = 0
    for e, size in enumerate(sizes):
        z = xs[start:start + size] @ up[e]
        h = 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))
        want[start:start + size] = h @ down[e]
        start += size
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert not got[17:].any()


def test_moe_experts_use_nvblaslt_ragged_dot_by_default():
    experts = MoEExperts(4, 16, 24, rngs=nnx.Rngs(0))
    assert experts.ragged_dot is nj.ragged_dot
    assert (experts.up.shape, experts.down.shape) == ((4, 16, 24), (4, 24, 16))


def test_refusals_name_the_argument():
    with pytest.raises(NvblasltValueError, match=r"^out_features: expected a positive int, got 0"):
        FusedDense(4, 0, rngs=nnx.Rngs(0))
    with pytest.raises(NvblasltValueError, match=r"^activation: expected one of \('none', 'relu', 'gelu'\), got 'tanh'"):
        FusedDense(4, 4, activation="tanh", rngs=nnx.Rngs(0))
    with pytest.raises(NvblasltValueError, match=r"^features: expected a sequence of at least two widths"):
        FusedMLP((4,), rngs=nnx.Rngs(0))
    with pytest.raises(NvblasltValueError, match=r"^last_activation: expected one of"):
        FusedMLP((4, 4), last_activation="softmax", rngs=nnx.Rngs(0))
    with pytest.raises(NvblasltValueError, match=r"^x: expected an array of shape \(…, 4\), got \(2, 5\)"):
        FusedDense(4, 4, rngs=nnx.Rngs(0))(jnp.ones((2, 5)))
    with pytest.raises(NvblasltTypeError, match=r"^ragged_dot: expected a callable"):
        MoEExperts(2, 4, 4, ragged_dot="xla", rngs=nnx.Rngs(0))
    with pytest.raises(NvblasltValueError, match=r"^activation: expected one of \('none', 'relu', 'gelu', 'silu'\)"):
        MoEExperts(2, 4, 4, activation="swiglu", rngs=nnx.Rngs(0))


def test_without_flax_the_import_says_what_to_install():
    code = ("import sys; sys.modules['flax'] = None\n"
            "try:\n    import nvblaslt.jax.nn\nexcept ImportError as e:\n    print(e.name, '|', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert out.startswith("flax | nvblaslt.jax.nn needs flax 0.12 or newer (pip install 'nvblaslt[flax]')"), out


def test_the_moe_example_trains_on_the_cpu_with_xla_ragged_dot():
    example = Path(__file__).resolve().parents[2] / "examples" / "jax_moe.py"
    done = subprocess.run([sys.executable, str(example), "--device", "cpu", "--steps", "60"], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "grouped GEMMs: jax.lax.ragged_dot on cpu, float32" in done.stdout
    assert "plain loop (an empty expert, rows past the total): True" in done.stdout, done.stdout
    assert "loss falls: True" in done.stdout, done.stdout
