"""Probe (GPU): is a tuned pick's speed against the first pick the same from one duel to the next?

On an H200 (2026-11-29) qwen3-8b's GELU_AUX_BIAS GEMM at 8192 tokens (1.1 ms, at the power limit) was the
worst problem of five of eight ``bench.tuning`` runs: a tune read its pick 0.91–0.94× the first pick and
the bench's duel, minutes later and behind the same queue, 1.05–1.07×. This runs the same pair in many
short duels back to back, each behind GEMMs on random values, and prints each duel's ratio beside the GPU's
clock, power and temperature after it, so that a ratio that moves can be read against what moved with it.
``--fresh`` allocates the operands again for each duel (a kernel whose speed follows its operands'
addresses would move with them). ``--between settle,idle`` runs the GPU at its power limit, or leaves it
idle, for a few seconds before alternate duels. ``--ahead flush`` leaves out the GEMMs (a tune's duel runs so).

    PYTHONPATH=. python -m tools.probe_pick_stability PROBLEMS.jsonl NAME DATABASE.jsonl [--duels 12]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

import torch

from nvblaslt import _tuning_db
from nvblaslt._timing import settle
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


def _fill_as_tune(array) -> None:
    """``array``'s memory filled as ``nvblaslt tune`` fills its own arrays (``_tune_arrays``)."""
    from nvblaslt import _dtypes
    from nvblaslt._tune_arrays import pattern

    block = torch.frombuffer(bytearray(pattern(_dtypes.BY_NAME[str(array.dtype).removeprefix("torch.")])),
                             dtype=torch.uint8).cuda()
    memory = torch.empty(0, dtype=torch.uint8, device="cuda").set_(array.untyped_storage())
    for offset in range(0, memory.numel(), block.numel()):
        part = memory[offset:offset + block.numel()]
        part.copy_(block[:part.numel()])


def _before_duel(state: str, seconds: float, matrix, own) -> None:
    """The GPU at its power limit (``settle``: GEMMs on random values), running the first pick back to back
    (``own``, as the search settles) or idle (``idle``) for ``seconds`` before a duel."""
    torch.cuda.synchronize()
    if state == "own":
        settle(own, torch.cuda.synchronize, seconds)
    elif state == "idle":
        time.sleep(seconds)
    elif state == "settle":
        product = torch.empty_like(matrix)
        settle(lambda: torch.mm(matrix, matrix, out=product), torch.cuda.synchronize, seconds)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems")
    parser.add_argument("name", help="the problem's name, exactly")
    parser.add_argument("database", help="a database holding a tuned entry for it")
    parser.add_argument("--duels", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--fresh", action="store_true", help="new operands for every duel")
    parser.add_argument("--operands", choices=("random", "tune"), default="random",
                        help="random: the bench's (uniform, every element drawn); tune: the values nvblaslt tune "
                             "times on (one block of random values repeated over each array)")
    parser.add_argument("--ahead", choices=("gemm", "flush"), default="gemm",
                        help="gemm: five GEMMs on random values and the L2 flush ahead of each sample (the bench's "
                             "queue); flush: the flush alone (the GPU below its power limit, as in a tune's duel)")
    parser.add_argument("--between", default="none",
                        help="what runs before each duel, alternating where comma-separated: none; settle (GEMMs on "
                             "random values back to back for --seconds: the GPU at its power limit, as in a long "
                             "training run); own (the first pick back to back); idle (the GPU idle)")
    parser.add_argument("--seconds", default="2", help="seconds before each duel, comma-separated: one per --between state")
    options = parser.parse_args(argv)
    between = options.between.split(",")
    seconds = [float(x) for x in str(options.seconds).split(",")]
    seconds += seconds[-1:] * (len(between) - len(seconds))
    if not set(between) <= {"none", "settle", "own", "idle"}:
        parser.error(f"--between: expected none, settle, own or idle (comma-separated), got {options.between!r}")
    spec = next(json.loads(line) for line in open(options.problems)
                if line.strip() and json.loads(line)["name"] == options.name)
    database = _tuning_db.read(options.database)
    flush = flush_buffer()
    ahead = torch.rand(4096, 4096, device="cuda", dtype=torch.bfloat16) * 2 - 1

    def before() -> None:
        if options.ahead == "gemm":
            for _ in range(5):
                torch.mm(ahead, ahead)
        flush.zero_()

    def made() -> dict:
        ops = operands(spec)
        if options.operands == "tune":
            for array in (ops["a"], ops["b"], *ops["inputs"].values()):
                _fill_as_tune(array)
        return ops

    ops = made()
    first = planned(spec, ops)
    entry = database.entries.get(key_of(first._launch))
    if entry is None or entry.get("kind") != "tuned":
        raise SystemExit(f"{options.database} holds no tuned entry for {options.name}")
    algo = bytes.fromhex(entry["algo"])
    pick = planned(spec, ops, algo)
    print(f"{torch.cuda.get_device_name()}; {options.name}: the database's pick / the first pick, median of "
          f"{options.rounds} interleaved rounds per duel, behind "
          f"{'five 4096³ GEMMs on random values and ' if options.ahead == 'gemm' else ''}an L2 flush "
          f"on {options.operands} operands (the tune recorded {entry.get('ratio', float('nan')):.3f})")
    print(f"  {'duel':>4s} {'before':6s} {'ratio':>6s} {'first ms':>9s} {'pick ms':>8s}  clock MHz, power W, temperature °C after; "
          f"the operands' addresses (low 32 bits)")
    ratios = []
    for duel in range(options.duels):
        if options.fresh and duel:
            first.free()
            pick.free()
            ops = made()
            first, pick = planned(spec, ops), planned(spec, ops, algo)
        state = between[duel % len(between)]
        _before_duel(state, seconds[duel % len(between)], ahead, first.execute)
        state = f"{state}{seconds[duel % len(between)]:g}" if state != "none" else state
        samples = event_rounds(torch, [("first", first.execute), ("pick", pick.execute)], options.rounds,
                               seed=duel, before=before)
        ratio = statistics.median(p / f for p, f in zip(samples[1], samples[0]))
        ratios.append(ratio)
        where = " ".join(f"{name}@{tensor.data_ptr() % (1 << 32):08x}" for name, tensor in
                         (("a", ops["a"]), ("b", ops["b"]), *ops["inputs"].items()))
        print(f"  {duel:4d} {state:6s} {ratio:6.3f} {statistics.median(samples[0]):9.4f} {statistics.median(samples[1]):8.4f}"
              f"  {_gpu_state()}  {where}", flush=True)
    labels = [f"{state}{time_s:g}" for state, time_s in zip(between, seconds)]
    for state in dict.fromkeys(labels) if len(set(labels)) > 1 else ():
        some = [ratio for duel, ratio in enumerate(ratios) if labels[duel % len(labels)] == state]
        print(f"after {state}: median {statistics.median(some):.3f}, range {min(some):.3f}–{max(some):.3f} over "
              f"{len(some)} duels")
    print(f"ratios: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}–{max(ratios):.3f} over "
          f"{len(ratios)} duels")
    first.free()
    pick.free()


if __name__ == "__main__":
    main()
