"""nvmath-python's Matmul surface on a GPU (issue 21), each result checked against a float64
reference on fresh random inputs: reset_operands_unchecked, autotune(prune=), applicable_algorithm_ids,
execute(algorithm=) among the planned ones, algorithms that pickle and come back to plan(), an fp8 aux
rescaled on reset, epilog inputs refused on reset (another package, another memory space) without
touching the plan, fp8 operands with a 16-bit bias and a float32 result, and refusals nvmath-python
makes (a 1-D c, an epilog_inputs key the epilog does not take)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import nvblaslt
from nvblaslt import Matmul, MatmulEpilog, matmul
from tests.reference import gelu, host, rel_error

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

E = MatmulEpilog
RNG = np.random.default_rng()
M, K, N = 64, 48, 80
TOL = {"float32": 2e-5, "bfloat16": 3e-2, "fp8": 5e-4}  # fp8: exact operands; Hopper fp8 kernels accumulate in stages (1.0e-4 seen)
ONES = {"a": 1.0, "b": 1.0}  # fp8 operands always take scales (nvmath-python's rule)
NOT_PLANNED = r"^execute: algorithm: Algorithm passed to execute\(\) has to be included in the plan\(\) algorithms"


@pytest.fixture(autouse=True)
def own_tuning_cache(tmp_path, monkeypatch):
    """No algorithm remembered by an earlier search joins these plans' lists."""
    monkeypatch.setenv("NVBLASLT_CACHE_DIR", str(tmp_path))


def rand(shape, dtype="float32", order="C", device="cuda"):
    """A fresh random torch tensor of ``shape``, stored C-order or F-order (per matrix)."""
    t = torch.from_numpy(RNG.standard_normal(shape)).to(getattr(torch, dtype))
    if order == "F" and len(shape) >= 2:
        t = t.transpose(-1, -2).contiguous().transpose(-1, -2)
    return t.to(device) if device != "cpu" else t


def check(out, ref, tol="float32"):
    got = host(out)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    error = rel_error(got, ref)
    assert error < (TOL[tol] if isinstance(tol, str) else tol), error


def fp8_tn(m, n, k):
    """fp8 A row-major (M, K) and B = (N, K).T, column-major (K, N): cuBLASLt's 'TN' layout."""
    return rand((m, k)).to(torch.float8_e4m3fn), rand((n, k)).to(torch.float8_e4m3fn).T


class ForeignArray:
    """A GPU array of no package nvblaslt knows (read through ``__cuda_array_interface__``)."""

    def __init__(self, tensor):
        self.tensor = tensor
        self.__cuda_array_interface__ = tensor.__cuda_array_interface__


# ---- reset_operands_unchecked ----------------------------------------------------------------------
def bias_operands():
    """a, b, c (column-major: a bias runs along the result's columns) and a bias."""
    return rand((M, K)), rand((K, N), order="F"), rand((M, N), order="F"), rand((M,))


def bias_reference(a, b, c, bias, alpha, beta):
    return alpha * (host(a) @ host(b)) + beta * host(c) + host(bias)[:, None]


def test_reset_operands_unchecked_gives_what_reset_operands_gives():
    a, b, c, bias = bias_operands()
    with Matmul(a, b, c, alpha=1.5, beta=0.5) as checked, Matmul(a, b, c, alpha=1.5, beta=0.5) as unchecked:
        checked.plan(epilog=E.BIAS, epilog_inputs={"bias": bias})
        unchecked.plan(epilog=E.BIAS, epilog_inputs={"bias": bias}, algorithms=[checked.algorithm])
        for mm in (checked, unchecked):
            check(mm.execute(), bias_reference(a, b, c, bias, 1.5, 0.5))
        for alpha, beta in ((0.25, 2.0), (-1.0, 0.0), (3.0, -0.5)):
            a, b, c, bias = bias_operands()  # like the plan's: shapes, strides, dtypes, device, alignment
            new = dict(a=a, b=b, c=c, alpha=alpha, beta=beta, epilog_inputs={"bias": bias})
            checked.reset_operands(**new)
            unchecked.reset_operands_unchecked(**new)
            expected = bias_reference(a, b, c, bias, alpha, beta)
            d_checked, d_unchecked = host(checked.execute()), host(unchecked.execute())
            check(d_checked, expected)
            check(d_unchecked, expected)
            assert rel_error(d_unchecked, d_checked) < 1e-6  # one algorithm, the same operands
        b_only = rand((K, N), order="F")  # a subset: the rest stays as the last reset left it
        unchecked.reset_operands_unchecked(b=b_only)
        check(unchecked.execute(), bias_reference(a, b_only, c, bias, 3.0, -0.5))


