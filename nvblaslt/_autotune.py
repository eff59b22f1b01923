"""Time a plan's algorithms with CUDA events, flushing L2 between runs so that every run
reads its operands from device memory as a real workload would."""

from __future__ import annotations

import statistics

from cuda.bindings import runtime as cudart

from . import _cuda
from ._memory import DeviceBuffer


def time_calls(device: int, calls: list, stream: int, iterations: int) -> list[float]:
    """Median milliseconds of each zero-argument call, each preceded by an L2 flush.

    Round-robin, not one call after another: clocks drift as the GPU heats up, and interleaving
    spreads that drift over every call alike."""
    flush = DeviceBuffer(max(2 * _cuda.device_properties(device).l2CacheSize, 1 << 20), 0)
    start = _cuda.check(cudart.cudaEventCreate(), "cudaEventCreate")
    stop = _cuda.check(cudart.cudaEventCreate(), "cudaEventCreate")
    samples: list[list[float]] = [[] for _ in calls]
    try:
        for call in calls:  # warm-up: module load, first-launch costs
            call()
        for _ in range(max(1, iterations)):
            for index, call in enumerate(calls):
                _cuda.check(cudart.cudaMemsetAsync(flush.pointer, 0, flush.size, stream), "cudaMemsetAsync")
                _cuda.check(cudart.cudaEventRecord(start, stream), "cudaEventRecord")
                call()
                _cuda.check(cudart.cudaEventRecord(stop, stream), "cudaEventRecord")
                _cuda.check(cudart.cudaEventSynchronize(stop), "cudaEventSynchronize")
                samples[index].append(_cuda.check(cudart.cudaEventElapsedTime(start, stop), "cudaEventElapsedTime"))
    finally:
        cudart.cudaEventDestroy(start)
        cudart.cudaEventDestroy(stop)
        flush.release()
    return [statistics.median(s) for s in samples]


def time_algorithms(plan, candidates, stream: int, iterations: int):
    """[(HeuristicResult, median ms)] for every candidate algorithm of ``plan``, fastest first."""

    def running(candidate):
        def call():
            plan._select(candidate)
            plan.execute(stream=stream)
        return call

    medians = time_calls(plan._device, [running(c) for c in candidates], stream, iterations)
    return sorted(zip(candidates, medians), key=lambda pair: pair[1])
