"""The invariance part of ``python -m nvblaslt.bench.tuning``: over the suite's (N, K) pairs and BIAS /
RELU_BIAS / GELU_BIAS in bf16, the time of the ``batch_invariant`` plan against the default plan's at
M = 1 … 8192, the points a ladder is chosen at and the M between them (the tokens are D's columns,
``W @ xᵀ``, as ``nvblaslt.torch`` runs a layer with a bias), with the measured ladders loaded
(``nvblaslt tune --batch-invariant``'s database; the part tunes one first where it is given none; with
none, today's single pin), in interleaved rounds; and D's token columns at every M of a dense set
(1 … 300, and each power of two from 512 with its neighbours) compared bitwise with those at M = 8192.
``tests/gpu/test_tuning_db_gpu.py`` checks the same through ``nvblaslt.torch.linear`` too. Each M says
which kernel the invariant plan ran: a verified member of the ladder's class that is the default plan's
own kernel for that M (``member``: the same config as the default's), or its rung, and whether the
default plan split K there."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from .common import free_memory, progress
from .tuning_problems import burst_calls, gpu_rounds, paired, suite_pairs

EPILOGS = ("BIAS", "RELU_BIAS", "GELU_BIAS")
# the ladder's points (_invariant_choice.SPEED_M: 1, 8, 12, 16, 24, … 8192), and M the tune never timed (40, 80,
# 320, 1280, 5120): a member or the next point's rung serves them
SPEED_M = (1, 8, 12, 16, 24, 32, 40, 48, 64, 80, 96, 128, 192, 256, 320, 384, 512, 768, 1024, 1280, 1536, 2048, 3072,
           4096, 5120, 6144, 8192)
SMALL_M = 64  # at or below: the small-M target; from LARGE_M up: the large-M target
LARGE_M = 256
TARGETS = {"small": 0.95, "large": 0.85}  # the batch-invariant plan's speed × the default's
LARGEST_M = 8192
BITWISE_M = (*range(1, 301), *(p + d for p in (512, 1024, 2048, 4096) for d in (-1, 0, 1)), 8191)
INVARIANT = {"batch_invariant": "columns"}


def _plan(w, x, bias, epilog: str, m: int, options, preferences=None):
    from nvblaslt import Matmul

    plan = Matmul(w, x[:m].T, options=options)
    try:
        plan.plan(epilog=epilog, epilog_inputs={"bias": bias}, preferences=preferences)
    except BaseException:
        plan.free()
        raise
    return plan


def _with_database(database: str | None, make):
    """``make()`` with ``database`` loaded (None: with none loaded)."""
    import nvblaslt

    if database is None:
        return make()
    nvblaslt.load_tuning(database)
    try:
        return make()
    finally:
        nvblaslt.unload_tuning()


def _speed(w, x, bias, epilog: str, rounds: int, flush, database: str | None, queue: str = "gemm") -> dict:
    """{M: the batch-invariant plan's speed × the default's (``ratio``, paired), the two medians, and the
    invariant plan's kernel (its rung's id and tile)}, ``database`` loaded for the invariant plan."""
    found = {}
    for m in SPEED_M:
        plans = [_plan(w, x, bias, epilog, m, None)]
        try:
            plans.append(_with_database(database, lambda: _plan(w, x, bias, epilog, m, INVARIANT)))
            default, invariant = plans
            calls = burst_calls(default.execute, flush)
            samples = gpu_rounds([("default", default.execute), ("invariant", invariant.execute)], rounds, calls,
                                 flush, queue)
            config = invariant.algorithm.algorithm.config()
            kernel = f"id {config.get('ID')} tile {config.get('TILE_ID')} split {config.get('SPLITK_NUM')}"
            # a member runs only where it is the default's own kernel (_batch_invariant.member_for)
            served = "member" if config == default.algorithm.algorithm.config() else "rung"
            default_splits = int(default.algorithm.algorithm.get("SPLITK_NUM")) > 1
        finally:
            for plan in plans:
                plan.free()
        found[m] = {**paired(samples[0], samples[1]), "default_ms": statistics.median(samples[0]),
                    "invariant_ms": statistics.median(samples[1]), "kernel": kernel, "calls": calls,
                    "served": served if database else "pin", "default_splits_k": default_splits}
    return found


def _bitwise(w, x, bias, epilog: str, database: str | None) -> list[int]:
    """The M of ``BITWISE_M`` where D's token columns differ from the first M of D at ``LARGEST_M`` rows
    (empty: none), through ``matmul()`` with ``database`` loaded (None: none)."""
    import torch

    import nvblaslt

    def d(m: int):
        return nvblaslt.matmul(w, x[:m].T, epilog=epilog, epilog_inputs={"bias": bias}, options=INVARIANT)

    def check() -> list[int]:
        nvblaslt.clear_plan_cache()  # plans made with another database
        reference = d(LARGEST_M)
        differ = [m for m in BITWISE_M if not torch.equal(d(m), reference[:, :m])]
        nvblaslt.clear_plan_cache()
        return differ
    return _with_database(database, check)


def tune_database(pairs: list[tuple[int, int]], path: Path, budget_s: float) -> str | None:
    """``nvblaslt tune --batch-invariant`` of ``pairs`` into ``path`` (in this process); None where it
    recorded nothing."""
    import nvblaslt

    path.unlink(missing_ok=True)
    database = nvblaslt.tune("llm-invariant", path, pairs=pairs, epilogs=EPILOGS, budget_s=budget_s,
                             progress=lambda line: progress(f"invariance tune: {line}"))
    return str(path) if len(database) else None


def section(pairs: list[tuple[int, int]] | None, rounds: int, deadline: float, flush,
            database: str | None = None, queue: str = "gemm") -> dict:
    """Every (pair, epilog) row, until ``deadline`` (``time.perf_counter()``); the pairs left are named.
    ``database``: the measured ladders (None: today's pins stand in for them, and the part says so);
    ``queue``: what runs ahead of each sample (``tuning_problems.QUEUES``)."""
    import torch

    import nvblaslt

    pairs = suite_pairs() if pairs is None else pairs
    rows, left = [], []
    torch.manual_seed(0)
    for index, (n, k) in enumerate(pairs):
        if time.perf_counter() > deadline:
            left = pairs[index:]
            progress(f"invariance: out of time; {len(left)} (N, K) pairs left out")
            break
        progress(f"invariance: N={n} K={k}")
        x = (torch.rand(LARGEST_M, k, device="cuda") * 2 - 1).to(torch.bfloat16)
        w = ((torch.rand(n, k, device="cuda") * 2 - 1) / k ** 0.5).to(torch.bfloat16)
        bias = (torch.rand(n, device="cuda") * 2 - 1).to(torch.bfloat16)
        for epilog in EPILOGS:
            row: dict = {"n": n, "k": k, "epilog": epilog}
            try:
                row["speed"] = _speed(w, x, bias, epilog, rounds, flush, database, queue)
                row["bitwise_differs"] = _bitwise(w, x, bias, epilog, database)
            except nvblaslt.NvblasltError as error:  # a pair cuBLASLt pins no algorithm for: said, and the rest go on
                row["error"] = f"{type(error).__name__}: {error}"
            rows.append(row)
        del x, w, bias
        nvblaslt.clear_plan_cache()  # matmul()'s plans of this pair hold its workspace
        free_memory(torch)
    return {"rows": rows, "pairs_left_out": [list(p) for p in left], "rounds": rounds, "database": database}


def summarize(part: dict) -> dict:
    """The lowest ratio per M class and the misses of each target (M between the classes is reported,
    not judged), the bitwise failures, and the rows not run."""
    small: list[float] = []
    large: list[float] = []
    misses: list[str] = []
    for row in part["rows"]:
        if "error" in row:
            continue
        for m, figures in row["speed"].items():
            ratio, m = figures["ratio"], int(m)
            if SMALL_M < m < LARGE_M:
                continue
            kind = "small" if m <= SMALL_M else "large"
            (small if kind == "small" else large).append(ratio)
            if ratio < TARGETS[kind]:
                misses.append(f"N={row['n']} K={row['k']} {row['epilog']} M={m}: {ratio:.3f}× "
                              f"(target ≥ {TARGETS[kind]})")
    return {"lowest_small": min(small, default=None), "lowest_large": min(large, default=None), "misses": misses,
            "bitwise_differs": [f"N={r['n']} K={r['k']} {r['epilog']}: M={m}" for r in part["rows"]
                                for m in r.get("bitwise_differs", [])],
            "errors": [f"N={r['n']} K={r['k']} {r['epilog']}: {r['error']}" for r in part["rows"] if "error" in r]}


def report(part: dict, summary: dict) -> None:
    what = "the measured ladders" if part.get("database") else "NO DATABASE: today's single pin"
    print(f"\nbatch_invariant plan's speed × the default plan's (default ms / invariant ms, paired, "
          f"{part['rounds']} rounds), bf16, D = W @ xᵀ with a bias, {what}")
    print(f"{'N':>6s} {'K':>6s} {'epilog':10s} " + " ".join(f"{f'M={m}':>7s}" for m in SPEED_M) + "  bitwise")
    for row in part["rows"]:
        if "error" in row:
            print(f"{row['n']:6d} {row['k']:6d} {row['epilog']:10s} {row['error']}")
            continue
        cells = [f"{row['speed'][m]['ratio']:7.3f}" for m in SPEED_M]
        bits = "same" if not row["bitwise_differs"] else f"DIFFERS at {len(row['bitwise_differs'])} M"
        print(f"{row['n']:6d} {row['k']:6d} {row['epilog']:10s} " + " ".join(cells) + f"  {bits}")
    for row in part["rows"]:  # which kernel ran where: a member, a rung; where the default split K
        if "error" not in row:
            figures = [row["speed"][m] for m in SPEED_M]
            kernels = [f"M={m}: {f['kernel']}" + (f" ({f['served']})" if "served" in f else "") +
                       (", default splits K" if f.get("default_splits_k") else "") for m, f in zip(SPEED_M, figures)]
            members = sum(f.get("served") == "member" for f in figures)
            print(f"  kernels, N={row['n']} K={row['k']} {row['epilog']} (a member at {members} of {len(SPEED_M)} M): "
                  + "; ".join(kernels))
    for kind, bound in (("small", f"M ≤ {SMALL_M}"), ("large", f"M ≥ {LARGE_M}")):
        lowest = summary[f"lowest_{kind}"]
        shown = "no figure" if lowest is None else f"lowest {lowest:.3f}×"
        met = "met" if lowest is not None and lowest >= TARGETS[kind] else "MISSED"
        print(f"batch_invariant at {bound}: {shown} (target ≥ {TARGETS[kind]} at every shape: {met})")
    for miss in summary["misses"]:
        print(f"  below: {miss}")
    checked = len(part["rows"]) - len(summary["errors"])
    differs = summary["bitwise_differs"]
    print(f"bitwise: D's token columns at M = 1 … 300, {', '.join(map(str, BITWISE_M[300:]))} against the first M "
          f"of D at M = {LARGEST_M}, {checked} (pair, epilog) rows: "
          f"{'all the same' if not differs else 'DIFFER: ' + '; '.join(differs)}")
    for error in summary["errors"]:
        print(f"  not run: {error}")
    if part["pairs_left_out"]:
        print(f"  left out for time: {part['pairs_left_out']}")
