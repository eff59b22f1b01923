"""Probe (GPU; cuBLASLt 13.4+ for the grouped part): does Python run slower in autograd's device thread?

The same pure-Python loop is timed inside a custom Function's backward, with the backward pass in
autograd's device thread and in the calling thread (``torch.autograd.set_multithreading_enabled``),
beside the same loop in the main thread. Then a Qwen3-shaped expert step (G=128, K=2048, N=768, 8192
tokens, bf16) of ``nvblaslt.torch.grouped_mm`` and of ``torch._grouped_mm`` is timed both ways, in
interleaved rounds. Why the eager Qwen3 step is host-bound (issue 24; docs/benchmarks.md, "the step
through backward()") turns on the answer: a loop slower in that thread means no Python backward escapes
it; an equal one points at the backward's own torch calls.

    NVBLASLT_LIBRARY=/tmp/lt/libcublasLt.so.13 python -m tools.probe_autograd_thread
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import torch

LOOP, STEPS, ROUNDS = 3000, 200, 7


def _loop_us() -> float:
    start, total = time.perf_counter(), 0
    for i in range(LOOP):
        total += i & 7
    return (time.perf_counter() - start) * 1e6


class _Busy(torch.autograd.Function):
    """An identity whose backward pass times the loop in whichever thread autograd runs it."""

    spent: list[float] = []

    @staticmethod
    def forward(ctx, x):
        return x * 1

    @staticmethod
    def backward(ctx, grad):
        _Busy.spent.append(_loop_us())
        return grad


def _python_in_backward() -> None:
    x = torch.randn(64, device="cuda", requires_grad=True)
    for _ in range(50):
        _Busy.apply(x).sum().backward()
    for threaded in (True, False, True, False):
        _Busy.spent.clear()
        walls = []
        with torch.autograd.set_multithreading_enabled(threaded):
            for _ in range(STEPS):
                start = time.perf_counter()
                _Busy.apply(x).sum().backward()
                walls.append((time.perf_counter() - start) * 1e6)
        main = statistics.median(_loop_us() for _ in range(STEPS))
        where = "autograd's thread" if threaded else "the calling thread"
        print(f"backward in {where:18s}: the loop takes {statistics.median(_Busy.spent):6.1f} µs there, "
              f"{main:6.1f} µs in the main thread; a step {statistics.median(walls):6.1f} µs")


def _expert_steps() -> None:
    from nvblaslt.torch import grouped_mm

    bf16 = torch.bfloat16
    x = torch.randn(8192, 2048, device="cuda", dtype=bf16, requires_grad=True)
    weight = torch.nn.Parameter(torch.randn(128, 768, 2048, device="cuda", dtype=bf16))
    grad = torch.randn(8192, 768, device="cuda", dtype=bf16)
    offs = (torch.arange(1, 129, device="cuda") * 64).to(torch.int32)
    ops = {"nvblaslt.torch.grouped_mm": lambda: grouped_mm(x, weight.transpose(1, 2), offs),
           "torch._grouped_mm": lambda: torch._grouped_mm(x, weight.transpose(1, 2), offs=offs)}
    found: dict[tuple[str, bool], list[float]] = {}
    for _ in range(ROUNDS):
        for name, op in ops.items():
            for threaded in (True, False):
                with torch.autograd.set_multithreading_enabled(threaded):
                    times = []
                    for step in range(13):
                        x.grad = weight.grad = None
                        start = time.perf_counter()
                        op().backward(grad)
                        if step >= 3:  # three warm-up steps
                            times.append((time.perf_counter() - start) * 1e6)
                        torch.cuda.synchronize()
                found.setdefault((name, threaded), []).append(statistics.median(times))
    for (name, threaded), values in found.items():
        where = "autograd's thread" if threaded else "the calling thread"
        print(f"host µs a step, {name:26s} backward in {where}: {statistics.median(values):6.0f}")


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["NVBLASLT_CACHE_DIR"] = scratch  # nothing tuned earlier is recalled
        print(torch.cuda.get_device_name())
        _python_in_backward()
        _expert_steps()


if __name__ == "__main__":
    main()
