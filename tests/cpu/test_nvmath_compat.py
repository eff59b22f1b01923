"""nvmath-python compatibility (issue 21) on a machine without a GPU: the error classes code written
for nvmath-python catches, nvmath-python's phrases in the messages (after the argument's name), its
fp8 rules before any GPU work, epilog_inputs keys, algorithms that pickle, capabilities by attribute,
cluster shapes as tuples, the options it accepts, and the algorithm bookkeeping of a launch
(``keep`` for ``autotune(prune=)``, ``planned_algorithm`` for ``execute(algorithm=)``).

GPU operands are stand-ins (tests/fakes.py): their pointers are never read. Where a call must get
*past* every check, the first GPU step is replaced by ``Reached``."""

from __future__ import annotations

import pickle
import re
from types import SimpleNamespace

import numpy as np
import pytest

import nvblaslt
from nvblaslt import (Matmul, MatmulEpilog, MatmulOptions, MatmulPlanPreferences, MatmulQuantizationScales,
                      NvblasltAlgorithmError, NvblasltArgumentError, NvblasltError, NvblasltStateError,
                      NvblasltTypeError, NvblasltValueError, _dtypes, _epilogs, _host, _scales, matmul)
from nvblaslt._descriptors import Capabilities, HeuristicResult
from nvblaslt._launch import Launch, algorithm_structs
from tests.fakes import FakeDLPack, Reached, StandInLaunch, forbid_gpu_work, fortran, reached

E = MatmulEpilog
F8 = "float8_e4m3fn"
A_PTR, B_PTR, C_PTR, BIAS_PTR, NEW_PTR = (0x7F0000000000, 0x7F0000100000, 0x7F0000200000, 0x7F0000300000,
                                          0x7F0000400000)
ONES = {"a": 1.0, "b": 1.0}  # fp8 operands always take scales (nvmath-python's rule)
RNG = np.random.default_rng()


@pytest.fixture
def no_gpu_work(monkeypatch, default_lib):
    """Host staging and scale uploads fail the test; the first CUDA device question (where a
    constructor's GPU work starts) raises ``Reached``."""
    return forbid_gpu_work(monkeypatch, device_query=reached)


@pytest.fixture
def fake_gpu(monkeypatch, default_lib):
    """Plans over stand-in GPU arrays can be made: scale uploads are recorded (not made) and
    ``Launch.planned`` (descriptors, handle, heuristics) raises ``Reached``. Returns the uploads."""
    written: list = []
    monkeypatch.setattr(_scales.Scales, "write", lambda self, scales, stream: written.append(dict(scales)))
    monkeypatch.setattr(Launch, "planned", classmethod(reached))
    return written


