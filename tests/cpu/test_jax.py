"""nvblaslt.jax with JAX's CPU build: registration, shapes and dtypes at trace time, refusals by name.

Nothing here runs a GEMM (no GPU): ``jax.eval_shape`` and ``jax.make_jaxpr`` trace the calls, and
the shapes they report are nvblaslt's own (the same rules ``nvblaslt.matmul`` lays its results out by).
"""

from __future__ import annotations

import re

import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import nvblaslt  # noqa: E402
from nvblaslt import (NvblasltArgumentError, NvblasltError, NvblasltTypeError,  # noqa: E402
                      NvblasltUnsupportedError, NvblasltValueError)

from tests import skips  # noqa: E402

skips.without_library()

import nvblaslt.jax as nj  # noqa: E402
from nvblaslt.jax import _bridge  # noqa: E402

S = jax.ShapeDtypeStruct


def shapes(f, *args):
    return jax.tree_util.tree_map(lambda s: (s.shape, s.dtype.name), jax.eval_shape(f, *args))


def test_the_primitive_is_registered_for_cuda_and_refuses_other_platforms():
    assert _bridge.gemm_p.name == "nvblaslt_gemm" and _bridge.gemm_p.multiple_results
    jaxpr = jax.make_jaxpr(lambda a, b: nj.matmul(a, b))(S((8, 4), jnp.float32), S((4, 2), jnp.float32))
    assert "nvblaslt_gemm" in str(jaxpr)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_plain_shapes_and_dtypes(dtype):
    a, b = S((64, 32), dtype), S((32, 16), dtype)
    assert shapes(lambda a, b: nj.matmul(a, b), a, b) == ((64, 16), dtype)


def test_result_type_and_compute_type():
    a, b = S((64, 32), jnp.bfloat16), S((32, 16), jnp.bfloat16)
    assert shapes(lambda a, b: nj.matmul(a, b, result_type="float32"), a, b) == ((64, 16), "float32")
    a, b = S((64, 32), jnp.float32), S((32, 16), jnp.float32)
    assert shapes(lambda a, b: nj.matmul(a, b, compute_type="tf32"), a, b) == ((64, 16), "float32")


def test_epilog_outputs_are_shaped_as_nvblaslt_returns_them():
    a, b, bias = S((200, 32), jnp.float16), S((32, 24), jnp.float16), S((200,), jnp.float16)
    d, aux = shapes(lambda a, b, bias: nj.matmul(a, b, epilog="RELU_AUX_BIAS", epilog_inputs={"bias": bias}),
                    a, b, bias)
    assert d == ((200, 24), "float16")
    assert aux == {"relu_aux": ((32, 24), "uint8")}  # ⌈200/128⌉·16 bytes of bitmask per column
    d, aux = shapes(lambda a, b: nj.matmul(a, b, epilog="GELU_AUX"), a, b)
    assert aux == {"gelu_aux": ((200, 24), "float16")}  # M rounded up to 8
    d, aux = shapes(lambda a, b: nj.matmul(a, b, epilog="BGRADB"), a, b)
    assert aux == {"bgradb": ((24,), "float16")}
    d, aux = shapes(lambda a, b: nj.matmul(a, b, epilog="BGRADA"), a, b)
    assert aux == {"bgrada": ((200,), "float16")}


def test_backward_epilogs_take_the_aux_the_forward_returned():
    a, b, bias = S((64, 32), jnp.float32), S((32, 16), jnp.float32), S((64,), jnp.float32)

    def f(a, b, bias):
        y, aux = nj.matmul(a, b, epilog="RELU_AUX_BIAS", epilog_inputs={"bias": bias})
        eye = jnp.eye(64, dtype=jnp.float32)
        return nj.matmul(eye, y, epilog="DRELU_BGRAD", epilog_inputs={"relu_aux": aux["relu_aux"]})

    d, aux = shapes(f, a, b, bias)
    assert d == ((64, 16), "float32") and aux == {"drelu_bgrad": ((64,), "float32")}


def test_batched_and_broadcast_operands():
    a, b = S((3, 64, 32), jnp.float32), S((32, 16), jnp.float32)
    assert shapes(lambda a, b: nj.matmul(a, b), a, b) == ((3, 64, 16), "float32")
    bias = S((3, 64, 1), jnp.float32)
    d = shapes(lambda a, b, bias: nj.matmul(a, b, epilog="BIAS", epilog_inputs={"bias": bias}), a, b, bias)
    assert d == ((3, 64, 16), "float32")  # no epilog outputs: D alone, as nvblaslt.matmul returns it
    c = S((64, 16), jnp.float32)
    assert shapes(lambda a, b, c: nj.matmul(a, b, c, beta=0.5), a, b, c) == ((3, 64, 16), "float32")


