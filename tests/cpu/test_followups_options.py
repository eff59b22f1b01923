"""``options.result_type`` with ``options.inplace``, on a machine without a GPU: nvmath-python
honours ``inplace`` (the result is ``c``, of ``c``'s dtype), ignores the result type and logs a
warning that it does. nvblaslt does the same, with a ``UserWarning`` pointing at the caller's line
(as for ``options.fast_accumulation``), instead of ignoring it silently."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from nvblaslt import Matmul, NvblasltValueError, _dtypes, _host, matmul
from tests.fakes import FakeDLPack

RNG = np.random.default_rng()
IGNORED = r"^options\.result_type: ignored in place, where the result is c itself \(so float32\); got 'float16'$"


class Reached(Exception):
    """Raised in place of host staging: the call got past every check."""


@pytest.fixture
def staging_is_reached(monkeypatch, default_lib):
    def reached(*args, **kwargs):
        raise Reached()
    monkeypatch.setattr(_host, "stage", reached)


def host(shape):
    return RNG.standard_normal(shape).astype(np.float32)


def fake_gpu_operands():
    return (FakeDLPack((8, 4)), FakeDLPack((4, 6), ptr=0x7F0000100000), FakeDLPack((8, 6), ptr=0x7F0000200000))


def test_matmul_in_place_warns_that_result_type_is_ignored_and_writes_cs_dtype(default_lib):
    a, b, c = fake_gpu_operands()
    with pytest.warns(UserWarning, match=IGNORED) as warned:
        mm = Matmul(a, b, c, beta=1.0, options={"inplace": True, "result_type": "float16"})
    assert warned[0].filename == __file__  # the caller's line, not nvblaslt's
    assert mm._problem_operands.types.d is _dtypes.FLOAT32 and mm._problem_operands.inplace


@pytest.mark.parametrize("given", [{"options": {"inplace": True, "result_type": "float16"}},
                                   {"options": {"inplace": True}, "result_type": "float16"}])
def test_function_form_in_place_warns_at_the_callers_line_then_runs(given, staging_is_reached):
    with pytest.warns(UserWarning, match=IGNORED) as warned, pytest.raises(Reached):
        matmul(host((8, 4)), host((4, 6)), host((8, 6)), beta=1.0, **given)
    assert warned[0].filename == __file__


def test_no_warning_without_result_type_or_out_of_place(default_lib):
    a, b, c = fake_gpu_operands()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Matmul(a, b, c, beta=1.0, options={"inplace": True})
        out_of_place = Matmul(a, b, c, beta=1.0, options={"result_type": "float32"})
        assert out_of_place._problem_operands.types.d is _dtypes.FLOAT32


def test_in_place_without_c_is_refused_with_no_warning(default_lib):
    a, b, _ = fake_gpu_operands()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(NvblasltValueError, match=r"^options\.inplace: the result is written into c"):
            Matmul(a, b, options={"inplace": True, "result_type": "float16"})


class _Properties:
    totalGlobalMem = 80 << 30


@pytest.mark.parametrize("memory_limit, workspace, expected", [
    ("80%", 1 << 37, 64 << 30),      # the default caps a workspace larger than 80% of the GPU too
    ("80 %", 1 << 37, 64 << 30),
    (0.8, 1 << 37, 64 << 30),
    ("1 GiB", 32 << 20, 32 << 20),   # a cap never raises the workspace
    ("1 MiB", 32 << 20, 1 << 20),
    ("80%", 32 << 20, 32 << 20),     # the default with a usual workspace: the device is not asked
])
def test_the_memory_limit_caps_the_workspace_whether_given_or_default(monkeypatch, memory_limit, workspace,
                                                                      expected):
    from nvblaslt import _launch

    asked = []
    monkeypatch.setattr(_launch._cuda, "device_properties", lambda device: asked.append(device) or _Properties())
    _launch._total_memory.cache_clear()
    try:
        assert _launch.workspace_cap(memory_limit, workspace, 0) == expected
        assert _launch.workspace_cap(memory_limit, workspace, 0) == expected
    finally:
        _launch._total_memory.cache_clear()  # what this fake GPU answered stays here
    assert len(asked) == (memory_limit != "80%" or workspace > 1 << 30)  # once per device at most
