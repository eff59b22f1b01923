"""The four silent wrong results nvmath-python's own tests found (issue 19), each as it was reported:
lazily conjugated torch tensors, in-place autotune writing into c, the fp8 GELU aux, and references
kept to the caller's arrays. Every result is compared with a float64 reference on fresh inputs."""

from __future__ import annotations

import gc
import sys

import numpy as np
import pytest

import nvblaslt
import nvblaslt._autotune as autotune_module
from nvblaslt import Matmul, MatmulEpilog, matmul
from tests.reference import gelu, host

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
RNG = np.random.default_rng()


def uniform(shape, dtype=torch.complex64, device="cuda"):
    """Fresh values uniform in [0, 1) (real and imaginary parts), as the report drew them."""
    values = RNG.random(shape) + (1j * RNG.random(shape) if dtype.is_complex else 0)
    return torch.from_numpy(values).to(dtype).to(device)


def exact(x) -> np.ndarray:
    """The mathematical value of a tensor, conjugate bit resolved, in complex128 / float64."""
    x = x.resolve_conj().detach().cpu()
    return x.to(torch.complex128 if x.dtype.is_complex else torch.float64).numpy()


def close(result, expected, tol):
    result = exact(result) if isinstance(result, torch.Tensor) else np.asarray(result)
    assert np.isfinite(result).all(), "NaN or Inf in the result"
    error = np.abs(result - expected).max() / max(np.abs(expected).max(), 1e-30)
    assert error < tol, f"relative error {error:.3g}"


# ---- 1. lazily conjugated torch tensors ----------------------------------------------------------------
CONJUGATED = {"a": (True, False), "b": (False, True), "both": (True, True)}
QUALIFIERS = [None, (True, False), (False, True), (True, True)]


@pytest.mark.parametrize("qualified", QUALIFIERS, ids=["none", "qual-a", "qual-b", "qual-ab"])
@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize("which", CONJUGATED)
def test_conjugate_views_are_multiplied_conjugated(which, device, layout, qualified):
    conj_a, conj_b = CONJUGATED[which]
    a, b, c = uniform((8, 7), device=device), uniform((7, 11), device=device), uniform((8, 11), device=device)
    if layout == "col":
        a, b = a.T.contiguous().T, b.T.contiguous().T
    a = a.conj() if conj_a else a
    b = b.conj() if conj_b else b
    assert a.is_conj() == conj_a and b.is_conj() == conj_b
    x, y = exact(a), exact(b)
    qualifiers = None
    if qualified is not None:
        qualifiers = np.zeros(3, dtype=nvblaslt.matrix_qualifiers_dtype)
        qualifiers["is_conjugate"][:2] = qualified
        x = np.conj(x) if qualified[0] else x
        y = np.conj(y) if qualified[1] else y
    expected = x @ y + exact(c)
    try:
        d = matmul(a, b, c=c, beta=1.0, qualifiers=qualifiers)
    except nvblaslt.CublasLtError as error:
        # cuBLASLt has no kernel for OP_C on row-major storage, which these layouts need for a conjugation
        # on the GPU (nvmath-python 1.0 refuses the same): refused clearly, never wrong. Host views are
        # conjugated as they are staged, so only a qualifier's conjugation can meet this there.
        assert error.status_name == "CUBLAS_STATUS_NOT_SUPPORTED" and (device == "cuda" or qualified is not None)
        pytest.skip(f"refused: {error}")
    close(d, expected, 1e-5)
    with Matmul(a, b, c=c, beta=1.0, qualifiers=qualifiers) as mm:
        mm.plan()
        close(mm.execute(), expected, 1e-5)


