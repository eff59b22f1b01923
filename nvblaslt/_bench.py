"""``nvblaslt bench`` (``python -m nvblaslt bench``): nvblaslt beside PyTorch and nvmath-python, on the GPU.

Sections (``--sections``, all by default):
  percall  the blog's small layer (CuPy fp32, 100×784 @ 784×256, RELU_BIAS): host time per call,
           against a bare ctypes cublasLtMatmul with every argument prebuilt as ctypes passes it
           (``from_param``) and no argtypes; the same call with c_void_p objects, and through the
           generated binding with argtypes, are rows of their own
  layer    transformer-sized layers (bf16; 16, 256, 8192 tokens; 4096→4096 and 4096→14336;
           RELU_BIAS, GELU_BIAS): event time per call of matmul() as users call it (fresh ``x.T``
           views, no ``out=``) and Matmul.execute(), against torch's fused ``_addmm_activation``
  seed     the seed's fp16 shape (65536×16384×8192): fused epilogs, heuristic #0 and autotuned,
           against naive, torch and nvmath-python
  search   at the seed shape, per epilog: autotune(search=True) against autotune(), re-timed in the
           same rounds, the search's time and confidence, and a second process that recalls the
           remembered pick (no search) and must get the same kernel
  mlp      nvblaslt._bench_mlp (a PyTorch MLP training step), when that module exists
  import   ``import nvblaslt`` in fresh interpreters

Every table is measured in one run, its rows in interleaved rounds (every case once per round,
median), so clock drift as the GPU heats falls on every row alike. ``--quick`` trims rounds and
epilogs to finish everything in about 3 minutes on an H200. JSON and a PNG chart (matplotlib,
optional) go under ``--out``; the compact tables are printed last. The search section uses its own
tuning cache under ``--out`` (``NVBLASLT_CACHE_DIR``), emptied at the start, so earlier runs cannot
leak into the autotuned rows.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import importlib
import importlib.util
import json
import logging
import math
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

SECTIONS = ("percall", "layer", "seed", "search", "mlp", "import")
SEED_EPILOGS = ("DEFAULT", "RELU_BIAS", "RELU_AUX_BIAS", "GELU_AUX_BIAS", "DRELU", "DRELU_BGRAD", "DGELU_BGRAD")
QUICK_SEED_EPILOGS = ("DEFAULT", "RELU_BIAS", "RELU_AUX_BIAS", "DRELU_BGRAD")
SEARCH_EPILOGS = ("DEFAULT", "RELU_BIAS", "RELU_AUX_BIAS", "GELU_AUX_BIAS", "DRELU_BGRAD", "DGELU_BGRAD")
QUICK_SEARCH_EPILOGS = ("RELU_BIAS", "RELU_AUX_BIAS", "DRELU_BGRAD")
LAYER_TOKENS = (16, 256, 8192)
LAYER_WIDTHS = ((4096, 4096), (4096, 14336))
LAYER_EPILOGS = ("RELU_BIAS", "GELU_BIAS")

_started = time.perf_counter()


def _progress(message: str) -> None:
    print(f"[{time.perf_counter() - _started:7.1f} s] {message}", file=sys.stderr, flush=True)


def _nvmath():
    """nvmath.linalg.advanced if installed (an optional comparison), else None."""
    try:
        import nvmath.linalg.advanced as advanced
    except ImportError:
        return None
    return advanced


# ---- timing -------------------------------------------------------------------------------------------
def _event_rounds(torch, cases: list, rounds: int, calls: int = 1, shuffle: bool = False) -> list[list[float]]:
    """Per-call ms of each ``(name, fn)`` case: CUDA events around a burst of ``calls`` calls, every
    case once per round (interleaved), after two warm-up calls each. ``shuffle``: each round runs
    the cases in another order (seeded), so that no case always runs after the same neighbour or in
    the same place of the round (the same point of the GPU's power and clock cycle)."""
    for _, fn in cases:
        fn()
        fn()
    torch.cuda.synchronize()
    samples: list[list[float]] = [[] for _ in cases]
    shuffler = random.Random(0)
    for _ in range(rounds):
        order = list(range(len(cases)))
        if shuffle:
            shuffler.shuffle(order)
        for index in order:
            fn = cases[index][1]
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            stop.record()
            stop.synchronize()
            samples[index].append(start.elapsed_time(stop) / calls)
    return samples


def _synchronize() -> None:
    from cuda.bindings import runtime as cudart

    cudart.cudaDeviceSynchronize()


def _host_burst(fn, calls: int) -> float:
    """Microseconds per call over a burst (the device drained before and after)."""
    _synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    _synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def _free_memory(torch) -> None:
    import gc

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


# ---- percall: the blog's small layer ------------------------------------------------------------------
def _as_passed(arguments) -> tuple:
    """The arguments as ctypes passes them with no conversion (from_param objects): the fastest form of
    each. A c_void_p or c_size_t instance is converted into one on every call."""
    return tuple(type(x).from_param(x.value) if isinstance(x, (ctypes.c_void_p, ctypes.c_size_t)) else x
                 for x in arguments)


def _bare_call(nvblaslt, weights_ptr: int, x_ptr: int, bias_ptr: int, out_ptr: int, workspace, stream: int):
    """cublasLtMatmul for D = relu(W @ x + bias), every argument a prebuilt ctypes object and the
    function without argtypes: the floor of any ctypes design. W (100×784) and x (784×256) are
    row-major, so cuBLASLt reads each as the transpose of a column-major matrix; D (100×256) is
    column-major and the bias runs along its rows."""
    from nvblaslt import Handle, MatmulDesc, MatmulPreference, MatrixLayout, heuristics
    from nvblaslt._plan import _raw_function

    lib = nvblaslt.library()
    api = lib.api
    desc = MatmulDesc(api.CUBLAS_COMPUTE_32F, api.CUDA_R_32F)
    desc.set("TRANSA", api.CUBLAS_OP_T)
    desc.set("TRANSB", api.CUBLAS_OP_T)
    desc.set("EPILOGUE", api.CUBLASLT_EPILOGUE_RELU_BIAS)
    desc.set("BIAS_POINTER", bias_ptr)
    a = MatrixLayout(api.CUDA_R_32F, 784, 100, 784)  # W^T as stored, column-major
    b = MatrixLayout(api.CUDA_R_32F, 256, 784, 256)  # x^T as stored, column-major
    d = MatrixLayout(api.CUDA_R_32F, 100, 256, 100)
    preference = MatmulPreference(max_workspace_bytes=workspace[1])
    handle = Handle.for_device(0)
    algorithm = heuristics(handle, desc, a, b, d, d, preference, count=1)[0]
    alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
    args = (ctypes.c_void_p(handle.handle), ctypes.c_void_p(desc.handle), ctypes.byref(alpha),
            ctypes.c_void_p(weights_ptr), ctypes.c_void_p(a.handle), ctypes.c_void_p(x_ptr), ctypes.c_void_p(b.handle),
            ctypes.byref(beta), ctypes.c_void_p(out_ptr), ctypes.c_void_p(d.handle), ctypes.c_void_p(out_ptr),
            ctypes.c_void_p(d.handle), ctypes.byref(algorithm.algorithm.algo),
            ctypes.c_void_p(workspace[0] if algorithm.workspace_size else None),
            ctypes.c_size_t(workspace[1] if algorithm.workspace_size else 0), ctypes.c_void_p(stream))
    raw, checked = _raw_function(lib.cublasLtMatmul), lib.cublasLtMatmul
    keep = (desc, a, b, d, preference, alpha, beta, algorithm)  # the C objects must outlive the calls
    passed = _as_passed(args)

    def bare():  # no argtypes or status check, every argument in the form ctypes passes as it is
        return raw(*passed)

    def bare_objects():  # ctypes objects: each c_void_p converted per call
        return raw(*args)

    def bare_checked():  # the generated binding: argtypes and a status check
        return checked(*args)
    bare.keep = bare_objects.keep = bare_checked.keep = keep  # type: ignore[attr-defined]
    return bare, bare_objects, bare_checked


def percall_section(args, torch, results: dict) -> None:
    import nvblaslt
    from nvblaslt import Matmul, MatmulEpilog, _operands

    try:
        import cupy as xp

        package = "cupy"
    except ImportError:
        xp, package = None, "torch"
        _progress("percall: CuPy not installed; nvblaslt runs on torch tensors instead")
    if xp is not None:
        generator = xp.random.default_rng(1)
        weights = generator.standard_normal((100, 784), dtype=xp.float32)
        x = generator.standard_normal((784, 256), dtype=xp.float32)
        bias = generator.standard_normal(100, dtype=xp.float32)
        pointer = lambda array: array.data.ptr  # noqa: E731
        stream = xp.cuda.get_current_stream().ptr
        workspace_array = xp.empty(32 << 20, dtype=xp.uint8)
        workspace = (workspace_array.data.ptr, workspace_array.nbytes)
        out = xp.empty((100, 256), dtype=xp.float32, order="F")
    else:
        generator = torch.Generator(device="cuda").manual_seed(1)
        weights = torch.randn(100, 784, device="cuda", generator=generator)
        x = torch.randn(784, 256, device="cuda", generator=generator)
        bias = torch.randn(100, device="cuda", generator=generator)
        pointer = lambda tensor: tensor.data_ptr()  # noqa: E731
        stream = torch.cuda.current_stream().cuda_stream
        workspace_array = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
        workspace = (workspace_array.data_ptr(), workspace_array.numel())
        out = torch.empty(256, 100, device="cuda").t()
    # torch's own layer in its fused layout: x^T (256×784) @ W^T + bias along the columns
    tw = torch.randn(100, 784, device="cuda")
    tx = torch.randn(256, 784, device="cuda")
    tb = torch.randn(100, device="cuda")

    epilog = MatmulEpilog.RELU_BIAS
    mm = Matmul(weights, x)
    mm.plan(epilog=epilog, epilog_inputs={"bias": bias})
    planned_out = mm.execute()
    bare, bare_objects, bare_checked = _bare_call(nvblaslt, pointer(weights), pointer(x), pointer(bias), pointer(out), workspace,
                                    stream)
    bare()
    expected = nvblaslt.matmul(weights, x, epilog=epilog, epilog_inputs={"bias": bias})
    close = _max_relative(torch, out, expected)
    cases = {
        "bare ctypes cublasLtMatmul": bare,
        "bare, c_void_p objects": bare_objects,
        "bare, through the binding (argtypes)": bare_checked,
        "Matmul.execute(out=)": lambda: mm.execute(out=planned_out),
        "Matmul.execute()": mm.execute,
        "matmul() (cached plan)": lambda: nvblaslt.matmul(weights, x, epilog=epilog, epilog_inputs={"bias": bias}),
        "torch _addmm_activation": lambda: torch._addmm_activation(tb, tx, tw.t()),
    }
    # pieces of execute() and matmul() that no Python form can skip, for where the time goes
    read_layouts, allocate = _operands.layout_reader(type(weights)), mm._alloc_d
    if read_layouts is not None and allocate is not None:
        cases["  piece: result allocation"] = functools.partial(allocate, stream, stream)
        cases["  piece: layout read of W, x, bias"] = functools.partial(read_layouts, (weights, x, None, bias))
    slow = {}
    advanced = _nvmath()
    if advanced is not None:
        nv = advanced.Matmul(weights, x)
        nv.plan(epilog=advanced.MatmulEpilog.RELU_BIAS, epilog_inputs={"bias": bias})
        cases["nvmath Matmul.execute()"] = nv.execute
        slow["nvmath matmul()"] = lambda: advanced.matmul(weights, x, epilog=advanced.MatmulEpilog.RELU_BIAS,
                                                          epilog_inputs={"bias": bias})
    calls, rounds = args.calls, args.rounds
    _progress(f"percall: {len(cases) + len(slow)} cases, {rounds} interleaved rounds of {calls}-call bursts")
    for fn in cases.values():  # warm-up: plans, caches, first launches
        for _ in range(50):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            samples[name].append(_host_burst(fn, calls))
    for name, fn in slow.items():  # plans every call: fewer calls per burst, same rounds
        fn()
        samples[name] = [_host_burst(fn, max(1, calls // 20)) for _ in range(rounds)]
    floor = statistics.median(samples["bare ctypes cublasLtMatmul"])
    # the floor's own GPU time (the sleep kernel runs on torch's stream, which must be the bare call's)
    gpu_us = _queued_gpu_us(torch, bare, 200) if stream == torch.cuda.current_stream().cuda_stream else None
    rows = [{"case": name, "us_per_call": statistics.median(v), "ratio": statistics.median(v) / floor,
             "spread_us": [min(v), max(v)]} for name, v in samples.items()]
    results["percall"] = {"problem": f"{package} fp32 W 100x784 @ x 784x256, RELU_BIAS", "package": package,
                          "bare_matches_matmul": close, "rows": rows, "bare_gpu_us": gpu_us,
                          "profile": _profile(lambda: nvblaslt.matmul(weights, x, epilog=epilog,
                                                                      epilog_inputs={"bias": bias}), calls)}


def _max_relative(torch, got, expected) -> float:
    got, expected = torch.as_tensor(got, device="cuda").float(), torch.as_tensor(expected, device="cuda").float()
    return float((got - expected).abs().max() / expected.abs().max().clamp_min(1e-30))


def _profile(fn, calls: int, top: int = 8) -> list[dict]:
    """Where ``fn``'s host time goes: cProfile's own time per function, µs per call (profiling
    inflates every figure alike; read them as shares)."""
    import cProfile
    import pstats

    for _ in range(100):
        fn()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = sorted(((tottime, f"{Path(file).name}:{line} {name}") for (file, line, name), (_, _, tottime, _, _)
                   in stats.items()), reverse=True)[:top]
    return [{"function": where, "us": seconds / calls * 1e6} for seconds, where in rows]


# ---- layer: transformer-sized layers, as users call them ---------------------------------------------
def layer_section(args, torch, results: dict) -> None:
    import nvblaslt
    from nvblaslt import Matmul, MatmulEpilog

    advanced = _nvmath()
    rows = []
    configs = [(t, w, e) for t in LAYER_TOKENS for w in LAYER_WIDTHS for e in LAYER_EPILOGS]
    generator = torch.Generator(device="cuda").manual_seed(2)
    for index, (tokens, (d_in, d_out), name) in enumerate(configs):
        _progress(f"layer {index + 1}/{len(configs)}: {tokens} tokens, {d_in}->{d_out}, {name}")
        w = torch.randn(d_out, d_in, device="cuda", dtype=torch.bfloat16, generator=generator) / d_in ** 0.5
        x = torch.randn(tokens, d_in, device="cuda", dtype=torch.bfloat16, generator=generator)
        b = torch.randn(d_out, device="cuda", dtype=torch.bfloat16, generator=generator)
        epilog, gelu = MatmulEpilog[name], name.startswith("GELU")
        mm = Matmul(w, x.T)
        mm.plan(epilog=epilog, epilog_inputs={"bias": b})
        cases = [("torch _addmm_activation", lambda: torch._addmm_activation(b, x, w.t(), use_gelu=gelu)),
                 ("nvblaslt matmul()", lambda: nvblaslt.matmul(w, x.T, epilog=epilog, epilog_inputs={"bias": b})),
                 ("nvblaslt Matmul.execute()", mm.execute)]
        if advanced is not None:
            nv = advanced.Matmul(w, x.T)
            nv.plan(epilog=advanced.MatmulEpilog[name], epilog_inputs={"bias": b})
            cases.append(("nvmath Matmul.execute()", nv.execute))
        reference = cases[0][1]()
        error = _max_relative(torch, cases[1][1]().T, reference)
        if error > 3e-2:
            _progress(f"  matmul() differs from torch by {error:.2e} (relative)")
        # bursts of about 5 ms (2 in --quick) so that the event pair's own cost does not count
        estimate = statistics.median(_event_rounds(torch, cases[:1], 3, 5)[0])
        calls = max(3, min(200, round((2.0 if args.quick else 5.0) / max(estimate, 1e-3))))
        samples = _event_rounds(torch, cases, args.layer_rounds, calls)
        torch_us = statistics.median(samples[0]) * 1000
        for (case, _), values in zip(cases, samples):
            us = statistics.median(values) * 1000
            rows.append({"tokens": tokens, "in": d_in, "out": d_out, "epilog": name, "case": case, "us": us,
                         "ratio": us / torch_us, "calls_per_sample": calls, "max_relative_error": error})
        if (tokens, (d_in, d_out), name) == configs[0]:
            results["breakdown"] = _breakdown(args, torch, w, x, b, mm, epilog)
        del mm, cases
    _free_memory(torch)
    results["layer"] = {"dtype": "bfloat16", "rounds": args.layer_rounds, "rows": rows,
                        "baseline": "torch _addmm_activation"}


def _breakdown(args, torch, w, x, b, mm, epilog) -> dict:
    """Where matmul()'s host time goes on the smallest layer: the whole calls beside the pieces no
    function form can skip (cuBLASLt's own launch, the result's allocation, reading the arrays'
    layouts, the caller's ``x.T``), timed in the same interleaved rounds."""
    import nvblaslt
    from nvblaslt import _operands

    read = _operands.layout_reader(type(w))
    stream = torch.cuda.current_stream().cuda_stream
    out = mm.execute()
    mm._d_argument.value, mm._stream_argument.value = out.data_ptr(), stream
    launch, passed = mm._matmul, _as_passed(mm._arguments)
    refused = (ctypes.c_void_p.from_param(None),) + passed[1:]  # no handle: cuBLASLt returns at its entry check
    xt = x.T
    pieces = {
        "torch _addmm_activation(b, x, w.t())": lambda: torch._addmm_activation(b, x, w.t()),
        "nvblaslt matmul(w, x.T, …)": lambda: nvblaslt.matmul(w, x.T, epilog=epilog, epilog_inputs={"bias": b}),
        "nvblaslt Matmul.execute()": mm.execute,
        "cublasLtMatmul alone (bare, the plan's arguments)": lambda: launch(*passed),
        "result allocation (torch new_empty_strided)": lambda: mm._alloc_d(stream, stream),
        "layout read of w, x.T and bias": lambda: read((w, xt, None, b)),
        "x.T (the caller's view)": lambda: x.T,
        "w.t() (inside torch's call)": lambda: w.t(),
        "ctypes call + cuBLASLt's entry check (NULL handle)": lambda: launch(*refused),
    }
    calls, rounds = max(200, args.calls // 4), args.rounds
    for fn in pieces.values():
        for _ in range(20):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in pieces}
    shuffler = random.Random(1)
    for _ in range(rounds):
        names = list(pieces)
        shuffler.shuffle(names)
        for name in names:
            samples[name].append(_host_burst(pieces[name], calls))
    us = {name: statistics.median(v) for name, v in samples.items()}
    keys = list(pieces)
    floor = us[keys[3]] + us[keys[4]] + us[keys[5]] + us[keys[6]]
    gpu = _queued_gpu_us(torch, lambda: launch(*passed), 200)  # a queue of 400 kernels never fills
    if gpu is not None:
        us["the launch's kernels on the GPU (queued behind a sleep)"] = gpu
    return {"problem": f"bf16 {x.shape[0]} tokens {w.shape[1]}->{w.shape[0]} {epilog.name}", "calls": calls,
            "rounds": rounds, "us": us, "floor_us": floor, "torch_us": us[keys[0]]}


def _queued_gpu_us(torch, launch, calls: int) -> float | None:
    """GPU µs per launch with no host time in it: the launches are queued behind a sleep kernel long
    enough that the GPU reaches them only once all are queued. None without torch's sleep kernel."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return None
    values = []
    for _ in range(5):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        sleep(int(4e7))  # tens of ms at any clock: longer than queueing the launches takes
        start.record()
        for _ in range(calls):
            launch()
        stop.record()
        stop.synchronize()
        values.append(start.elapsed_time(stop) / calls * 1000)
    return statistics.median(values)


# ---- seed: the seed's shape, fused against naive, torch and nvmath ---------------------------------------
def _seed_operands(torch, args):
    m, k, n = args.m, args.k, args.n
    generator = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16, generator=generator)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16, generator=generator)
    bias = torch.randn(m, device="cuda", dtype=torch.float16, generator=generator)
    return a, b, bias


def _epilog_inputs(nvblaslt, a, b, bias) -> dict:
    """Each seed epilog's inputs, the aux arrays made by the forward epilogs."""
    from nvblaslt import MatmulEpilog

    _, aux = nvblaslt.matmul(a, b, epilog=MatmulEpilog.RELU_AUX_BIAS, epilog_inputs={"bias": bias})
    _, gaux = nvblaslt.matmul(a, b, epilog=MatmulEpilog.GELU_AUX_BIAS, epilog_inputs={"bias": bias})
    relu, gelu = {"relu_aux": aux["relu_aux"]}, {"gelu_aux": gaux["gelu_aux"]}
    return {"DEFAULT": None, "RELU_BIAS": {"bias": bias}, "RELU_AUX_BIAS": {"bias": bias},
            "GELU_AUX_BIAS": {"bias": bias}, "DRELU": relu, "DRELU_BGRAD": relu, "DGELU_BGRAD": gelu}


def _planned(a, b, name: str, inputs, limit: int):
    from nvblaslt import Matmul, MatmulEpilog

    mm = Matmul(a, b)
    mm.plan(epilog=MatmulEpilog[name], epilog_inputs=inputs, preferences={"limit": limit})
    return mm


def _kernel(mm) -> str:
    algorithm = mm.algorithm.algorithm
    return f"id {algorithm.id} {algorithm.tile}"


def seed_section(args, torch, results: dict) -> None:
    import nvblaslt
    from nvblaslt import Matmul

    a, b, bias = _seed_operands(torch, args)
    flops = 2.0 * args.m * args.n * args.k
    inputs = _epilog_inputs(nvblaslt, a, b, bias)
    cases = []  # (name, fn, note)
    for name in args.seed_epilogs:
        for tuned in (False, True):
            _progress(f"seed: planning {name}{' [autotuned]' if tuned else ''}")
            mm = _planned(a, b, name, inputs[name], args.limit)
            if tuned:
                mm.autotune(iterations=3, remember=False)
            label = ("plain matmul" if name == "DEFAULT" else f"fused {name}") + (" [autotuned]" if tuned else "")
            cases.append((label, mm.execute, ("autotuned " if tuned else "heuristic #0 ") + _kernel(mm)))

    def naive_forward():
        y = nvblaslt.matmul(a, b)
        y += bias[:, None]
        return torch.relu_(y)

    mask = (nvblaslt.matmul(a, b) + bias[:, None]) <= 0

    def naive_backward():
        g = nvblaslt.matmul(a, b)
        g.masked_fill_(mask, 0)
        return g, g.sum(dim=1)

    cases.append(("naive forward (matmul, +bias, relu)", naive_forward, ""))
    cases.append(("naive backward (matmul, mask, bias sum)", naive_backward, ""))
    if "DRELU_BGRAD" in args.seed_epilogs:  # the split form by hand: DRELU, then the row sums as a GEMV
        drelu = _planned(a, b, "DRELU", inputs["DRELU"], args.limit)
        ones = torch.ones(args.n, 1, device="cuda", dtype=torch.float16)
        row_sums = Matmul(drelu.execute(), ones)
        row_sums.plan()

        def drelu_then_gemv():
            d = drelu.execute()
            row_sums.reset_operands(a=d)
            return d, row_sums.execute()
        cases.append(("DRELU + row-sum GEMV (2 calls)", drelu_then_gemv, "same outputs as DRELU_BGRAD"))
    cases += _nvmath_seed_cases(args, a, b, bias)
    if args.torch:
        bias_n = torch.randn(args.n, device="cuda", dtype=torch.float16)  # torch fuses a bias along N only
        cases.append(("torch.matmul", lambda: torch.matmul(a, b), ""))
        cases.append(("torch._addmm_activation", lambda: torch._addmm_activation(bias_n, a, b),
                      "relu(a @ b + bias along N), torch's fused path"))
        if args.compile:
            _progress("seed: compiling relu(a @ b + bias) with torch.compile")
            compiled = torch.compile(lambda x, y, z: torch.relu(x @ y + z[:, None]))
            for _ in range(3):
                compiled(a, b, bias)
            cases.append(("torch.compile relu(a @ b + bias)", lambda: compiled(a, b, bias), ""))
    _progress(f"seed: timing {len(cases)} cases, {args.repeats} interleaved rounds")
    samples = _event_rounds(torch, [(name, fn) for name, fn, _ in cases], args.repeats, shuffle=True)
    rows = [{"case": name, "ms": statistics.median(s), "tflops": flops / statistics.median(s) / 1e9, "note": note}
            for (name, _, note), s in zip(cases, samples)]
    del cases, inputs
    _free_memory(torch)
    results["seed"] = {"shape": [args.m, args.k, args.n], "dtype": "float16", "rounds": args.repeats, "rows": rows,
                       "baseline": "plain matmul"}


def _nvmath_seed_cases(args, a, b, bias) -> list:
    advanced = _nvmath()
    if advanced is None:
        _progress("seed: nvmath-python not installed: no nvmath rows")
        return []
    epilog = advanced.MatmulEpilog
    _, nvmath_aux = advanced.matmul(a, b, epilog=epilog.RELU_AUX_BIAS, epilog_inputs={"bias": bias})
    cases = []
    for name, inputs in (("DEFAULT", None), ("RELU_BIAS", {"bias": bias}), ("RELU_AUX_BIAS", {"bias": bias}),
                         ("DRELU_BGRAD", {"relu_aux": nvmath_aux["relu_aux"]})):
        if name not in args.seed_epilogs:
            continue
        for tuned in (False, True):
            _progress(f"seed: planning nvmath {name}{' [autotuned]' if tuned else ''}")
            mm = advanced.Matmul(a, b)
            mm.plan(epilog=None if name == "DEFAULT" else epilog[name], epilog_inputs=inputs)
            if tuned:
                mm.autotune(iterations=3)
            cases.append((f"nvmath {'plain' if name == 'DEFAULT' else name}" + (" [autotuned]" if tuned else ""),
                          mm.execute, ""))
    return cases


# ---- search: autotune(search=True) against autotune() ----------------------------------------------------
def search_section(args, torch, results: dict) -> None:
    cache_dir = args.out / "tuning-cache"
    shutil.rmtree(cache_dir, ignore_errors=True)
    previous = os.environ.get("NVBLASLT_CACHE_DIR")
    os.environ["NVBLASLT_CACHE_DIR"] = str(cache_dir)
    try:
        _search_rows(args, torch, results, cache_dir)
    finally:
        if previous is None:
            os.environ.pop("NVBLASLT_CACHE_DIR", None)
        else:
            os.environ["NVBLASLT_CACHE_DIR"] = previous


def _search_rows(args, torch, results: dict, cache_dir: Path) -> None:
    import nvblaslt
    from nvblaslt._autotune import median_bounds

    a, b, bias = _seed_operands(torch, args)
    inputs = _epilog_inputs(nvblaslt, a, b, bias)
    rows, plans = [], []
    for name in args.search_epilogs:
        _progress(f"search: {name}: heuristic #0 and autotune()")
        first = _planned(a, b, name, inputs[name], args.limit)
        # autotune() then autotune(search=True) on one plan, as users do; the autotuned row runs
        # autotune()'s pick in a plan of its own, so both rows are timed side by side
        searched = _planned(a, b, name, inputs[name], args.limit)
        searched.autotune(iterations=5, remember=False)
        autotuned = _planned(a, b, name, inputs[name], args.limit)
        autotuned.plan(epilog=name, epilog_inputs=inputs[name], algorithms=[searched.algorithm.as_bytes()])
        _progress(f"search: {name}: autotune(search=True)")
        started = time.perf_counter()
        searched.autotune(iterations=5, search=True, remember=True)
        seconds = time.perf_counter() - started
        report = getattr(searched, "tuning_report", None)
        plans.append((name, first, autotuned, searched))
        rows.append({"epilog": name, "search_s": seconds, "report": str(report) if report else "",
                     "switched": getattr(report, "switched", None), "confidence": getattr(report, "confidence", None),
                     "kernel_autotuned": _kernel(autotuned), "kernel_searched": _kernel(searched),
                     "same_kernel": autotuned.algorithm.algorithm.config() == searched.algorithm.algorithm.config(),
                     # the whole 64-byte algorithm and the workspace it is given: identical means the very
                     # same launch, so any difference the re-timing shows is measurement noise
                     "same_launch": autotuned.algorithm.as_bytes() == searched.algorithm.as_bytes()
                     and autotuned._workspace_size == searched._workspace_size,
                     "form": list(getattr(searched, "bias_gradient_form", None) or []) or None,
                     "config_searched": searched.algorithm.algorithm.config()})
    rivals = _nvmath_autotuned(a, b, bias, [row["epilog"] for row in rows])  # the anchor's best, same rounds
    cases = [(f"{name} {what}", mm.execute) for name, *mms in plans
             for what, mm in zip(("heuristic #0", "autotuned", "searched"), mms)]
    cases += [(f"{name} nvmath autotuned", rival) for name, rival in rivals.items()]
    _progress(f"search: re-timing {len(cases)} plans, {args.search_rounds} interleaved rounds, shuffled")
    samples = _event_rounds(torch, cases, args.search_rounds, shuffle=True)
    medians = [statistics.median(s) for s in samples]
    rival_samples = dict(zip(rivals, samples[3 * len(plans):]))

    def paired(numerator, denominator) -> tuple[float, list[float]]:
        """The median of per-round ratios (drift cancels) and a 95 % distribution-free bound on it
        (the sign test inverted, 2.5 % each side)."""
        ratios = [x / y for x, y in zip(numerator, denominator)]
        return statistics.median(ratios), list(median_bounds(ratios, 0.025))

    for index, row in enumerate(rows):
        first_ms, auto_ms, searched_ms = medians[3 * index: 3 * index + 3]
        ratio, bounds = paired(samples[3 * index + 2], samples[3 * index + 1])
        row.update(first_ms=first_ms, autotuned_ms=auto_ms, searched_ms=searched_ms,
                   searched_over_autotuned=ratio, searched_over_autotuned_bounds=bounds,
                   first_over_autotuned=first_ms / auto_ms)
        rival = rival_samples.get(row["epilog"])
        if rival is not None:
            row["nvmath_autotuned_ms"] = statistics.median(rival)
            row["autotuned_over_nvmath"], row["autotuned_over_nvmath_bounds"] = paired(samples[3 * index + 1], rival)
            row["searched_over_nvmath"], row["searched_over_nvmath_bounds"] = paired(samples[3 * index + 2], rival)
    del plans, cases, rivals, inputs, a, b, bias
    _free_memory(torch)
    recalled = _recall_in_another_process(args, [r["epilog"] for r in rows])
    for row in rows:
        other = recalled.get(row["epilog"], {})
        row["second_process"] = {"same_kernel": other.get("config") == row["config_searched"],
                                 "cache_hit": other.get("hit"), "plan_ms": other.get("plan_ms"),
                                 "error": other.get("error")}
    results["search"] = {"shape": [args.m, args.k, args.n], "rounds": args.search_rounds, "rows": rows,
                         "cache": str(cache_dir)}


def _nvmath_autotuned(a, b, bias, epilogs: list[str]) -> dict:
    """nvmath-python's autotuned plan per epilog (its execute), each backward epilog fed the aux array
    of nvmath's own forward; empty without nvmath-python."""
    advanced = _nvmath()
    if advanced is None:
        _progress("search: nvmath-python not installed: no nvmath rows")
        return {}
    epilog = advanced.MatmulEpilog
    inputs: dict = {"DEFAULT": None}
    for forward, backward, key in (("RELU_AUX_BIAS", "DRELU_BGRAD", "relu_aux"),
                                   ("GELU_AUX_BIAS", "DGELU_BGRAD", "gelu_aux")):
        inputs[forward] = {"bias": bias}
        if backward in epilogs:
            try:
                _, aux = advanced.matmul(a, b, epilog=epilog[forward], epilog_inputs={"bias": bias})
                inputs[backward] = {key: aux[key]}
            except Exception as error:  # noqa: BLE001 - an optional comparison: lose one row, not the section
                _progress(f"search: nvmath-python {forward} failed ({type(error).__name__}: {error}); "
                          f"no nvmath {backward} row")
    inputs["RELU_BIAS"] = inputs["GELU_BIAS"] = {"bias": bias}
    plans = {}
    for name in epilogs:
        if name not in inputs:
            continue
        _progress(f"search: {name}: nvmath-python autotune()")
        try:
            mm = advanced.Matmul(a, b)
            mm.plan(epilog=None if name == "DEFAULT" else epilog[name], epilog_inputs=inputs[name])
            mm.autotune(iterations=5)
        except Exception as error:  # noqa: BLE001
            _progress(f"search: nvmath-python {name} failed ({type(error).__name__}: {error}); no nvmath row")
            continue
        plans[name] = mm.execute
    return plans


def _recall_in_another_process(args, epilogs: list[str]) -> dict:
    """Plan each searched problem in a fresh process sharing the tuning cache: it must recall the
    pick (a cache hit, no search) and get the same kernel."""
    _progress(f"search: planning the {len(epilogs)} problems again in a second process")
    spec = {"shape": [args.m, args.k, args.n], "limit": args.limit, "epilogs": epilogs}
    command = [sys.executable, "-m", "nvblaslt", "bench", "--recall-check", json.dumps(spec)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=os.environ.copy())
    except subprocess.TimeoutExpired:
        return {e: {"error": "timed out"} for e in epilogs}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip().splitlines()[-3:]
        return {e: {"error": f"exit {done.returncode}: {' | '.join(tail)}"} for e in epilogs}
    return json.loads(lines[-1])


def recall_check(spec: dict) -> int:
    """The second process of the search section: plan, never autotune, report what was recalled."""
    import torch

    import nvblaslt

    class Hits(logging.Handler):
        messages: list[str] = []

        def emit(self, record):
            Hits.messages.append(record.getMessage())

    logger = logging.getLogger("nvblaslt")
    logger.setLevel(logging.INFO)
    logger.addHandler(Hits())
    args = argparse.Namespace(m=spec["shape"][0], k=spec["shape"][1], n=spec["shape"][2])
    a, b, bias = _seed_operands(torch, args)
    inputs = _epilog_inputs(nvblaslt, a, b, bias)
    found = {}
    for name in spec["epilogs"]:
        Hits.messages.clear()
        started = time.perf_counter()
        mm = _planned(a, b, name, inputs[name], spec["limit"])
        found[name] = {"config": mm.algorithm.algorithm.config(), "plan_ms": (time.perf_counter() - started) * 1e3,
                       "hit": any("tuning cache hit" in m for m in Hits.messages)}
        mm.execute()
    torch.cuda.synchronize()
    print(json.dumps(found))
    return 0


# ---- mlp and import ------------------------------------------------------------------------------------------
def mlp_section(args, torch, results: dict) -> None:
    if importlib.util.find_spec("nvblaslt._bench_mlp") is None:
        _progress("mlp: nvblaslt._bench_mlp is not there; skipped")
        results["mlp"] = {"skipped": "nvblaslt._bench_mlp is not there"}
        return
    module = importlib.import_module("nvblaslt._bench_mlp")
    argv = ["--json", str(args.out / "mlp.json")] + (["--quick", "--no-compile"] if args.quick else [])
    _progress(f"mlp: nvblaslt._bench_mlp.main({argv})")
    outcome = module.main(argv)
    results["mlp"] = outcome if isinstance(outcome, dict) else {"returned": repr(outcome)}
    results["mlp"]["summary_lines"] = _mlp_lines(results["mlp"])


def _mlp_lines(outcome: dict) -> list[str]:
    """Its table in short: each step's ms and × eager PyTorch, per activation."""
    rows = outcome.get("rows")
    if not isinstance(rows, dict):
        return []
    lines = []
    for label, per_activation in rows.items():
        cells = "  ".join(f"{activation} {figures['ms']:8.2f} ms {figures['x_eager']:6.3f}×"
                          for activation, figures in per_activation.items() if isinstance(figures, dict))
        lines.append(f"{label[:44]:44s} {cells}")
    return lines


def import_section(args, torch, results: dict) -> None:
    code = "import time; t = time.perf_counter(); import nvblaslt; print(time.perf_counter() - t)"
    runs = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 check=True).stdout) for _ in range(3 if args.quick else 5)]
    results["import"] = {"seconds": statistics.median(runs), "runs": runs}


# ---- report ---------------------------------------------------------------------------------------------------
def machine(torch) -> dict:
    import nvblaslt
    from cuda.bindings import runtime as cudart

    _, driver = cudart.cudaDriverGetVersion()
    props = torch.cuda.get_device_properties(0)
    advanced = _nvmath()
    nvmath_version = None
    if advanced is not None:
        import nvmath

        nvmath_version = getattr(nvmath, "__version__", "?")
    return {"gpu": props.name, "driver_cuda": f"{driver // 1000}.{driver % 1000 // 10}",
            "cublaslt": ".".join(map(str, nvblaslt.library().version_tuple)), "torch": torch.__version__,
            "nvmath": nvmath_version, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M")}


def summary_lines(results: dict) -> list[str]:
    """The compact tables, for the end of the output."""
    lines = []
    info = results["machine"]
    lines.append(f"nvblaslt bench on {info['gpu']} (CUDA driver {info['driver_cuda']}, cuBLASLt {info['cublaslt']}, "
                 f"torch {info['torch']}, nvmath {info['nvmath'] or '-'}), {info['date']}"
                 f"{', --quick' if results.get('quick') else ''}")
    if "percall" in results:
        section = results["percall"]
        lines += ["", f"per call, host time: {section['problem']} (× bare ctypes cublasLtMatmul; "
                      f"bare vs matmul() max rel. diff {section['bare_matches_matmul']:.1e})"]
        lines += [f"  {r['case']:36s} {r['us_per_call']:8.2f} µs  {r['ratio']:6.2f}×" for r in section["rows"]]
        if section.get("bare_gpu_us"):
            lines.append(f"  (the bare call's kernels alone take {section['bare_gpu_us']:.2f} µs on the GPU)")
        lines.append("  matmul()'s host time by function (cProfile, µs per call, inflated alike):")
        lines += [f"    {r['us']:6.2f}  {r['function']}" for r in section["profile"][:6]]
    if "layer" in results:
        rows = results["layer"]["rows"]
        cases = list(dict.fromkeys(r["case"] for r in rows))[1:]
        short = {"nvblaslt matmul()": "matmul()", "nvblaslt Matmul.execute()": "execute()",
                 "nvmath Matmul.execute()": "nvmath exec"}
        lines += ["", "layers, bf16, event time per call: torch _addmm_activation in µs, the others × torch "
                      "(< 1 is faster)",
                  f"  {'tokens':>6s} {'in->out':>11s} {'epilog':9s} {'torch µs':>9s} " +
                  " ".join(f"{short.get(c, c):>11s}" for c in cases)]
        for key in dict.fromkeys((r["tokens"], r["in"], r["out"], r["epilog"]) for r in rows):
            group = {r["case"]: r for r in rows if (r["tokens"], r["in"], r["out"], r["epilog"]) == key}
            cells = " ".join(f"{group[c]['ratio']:11.3f}" if c in group else f"{'-':>11s}" for c in cases)
            lines.append(f"  {key[0]:6d} {f'{key[1]}->{key[2]}':>11s} {key[3]:9s} "
                         f"{group['torch _addmm_activation']['us']:9.1f} {cells}")
    if "breakdown" in results:
        section = results["breakdown"]
        torch_us = section["torch_us"]
        lines += ["", f"where matmul()'s time goes, {section['problem']} (host µs a call, or GPU time where longer; "
                      f"× torch's whole call)"]
        lines += [f"  {name:52s} {us:7.2f} µs {us / torch_us:6.3f}×" for name, us in section["us"].items()]
        lines.append(f"  {'launch + allocation + layout read + x.T':52s} {section['floor_us']:7.2f} µs "
                     f"{section['floor_us'] / torch_us:6.3f}×  (what no checking function form can skip)")
    if "seed" in results:
        section = results["seed"]
        plain = next((r["ms"] for r in section["rows"] if r["case"] == "plain matmul"), section["rows"][0]["ms"])
        m, k, n = section["shape"]
        lines += ["", f"seed shape fp16 ({m},{k}) @ ({k},{n}), ms (× plain matmul, heuristic #0)"]
        lines += [f"  {r['case']:44s} {r['ms']:8.3f} {r['ms'] / plain:7.3f}  {r['note']}" for r in section["rows"]]
    if "search" in results:
        section = results["search"]
        lines += ["", "search against autotune at the seed shape, re-timed in the same rounds (searched/autotuned ≤ 1 "
                      "is the target)",
                  "  (same*: the very same launch, algorithm bytes and workspace; 2nd proc: recalls the pick, no search)",
                  f"  {'epilog':14s} {'h0 ms':>8s} {'auto ms':>8s} {'srch ms':>8s} {'s/auto':>7s} {'95% bound':>15s} "
                  f"{'search':>7s}  {'kernel':8s} {'2nd proc':18s} decision"]
        nvmath_rows = [r for r in section["rows"] if "nvmath_autotuned_ms" in r]
        for r in section["rows"]:
            second = r["second_process"]
            other = (second["error"] or "")[:18] if second.get("error") else (
                f"{'same' if second['same_kernel'] else 'DIFFERENT'}, {'hit' if second['cache_hit'] else 'miss'} "
                f"{second['plan_ms'] or 0:.0f}ms")
            decision = "switched" if r["switched"] else "kept"
            if r["confidence"] is not None:
                decision += f" ({r['confidence']:.0%})"
            if r["form"]:
                decision += f"; {r['form'][0]} form"
            low, high = r.get("searched_over_autotuned_bounds") or (math.nan, math.nan)
            lines.append(f"  {r['epilog']:14s} {r['first_ms']:8.3f} {r['autotuned_ms']:8.3f} {r['searched_ms']:8.3f} "
                         f"{r['searched_over_autotuned']:7.3f} [{low:6.3f}, {high:6.3f}] {r['search_s']:6.1f}s  "
                         f"{('same*' if r.get('same_launch') else 'same') if r['same_kernel'] else 'other':8s} "
                         f"{other:18s} {decision}")
        if nvmath_rows:
            lines += ["  against nvmath-python's autotuned plan in the same rounds (paired ratio [95% bound]):",
                      f"  {'epilog':14s} {'nvm ms':>8s} {'autotuned/nvm':>24s} {'searched/nvm':>24s}"]
            for r in nvmath_rows:
                ratios = [f"{r[key]:7.3f} [{r[key + '_bounds'][0]:6.3f}, {r[key + '_bounds'][1]:6.3f}]"
                          for key in ("autotuned_over_nvmath", "searched_over_nvmath")]
                lines.append(f"  {r['epilog']:14s} {r['nvmath_autotuned_ms']:8.3f} {ratios[0]:>24s} {ratios[1]:>24s}")
    if "mlp" in results:
        mlp = results["mlp"]
        lines += ["", "mlp training step (nvblaslt._bench_mlp), ms and × eager PyTorch:"]
        lines += [f"  {line}" for line in mlp.get("summary_lines", [])] or [f"  {mlp.get('skipped') or 'see JSON'}"]
    if "import" in results:
        lines += ["", f"import nvblaslt: {results['import']['seconds'] * 1000:.0f} ms (median of fresh interpreters)"]
    for section, error in results.get("errors", {}).items():
        lines.append(f"!! section {section} failed: {error}")
    return lines


def chart(results: dict, path: Path) -> bool:
    """Ratios to each table's baseline, bars drawn from 1.0 so that 1-15 % differences show."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = []
    if "layer" in results:
        rows = [r for r in results["layer"]["rows"] if r["case"] != results["layer"]["baseline"]]
        panels.append(("layers: × torch _addmm_activation (bf16)", [
            (f"{r['tokens']}t {r['in']}->{r['out']} {r['epilog']} {r['case'].replace('nvblaslt ', '')}", r["ratio"])
            for r in rows], False))
    if "percall" in results:
        panels.append(("host time per call: × bare cublasLtMatmul (log)",
                       [(r["case"], r["ratio"]) for r in results["percall"]["rows"]], True))
    if "search" in results:
        panels.append(("search: × autotune() at the seed shape", [
            (f"{r['epilog']} {what}", r[key]) for r in results["search"]["rows"]
            for what, key in (("heuristic #0", "first_over_autotuned"), ("searched", "searched_over_autotuned"))],
            False))
        against_nvmath = [(f"{r['epilog']} {what}", r[key]) for r in results["search"]["rows"]
                          if "nvmath_autotuned_ms" in r
                          for what, key in (("autotuned", "autotuned_over_nvmath"), ("searched", "searched_over_nvmath"))]
        if against_nvmath:
            panels.append(("seed shape: × nvmath-python's autotuned plan, same rounds", against_nvmath, False))
    if "seed" in results:
        rows = results["seed"]["rows"]
        plain = next((r["ms"] for r in rows if r["case"] == "plain matmul"), rows[0]["ms"])
        panels.append(("seed shape: × plain matmul", [(r["case"], r["ms"] / plain) for r in rows], False))
    if not panels:
        return False
    heights = [max(2.0, 0.22 * len(bars) + 1.0) for _, bars, _ in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, sum(heights)), gridspec_kw={"height_ratios": heights},
                             squeeze=False)
    for ax, (title, bars, log) in zip(axes[:, 0], panels):
        labels, ratios = [b[0] for b in bars][::-1], [b[1] for b in bars][::-1]
        colors = ["tab:green" if r <= 1 else "tab:red" for r in ratios]
        ax.barh(labels, [r - 1 for r in ratios], left=1.0, color=colors)
        for y, ratio in enumerate(ratios):
            ax.text(ratio, y, f" {ratio:.3f} ", va="center", ha="left" if ratio >= 1 else "right", fontsize=6)
        ax.axvline(1.0, color="black", linewidth=0.8)
        if log:
            ax.set_xscale("log")
            ax.set_xlim(min(ratios) / 1.2, max(ratios) * 1.2)
        else:
            low, high = min(ratios + [1.0]), max(ratios + [1.0])
            pad = max(0.01, 0.08 * (high - low))
            ax.set_xlim(low - pad, high + pad)
        ax.set_title(title, fontsize=9)
        ax.tick_params(axis="y", labelsize=6)
    info = results["machine"]
    fig.suptitle(f"nvblaslt on {info['gpu']}, cuBLASLt {info['cublaslt']}, {info['date']}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / sum(heights)))  # half an inch for the title
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ---- main ------------------------------------------------------------------------------------------------------
def _arguments(argv) -> argparse.Namespace:
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
    parser.add_argument("--rounds", type=int, help="interleaved rounds, per-call section (default 7, quick 5)")
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
    args.seed_epilogs = QUICK_SEED_EPILOGS if quick else SEED_EPILOGS
    args.search_epilogs = QUICK_SEARCH_EPILOGS if quick else SEARCH_EPILOGS
    return args


def main(argv: list[str] | None = None) -> int:
    args = _arguments(sys.argv[1:] if argv is None else argv)
    if args.recall_check:
        return recall_check(json.loads(args.recall_check))
    try:
        import torch
    except ImportError:
        print("bench: needs PyTorch (timing events and the comparisons)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench: needs an NVIDIA GPU", file=sys.stderr)
        return 2
    handler = logging.StreamHandler(sys.stderr)  # nvblaslt's decisions and search progress
    handler.setFormatter(logging.Formatter("           nvblaslt: %(message)s"))
    logger = logging.getLogger("nvblaslt")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {"machine": machine(torch), "quick": args.quick, "sections": args.sections, "errors": {}}
    sections = {"percall": percall_section, "layer": layer_section, "seed": seed_section, "search": search_section,
                "mlp": mlp_section, "import": import_section}
    for name in SECTIONS:  # in this order whatever the option's: the search's cache must not reach the others
        if name not in args.sections:
            continue
        _progress(f"section {name}")
        started = time.perf_counter()
        try:
            sections[name](args, torch, results)
        except Exception as error:  # one failed section must not lose the others' figures
            traceback.print_exc()
            results["errors"][name] = f"{type(error).__name__}: {error}"
            with contextlib.suppress(Exception):
                _free_memory(torch)
        _progress(f"section {name} done in {time.perf_counter() - started:.0f} s")
    results["seconds"] = time.perf_counter() - _started
    (args.out / "bench.json").write_text(json.dumps(results, indent=2, default=str))
    drawn = chart(results, args.out / "bench.png")
    lines = summary_lines(results)
    (args.out / "bench.txt").write_text("\n".join(lines) + "\n")
    print(f"\nwrote {args.out / 'bench.json'}, {args.out / 'bench.txt'}"
          f"{', ' + str(args.out / 'bench.png') if drawn else ' (no chart: matplotlib not installed)'}"
          f"; {results['seconds']:.0f} s in all")
    print("\n".join(lines))
    return 1 if results["errors"] else 0
