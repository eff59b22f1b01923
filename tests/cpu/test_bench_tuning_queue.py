"""``python -m nvblaslt.bench.tuning --queue``: what runs ahead of a sample, without a GPU (the timing
stubbed): every sample of a duel, the burst-size probe included, runs behind what ``--queue`` names."""

from __future__ import annotations

from types import SimpleNamespace

from nvblaslt.bench import tuning, tuning_problems


def test_the_burst_size_probe_runs_behind_the_same_queue_as_the_duel(monkeypatch):
    queues = []

    def rounds_behind(cases, rounds, calls, flush, queue="gemm"):
        queues.append(queue)
        return [[0.01] * rounds for _ in cases]

    plan = SimpleNamespace(algorithm=SimpleNamespace(as_bytes=lambda: b"first"), _launch=None,
                           execute=lambda: None, free=lambda: None)
    monkeypatch.setattr(tuning_problems, "gpu_rounds", rounds_behind)  # burst_calls' probe
    monkeypatch.setattr(tuning, "gpu_rounds", rounds_behind)
    monkeypatch.setattr(tuning, "operands", lambda spec: object())
    monkeypatch.setattr(tuning, "planned", lambda spec, ops, pick=None: plan)
    monkeypatch.setattr(tuning, "key_of", lambda launch: None)
    monkeypatch.setattr(tuning, "torch_call", lambda spec, ops: lambda: None)
    monkeypatch.setattr(tuning, "torch_baseline", lambda spec: None)
    row = tuning.duel_problem({"name": "a problem"}, [None, None], 3, flush=None, queue="spin")
    assert row["calls"] == 5 and queues == ["spin", "spin"]