@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize("which", CONJUGATED)
def test_a_conjugate_view_after_a_plain_call_of_the_same_shape_gets_its_own_plan(which, device):
    conj_a, conj_b = CONJUGATED[which]
    a, b = uniform((8, 7), device=device), uniform((7, 11), device=device)
    c = uniform((11, 8), device=device).T  # column-major: the layout in which both libraries run conjugate views
    close(matmul(a, b, c=c, beta=1.0), exact(a) @ exact(b) + exact(c), 1e-5)  # the plan a conjugate view must not reuse
    a = a.conj() if conj_a else a
    b = b.conj() if conj_b else b
    for _ in range(2):  # the second call comes from the cache
        close(matmul(a, b, c=c, beta=1.0), exact(a) @ exact(b) + exact(c), 1e-5)
        close(matmul(a, b), exact(a) @ exact(b), 1e-5)


# ---- 2. in-place autotune ---------------------------------------------------------------------------------
@pytest.mark.parametrize("search", [False, True], ids=["autotune", "search"])
def test_in_place_autotune_leaves_c_as_it_was(search, tmp_path, monkeypatch):
    monkeypatch.setenv("NVBLASLT_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(autotune_module.autotune.__kwdefaults__, "budget_s", 1.0)
    a, b = uniform((123, 789), torch.float64), uniform((789, 456), torch.float64)
    c = uniform((123, 456), torch.float64)
    c_before = c.clone()
    expected = exact(a) @ exact(b) + exact(c)
    with Matmul(a, b, c=c, beta=1.0, options={"inplace": True}) as mm:
        mm.plan()
        mm.autotune(iterations=3, search=search)
        torch.cuda.synchronize()
        assert torch.equal(c, c_before), "autotune wrote into the caller's c"
        d = mm.execute()
        assert d is c
        close(d, expected, 1e-12)
        # reset to new values, execute again: each result from the values of its own call
        a2, c2 = uniform((123, 789), torch.float64), uniform((123, 456), torch.float64)
        expected2 = exact(a2) @ exact(b) + exact(c2)
        mm.reset_operands(a=a2, c=c2)
        close(mm.execute(), expected2, 1e-12)


def test_in_place_bias_gradient_duel_leaves_c_as_it_was(tmp_path, monkeypatch):
    """The split-form duel of DRELU_BGRAD times two-call launches: those must not write c either."""
    monkeypatch.setenv("NVBLASLT_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(autotune_module.autotune.__kwdefaults__, "budget_s", 1.0)
    m, n, k = 64, 48, 32
    a, b = uniform((m, k), torch.float32), uniform((k, n), torch.float32)
    c = uniform((n, m), torch.float32).T  # column-major, as the bias-gradient epilogs need D
    _, aux = matmul(uniform((m, k), torch.float32) - 0.5, uniform((k, n), torch.float32),
                    epilog=MatmulEpilog.RELU_AUX)
    c_before = c.clone()
    with Matmul(a, b, c=c, beta=1.0, options={"inplace": True}) as mm:
        mm.plan(epilog=MatmulEpilog.DRELU_BGRAD, epilog_inputs={"relu_aux": aux["relu_aux"]})
        mm.autotune(iterations=2, search=True)
        torch.cuda.synchronize()
        assert torch.equal(c, c_before), "the search wrote into the caller's c"


# ---- 3. the fp8 GELU aux ------------------------------------------------------------------------------
def fp8_operands(m, n, k):
    a = (uniform((m, k), torch.float32) - 0.3).to(torch.float8_e4m3fn)  # row-major A, column-major B: "TN"
    b = (uniform((n, k), torch.float32) - 0.3).to(torch.float8_e4m3fn).T
    return a, b


def fp8_preactivation(a, b, bias=None):
    z = exact(a.to(torch.float32)) @ exact(b.to(torch.float32))
    return z + exact(bias)[:, None] if bias is not None else z


@pytest.mark.parametrize("name", ["GELU_AUX", "GELU_AUX_BIAS"])
@pytest.mark.parametrize("m, n, k", [(16, 16, 16), (80, 96, 64)])
def test_fp8_gelu_aux_with_an_fp8_result_is_the_preactivation_in_float16(name, m, n, k):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs compute capability 8.9 or later")
    a, b = fp8_operands(m, n, k)
    bias = uniform((m,), torch.float16) - 0.5 if "BIAS" in name else None
    d_scale = 4.0
    d, aux = matmul(a, b, epilog=MatmulEpilog[name], epilog_inputs={"bias": bias} if bias is not None else None,
                    quantization_scales={"a": 1.0, "b": 1.0, "d": d_scale},
                    options={"result_type": "float8_e4m3fn"})
    z = fp8_preactivation(a, b, bias)
    gelu_aux = aux["gelu_aux"]
    assert gelu_aux.dtype == torch.float16  # nvmath-python's type: C's (float16 without a c)
    assert gelu_aux.shape == (m, n)  # M is a multiple of 8: no padding rows
    close(gelu_aux, z, 2e-3)
    assert d.dtype == torch.float8_e4m3fn
    close(exact(d.to(torch.float32)) / d_scale, gelu(z), 0.07)


@pytest.mark.parametrize("amax", [False, True])
def test_fp8_gelu_aux_in_fp8_with_its_scale_runs_and_holds_the_scaled_preactivation(amax):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs compute capability 8.9 or later")
    m, n, k = 64, 32, 48
    a, b = fp8_operands(m, n, k)
    aux_scale = 2.0
    d, aux = matmul(a, b, epilog=MatmulEpilog.GELU_AUX,
                    epilog_inputs={"aux_quantization_scale": aux_scale},
                    quantization_scales={"a": 1.0, "b": 1.0, "d": 1.0},
                    options={"result_type": "float8_e4m3fn"},
                    preferences={"epilog": {"aux_type": "float8_e4m3fn", "aux_amax": amax}})
    z = fp8_preactivation(a, b)
    assert aux["gelu_aux"].dtype == torch.float8_e4m3fn
    close(exact(aux["gelu_aux"].to(torch.float32)) / aux_scale, z, 0.07)
    if amax:
        close(exact(aux["gelu_aux_amax"]), np.abs(z).max(), 2e-3)
    else:
        assert "gelu_aux_amax" not in aux


# ---- 4. no reference kept to the caller's arrays -------------------------------------------------------------
def counts(*arrays):
    gc.collect()
    return [sys.getrefcount(x) for x in arrays]


def operands(device="cuda"):
    a, b = uniform((32, 24), torch.float32, device), uniform((24, 16), torch.float32, device)
    c = uniform((16, 32), torch.float32, device).T  # column-major: the bias epilogs need D so, and D takes c's order
    return a, b, c, uniform((32,), torch.float32, device)


@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize("ending", ["free", "with", "release_operands", "function_form"])
def test_no_reference_is_kept_to_the_caller_arrays(ending, device):
    a, b, c, bias = operands(device)
    before = counts(a, b, c, bias)
    expected = np.maximum(exact(a) @ exact(b) + exact(bias)[:, None], 0) + 0.5 * exact(c)
    if ending == "function_form":
        for _ in range(2):  # planned, then from the cache
            close(matmul(a, b, c=c, beta=0.5, epilog="RELU_BIAS", epilog_inputs={"bias": bias}), expected, 1e-5)
    elif ending == "with":
        with Matmul(a, b, c=c, beta=0.5) as mm:
            mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
            close(mm.execute(), expected, 1e-5)
            assert counts(a)[0] > before[0]  # held while in use: the test can see a reference
    else:
        mm = Matmul(a, b, c=c, beta=0.5)
        mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        close(mm.execute(), expected, 1e-5)
        if ending == "free":
            mm.free()
        else:
            mm.release_operands()
    assert counts(a, b, c, bias) == before
    if ending == "release_operands":  # the plan lives on, and takes new operands
        a2, b2, c2, bias2 = operands(device)
        before2 = counts(a2, b2, c2, bias2)
        mm.reset_operands(a=a2, b=b2, c=c2, epilog_inputs={"bias": bias2})
        close(mm.execute(), np.maximum(exact(a2) @ exact(b2) + exact(bias2)[:, None], 0) + 0.5 * exact(c2), 1e-5)
        mm.free()
        assert counts(a2, b2, c2, bias2) == before2
