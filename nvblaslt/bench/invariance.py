"""The invariance part of ``python -m nvblaslt.bench.tuning``: over the suite's (N, K) pairs and BIAS /
RELU_BIAS / GELU_BIAS in bf16, a ``batch_invariant`` plan's time against the default plan's at M = 1 … 8192
(the tokens are D's columns, ``W @ xᵀ``, as ``nvblaslt.torch`` runs a layer with a bias), and a bitwise
check that the first rows (D's first columns) do not change with M. ``tests/gpu/test_tuning_db_gpu.py``
does the thorough bitwise check."""

from __future__ import annotations

import statistics
import time

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


def _plans(w, x, bias, epilog: str, m: int):
    from nvblaslt import Matmul

    made = []
    for options in (None, INVARIANT):
        plan = Matmul(w, x[:m].T, options=options)
        made.append(plan)
        plan.plan(epilog=epilog, epilog_inputs={"bias": bias})
    return made


def _speed(w, x, bias, epilog: str, rounds: int, flush) -> dict:
    """{M: default ms / batch-invariant ms (paired)}, and the two medians."""
    found = {}
    for m in SPEED_M:
        default, invariant = _plans(w, x, bias, epilog, m)
        try:
            calls = burst_calls(default.execute, flush)
            samples = gpu_rounds([("default", default.execute), ("invariant", invariant.execute)], rounds, calls,
                                 flush)
        finally:
            default.free()
            invariant.free()
        found[m] = {**paired(samples[0], samples[1]), "default_ms": statistics.median(samples[0]),
                    "invariant_ms": statistics.median(samples[1]), "calls": calls}
    return found


def _bitwise(w, x, bias, epilog: str) -> list[str]:
    """Where D's first columns at M of ``BITWISE_M`` differ from D at M = 1 … 8 (empty: nowhere)."""
    import torch

    import nvblaslt

    def d(m: int):
        return nvblaslt.matmul(w, x[:m].T, epilog=epilog, epilog_inputs={"bias": bias}, options=INVARIANT)

    small = {m: d(m) for m in range(1, BITWISE_ROWS + 1)}
    differ = []
    for big in BITWISE_M:
        result = small[big] if big in small else d(big)
        differ += [f"M={big} vs M={m}" for m in range(1, min(big, BITWISE_ROWS) + 1)
                   if not torch.equal(result[:, :m], small[m])]
    return differ


def section(pairs: list[tuple[int, int]] | None, rounds: int, deadline: float, flush) -> dict:
    """Every (pair, epilog) row, until ``deadline`` (``time.perf_counter()``); the pairs left are named."""
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
                row["speed"] = _speed(w, x, bias, epilog, rounds, flush)
                row["bitwise_differs"] = _bitwise(w, x, bias, epilog)
            except nvblaslt.NvblasltError as error:  # a pair cuBLASLt pins no algorithm for: said, and the rest go on
                row["error"] = f"{type(error).__name__}: {error}"
            rows.append(row)
        del x, w, bias
        nvblaslt.clear_plan_cache()  # matmul()'s plans of this pair hold its workspace
        free_memory(torch)
    return {"rows": rows, "pairs_left_out": [list(p) for p in left], "rounds": rounds}


def summarize(part: dict) -> dict:
    """The misses of each target, the lowest ratio per M class, and the bitwise failures."""
    small: list[float] = []
    large: list[float] = []
    misses: list[str] = []
    differs: list[str] = []
    errors: list[str] = []
    for row in part["rows"]:
        what = f"N={row['n']} K={row['k']} {row['epilog']}"
        if "error" in row:
            errors.append(f"{what}: {row['error']}")
            continue
        for m, figures in row["speed"].items():
            ratio, m = figures["ratio"], int(m)
            if m <= SMALL_M or m >= LARGE_M:
                kind = "small" if m <= SMALL_M else "large"
                (small if kind == "small" else large).append(ratio)
                if ratio < TARGETS[kind]:
                    misses.append(f"{what} M={m}: {ratio:.3f}× (target ≥ {TARGETS[kind]})")
        differs += [f"{what}: {where}" for where in row["bitwise_differs"]]
    return {"lowest_small": min(small, default=None), "lowest_large": min(large, default=None), "misses": misses,
            "bitwise_differs": differs, "errors": errors}


def report(part: dict, summary: dict) -> None:
    print(f"\nbatch_invariant plan's speed × the default plan's (default ms / invariant ms, paired, "
          f"{part['rounds']} rounds), bf16, D = W @ xᵀ with a bias:")
    print(f"{'N':>6s} {'K':>6s} {'epilog':10s} " + " ".join(f"{f'M={m}':>8s}" for m in SPEED_M) + "  bitwise")
    for row in part["rows"]:
        if "error" in row:
            print(f"{row['n']:6d} {row['k']:6d} {row['epilog']:10s} {row['error']}")
            continue
        cells = " ".join(f"{row['speed'][m]['ratio']:7.3f}×" for m in SPEED_M)
        print(f"{row['n']:6d} {row['k']:6d} {row['epilog']:10s} {cells}  "
              f"{'same' if not row['bitwise_differs'] else 'DIFFERS'}")
    for kind, bound in (("small", f"M ≤ {SMALL_M}"), ("large", f"M ≥ {LARGE_M}")):
        lowest = summary[f"lowest_{kind}"]
        shown = "no figure" if lowest is None else f"lowest {lowest:.3f}×"
        met = "met" if lowest is not None and lowest >= TARGETS[kind] else "MISSED"
        print(f"at {bound}: {shown} (target ≥ {TARGETS[kind]} at every shape: {met})")
    for miss in summary["misses"]:
        print(f"  below: {miss}")
    checked = len(part["rows"]) - len(summary["errors"])
    print(f"bitwise: D's first {BITWISE_ROWS} token columns at M = {', '.join(map(str, BITWISE_M))} against M = 1 … "
          f"{BITWISE_ROWS}, {checked} (pair, epilog) rows: "
          f"{'all the same' if not summary['bitwise_differs'] else 'DIFFER: ' + '; '.join(summary['bitwise_differs'])}")
    for error in summary["errors"]:
        print(f"  not run: {error}")
    if part["pairs_left_out"]:
        print(f"  left out for time: {part['pairs_left_out']}")