def host(shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


class HostDLPack:
    """A host array seen only through DLPack: the same (protocol) package as ``FakeDLPack``."""

    def __init__(self, array):
        self.array = array

    def __dlpack_device__(self):
        return 1, 0  # kDLCPU

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__()


def fake_mm(m=8, k=4, n=6, dtype="float32"):
    return Matmul(FakeDLPack((m, k), dtype=dtype, ptr=A_PTR), FakeDLPack((k, n), dtype=dtype, ptr=B_PTR))


def fp8_operands(m=32, k=16, n=48, a_ptr=A_PTR, b_ptr=B_PTR):
    """fp8 A row-major (M, K) and B column-major (K, N): cuBLASLt's 'TN' layout."""
    return FakeDLPack((m, k), dtype=F8, ptr=a_ptr), fortran((k, n), F8, ptr=b_ptr)


def both_forms(form, *args, **kwargs):
    return Matmul(*args, **kwargs) if form == "Matmul" else matmul(*args, **kwargs)


FORMS = pytest.mark.parametrize("form", ["Matmul", "matmul"])


def assert_argument_error(error):
    assert isinstance(error, NvblasltArgumentError)
    assert isinstance(error, TypeError) and isinstance(error, ValueError) and isinstance(error, NvblasltError)


# ---- error classes ------------------------------------------------------------------------------
def test_the_error_classes_derive_from_what_nvmath_python_raises():
    assert issubclass(NvblasltArgumentError, TypeError) and issubclass(NvblasltArgumentError, ValueError)
    assert issubclass(NvblasltArgumentError, NvblasltTypeError) and issubclass(NvblasltArgumentError,
                                                                               NvblasltValueError)
    assert issubclass(NvblasltStateError, RuntimeError) and issubclass(NvblasltStateError, ValueError)
    assert issubclass(NvblasltAlgorithmError, TypeError) and issubclass(NvblasltAlgorithmError, AssertionError)
    for cls in (NvblasltArgumentError, NvblasltStateError, NvblasltAlgorithmError):
        assert issubclass(cls, NvblasltError) and getattr(nvblaslt, cls.__name__) is cls
        assert cls.__name__ in nvblaslt.__all__


ARGUMENT_ERRORS = {
    "float16 x float32": (lambda: (host((4, 3), np.float16), host((3, 6))),
                          r"^a, b: Unsupported combination of dtypes for operands A float16 and B float32"),
    "int64": (lambda: (host((4, 3), np.int64), host((3, 6), np.int64)),
              r"^The dtype of operand A \(argument a: int64\) is not supported; expected one of float32"),
    "int8": (lambda: (host((4, 3), np.int8), host((3, 6), np.int8)), r"^The dtype of operand A \(argument a: int8\) is not"),
    "host and GPU": (lambda: (FakeDLPack((4, 3), ptr=A_PTR), HostDLPack(host((3, 6)))),
                     r"^a, b, c: operands are not on the same device: they must all be in GPU memory or all in host"),
}


@FORMS
@pytest.mark.parametrize("case", ARGUMENT_ERRORS)
def test_dtype_and_memory_space_refusals_are_both_type_and_value_errors(case, form, no_gpu_work):
    make, pattern = ARGUMENT_ERRORS[case]
    with pytest.raises(ValueError, match=pattern) as as_value:  # as nvmath-python raises it
        both_forms(form, *make())
    assert_argument_error(as_value.value)
    with pytest.raises(TypeError, match=pattern):  # as earlier nvblaslt releases raised it
        both_forms(form, *make())
    assert no_gpu_work == []


def test_an_epilog_input_in_another_memory_space_or_of_a_wrong_dtype_is_an_argument_error(fake_gpu):
    mm = fake_mm()
    with pytest.raises(ValueError, match=r"^epilog_inputs\['bias'\]: The operand bias is on device cpu "
                                         r"\(host memory\), but it should be on device cuda:0") as info:
        mm.plan(epilog="BIAS", epilog_inputs={"bias": HostDLPack(host((8,)))})
    assert_argument_error(info.value)
    with pytest.raises(TypeError, match=r"^epilog_inputs\['bias'\]: expected dtype float32 for a float32 result, got "
                                        r"float64") as info:
        mm.plan(epilog="BIAS", epilog_inputs={"bias": FakeDLPack((8,), dtype="float64", ptr=BIAS_PTR)})
    assert_argument_error(info.value)
    with pytest.raises(Reached):  # the right one gets past every check
        mm.plan(epilog="BIAS", epilog_inputs={"bias": FakeDLPack((8,), ptr=BIAS_PTR)})


def test_state_refusals_are_runtime_and_value_errors(default_lib):
    mm = fake_mm()
    for call in (mm.execute, mm.autotune):
        with pytest.raises(RuntimeError, match=r"^execute/autotune: call plan\(\) first") as info:
            call()
        assert isinstance(info.value, NvblasltStateError) and isinstance(info.value, ValueError)
    mm.release_operands()
    with pytest.raises(RuntimeError, match=r"^execute: cannot be performed after the operands have been released by "
                                           r"release_operands\(\)") as info:
        mm.execute()
    assert isinstance(info.value, ValueError)
    mm.free()
    for call in (mm.execute, mm.plan, mm.release_operands, mm.applicable_algorithm_ids):
        with pytest.raises(NvblasltStateError, match="this Matmul was freed"):
            call()


@pytest.mark.parametrize("item", [None, 0, "algo", 1.5, b"\x00" * 8, object()])
def test_what_is_not_an_algorithm_is_an_assertion_and_type_error(item, default_lib):
    for index, given in enumerate(([item], [b"\x00" * 64, item])):
        with pytest.raises(AssertionError, match=rf"^algorithms\[{index}\]: expected an algorithm from "
                                                 r"plan\(\)/autotune\(\), got " + type(item).__name__) as info:
            algorithm_structs(given, default_lib.api)
        assert isinstance(info.value, NvblasltAlgorithmError) and isinstance(info.value, TypeError)


def test_algorithm_structs_reads_every_form_of_an_algorithm(default_lib):
    api = default_lib.api
    result = zeroed_result(default_lib, 7)
    raw = result.as_bytes()
    structs = algorithm_structs([result, result.algorithm, result.algorithm.algo, raw, bytearray(raw),
                                 np.frombuffer(raw, np.uint8)], api)
    assert all(isinstance(s, api.cublasLtMatmulAlgo_t) and bytes(memoryview(s)) == raw for s in structs)
    with pytest.raises(TypeError, match="non-empty list") as info:  # not an algorithm list at all: no assertion
        algorithm_structs([], api)
    assert not isinstance(info.value, AssertionError)


@FORMS
def test_plan_algorithms_of_none_is_an_assertion_error(form, default_lib):
    a, b = FakeDLPack((8, 4), ptr=A_PTR), FakeDLPack((4, 6), ptr=B_PTR)
    with pytest.raises(AssertionError, match=r"^algorithms\[0\]: expected an algorithm"):
        if form == "Matmul":
            Matmul(a, b).plan(algorithms=[None])
        else:
            matmul(a, b, algorithm=0)


# ---- nvmath-python's phrases, after the argument's name ---------------------------------------------
PHRASES = {
    "K extent": (lambda: (host((4, 3)), host((5, 6))), {},
                 r"^a, b: The 'K' extent must match for the operands: K=3 in operand A is not equal to K=5 in "
                 r"operand B"),
    "M of c": (lambda: (host((4, 3)), host((3, 6)), host((5, 6))), {"beta": 1.0},
               r"^c: The M dimension of the C matrix \(5\) must match the M dimension of A \(4\)"),
    "N of c": (lambda: (host((4, 3)), host((3, 6)), host((4, 5))), {"beta": 1.0},
               r"^c: The N dimension of the C matrix \(5\) must match the N dimension of B \(6\)"),
    "empty a": (lambda: (host((0, 3)), host((3, 6))), {}, r"^a: The extents must be strictly positive"),
    "empty b": (lambda: (host((4, 3)), host((3, 0))), {}, r"^b: The extents must be strictly positive"),
    "1-D c": (lambda: (host((4, 3)), host((3, 6)), host((6,))), {"beta": 1.0}, r"^c: `c` must be at least 2-D\."),
    "dtypes": (lambda: (host((4, 3)), host((3, 6), np.float64)), {},
               r"^a, b: Unsupported combination of dtypes for operands A float32 and B float64"),
    "result_amax": (lambda: (host((4, 3)), host((3, 6))), {"options": {"result_amax": True}},
                    r"^options\.result_amax: result_amax=True is allowed only for narrow-precision \(FP8 and lower\) "
                    r"results; the result is float32"),
    "scales for float32": (lambda: (host((4, 3)), host((3, 6))), {"quantization_scales": ONES},
                           r"^quantization_scales: only fp8 operands or results take scales"),
    "blocking": (lambda: (host((4, 3)), host((3, 6))), {"options": {"blocking": False}},
                 r"^options\.blocking: The value specified for blocking must be either True or 'auto'\. Got False"),
}


@FORMS
@pytest.mark.parametrize("case", PHRASES)
def test_messages_carry_nvmath_pythons_phrase_after_the_arguments_name(case, form, no_gpu_work):
    make, keywords, pattern = PHRASES[case]
    with pytest.raises(ValueError, match=pattern) as info:
        both_forms(form, *make(), **keywords)
    assert isinstance(info.value, NvblasltError)
    assert no_gpu_work == []


def test_blocking_is_refused_by_the_options_themselves():
    for value in (False, "yes", None, 0):
        with pytest.raises(NvblasltValueError, match=r"^options\.blocking: The value specified for blocking must be "
                                                     r"either True or 'auto'\. Got " + repr(value).replace(".", r"\.")):
            MatmulOptions(blocking=value)
    assert MatmulOptions(blocking=True).blocking is True and MatmulOptions().blocking == "auto"
    for one in (1, 1.0, np.True_, np.int64(1)):  # what nvmath-python's `in (True, "auto")` lets through
        assert MatmulOptions(blocking=one).blocking is True


def test_quantization_scales_of_another_type_carry_nvmath_pythons_phrase(fake_gpu):
    with pytest.raises(TypeError, match=r"^quantization_scales: Scale factors must be provided as an object of type "
                                        r"MatmulQuantizationScales or as a dict"):
        Matmul(*fp8_operands(), quantization_scales="oh no!")


def test_a_gpu_alpha_is_not_read_before_the_fp8_checks_refuse(fake_gpu):
    """Reading a GPU scalar copies it back and waits: every check that needs nothing of it runs first."""
    from tests.fakes import FakeGpuScalar

    alpha = FakeGpuScalar(2.0)
    with pytest.raises(NvblasltValueError, match="Scales are required"):
        Matmul(*fp8_operands(), alpha=alpha)
    assert alpha.reads == 0


@pytest.mark.parametrize("epilog", [E.BIAS, E.RELU_BIAS, E.GELU_AUX_BIAS])
def test_a_missing_epilog_input_says_which_tensors_the_epilog_requires(epilog, fake_gpu):
    mm = fake_mm()
    with pytest.raises(NvblasltValueError, match=rf"^epilog_inputs: The epilog {epilog.name} requires the following "
                                                 r"input tensors: \{'bias'\}\. Missing \['bias'\]"):
        mm.plan(epilog=epilog)
    with pytest.raises(NvblasltValueError, match=rf"^epilog_inputs: The epilog {epilog.name} requires the following"):
        mm.plan(epilog=epilog, epilog_inputs={"relu_aux": FakeDLPack((8, 6), dtype="int8", ptr=BIAS_PTR)})


def test_a_reset_operand_unlike_the_plans_is_refused_in_nvmath_pythons_words(default_lib):
    mm = fake_mm()
    refusals = {
        r"^a: The extents \(8, 5\) of the new operand must match the extents \(8, 4\) the plan was made for":
            FakeDLPack((8, 5), ptr=NEW_PTR),
        r"^a: The strides \(1, 8\) of the new operand must match the strides \(4, 1\) the plan was made for":
            fortran((8, 4), ptr=NEW_PTR),
        r"^a: The data type of the new operand must match the data type of the original operand\. The plan was made "
        r"for float32, got float16": FakeDLPack((8, 4), dtype="float16", ptr=NEW_PTR),
        r"^a: The new operand is on device 1, but it should be on device 0":
            FakeDLPack((8, 4), ptr=NEW_PTR, device=1),
    }
    for pattern, new in refusals.items():
        with pytest.raises(NvblasltValueError, match=pattern):
            mm.reset_operands(a=new)
    with pytest.raises(TypeError, match=r"^a: Library package mismatch"):  # nvmath-python's words, its class
        mm.reset_operands(a=host((8, 4)))
    assert mm._operands["a"].ptr == A_PTR  # every refused reset left the plan on its operand
    mm.reset_operands(a=FakeDLPack((8, 4), ptr=NEW_PTR))
    assert mm._operands["a"].ptr == NEW_PTR


def test_k_equal_to_one_is_not_supported_for_d_epilogs():
    one = SimpleNamespace(k=1)
    for epilog, key in ((E.DRELU, "relu_aux"), (E.DGELU_BGRAD, "gelu_aux")):
        with pytest.raises(NvblasltValueError, match=rf"^a, b: K=1 is not supported for {epilog.name} epilog"):
            _epilogs.input_keys(epilog, {key: object()}, one)
        assert _epilogs.input_keys(epilog, {key: object()}, SimpleNamespace(k=2)) == (key,)
    assert _epilogs.input_keys(E.BIAS, {"bias": object()}, one) == ("bias",)  # forward epilogs take K=1


# ---- fp8: nvmath-python's rules, all before any GPU work ------------------------------------------
@FORMS
def test_fp8_operands_without_scales_are_refused(form, no_gpu_work):
    with pytest.raises(NvblasltValueError, match=r"^quantization_scales: Scales are required for narrow-precision "
                                                 r"\(FP8 and lower\) operations: give scales for 'a', 'b' "):
        both_forms(form, *fp8_operands(), options={"result_type": "bfloat16"})
    with pytest.raises(NvblasltValueError, match=r"give scales for 'a', 'b', 'd' "):  # an fp8 result needs its own
        both_forms(form, *fp8_operands())
    assert no_gpu_work == []


@FORMS
@pytest.mark.parametrize("scales, missing", [({"a": 1.0}, "'b'"), ({"b": 2.0, "c": None}, "'a'"),
                                             (MatmulQuantizationScales(a=1.0), "'b'"), ({}, "'a', 'b'")])
def test_a_missing_fp8_scale_is_refused(scales, missing, form, no_gpu_work):
    with pytest.raises(NvblasltValueError, match=r"^quantization_scales: Scales are required for narrow-precision "
                                                 r"\(FP8 and lower\) operations, for every fp8 operand and an fp8 "
                                                 rf"result; missing \[{missing}\]"):
        both_forms(form, *fp8_operands(), options={"result_type": "bfloat16"}, quantization_scales=scales)
    assert no_gpu_work == []


@FORMS
def test_only_fp8_operands_and_results_take_scales(form, no_gpu_work):
    a, b = fp8_operands()
    c = fortran((32, 48), "bfloat16", ptr=C_PTR)
    with pytest.raises(NvblasltValueError, match=r"^quantization_scales\['c'\]: Quantization scaling is not supported "
                                                 r"for c when it is not a narrow-precision \(FP8 and lower\) type; it "
                                                 r"is bfloat16"):
        both_forms(form, a, b, c, beta=1.0, quantization_scales={**ONES, "c": 1.0})
    with pytest.raises(NvblasltValueError, match=r"^quantization_scales\['d'\]: Quantization scaling is not supported "
                                                 r"for d when it is not a narrow-precision"):
        both_forms(form, a, b, options={"result_type": "float32"}, quantization_scales={**ONES, "d": 1.0})
    with pytest.raises(NvblasltValueError, match=r"^quantization_scales\['c'\]: Quantization scaling is not supported "
                                                 r"for c"):  # no c at all
        both_forms(form, a, b, options={"result_type": "bfloat16"}, quantization_scales={**ONES, "c": 1.0})
    assert no_gpu_work == []
    with pytest.raises(Reached):  # the same call with only the fp8 operands' scales gets past every check
        both_forms(form, a, b, c, beta=1.0, quantization_scales=ONES)


@FORMS
@pytest.mark.parametrize("m, k, n, odd", [(24, 16, 48, "M=24"), (32, 16, 40, "N=40"), (32, 8, 48, "K=8"),
                                          (33, 17, 47, "M=33, N=47, K=17")])
def test_fp8_sizes_not_divisible_by_16_are_refused(m, k, n, odd, form, no_gpu_work):
    with pytest.raises(NvblasltValueError, match=rf"^a, b: the sizes of an fp8 matmul must be divisible by 16; got "
                                                 rf"{odd} \(M={m}, N={n}, K={k}\)"):
        both_forms(form, *fp8_operands(m, k, n), options={"result_type": "bfloat16"}, quantization_scales=ONES)
    assert no_gpu_work == []


@FORMS
@pytest.mark.parametrize("which, offset, alignment", [("a", 1, 1), ("b", 1, 1), ("a", 8, 8), ("b", 4, 4)])
def test_misaligned_fp8_operands_are_refused(which, offset, alignment, form, no_gpu_work):
    pointers = {"a_ptr": A_PTR, "b_ptr": B_PTR}
    pointers[f"{which}_ptr"] += offset
    with pytest.raises(NvblasltValueError, match=rf"^{which}: fp8 operands should be aligned to 16 bytes; pointer "
                                                 rf"0x{pointers[which + '_ptr']:x} is aligned to {alignment}$"):
        both_forms(form, *fp8_operands(**pointers), options={"result_type": "bfloat16"}, quantization_scales=ONES)
    assert no_gpu_work == []


@FORMS
@pytest.mark.parametrize("result_type, options, scales", [
    ("bfloat16", {}, ONES),
    ("float32", {}, MatmulQuantizationScales(a=2.0, b=0.5)),
    ("float16", {}, {"a": 1.0, "b": np.float32(1.0)}),
    (None, {"result_amax": True}, {**ONES, "d": 1.0}),  # an fp8 result: its scale and its amax
])
def test_a_valid_fp8_tn_matmul_passes_the_checks(result_type, options, scales, form, no_gpu_work):
    a, b = fp8_operands(64, 32, 48, a_ptr=A_PTR + 16, b_ptr=B_PTR + 256)  # 16-byte aligned is enough
    with pytest.raises(Reached):
        both_forms(form, a, b, options={**options, "result_type": result_type}, quantization_scales=scales)
    assert no_gpu_work == []


def test_fp8_scales_on_reset_may_change_any_fp8_key_and_only_those(fake_gpu):
    mm = Matmul(*fp8_operands(), options={"result_type": "bfloat16"}, quantization_scales=ONES)
    assert fake_gpu == [{"a": 1.0, "b": 1.0}]
    mm.reset_operands(quantization_scales={"b": 4.0})  # a subset: the other keep their values
    mm.reset_operands(quantization_scales=MatmulQuantizationScales(a=0.5))
    assert fake_gpu[1:] == [{"b": 4.0}, {"a": 0.5}]
    for key in "cd":
        with pytest.raises(NvblasltValueError, match=rf"^quantization_scales\['{key}'\]: Quantization scaling is not "
                                                     rf"supported for {key} when it is not a narrow-precision"):
            mm.reset_operands(quantization_scales={key: 1.0})
    assert len(fake_gpu) == 3  # the refused resets wrote nothing


def test_epilog_inputs_on_reset_need_a_plan(fake_gpu):
    mm = Matmul(*fp8_operands(), options={"result_type": "bfloat16"}, quantization_scales=ONES)
    for inputs in ({"aux_quantization_scale": 2.0}, {"bias": 1.0}):
        with pytest.raises(NvblasltValueError, match=r"^epilog_inputs: call plan\(\) before resetting epilog inputs"):
            mm.reset_operands(epilog_inputs=inputs)
    assert len(fake_gpu) == 1


@pytest.mark.parametrize("result_type, bias, accepted", [
    ("float32", "bfloat16", True), ("float32", "float16", True), ("float32", "float32", True),
    ("float32", "float64", False), ("bfloat16", "bfloat16", True), ("bfloat16", "float16", True),
    ("bfloat16", "float32", False), (None, "bfloat16", True), (None, "float32", False),
])
def test_fp8_operands_take_a_16_bit_bias(result_type, bias, accepted, fake_gpu):
    scales = ONES if result_type else {**ONES, "d": 1.0}
    mm = Matmul(*fp8_operands(), options={"result_type": result_type}, quantization_scales=scales)
    inputs = {"bias": FakeDLPack((32,), dtype=bias, ptr=BIAS_PTR)}
    if accepted:
        with pytest.raises(Reached):
            mm.plan(epilog="BIAS", epilog_inputs=inputs)
    else:
        with pytest.raises(NvblasltArgumentError, match=rf"^epilog_inputs\['bias'\]: expected dtype .* got {bias}$"):
            mm.plan(epilog="BIAS", epilog_inputs=inputs)


def test_wider_operands_take_only_their_results_bias_type():
    f8, bf16, f16, f32 = _dtypes.FLOAT8_E4M3, _dtypes.BFLOAT16, _dtypes.FLOAT16, _dtypes.FLOAT32
    types = lambda a, d: SimpleNamespace(a=a, b=a, d=d, fp8=a in _dtypes.FLOAT8)  # noqa: E731
    assert _epilogs.bias_types(types(f32, f32)) == (f32,)
    assert _epilogs.bias_types(types(f16, f16)) == (f16,)
    assert _epilogs.bias_types(types(f8, f32)) == (f32, bf16, f16)
    assert _epilogs.bias_types(types(f8, bf16)) == (bf16, f16)
    assert _epilogs.bias_types(types(f8, f8)) == (bf16, f16)


# ---- epilog_inputs keys ----------------------------------------------------------------------------
KEYED = [E.DEFAULT, E.RELU, E.GELU_AUX, E.BIAS, E.RELU_AUX_BIAS, E.GELU_BIAS, E.DRELU, E.DRELU_BGRAD, E.DGELU,
         E.BGRADB]


@pytest.mark.parametrize("epilog", KEYED)
def test_input_keys_refuses_an_extra_key_and_a_missing_one(epilog):
    spec = _epilogs.SPECS[epilog]
    problem = SimpleNamespace(k=16)
    exact = {key: object() for key in spec.inputs}
    assert _epilogs.input_keys(epilog, exact, problem) == spec.inputs
    extra = "gelu_aux" if "gelu_aux" not in spec.inputs else "bias"
    with pytest.raises(ValueError, match=rf"^epilog_inputs: {epilog.name} takes .*; got also \['{extra}'\]$"):
        _epilogs.input_keys(epilog, {**exact, extra: object()}, problem)
    with pytest.raises(NvblasltValueError, match=r"got also \['unknown'\]"):
        _epilogs.input_keys(epilog, {**exact, "unknown": None}, problem)
    for key in spec.inputs:
        with pytest.raises(NvblasltValueError, match=rf"^epilog_inputs: The epilog {epilog.name} requires the "
                                                     rf"following input tensors: .*Missing \['{key}'\]"):
            _epilogs.input_keys(epilog, {k: v for k, v in exact.items() if k != key}, problem)


@FORMS
def test_an_extra_epilog_input_is_refused_on_plan_and_on_the_function_form(form, fake_gpu):
    a, b = FakeDLPack((8, 4), ptr=A_PTR), FakeDLPack((4, 6), ptr=B_PTR)
    bias, extra = FakeDLPack((8,), ptr=BIAS_PTR), FakeDLPack((8, 6), ptr=NEW_PTR)
    for epilog, inputs in (("RELU_BIAS", {"bias": bias, "gelu_aux": extra}), ("DEFAULT", {"bias": bias})):
        with pytest.raises(ValueError, match=r"^epilog_inputs: .* takes .*; got also"):
            if form == "Matmul":
                Matmul(a, b).plan(epilog=epilog, epilog_inputs=inputs)
            else:
                matmul(a, b, epilog=epilog, epilog_inputs=inputs)
    with pytest.raises(Reached):  # without the extra key, the call gets past every check
        if form == "Matmul":
            Matmul(a, b).plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        else:
            matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})


