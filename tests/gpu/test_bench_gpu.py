"""The bench's cheap sections on the GPU (the rest of the bench's tests need none: tests/cpu/test_bench.py)."""

from __future__ import annotations

import json

import pytest

from nvblaslt.bench import cli

pytestmark = pytest.mark.gpu


def test_the_cheap_sections_run_on_the_gpu(tmp_path):
    pytest.importorskip("torch")
    code = cli.main(["--sections", "percall,import", "--calls", "20", "--rounds", "2", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "bench.json").read_text())
    assert code == 0, results["errors"]
    assert results["percall"]["bare_matches_matmul"] < 1e-5
    cold = results["import"]  # each row ran in fresh interpreters; CuPy is on the GPU machine
    assert {"import nvblaslt", "import cupy", "first result, nvblaslt.matmul"} <= set(cold)
    assert all(len(row["runs"]) == 2 and row["seconds"] > 0 for row in cold.values())

