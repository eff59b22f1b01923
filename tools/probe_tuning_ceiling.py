"""Probe (GPU): how much faster than the heuristics' first pick is the fastest kernel a search can reach?

Issue 35 asks the tuning database for a geometric mean of 1.05× the first pick over the LLM suite. The
tunes keep the first pick on about two problems in three, so this measures the ceiling any selection has
on the same pool the search draws from (``_search.candidates``, after the heuristic list), without the
tune's time budget and without its first-launch bias: each candidate runs once untimed (its module
loaded), then twice timed next to the first pick (L2 flushed); the eight fastest go to an interleaved
duel against the first pick behind five 4096³ GEMMs on random values (the SMs at their power limit, as in a
training step), with the split form beside them where the epilog has one. The duel's fastest is then timed
against the first pick alone in a fresh duel (the minimum over finalists reads low by itself), behind GEMMs on
random values and behind the same GEMMs on ones (less power drawn: the clock runs higher). A problem's
ceiling is min(1, that ratio): the first pick is always available.

Each problem's screening stops at ``--screen-seconds``; a row says how much of its pool that reached.

``--settle 0.3`` times a settled GPU, as the search does now (the second pass's 1.032× was taken without).

    PYTHONPATH=. python -m tools.probe_tuning_ceiling PROBLEMS.jsonl [--screen-seconds 3] [--rounds 15] [--settle 0.3]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import statistics
import time

import torch

from nvblaslt import _search, _timing, _tuning_cache
from nvblaslt._errors import NvblasltError
from nvblaslt._timing import settle
from nvblaslt.bench.timing import event_rounds
from nvblaslt.bench.tuning_problems import flush_buffer, operands, planned

FINALISTS = 8


def _name(result) -> str:
    """The kernel's id, tile and stages, with its split-K count, custom option and swizzle."""
    config = result.algorithm.config()
    return (f"{_tuning_cache.describe_algorithm(result)} split {config.get('SPLITK_NUM')} "
            f"option {config.get('CUSTOM_OPTION')} swizzle {config.get('CTA_SWIZZLING')}")


def _screen(first, seconds: float) -> tuple[list[tuple[float, bytes]], int, bool]:
    """[(candidate ms / first pick ms, its algorithm's bytes)] fastest first; how many were timed; whether
    the pool ran dry before ``seconds``."""
    launch = first._launch
    stream = torch.cuda.current_stream().cuda_stream
    incumbent = launch.algorithm
    pool = _search.candidates(launch, workspace_limit=launch.workspace_limit, incumbent=incumbent)
    deadline = time.perf_counter() + seconds
    measured: list[tuple[float, bytes]] = []
    exhausted = False
    with _timing.Timer(first.device, stream) as timer:
        run = functools.partial(first._trial_run, stream)
        for candidate in itertools.chain(launch.algorithms[1:], pool):  # the pool enumerated lazily
            if time.perf_counter() >= deadline:
                break
            launch.ensure_workspace(candidate.workspace_size, stream)
            try:
                launch.select(candidate)
                run()  # its module loaded, untimed
                ms = min(timer(run) for _ in range(2))
                launch.select(incumbent)
                reference = min(timer(run) for _ in range(2))
            except NvblasltError:
                launch.select(incumbent)
                continue
            measured.append((ms / reference, candidate.as_bytes()))
        else:
            exhausted = True
        launch.select(incumbent)
    return sorted(measured, key=lambda pair: pair[0]), len(measured), exhausted


def _contexts(flush):
    """What runs ahead of each duel sample: five 4096³ bf16 GEMMs on random values or on ones, the L2 flush."""
    def ahead_of(matrix):
        def before() -> None:
            for _ in range(5):
                torch.mm(matrix, matrix)
            flush.zero_()
        return before
    random_values = torch.rand(4096, 4096, device="cuda", dtype=torch.bfloat16) * 2 - 1
    ones = torch.ones(4096, 4096, device="cuda", dtype=torch.bfloat16)
    return {"randn ahead": ahead_of(random_values), "ones ahead": ahead_of(ones)}