def test_vectors():
    assert shapes(lambda a, b: nj.matmul(a, b), S((32,), jnp.float32), S((32, 16), jnp.float32)) == ((16,), "float32")
    assert shapes(lambda a, b: nj.matmul(a, b), S((8, 32), jnp.float32), S((32,), jnp.float32)) == ((8,), "float32")


def test_vmap_folds_the_mapped_axis_into_the_batch():
    b = S((32, 16), jnp.float32)
    f = jax.vmap(lambda a, b, bias: nj.matmul(a, b, epilog="RELU_AUX_BIAS", epilog_inputs={"bias": bias}),
                 in_axes=(0, None, 0))
    jaxpr = jax.make_jaxpr(f)(S((5, 64, 32), jnp.float32), b, S((5, 64), jnp.float32))
    gemms = [e for e in jaxpr.jaxpr.eqns[0].params["call_jaxpr"].eqns if e.primitive.name == "nvblaslt_gemm"]
    assert len(gemms) == 1  # one batched launch, not a loop
    spec = gemms[0].params["spec"]
    assert spec.a.shape == (5, 64, 32) and spec.b.shape == (32, 16)  # b stays one matrix, broadcast
    d, aux = shapes(f, S((5, 64, 32), jnp.float32), b, S((5, 64), jnp.float32))
    assert d == ((5, 64, 16), "float32") and aux == {"relu_aux": ((5, 16, 16), "uint8")}
    g = jax.vmap(lambda a, b: nj.matmul(a, b, epilog="BGRADB"), in_axes=(0, None))
    assert shapes(g, S((5, 64, 32), jnp.float32), b)[1] == {"bgradb": ((5, 16), "float32")}


@pytest.mark.parametrize("epilog", ["DEFAULT", "BIAS", "RELU_BIAS", "GELU_BIAS", "RELU_AUX_BIAS", "GELU_AUX_BIAS"])
def test_gradients_trace_with_the_primal_shapes(epilog):
    a, b, bias = S((64, 32), jnp.float32), S((32, 16), jnp.float32), S((64,), jnp.float32)
    inputs = (lambda bias: {"bias": bias}) if "BIAS" in epilog else (lambda bias: None)

    def loss(a, b, bias):
        out = nj.matmul(a, b, epilog=epilog, epilog_inputs=inputs(bias))
        return (out[0] if isinstance(out, tuple) else out).sum()

    grads = shapes(jax.grad(loss, argnums=(0, 1, 2)), a, b, bias)
    assert grads == (((64, 32), "float32"), ((32, 16), "float32"), ((64,), "float32"))
    jaxpr = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(a, b, bias))
    assert jaxpr.count("nvblaslt_gemm") == 3  # the forward, then da and db


EPILOGS_BY_BACKWARD = {  # (backward, activation): the epilogs the traced training step runs. XLA makes the top
    # layer's dz (no GEMM follows it) and every unfused one; where that is ReLU's mask, XLA sums its bias gradient
    # too. BGRADA sums GELU's, and those below a fused DRELU / DGELU; DRELU_BGRAD / DGELU_BGRAD give their own
    ("auto", "relu"): {"RELU_BIAS", "DEFAULT"}, ("auto", "gelu"): {"GELU_AUX_BIAS", "DGELU", "BGRADA", "DEFAULT"},
    ("unfused", "relu"): {"RELU_BIAS", "DEFAULT"}, ("unfused", "gelu"): {"GELU_AUX_BIAS", "BGRADA", "DEFAULT"},
    ("bgradb", "relu"): {"RELU_AUX_BIAS", "RELU_BIAS", "DRELU", "BGRADA", "DEFAULT"},
    ("bgradb", "gelu"): {"GELU_AUX_BIAS", "DGELU", "BGRADA", "DEFAULT"},
    ("epilog", "relu"): {"RELU_AUX_BIAS", "RELU_BIAS", "DRELU_BGRAD", "DEFAULT"},
    ("epilog", "gelu"): {"GELU_AUX_BIAS", "DGELU_BGRAD", "BGRADA", "DEFAULT"},
    ("auto", "none"): {"BIAS", "BGRADA", "DEFAULT"},  # the top layer sums its dy by XLA, the one below by BGRADA
}


