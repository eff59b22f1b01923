"""``python -m nvblaslt bench``: the seed's H200 cases and the cost of one call.

Every figure in a table is measured in this run, side by side, so ratios are comparable.
Large cases: CUDA events, median of ``--repeats`` rounds, every case timed once per round. Per-call cases: wall
clock over bursts of calls, median of interleaved rounds, synchronized at the ends.
Writes JSON (and a PNG bar chart if matplotlib is installed) under ``--out``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import statistics
import sys
import time
from pathlib import Path


def _progress(message: str) -> None:
    print(f"  … {message}", file=sys.stderr, flush=True)


def _interleaved(torch, cases: list, rounds: int) -> list[float]:
    """Median ms of each case, timed round-robin (one run of every case per round) so that clock
    drift as the GPU heats up falls on every case alike."""
    for _, fn, _ in cases:
        fn()
        fn()
    samples = [[] for _ in cases]
    for _ in range(rounds):
        for index, (_, fn, _) in enumerate(cases):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            samples[index].append(start.elapsed_time(stop))
    return [statistics.median(s) for s in samples]


def large_cases(args, torch, results: dict) -> None:
    """The blog's fp16 (M,K)@(K,N) layer, forward and backward, naive against fused, all interleaved."""
    import nvblaslt
    from nvblaslt import Matmul, MatmulEpilog

    m, k, n = args.m, args.k, args.n
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16, generator=gen)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16, generator=gen)
    bias = torch.randn(m, device="cuda", dtype=torch.float16, generator=gen)
    flops = 2.0 * m * n * k
    cases = []  # (name, callable, note)

    def planned(epilog=None, inputs=None, tune=False):
        mm = Matmul(a, b)
        mm.plan(epilog=epilog, epilog_inputs=inputs, preferences={"limit": args.limit})
        note = f"heuristic #0 (id {mm.algorithm.algo_id}, {mm.algorithm.algorithm.tile})"
        if tune:
            timings = mm.autotune(iterations=3, search=tune == "search", remember=False)
            what = "searched" if tune == "search" else "autotuned"
            note = f"{what}: best of {len(timings)} (id {mm.algorithm.algo_id}, {mm.algorithm.algorithm.tile})"
            form = getattr(mm, "bias_gradient_form", None)
            if form:
                note += f"; {form[0]} form ({form[1]:.2f} vs {form[2]:.2f} ms)"
        return mm, note

    _, aux = nvblaslt.matmul(a, b, epilog=MatmulEpilog.RELU_AUX_BIAS, epilog_inputs={"bias": bias})
    _, gaux = nvblaslt.matmul(a, b, epilog=MatmulEpilog.GELU_AUX_BIAS, epilog_inputs={"bias": bias})
    modes = [False] + (["autotune", "search"] if args.autotune else [])
    suffixes = {False: "", "autotune": " [autotuned]", "search": " [searched]"}
    for name, inputs in (("plain matmul", None), ("RELU_BIAS", {"bias": bias}), ("RELU_AUX_BIAS", {"bias": bias}),
                         ("GELU_AUX_BIAS", {"bias": bias}), ("DRELU", {"relu_aux": aux["relu_aux"]}),
                         ("DRELU_BGRAD", {"relu_aux": aux["relu_aux"]}),
                         ("DGELU_BGRAD", {"gelu_aux": gaux["gelu_aux"]})):
        for tune in modes:
            _progress(f"planning {name}{suffixes[tune]}")
            mm, note = planned(None if name == "plain matmul" else MatmulEpilog[name], inputs, tune)
            label = name if name == "plain matmul" else f"fused {name}"
            cases.append((label + suffixes[tune], mm.execute, note))

    def naive_forward():
        y = nvblaslt.matmul(a, b)
        y += bias[:, None]
        return torch.relu_(y)

    mask = (nvblaslt.matmul(a, b) + bias[:, None]) <= 0

    def naive_backward():
        g = nvblaslt.matmul(a, b)
        g.masked_fill_(mask, 0)
        return g, g.sum(dim=1)

    # The bias gradient as a second cuBLASLt call: DRELU, then row sums as a GEMV with a ones vector.
    drelu, _ = planned(MatmulEpilog.DRELU, {"relu_aux": aux["relu_aux"]}, "autotune")
    d_shape = drelu.execute()
    ones = torch.ones(n, 1, device="cuda", dtype=torch.float16)
    row_sums = Matmul(d_shape, ones)
    row_sums.plan()

    def drelu_then_gemv():
        d = drelu.execute()
        row_sums.reset_operands(a=d)
        return d, row_sums.execute()

    cases.append(("DRELU [autotuned] + row-sum GEMV (2 calls)", drelu_then_gemv, "same outputs as DRELU_BGRAD"))
    cases.append(("naive forward (matmul, +bias, relu)", naive_forward, ""))
    cases.append(("naive backward (matmul, mask, bias sum)", naive_backward, ""))
    cases += nvmath_cases(a, b, bias)
    if args.torch:
        cases.append(("torch.matmul", lambda: torch.matmul(a, b), ""))
        cases.append(("torch.addmm + relu", lambda: torch.relu_(torch.addmm(bias[:, None], a, b)), ""))
        cases.append(("torch._addmm_activation", lambda: torch._addmm_activation(bias[:, None], a, b), ""))
        if args.compile:
            _progress("compiling relu(a @ b + bias) with torch.compile")
            compiled = torch.compile(lambda x, y, z: torch.relu(x @ y + z[:, None]))
            for _ in range(3):
                compiled(a, b, bias)
            cases.append(("torch.compile relu(a @ b + bias)", lambda: compiled(a, b, bias), ""))
    _progress(f"timing {len(cases)} cases, {args.repeats} interleaved rounds")
    medians = _interleaved(torch, cases, args.repeats)
    rows = [{"case": name, "ms": ms, "tflops": flops / ms / 1e9, "note": note}
            for (name, _, note), ms in zip(cases, medians)]
    results["large"] = {"shape": [m, k, n], "dtype": "float16", "rounds": args.repeats, "rows": rows}


