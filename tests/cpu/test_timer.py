"""``_timing.Timer`` without a GPU (cuda-bindings' runtime replaced by a clock of its own): a sample counts
only if the GPU was still on the work queued ahead of it once the whole sample was queued; one the host
outran is taken again (behind more work queued ahead once it is outrun again), so the host's time to issue a
call is not timed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nvblaslt import _cuda, _timing
from nvblaslt._errors import CudaError

KERNEL_MS, COVER_MS = 0.02, 0.035  # a decode GEMM, one L2 flush


class Status(int):
    """A cudaError_t as cuda-bindings gives one: an int with a name."""

    def __new__(cls, value: int, name: str):
        made = super().__new__(cls, value)
        made.name = name
        return made


NOT_READY = Status(600, "cudaErrorNotReady")


class FakeRuntime:
    """One stream. The GPU works through the flushes queued ahead of the start event while the host issues
    the call (``host_ms``); the start event is pending at the query only if the flushes outlast the host's
    time up to that query, and elapsed time holds the host's time where they did not. Every call is logged."""

    def __init__(self, host_ms: float):
        self.host_ms, self.flushes, self.calls = host_ms, 0, []
        self.query_status = None  # a status for cudaEventQuery to answer instead of its own

    def covered(self) -> bool:
        return self.flushes * COVER_MS > self.host_ms

    def cudaEventCreate(self):
        return (0, object())

    def cudaEventDestroy(self, event):
        return (0,)

    def cudaGetErrorString(self, error):
        return (0, b"a failure")

    def cudaMemsetAsync(self, pointer, value, size, stream):
        self.calls.append("flush")
        self.flushes += 1
        return (0,)

    def cudaEventRecord(self, event, stream):
        self.calls.append("record")
        return (0,)

    def cudaEventQuery(self, event):
        self.calls.append("query")
        if self.query_status is not None:
            return (self.query_status,)
        # only a query made once the whole sample is queued sees what the GPU did while the host issued it
        queued = self.calls[-4:-1] == ["record", "run", "record"]
        return (NOT_READY if queued and self.covered() else 0,)

    def cudaEventSynchronize(self, event):
        self.calls.append("sync")
        return (0,)

    def cudaEventElapsedTime(self, start, stop):
        ms = KERNEL_MS if self.covered() else self.host_ms + KERNEL_MS
        self.flushes = 0
        return (0, ms)


@pytest.fixture
def fake(monkeypatch):
    def make(host_ms: float) -> FakeRuntime:
        runtime = FakeRuntime(host_ms)
        monkeypatch.setattr(_timing, "cudart", runtime)
        return runtime
    monkeypatch.setattr(_timing, "_l2_bytes", lambda device: 1 << 20)
    monkeypatch.setattr(_timing, "DeviceBuffer",
                        lambda size, stream: SimpleNamespace(pointer=1, size=size, release=lambda: None))
    return make


def test_a_sample_the_host_outran_twice_is_taken_again_behind_more_work(fake):
    runtime = fake(host_ms=_timing.START_COVER * COVER_MS + 0.01)  # just beyond the first cover
    timer = _timing.Timer(0, 0)
    assert timer.cover == _timing.START_COVER
    prepared = []
    ms = timer(lambda: runtime.calls.append("run"), lambda: prepared.append(1))
    assert ms == KERNEL_MS  # not the host's time to issue it
    assert timer.cover == 2 * _timing.START_COVER and timer.retaken == 2 and timer.outran == 0
    assert runtime.calls.count("run") == 3 and len(prepared) == 3  # each sample taken again, set up again
    # each attempt: the flushes, start, the call, stop, and only then the query, before waiting on stop
    assert runtime.calls[-6:] == ["flush", "flush", "record", "run", "record", "query", "sync"][-6:]
    assert timer(lambda: runtime.calls.append("run")) == KERNEL_MS and timer.retaken == 2  # the cover stays


def test_a_one_off_pause_of_the_host_is_retaken_behind_the_same_cover(fake):
    runtime = fake(host_ms=0.05)
    pauses = iter([5.0])  # the first attempt only: a pause of the host's (a collection, a page fault)

    def prepare():
        runtime.host_ms = next(pauses, 0.05)
    timer = _timing.Timer(0, 0)
    assert timer(lambda: runtime.calls.append("run"), prepare) == KERNEL_MS
    assert timer.cover == _timing.START_COVER and timer.retaken == 1 and timer.outran == 0
    assert [timer(lambda: runtime.calls.append("run")) for _ in range(3)] == [KERNEL_MS] * 3
    assert timer.cover == _timing.START_COVER and timer.retaken == 1


def test_a_host_the_cover_never_outlasts_gives_up_after_its_attempts_and_says_so(fake):
    runtime = fake(host_ms=100.0)  # longer than MAX_COVER flushes
    timer = _timing.Timer(0, 0)
    ms = timer(lambda: runtime.calls.append("run"))
    assert ms == 100.0 + KERNEL_MS and runtime.calls.count("run") == _timing.ATTEMPTS
    assert timer.retaken == _timing.ATTEMPTS - 1 and timer.outran == 1
    assert timer.cover == _timing.MAX_COVER  # 8, 8, 16, 32: grown as far as it goes, for the next sample
    runs = runtime.calls.count("run")
    timer(lambda: runtime.calls.append("run"))  # outrun behind the most cover again: not retaken
    assert runtime.calls.count("run") == runs + 1 and timer.outran == 2 and timer.retaken == _timing.ATTEMPTS - 1


def test_the_cover_stops_growing_at_its_cap(fake, monkeypatch):
    fake(host_ms=0.05)
    monkeypatch.setattr(_timing, "MAX_COVER", 1)
    timer = _timing.Timer(0, 0)
    assert timer.cover == 1
    assert timer(lambda: None) == 0.05 + KERNEL_MS  # retaken once, then no more cover allowed: it is what it is
    assert timer.cover == 1 and timer.retaken == 1 and timer.outran == 1


def test_a_failing_query_raises_instead_of_counting_as_pending(fake, monkeypatch):
    runtime = fake(host_ms=0.0)
    runtime.query_status = Status(400, "cudaErrorInvalidResourceHandle")
    monkeypatch.setattr(_cuda, "cudart", runtime)  # the error's text
    timer = _timing.Timer(0, 0)
    with pytest.raises(CudaError, match="cudaErrorInvalidResourceHandle"):
        timer(lambda: None)


# ---- settle: the GPU at the power its own work draws, before a duel ---------------------------------------------
def test_settle_runs_back_to_back_until_its_time_is_up_never_queuing_more_than_a_chunk(monkeypatch):
    clock = [0.0]
    log: list[str] = []

    def run():  # a 1 ms call on a clock only the calls advance
        clock[0] += 0.001
        log.append("run")
    monkeypatch.setattr(_timing.time, "perf_counter", lambda: clock[0])
    _timing.settle(run, lambda: log.append("sync"), seconds=0.05)
    assert 0.05 <= clock[0] < 0.05 + _timing.SETTLE_CHUNK * 0.001 + 1e-9  # stops within a chunk of its time
    chunks = "".join("r" if entry == "run" else "|" for entry in log).split("|")
    assert chunks[-1] == "" and all(len(chunk) == _timing.SETTLE_CHUNK for chunk in chunks[:-1])


def test_settle_takes_no_time_when_given_none():
    calls = []
    _timing.settle(lambda: calls.append(1), lambda: calls.append(0), seconds=0.0)
    assert calls == []
