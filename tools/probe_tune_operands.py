"""Probe (GPU): does a tune's pick read faster on the tune's own operands than elsewhere?

Tunes each named problem ``--tunes`` times in this process (``nvblaslt tune``'s own path, on its arrays), then
times the first pick and every distinct kernel kept, with ``_timing.Timer`` in 25 shuffled rounds after 0.3 s
of the first pick back to back, four ways:
  A  a plan per kernel from its bytes, on torch's random operands (as the bench and a recalling process run it)
  B  one plan, each kernel selected on it with the largest workspace any needs (as the search runs them)
  C  as B, on arrays made as ``nvblaslt tune`` makes them (``_tune_arrays``: its values, its allocations)
  E  the bench's context: A's plans, GEMMs on random values queued ahead, the L2 flushed, a burst of calls
A gap between B and C is the operands' doing; between A and E, the context's.

    PYTHONPATH=. python -m tools.probe_tune_operands PROBLEMS.jsonl "NAME|NAME" [--tunes 3]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics

ROUNDS = 25


def _rounds(timer, runs) -> list[list[float]]:
    from nvblaslt import _timing

    for run, prepare in runs:
        if prepare:
            prepare()
        run()
    timer.synchronize()
    first_run, first_prepare = runs[0]
    _timing.settle(lambda: (first_prepare and first_prepare(), first_run()), timer.synchronize, 0.3)
    return _timing.shuffled_rounds(runs, ROUNDS, lambda pair: timer(pair[0], pair[1]), random.Random(0))


def _config(result) -> dict:
    return (result.algorithm if hasattr(result, "algorithm") else result).config()


def _ratios(samples) -> list[float]:
    return [statistics.median(x / y for x, y in zip(s, samples[0])) for s in samples[1:]]


def _tune_plan(spec: dict, patterns: dict):
    """A plan on arrays made as ``nvblaslt tune`` makes them, and the arrays (kept alive with it)."""
    from nvblaslt import Matmul
    from nvblaslt._tune_arrays import device_array

    arrays = {name: device_array(spec[name], 0, 0, patterns) for name in ("a", "b")}
    inputs = {key: device_array(value, 0, 0, patterns) for key, value in spec.get("inputs", {}).items()}
    fp8 = {name for name in ("a", "b") if spec[name]["dtype"].startswith("float8")}
    plan = Matmul(arrays["a"], arrays["b"], options=spec.get("options"),
                  quantization_scales={name: 1.0 for name in fp8} or None, stream=0)
    plan.plan(epilog=spec.get("epilog", "DEFAULT"), epilog_inputs=inputs or None)
    return plan, (arrays, inputs)


def _name(result) -> str:
    config = _config(result)
    return (f"tile{config.get('TILE_ID')} cl{config.get('CLUSTER_SHAPE_ID')} opt{config.get('CUSTOM_OPTION')} "
            f"ws{result.workspace_size}")


def probe(spec: dict, tunes: int, flush) -> None:
    import torch

    from nvblaslt import _tune
    from nvblaslt._timing import Timer
    from nvblaslt.bench.tuning_problems import burst_calls, gpu_rounds, operands, planned

    patterns: dict = {}
    picks, kinds = [], []
    for repeat in range(tunes):
        with _tune._heuristics_only():
            found = _tune._tune_matmul(spec, 2.5, 0, patterns, lambda key: False)
        entry = found[1]
        kinds.append(f"{entry['kind']} {entry.get('ratio')}")
        print(f"  tune {repeat}: {entry['kind']} {entry.get('ratio')} {entry.get('config')}", flush=True)
        if entry["kind"] == "tuned" and entry["algo"] not in picks:
            picks.append(entry["algo"])
    print(f"\n{spec['name']}: tunes say {kinds}", flush=True)
    if not picks:
        return
    ops = operands(spec)
    with _tune._heuristics_only():
        first = planned(spec, ops)
        per_pick = [planned(spec, ops, bytes.fromhex(algo)) for algo in picks]
    results = [first.algorithm] + [plan.algorithm for plan in per_pick]
    largest = max((result.workspace_size or 0) for result in results)
    stream = torch.cuda.current_stream().cuda_stream

    def selecting(launch, result):
        return lambda: launch.select(result)
    with Timer(0, stream) as timer:
        a = _rounds(timer, [(plan.execute, None) for plan in [first, *per_pick]])
        first._launch.ensure_workspace(largest, stream)
        b = _rounds(timer, [(lambda: first._trial_run(stream), selecting(first._launch, r)) for r in results])
        first._launch.select(results[0])
    calls = burst_calls(first.execute, flush)
    e = gpu_rounds([(str(i), plan.execute) for i, plan in enumerate([first, *per_pick])], 21, calls, flush, "gemm",
                   0.3)
    with _tune._heuristics_only():
        tune_plan, kept_alive = _tune_plan(spec, patterns)
    with Timer(0, 0) as timer:
        tune_plan._launch.ensure_workspace(largest, 0)
        c = _rounds(timer, [(lambda: tune_plan._trial_run(0), selecting(tune_plan._launch, r)) for r in results])
    print(f"  first pick: {_name(results[0])}; ms A {statistics.median(a[0]):.4f} B {statistics.median(b[0]):.4f} "
          f"C {statistics.median(c[0]):.4f}")
    for name, ra, rb, rc, re in zip((_name(r) for r in results[1:]), _ratios(a), _ratios(b), _ratios(c), _ratios(e)):
        print(f"  {name:40s} × first: A plans {ra:.4f} | B select {rb:.4f} | C select, tune operands {rc:.4f} | "
              f"E bench ctx {re:.4f}")
    for plan in [first, *per_pick, tune_plan]:
        plan.free()
    del kept_alive


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems", help="a problems file (bench.tuning writes one into its --out)")
    parser.add_argument("names", help="the problems' names, separated by |")
    parser.add_argument("--tunes", type=int, default=3)
    options = parser.parse_args(argv)
    wanted = options.names.split("|")
    from nvblaslt.bench.tuning_problems import flush_buffer

    flush = flush_buffer()
    for spec in (json.loads(line) for line in open(options.problems) if line.strip()):
        if spec["name"] in wanted:
            probe(spec, options.tunes, flush)


if __name__ == "__main__":
    main()
