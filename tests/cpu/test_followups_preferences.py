"""``preferences.limit`` on a machine without a GPU: 0 where the heuristics are to be asked is refused
before any GPU work, with the class nvmath-python's users get for it (cuBLASLt's INVALID_VALUE, a
``CublasLtError``) that is also a ``ValueError``; with ``algorithms`` given it is kept, as nvmath-python
keeps it. A limit that is no integer is a ``TypeError`` as under nvmath-python (NumPy sizes its
result buffer with it), and still the ``ValueError`` it was."""

from __future__ import annotations

import numpy as np
import pytest

from nvblaslt import CublasLtError, Matmul, MatmulPlanPreferences, NvblasltArgumentError, NvblasltValueError, matmul
from nvblaslt._launch import Launch
from tests.fakes import FakeDLPack, Reached, forbid_gpu_work, reached

RNG = np.random.default_rng()


@pytest.fixture
def no_gpu_work(monkeypatch, default_lib):
    """Host staging, scale uploads, CUDA device questions and ``Launch.planned`` are recorded and fail."""
    touched = forbid_gpu_work(monkeypatch)

    def planned(*args, **kwargs):
        touched.append("the handle and heuristics")
        raise AssertionError("the handle and heuristics before the call was refused")
    monkeypatch.setattr(Launch, "planned", classmethod(planned))
    return touched


@pytest.fixture
def fake_gpu(monkeypatch, default_lib):
    """Plans over stand-in GPU arrays: ``Launch.planned`` (where the handle is made) raises ``Reached``."""
    monkeypatch.setattr(Launch, "planned", classmethod(reached))


def host(shape):
    return RNG.standard_normal(shape).astype(np.float32)


def assert_the_heuristics_limit_error(error):
    assert isinstance(error, CublasLtError) and isinstance(error, NvblasltValueError)
    assert error.status_name == "CUBLAS_STATUS_INVALID_VALUE" and error.status == 7
    assert error.function == "cublasLtMatmulAlgoGetHeuristic"
    assert str(error).startswith("preferences.limit: expected an int from 1 to 1024 where the heuristics are asked")
    assert "got 0" in str(error)


@pytest.mark.parametrize("preferences", [{"limit": 0}, MatmulPlanPreferences(limit=0)])
def test_function_form_refuses_limit_zero_before_any_gpu_work(preferences, no_gpu_work):
    with pytest.raises(CublasLtError) as refused:
        matmul(host((4, 3)), host((3, 6)), preferences=preferences)
    assert_the_heuristics_limit_error(refused.value)
    assert no_gpu_work == []


def test_plan_refuses_limit_zero_before_the_handle_is_made(fake_gpu):
    mm = Matmul(FakeDLPack((8, 4)), FakeDLPack((4, 6), ptr=0x7F0000100000))
    with pytest.raises(CublasLtError) as refused:
        mm.plan(preferences={"limit": 0})
    assert_the_heuristics_limit_error(refused.value)
    with pytest.raises(Reached):  # without the limit the same plan gets to the handle
        mm.plan(preferences={"limit": 1})


def test_limit_zero_with_algorithms_asks_no_heuristics_and_is_kept(fake_gpu):
    mm = Matmul(FakeDLPack((8, 4)), FakeDLPack((4, 6), ptr=0x7F0000100000))
    with pytest.raises(Reached):  # the caller's algorithms are checked in Launch.planned; limit plays no part
        mm.plan(preferences={"limit": 0}, algorithms=[bytes(64)])
    assert MatmulPlanPreferences(limit=0).limit == 0


@pytest.mark.parametrize("limit", [2.5, "8", 4.0, [4]])
def test_a_limit_that_is_no_integer_is_a_type_error_too(limit):
    with pytest.raises(NvblasltArgumentError, match=r"^preferences\.limit: expected an int from 0 to 1024") as refused:
        MatmulPlanPreferences(limit=limit)
    assert isinstance(refused.value, TypeError) and isinstance(refused.value, ValueError)
    assert repr(limit) in str(refused.value)


@pytest.mark.parametrize("limit", [-1, 1025])
def test_a_limit_out_of_range_is_a_value_error_naming_it(limit):
    with pytest.raises(NvblasltValueError, match=rf"^preferences\.limit: expected an int from 0 to 1024.*got {limit}$"):
        MatmulPlanPreferences(limit=limit)


def test_a_numpy_integer_limit_is_taken_as_nvmath_python_takes_it():
    preferences = MatmulPlanPreferences(limit=np.int64(4))
    assert preferences.limit == 4 and type(preferences.limit) is int
