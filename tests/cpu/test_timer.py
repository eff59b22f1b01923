"""``_timing.Timer`` without a GPU (cuda-bindings' runtime replaced by a clock of its own): a sample counts
only if the GPU was still on the work queued ahead of it once the whole sample was queued; one the host
outran is taken again with more work queued ahead, so the host's time to issue a call is never timed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nvblaslt import _timing

KERNEL_MS, HOST_MS, COVER_MS = 0.02, 0.05, 0.035  # a decode GEMM, the host's time to issue it, one flush


class FakeRuntime:
    """One stream: the GPU reaches the start event after the flushes queued ahead of it; the host queues the
    call ``HOST_MS`` after the start event. Elapsed time includes the host's time where the GPU got there first."""

    def __init__(self):
        self.flushes = 0
        self.ran = 0

    def cudaEventCreate(self):
        return (0, object())

    def cudaEventDestroy(self, event):
        return (0,)

    def cudaMemsetAsync(self, pointer, value, size, stream):
        self.flushes += 1
        return (0,)

    def cudaEventRecord(self, event, stream):
        return (0,)

    def cudaEventQuery(self, event):
        covered = self.flushes * COVER_MS > HOST_MS
        return (SimpleNamespace(name="cudaErrorNotReady") if covered else 0,)

    def cudaEventSynchronize(self, event):
        return (0,)

    def cudaEventElapsedTime(self, start, stop):
        covered = self.flushes * COVER_MS > HOST_MS
        self.flushes = 0
        return (0, KERNEL_MS if covered else HOST_MS + KERNEL_MS)


@pytest.fixture
def runtime(monkeypatch):
    fake = FakeRuntime()
    monkeypatch.setattr(_timing, "cudart", fake)
    monkeypatch.setattr(_timing, "_l2_bytes", lambda device: 1 << 20)
    monkeypatch.setattr(_timing, "DeviceBuffer",
                        lambda size, stream: SimpleNamespace(pointer=1, size=size, release=lambda: None))
    return fake


def test_a_sample_the_host_outran_is_taken_again_behind_more_work(runtime):
    timer = _timing.Timer(0, 0)
    prepared = []

    def run():
        runtime.ran += 1
    ms = timer(run, lambda: prepared.append(1))
    assert ms == KERNEL_MS  # not the host's time to issue it
    assert timer.cover == 2 and timer.retaken == 1
    assert runtime.ran == 2 and len(prepared) == 2  # the sample taken again, set up again
    assert timer(run) == KERNEL_MS and timer.retaken == 1  # the cover stays: the next sample counts at once


def test_the_cover_stops_growing_at_its_cap(runtime, monkeypatch):
    monkeypatch.setattr(_timing, "MAX_COVER", 1)
    timer = _timing.Timer(0, 0)
    assert timer(lambda: None) == HOST_MS + KERNEL_MS  # no more cover allowed: the sample is what it is
    assert timer.cover == 1 and timer.retaken == 0