def _ratios(cases, rounds: int, before, settle_s: float = 0.0) -> list[float]:
    """Each case after the first: the median over rounds of its time / the first case's, the first case run
    back to back for ``settle_s`` before the rounds."""
    samples = event_rounds(torch, cases, rounds, before=before, settle_s=settle_s)
    return [statistics.median(p / f for p, f in zip(s, samples[0])) for s in samples[1:]]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems")
    parser.add_argument("--screen-seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--only", help="comma-separated substrings of the names of the problems to keep")
    parser.add_argument("--verbose", action="store_true", help="name the first pick's and the best's kernels")
    parser.add_argument("--settle", type=float, default=0.0,
                        help="seconds of the first pick back to back before the screening and each duel (as "
                             "nvblaslt tune does since 2026-11-29's third pass: 0.3); 0, as the second pass ran")
    options = parser.parse_args(argv)
    flush = flush_buffer()
    contexts = _contexts(flush)
    specs = [json.loads(line) for line in open(options.problems) if line.strip()]
    wanted = options.only.split(",") if options.only else None
    specs = [s for s in specs if s.get("kind") == "matmul" and (not wanted or any(w in s["name"] for w in wanted))]
    print(f"{torch.cuda.get_device_name()}; the pool's best / first pick (below 1: faster): chosen in a duel of "
          f"{options.rounds} rounds behind GEMMs on random values, then timed against the first pick alone in a "
          f"fresh duel of {options.rounds} rounds in each context; screening {options.screen_seconds} s a problem")
    print(f"  {'problem':66s} {'timed':>6s} {'pool':>5s} {'screen':>7s} {'chosen':>7s} {'best':>6s}"
          + "".join(f" {c:>11s}" for c in contexts))
    ceilings: dict[str, list[float]] = {c: [] for c in contexts}
    for spec in specs:
        ops = operands(spec)
        first = planned(spec, ops)
        settle(first.execute, torch.cuda.synchronize, options.settle)
        screened, timed, exhausted = _screen(first, options.screen_seconds)
        finalists = []
        for _, algo in screened[:FINALISTS]:
            try:
                finalists.append(("kernel", planned(spec, ops, algo)))
            except NvblasltError:
                continue
        if first._splittable():  # the two-call form, its first call autotuned over the heuristics' list
            split = planned(spec, ops)
            split._split_form = split._make_split_form(iterations=3)
            if split._split_form is not None:
                finalists.append(("split", split))
            else:
                split.free()
        cases = [("first", first.execute)] + [(f"{kind} {i}", p.execute) for i, (kind, p) in enumerate(finalists)]
        chosen = _ratios(cases, options.rounds, contexts["randn ahead"], options.settle)
        best = min(range(len(chosen)), key=chosen.__getitem__) if chosen else None
        row = {}
        for context, before in contexts.items():
            confirmed = (_ratios([cases[0], cases[1 + best]], options.rounds, before, options.settle)[0]
                         if best is not None else 1.0)
            row[context] = min(1.0, confirmed)
            ceilings[context].append(row[context])
        screen = f"{screened[0][0]:.3f}" if screened else "-"
        kind = finalists[best][0] if best is not None else "-"
        print(f"  {spec['name'][:66]:66s} {timed:6d} {'all' if exhausted else 'part':>5s} {screen:>7s} "
              f"{min(chosen, default=1.0):7.3f} {kind:>6s}" + "".join(f" {row[c]:11.3f}" for c in contexts), flush=True)
        if options.verbose and best is not None:
            print(f"    first pick {_name(first.algorithm)}; best "
                  f"{_name(finalists[best][1].algorithm)}", flush=True)
        for plan in (first, *(p for _, p in finalists)):
            plan.free()
    for context, values in ceilings.items():
        if values:
            speed = math.exp(-statistics.fmean(math.log(v) for v in values))
            print(f"ceiling, {context}: geometric mean {speed:.3f}× the first pick's speed over {len(values)} "
                  f"problems; {sum(v < 0.99 for v in values)} with a kernel or form ≥ 1 % faster")


if __name__ == "__main__":
    main()
