"""``python -m nvblaslt.bench.tuning --queue``: what runs ahead of a sample, without a GPU (the timing
stubbed): every sample of a duel, the burst-size probe included, runs behind what ``--queue`` names, and a duel
starts with the GPU settled (``--settle``)."""

from __future__ import annotations

from types import SimpleNamespace

from nvblaslt.bench import tuning, tuning_problems


def test_the_burst_size_probe_runs_behind_the_same_queue_as_the_duel(monkeypatch):
    queues, settles = [], []

    def rounds_behind(cases, rounds, calls, flush, queue="gemm", settle_s=tuning_problems.SETTLE_S):
        queues.append(queue)
        settles.append(settle_s)
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
    monkeypatch.setattr(tuning, "launched_kernels", lambda fn: [("a kernel", 1.0)])
    row = tuning.duel_problem({"name": "a problem"}, [None, None], 3, flush=None, queue="spin")
    assert row["calls"] == 5 and queues == ["spin", "spin"]
    # the duel starts settled, as a tune's duels do; the one-sample probe needs no settling
    assert settles == [0.0, tuning_problems.SETTLE_S] and tuning_problems.SETTLE_S > 0
    tuning.duel_problem({"name": "a problem"}, [None, None], 3, flush=None, settle_s=0.0)
    assert settles[-1] == 0.0  # --settle 0: as before


def test_the_gemm_queue_multiplies_random_values_not_constants(monkeypatch):
    """GEMMs on constant data draw less power (H200: 424 W against 689 W), so the clock ran higher behind them
    than a training step lets it: the queue's GEMMs read random values."""
    import sys

    made, multiplied = [], []

    class Matrix:
        def __init__(self, kind):
            self.kind = kind
            made.append(kind)

        def __mul__(self, other):
            return self

        def __sub__(self, other):
            return self

    fake = SimpleNamespace(
        bfloat16="bf16", rand=lambda *shape, **kw: Matrix("random"), ones=lambda *shape, **kw: Matrix("ones"),
        empty_like=lambda m: Matrix("empty"), mm=lambda x, y, out=None: multiplied.append((x.kind, y.kind)),
        cuda=SimpleNamespace(_sleep=lambda cycles: None))
    monkeypatch.setitem(sys.modules, "torch", fake)

    settled = []

    def rounds(torch, cases, rounds, calls, before, settle_s):
        before()
        settled.append(settle_s)
        return [[0.01] for _ in cases]
    monkeypatch.setattr(tuning_problems, "event_rounds", rounds)
    flush = SimpleNamespace(zero_=lambda: None)
    tuning_problems.gpu_rounds([("case", lambda: None)], 1, 1, flush, "gemm")
    assert multiplied and set(multiplied) == {("random", "random")}
    multiplied.clear()
    tuning_problems.gpu_rounds([("case", lambda: None)], 1, 1, flush, "spin")
    assert not multiplied  # the spin queue runs a sleep kernel only
    assert settled == [0.0, 0.0]  # only a duel asks to settle: the invariance part times 81 plan pairs per (N, K)


def test_a_settled_duel_runs_its_first_case_back_to_back_after_the_warm_up_and_before_its_rounds():
    from nvblaslt.bench.timing import event_rounds

    log: list[str] = []

    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            log.append("event")

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return 1.0
    fake = SimpleNamespace(cuda=SimpleNamespace(Event=Event, synchronize=lambda: log.append("sync")))
    cases = [("first", lambda: log.append("first")), ("pick", lambda: log.append("pick"))]
    event_rounds(fake, cases, 1, settle_s=0.01)
    warm_up_end = log.index("sync")  # two calls each, then the device drained
    assert sorted(log[:warm_up_end]) == ["first", "first", "pick", "pick"]
    settling = log[warm_up_end + 1:log.index("event")]
    assert settling.count("first") >= 8 and "pick" not in settling and settling[-1] == "sync"
    log.clear()
    event_rounds(fake, cases, 1)  # unsettled: the rounds follow the warm-up at once
    assert log[log.index("sync") + 1] == "event"


def test_the_settle_and_queue_options_reach_every_duel(monkeypatch):
    """``--settle`` and ``--queue`` through argparse to each problem's duel (the default settles as the search's
    duels do)."""
    import time

    import pytest

    pytest.importorskip("torch")
    seen = []

    def duel_problem(spec, databases, rounds, flush, queue, settle_s):
        seen.append((spec["name"], rounds, queue, settle_s))
        return {"name": spec["name"], "error": "stood in"}
    monkeypatch.setattr(tuning, "duel_problem", duel_problem)
    monkeypatch.setattr(tuning, "free_memory", lambda torch: None)
    args = tuning.arguments(["--quick", "--settle", "0.5", "--queue", "spin", "--rounds", "7"])
    results: dict = {}
    tuning.run_duels(args, [{"name": "p1"}, {"name": "p2"}], [None, None], results, time.perf_counter() + 60, None)
    assert seen == [("p1", 7, "spin", 0.5), ("p2", 7, "spin", 0.5)]
    assert [row["name"] for row in results["duels"]["rows"]] == ["p1", "p2"]
    assert tuning.arguments(["--quick"]).settle == tuning_problems.SETTLE_S