def nvmath_cases(a, b, bias) -> list:
    """nvmath-python's Matmul on the same operands (planned, and autotuned), when it is installed."""
    try:
        import nvmath.linalg.advanced as nvmath_advanced
    except ImportError:
        _progress("nvmath-python not installed: no nvmath rows")
        return []
    epilog = nvmath_advanced.MatmulEpilog
    # nvmath's own mask: its DRELU_BGRAD wants the dtype its RELU_AUX_BIAS makes (uint8 in 1.0)
    _, nvmath_aux = nvmath_advanced.matmul(a, b, epilog=epilog.RELU_AUX_BIAS, epilog_inputs={"bias": bias})
    cases = []
    for name, inputs in (("plain", None), ("RELU_BIAS", {"bias": bias}), ("RELU_AUX_BIAS", {"bias": bias}),
                         ("DRELU_BGRAD", {"relu_aux": nvmath_aux["relu_aux"]})):
        for tune in (False, True):
            _progress(f"planning nvmath {name}" + (" [autotuned]" if tune else ""))
            mm = nvmath_advanced.Matmul(a, b)
            mm.plan(epilog=None if name == "plain" else epilog[name], epilog_inputs=inputs)
            if tune:
                mm.autotune(iterations=3)
            cases.append((f"nvmath {name}" + (" [autotuned]" if tune else ""), mm.execute, ""))
    return cases