# ---- algorithms: pickles, capabilities, cluster shapes ------------------------------------------------
def zeroed_result(lib, marker: int = 0, workspace: int = 0, waves: float = 0.0) -> HeuristicResult:
    """A HeuristicResult of a zeroed algorithm whose first word is ``marker`` (no GPU needed)."""
    result = lib.api.cublasLtMatmulHeuristicResult_t()
    result.algo.data[0] = marker
    result.workspaceSize, result.wavesCount = workspace, waves
    return HeuristicResult(result, lib)


def test_a_heuristic_result_pickles_as_its_bytes(default_lib):
    result = zeroed_result(default_lib, 0x1234, workspace=4 << 20, waves=0.625)
    result.split_k = 3
    result.cluster_shape = (2, 1, 1)
    assert result.algorithm.workspace_size == 4 << 20  # nvmath-python's algorithm.workspace_size
    back = pickle.loads(pickle.dumps(result))
    assert isinstance(back, HeuristicResult) and back is not result
    assert back.as_bytes() == result.as_bytes() and back.algorithm.algo.data[0] == 0x1234
    assert (back.workspace_size, back.waves, back.algorithm.workspace_size) == (4 << 20, 0.625, 4 << 20)
    assert (back.split_k, back.cluster_shape) == (3, (2, 1, 1))  # the config travels in the bytes
    assert back.algorithm.lib is default_lib
    several = pickle.loads(pickle.dumps([result, zeroed_result(default_lib, 9)]))
    assert [r.algorithm.algo.data[0] for r in several] == [0x1234, 9]
    assert bytes(memoryview(algorithm_structs(several, default_lib.api)[0])) == result.as_bytes()