# ---- autotune(prune=) and the algorithms' order --------------------------------------------------------
@pytest.mark.parametrize("prune", [1, 2, 3, 1024])
def test_autotune_prune_keeps_the_first_of_the_timed_order(prune):
    a, b = rand((256, 192)), rand((192, 160), order="F")
    with Matmul(a, b) as mm:
        planned = len(mm.plan(preferences={"limit": 8}))
        timings = mm.autotune(iterations=2, prune=prune)
        assert len(mm.algorithms) == min(prune, planned)
        assert mm.algorithms[0] is mm.algorithm is timings[0][0]  # the selected one first
        assert all(kept is timed for kept, (timed, _) in zip(mm.algorithms, timings))  # then the timed order
        rest = [ms for _, ms in timings[1:]]
        assert rest == sorted(rest)
        check(mm.execute(), host(a) @ host(b))
        for kept in mm.algorithms:
            check(mm.execute(algorithm=kept), host(a) @ host(b))


def test_autotune_prune_must_be_a_positive_int():
    a, b = rand((M, K)), rand((K, N))
    with Matmul(a, b) as mm:
        before = list(mm.plan())
        for prune in (0, -1, True, False, 1.5, "2"):
            with pytest.raises(ValueError, match=r"^prune: expected a positive int"):
                mm.autotune(iterations=1, prune=prune)
        assert mm.algorithms == before  # nothing timed, nothing dropped
        check(mm.execute(), host(a) @ host(b))


# ---- applicable_algorithm_ids ----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_applicable_algorithm_ids_returns_at_most_limit_ints(dtype):
    a, b = rand((M, K), dtype), rand((K, N), dtype)
    with Matmul(a, b) as mm:
        ids = mm.applicable_algorithm_ids(limit=4)  # no plan needed
        assert isinstance(ids, list) and 1 <= len(ids) <= 4 and all(type(i) is int for i in ids)
        assert len(set(ids)) == len(ids)
        assert len(mm.applicable_algorithm_ids()) <= 8
        every = mm.applicable_algorithm_ids(limit=1024)
        assert set(ids) <= set(every) and len(every) >= len(ids)
        mm.plan()
        assert mm.algorithm.algorithm_id in every  # the heuristics' pick is one of the ids for these types
        with pytest.raises(ValueError, match=r"^limit: expected a positive int"):
            mm.applicable_algorithm_ids(limit=0)


# ---- execute(algorithm=) ------------------------------------------------------------------------------
def test_execute_takes_a_planned_algorithm_and_refuses_another():
    a, b = rand((M, K)), rand((K, N))
    expected = host(a) @ host(b)
    with Matmul(a, b) as mm:
        found = mm.plan(preferences={"limit": 8})
        if len(found) < 2:
            pytest.skip("the heuristics offered one algorithm")
        for result in reversed(found):
            check(mm.execute(algorithm=result), expected)
            assert mm.algorithm is result
        check(mm.execute(algorithm=found[1].as_bytes()), expected)  # its bytes name the planned one
        assert mm.algorithm is found[1]
        with Matmul(a, b) as only:
            only.plan(algorithms=[found[1]])
            check(only.execute(algorithm=found[1]), expected)
            selected = only.algorithm
            for other in (found[0], found[0].as_bytes()):
                with pytest.raises(ValueError, match=NOT_PLANNED):
                    only.execute(algorithm=other)
            assert only.algorithm is selected and only.algorithms == [selected]  # the refusal changed nothing
            check(only.execute(), expected)


