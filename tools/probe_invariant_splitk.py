"""Probe (GPU): would a pin that keeps a fixed split-K stay batch-invariant, and be faster at small M?

``batch_invariant=True`` pins the heuristics' kernel for 1024 rows with split-K off, and runs at 0.26–0.72×
the default plan's speed for M ≤ 64 on an H200 (issue 35). A split count fixed for every M, with a
reduction scheme whose order does not depend on M (COMPUTE_TYPE: partial sums in the workspace, summed in
a second step) or INPLACE (the parts added into D in order, counters in the workspace), should keep row i's
bits the same for every M. This probe prints the default plan's algorithm at each M of ``--rows`` (its split-K
and reduction scheme), then takes candidate pins — today's, today's with a split-K of 2 and 4, and the
heuristics' picks at 16 and 64 rows with their split-K kept, each with either reduction — and for each M prints
its speed × the default plan's, whether D's first 8 token columns equal those at M = 8 bit for bit, and the
workspace cuBLASLt asks for it.

``--classes`` asks the ladder's question instead: a batch-invariant entry may run another kernel at each M, but
all of them must give the same bits. For each split count (1, 2, 3, 4, 6, 8) and reduction scheme it forces
that split onto every distinct kernel the heuristics offer at any M of ``--rows`` (their 24 best each), and
prints at each M the fastest one whose first 8 token columns equal the class's reference, × the default. The
reference is the first kernel's D at M = 8 (the first, in the heuristics' order, that plans at M = 8; those
before it are left out); every later run, the reference kernel's own at other M included, is compared with it
and counted.

    python -m tools.probe_invariant_splitk [--pairs 4096x14336,8192x28672] [--rows 1,16,64,256,1024,8192]
    python -m tools.probe_invariant_splitk --classes --pairs 1024x8192
"""

from __future__ import annotations

import argparse
import statistics

import torch

import nvblaslt
from nvblaslt import Matmul, MatmulEpilog
from nvblaslt import _search
from nvblaslt._descriptors import Algorithm

INPLACE, COMPUTE_TYPE = 1, 2  # CUBLASLT_REDUCTION_SCHEME_INPLACE (counters in the workspace), _COMPUTE_TYPE
SCHEMES = {INPLACE: "INPLACE", COMPUTE_TYPE: "COMPUTE_TYPE"}


def _plan(w, x, bias, algorithms=None, invariant=False):
    options = {"batch_invariant": "columns"} if invariant else None
    plan = Matmul(w, x.T, options=options)
    plan.plan(epilog=MatmulEpilog.RELU_BIAS, epilog_inputs={"bias": bias}, algorithms=algorithms)
    return plan


def _with_split(raw: bytes, splits: int | None, scheme: int) -> bytes:
    """``raw`` with split-K ``splits`` (None: its own) and, where it splits, the reduction ``scheme``; with
    ``splits`` 1, no reduction scheme."""
    lib = nvblaslt.library()
    algo = lib.api.cublasLtMatmulAlgo_t.from_buffer_copy(raw)
    config = Algorithm(algo, lib)
    if splits is not None:
        config.set("SPLITK_NUM", splits)
    if config.get("SPLITK_NUM") > 1:
        config.set("REDUCTION_SCHEME", scheme)
    elif splits == 1:
        config.set("REDUCTION_SCHEME", 0)  # a kernel that does not split reduces nothing
    return bytes(algo)


def _described(raw: bytes) -> str:
    config = Algorithm(nvblaslt.library().api.cublasLtMatmulAlgo_t.from_buffer_copy(raw), nvblaslt.library()).config()
    return " ".join(f"{k}={v}" for k, v in sorted(config.items()))


def _ms(plan, calls: int = 20) -> float:
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    plan.execute()
    samples = []
    for _ in range(5):
        torch.cuda._sleep(2_000_000)
        start.record()
        for _ in range(calls):
            plan.execute()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) / calls)
    return statistics.median(samples)


