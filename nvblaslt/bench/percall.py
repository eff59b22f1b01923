"""The ``percall`` section: host time per call of the blog's small layer (CuPy fp32, 100×784 @
784×256, RELU_BIAS), against a bare ctypes cublasLtMatmul with every argument prebuilt as ctypes
passes it (``from_param``) and no argtypes; the same call with c_void_p objects, and through the
generated binding with argtypes, are rows of their own."""

from __future__ import annotations

import ctypes
import functools
import statistics
from pathlib import Path

from .common import max_relative, nvmath_advanced, progress
from .timing import host_rounds, queued_gpu_us


def as_passed(arguments) -> tuple:
    """The arguments as ctypes passes them with no conversion (from_param objects): the fastest form of
    each. A c_void_p or c_size_t instance is converted into one on every call."""
    return tuple(type(x).from_param(x.value) if isinstance(x, (ctypes.c_void_p, ctypes.c_size_t)) else x
                 for x in arguments)


def bare_call(nvblaslt, weights_ptr: int, x_ptr: int, bias_ptr: int, out_ptr: int, workspace, stream: int):
    """cublasLtMatmul for D = relu(W @ x + bias), every argument a prebuilt ctypes object and the
    function without argtypes: the floor of any ctypes design. W (100×784) and x (784×256) are
    row-major, so cuBLASLt reads each as the transpose of a column-major matrix; D (100×256) is
    column-major and the bias runs along its rows."""
    from nvblaslt import Handle, MatmulDesc, MatmulPreference, MatrixLayout, heuristics
    from nvblaslt._launch import raw_function

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
    raw, checked = raw_function(lib.cublasLtMatmul), lib.cublasLtMatmul
    keep = (desc, a, b, d, preference, alpha, beta, algorithm)  # the C objects must outlive the calls
    passed = as_passed(args)

    def bare():  # no argtypes or status check, every argument in the form ctypes passes as it is
        return raw(*passed)

    def bare_objects():  # ctypes objects: each c_void_p converted per call
        return raw(*args)

    def bare_checked():  # the generated binding: argtypes and a status check
        return checked(*args)
    bare.keep = bare_objects.keep = bare_checked.keep = keep  # type: ignore[attr-defined]
    return bare, bare_objects, bare_checked


def section(args, torch, results: dict) -> None:
    import nvblaslt
    from nvblaslt import Matmul, MatmulEpilog
    from nvblaslt._frameworks import framework_of

    try:
        import cupy as xp

        package = "cupy"
    except ImportError:
        xp, package = None, "torch"
        progress("percall: CuPy not installed; nvblaslt runs on torch tensors instead")
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
    bare, bare_objects, bare_checked = bare_call(nvblaslt, pointer(weights), pointer(x), pointer(bias), pointer(out),
                                                 workspace, stream)
    bare()
    expected = nvblaslt.matmul(weights, x, epilog=epilog, epilog_inputs={"bias": bias})
    close = max_relative(torch, out, expected)
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
    read_layouts, allocate = framework_of(weights).layout_reader(type(weights)), mm._allocate_result
    if read_layouts is not None and allocate is not None:
        cases["  piece: result allocation"] = functools.partial(allocate, stream, stream)
        cases["  piece: layout read of W, x, bias"] = functools.partial(read_layouts, (weights, x, None, bias))
    slow = {}
    advanced = nvmath_advanced()
    if advanced is not None:
        nv = advanced.Matmul(weights, x)
        nv.plan(epilog=advanced.MatmulEpilog.RELU_BIAS, epilog_inputs={"bias": bias})
        cases["nvmath Matmul.execute()"] = nv.execute
        slow["nvmath matmul()"] = lambda: advanced.matmul(weights, x, epilog=advanced.MatmulEpilog.RELU_BIAS,
                                                          epilog_inputs={"bias": bias})
    calls, rounds = args.calls, args.rounds
    progress(f"percall: {len(cases) + len(slow)} cases, {rounds} interleaved rounds of {calls}-call bursts")
    # warm-up: plans, caches, first launches
    samples = host_rounds(cases, rounds, calls, warmup=50, seed=0)
    # plans every call: fewer calls per burst, same rounds
    samples.update(host_rounds(slow, rounds, max(1, calls // 20), warmup=1, seed=0))
    floor = statistics.median(samples["bare ctypes cublasLtMatmul"])
    # the floor's own GPU time (the sleep kernel runs on torch's stream, which must be the bare call's)
    gpu_us = queued_gpu_us(torch, bare, 200) if stream == torch.cuda.current_stream().cuda_stream else None
    rows = [{"case": name, "us_per_call": statistics.median(v), "ratio": statistics.median(v) / floor,
             "spread_us": [min(v), max(v)]} for name, v in samples.items()]
    results["percall"] = {"problem": f"{package} fp32 W 100x784 @ x 784x256, RELU_BIAS", "package": package,
                          "bare_matches_matmul": close, "rows": rows, "bare_gpu_us": gpu_us,
                          "profile": profile(lambda: nvblaslt.matmul(weights, x, epilog=epilog,
                                                                     epilog_inputs={"bias": bias}), calls)}


def profile(fn, calls: int, top: int = 8) -> list[dict]:
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
