"""Probe (GPU): does the way a kernel is timed change which of two kernels is faster?

``nvblaslt tune`` keeps a pick when it beats the heuristics' first pick in ``_autotune``'s duel: one call per
sample, the L2 flushed before it, no work queued ahead (``_timing.Timer``: the GPU idles between samples
while the host waits). ``bench.tuning`` re-times the pair in its own duel: each sample behind a spin kernel
(the GPU busy, as in a training step), the L2 flushed, two plans. On an H200 both runs of 2026-11-28 kept
qwen3-8b's BGRADB pick at 0.972–0.979× the first pick's time and both bench duels read it 1.011–1.012×
slower. For each tuned problem of a database, this times the first pick and the database's pick three ways
(the GPU idle while the host issues each sample; a spin queued ahead; ``_timing.Timer`` as the tune uses it
now), and two more that tell the causes apart: ``gated``, the stream held on a host flag
(``cuStreamWaitValue32``) while the sample is queued and released after (no host gap inside the events, the
GPU idle before), and ``gemm ahead``, a ~1 ms GEMM queued ahead (the SMs busy and drawing power, as the
layer before in a training step). It prints pick / first for each, beside the ratio the tune recorded.

    PYTHONPATH=. python -m tools.probe_tune_timing PROBLEMS.jsonl DATABASE.jsonl [--rounds 30]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics

import torch

import random

from nvblaslt import _timing, _tuning_db
from nvblaslt._tuning_cache import key_of
from nvblaslt.bench.timing import event_rounds
from nvblaslt.bench.tuning_problems import flush_buffer, operands, planned

SPIN_CYCLES = 2_000_000  # about 1 ms of queued GPU work ahead of a spin sample


class Gate:
    """Holds a stream on a host-mapped flag (``cuStreamWaitValue32``) until ``release()``: what is queued
    behind it runs back to back. A probe's tool only: a blocking CUDA call made while held never returns."""

    def __init__(self, stream: int):
        from cuda.bindings import driver, runtime

        self.driver, self.stream, self.count = driver, stream, 0
        err, self.host = runtime.cudaHostAlloc(4, runtime.cudaHostAllocMapped)
        assert err == 0, err
        err, self.device = runtime.cudaHostGetDevicePointer(self.host, 0)
        assert err == 0, err
        self.flag = ctypes.c_uint32.from_address(self.host)
        self.flag.value = 0

    def hold(self) -> None:
        self.count += 1
        (err,) = self.driver.cuStreamWaitValue32(self.stream, self.device, self.count,
                                                 self.driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ)
        assert err == 0, err

    def release(self) -> None:
        self.flag.value = self.count


def _ratio(pick: list[float], first: list[float]) -> float:
    return statistics.median(p / f for p, f in zip(pick, first))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems")
    parser.add_argument("database")
    parser.add_argument("--rounds", type=int, default=30)
    options = parser.parse_args(argv)
    database = _tuning_db.read(options.database)
    flush = flush_buffer()
    specs = [json.loads(line) for line in open(options.problems) if line.strip()]
    print(f"{torch.cuda.get_device_name()}; pick / first pick, median of {options.rounds} interleaved rounds "
          f"(below 1: the pick is faster)")
    print(f"  {'problem':66s} {'idle':>8s} {'spin, as the bench':>19s} {'_timing.Timer':>14s} {'gated':>7s} "
          f"{'gemm ahead':>10s}  tune's own")
    timer = _timing.Timer(0, torch.cuda.current_stream().cuda_stream)
    gate = Gate(torch.cuda.current_stream().cuda_stream)
    big = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)  # 4096³ bf16: about 0.2 ms; four of them
    for _ in range(2):
        torch.mm(big, big)
    for spec in specs:
        if spec.get("kind") != "matmul":
            continue
        ops = operands(spec)
        first = planned(spec, ops)
        entry = database.entries.get(key_of(first._launch))
        if entry is None or entry.get("kind") != "tuned":
            first.free()
            continue
        pick = planned(spec, ops, bytes.fromhex(entry["algo"]))

        def idle():
            flush.zero_()

        def spin():
            torch.cuda._sleep(SPIN_CYCLES)
            flush.zero_()

        def ahead():
            for _ in range(5):  # about 1 ms
                torch.mm(big, big)
            flush.zero_()

        def gated(case) -> float:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            gate.hold()
            try:
                flush.zero_()
                start.record()
                case[1]()
                stop.record()
            finally:
                gate.release()
            stop.synchronize()
            return start.elapsed_time(stop)

        cases = [("first", first.execute), ("pick", pick.execute)]
        cold = event_rounds(torch, cases, options.rounds, before=idle)
        warm = event_rounds(torch, cases, options.rounds, before=spin)
        timed = _timing.shuffled_rounds(cases, options.rounds, lambda case: timer(case[1]), shuffler=random.Random(0))
        held = _timing.shuffled_rounds(cases, options.rounds, gated, shuffler=random.Random(1))
        busy = event_rounds(torch, cases, options.rounds, before=ahead)
        print(f"  {spec['name'][:66]:66s} {_ratio(cold[1], cold[0]):8.3f} {_ratio(warm[1], warm[0]):19.3f}"
              f" {_ratio(timed[1], timed[0]):14.3f} {_ratio(held[1], held[0]):7.3f} {_ratio(busy[1], busy[0]):10.3f}"
              f"  {entry.get('ratio', float('nan')):.3f}")
        first.free()
        pick.free()


if __name__ == "__main__":
    main()
