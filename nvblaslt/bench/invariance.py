"""The invariance part of ``python -m nvblaslt.bench.tuning``: over the suite's (N, K) pairs and BIAS /
RELU_BIAS / GELU_BIAS in bf16, the time of two ``batch_invariant`` plans against the default plan's at
M = 1 … 8192 (the tokens are D's columns, ``W @ xᵀ``, as ``nvblaslt.torch`` runs a layer with a bias):
today's pin (no database loaded) and the measured pin (``nvblaslt tune --batch-invariant``'s database
loaded; the part tunes one first where it is given none), all three in the same interleaved rounds; and
a bitwise check that the first rows (D's first columns) do not change with M, for both pins.
``tests/gpu/test_tuning_db_gpu.py`` does the thorough bitwise check."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from .common import free_memory, progress
from .tuning_problems import burst_calls, gpu_rounds, paired, suite_pairs

EPILOGS = ("BIAS", "RELU_BIAS", "GELU_BIAS")
SPEED_M = (1, 16, 64, 256, 1024, 8192)
SMALL_M = 64  # at or below: the small-M target; from LARGE_M up: the large-M target
LARGE_M = 256
TARGETS = {"small": 0.95, "large": 0.85}  # the batch-invariant plan's speed × the default's
BITWISE_M = (1, 7, 64, 300, 8192)
BITWISE_ROWS = 8
INVARIANT = {"batch_invariant": "columns"}
PINS = ("today", "measured")  # today's rule (no database), the database's measured pin


def _plan(w, x, bias, epilog: str, m: int, options):
    from nvblaslt import Matmul

    plan = Matmul(w, x[:m].T, options=options)
    try:
        plan.plan(epilog=epilog, epilog_inputs={"bias": bias})
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


def _speed(w, x, bias, epilog: str, rounds: int, flush, database: str | None) -> dict:
    """{M: the measured pin's speed × the default's (``ratio``, paired), today's (``today``), the three
    medians and whether the two pins are one kernel}."""
    found = {}
    for m in SPEED_M:
        plans = [_plan(w, x, bias, epilog, m, None), _plan(w, x, bias, epilog, m, INVARIANT)]
        try:
            plans.append(_with_database(database, lambda: _plan(w, x, bias, epilog, m, INVARIANT)))
            default, today, measured = plans
            calls = burst_calls(default.execute, flush)
            samples = gpu_rounds([("default", default.execute), ("today", today.execute),
                                  ("measured", measured.execute)], rounds, calls, flush)
            same = today.algorithm.as_bytes() == measured.algorithm.as_bytes()
        finally:
            for plan in plans:
                plan.free()
        found[m] = {**paired(samples[0], samples[2]), "today": paired(samples[0], samples[1]),
                    "default_ms": statistics.median(samples[0]), "today_ms": statistics.median(samples[1]),
                    "invariant_ms": statistics.median(samples[2]), "same_kernel": same, "calls": calls}
    return found


def _bitwise(w, x, bias, epilog: str, database: str | None) -> list[str]:
    """Where D's first columns at M of ``BITWISE_M`` differ from D at M = 1 … 8 (empty: nowhere), through
    ``matmul()`` with ``database`` loaded (None: none)."""
    import torch

    import nvblaslt

    def d(m: int):
        return nvblaslt.matmul(w, x[:m].T, epilog=epilog, epilog_inputs={"bias": bias}, options=INVARIANT)

    def check() -> list[str]:
        nvblaslt.clear_plan_cache()  # plans of the other pin
        small = {m: d(m) for m in range(1, BITWISE_ROWS + 1)}
        differ = []
        for big in BITWISE_M:
            result = small[big] if big in small else d(big)
            differ += [f"M={big} vs M={m}" for m in range(1, min(big, BITWISE_ROWS) + 1)
                       if not torch.equal(result[:, :m], small[m])]
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
            database: str | None = None) -> dict:
    """Every (pair, epilog) row, until ``deadline`` (``time.perf_counter()``); the pairs left are named.
    ``database``: the measured pins (None: today's pins stand in for them, and the part says so)."""
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
        x = (torch.rand(max(SPEED_M + BITWISE_M), k, device="cuda") * 2 - 1).to(torch.bfloat16)
        w = ((torch.rand(n, k, device="cuda") * 2 - 1) / k ** 0.5).to(torch.bfloat16)
        bias = (torch.rand(n, device="cuda") * 2 - 1).to(torch.bfloat16)
        for epilog in EPILOGS:
            row: dict = {"n": n, "k": k, "epilog": epilog}
            try:
                row["speed"] = _speed(w, x, bias, epilog, rounds, flush, database)
                row["bitwise_differs"] = _bitwise(w, x, bias, epilog, database)
                row["today_bitwise_differs"] = _bitwise(w, x, bias, epilog, None)
            except nvblaslt.NvblasltError as error:  # a pair cuBLASLt pins no algorithm for: said, and the rest go on
                row["error"] = f"{type(error).__name__}: {error}"
            rows.append(row)
        del x, w, bias
        nvblaslt.clear_plan_cache()  # matmul()'s plans of this pair hold its workspace
        free_memory(torch)
    return {"rows": rows, "pairs_left_out": [list(p) for p in left], "rounds": rounds, "database": database}


def _lowest(part: dict, pick) -> dict:
    """The lowest speed per M class and the misses, of the pin ``pick(figures)`` gives per row and M."""
    small: list[float] = []
    large: list[float] = []
    misses: list[str] = []
    for row in part["rows"]:
        if "error" in row:
            continue
        what = f"N={row['n']} K={row['k']} {row['epilog']}"
        for m, figures in row["speed"].items():
            ratio, m = pick(figures), int(m)
            if ratio is None or SMALL_M < m < LARGE_M:
                continue
            kind = "small" if m <= SMALL_M else "large"
            (small if kind == "small" else large).append(ratio)
            if ratio < TARGETS[kind]:
                misses.append(f"{what} M={m}: {ratio:.3f}× (target ≥ {TARGETS[kind]})")
    return {"lowest_small": min(small, default=None), "lowest_large": min(large, default=None), "misses": misses}


def summarize(part: dict) -> dict:
    """The measured pin's misses of each target and lowest ratio per M class (top level), today's
    (``today``), the bitwise failures of each and the rows not run."""
    found = _lowest(part, lambda figures: figures["ratio"])
    found["today"] = _lowest(part, lambda figures: figures.get("today", {}).get("ratio"))
    found["bitwise_differs"] = [f"N={r['n']} K={r['k']} {r['epilog']}: {where}" for r in part["rows"]
                                for where in r.get("bitwise_differs", [])]
    found["today"]["bitwise_differs"] = [f"N={r['n']} K={r['k']} {r['epilog']}: {where}" for r in part["rows"]
                                         for where in r.get("today_bitwise_differs", [])]
    found["errors"] = [f"N={r['n']} K={r['k']} {r['epilog']}: {r['error']}" for r in part["rows"] if "error" in r]
    return found


def _verdicts(summary: dict, name: str) -> None:
    for kind, bound in (("small", f"M ≤ {SMALL_M}"), ("large", f"M ≥ {LARGE_M}")):
        lowest = summary[f"lowest_{kind}"]
        shown = "no figure" if lowest is None else f"lowest {lowest:.3f}×"
        met = "met" if lowest is not None and lowest >= TARGETS[kind] else "MISSED"
        print(f"{name} at {bound}: {shown} (target ≥ {TARGETS[kind]} at every shape: {met})")
    for miss in summary["misses"]:
        print(f"  below: {miss}")


def report(part: dict, summary: dict) -> None:
    measured = "the measured pin" if part.get("database") else "the measured pin (NO DATABASE: today's rule)"
    print(f"\nbatch_invariant plans' speed × the default plan's (default ms / invariant ms, paired, "
          f"{part['rounds']} rounds), bf16, D = W @ xᵀ with a bias; per M: today's pin / {measured} "
          f"(= where the two are one kernel)")
    print(f"{'N':>6s} {'K':>6s} {'epilog':10s} " + " ".join(f"{f'M={m}':>13s}" for m in SPEED_M) + "  bitwise")
    for row in part["rows"]:
        if "error" in row:
            print(f"{row['n']:6d} {row['k']:6d} {row['epilog']:10s} {row['error']}")
            continue
        cells = []
        for m in SPEED_M:
            figures = row["speed"][m]
            today = figures.get("today", {}).get("ratio")
            mark = "=" if figures.get("same_kernel") else "/"
            cells.append(f"{'-' if today is None else f'{today:.3f}'}{mark}{figures['ratio']:.3f}")
        bits = "same" if not row["bitwise_differs"] and not row.get("today_bitwise_differs") else "DIFFERS"
        print(f"{row['n']:6d} {row['k']:6d} {row['epilog']:10s} " + " ".join(f"{c:>13s}" for c in cells)
              + f"  {bits}")
    _verdicts(summary["today"], "today's pin")
    _verdicts(summary, "measured pin")
    checked = len(part["rows"]) - len(summary["errors"])
    for name, differs in (("today's pin", summary["today"]["bitwise_differs"]),
                          ("measured pin", summary["bitwise_differs"])):
        print(f"bitwise, {name}: D's first {BITWISE_ROWS} token columns at M = {', '.join(map(str, BITWISE_M))} "
              f"against M = 1 … {BITWISE_ROWS}, {checked} (pair, epilog) rows: "
              f"{'all the same' if not differs else 'DIFFER: ' + '; '.join(differs)}")
    for error in summary["errors"]:
        print(f"  not run: {error}")
    if part["pairs_left_out"]:
        print(f"  left out for time: {part['pairs_left_out']}")
