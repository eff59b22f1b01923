"""Probe (GPU): do fresh tunes of one problem keep the same kernel, and how do their picks compare elsewhere?

Two ``bench.tuning`` tunes of the quick suite disagreed on 4–7 of 30 problems on an H200 (2026-11-29). This
tunes each named problem ``--tunes`` times, each in a fresh process as ``nvblaslt tune`` runs (its search's
log kept under ``$OUT/tune-repeats`` or ``/tmp/tune-repeats``), prints each tune's entry, then times every
distinct kernel the tunes kept against the first pick in 21 interleaved rounds in two contexts, settled
(0.3 s of the first pick back to back): the bench's (GEMMs on random values queued ahead of each sample, the
L2 flushed, a burst of calls from 0.05 ms up) and one like the tune's own (the L2 flushed, one call), on
torch's random operands.

    PYTHONPATH=. python -m tools.probe_tune_repeats PROBLEMS.jsonl "NAME|NAME" [--tunes 6] [--budget 2.5]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

TUNE = ("import logging,sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='%(message)s');"
        "import nvblaslt; nvblaslt.tune(sys.argv[1], sys.argv[2], budget_s=float(sys.argv[3]), progress=print)")


def _config_name(config: dict, times: int) -> str:
    return (f"x{times} tile{config.get('TILE_ID')} st{config.get('STAGES_ID')} cl{config.get('CLUSTER_SHAPE_ID')} "
            f"opt{config.get('CUSTOM_OPTION')} sk{config.get('SPLITK_NUM')} id{config.get('ID')}")


def _tune_repeatedly(spec: dict, index: int, tunes: int, budget: float, out: Path) -> list[tuple]:
    """(algo hex or None, kind, ratio, config) of each fresh-process tune of ``spec``."""
    problem = out / f"p{index}.jsonl"
    problem.write_text(json.dumps(spec) + "\n")
    picks = []
    for repeat in range(tunes):
        database = out / f"p{index}-db{repeat}.jsonl"
        log = subprocess.run([sys.executable, "-c", TUNE, str(problem), str(database), str(budget)],
                             capture_output=True, text=True)
        (out / f"p{index}-log{repeat}.txt").write_text(log.stdout + log.stderr)
        entries = [json.loads(line) for line in open(database) if line.strip() and '"kind"' in line]
        entry = [e for e in entries if e.get("kind") in ("tuned", "default") and not e.get("of_split_form")][0]
        picks.append((entry.get("algo"), entry["kind"], entry.get("ratio"), entry.get("config")))
        print(f"{spec['name']} tune {repeat}: {entry['kind']} {entry.get('ratio')} {entry.get('config')}", flush=True)
    return picks


def _time_picks(spec: dict, picks: list[tuple], flush) -> None:
    import torch

    from nvblaslt.bench.timing import event_rounds
    from nvblaslt.bench.tuning_problems import burst_calls, gpu_rounds, operands, planned

    ops = operands(spec)
    first = planned(spec, ops)
    distinct = collections.Counter(algo for algo, *_ in picks)
    cases, names, plans = [("first", first.execute)], ["first"], [first]
    for algo, times in distinct.items():
        if algo is None:
            continue
        plan = planned(spec, ops, bytes.fromhex(algo))
        plans.append(plan)
        names.append(_config_name(next(c for a, _, _, c in picks if a == algo), times))
        cases.append((names[-1], plan.execute))
    calls = burst_calls(first.execute, flush)
    bench = gpu_rounds(cases, 21, calls, flush, "gemm", 0.3)
    tune_like = event_rounds(torch, cases, 21, 1, before=flush.zero_, settle_s=0.3)
    print(f"\n{spec['name']}: default x{distinct.get(None, 0)}; × first pick, median [bench ctx | tune-like ctx]")
    for j, name in enumerate(names[1:], 1):
        in_bench = statistics.median(x / y for x, y in zip(bench[j], bench[0]))
        in_tune = statistics.median(x / y for x, y in zip(tune_like[j], tune_like[0]))
        print(f"  {name:60s} {in_bench:.4f} | {in_tune:.4f}")
    for plan in plans:
        plan.free()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems", help="a problems file (bench.tuning writes one into its --out)")
    parser.add_argument("names", help="the problems' names, separated by |")
    parser.add_argument("--tunes", type=int, default=6)
    parser.add_argument("--budget", type=float, default=2.5, help="each tune's budget (bench.tuning --quick: 2.5)")
    options = parser.parse_args(argv)
    wanted = options.names.split("|")
    specs = [s for s in (json.loads(line) for line in open(options.problems) if line.strip()) if s["name"] in wanted]
    out = Path(os.environ.get("OUT", "/tmp")) / "tune-repeats"
    out.mkdir(parents=True, exist_ok=True)
    picks = {spec["name"]: _tune_repeatedly(spec, i, options.tunes, options.budget, out) for i, spec in enumerate(specs)}
    from nvblaslt.bench.tuning_problems import flush_buffer

    flush = flush_buffer()
    for spec in specs:
        _time_picks(spec, picks[spec["name"]], flush)


if __name__ == "__main__":
    main()
