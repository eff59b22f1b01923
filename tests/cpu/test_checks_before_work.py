"""Every check that needs no GPU runs before any GPU work (issue 22): a refused call stages no host
operand, uploads no scale and asks CUDA nothing. Runs on a machine without a GPU: the refusal
comes before the first CUDA call, so it is the refusal the user sees."""

from __future__ import annotations

import numpy as np
import pytest

import nvblaslt
from nvblaslt import Matmul, NvblasltError, matmul
from tests.fakes import forbid_gpu_work

RNG = np.random.default_rng()


@pytest.fixture
def no_gpu_work(monkeypatch, default_lib):
    """Fail the test at the first host copy, scale upload or CUDA device question."""
    return forbid_gpu_work(monkeypatch)


def host(shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


BAD_HOST_CALLS = {
    "K mismatch": (lambda: (host((4, 3)), host((5, 6))), {}, "a, b: The 'K' extent must match"),
    "dtype mix": (lambda: (host((4, 3)), host((3, 6), np.float64)), {}, "a, b"),
    "batch mismatch": (lambda: (host((2, 4, 3)), host((3, 3, 6))), {}, "batch"),
    "0-d operand": (lambda: (np.float32(2.0), host((3, 6))), {}, "a"),
    "c of another shape": (lambda: (host((4, 3)), host((3, 6)), host((5, 6))), {"beta": 1.0}, "c"),
    "beta without c": (lambda: (host((4, 3)), host((3, 6))), {"beta": 1.0}, "beta"),
}


@pytest.mark.parametrize("case", BAD_HOST_CALLS)
@pytest.mark.parametrize("form", ["Matmul", "matmul"])
def test_bad_host_operands_are_refused_before_any_copy(case, form, no_gpu_work):
    make, keywords, named = BAD_HOST_CALLS[case]
    arrays = make()
    with pytest.raises(NvblasltError, match=named) as refused:
        if form == "Matmul":
            Matmul(*arrays, **keywords)
        else:
            matmul(*arrays, **keywords)
    assert isinstance(refused.value, (ValueError, TypeError))
    assert no_gpu_work == []


def test_an_fp8_operand_in_the_wrong_order_is_refused_before_its_scales_are_uploaded(no_gpu_work):
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no fp8")
    a = torch.randn(32, 16).to(torch.float8_e4m3fn).T.contiguous().T  # column-major A: fp8 needs it row-major
    b = torch.randn(16, 32).to(torch.float8_e4m3fn).T.contiguous().T
    with pytest.raises(nvblaslt.NvblasltValueError, match="fp8"):
        Matmul(a, b, quantization_scales={"a": 1.0, "b": 1.0}, options={"result_type": "bfloat16"})
    assert no_gpu_work == []


# The function form plans in the call: its epilog inputs are checked as plan() checks them, before the
# constructor stages a, b and c (not only their names).
BAD_HOST_EPILOG_INPUTS = {
    "bias of another dtype": ("BIAS", lambda: {"bias": host((4,), np.float64)}, nvblaslt.NvblasltArgumentError,
                              r"epilog_inputs\['bias'\]: expected dtype float32"),
    "bias of another length": ("RELU_BIAS", lambda: {"bias": host((5,))}, nvblaslt.NvblasltValueError,
                               r"epilog_inputs\['bias'\]: The extents \(5,\) of the bias must match the result's M=4"),
    "bias with a batch the product lacks": ("BIAS", lambda: {"bias": host((3, 4))}, nvblaslt.NvblasltValueError,
                                            r"epilog_inputs\['bias'\]: The batch dimensions of the bias \(3,\)"),
    "relu_aux of a float dtype": ("DRELU", lambda: {"relu_aux": host((16, 6))}, nvblaslt.NvblasltArgumentError,
                                  r"epilog_inputs\['relu_aux'\]: The dtype of the relu_aux auxiliary input"),
    "an aux scale without an fp8 aux": ("BIAS", lambda: {"bias": host((4,)), "aux_quantization_scale": 1.0},
                                             nvblaslt.NvblasltValueError,
                                             r"epilog_inputs\['aux_quantization_scale'\]: only an fp8 aux"),
}


@pytest.mark.parametrize("case", BAD_HOST_EPILOG_INPUTS)
def test_function_form_refuses_a_bad_epilog_input_before_staging_the_operands(case, no_gpu_work):
    epilog, make_inputs, error, message = BAD_HOST_EPILOG_INPUTS[case]
    with pytest.raises(error, match=message):
        matmul(host((4, 3)), host((3, 6)), epilog=epilog, epilog_inputs=make_inputs())
    assert no_gpu_work == []
