"""Time a plan's algorithms with CUDA events, flushing L2 between runs so that every run
reads its operands from device memory as a real workload would."""

from __future__ import annotations

import statistics

from cuda.bindings import runtime as cudart

from . import _cuda
from ._memory import DeviceBuffer


def _l2_flush_buffer(device: int) -> DeviceBuffer:
    props = _cuda.device_properties(device)
    return DeviceBuffer(max(2 * props.l2CacheSize, 1 << 20), 0)


def time_algorithms(plan, candidates, stream: int, iterations: int):
    """[(HeuristicResult, median ms)] for every candidate algorithm, fastest first."""
    flush = _l2_flush_buffer(plan._device)
    start = _cuda.check(cudart.cudaEventCreate(), "cudaEventCreate")
    stop = _cuda.check(cudart.cudaEventCreate(), "cudaEventCreate")
    samples = {id(c): [] for c in candidates}
    try:
        for candidate in candidates:  # warm-up: module load, first-launch costs
            plan._select(candidate)
            plan.execute(stream=stream)
        # Round-robin, not one candidate after another: clocks drift as the GPU heats up, and
        # interleaving spreads that drift over every candidate alike.
        for _ in range(max(1, iterations)):
            for candidate in candidates:
                plan._select(candidate)
                _cuda.check(cudart.cudaMemsetAsync(flush.pointer, 0, flush.size, stream), "cudaMemsetAsync")
                _cuda.check(cudart.cudaEventRecord(start, stream), "cudaEventRecord")
                plan.execute(stream=stream)
                _cuda.check(cudart.cudaEventRecord(stop, stream), "cudaEventRecord")
                _cuda.check(cudart.cudaEventSynchronize(stop), "cudaEventSynchronize")
                samples[id(candidate)].append(
                    _cuda.check(cudart.cudaEventElapsedTime(start, stop), "cudaEventElapsedTime"))
        timings = [(c, statistics.median(samples[id(c)])) for c in candidates]
    finally:
        cudart.cudaEventDestroy(start)
        cudart.cudaEventDestroy(stop)
        flush.release()
    timings.sort(key=lambda pair: pair[1])
    return timings