def _burst(fn, calls: int) -> float:
    """Microseconds per call over a burst (the device drained before and after)."""
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def per_call_cases(args, torch, results: dict) -> None:
    """The blog's small layer (weights 100×784, x 784×256, fp32, RELU_BIAS): host cost per call."""
    import nvblaslt
    from nvblaslt import Matmul, MatmulEpilog

    gen = torch.Generator(device="cuda").manual_seed(1)
    weights = torch.randn(100, 784, device="cuda", generator=gen)
    x = torch.randn(784, 256, device="cuda", generator=gen)
    bias = torch.randn(100, device="cuda", generator=gen)
    mm = Matmul(weights, x)
    mm.plan(epilog=MatmulEpilog.RELU_BIAS, epilog_inputs={"bias": bias})
    out = torch.empty(256, 100, device="cuda").t()
    stream = torch.cuda.current_stream().cuda_stream

    # The floor of any ctypes design: cublasLtMatmul with every argument prebuilt.
    lt_matmul = mm._lib.cublasLtMatmul
    bare_args = (*mm._args_head, ctypes.c_void_p(out.data_ptr()), mm._c_layout, ctypes.c_void_p(out.data_ptr()),
                 mm._d_layout, *mm._args_tail, ctypes.c_void_p(stream))
    cases = {
        "bare ctypes cublasLtMatmul": lambda: lt_matmul(*bare_args),
        "Matmul.execute(out=...)": lambda: mm.execute(out=out),
        "Matmul.execute()": mm.execute,
        "matmul() (cached plan)": lambda: nvblaslt.matmul(weights, x, epilog=MatmulEpilog.RELU_BIAS,
                                                          epilog_inputs={"bias": bias}),
    }
    if args.torch:
        cases["torch._addmm_activation"] = lambda: torch._addmm_activation(bias[:, None], weights, x)
        cases["torch.addmm + relu"] = lambda: torch.relu_(torch.addmm(bias[:, None], weights, x))
    try:
        import nvmath.linalg.advanced as nvmath_advanced

        nv = nvmath_advanced.Matmul(weights, x)
        nv.plan(epilog=nvmath_advanced.MatmulEpilog.RELU_BIAS, epilog_inputs={"bias": bias})
        cases["nvmath Matmul.execute()"] = nv.execute
        nv_epilog = nvmath_advanced.MatmulEpilog.RELU_BIAS
        slow_cases = {"nvmath matmul()": lambda: nvmath_advanced.matmul(weights, x, epilog=nv_epilog,
                                                                         epilog_inputs={"bias": bias})}
    except ImportError:
        slow_cases = {}
    for fn in cases.values():  # warm-up: plans, caches, first launches
        for _ in range(50):
            fn()
    samples = {name: [] for name in cases}
    for _ in range(args.rounds):  # interleaved, so drift on a noisy machine hits every case alike
        for name, fn in cases.items():
            samples[name].append(_burst(fn, args.calls))
    for name, fn in slow_cases.items():  # re-plans every call: fewer calls, same rounds
        fn()
        samples[name] = [_burst(fn, max(1, args.calls // 20)) for _ in range(args.rounds)]
    floor = statistics.median(samples["bare ctypes cublasLtMatmul"])
    rows = []
    for name, values in samples.items():
        us = statistics.median(values)
        rows.append({"case": name, "us_per_call": us, "ratio_to_bare": us / floor,
                     "spread_us": [min(values), max(values)]})
        _progress(f"{name}: {us:.2f} µs/call")
    results["per_call"] = {"problem": "weights 100x784 @ x 784x256 fp32, RELU_BIAS", "rows": rows,
                           "breakdown": breakdown(torch, mm, weights, x, bias, stream)}


def breakdown(torch, mm, weights, x, bias, stream) -> list[dict]:
    """Where the function form's microseconds go: each host-side step alone, in a loop."""
    from nvblaslt import _matmul, _operands, _streams
    from nvblaslt._epilogs import MatmulEpilog

    cache = _matmul._local.plans
    settings = (MatmulEpilog.RELU_BIAS, None, None, True, _matmul._DEFAULT_PREFERENCES)
    steps = {
        "fingerprint of one tensor": lambda: _operands.fingerprint(weights, "torch"),
        "framework's current stream": lambda: _streams.framework_stream_of("torch", weights),
        "plan lookup (3 fingerprints, key, dict)": lambda: _matmul._fast_lookup(
            "torch", cache, weights, x, None, {"bias": bias}, settings),
        "rebind pointers and scalars": lambda: mm._rebind([weights.data_ptr(), x.data_ptr(), None,
                                                           bias.data_ptr()], ("bias",), 1.0, 0.0),
        "allocate the result (torch pool)": lambda: mm._alloc_d(stream, stream),
    }
    rows = []
    for name, fn in steps.items():
        for _ in range(1000):
            fn()
        start = time.perf_counter()
        for _ in range(20000):
            fn()
        rows.append({"step": name, "us": (time.perf_counter() - start) / 20000 * 1e6})
        _progress(f"{name}: {rows[-1]['us']:.2f} µs")
    torch.cuda.synchronize()
    return rows


def import_time(results: dict) -> None:
    import subprocess

    code = "import time; t = time.perf_counter(); import nvblaslt; print(time.perf_counter() - t)"
    runs = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 check=True).stdout) for _ in range(5)]
    results["import_s"] = statistics.median(runs)