def test_capabilities_answer_by_name_and_by_nvmath_pythons_attribute(default_lib):
    caps = zeroed_result(default_lib).capabilities
    assert isinstance(caps, Capabilities) and isinstance(caps, dict)
    if "TILE_IDS" in caps:  # a zeroed algorithm: the library may answer nothing without a GPU
        assert caps.tile_ids == caps["TILE_IDS"]
    made = Capabilities({"TILE_IDS": [18, 20], "SPLITK_SUPPORT": 1, "EPILOGUE_MASK": 0})
    assert made.tile_ids == [18, 20] and made.splitk_support == 1 and made.epilogue_mask == 0
    assert made["TILE_IDS"] is made.tile_ids and dict(made) == {"TILE_IDS": [18, 20], "SPLITK_SUPPORT": 1,
                                                                 "EPILOGUE_MASK": 0}
    with pytest.raises(AttributeError, match="stages_ids"):
        made.stages_ids
    assert not hasattr(made, "nothing_such") and getattr(made, "nothing_such", None) is None


def test_cluster_shape_is_an_xyz_tuple(default_lib):
    result = zeroed_result(default_lib)
    members = default_lib.api.cublasLtClusterShape_t
    for shape in ((1, 1, 1), (2, 1, 1), (1, 2, 1), (4, 2, 1), [2, 2, 1]):
        result.cluster_shape = shape
        assert result.cluster_shape == tuple(shape)
        assert result.algorithm.get("CLUSTER_SHAPE_ID") == members["SHAPE_" + "x".join(map(str, shape))]
    for unknown in ((3, 3, 3), (1, 1), (0, 0, 0), (2, 1, 1, 1)):
        with pytest.raises(NvblasltValueError, match=r"^cluster_shape: expected one of the loaded cuBLASLt's cluster "
                                                     r"shapes, got " + repr(tuple(unknown)).replace("(", r"\(")
                                                     .replace(")", r"\)")):
            result.cluster_shape = unknown
        assert result.cluster_shape == (2, 2, 1)  # a refused shape changes nothing
    result.cluster_shape = int(members.SHAPE_AUTO)  # an id: AUTO names no shape, so it reads as the id
    assert result.cluster_shape == int(members.SHAPE_AUTO)


