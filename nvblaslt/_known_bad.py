"""Algorithms seen to return wrong results, as data: the plan never offers them for such problems.

Each entry says which cuBLASLt epilog, element type and algorithm id, and on which problems (the
canonical problem's extents) the result was wrong, with where it was seen. A wrong result is
worse than a slower kernel, so the rule is broad enough to cover what was measured around it.
"""

from __future__ import annotations

# (epilog name, D type, algorithm id, predicate on the canonical problem, where it was seen)
KNOWN_BAD = [
    ("BGRADB", "float16", 13, lambda p: p.m == 1,
     "cuBLASLt 13.1 / H200: bgradb wrong (often run-to-run different) for M=1 and every N (4, 64) and K (64 to 1024) "
     "probed; right for M ≥ 2, for bf16/fp32 and for BGRADA with N=1 (tools/probe_known_bad.py, 2026-11-22)"),
]


def refuses(result, problem) -> bool:
    epilog, dtype = problem.epilog.name, problem.types.d.name
    return any(e == epilog and d == dtype and result.algo_id == algo and rule(problem)
               for e, d, algo, rule, _ in KNOWN_BAD)
