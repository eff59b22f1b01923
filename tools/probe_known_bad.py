"""Probe (GPU): which heuristic algorithms give wrong or run-to-run different bias gradients.

For BGRADA/BGRADB on small-M/N problems, each algorithm the heuristics offer is run 10 times and
its bias gradient compared with a float64 reference (tolerance scaled by the sum of |terms|).
What it finds goes into ``nvblaslt/_known_bad.py``.

    python -m tools.probe_known_bad      # from the repository root (it imports tests.reference)
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

import nvblaslt
from nvblaslt import Matmul, MatmulEpilog
from tests.reference import host

RNG = np.random.default_rng(3)


def probe(epilog, dtype, m, n, k):
    if epilog == MatmulEpilog.BGRADB:
        a = torch.from_numpy(RNG.standard_normal((m, k))).to(dtype).cuda()
        b = torch.from_numpy(RNG.standard_normal((k, n))).to(dtype).cuda()
        operand, axis = b, 0
    else:
        a = torch.from_numpy(RNG.standard_normal((k, m))).to(dtype).cuda().T
        b = torch.from_numpy(RNG.standard_normal((k, n))).to(dtype).cuda()
        operand, axis = a, 1
    key = "bgradb" if epilog == MatmulEpilog.BGRADB else "bgrada"
    ref = host(operand).sum(axis=axis)
    terms = np.abs(host(operand)).sum(axis=axis)
    bad = []
    try:
        mm = Matmul(a, b)
        algorithms = mm.plan(epilog=epilog, preferences={"limit": 32})
    except nvblaslt.NvblasltError as error:
        return [("plan", str(error)[:80])]
    for algorithm in algorithms:
        seen, wrong = set(), 0
        for _ in range(10):
            try:
                _, aux = mm.execute(algorithm=algorithm)
            except nvblaslt.NvblasltError:
                break
            grad = host(aux[key])
            seen.add(grad.tobytes())
            if not np.all(np.abs(grad - ref) <= 4e-3 * terms + 1e-2):
                wrong += 1
        if wrong or len(seen) > 1:
            bad.append((algorithm.algo_id, f"wrong {wrong}/10, {len(seen)} distinct"))
    return bad


def main():
    found = 0
    for epilog, dtype, small, other, k in itertools.product(
            (MatmulEpilog.BGRADB, MatmulEpilog.BGRADA), (torch.float16, torch.bfloat16, torch.float32),
            (1, 2, 4, 8, 16, 32), (1, 4, 64), (64, 384, 1024)):
        m, n = (small, other) if epilog == MatmulEpilog.BGRADB else (other, small)
        bad = probe(epilog, dtype, m, n, k)
        if bad:
            found += 1
            print(f"{epilog.name} {str(dtype)[6:]} M={m} N={n} K={k}: {bad}", flush=True)
    print(f"probe_known_bad: {found} configurations with a bad algorithm")


if __name__ == "__main__":
    main()
