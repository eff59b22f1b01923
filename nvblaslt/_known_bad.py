"""Algorithms seen to return wrong results, as data: the plan never offers them for such problems.

Each entry says which cuBLASLt epilog, element type and algorithm id, and on which problems (the
canonical problem's extents) the result was wrong, with where it was seen. A wrong result is
worse than a slower kernel, so the rule is broad enough to cover what was measured around it.
"""

from __future__ import annotations

# (epilog name, D type, algorithm id, predicate on the canonical problem, where it was seen)
KNOWN_BAD = [
    ("BGRADB", "float16", 13, lambda p: p.m < 16,
     "cuBLASLt 13.1 / H200: bgradb wrong and nondeterministic for M=1, N=4, K=384/512/1024 (issue 10)"),
]


def refuses(result, problem) -> bool:
    epilog, dtype = problem.epilog.name, problem.types.d.name
    return any(e == epilog and d == dtype and result.algo_id == algo and rule(problem)
               for e, d, algo, rule, _ in KNOWN_BAD)
