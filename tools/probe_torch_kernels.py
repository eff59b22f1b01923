"""Probe (GPU): which kernels torch's own call and nvblaslt's plans launch, problem by problem.

``bench.tuning`` counts a problem "slower than torch" when torch's call reads faster than the database's
pick in a duel, by any margin. On an H200 (2026-11-29) 7–14 of the quick suite's 30 problems read so, by
0.1–3 %, most of them where the database keeps the heuristics' first pick. Whether torch runs the same
kernel there (and the gap is the duel's noise) or another one (cuBLAS's own GEMV-like path at one token,
another tile from cuBLAS's own heuristics, another workspace) is a question the duel cannot answer. This
lists the CUDA kernels each call launches (torch.profiler) with their mean device time.

    PYTHONPATH=. python -m tools.probe_torch_kernels PROBLEMS.jsonl [DATABASE.jsonl] [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import functools
import json

import torch

from nvblaslt import _tuning_db
from nvblaslt._tuning_cache import key_of
from nvblaslt.bench.tuning_problems import launched_kernels, operands, planned, torch_call

CALLS = 5
kernels = functools.partial(launched_kernels, calls=CALLS)


def show(label: str, found: list[tuple[str, float]]) -> str:
    if not found:
        return f"    {label:8s} (no kernel)"
    return "\n".join(f"    {label if i == 0 else '':8s} {us:8.1f} µs  {name[:150]}" for i, (name, us) in enumerate(found))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems")
    parser.add_argument("database", nargs="?", help="a database whose tuned picks are listed too")
    parser.add_argument("--only", default="", help="problems whose name holds this")
    options = parser.parse_args(argv)
    specs = [json.loads(line) for line in open(options.problems) if line.strip()]
    database = _tuning_db.read(options.database) if options.database else None
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: kernels per call (torch.profiler, mean of "
          f"{CALLS} calls); 'same' = torch's GEMM kernel has the first pick's name")
    same = 0
    counted = 0
    for spec in specs:
        if options.only not in spec["name"]:
            continue
        ops = operands(spec)
        first = planned(spec, ops)
        rows = {"torch": kernels(torch_call(spec, ops)), "first": kernels(first.execute)}
        entry = database.entries.get(key_of(first._launch)) if database else None
        if entry is not None and entry.get("kind") == "tuned":
            pick = planned(spec, ops, bytes.fromhex(entry["algo"]))  # fused, whatever form the entry says
            rows["database"] = kernels(pick.execute)
            pick.free()
        first.free()
        def gemms(found):  # a split-K reduction kernel shared by two GEMMs says nothing of the GEMMs
            return {name for name, _ in found if "splitKreduce" not in name}
        matched = bool(gemms(rows["first"]) & gemms(rows["torch"]))
        counted += 1
        same += matched
        print(f"{spec['name']}: {'same' if matched else 'OTHER'}")
        for label, found in rows.items():
            print(show(label, found))
    print(f"torch launches the first pick's kernel on {same} of {counted} problems")


if __name__ == "__main__":
    main()
