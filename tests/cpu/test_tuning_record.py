"""NVBLASLT_RECORD (issue 35): each distinct problem a process plans, one JSON line, readable back as a
problem for `nvblaslt tune`; recording never breaks a plan. No GPU: a stand-in planned Matmul."""

from __future__ import annotations

import json
import types
import warnings

import pytest

import nvblaslt
from nvblaslt import _dtypes, _tuning_record
from nvblaslt._epilogs import MatmulEpilog


def operand(shape, strides, dtype="bfloat16"):
    return types.SimpleNamespace(shape=tuple(shape), strides=tuple(strides), dtype=_dtypes.BY_NAME[dtype])


def stand_in_plan(m, invariant=False):
    a, b = operand((m, 4096), (4096, 1)), operand((4096, 1024), (1, 4096))
    operands = types.SimpleNamespace(a=types.SimpleNamespace(op=a), b=types.SimpleNamespace(op=b), c=None)
    problem = types.SimpleNamespace(types=types.SimpleNamespace(compute="COMPUTE_32F", scale="CUDA_R_32F",
                                                                d=_dtypes.BY_NAME["bfloat16"]))
    return types.SimpleNamespace(_problem_operands=operands, _problem=problem,
                                 _options=nvblaslt.MatmulOptions(batch_invariant=invariant))


@pytest.fixture
def record(tmp_path, monkeypatch):
    path = tmp_path / "problems.jsonl"
    monkeypatch.setenv(_tuning_record.ENV_RECORD, str(path))
    monkeypatch.setattr(_tuning_record, "_seen", {})
    monkeypatch.setattr(_tuning_record, "_failed", set())
    return path


def test_each_distinct_problem_is_one_line(record):
    bias = {"bias": operand((1024,), (1,))}
    for m in (8, 8, 16, 8):
        _tuning_record.note(stand_in_plan(m), MatmulEpilog.RELU_BIAS, bias)
    _tuning_record.note(stand_in_plan(8, invariant=True), MatmulEpilog.RELU_BIAS, bias)
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert [line["a"]["shape"] for line in lines] == [[8, 4096], [16, 4096], [8, 4096]]
    assert lines[0] == {"kind": "matmul", "a": {"shape": [8, 4096], "strides": [4096, 1], "dtype": "bfloat16"},
                        "b": {"shape": [4096, 1024], "strides": [1, 4096], "dtype": "bfloat16"}, "c": None,
                        "epilog": "RELU_BIAS",
                        "inputs": {"bias": {"shape": [1024], "strides": [1], "dtype": "bfloat16"}},
                        "options": {"compute_type": "COMPUTE_32F", "scale_type": "CUDA_R_32F",
                                    "result_type": "bfloat16"}}
    assert lines[2]["options"]["batch_invariant"] == "rows"
    assert _tuning_record.read_problems(record) == lines


def test_a_second_process_does_not_write_a_line_again(record):
    _tuning_record.note(stand_in_plan(8), MatmulEpilog.DEFAULT, {})
    _tuning_record._seen.clear()  # as a fresh process sees the file
    _tuning_record.note(stand_in_plan(8), MatmulEpilog.DEFAULT, {})
    assert len(record.read_text().splitlines()) == 1


def test_nothing_is_written_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(_tuning_record.ENV_RECORD, raising=False)
    monkeypatch.chdir(tmp_path)
    _tuning_record.note(stand_in_plan(8), MatmulEpilog.DEFAULT, {})
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_file_warns_once_and_never_raises(tmp_path, monkeypatch):
    monkeypatch.setenv(_tuning_record.ENV_RECORD, str(tmp_path / "no-such-dir" / "problems.jsonl"))
    monkeypatch.setattr(_tuning_record, "_seen", {})
    monkeypatch.setattr(_tuning_record, "_failed", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for m in (8, 16):
            _tuning_record.note(stand_in_plan(m), MatmulEpilog.DEFAULT, {})
    assert len([w for w in caught if issubclass(w.category, _tuning_record.RecordWarning)]) == 1


def test_reading_names_the_line_that_is_not_a_problem(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"kind": "matmul", "a": {}, "b": {}}\n\n[1, 2]\n')
    with pytest.raises(nvblaslt.NvblasltValueError, match=r"p.jsonl: line 3: expected a recorded problem"):
        _tuning_record.read_problems(path)