def test_algorithms_pickle_and_come_back_to_plan():
    a, b = rand((M, K)), rand((K, N), order="F")
    with Matmul(a, b) as mm:
        found = mm.plan(preferences={"limit": 4})
        back = pickle.loads(pickle.dumps(found))
    assert [r.as_bytes() for r in back] == [r.as_bytes() for r in found]
    assert [(r.workspace_size, r.waves) for r in back] == [(r.workspace_size, r.waves) for r in found]
    assert [r.algorithm.workspace_size for r in back] == [r.workspace_size for r in found]
    assert [(r.algorithm_id, r.tile, r.stages) for r in back] == [(r.algorithm_id, r.tile, r.stages) for r in found]
    a, b = rand((M, K)), rand((K, N), order="F")  # new operands, same problem
    with Matmul(a, b) as again:
        planned = again.plan(algorithms=back)
        assert [r.as_bytes() for r in planned] == [r.as_bytes() for r in back]
        check(again.execute(algorithm=back[0]), host(a) @ host(b))
        check(again.execute(algorithm=back[-1]), host(a) @ host(b))
        assert again.algorithm.as_bytes() == back[-1].as_bytes()


# ---- aux_quantization_scale on reset --------------------------------------------------------------------
def test_aux_quantization_scale_on_reset_rescales_the_fp8_aux():
    m, n, k = 64, 48, 32
    a, b = fp8_tn(m, n, k)
    z = host(a) @ host(b)
    mm = Matmul(a, b, quantization_scales=ONES, options={"result_type": "bfloat16"})
    try:
        try:
            mm.plan(epilog=E.GELU_AUX, preferences={"epilog": {"aux_type": torch.float8_e4m3fn}},
                    epilog_inputs={"aux_quantization_scale": 0.5})
            d, aux = mm.execute()
        except nvblaslt.CublasLtError as error:  # cuBLASLt 13.1 / H200 refuses this fp8 aux: said with its status
            if error.status_name in ("CUBLAS_STATUS_NOT_SUPPORTED", "CUBLAS_STATUS_INVALID_VALUE"):
                pytest.skip(f"cuBLASLt answers {error.status_name} for GELU_AUX with an fp8 aux on this GPU")
            raise
        assert aux["gelu_aux"].dtype == torch.float8_e4m3fn
        first = host(aux["gelu_aux"])[:m]
        check(d, gelu(z), "bfloat16")
        assert rel_error(first, np.clip(z * 0.5, -448, 448)) < 0.1
        mm.reset_operands(epilog_inputs={"aux_quantization_scale": 0.125})
        d, aux = mm.execute()
        second = host(aux["gelu_aux"])[:m]
        check(d, gelu(z), "bfloat16")  # the result does not depend on the aux's scale
        assert rel_error(second, np.clip(z * 0.125, -448, 448)) < 0.1
        normal = (np.abs(first) >= 2.0 ** -4) & (np.abs(first) < 448)  # both e4m3 normals, neither saturated
        assert normal.mean() > 0.5
        assert np.allclose(first[normal], 4 * second[normal], rtol=0.07, atol=0)  # by the ratio of the scales
    finally:
        mm.free()


# ---- epilog inputs refused on reset ---------------------------------------------------------------------
@pytest.mark.parametrize("package", ["protocol", "cupy"])
def test_a_reset_bias_from_another_package_or_memory_space_is_refused_and_changes_nothing(package):
    a, b, bias = rand((M, K)), rand((K, N), order="F"), rand((M,))
    saved = bias.clone()
    expected = host(a) @ host(b) + host(bias)[:, None]
    other = rand((M,))
    if package == "cupy":
        cupy = pytest.importorskip("cupy", reason="the package mismatch with CuPy needs cupy")
        foreign = cupy.asarray(other)  # CuPy's view of torch's memory: another package
    else:
        foreign = ForeignArray(other)  # a GPU array of no known package
    with Matmul(a, b) as mm:
        mm.plan(epilog=E.BIAS, epilog_inputs={"bias": bias})
        check(mm.execute(), expected)
        for reset in (mm.reset_operands, mm.reset_operands_unchecked):
            with pytest.raises(TypeError, match=r"^epilog_inputs\['bias'\]: Library package mismatch"):
                reset(epilog_inputs={"bias": foreign})
            with pytest.raises(ValueError, match=r"^epilog_inputs\['bias'\]: The operand bias is on device .*, but it "
                                                 r"should be on device"):
                reset(epilog_inputs={"bias": other.cpu()})
        check(mm.execute(), expected)  # the plan's bias is untouched
        assert torch.equal(bias, saved)  # and so is the caller's: no host bias was copied into it
        mm.reset_operands(epilog_inputs={"bias": other})  # one like the plan's is taken
        check(mm.execute(), host(a) @ host(b) + host(other)[:, None])


