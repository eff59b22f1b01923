"""fp8 in nvblaslt.jax.matmul with JAX's CPU build: scales as numbers and as JAX arrays, amax outputs, the
fp8 GELU aux, their shapes and dtypes at trace time, refusals by name, and that a scale array's new value
(or new buffer) is no new spec, trace or plan.

Nothing here runs a GEMM (no GPU): ``jax.eval_shape`` and ``jax.make_jaxpr`` trace the calls; the bridge's
plan keys are checked with a stand-in plan (``tests.fakes.StandInEntry``).
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from nvblaslt import (MatmulEpilogPreferences, MatmulPlanPreferences, MatmulQuantizationScales,  # noqa: E402
                      NvblasltArgumentError, NvblasltTypeError, NvblasltUnsupportedError, NvblasltValueError)

from tests import skips  # noqa: E402

skips.without_library()

import nvblaslt.jax as nj  # noqa: E402
from nvblaslt.jax import _bridge  # noqa: E402
from tests.fakes import StandInEntry  # noqa: E402

S = jax.ShapeDtypeStruct
E4M3, E5M2 = jnp.float8_e4m3fn, jnp.float8_e5m2
A, B = S((64, 32), E4M3), S((32, 48), E4M3)
SCALE = S((), jnp.float32)
BIAS = S((64,), jnp.bfloat16)
FP8_AUX = {"epilog": {"aux_type": "float8_e4m3fn", "aux_amax": True}}


def shapes(f, *args):
    return jax.tree_util.tree_map(lambda s: (s.shape, s.dtype.name), jax.eval_shape(f, *args))


def gemm_equations(f, *args) -> list:
    return [e for e in jax.make_jaxpr(f)(*args).eqns if e.primitive is _bridge.gemm_p]


def spec_of(f, *args):
    (equation,) = gemm_equations(f, *args)
    return equation.params["spec"]


# ---- what comes back ------------------------------------------------------------------------------
def test_numbers_and_arrays_give_the_same_results_shapes():
    def numbers(a, b, s):
        return nj.matmul(a, b, quantization_scales={"a": 2.0, "b": 0.5, "d": 4.0})

    def arrays(a, b, s):
        return nj.matmul(a, b, quantization_scales={"a": s, "b": s, "d": s})

    def mixed(a, b, s):
        return nj.matmul(a, b, quantization_scales=MatmulQuantizationScales(a=s, b=0.5, d=s.reshape(1)))

    for f in (numbers, arrays, mixed):
        assert shapes(f, A, B, SCALE) == ((64, 48), "float8_e4m3fn")  # fp8 operands' default result: fp8
    assert shapes(lambda a, b, s: nj.matmul(a, b, quantization_scales={"a": s, "b": 1.0}, result_type="bfloat16"),
                  A, B, SCALE) == ((64, 48), "bfloat16")


def test_e5m2_in_one_operand():
    d = shapes(lambda a, b, s: nj.matmul(a, b, quantization_scales={"a": s, "b": s, "d": 1.0},
                                         result_type="float8_e5m2"), A, S((32, 48), E5M2), SCALE)
    assert d == ((64, 48), "float8_e5m2")
    with pytest.raises(NvblasltArgumentError, match=r"result_type|float8_e5m2"):  # e4m3 × e4m3 gives no e5m2 D
        jax.eval_shape(lambda a, b: nj.matmul(a, b, quantization_scales={"a": 1.0, "b": 1.0, "d": 1.0},
                                              result_type="float8_e5m2"), A, B)


def test_result_amax_comes_back_in_aux_as_nvblaslt_matmul_returns_it():
    d, aux = shapes(lambda a, b, s: nj.matmul(a, b, quantization_scales={"a": s, "b": s, "d": s},
                                              options={"result_amax": True}), A, B, SCALE)
    assert d == ((64, 48), "float8_e4m3fn") and aux == {"result_amax": ((1,), "float32")}
    d, aux = shapes(lambda a, b, bias: nj.matmul(a, b, quantization_scales={"a": 1.0, "b": 1.0, "d": 1.0},
                                                 epilog="RELU_AUX_BIAS", epilog_inputs={"bias": bias},
                                                 options={"result_amax": True}), A, B, BIAS)
    assert aux == {"relu_aux": ((16, 48), "uint8"), "result_amax": ((1,), "float32")}


def test_fp8_gelu_aux_with_its_scale_and_amax():
    def f(a, b, s, bias):
        return nj.matmul(a, b, quantization_scales={"a": s, "b": 1.0}, result_type="bfloat16", epilog="GELU_AUX_BIAS",
                         epilog_inputs={"bias": bias, "aux_quantization_scale": s}, preferences=FP8_AUX)

    d, aux = shapes(f, A, B, SCALE, BIAS)
    assert d == ((64, 48), "bfloat16")
    assert aux == {"gelu_aux": ((64, 48), "float8_e4m3fn"), "gelu_aux_amax": ((1,), "float32")}
    # the aux type as a JAX dtype, the preferences as nvblaslt's objects; the scale as a number
    preferences = MatmulPlanPreferences(epilog=MatmulEpilogPreferences(aux_type=E5M2))
    d, aux = shapes(lambda a, b: nj.matmul(a, b, quantization_scales={"a": 1.0, "b": 1.0, "d": 1.0},
                                           epilog="GELU_AUX", epilog_inputs={"aux_quantization_scale": 0.5},
                                           preferences=preferences, options={"result_amax": True}), A, B)
    assert d == ((64, 48), "float8_e4m3fn")
    assert aux == {"gelu_aux": ((64, 48), "float8_e5m2"), "result_amax": ((1,), "float32")}
    # no aux type: an fp8 D's GELU aux is in C's type (nvmath-python's rule)
    _, aux = shapes(lambda a, b: nj.matmul(a, b, quantization_scales={"a": 1.0, "b": 1.0, "d": 1.0},
                                           epilog="GELU_AUX"), A, B)
    assert aux == {"gelu_aux": ((64, 48), "float16")}


def test_vmap_folds_the_batch_and_keeps_an_unmapped_scale_array():
    f = jax.vmap(lambda a, b, s: nj.matmul(a, b, quantization_scales={"a": s, "b": 1.0, "d": s}),
                 in_axes=(0, None, None))
    assert shapes(f, S((3, 64, 32), E4M3), B, SCALE) == ((3, 64, 48), "float8_e4m3fn")
    # a batched GEMM's amax is one over the whole batch, not one per mapped element: refused, not made up
    f = jax.vmap(lambda a, b, s: nj.matmul(a, b, quantization_scales={"a": s, "b": 1.0, "d": s},
                                           options={"result_amax": True}), in_axes=(0, None, None))
    with pytest.raises(NvblasltValueError, match=r"^options.result_amax: vmap of an fp8 GEMM with an amax is not"):
        jax.eval_shape(f, S((3, 64, 32), E4M3), B, SCALE)
    # batched operands give that one amax, as nvblaslt.matmul does
    _, aux = shapes(lambda a, b: nj.matmul(a, b, quantization_scales={"a": 1.0, "b": 1.0, "d": 1.0},
                                           options={"result_amax": True}), S((3, 64, 32), E4M3), B)
    assert aux == {"result_amax": ((1,), "float32")}


# ---- what is passed to XLA and planned ------------------------------------------------------------
def test_scale_arrays_are_buffers_after_the_operands_and_numbers_are_static():
    f = lambda a, b, s: nj.matmul(a, b, quantization_scales={"a": s, "b": 0.5, "d": s * 2})  # noqa: E731
    (equation,) = gemm_equations(f, A, B, SCALE)
    spec = equation.params["spec"]
    assert spec.scales == (("b", 0.5),) and spec.scale_arrays == ("a", "d")
    assert len(equation.invars) == 4  # a, bᵀ, then the two scales
    assert [v.aval.shape for v in equation.invars] == [(64, 32), (48, 32), (), ()]
    assert spec.b.transposed and spec.b.shape == (48, 32)  # fp8 kernels read B column-major: b's transpose
    assert spec.plan_scales() == ({"b": 0.5, "a": 1.0, "d": 1.0}, None)  # arrays planned on a placeholder
    aux = spec_of(lambda a, b, s, bias: nj.matmul(a, b, quantization_scales={"a": 1.0, "b": 1.0},
                                                  result_type="bfloat16", epilog="GELU_AUX_BIAS",
                                                  epilog_inputs={"bias": bias, "aux_quantization_scale": s},
                                                  preferences=FP8_AUX), A, B, SCALE, BIAS)
    assert aux.scale_arrays == ("aux",) and aux.plan_scales() == ({"a": 1.0, "b": 1.0}, 1.0)


def test_each_scale_array_is_pointed_at_its_own_descriptor_attribute():
    from nvblaslt.jax._planning import scale_attributes

    # a row-major D is planned as the transposed problem: cuBLASLt's A is the caller's b, and so is its scale
    spec = spec_of(lambda a, b, s: nj.matmul(a, b, quantization_scales={"a": s, "b": s, "d": s}), A, B, SCALE)
    assert scale_attributes(spec) == ("B_SCALE_POINTER", "A_SCALE_POINTER", "D_SCALE_POINTER")
    # GELU_AUX needs a column-major D: not transposed
    spec = spec_of(lambda a, b, s: nj.matmul(a, b, quantization_scales={"a": s, "b": 1.0, "d": 1.0}, epilog="GELU_AUX",
                                             epilog_inputs={"aux_quantization_scale": s}, preferences=FP8_AUX),
                   A, B, SCALE)
    assert scale_attributes(spec) == ("A_SCALE_POINTER", "EPILOGUE_AUX_SCALE_POINTER")


def test_a_new_scale_value_is_the_same_spec():
    def step(a, b, s):
        return nj.matmul(a, b, quantization_scales={"a": s, "b": s, "d": s})

    # jit's cache is keyed on the arguments' shapes and dtypes, and the plans on the spec: an array's value is
    # in neither (a number's is: it is planned for)
    specs = {spec_of(step, A, B, jnp.float32(value)) for value in (1.0, 0.25, 3.0)}
    assert len(specs) == 1 and next(iter(specs)).scales == ()
    assert spec_of(lambda a, b: nj.matmul(a, b, quantization_scales={"a": 1.0, "b": 2.0, "d": 1.0}), A, B) != \
        spec_of(lambda a, b: nj.matmul(a, b, quantization_scales={"a": 1.0, "b": 3.0, "d": 1.0}), A, B)


class _StandIn(StandInEntry):
    made: list = []

    def __init__(self, spec, outputs, pointers, stream, device):
        super().__init__(device, stream)
        self.pointers = [pointers]

    def run(self, pointers, out_pointers, stream):
        self.pointers.append(pointers)


class _Buffer:
    dtype = np.dtype(np.float32)  # a scale's: read through __cuda_array_interface__

    def __init__(self, pointer):
        self.__cuda_array_interface__ = {"data": (pointer, False)}


class _Context:
    stream = 100


def test_new_scale_buffers_make_no_new_plan(monkeypatch):
    _StandIn.made = []
    monkeypatch.setattr(_bridge, "_Entry", _StandIn)
    monkeypatch.setattr(_bridge, "_latest", {})
    monkeypatch.setattr(_bridge._local, "plans", {}, raising=False)
    monkeypatch.setattr(_bridge, "device_of", lambda stream, pointer: 0)
    monkeypatch.setattr(_bridge._cuda, "several_devices", lambda: False)
    monkeypatch.setattr(_bridge._cuda, "is_capturing", lambda stream: False)
    spec = spec_of(lambda a, b, s: nj.matmul(a, b, quantization_scales={"a": s, "b": 1.0, "d": s}), A, B, SCALE)
    _, outputs = _bridge.outputs_of(spec)
    launch = _bridge._launch
    operands = [_Buffer(1 << 20), _Buffer(2 << 20)]
    out = _Buffer(3 << 20)
    # delayed scaling: new scale values, in buffers XLA places anywhere (a 4-byte alignment included)
    for scale_a, scale_d in ((4 << 20, 5 << 20), (6 << 20 | 4, 7 << 20 | 64), (8 << 20, 9 << 20 | 16)):
        launch(spec, outputs, _Context(), [out], *operands, _Buffer(scale_a), _Buffer(scale_d))
    (entry,) = _StandIn.made
    assert [p[2:] for p in entry.pointers] == [[4 << 20, 5 << 20], [4 << 20, 5 << 20], [6 << 20 | 4, 7 << 20 | 64],
                                               [8 << 20, 9 << 20 | 16]]
    launch(spec, outputs, _Context(), [out], _Buffer(1 << 20 | 16), operands[1], _Buffer(4 << 20), _Buffer(5 << 20))
    assert len(_StandIn.made) == 2  # an operand's alignment is in the key: that is a new plan


def test_a_plan_sets_a_scale_pointer_only_when_it_changes():
    entry = object.__new__(_bridge._Entry)  # the pointer bookkeeping alone: the plan itself needs a GPU
    set_a, set_d = [], []
    entry.scale_setters, entry.scale_pointers = [set_a.append, set_d.append], [None, None]
    for pointers in ([4096, 8192], [4096, 8192], [4096, 12288]):
        entry._point_scales(pointers)
    assert set_a == [4096] and set_d == [8192, 12288]


# ---- refused by name, at trace time -----------------------------------------------------------------
@pytest.mark.parametrize("scales, error, message", [
    ({"a": 1.0, "b": 1.0}, NvblasltValueError, r"^quantization_scales: Scales are required .* missing \['d'\]"),
    ({"a": 1.0, "b": 1.0, "d": 1.0, "e": 1.0}, NvblasltValueError, r"^quantization_scales: expected keys among"),
    ({"a": True, "b": 1.0, "d": 1.0}, NvblasltTypeError, r"^quantization_scales\['a'\]: expected a number or a "),
    ({"a": float("nan"), "b": 1.0, "d": 1.0}, NvblasltValueError, r"^quantization_scales\['a'\]: nan is not a finite"),
    ({"a": "2", "b": 1.0, "d": 1.0}, NvblasltTypeError, r"^quantization_scales\['a'\]: expected a number or a "),
    ([1.0, 1.0], NvblasltTypeError, r"^quantization_scales: expected a dict"),
])
def test_bad_scales_are_refused_by_name(scales, error, message):
    with pytest.raises(error, match=message):
        jax.eval_shape(lambda a, b: nj.matmul(a, b, quantization_scales=scales), A, B)


def test_scale_arrays_must_be_one_float32():
    for scale in (S((), jnp.float16), S((2,), jnp.float32), S((1, 1), jnp.float32)):
        with pytest.raises(NvblasltValueError, match=r"^quantization_scales\['b'\]: expected a number or a float32 "
                                                     r"JAX array of shape \(\) or \(1,\), got a"):
            jax.eval_shape(lambda a, b, s: nj.matmul(a, b, quantization_scales={"a": 1.0, "b": s, "d": 1.0}), A, B,
                           scale)
    with pytest.raises(NvblasltValueError, match=r"^quantization_scales\['a'\]: a JAX array on cpu"):
        on_cpu = jnp.ones((), jnp.float32)
        jax.eval_shape(lambda a, b: nj.matmul(a, b, quantization_scales={"a": on_cpu, "b": 1.0, "d": 1.0}), A, B)


def test_scales_where_nothing_is_fp8_and_amax_of_a_wide_result_are_refused():
    a, b = S((64, 32), jnp.bfloat16), S((32, 48), jnp.bfloat16)
    with pytest.raises(NvblasltValueError, match=r"^quantization_scales: only fp8 operands or results take scales"):
        jax.eval_shape(lambda a, b, s: nj.matmul(a, b, quantization_scales={"a": s}), a, b, SCALE)
    with pytest.raises(NvblasltValueError, match=r"^quantization_scales\['d'\]: Quantization scaling is not supported"):
        jax.eval_shape(lambda a, b: nj.matmul(a, b, quantization_scales={"a": 1.0, "b": 1.0, "d": 1.0},
                                              result_type="bfloat16"), A, B)
    with pytest.raises(NvblasltValueError, match=r"^options.result_amax: result_amax=True is allowed only for "
                                                 r"narrow-precision .* the result is bfloat16"):
        jax.eval_shape(lambda a, b: nj.matmul(a, b, quantization_scales={"a": 1.0, "b": 1.0}, result_type="bfloat16",
                                              options={"result_amax": True}), A, B)
    with pytest.raises(NvblasltValueError, match=r"^options.result_amax: .* the result is bfloat16"):
        jax.eval_shape(lambda a, b: nj.matmul(a, b, epilog="RELU", options={"result_amax": True}), a, b)


def test_the_fp8_aux_and_its_scale_and_amax_go_together():
    def gelu(preferences, scale=None, epilog="GELU_AUX"):
        inputs = {} if scale is None else {"aux_quantization_scale": scale}
        return lambda a, b: nj.matmul(a, b, quantization_scales={"a": 1.0, "b": 1.0}, result_type="bfloat16",
                                      epilog=epilog, epilog_inputs=inputs, preferences=preferences)

    with pytest.raises(NvblasltValueError, match=r"^epilog_inputs\['aux_quantization_scale'\]: required when"):
        jax.eval_shape(gelu({"epilog": {"aux_type": "float8_e4m3fn"}}), A, B)
    with pytest.raises(NvblasltValueError, match=r"^epilog_inputs\['aux_quantization_scale'\]: only an fp8 aux"):
        jax.eval_shape(gelu(None, 1.0), A, B)
    with pytest.raises(NvblasltValueError, match=r"^preferences.epilog.aux_amax: only an fp8 aux"):
        jax.eval_shape(gelu({"epilog": {"aux_amax": True}}), A, B)
    with pytest.raises(NvblasltValueError, match=r"^preferences.epilog.aux_type: only GELU_AUX epilogs take an aux"):
        jax.eval_shape(gelu(FP8_AUX, 1.0, epilog="RELU_AUX"), A, B)
    with pytest.raises(NvblasltValueError, match=r"^preferences.epilog: unknown keys \['aux_scale'\]"):
        jax.eval_shape(gelu({"epilog": {"aux_scale": 1.0}}), A, B)
    with pytest.raises(NvblasltValueError, match=r"^epilog_inputs\['aux_quantization_scale'\]: expected a number or"):
        jax.eval_shape(lambda a, b, s: gelu(FP8_AUX, s)(a, b), A, B, S((2,), jnp.float32))


def test_fp8_shapes_and_layouts_cublaslt_refuses_are_refused_by_name():
    with pytest.raises(NvblasltValueError, match=r"^a, b: the sizes of an fp8 matmul must be divisible by 16"):
        jax.eval_shape(lambda a, b: nj.matmul(a, b, quantization_scales={"a": 1.0, "b": 1.0, "d": 1.0}),
                       S((64, 24), E4M3), S((24, 48), E4M3))
    with pytest.raises(NvblasltArgumentError, match=r"bias"):  # an fp8 D takes a 16-bit bias only
        jax.eval_shape(lambda a, b, bias: nj.matmul(a, b, quantization_scales={"a": 1.0, "b": 1.0, "d": 1.0},
                                                    epilog="BIAS", epilog_inputs={"bias": bias}),
                       A, B, S((64,), jnp.float32))


def test_vmap_over_a_scale_is_refused_by_name():
    f = jax.vmap(lambda a, s: nj.matmul(a, jnp.zeros((32, 48), E4M3), quantization_scales={"a": s, "b": 1.0, "d": 1.0}))
    with pytest.raises(NvblasltValueError, match=r"^quantization_scales\['a'\]: vmap over a scale is not supported"):
        jax.eval_shape(f, S((3, 64, 32), E4M3), S((3,), jnp.float32))


def test_jax_grad_through_fp8_is_refused_by_name():
    def loss(x, s, b):
        return nj.matmul(x.astype(E4M3), b, quantization_scales={"a": s, "b": 1.0},
                         result_type="bfloat16").astype(jnp.float32).sum()

    for argnums in (0, 1):  # through the operand and through the scale
        with pytest.raises(NvblasltUnsupportedError, match=r"^a, b: jax.grad through nvblaslt.jax.matmul takes real "
                                                           r"16-, 32- or 64-bit operands, got fp8"):
            jax.eval_shape(jax.grad(loss, argnums=argnums), S((64, 32), jnp.float32), SCALE, B)


@pytest.mark.parametrize("scales", [{}, {"a": None, "b": None}, MatmulQuantizationScales()], ids=repr)
def test_scales_that_give_no_scale_leave_a_wide_matmul_differentiable(scales):
    # nothing to scale (nvmath-python code passes an empty MatmulQuantizationScales): jax.grad as without them
    a, b = S((64, 32), jnp.bfloat16), S((32, 48), jnp.bfloat16)
    grads = jax.eval_shape(jax.grad(lambda a, b: nj.matmul(a, b, quantization_scales=scales).astype(jnp.float32)
                                    .sum(), argnums=(0, 1)), a, b)
    assert [(g.shape, g.dtype) for g in grads] == [((64, 32), jnp.bfloat16), ((32, 48), jnp.bfloat16)]


def test_jax_grad_through_a_backward_epilog_is_refused_by_name():
    a, b, aux = S((64, 32), jnp.float32), S((32, 16), jnp.float32), S((16, 16), jnp.uint8)
    with pytest.raises(NvblasltUnsupportedError, match=r"^epilog: jax.grad through nvblaslt.jax.matmul differentiates "
                                                       r"DEFAULT, BIAS, RELU\* and GELU\* .* got DRELU"):
        jax.eval_shape(jax.grad(lambda a, b, aux: nj.matmul(a, b, epilog="DRELU", epilog_inputs={"relu_aux": aux})
                                .sum()), a, b, aux)


def test_numpy_scalars_are_numbers():
    spec = spec_of(lambda a, b: nj.matmul(a, b, quantization_scales={"a": np.float32(0.5), "b": np.array([2.0]),
                                                                     "d": 1}), A, B)
    assert spec.scales == (("a", 0.5), ("b", 2.0), ("d", 1.0)) and spec.scale_arrays == ()


@pytest.mark.parametrize("dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2])
def test_an_fp8_buffer_s_pointer_is_read_through_dlpack(dtype):
    # XLA's fp8 buffers have no __cuda_array_interface__ on the GPU; a JAX array (which has DLPack) stands in
    from nvblaslt.jax import _bridge

    x = jnp.arange(8, dtype=jnp.float32).astype(dtype)[2:]
    x = jnp.array(x)  # its own buffer
    assert _bridge._pointer(x) == x.unsafe_buffer_pointer()
