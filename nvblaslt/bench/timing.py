"""The bench's clocks: CUDA events around bursts, the wall clock to a synchronize after each step, host
time over bursts, GPU time queued behind a sleep. Every set of rounds goes through ``nvblaslt._timing.shuffled_rounds``, the package's one
way of timing contestants against each other (a fresh order each round); warm-up and what is
measured stay here."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence

from nvblaslt._timing import settle, shuffled_rounds


def _warm_up(torch, cases: Sequence[tuple[str, Callable]]) -> None:
    """Two calls of each case (plans made, caches filled), then the device drained."""
    for _, fn in cases:
        fn()
        fn()
    torch.cuda.synchronize()


def event_rounds(torch, cases: Sequence[tuple[str, Callable]], rounds: int, calls: int = 1,
                 seed: int = 0, before: Callable[[], None] | None = None,
                 settle_s: float = 0.0) -> list[list[float]]:
    """Per-call ms of each ``(name, fn)`` case: CUDA events around a burst of ``calls`` calls, every
    case once per round in a fresh order (seeded), after two warm-up calls each. ``before()`` runs ahead
    of each sample's first event (an L2 flush, a spin that hides the host). With ``settle_s`` the first
    case runs back to back that long before the first round (``nvblaslt._timing.settle``: the GPU in the
    power state that work keeps it in)."""
    _warm_up(torch, cases)
    if settle_s > 0:
        settle(cases[0][1], torch.cuda.synchronize, settle_s)

    def measure(case: tuple[str, Callable]) -> float:
        fn = case[1]
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if before is not None:
            before()
        start.record()
        for _ in range(calls):
            fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / calls
    return shuffled_rounds(cases, rounds, measure, shuffler=random.Random(seed))


def synchronize() -> None:
    from cuda.bindings import runtime as cudart

    cudart.cudaDeviceSynchronize()


def host_burst(fn: Callable, calls: int) -> float:
    """Microseconds per call over a burst (the device drained before and after)."""
    synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def host_rounds(cases: dict[str, Callable], rounds: int, calls: int, warmup: int, seed: int) -> dict[str, list[float]]:
    """µs per call of each named case over bursts of ``calls``, every case once per round in a fresh
    order (seeded), after ``warmup`` calls each."""
    for fn in cases.values():
        for _ in range(warmup):
            fn()
    names = list(cases)
    samples = shuffled_rounds(names, rounds, lambda name: host_burst(cases[name], calls), shuffler=random.Random(seed))
    return dict(zip(names, samples))


def queued_gpu_us(torch, launch: Callable, calls: int) -> float | None:
    """GPU µs per launch with no host time in it: the launches are queued behind a sleep kernel long
    enough that the GPU reaches them only once all are queued. None without torch's sleep kernel."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return None
    values = []
    for _ in range(5):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        sleep(int(4e7))  # tens of ms at any clock: longer than queueing the launches takes
        start.record()
        for _ in range(calls):
            launch()
        stop.record()
        stop.synchronize()
        values.append(start.elapsed_time(stop) / calls * 1000)
    return statistics.median(values)


def wall_rounds(torch, cases: Sequence[tuple[str, Callable]], rounds: int, calls: int = 1,
                seed: int = 0) -> list[list[float]]:
    """``event_rounds``' contract, timed as a loop that waits for each step sees it: the wall clock from
    a drained device over ``calls`` calls, each followed by ``torch.cuda.synchronize()``, per call (the
    host's time to issue each call is paid in full)."""
    _warm_up(torch, cases)

    def measure(case: tuple[str, Callable]) -> float:
        fn = case[1]
        torch.cuda.synchronize()
        begin = time.perf_counter()
        for _ in range(calls):
            fn()
            torch.cuda.synchronize()
        return (time.perf_counter() - begin) * 1e3 / calls
    return shuffled_rounds(cases, rounds, measure, shuffler=random.Random(seed))


SPIN_CYCLES = 4_000_000  # ~2 ms of GPU clock queued before each timed step: the host's head start

# How a training step is timed. "sync": the wall clock to a synchronize after the step, as a loop that logs
# loss.item() every step sees it: the host's time to issue the step is paid. "spin": CUDA events around the
# step queued behind a short spin kernel, as a loop that never waits sees it: GPU time, the host's time hidden
# (host stalls inside the step still show). Every bench defaults to "sync" and labels what it printed.
TIMINGS = {"sync": "wall clock to a synchronize after each step (host time paid)",
           "spin": "GPU events behind a 2 ms spin (GPU time; the host's time to issue the step hidden)"}


def timing_modes(choice: str) -> tuple[str, ...]:
    """The modes a bench's ``--timing`` asks for: one of ``TIMINGS``, or "both" (sync first)."""
    return tuple(TIMINGS) if choice == "both" else (choice,)


def add_timing_argument(parser, default: str = "sync", both: bool = True) -> None:
    """``--timing {sync,spin[,both]}`` on a bench's parser."""
    parser.add_argument("--timing", choices=[*TIMINGS, *(["both"] if both else [])], default=default,
                        help="sync: " + TIMINGS["sync"] + "; spin: " + TIMINGS["spin"]
                             + ("; both: each, in rounds of their own" if both else "") + f" (default {default})")


def step_rounds(torch, cases: Sequence[tuple[str, Callable]], rounds: int, cuda: bool,
                timing: str = "sync") -> tuple[list[float], list[float]]:
    """(median ms, median host ms) of each (name, run) training-step case, every case once per round in
    a fresh order (``shuffled_rounds``), timed on CUDA as ``timing`` (a key of ``TIMINGS``) says. Host ms
    is the host's time to issue the step (on the CPU, the wall clock, where all are the same)."""
    if timing not in TIMINGS:
        raise ValueError(f"timing: expected one of {sorted(TIMINGS)}, got {timing!r}")
    host: list[list[float]] = [[] for _ in cases]

    def measure(index: int) -> float:
        run = cases[index][1]
        if cuda and timing == "sync":
            torch.cuda.synchronize()  # nothing of the previous step left
            begin = time.perf_counter()
            run()
            host[index].append((time.perf_counter() - begin) * 1e3)
            torch.cuda.synchronize()
            return (time.perf_counter() - begin) * 1e3
        if not cuda:
            begin = time.perf_counter()
            run()
            host[index].append((time.perf_counter() - begin) * 1e3)
            return host[index][-1]
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SPIN_CYCLES)
        start.record()
        begin = time.perf_counter()
        run()
        host[index].append((time.perf_counter() - begin) * 1e3)
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop)
    samples = shuffled_rounds(range(len(cases)), rounds, measure)
    return [statistics.median(s) for s in samples], [statistics.median(h) for h in host]
