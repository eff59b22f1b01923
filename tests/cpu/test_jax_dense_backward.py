"""``nvblaslt.jax.dense``'s backward run on the CPU, with a jnp stand-in for nvblaslt's GEMM and its epilogs:
which bias gradient XLA sums and which an epilog does must not change the gradients. Each backward mode and
mix of activations gives ``jax.grad`` of the plain stack, and a float64 or complex stack keeps its bias
gradients' precision and parts."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from nvblaslt._epilogs import MatmulEpilog  # noqa: E402

from tests import skips  # noqa: E402

skips.without_library()

from nvblaslt.jax import _dense  # noqa: E402


def _gelu(z):
    return jax.nn.gelu(z, approximate=True)


def _stand_in_gemm(a, b, *, epilog=None, epilog_inputs=None, a_transposed=False, b_transposed=False):
    """op(a) @ op(b) with the epilog as cuBLASLt applies it (bias along D's rows; BGRADA sums op(a)'s rows; the
    backward epilogs' bias gradient sums D's rows); aux kept as the matching backward epilog here reads it."""
    name = MatmulEpilog.DEFAULT.name if epilog is None else MatmulEpilog(epilog).name
    d = jnp.dot(a.T if a_transposed else a, b.T if b_transposed else b, precision="highest")
    aux = {}
    if name in ("BIAS", "RELU_BIAS", "GELU_BIAS", "RELU_AUX_BIAS", "GELU_AUX_BIAS"):
        d = d + epilog_inputs["bias"][:, None]
    if name.startswith("RELU"):
        aux = {"relu_aux": d > 0} if "AUX" in name else {}
        d = jnp.maximum(d, 0)
    elif name.startswith("GELU"):
        aux = {"gelu_aux": d} if "AUX" in name else {}
        d = _gelu(d)
    elif name.startswith("DRELU"):
        d = jnp.where(epilog_inputs["relu_aux"], d, 0)
    elif name.startswith("DGELU"):
        z = epilog_inputs["gelu_aux"]
        d = d * jax.vmap(jax.grad(_gelu))(z.reshape(-1)).reshape(z.shape).astype(d.dtype)
    elif name == "BGRADA":
        aux = {"bgrada": (a.T if a_transposed else a).sum(axis=1)}
    if name.endswith("_BGRAD"):
        aux = {f"{name.lower()}": d.sum(axis=1)}
    return d, aux


@pytest.fixture
def stand_in(monkeypatch):
    monkeypatch.setattr(_dense, "gemm", _stand_in_gemm)
    monkeypatch.setattr(_dense, "vary_alike", lambda tree: tree)


def _plain(x, layers, activations):
    act = {"relu": jax.nn.relu, "gelu": _gelu, "none": lambda z: z}
    for (kernel, bias), activation in zip(layers, activations):
        x = act[activation](jnp.dot(x, kernel, precision="highest") + (0 if bias is None else bias))
    return x


def _gradients(forward, x, layers, weights):
    return jax.grad(lambda x, layers: (forward(x, layers) * weights).sum().real, argnums=(0, 1))(x, layers)


def _stack(dtype, biases=(True, True), scale=1.0):
    rng = np.random.default_rng(0)

    def draw(*shape):
        values = rng.standard_normal(shape)
        if jnp.issubdtype(dtype, jnp.complexfloating):
            values = values + 1j * rng.standard_normal(shape)
        return jnp.asarray(values * scale, dtype)
    x = draw(2, 40, 24)
    layers = [(draw(24, 16) * 0.3, draw(16) if biases[0] else None),
              (draw(16, 8) * 0.3, draw(8) if biases[1] else None)]
    return x, layers, draw(2, 40, 8)


@pytest.mark.parametrize("backward", _dense.BACKWARDS)
def test_every_mode_and_mix_of_activations_gives_the_plain_stacks_gradients(stand_in, backward):
    for activations, biases in itertools.product(itertools.product(_dense.ACTIVATIONS, repeat=2),
                                                 [(True, True), (False, True), (True, False)]):
        x, layers, weights = _stack(jnp.float32, biases)
        got = _gradients(lambda x, l: _dense.dense(x, l, activations, backward=backward), x, layers, weights)
        want = _gradients(lambda x, l: _plain(x, l, activations), x, layers, weights)
        assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=f"{activations} {biases}")


@pytest.mark.parametrize("activation", ["relu", "none", "gelu"])  # XLA sums the bias gradients; GELU: its derivative
def test_a_float64_stack_keeps_its_bias_gradients_precision(stand_in, activation):
    with jax.enable_x64(True):
        x, layers, weights = _stack(jnp.float64, scale=1e3)
        got = _gradients(lambda x, l: _dense.dense(x, l, activation), x, layers, weights)
        want = _gradients(lambda x, l: _plain(x, l, [activation] * 2), x, layers, weights)
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            assert g.dtype == jnp.float64
            np.testing.assert_allclose(g, w, rtol=1e-12)


def test_a_complex_stack_keeps_the_imaginary_part_of_its_bias_gradients(stand_in):
    x, layers, weights = _stack(jnp.complex64)
    got = _gradients(lambda x, l: _dense.dense(x, l, "none"), x, layers, weights)
    want = _gradients(lambda x, l: _plain(x, l, ["none"] * 2), x, layers, weights)
    for (_, bias_grad), (_, bias_want) in zip(got[1], want[1]):
        assert np.abs(bias_want.imag).max() > 1  # a part that dropping would lose
        np.testing.assert_allclose(bias_grad, bias_want, rtol=1e-4)
