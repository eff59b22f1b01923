"""``nvblaslt bench`` (``python -m nvblaslt bench``): nvblaslt beside PyTorch and nvmath-python, on the GPU.

Sections (``--sections``, all by default):
  percall  the blog's small layer (CuPy fp32, 100×784 @ 784×256, RELU_BIAS): host time per call,
           against a bare ctypes cublasLtMatmul with every argument prebuilt as ctypes passes it
           (``from_param``) and no argtypes; the same call with c_void_p objects, and through the
           generated binding with argtypes, are rows of their own
  layer    transformer-sized layers (bf16; 1, 16, 256, 8192 tokens; 4096→4096 and 4096→14336;
           RELU_BIAS, GELU_BIAS): event time per call of matmul() as users call it (fresh ``x.T``
           views, no ``out=``) and Matmul.execute(), against torch's fused ``_addmm_activation``
  graph    decode layers under CUDA-graph replay (bf16; 1, 16, 256 tokens): GPU time per layer of a
           graph of nvblaslt.torch.linear against one of nn.functional.linear + the activation
  seed     the seed's fp16 shape (65536×16384×8192): fused epilogs, heuristic #0 and autotuned,
           against naive, torch and nvmath-python
  search   at the seed shape, per epilog: autotune(search=True) against autotune(), re-timed in the
           same rounds, the search's time and confidence, and a second process that recalls the
           remembered pick (no search) and must get the same kernel
  mlp      nvblaslt.bench.mlp (a PyTorch MLP training step; also python -m nvblaslt.bench.mlp)
  import   ``import nvblaslt`` in fresh interpreters

Every table is measured in one run, its rows in interleaved rounds (every case once per round,
each round in a fresh order, median), so clock drift as the GPU heats falls on every row alike.
``--quick`` trims rounds and epilogs to finish everything in about 3 minutes on an H200. JSON and
a PNG chart (matplotlib, optional) go under ``--out``; the compact tables are printed last. The
search section uses its own tuning cache under ``--out`` (``NVBLASLT_CACHE_DIR``), emptied at the
start, so earlier runs cannot leak into the autotuned rows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
import traceback
from pathlib import Path

from . import graph, import_time, layer, mlp, percall, report, search, seed
from .common import STARTED, free_memory, progress

# the order they run in, whatever the option's: the search's tuning cache must not reach the others
SECTIONS = {"percall": percall.section, "layer": layer.section, "graph": graph.section, "seed": seed.section,
            "search": search.section, "mlp": mlp.section, "import": import_time.section}


def arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="nvblaslt bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated, from {','.join(SECTIONS)} (default: all)")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and epilogs: about 3 minutes on an H200")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="where bench.json and bench.png go")
    parser.add_argument("--m", type=int, default=65536, help="seed shape: (M, K) @ (K, N)")
    parser.add_argument("--k", type=int, default=16384)
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--repeats", type=int, help="interleaved rounds at the seed shape (default 16, quick 5)")
    parser.add_argument("--search-rounds", type=int,
                        help="interleaved rounds re-timing the search section's plans (default 24, quick 8)")
    parser.add_argument("--layer-rounds", type=int, help="interleaved rounds per layer (default 21, quick 7)")
    parser.add_argument("--calls", type=int, help="calls per burst, per-call section (default 2000, quick 500)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds of the per-call and import sections (default 7; quick 5 and 3)")
    parser.add_argument("--limit", type=int, default=8, help="algorithms the heuristics return (autotune times them)")
    parser.add_argument("--no-torch", dest="torch", action="store_false", help="no torch rows at the seed shape")
    parser.add_argument("--compile", action="store_true", help="include torch.compile at the seed shape (slow)")
    parser.add_argument("--recall-check", help=argparse.SUPPRESS)  # the search section's second process
    args = parser.parse_args(argv)
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        parser.error(f"--sections: unknown {sorted(unknown)}; known: {','.join(SECTIONS)}")
    quick = args.quick
    args.repeats = args.repeats or (5 if quick else 16)
    args.search_rounds = args.search_rounds or (8 if quick else 24)
    args.layer_rounds = args.layer_rounds or (7 if quick else 21)
    args.calls = args.calls or (500 if quick else 2000)
    args.rounds = args.rounds or (5 if quick else 7)
    args.seed_epilogs = seed.QUICK_SEED_EPILOGS if quick else seed.SEED_EPILOGS
    args.search_epilogs = search.QUICK_SEARCH_EPILOGS if quick else search.SEARCH_EPILOGS
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(sys.argv[1:] if argv is None else argv)
    if args.recall_check:
        return search.recall_check(json.loads(args.recall_check))
    needs_gpu = any(name not in import_time.WITHOUT_GPU for name in args.sections)
    try:
        import torch
    except ImportError:
        torch = None  # type: ignore[assignment]  # the import section runs without it
        if needs_gpu:
            print("bench: needs PyTorch (timing events and the comparisons)", file=sys.stderr)
            return 2
    args.gpu = torch is not None and torch.cuda.is_available()
    if needs_gpu and not args.gpu:
        print(f"bench: needs an NVIDIA GPU (--sections {','.join(import_time.WITHOUT_GPU)} runs without one)",
              file=sys.stderr)
        return 2
    handler = logging.StreamHandler(sys.stderr)  # nvblaslt's decisions and search progress
    handler.setFormatter(logging.Formatter("           nvblaslt: %(message)s"))
    logger = logging.getLogger("nvblaslt")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    args.out.mkdir(parents=True, exist_ok=True)
    machine = report.machine(torch) if args.gpu else import_time.machine_without_gpu(torch)
    results: dict = {"machine": machine, "quick": args.quick, "sections": args.sections, "errors": {}}
    for name in SECTIONS:
        if name not in args.sections:
            continue
        progress(f"section {name}")
        started = time.perf_counter()
        try:
            SECTIONS[name](args, torch, results)
        except Exception as error:  # one failed section must not lose the others' figures
            traceback.print_exc()
            results["errors"][name] = f"{type(error).__name__}: {error}"
            with contextlib.suppress(Exception):
                free_memory(torch)
        progress(f"section {name} done in {time.perf_counter() - started:.0f} s")
    results["seconds"] = time.perf_counter() - STARTED
    report.write(results, args.out)
    return 1 if results["errors"] else 0
