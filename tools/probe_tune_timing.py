"""Probe (GPU): does the way a kernel is timed change which of two kernels is faster?

``nvblaslt tune`` keeps a pick when it beats the heuristics' first pick in ``_autotune``'s duel: one call per
sample, the L2 flushed before it (``_timing.Timer``; when this probe was written no other work was queued
ahead, and the GPU idled between samples while the host waited; now 8 flushes are). ``bench.tuning`` re-times the pair in its own duel: each sample behind a spin kernel
(the GPU busy, as in a training step), the L2 flushed, two plans. On an H200 both runs of 2026-11-28 kept
qwen3-8b's BGRADB pick at 0.972–0.979× the first pick's time and both bench duels read it 1.011–1.012×
slower. For each tuned problem of a database, this times the first pick and the database's pick three ways
(the GPU idle while the host issues each sample; a spin queued ahead; ``_timing.Timer`` as the tune uses it
now), and two more that tell the causes apart: ``gated``, the stream held on a host flag
(``cuStreamWaitValue32``) while the sample is queued and released after (no host gap inside the events, the
GPU idle before), and ``gemm ahead``, a ~1 ms GEMM queued ahead (the SMs busy and drawing power, as the
layer before in a training step). Later modes (``MODES``) tell the bench's own queues apart from these: the
data the GEMMs ahead run on (random or constant), and the problem's own kernel ahead. It prints pick / first
for each, beside the ratio the tune recorded, and when each problem's row started (to read beside a power log
such as ``nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv -lms 100``).

    PYTHONPATH=. python -m tools.probe_tune_timing PROBLEMS.jsonl DATABASE.jsonl [--rounds 30]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics

import torch

import random
import time

from nvblaslt import _timing, _tuning_db
from nvblaslt._tuning_cache import key_of
from nvblaslt.bench.timing import event_rounds
from nvblaslt.bench.tuning_problems import flush_buffer, gpu_rounds, operands, planned

SPIN_CYCLES = 2_000_000  # about 1 ms of queued GPU work ahead of a spin sample
# What runs ahead of each sample (every one flushes the L2 just before it, "bench spin" before its sleep):
MODES = {
    "idle": "nothing: the GPU idles while the host issues the sample",
    "spin>flush": "a ~1 ms sleep kernel, then the flush",
    "bench spin": "bench.tuning --queue spin: the flush, then a sleep kernel",
    "Timer": "_timing.Timer, as the tune's duels time",
    "gated": "the stream held on a host flag while the sample is queued (no host gap inside the events)",
    "randn ahead": "five 4096³ bf16 GEMMs on normal random values (the SMs busy, drawing power)",
    "ones ahead": "the same five GEMMs on ones (constant data: the SMs busy, drawing less power)",
    "bench gemm": "bench.tuning --queue gemm, as it times by default",
    "own ahead": "the problem's own first pick, about 1 ms of it and at most 16 calls (the layer before)",
}


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
    timer = _timing.Timer(0, torch.cuda.current_stream().cuda_stream)
    gate = Gate(torch.cuda.current_stream().cuda_stream)
    big = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)  # 4096³ bf16: about 0.2 ms; five of them
    ones = torch.ones(4096, 4096, device="cuda", dtype=torch.bfloat16)  # the same GEMM on constant data
    for _ in range(2):
        torch.mm(big, big)
    modes = list(MODES)
    print(f"  {'problem':66s} " + " ".join(f"{m:>{max(7, len(m))}s}" for m in modes) + "  tune's own  (unix time)")
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
        cases = [("first", first.execute), ("pick", pick.execute)]
        started = time.time()

        def ahead_of(matrix):
            def before():
                for _ in range(5):  # about 1 ms
                    torch.mm(matrix, matrix)
                flush.zero_()
            return before

        def own_ahead():  # the first pick itself, about 1 ms of it: the layer before, at this GEMM's power
            for _ in range(own_calls):
                first.execute()
            flush.zero_()

        def spin_then_flush():
            torch.cuda._sleep(SPIN_CYCLES)
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

        one_ms = event_rounds(torch, cases[:1], 3, before=flush.zero_)[0]
        own_calls = max(1, min(16, round(1.0 / max(statistics.median(one_ms), 1e-3))))
        rounds = options.rounds
        timings = {
            "idle": lambda: event_rounds(torch, cases, rounds, before=flush.zero_),
            "spin>flush": lambda: event_rounds(torch, cases, rounds, before=spin_then_flush),
            "bench spin": lambda: gpu_rounds(cases, rounds, 1, flush, "spin"),
            "Timer": lambda: _timing.shuffled_rounds(cases, rounds, lambda case: timer(case[1]),
                                                     shuffler=random.Random(0)),
            "gated": lambda: _timing.shuffled_rounds(cases, rounds, gated, shuffler=random.Random(1)),
            "randn ahead": lambda: event_rounds(torch, cases, rounds, before=ahead_of(big)),
            "ones ahead": lambda: event_rounds(torch, cases, rounds, before=ahead_of(ones)),
            "bench gemm": lambda: gpu_rounds(cases, rounds, 1, flush, "gemm"),
            "own ahead": lambda: event_rounds(torch, cases, rounds, before=own_ahead),
        }
        ratios = {}
        for mode in modes:
            samples = timings[mode]()
            ratios[mode] = _ratio(samples[1], samples[0])
        print(f"  {spec['name'][:66]:66s} " + " ".join(f"{ratios[m]:{max(7, len(m))}.3f}" for m in modes)
              + f"  {entry.get('ratio', float('nan')):10.3f}  ({started:.1f})", flush=True)
        first.free()
        pick.free()


if __name__ == "__main__":
    main()