def machine(torch) -> dict:
    import nvblaslt
    from nvblaslt import _cuda

    lib = nvblaslt.library()
    props = _cuda.device_properties(0)
    driver = _cuda.driver_version()
    return {"gpu": props.name.decode(), "driver_cuda": f"{driver // 1000}.{driver % 1000 // 10}",
            "cublaslt": ".".join(map(str, lib.version_tuple)), "torch": torch.__version__,
            "python": platform.python_version()}


def print_tables(results: dict) -> None:
    print(f"\nnvblaslt bench on {results['machine']['gpu']} (CUDA driver {results['machine']['driver_cuda']}, "
          f"cuBLASLt {results['machine']['cublaslt']}, torch {results['machine']['torch']})")
    if "large" in results:
        m, k, n = results["large"]["shape"]
        plain = next(r["ms"] for r in results["large"]["rows"] if r["case"] == "plain matmul")
        print(f"\nfp16 ({m},{k}) @ ({k},{n}); ratio to plain matmul (heuristic #0)")
        print(f"{'case':42s} {'ms':>8s} {'TFLOP/s':>8s} {'ratio':>6s}  note")
        for r in results["large"]["rows"]:
            print(f"{r['case']:42s} {r['ms']:8.2f} {r['tflops']:8.1f} {r['ms'] / plain:6.3f}  {r['note']}")
    if "per_call" in results:
        print(f"\ncost per call: {results['per_call']['problem']}")
        print(f"{'case':32s} {'µs/call':>8s} {'× bare':>7s}")
        for r in results["per_call"]["rows"]:
            print(f"{r['case']:32s} {r['us_per_call']:8.2f} {r['ratio_to_bare']:7.2f}")
        print("where matmul()'s host time goes (each step alone):")
        for r in results["per_call"]["breakdown"]:
            print(f"  {r['step']:42s} {r['us']:6.2f} µs")
    if "import_s" in results:
        print(f"\nimport nvblaslt: {results['import_s'] * 1000:.0f} ms (median of 5 fresh interpreters)")


def chart(results: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = results.get("large", {}).get("rows", [])
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(rows) + 1))
    ax.barh([r["case"] for r in rows][::-1], [r["ms"] for r in rows][::-1])
    ax.set_xlabel("ms (median)")
    ax.set_title(f"nvblaslt on {results['machine']['gpu']}: fp16 {tuple(results['large']['shape'])}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nvblaslt bench", description=__doc__)
    parser.add_argument("--only", choices=["large", "per-call", "import"], action="append")
    parser.add_argument("--m", type=int, default=65536)
    parser.add_argument("--k", type=int, default=16384)
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--limit", type=int, default=16, help="algorithms the heuristics return (autotune)")
    parser.add_argument("--no-autotune", dest="autotune", action="store_false")
    parser.add_argument("--no-torch", dest="torch", action="store_false", help="skip the PyTorch anchors")
    parser.add_argument("--compile", action="store_true", help="include torch.compile (slow to compile)")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("bench: needs PyTorch for timing events and the anchors", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench: needs an NVIDIA GPU", file=sys.stderr)
        return 2
    only = set(args.only or ["large", "per-call", "import"])
    results = {"machine": machine(torch)}
    if "per-call" in only:
        per_call_cases(args, torch, results)
    if "large" in only:
        large_cases(args, torch, results)
    if "import" in only:
        import_time(results)
    print_tables(results)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(results, indent=2))
    chart(results, args.out / "bench.png")
    print(f"\nwrote {args.out / 'bench.json'}")
    return 0