# ---- options -----------------------------------------------------------------------------------
def test_a_negative_device_id_is_refused_where_the_options_are_used(no_gpu_work):
    options = MatmulOptions(device_id=-1)
    assert options.device_id == -1
    for value in (1.5, "0", True):
        with pytest.raises(NvblasltTypeError, match=r"^options\.device_id: expected a GPU ordinal"):
            MatmulOptions(device_id=value)
    for given in (options, {"device_id": -2}):
        for form in ("Matmul", "matmul"):
            with pytest.raises(ValueError, match=r"^options\.device_id: expected a GPU ordinal \(int ≥ 0\), got -"):
                both_forms(form, host((4, 3)), host((3, 6)), options=given)
    assert no_gpu_work == []  # refused before anything was staged
    with pytest.raises(Reached):
        Matmul(host((4, 3)), host((3, 6)), options={"device_id": 0})


class AsyncManager:
    def memalloc_async(self, size, stream):
        raise AssertionError("not called by the options")


class SyncManager:
    def memalloc(self, size):
        raise AssertionError("not called by the options")


class NotAManager:
    memalloc = "not callable"

    def allocate(self, size):
        return 0


def test_the_allocator_is_a_memory_manager_of_either_kind():
    for manager in (AsyncManager(), SyncManager()):
        assert MatmulOptions(allocator=manager).allocator is manager
        assert MatmulOptions(**{"allocator": manager}).allocator is manager
    for bad in (NotAManager(), object(), 42):
        with pytest.raises(TypeError, match=r"^options\.allocator: expected a memory manager with "
                                            r"memalloc_async\(size, stream\) or memalloc\(size\)") as info:
            MatmulOptions(allocator=bad)
        assert isinstance(info.value, NvblasltTypeError) and type(bad).__name__ in str(info.value)


def test_preferences_limit_takes_zero_to_1024():
    for limit in (0, 1, 8, 1024):
        assert MatmulPlanPreferences(limit=limit).limit == limit
    for limit in (-1, 1025, True, 2.0, None):
        with pytest.raises(NvblasltValueError, match=r"^preferences\.limit: expected an int"):
            MatmulPlanPreferences(limit=limit)


def test_applicable_algorithm_ids_refuses_a_limit_below_one_before_any_gpu_work(default_lib):
    mm = fake_mm()
    for limit in (0, -1, True, 2.5):
        with pytest.raises(NvblasltValueError, match=r"^limit: expected a positive int"):
            mm.applicable_algorithm_ids(limit=limit)


# ---- reset_operands_unchecked ------------------------------------------------------------------------
def test_reset_operands_unchecked_takes_the_callers_gpu_arrays_without_comparing(fake_gpu):
    mm = fake_mm()
    like = FakeDLPack((8, 4), ptr=NEW_PTR)
    mm.reset_operands_unchecked(a=like, b=FakeDLPack((4, 6), ptr=NEW_PTR + 4096))
    assert (mm._operands["a"].ptr, mm._operands["b"].ptr) == (NEW_PTR, NEW_PTR + 4096)
    mm.release_operands()
    with pytest.raises(NvblasltValueError, match=r"^b: release_operands\(\) dropped the operands"):
        mm.reset_operands_unchecked(a=like)  # what must be given again still is
    mm.reset_operands_unchecked(a=like, b=FakeDLPack((4, 6), ptr=B_PTR))
    assert mm._released is None and mm._operands["b"].ptr == B_PTR


def test_reset_operands_unchecked_refuses_a_host_array_for_a_gpu_plan(fake_gpu, monkeypatch):
    """Only GPU arrays for a GPU plan are taken on trust: a host array would otherwise be copied into the
    caller's previous GPU array (past its end, for a larger one)."""
    refreshed: list = []
    monkeypatch.setattr(_host, "refresh", lambda *args: refreshed.append(args))
    mm = fake_mm()
    before = mm._operands["a"].ptr
    with pytest.raises(TypeError, match=r"^a: Library package mismatch"):
        mm.reset_operands_unchecked(a=np.ones((9, 5)))
    assert refreshed == [] and mm._operands["a"].ptr == before


class _FakeBuffer:
    pointer = 0x7F0000500000

    def release(self) -> None:
        pass


def test_reset_operands_unchecked_still_checks_host_operands(monkeypatch, default_lib):
    """Host operands are copied into the plan's device copies: a wrong one is refused, unchecked or not."""
    import dataclasses

    def stage(op, device, stream):
        copy = dataclasses.replace(op, ptr=_FakeBuffer.pointer, strides=_host.device_strides(op), device=device,
                                   host=False, conjugated=False)
        return copy, _FakeBuffer()
    refreshed: list = []
    monkeypatch.setattr(_host, "stage", stage)
    monkeypatch.setattr(_host, "refresh", lambda op, pointer, strides, stream: refreshed.append(op.shape))
    mm = Matmul(host((8, 4)), host((4, 6)))
    for reset in (mm.reset_operands, mm.reset_operands_unchecked):
        with pytest.raises(NvblasltValueError, match=r"^a: The extents \(9, 4\) of the new operand must match"):
            reset(a=host((9, 4)))
        with pytest.raises(NvblasltValueError, match=r"^a: The data type of the new operand must match"):
            reset(a=host((8, 4), np.float64))
        with pytest.raises(NvblasltTypeError, match=r"^a: Library package mismatch"):
            reset(a=FakeDLPack((8, 4), ptr=NEW_PTR))
    assert refreshed == []
    mm.reset_operands_unchecked(a=host((8, 4)))
    assert refreshed == [(8, 4)]