@pytest.mark.parametrize("backward, activation", sorted(EPILOGS_BY_BACKWARD))
def test_dense_backward_runs_the_epilogs_its_backward_mode_names(backward, activation):
    x = S((64, 32), jnp.bfloat16)
    layers = [(S((32, 48), jnp.bfloat16), S((48,), jnp.bfloat16)), (S((48, 16), jnp.bfloat16), S((16,), jnp.bfloat16))]

    def loss(x, layers):
        return nj.dense(x, layers, activation, backward=backward).astype(jnp.float32).sum()

    grads = shapes(jax.grad(loss, argnums=(0, 1)), x, layers)
    assert grads[0] == ((64, 32), "bfloat16")
    assert grads[1] == [(((32, 48), "bfloat16"), ((48,), "bfloat16")), (((48, 16), "bfloat16"), ((16,), "bfloat16"))]
    jaxpr = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, layers))
    assert set(re.findall(r"epilog=<MatmulEpilog\.(\w+)", jaxpr)) == EPILOGS_BY_BACKWARD[backward, activation]
    assert shapes(lambda x, layers: nj.dense(x, layers, activation, backward=backward), S((2, 7, 32), jnp.bfloat16),
                  layers) == ((2, 7, 16), "bfloat16")


# ---- refusals, each by name ---------------------------------------------------------------------------
def test_arrays_not_on_a_gpu_are_refused_by_name():
    a, b = jnp.ones((8, 4), jnp.float32), jnp.ones((4, 2), jnp.float32)
    with pytest.raises(NvblasltValueError, match=r"^a: a JAX array on cpu"):
        nj.matmul(a, b)
    with pytest.raises(NvblasltValueError, match=r"a, b: JAX arrays on cpu.*CUDA GPUs only"):
        jax.jit(lambda x: nj.matmul(x, x.T))(a)


@pytest.mark.parametrize("dtype, error, match", [
    ("int32", NvblasltArgumentError, r"^The dtype of operand A \(argument a: int32\) is not supported"),
    ("bool", NvblasltTypeError, r"^a: unknown dtype 'bool'"),
    ("int8", NvblasltArgumentError, r"^The dtype of operand A \(argument a: int8\) is not supported"),
])
def test_dtypes_cublaslt_does_not_take_are_refused_by_name(dtype, error, match):
    with pytest.raises(error, match=match):
        jax.eval_shape(lambda a, b: nj.matmul(a, b), S((8, 4), dtype), S((4, 2), dtype))


def test_shapes_nvblaslt_cannot_plan_are_refused_at_trace_time():
    with pytest.raises(NvblasltValueError, match=r"^a, b: The 'K' extent must match"):
        jax.eval_shape(lambda a, b: nj.matmul(a, b), S((8, 4), jnp.float32), S((5, 2), jnp.float32))
    with pytest.raises(NvblasltValueError, match=r"epilog_inputs\['bias'\]: The extents \(7,\)"):
        jax.eval_shape(lambda a, b, bias: nj.matmul(a, b, epilog="BIAS", epilog_inputs={"bias": bias}),
                       S((8, 4), jnp.float32), S((4, 2), jnp.float32), S((7,), jnp.float32))
    with pytest.raises(NvblasltArgumentError, match=r"epilog_inputs\['bias'\]: expected dtype float16"):
        jax.eval_shape(lambda a, b, bias: nj.matmul(a, b, epilog="BIAS", epilog_inputs={"bias": bias}),
                       S((8, 4), jnp.float16), S((4, 2), jnp.float16), S((8,), jnp.float32))
    with pytest.raises(NvblasltValueError, match=r"epilog_inputs: The epilog RELU_BIAS requires"):
        jax.eval_shape(lambda a, b: nj.matmul(a, b, epilog="RELU_BIAS"), S((8, 4), jnp.float32),
                       S((4, 2), jnp.float32))
    with pytest.raises(NvblasltValueError, match=r"^beta: A value for beta must be provided"):
        jax.eval_shape(lambda a, b, c: nj.matmul(a, b, c), S((8, 4), jnp.float32), S((4, 2), jnp.float32),
                       S((8, 2), jnp.float32))


