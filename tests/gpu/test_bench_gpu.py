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


def test_a_held_stream_times_what_runs_on_it_and_is_released_when_a_sample_fails():
    torch = pytest.importorskip("torch")
    from nvblaslt.bench.timing import event_rounds, held_rounds

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    cases = [("one", lambda: a @ a), ("four", lambda: [a @ a for _ in range(4)])]
    held = [min(s) for s in held_rounds(torch, cases, 5)]
    plain = [min(s) for s in event_rounds(torch, cases, 5)]
    assert 3.0 < held[1] / held[0] < 5.0  # the events hold the GEMMs and nothing else
    assert held[0] == pytest.approx(plain[0], rel=0.25)

    calls = []

    def failing():  # the two warm-up calls pass; the sample's, queued behind the held stream, fails
        a @ a
        calls.append(1)
        if len(calls) > 2:
            raise RuntimeError("a sample's call failed")
    with pytest.raises(RuntimeError, match="sample's call failed"):
        held_rounds(torch, [("failing", failing)], 1)
    assert len(calls) == 3
    torch.cuda.synchronize()  # returns: the gate was released in spite of the failure
