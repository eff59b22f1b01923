"""Probe (GPU): is a tuned pick's speed against the first pick the same from one duel to the next?

On an H200 (2026-11-29) qwen3-8b's GELU_AUX_BIAS GEMM at 8192 tokens (1.1 ms, at the power limit) was the
worst problem of five of eight ``bench.tuning`` runs: a tune read its pick 0.91–0.94× the first pick and
the bench's duel, minutes later and behind the same queue, 1.05–1.07×. This runs the same pair in many
short duels back to back, each behind GEMMs on random values, and prints each duel's ratio beside the GPU's
clock, power and temperature after it, so that a ratio that moves can be read against what moved with it.
``--fresh`` allocates the operands again for each duel (a kernel whose speed follows its operands'
addresses would move with them).

    PYTHONPATH=. python -m tools.probe_pick_stability PROBLEMS.jsonl NAME DATABASE.jsonl [--duels 12]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess

import torch

from nvblaslt import _tuning_db
from nvblaslt._tuning_cache import key_of
from nvblaslt.bench.timing import event_rounds
from nvblaslt.bench.tuning_problems import flush_buffer, operands, planned


def _gpu_state() -> str:
    """SM clock (MHz), power (W) and temperature (°C) now, as nvidia-smi reads them."""
    try:
        found = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                                "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "-"
    return found.stdout.strip().splitlines()[0] if found.stdout.strip() else "-"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems")
    parser.add_argument("name", help="the problem's name, exactly")
    parser.add_argument("database", help="a database holding a tuned entry for it")
    parser.add_argument("--duels", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--fresh", action="store_true", help="new operands for every duel")
    options = parser.parse_args(argv)
    spec = next(json.loads(line) for line in open(options.problems)
                if line.strip() and json.loads(line)["name"] == options.name)
    database = _tuning_db.read(options.database)
    flush = flush_buffer()
    ahead = torch.rand(4096, 4096, device="cuda", dtype=torch.bfloat16) * 2 - 1

    def before() -> None:
        for _ in range(5):
            torch.mm(ahead, ahead)
        flush.zero_()

    ops = operands(spec)
    first = planned(spec, ops)
    entry = database.entries.get(key_of(first._launch))
    if entry is None or entry.get("kind") != "tuned":
        raise SystemExit(f"{options.database} holds no tuned entry for {options.name}")
    algo = bytes.fromhex(entry["algo"])
    pick = planned(spec, ops, algo)
    print(f"{torch.cuda.get_device_name()}; {options.name}: the database's pick / the first pick, median of "
          f"{options.rounds} interleaved rounds per duel, behind five 4096³ GEMMs on random values "
          f"(the tune recorded {entry.get('ratio', float('nan')):.3f})")
    print(f"  {'duel':>4s} {'ratio':>6s} {'first ms':>9s} {'pick ms':>8s}  clock MHz, power W, temperature °C after")
    ratios = []
    for duel in range(options.duels):
        if options.fresh and duel:
            first.free()
            pick.free()
            ops = operands(spec)
            first, pick = planned(spec, ops), planned(spec, ops, algo)
        samples = event_rounds(torch, [("first", first.execute), ("pick", pick.execute)], options.rounds,
                               seed=duel, before=before)
        ratio = statistics.median(p / f for p, f in zip(samples[1], samples[0]))
        ratios.append(ratio)
        print(f"  {duel:4d} {ratio:6.3f} {statistics.median(samples[0]):9.4f} {statistics.median(samples[1]):8.4f}"
              f"  {_gpu_state()}", flush=True)
    print(f"ratios: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}–{max(ratios):.3f} over "
          f"{len(ratios)} duels")
    first.free()
    pick.free()


if __name__ == "__main__":
    main()
