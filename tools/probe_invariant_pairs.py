"""Probe (GPU): do two kernels without split-K give the same bits? If so, a decode kernel and a prefill
kernel could share one batch-invariant pin's rows.

A single pinned kernel for every M runs at 0.55–0.96× the default plan at M ≤ 64 or at large M, never at both
(issue 35's measured pin, H200). Without split-K each output element is one CTA's sequential sum over K,
so kernels with other tiles may still add the same products in the same order. This probe collects the
heuristics' picks at several M (split-K turned off where cuBLASLt accepts it), runs each at every M of
``--rows`` on the same x and W, and groups them by the bits of token 0's row: candidates in one
bit class are interchangeable for a batch-invariant plan. For each it prints its speed × the default plan
at each M, then the bit classes, and the best speed a class reaches at each M against the best single pin.

A fixed split count with the COMPUTE_TYPE reduction sums in an order that does not depend on M either;
``--splits 2`` (or ``1,2,4``) gives every candidate that count instead, to see whether kernels of one split
count form one class too (each count is its own run of classes: counts never share bits).

    python -m tools.probe_invariant_pairs [--pairs 4096x4096,14336x4096,4096x14336,1024x8192] [--rows 1,16,64,256,1024,8192] [--splits 1]
"""

from __future__ import annotations

import argparse

import torch

import nvblaslt
from nvblaslt._invariant_choice import with_split
from tools.probe_invariant_splitk import _ms, _plan

PICKS_AT = (1, 16, 64, 256, 1024, 8192)
PICKS_EACH = 4


def candidates(w, x, bias, splits: int = 1) -> dict[bytes, str]:
    """The heuristics' picks at each M of ``PICKS_AT``, each with split-K ``splits`` (1: off)."""
    lib = nvblaslt.library()
    found: dict[bytes, str] = {}
    for at in PICKS_AT:
        with _plan(w, x[:at], bias) as plan:
            for rank, result in enumerate(plan.algorithms[:PICKS_EACH]):
                raw = with_split(lib, result.as_bytes(), splits)
                if raw is not None:
                    found.setdefault(raw, f"pick {rank} at M={at}")
    return found


def probe(n: int, k: int, rows: list[int], splits: int = 1) -> None:
    torch.manual_seed(0)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    x = torch.randn(max(rows), k, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    defaults = {}
    for m in rows:
        with _plan(w, x[:m], bias) as plan:
            defaults[m] = _ms(plan)
    speeds: dict[str, dict[int, float]] = {}
    classes: dict[bytes, list[str]] = {}
    for raw, name in candidates(w, x, bias, splits).items():
        first_bits, row_speed, consistent = None, {}, True
        for m in rows:
            try:
                plan = _plan(w, x[:m], bias, algorithms=[raw])
            except nvblaslt.NvblasltError:
                row_speed[m] = float("nan")
                continue
            with plan:
                d = plan.execute()
                key = d[:, 0].cpu().view(torch.int16).numpy().tobytes()  # token 0's column, bit for bit
                if first_bits is None:
                    first_bits = key
                consistent = consistent and key == first_bits
                row_speed[m] = defaults[m] / _ms(plan)
        label = f"{name}{'' if consistent else ' (own rows change with M)'}"
        speeds[label] = row_speed
        if first_bits is not None and consistent:
            classes.setdefault(first_bits, []).append(label)
    split = "split-K off" if splits == 1 else f"split-K {splits}, COMPUTE_TYPE reduction"
    print(f"\nN {n}, K {k}, bf16 RELU_BIAS, D = W xᵀ, {split}; speed × the default plan at each M (nan: refused)")
    print(f"  {'candidate':44s} " + " ".join(f"{'M=' + str(m):>8s}" for m in rows))
    for label, row_speed in speeds.items():
        print(f"  {label:44s} " + " ".join(f"{row_speed[m]:8.3f}" for m in rows))
    best_single = max((min(s[m] for m in rows) for s in speeds.values()), default=float("nan"))
    print(f"  bit classes (kernels whose rows agree bitwise): {len(classes)}; best single pin's worst M: "
          f"{best_single:.3f}")
    for index, members in enumerate(sorted(classes.values(), key=len, reverse=True)):
        best = [max(speeds[label][m] for label in members) for m in rows]
        print(f"   class {index}: {len(members)} kernels; best of the class at each M: "
              + " ".join(f"{b:.3f}" for b in best) + f"; worst M {min(best):.3f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", default="4096x4096,14336x4096,4096x14336,1024x8192")
    parser.add_argument("--rows", default="1,16,64,256,1024,8192")
    parser.add_argument("--splits", default="1", help="split-K counts, each a run of its own (1: off)")
    options = parser.parse_args(argv)
    rows = [int(r) for r in options.rows.split(",")]
    print(f"{torch.cuda.get_device_name()}, cuBLASLt {nvblaslt.library().version}")
    for pair in options.pairs.split(","):
        n, k = (int(v) for v in pair.split("x"))
        for splits in (int(c) for c in options.splits.split(",")):
            probe(n, k, rows, splits)


if __name__ == "__main__":
    main()