def probe(n: int, k: int, rows: list[int]) -> None:
    torch.manual_seed(0)
    big = max(rows)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    x = torch.randn(big, k, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    candidates = {}
    with _plan(w, x[:1024], bias, invariant=True) as today:
        pin = today.algorithm.as_bytes()
    candidates["today's pin (1024 rows, no split-K)"] = (pin, "split-K 1")
    for splits in (2, 4):
        for scheme, name in SCHEMES.items():
            candidates[f"today's pin, split-K {splits}, {name}"] = (_with_split(pin, splits, scheme), f"split-K {splits}")
    for at in (16, 64):
        with _plan(w, x[:at], bias) as plan:
            own = plan.algorithm.as_bytes()
        for scheme, name in SCHEMES.items():
            candidates[f"heuristics at {at} rows, own split, {name}"] = (_with_split(own, None, scheme), "")
    print(f"\nN {n}, K {k}: the default plan's algorithm at each M")
    defaults = {}
    for m in rows:
        with _plan(w, x[:m], bias) as plan:
            defaults[m] = _ms(plan)
            print(f"  M={m:<6d} {_described(plan.algorithm.as_bytes())} workspace {(plan.algorithm.workspace_size or 0) / 2**20:.1f} MiB")
    print(f"\nN {n}, K {k}, bf16 RELU_BIAS, D = W xᵀ; speed × the default plan at each M; bits: D's first 8 token "
          f"columns against M = 8")
    print(f"  {'candidate':58s} " + " ".join(f"{'M=' + str(m):>20s}" for m in rows))
    for name, (raw, _) in candidates.items():
        cells = []
        reference = None
        for m in [8, *rows]:
            try:
                plan = _plan(w, x[:m], bias, algorithms=[raw])
            except nvblaslt.NvblasltError as error:
                cells.append(f"refused ({type(error).__name__})")
                continue
            with plan:
                d = plan.execute()
                first = d[:, :min(m, 8)].clone()
                if m == 8 and reference is None:
                    reference = first
                    continue
                same = reference is not None and torch.equal(first, reference[:, :first.shape[1]])
                cells.append(f"{defaults[m] / _ms(plan):.3f}× {'same' if same else 'DIFF'}"
                             f" {(plan.algorithm.workspace_size or 0) / 2**20:.1f}M")
        print(f"  {name:58s} " + " ".join(f"{c:>20s}" for c in cells))


def _kernels(w, x, bias, rows: list[int]) -> tuple[dict, dict]:
    """(the default plan's ms at each M, {(id, tile, cluster, option, stages): algorithm bytes}): every
    distinct kernel among the heuristics' 24 best at any M of ``rows``."""
    lib = nvblaslt.library()
    defaults, kernels = {}, {}
    for m in rows:
        with _plan(w, x[:m], bias) as plan:
            defaults[m] = _ms(plan)
            for result in _search._deeper_heuristics(plan._launch)[:24]:
                config = result.algorithm.config()
                key = tuple(config[name] for name in ("ID", "TILE_ID", "STAGES_ID", "CLUSTER_SHAPE_ID", "CUSTOM_OPTION",
                                                      "CTA_SWIZZLING", "INNER_SHAPE_ID"))
                kernels.setdefault(key, bytes(lib.api.cublasLtMatmulAlgo_t.from_buffer_copy(result.algorithm.algo)))
    return defaults, kernels


def classes(n: int, k: int, rows: list[int]) -> None:
    torch.manual_seed(0)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    x = torch.randn(max(rows), k, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    defaults, kernels = _kernels(w, x, bias, rows)
    print(f"\nN {n}, K {k}, bf16 RELU_BIAS: {len(kernels)} distinct kernels from the heuristics at M = {rows}; "
          f"the default plan's ms: " + " ".join(f"M={m} {defaults[m]:.4f}" for m in rows))
    print("  the fastest kernel of each class whose bits equal the class's own at M = 8, speed × the default plan:")
    for splits in (1, 2, 3, 4, 6, 8):
        for scheme in ([0] if splits == 1 else list(SCHEMES)):
            reference, best, same, differ = None, {m: (0.0, "-") for m in rows}, 0, 0
            for raw in kernels.values():
                try:
                    forced = _with_split(raw, splits, scheme)
                except nvblaslt.NvblasltError:  # an attribute value this library refuses to set
                    continue
                for m in [8, *(m for m in rows if m != 8)]:
                    try:
                        plan = _plan(w, x[:m], bias, algorithms=[forced])
                    except nvblaslt.NvblasltError:  # refused for this M (workspace, shape)
                        continue
                    with plan:
                        first = plan.execute()[:, :min(m, 8)].clone()
                        if reference is None:
                            if m == 8:
                                reference = first
                            continue
                        if not torch.equal(first, reference[:, :first.shape[1]]):
                            differ += 1
                            continue
                        same += 1
                        if m in defaults:
                            speed = defaults[m] / _ms(plan)
                            if speed > best[m][0]:
                                best[m] = (speed, _described(forced))
            name = f"split-K {splits}" + (f", {SCHEMES[scheme]}" if splits > 1 else "")
            print(f"  {name:22s} {same} runs with the class's bits, {differ} without")
            for m in rows:
                print(f"    M={m:<6d} {best[m][0]:.3f}×  {best[m][1]}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", default="4096x14336,14336x4096,8192x28672")
    parser.add_argument("--rows", default="1,16,64,256,1024,8192")
    parser.add_argument("--classes", action="store_true",
                        help="per split-K class, the fastest kernel with the class's bits at each M")
    options = parser.parse_args(argv)
    rows = [int(r) for r in options.rows.split(",")]
    print(f"{torch.cuda.get_device_name()}, cuBLASLt {nvblaslt.library().version}")
    for pair in options.pairs.split(","):
        n, k = (int(v) for v in pair.split("x"))
        (classes if options.classes else probe)(n, k, rows)


if __name__ == "__main__":
    main()