# ---- a launch's algorithms: keep() for autotune(prune=), planned_algorithm() for execute(algorithm=) ----
def stand_in_launch(lib, count: int = 4) -> Launch:
    launch = Launch.__new__(Launch)
    launch.lib = lib
    launch.algorithms = [zeroed_result(lib, marker) for marker in range(1, count + 1)]
    return launch


def test_keep_puts_the_timed_order_first_and_prunes(default_lib):
    launch = stand_in_launch(default_lib)
    r1, r2, r3, r4 = launch.algorithms
    launch.keep([r3, r1], None)  # timed ones first, in their order; those not timed after them
    assert [r.algorithm.algo.data[0] for r in launch.algorithms] == [3, 1, 2, 4]
    assert all(a is b for a, b in zip(launch.algorithms, (r3, r1, r2, r4)))
    launch.keep([r2, r4, r3, r1], 2)
    assert launch.algorithms == [r2, r4]
    launch.algorithms = [r1, r2, r3]
    challenger = zeroed_result(default_lib, 99)  # search=True: a winner the heuristics did not offer
    launch.keep([challenger, r2], 10)
    assert launch.algorithms == [challenger, r2, r1, r3]
    launch.keep([r1, challenger], 1)
    assert launch.algorithms == [r1]
    twin = pickle.loads(pickle.dumps(r3))  # same bytes, another object: kept apart (identity, not equality)
    launch.algorithms = [r1, r3]
    launch.keep([twin], None)
    assert launch.algorithms == [twin, r1, r3]


def test_planned_algorithm_finds_the_plans_own_or_refuses(default_lib):
    launch = stand_in_launch(default_lib)
    r1, r2, r3, r4 = launch.algorithms
    assert launch.planned_algorithm(r2) is r2
    for alike in (pickle.loads(pickle.dumps(r3)), r3.as_bytes(), r3.algorithm, r3.algorithm.algo,
                  np.frombuffer(r3.as_bytes(), np.uint8)):
        assert launch.planned_algorithm(alike) is r3  # the plan's own object: checked, with its workspace
    outsider = zeroed_result(default_lib, 42)
    for other in (outsider, outsider.as_bytes()):
        with pytest.raises(ValueError, match=r"Algorithm passed to execute\(\) has to be included in the plan\(\) "
                                             r"algorithms") as info:
            launch.planned_algorithm(other)
        assert isinstance(info.value, NvblasltValueError) and str(info.value).startswith("execute: algorithm: ")
    launch.keep([r4], 1)  # pruned away: no longer planned
    with pytest.raises(NvblasltValueError, match="has to be included"):
        launch.planned_algorithm(r1)
    with pytest.raises(NvblasltAlgorithmError):
        launch.planned_algorithm("algo")


@pytest.mark.parametrize("iterations", [0, -1, True, 2.0, "3"])
def test_autotune_refuses_iterations_that_time_nothing(fake_gpu, iterations):
    with pytest.raises(NvblasltValueError, match=r"^iterations: expected a positive int"):
        fake_mm().autotune(iterations=iterations)


def test_an_aux_epilog_with_a_row_major_c_is_refused_as_cublaslt_refuses_it(fake_gpu):
    """nvmath-python passes it on and cuBLASLt answers NOT_SUPPORTED (measured on an H100 for RELU_BIAS,
    RELU_AUX, RELU_AUX_BIAS and GELU_AUX_BIAS): nvblaslt refuses it first, as that same CublasLtError
    and a ValueError that names c, before any GPU work."""
    from nvblaslt import CublasLtError, NvblasltUnsupportedError

    c = FakeDLPack((8, 6), ptr=NEW_PTR)  # row-major: the result would be too
    mm = Matmul(FakeDLPack((8, 4), ptr=A_PTR), FakeDLPack((4, 6), ptr=B_PTR), c, beta=0.5)
    with pytest.raises(NvblasltUnsupportedError, match=r"^c: RELU_AUX needs a column-major") as caught:
        mm.plan(epilog="RELU_AUX")
    error = caught.value
    assert isinstance(error, CublasLtError) and isinstance(error, ValueError)
    assert error.status_name == "CUBLAS_STATUS_NOT_SUPPORTED" and "NOT_SUPPORTED" in str(error)


def test_a_refused_plan_leaves_the_committed_plans_aux_scale_in_place(monkeypatch, default_lib):
    # the plan's aux scale lives in one slot of the scale buffer, which the committed plan reads: a
    # re-plan writes its value there only when it commits, so one that fails changes nothing
    written: list = []

    def write(self, values, stream):  # Scales.write without the device copy
        self._values.update(values)
        written.append({key: value for key, value in self._values.items() if isinstance(value, float)})
    monkeypatch.setattr(_scales.Scales, "write", write)
    monkeypatch.setattr(_scales.Scales, "stage", lambda self, values, stream: self._values.update(values))
    monkeypatch.setattr(Launch, "planned", classmethod(reached))
    mm = Matmul(*fp8_operands(), options={"result_type": "float8_e4m3fn"}, quantization_scales={**ONES, "d": 1.0})
    aux_fp8 = {"epilog": {"aux_type": "float8_e4m3fn"}}
    with pytest.raises(Reached):
        mm.plan(epilog="GELU_AUX", epilog_inputs={"aux_quantization_scale": 2.0}, preferences=aux_fp8)
    assert all("aux" not in w for w in written) and mm._scales.value("aux") is None
    # as if a plan had committed with 2.0: a refused re-plan with 3.0 leaves 2.0, in the slot and held
    mm._scales.write({"aux": 2.0}, 0)
    with pytest.raises(Reached):
        mm.plan(epilog="GELU_AUX", epilog_inputs={"aux_quantization_scale": 3.0}, preferences=aux_fp8)
    assert [w["aux"] for w in written if "aux" in w] == [2.0] and mm._scales.value("aux") == 2.0


# ---- nvmath-python's own suite: the refusals whose regexes read only the message ---------------------
# Its test_epilog (test_invalid_bias, test_aux_handler_validation), test_input (test_batch_matrix_negative)
# and test_reset (test_dtype_mismatch, test_shape_mismatch) match these phrases with re.search: each case
# here is one of theirs, its regex copied, and the message must also start with the argument's name.
# Strides are in elements: theirs are CuPy byte strides, which CuPy exports divided by the item size
# (float32 byte strides (4, 12, 1, 4) read as (1, 3, 0, 1)).
def refused_as_nvmath_python_says(call, error, nvmath_regex: str, argument: str) -> str:
    with pytest.raises(Exception) as info:
        call()
    message = str(info.value)
    assert type(info.value) is error, message
    assert message.startswith(f"{argument}: "), message
    assert re.search(nvmath_regex, message), message
    return message


def batch_of(shape, dtype="float32", strides=None, ptr=A_PTR):
    return FakeDLPack(shape, strides, dtype, ptr=ptr)


def swapped(shape, ptr):
    """A (B1, B0, …) C-order batch seen with its two batch axes swapped, as ``transpose(1, 0, 2, 3)``."""
    strides = FakeDLPack(shape).strides
    return FakeDLPack((shape[1], shape[0], *shape[2:]), (strides[1], strides[0], *strides[2:]), ptr=ptr)


def sliced(shape, keep, ptr):
    """``x[:, :keep]`` of a C-order (B0, B1, …) batch: its outer batches are B1 matrices apart, not ``keep``."""
    return FakeDLPack((shape[0], keep, *shape[2:]), FakeDLPack(shape).strides, ptr=ptr)


