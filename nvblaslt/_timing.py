"""Timing on the GPU: ``Timer`` (CUDA events around one call, L2 flushed before it),
``shuffled_rounds``, the one way this package times several things against each other, and ``settle``,
which brings the GPU to the power state a problem's own work keeps it in before a duel.

Every contestant runs once per round, and each round runs them in a fresh random order. In a
fixed or rotated order a contestant always follows the same neighbour, and at the seed's shape on
an H200 that alone made one kernel read up to 6 % faster than itself (autotune, the bench and the
MLP bench all time this way).
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from . import _cuda
from ._cuda import cudart
from ._logging import logger
from ._memory import DeviceBuffer

T = TypeVar("T")


@functools.lru_cache(maxsize=None)
def _l2_bytes(device: int) -> int:
    return _cuda.device_properties(device).l2CacheSize


# The GPU's power state decides some duels. An H200 running a large GEMM back to back sits at its power
# limit (700 W) and its clock follows; after a second or more idle it starts a duel boosted, and the kernels
# that win there are not the ones that win at the limit: qwen3-8b's GELU_AUX_BIAS pick at 8192 tokens read
# 0.906-0.911x the first pick's time after 0.3 s of the first pick back to back, 0.904-0.909x after 1 s, and
# 0.985-1.051x after 1.5 s idle (tools/probe_pick_stability --between, 2026-11-29). Large GEMMs run back to
# back in a training or prefill step, so a search's duels start settled.
SETTLE_S = 0.3
SETTLE_CHUNK = 8  # calls queued between synchronizations while settling

START_COVER = 8  # L2 flushes queued ahead of each sample at first: about 0.2 ms of GPU work on an H200, more
#                  than the host's usual time to issue a trial run. Starting at 1 and doubling, one tune
#                  of a problem timed behind 2 flushes and the next behind 32, and a 1.1 ms GELU_AUX_BIAS
#                  kernel read 0.91x the first pick behind 2-16 and 0.99x behind 32: the memsets ahead
#                  move the GPU's power state (bench.tuning's tune logs, H200, 2026-11-29)
MAX_COVER = 32  # L2 flushes queued ahead of a sample at most (about 1 ms of GPU work on an H200)
ATTEMPTS = 4  # samples taken of one call at most: a one-off outrun is retaken behind the same cover; the
#              cover doubles only when the host outruns the retake too


class Timer:
    """Milliseconds of one call on ``stream``, L2 flushed before it, CUDA events around it, with the host's
    time to issue the call kept out of the events wherever the cover allows.

    The events time the GPU from the start event to the stop event. If the GPU reaches the start event
    before the host has queued the call, the host's time to issue it is timed as well: on an H200 the
    search's screening read a 22 µs decode GEMM at 46–93 µs that way (the host's first launch of a kernel
    and the plan's Python), and ranked its candidates by that. So the flush is queued ``cover`` times ahead
    of each sample (``START_COVER`` at first), a sample counts only if the start event was still pending
    once the stop event was queued (``cudaEventQuery``), and one that the host outran is taken again: behind
    the same cover the first time (a pause of the host's is no reason to time everything after it behind
    more work), then with the cover doubled (up to ``MAX_COVER`` flushes, ``ATTEMPTS`` tries; the cover stays
    for the Timer's life: one tune; after a sample outran even ``MAX_COVER``, the next one outrun there is not
    retaken). ``retaken`` counts the samples taken again, ``outran`` those returned with host time in them
    all the same."""

    def __init__(self, device: int, stream: int):
        self.stream = stream
        self.cover = min(START_COVER, MAX_COVER)  # flushes queued ahead of each sample: GPU work that outlasts
        #                                            the host's time to issue the call
        self.retaken = 0
        self._hopeless = False  # the last sample outran even the most cover: retaking behind it again costs a run
        self.outran = 0
        self._samples, self._seconds = 0, 0.0  # samples returned and the wall time they took: sample_s
        self._flush = DeviceBuffer(max(2 * _l2_bytes(device), 1 << 20), stream)
        self._start = _cuda.check(cudart.cudaEventCreate(), "cudaEventCreate")
        self._stop = _cuda.check(cudart.cudaEventCreate(), "cudaEventCreate")

    def __call__(self, run: Callable[[], object], prepare: Callable[[], object] | None = None) -> float:
        """Time ``run()``; ``prepare()`` (host-side set-up, such as selecting the algorithm) runs first, untimed.
        A sample the host outran runs ``prepare()`` and ``run()`` again."""
        stream, started = self.stream, time.perf_counter()
        for attempt in range(ATTEMPTS):
            if prepare is not None:
                prepare()
            for _ in range(self.cover):
                _cuda.check(cudart.cudaMemsetAsync(self._flush.pointer, 0, self._flush.size, stream),
                            "cudaMemsetAsync")
            _cuda.check(cudart.cudaEventRecord(self._start, stream), "cudaEventRecord")
            run()
            _cuda.check(cudart.cudaEventRecord(self._stop, stream), "cudaEventRecord")
            (status,) = cudart.cudaEventQuery(self._start)
            pending = status != _cuda.SUCCESS and status.name == "cudaErrorNotReady"  # the GPU was still on the cover
            if status != _cuda.SUCCESS and not pending:
                _cuda.check((status,), "cudaEventQuery")
            _cuda.check(cudart.cudaEventSynchronize(self._stop), "cudaEventSynchronize")
            ms = _cuda.check(cudart.cudaEventElapsedTime(self._start, self._stop), "cudaEventElapsedTime")
            if pending:
                self._hopeless = False
                self._count(started)
                return ms
            grown = min(2 * self.cover, MAX_COVER) if attempt > 0 else self.cover  # outrun again: more cover
            if attempt == ATTEMPTS - 1 or (attempt > 0 or self._hopeless) and grown == self.cover:
                self._hopeless = grown == MAX_COVER
                self.cover = grown
                self.outran += 1
                self._count(started)
                return ms
            self.cover = grown
            self.retaken += 1
        raise AssertionError("unreachable: the last attempt returns")

    def _count(self, started: float) -> None:
        self._samples += 1
        self._seconds += time.perf_counter() - started

    @property
    def sample_s(self) -> float:
        """Wall seconds one sample has taken on average (its cover, retakes and the host's share
        included; 0.0 before the first): what a duel's round costs, which the call's own time
        understates by far for a short GEMM behind ``START_COVER`` flushes."""
        return self._seconds / self._samples if self._samples else 0.0

    def synchronize(self) -> None:
        _cuda.check(cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")

    def close(self) -> None:
        if self.retaken or self.outran:
            logger.info("timing: %d samples taken again (%d L2 flushes queued ahead at the end), %d kept with the "
                        "host's time to issue the call in them", self.retaken, self.cover, self.outran)
        cudart.cudaEventDestroy(self._start)
        cudart.cudaEventDestroy(self._stop)
        self._flush.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def settle(run: Callable[[], object], synchronize: Callable[[], None], seconds: float = SETTLE_S) -> None:
    """``run()`` back to back for ``seconds`` (wall clock; the stream synchronized every ``SETTLE_CHUNK``
    calls, so that no more than that is ever queued): what is timed next starts in the power state that
    this work keeps the GPU in (``SETTLE_S`` says why)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(SETTLE_CHUNK):
            run()
        synchronize()


# Where each timing's orders come from: fresh seeds by default (no order shared by every timing);
# tests replace it to replay a timing exactly.
new_shuffler: Callable[[], random.Random] = random.Random


def shuffled(shuffler: random.Random, count: int) -> list[int]:
    """0 … count-1 in a fresh order."""
    order = list(range(count))
    shuffler.shuffle(order)
    return order


def shuffled_rounds(contestants: Sequence[T], rounds: int, measure: Callable[[T], float],
                    shuffler: random.Random | None = None) -> list[list[float]]:
    """``samples[i]``: ``measure(contestants[i])`` once per round, over ``rounds`` rounds, each round
    in a fresh shuffled order (warm-up is the caller's)."""
    shuffler = shuffler or new_shuffler()
    samples: list[list[float]] = [[] for _ in contestants]
    for _ in range(max(1, rounds)):
        for index in shuffled(shuffler, len(contestants)):
            samples[index].append(measure(contestants[index]))
    return samples