def test_arguments_without_meaning_in_jax_are_refused_by_name():
    a, b = S((8, 4), jnp.float32), S((4, 2), jnp.float32)
    for name in ("stream", "out", "algorithm", "qualifiers"):
        with pytest.raises(NvblasltValueError, match=rf"^{name}: not available in nvblaslt.jax"):
            jax.eval_shape(lambda a, b: nj.matmul(a, b, **{name: 0}), a, b)
    with pytest.raises(NvblasltValueError, match=r"^options.inplace: not available inside JAX"):
        jax.eval_shape(lambda a, b: nj.matmul(a, b, options={"inplace": True}), a, b)
    with pytest.raises(NvblasltTypeError, match=r"^alpha: expected a Python number .* got a traced JAX value"):
        jax.eval_shape(lambda a, b, s: nj.matmul(a, b, alpha=s), a, b, S((), jnp.float32))
    with pytest.raises(NvblasltTypeError, match=r"^a: expected a JAX array, got list"):
        nj.matmul([[1.0]], jnp.ones((1, 1)))
    with pytest.raises(NvblasltTypeError, match=r"^epilog_inputs: expected a dict, got list"):
        jax.eval_shape(lambda a, b: nj.matmul(a, b, epilog_inputs=[1]), a, b)


def test_gradients_through_a_backward_epilog_or_fp8_are_refused():
    with pytest.raises(NvblasltUnsupportedError, match=r"^a: jax.grad through nvblaslt.jax.matmul takes real"):
        jax.eval_shape(jax.grad(lambda a, b: nj.matmul(a, b).real.sum()), S((8, 4), jnp.complex64),
                       S((4, 2), jnp.complex64))


def test_dense_refuses_unknown_activations_and_counts():
    x, kernel = S((8, 4), jnp.float32), S((4, 2), jnp.float32)
    with pytest.raises(NvblasltValueError, match=r"^activations: expected one of"):
        jax.eval_shape(lambda x, k: nj.dense(x, [(k, None)], "tanh"), x, kernel)
    with pytest.raises(NvblasltValueError, match=r"^activations: expected one per layer \(1\), got 2"):
        jax.eval_shape(lambda x, k: nj.dense(x, [(k, None)], ("relu", "relu")), x, kernel)
    with pytest.raises(NvblasltValueError, match=r"^backward: expected one of \('auto', 'unfused', 'bgradb', 'epilog'\)"):
        jax.eval_shape(lambda x, k: nj.dense(x, [(k, None)], "relu", backward="fused"), x, kernel)


def test_ragged_dot_checks_before_any_gpu_work():
    lhs, rhs, sizes = jnp.ones((32, 16), jnp.bfloat16), jnp.ones((4, 16, 8), jnp.bfloat16), jnp.array([8, 0, 20, 4])
    try:
        nvblaslt._grouped_version.require_grouped(nvblaslt.library())
    except NvblasltUnsupportedError:  # an older cuBLASLt: refused naming the version, before anything else
        with pytest.raises(NvblasltUnsupportedError, match=r"grouped GEMM needs cuBLASLt 13.4 or newer; the loaded"):
            nj.ragged_dot(lhs, rhs, sizes)
        return
    with pytest.raises(NvblasltValueError, match=r"^lhs, rhs: JAX's backend is cpu"):
        nj.ragged_dot(lhs, rhs, sizes)
    with pytest.raises(NvblasltTypeError, match=r"^lhs: expected bfloat16 or float16"):
        nj.ragged_dot(lhs.astype(jnp.float32), rhs, sizes)
    with pytest.raises(NvblasltValueError, match=r"^lhs, rhs, group_sizes: k and g must agree"):
        nj.ragged_dot(lhs, rhs[:3], sizes)
    with pytest.raises(NvblasltValueError, match=r"^group_offset: not supported"):
        nj.ragged_dot(lhs, rhs, sizes, group_offset=jnp.array([0]))


def test_every_refusal_is_an_nvblaslt_error():
    assert issubclass(NvblasltValueError, NvblasltError) and issubclass(NvblasltTypeError, NvblasltError)


def test_autotune_checks_its_arguments_and_nests():
    from nvblaslt.jax import _tuning

    with pytest.raises(NvblasltValueError, match=r"^iterations: expected an int ≥ 1"):
        nj.autotune(iterations=0)
    with pytest.raises(NvblasltTypeError, match=r"^iterations: expected an int ≥ 1 .* got True"):
        nj.autotune(iterations=True)
    with pytest.raises(NvblasltTypeError, match=r"^search: expected a bool, got int"):
        nj.autotune(search=1)
    assert _tuning.active() is None
    with nj.autotune(search=False, iterations=2):
        outer = _tuning.active()
        assert (outer.search, outer.iterations) == (False, 2)
        with nj.autotune():
            inner = _tuning.active()
            assert inner.search and inner.generation > outer.generation  # plans of the outer one are made again
        assert _tuning.active() == outer
    assert _tuning.active() is None
    assert isinstance(nj.python_entries(), int)