# ---- fp8 operands, a 16-bit bias, a float32 result --------------------------------------------------------
@pytest.mark.parametrize("bias_dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("form", ["Matmul", "matmul"])
def test_fp8_operands_with_a_16_bit_bias_and_a_float32_result(bias_dtype, form):
    """nvmath-python's fp8 rule: operands e4m3, result float32, a bfloat16 bias (fp16 and float32 are
    accepted too; cuBLASLt decides whether it has a kernel for those)."""
    m, n, k = 64, 48, 96
    a, b = fp8_tn(m, n, k)
    bias = rand((m,), bias_dtype)
    scales = {"a": 2.0, "b": 0.75}
    expected = 1.5 * (host(a) @ host(b)) + host(bias)[:, None]  # the dequantized operands, in float64
    keywords = dict(quantization_scales=scales, options={"result_type": "float32"})
    try:
        if form == "matmul":
            d = matmul(a, b, epilog=E.BIAS, epilog_inputs={"bias": bias}, **keywords)
        else:
            with Matmul(a, b, **keywords) as mm:
                mm.plan(epilog=E.BIAS, epilog_inputs={"bias": bias})
                d = mm.execute()
                a2, b2 = fp8_tn(m, n, k)
                bias2 = rand((m,), bias_dtype)
                mm.reset_operands(a=a2, b=b2, epilog_inputs={"bias": bias2}, quantization_scales={"b": 0.25})
                check(mm.execute(), 0.5 * (host(a2) @ host(b2)) + host(bias2)[:, None], "fp8")
    except nvblaslt.CublasLtError as error:
        if bias_dtype == "bfloat16" or error.status_name != "CUBLAS_STATUS_NOT_SUPPORTED":
            raise
        pytest.skip(f"cuBLASLt answers {error.status_name} for fp8 operands with a {bias_dtype} bias and a float32 "
                    f"result on this GPU")
    assert d.dtype == torch.float32
    check(d, expected, "fp8")


@pytest.mark.parametrize("form", ["Matmul", "matmul"])
def test_fp8_scales_as_a_quantization_scales_object_with_numpy_values(form):
    """nvmath-python's test_quantization_scales_as_object: the scales as a MatmulQuantizationScales of NumPy
    float64s (one negative), a float16 C and result. Its own run of it fails on nvblaslt only where
    NVIDIA's reference helper hands our object to nvmath-python; this is the same call against float64."""
    m, n, k = 16, 16, 16
    a, b = fp8_tn(m, n, k)
    c = rand((m, n), "float16", order="F")
    scales = nvblaslt.MatmulQuantizationScales(a=np.float64(-0.3), b=np.float64(0.17))
    expected = 0.8 * (-0.3 * 0.17) * (host(a) @ host(b)) + 0.12 * host(c)
    if form == "matmul":
        d = matmul(a, b, c, alpha=0.8, beta=0.12, quantization_scales=scales)
    else:
        with Matmul(a, b, c, alpha=0.8, beta=0.12, quantization_scales=scales) as mm:
            mm.plan()
            d = mm.execute()
    assert d.dtype == torch.float16
    check(d, expected, "fp8")


# ---- refusals ----------------------------------------------------------------------------------------
def test_a_one_dimensional_c_is_refused():
    a, b, c = rand((M, K)), rand((K, N)), rand((N,))
    for call in (matmul, Matmul):
        with pytest.raises(ValueError, match=r"^c: `c` must be at least 2-D\."):
            call(a, b, c, beta=1.0)
    check(matmul(a, b, c.reshape(1, N).expand(M, N).contiguous(), beta=1.0), host(a) @ host(b) + host(c)[None, :])


def test_an_extra_epilog_input_is_refused_on_plan_reset_and_the_function_form():
    from nvblaslt import _function_form

    a, b, bias, extra = rand((M, K)), rand((K, N)), rand((M,)), rand((M, N))
    expected = np.maximum(host(a) @ host(b) + host(bias)[:, None], 0)
    with Matmul(a, b) as mm:
        with pytest.raises(ValueError, match=r"^epilog_inputs: RELU_BIAS takes \['bias'\]; got also \['gelu_aux'\]"):
            mm.plan(epilog=E.RELU_BIAS, epilog_inputs={"bias": bias, "gelu_aux": extra})
        with pytest.raises(ValueError, match=r"^epilog_inputs: DEFAULT takes no inputs; got also \['bias'\]"):
            mm.plan(epilog=E.DEFAULT, epilog_inputs={"bias": bias})
        mm.plan(epilog=E.RELU_BIAS, epilog_inputs={"bias": bias})
        check(mm.execute(), expected)
        with pytest.raises(ValueError, match=r"^epilog_inputs: RELU_BIAS takes \['bias'\]; unknown \['gelu_aux'\]"):
            mm.reset_operands(epilog_inputs={"bias": rand((M,)), "gelu_aux": extra})
        check(mm.execute(), expected)  # the refused reset took nothing, the new bias included
    _function_form.clear_plan_cache()
    for _ in range(3):  # the first plan, the checked path's cache hit, the fast path
        check(matmul(a, b, epilog=E.RELU_BIAS, epilog_inputs={"bias": bias}), expected)
        with pytest.raises(ValueError, match=r"^epilog_inputs: RELU_BIAS takes \['bias'\]; got also \['gelu_aux'\]"):
            matmul(a, b, epilog=E.RELU_BIAS, epilog_inputs={"bias": bias, "gelu_aux": extra})
    _function_form.clear_plan_cache()


def test_after_release_operands_a_reset_must_give_the_epilog_inputs_again():
    """nvmath-python refuses a reset after release_operands() that leaves out an epilog input: its pointer
    is still bound, and the array it points to may be gone."""
    a, b, bias = rand((24, 16)), rand((16, 40)), rand((24,))
    with Matmul(a, b) as mm:
        mm.plan(epilog=E.BIAS, epilog_inputs={"bias": bias})
        mm.release_operands()
        a2, b2, bias2 = rand((24, 16)), rand((16, 40)), rand((24,))
        for reset in (mm.reset_operands, mm.reset_operands_unchecked):
            with pytest.raises(ValueError, match=r"^epilog_inputs: release_operands\(\) dropped the epilog inputs"):
                reset(a=a2, b=b2)
        mm.reset_operands(a=a2, b=b2, epilog_inputs={"bias": bias2})
        check(mm.execute(), host(a2) @ host(b2) + host(bias2)[:, None])


def test_a_reset_epilog_input_is_compared_with_the_original_inputs_package():
    """plan() takes a bias from another package than the operands'; a reset takes one like it."""
    cupy = pytest.importorskip("cupy")
    a, b = cupy.asarray(host(rand((24, 16)))), cupy.asarray(host(rand((16, 40))))
    bias, bias2 = rand((24,), "float64"), rand((24,), "float64")  # torch, in the operands' dtype
    with Matmul(a, b) as mm:
        mm.plan(epilog=E.BIAS, epilog_inputs={"bias": bias})
        mm.reset_operands(epilog_inputs={"bias": bias2})
        check(mm.execute(), a.get() @ b.get() + host(bias2)[:, None])
        with pytest.raises(TypeError, match=r"Library package mismatch"):
            mm.reset_operands(epilog_inputs={"bias": cupy.asarray(host(bias))})


def test_a_search_leaves_the_planned_algorithms_and_its_choice_not_every_candidate_it_screened():
    a, b = rand((256, 512), "float16"), rand((512, 384), "float16")
    with Matmul(a, b) as mm:
        planned = mm.plan(preferences={"limit": 4})
        mm.autotune(iterations=2, search=True, remember=False)
        algorithms = mm.algorithms
        assert algorithms[0] is mm.algorithm and len(algorithms) <= len(planned) + 1
        assert all(any(r is p for p in planned) for r in algorithms[1:])
        check(mm.execute(), host(a) @ host(b), "bfloat16")  # fp16 result: a bf16-sized tolerance