M3, K4, N5 = 3, 4, 5
OPERAND_CASES = {  # test_batch_matrix_negative's cases: (a, b, c), nvmath-python's regex, the argument named
    "not_tileable_a": (lambda: (sliced((2, 3, M3, K4), 2, A_PTR), batch_of((2, 2, K4, N5), ptr=B_PTR), None),
                       "batch layout for A .* is not tileable", "a"),
    "not_tileable_b": (lambda: (batch_of((2, 2, M3, K4)), sliced((2, 3, K4, N5), 2, B_PTR), None),
                       "batch layout for B .* is not tileable", "b"),
    "batch_shape_mismatch": (lambda: (batch_of((2, M3, K4)), batch_of((3, K4, N5), ptr=B_PTR), None),
                             "batch dimensions of operands A .* and B .* must match", "a, b"),
    "batch_order_mismatch": (lambda: (batch_of((2, 3, M3, K4)), swapped((3, 2, K4, N5), B_PTR), None),
                             "batch order of operands A .* and B .* must match", "a, b"),
    "c_m_dimension_mismatch": (lambda: (batch_of((M3, K4)), batch_of((K4, N5), ptr=B_PTR),
                                        batch_of((M3 + 1, N5), ptr=C_PTR)),
                               "The M dimension of the C matrix .* must match the M dimension of A", "c"),
    "c_n_dimension_mismatch": (lambda: (batch_of((M3, K4)), batch_of((K4, N5), ptr=B_PTR),
                                        batch_of((M3, N5 + 1), ptr=C_PTR)),
                               "The N dimension of the C matrix .* must match the N dimension of B", "c"),
    "c_batch_shape_mismatch": (lambda: (batch_of((2, 2, M3, K4)), batch_of((2, 2, K4, N5), ptr=B_PTR),
                                        batch_of((3, 2, M3, N5), ptr=C_PTR)),
                               "The batch dimension of operand C .* must match with that of the other operands", "c"),
    "c_batch_order_mismatch": (lambda: (batch_of((2, 3, M3, K4)), batch_of((2, 3, K4, N5), ptr=B_PTR),
                                        swapped((3, 2, M3, N5), C_PTR)),
                               "The batch axis order of operand C .* must match with that of the other", "c"),
    "c_not_tileable": (lambda: (batch_of((2, 2, M3, K4)), batch_of((2, 2, K4, N5), ptr=B_PTR),
                                sliced((2, 3, M3, N5), 2, C_PTR)),
                       "The batch layout for C corresponding to shape .* is currently not supported because it is "
                       "not tileable", "c"),
}


@FORMS
@pytest.mark.parametrize("case", OPERAND_CASES)
def test_batch_layout_refusals_carry_nvmath_pythons_phrase(case, form, fake_gpu):
    make, nvmath_regex, argument = OPERAND_CASES[case]
    a, b, c = make()
    keywords = {"beta": 1.0} if c is not None else {}
    refused_as_nvmath_python_says(lambda: both_forms(form, a, b, c, **keywords), NvblasltValueError, nvmath_regex,
                                  argument)


def test_operands_sharing_a_batch_order_other_than_c_order_are_refused_as_a_pair(fake_gpu):
    """nvmath-python takes batch axes in any order the operands share; nvblaslt walks C order only."""
    message = refused_as_nvmath_python_says(
        lambda: Matmul(swapped((3, 2, M3, K4), A_PTR), swapped((3, 2, K4, N5), B_PTR)), NvblasltValueError,
        r"The batch order \(1, 0\) of operands A and B .* is not supported: nvblaslt walks batches in C order "
        r"\(0, 1\) only", "a, b")
    assert "shape (2, 3, 3, 4) with element strides (12, 24, 4, 1)" in message
    with pytest.raises(Reached):  # the same operands in C order get past every check
        Matmul(batch_of((2, 3, M3, K4)), batch_of((2, 3, K4, N5), ptr=B_PTR)).plan()


def test_an_unsupported_dtype_starts_with_nvmath_pythons_phrase_and_names_the_argument(no_gpu_work):
    # nvmath-python's test_unsupported_type anchors its regex at the message's start, so this one message
    # names its argument after the phrase rather than before it
    zeros = np.zeros((2, 2), np.int64)
    with pytest.raises(NvblasltArgumentError) as info:
        matmul(zeros, zeros, zeros, beta=1)
    assert re.match(r"^The dtype of operand.*not supported", str(info.value)), info.value
    assert "(argument a: int64)" in str(info.value)


BIAS_EPILOGS = [E.BIAS, E.RELU_BIAS, E.GELU_BIAS, E.RELU_AUX_BIAS, E.GELU_AUX_BIAS]
BIAS_CASES = {  # test_invalid_bias's cases: a, b and bias shapes, the bias's element strides, the regex
    "mismatch_batch_size": ((2, 4, 5), (2, 5, 8), (3, 4, 1), None, "batch dimensions of the bias.*must match"),
    "mismatched_batch_axis_order": ((2, 3, 4, 5), (2, 3, 5, 8), (2, 3, 4, 1), (1, 3, 0, 1),
                                    "batch axis order of the bias.*must match"),
    "non_tileable_batch": ((2, 3, 4, 5), (2, 3, 5, 8), (2, 3, 4, 1), (4, 1, 0, 1),
                           "not supported because it is not tileable"),
    "invalid_stride": ((4, 5), (5, 8), (4, 1), (0, 0), "stride of the bias.*must be 1"),
    "invalid_stride, every other value": ((4, 5), (5, 8), (4, 1), (2, 1), "stride of the bias.*must be 1"),
}


@FORMS
@pytest.mark.parametrize("epilog", BIAS_EPILOGS)
@pytest.mark.parametrize("case", BIAS_CASES)
def test_bias_refusals_carry_nvmath_pythons_phrase(case, epilog, form, fake_gpu):
    a_shape, b_shape, bias_shape, strides, nvmath_regex = BIAS_CASES[case]
    a, b = batch_of(a_shape), batch_of(b_shape, ptr=B_PTR)
    inputs = {"bias": batch_of(bias_shape, strides=strides, ptr=BIAS_PTR)}
    call = (lambda: Matmul(a, b).plan(epilog=epilog, epilog_inputs=inputs)) if form == "Matmul" else \
        (lambda: matmul(a, b, epilog=epilog, epilog_inputs=inputs))
    refused_as_nvmath_python_says(call, NvblasltValueError, nvmath_regex, "epilog_inputs['bias']")


