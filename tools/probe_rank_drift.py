"""Probe (GPU): do near-equal kernels keep their order over minutes in one process?

Two fresh tunes of one problem in ``bench.tuning`` kept kernels 2–3 % apart (llama3-8b's GELU_AUX_BIAS at 1024
tokens, H200, 2026-11-29): the first tune of each run kept autotune's 128×128 pick, the second found a 64×256
kernel a few % faster. This plans each named problem once, takes autotune's pick as the incumbent and the
search's closest candidates (its screening and rescreen, as a search runs them), then times the incumbent
against each candidate in its own duel of ``--rounds`` shuffled rounds (settled first, L2 flushed before
each sample), on the GPU as it is, after each of ``--heats`` spells of ``--heat`` seconds of 8192³ bf16 GEMMs
at the power limit, and after ``--idle`` seconds idle. Each line is one duel's median ratio (candidate /
incumbent; below 1 the candidate is faster), with the GPU's SM clock, power and temperature before the duels.

    PYTHONPATH=. python -m tools.probe_rank_drift PROBLEMS.jsonl "llama3-8b.mlp_up GELU_AUX_BIAS forward bf16 T=1024"
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import time

import torch

from nvblaslt import _autotune, _search, _tune
from nvblaslt._timing import Timer
from nvblaslt.bench.tuning_problems import operands, planned
from tools.probe_pick_stability import _gpu_state


def _short(result) -> str:
    config = result.algorithm.config()
    return " ".join(f"{name}={config[name]}" for name in ("TILE_ID", "STAGES_ID", "CLUSTER_SHAPE_ID", "CUSTOM_OPTION",
                                                          "CTA_SWIZZLING", "SPLITK_NUM", "REDUCTION_SCHEME"))


def _ratio(samples: list[list[float]]) -> float:
    """The median of the paired ratios second / first, round by round."""
    return math.exp(statistics.median(math.log(b / a) for a, b in zip(*samples)))


def _contenders(spec: dict, candidates: int):
    """(plan, timer, incumbent, [first pick, candidates…]) for one problem, planned as ``bench.tuning`` plans it;
    the plan and timer stay open. Where autotune keeps the first pick, its line is the incumbent against itself:
    the duels' noise."""
    with _tune._heuristics_only():
        plan = planned(spec, operands(spec))
    first = plan.algorithm
    picked = _autotune.tune(plan, iterations=5, search=False, remember=False, stream=0).timings[0][0]
    timer = Timer(plan.device, plan.stream).__enter__()
    incumbent = _autotune._algorithm(plan, picked, 0, "autotune's pick " + _short(picked))
    _autotune.settle_on(timer, incumbent, 0.3)
    own = [r for r in plan._launch.algorithms if _search.config_key(r) != _search.config_key(picked)]
    pool = itertools.chain(own, _search.candidates(plan._launch, workspace_limit=plan._launch.workspace_limit,
                                                   incumbent=picked))
    screened, _, _ = _autotune._screen(plan, timer, incumbent, pool, 0, time.perf_counter() + 2.0)
    ranked = _autotune._rescreen(timer, incumbent, screened, plan, 0, time.perf_counter() + 1.0)
    same = _search.config_key(first) == _search.config_key(picked)
    others = [_autotune._algorithm(plan, first, 0, ("the first pick, autotune's pick itself " if same else
                                                    "the first pick ") + _short(first))]
    others += [_autotune._algorithm(plan, c, 0, _short(c)) for c, _ in ranked[:candidates]
               if _search.config_key(c) != _search.config_key(first)]
    return plan, timer, incumbent, others


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems", help="a problems file (bench.tuning writes one into its --out)")
    parser.add_argument("names", nargs="+", help="problem names, as the file has them")
    parser.add_argument("--candidates", type=int, default=7, help="the search's closest, after its rescreen")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--heat", type=float, default=90.0, help="seconds of GEMMs at the power limit per spell")
    parser.add_argument("--heats", type=int, default=2)
    parser.add_argument("--idle", type=float, default=30.0)
    options = parser.parse_args(argv)
    specs = {spec["name"]: spec for spec in map(json.loads, open(options.problems))}
    print(f"{torch.cuda.get_device_name()}; duels of {options.rounds} shuffled rounds, candidate / incumbent")
    setups = [(name, *_contenders(specs[name], options.candidates)) for name in options.names]

    def duels(when: str) -> None:
        print(f"== {when} (SM MHz, W, °C: {_gpu_state()})", flush=True)
        for name, _plan, timer, incumbent, others in setups:
            print(f"  {name}: incumbent {incumbent.name}")
            for other in others:
                _autotune.settle_on(timer, incumbent, 0.3)
                print(f"    {_ratio(_autotune._round_robin(timer, [incumbent, other], options.rounds)):.4f}  "
                      f"{other.name}", flush=True)

    duels("as found")
    square = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for spell in range(1, options.heats + 1):
        ends = time.perf_counter() + options.heat
        while time.perf_counter() < ends:
            for _ in range(20):
                square @ square
            torch.cuda.synchronize()
        duels(f"after {spell * options.heat:.0f} s of 8192³ bf16 GEMMs")
    time.sleep(options.idle)
    duels(f"after {options.idle:.0f} s idle")
    for _name, plan, timer, _incumbent, _others in setups:
        timer.__exit__(None, None, None)
        plan.free()


if __name__ == "__main__":
    main()