# test_aux_handler_validation's cases: a, b shapes, the aux (shape, element strides for each epilog, dtype or
# None for the one the forward epilog returns), the class, the regex. Its aux is uint8 for DRELU, float32 for
# DGELU: CuPy byte strides (2, 16) read as (2, 16) and (0, 4).
AUX = {E.DRELU: ("relu_aux", "uint8", "float16", 1), E.DGELU: ("gelu_aux", "float32", "uint8", 4)}
AUX_CASES = {
    "wrong_dtype": ((16, 32), (32, 16), (16, 16), lambda item: None, "other", NvblasltArgumentError,
                    r"The dtype of the .* auxiliary input .* must be"),
    "wrong_mm_shape": ((16, 32), (32, 16), (24, 24), lambda item: None, None, NvblasltValueError,
                       r"The auxiliary epilog input .* must have the MM shape"),
    "wrong_stride": ((16, 32), (32, 16), (16, 16), lambda item: (2 // item, 16 // item), None, NvblasltValueError,
                     r"The stride of the .* auxiliary input .* must be 1 along the dimension "
                     r".* which corresponds to the M dimension"),
    "batch_shape_mismatch": ((2, 3, 16, 32), (2, 3, 32, 16), (2, 4, 16, 16), lambda item: None, None,
                             NvblasltValueError, r"The batch dimensions of the .* auxiliary input .* must match with "
                                                 r"that of the matrix multiplication definition"),
    "batch_axis_order_mismatch": ((2, 3, 16, 32), (2, 3, 32, 16), (2, 3, 16, 16),
                                  lambda item: (256 // item, 512 // item, 1 // item, 16 // item), None,
                                  NvblasltValueError, r"The batch axis order of the .* auxiliary input .* must match "
                                                      r"with that of the other operands"),
    "non_tileable_batch": ((2, 3, 16, 32), (2, 3, 32, 16), (2, 3, 16, 16),
                           lambda item: (5376 // item, 1280 // item, 1 // item, 16 // item), None, NvblasltValueError,
                           r"The batch layout for .* auxiliary input .* is currently not supported because it is not "
                           r"tileable"),
}


@pytest.mark.parametrize("epilog", list(AUX))
@pytest.mark.parametrize("case", AUX_CASES)
def test_aux_input_refusals_carry_nvmath_pythons_phrase(case, epilog, fake_gpu):
    key, dtype, other, item = AUX[epilog]
    a_shape, b_shape, aux_shape, strides, given, error, nvmath_regex = AUX_CASES[case]
    aux = batch_of(aux_shape, other if given == "other" else dtype, strides(item), ptr=BIAS_PTR)
    mm = Matmul(batch_of(a_shape), batch_of(b_shape, ptr=B_PTR))
    refused_as_nvmath_python_says(lambda: mm.plan(epilog=epilog, epilog_inputs={key: aux}), error, nvmath_regex,
                                  f"epilog_inputs['{key}']")


def test_an_aux_input_strided_along_n_is_refused_by_the_dimension_it_takes():
    problem = SimpleNamespace(m=16, n=16, batch_shape=(), batch_count=1, types=SimpleNamespace(d=_dtypes.FLOAT32))
    aux = nvblaslt._operands.read(FakeDLPack((16, 16), (1, 32), ptr=BIAS_PTR), "epilog_inputs['gelu_aux']", 0)
    with pytest.raises(NvblasltValueError, match=r"^epilog_inputs\['gelu_aux'\]: The stride of the gelu_aux auxiliary "
                                                 r"input of shape \(16, 16\) must be 16 along the dimension 1, which "
                                                 r"corresponds to the N dimension .*; got strides \(1, 32\)$"):
        _epilogs.check_aux(aux, "gelu_aux", problem)
    column_major = nvblaslt._operands.read(fortran((16, 16), ptr=BIAS_PTR), "epilog_inputs['gelu_aux']", 0)
    assert _epilogs.check_aux(column_major, "gelu_aux", problem).ld == 16


@pytest.fixture
def committed_plans(monkeypatch, default_lib):
    """``plan()`` commits with a stand-in launch; host arrays are 'staged' to a fake device pointer."""
    import dataclasses

    def stage(op, device, stream):
        copy = dataclasses.replace(op, ptr=_FakeBuffer.pointer, strides=_host.device_strides(op), device=device,
                                   host=False, conjugated=False)
        return copy, _FakeBuffer()
    monkeypatch.setattr(Launch, "planned", classmethod(lambda cls, *args, **kwargs: (StandInLaunch(), ["algo"], {})))
    monkeypatch.setattr(_host, "stage", stage)
    monkeypatch.setattr(_host, "refresh", lambda *args: None)


@pytest.mark.parametrize("memory", ["gpu", "host"])
def test_a_reset_bias_of_another_dtype_or_length_carries_nvmath_pythons_phrase(memory, committed_plans):
    """test_reset's test_dtype_mismatch (M=19, RELU_BIAS) and test_shape_mismatch (M=54, BIAS), for a bias
    in GPU memory (checked as plan() checks it, then against the plan's) and in host memory (copied into
    the plan's device copy: compared with it)."""
    def array(shape, dtype="float32", ptr=NEW_PTR):
        return FakeDLPack(shape, dtype=dtype, ptr=ptr) if memory == "gpu" else host(shape, np.dtype(dtype))
    # the class each path raised before: plan()'s dtype refusal on the GPU path, a value error on the host's
    dtype_error = NvblasltArgumentError if memory == "gpu" else NvblasltValueError
    for m, epilog, dtype, bad in ((19, "RELU_BIAS", "float32", "float64"), (19, "RELU_BIAS", "float64", "float32"),
                                  (54, "BIAS", "float64", None)):
        mm = Matmul(array((m, 10), dtype, A_PTR), array((10, 32), dtype, B_PTR))
        mm.plan(epilog=epilog, epilog_inputs={"bias": array((m, 1), dtype, BIAS_PTR)})
        if bad is not None:
            refused_as_nvmath_python_says(lambda: mm.reset_operands(epilog_inputs={"bias": array((m, 1), bad)}),
                                          dtype_error, "The data type of the new operand must match the data type "
                                                       "of the original operand.", "epilog_inputs['bias']")
        refused_as_nvmath_python_says(lambda: mm.reset_operands(epilog_inputs={"bias": array((m - 1, 1), dtype)}),
                                      NvblasltValueError, "The extents .* must match", "epilog_inputs['bias']")
        mm.reset_operands(epilog_inputs={"bias": array((m, 1), dtype)})  # one like the plan's is taken
        if memory == "gpu":
            assert mm._input_operands["bias"].ptr == NEW_PTR
            mm.reset_operands(epilog_inputs={"bias": array((m,), dtype)})  # the same vector, another shape
            every_other = FakeDLPack((m, 1), (2, 1), dtype, ptr=NEW_PTR)
            refused_as_nvmath_python_says(lambda: mm.reset_operands(epilog_inputs={"bias": every_other}),
                                          NvblasltValueError, "stride of the bias.*must be 1", "epilog_inputs['bias']")


def test_a_reset_gpu_bias_read_in_another_layout_names_the_plans(committed_plans):
    mm = Matmul(FakeDLPack((2, 8, 4), ptr=A_PTR), FakeDLPack((2, 4, 6), ptr=B_PTR))
    mm.plan(epilog="BIAS", epilog_inputs={"bias": FakeDLPack((2, 8, 1), ptr=BIAS_PTR)})  # one bias per batch
    with pytest.raises(NvblasltValueError, match=r"^epilog_inputs\['bias'\]: The extents \(8, 1\) and strides \(1, 1\) "
                                                 r"of the new operand must match the layout the plan was made for "
                                                 r"\(extents \(2, 8, 1\), strides \(8, 1, 1\)\); call plan\(\) again"):
        mm.reset_operands(epilog_inputs={"bias": FakeDLPack((8, 1), ptr=NEW_PTR)})  # one for every batch
    mm.reset_operands(epilog_inputs={"bias": FakeDLPack((2, 8), ptr=NEW_PTR)})  # the same layout, read as (…, M)
    assert mm._input_operands["bias"].ptr == NEW_PTR
