"""The ``layer`` section: transformer-sized layers (bf16; 1, 16, 256, 8192 tokens; 4096→4096 and
4096→14336; RELU_BIAS, GELU_BIAS), event time per call of matmul() as users call it (fresh ``x.T``
views, no ``out=``), Matmul.execute() and ``nvblaslt.torch.linear``, against torch's fused
``_addmm_activation`` and ``nn.Linear`` + the activation; and, on the
smallest layer, where matmul()'s host time goes (the breakdown)."""

from __future__ import annotations

import ctypes
import statistics

from .common import epilog_named, free_memory, max_relative, nvmath_advanced, progress
from .percall import as_passed
from .timing import event_rounds, host_rounds, queued_gpu_us

LAYER_TOKENS = (1, 16, 256, 8192)
LAYER_WIDTHS = ((4096, 4096), (4096, 14336))
LAYER_EPILOGS = ("RELU_BIAS", "GELU_BIAS")


def section(args, torch, results: dict) -> None:
    from torch.nn import functional

    import nvblaslt
    from nvblaslt import Matmul
    from nvblaslt import torch as nvtorch

    advanced = nvmath_advanced()
    rows = []
    configs = [(t, w, e) for t in LAYER_TOKENS for w in LAYER_WIDTHS for e in LAYER_EPILOGS]
    generator = torch.Generator(device="cuda").manual_seed(2)
    for index, (tokens, (d_in, d_out), name) in enumerate(configs):
        progress(f"layer {index + 1}/{len(configs)}: {tokens} tokens, {d_in}->{d_out}, {name}")
        w = torch.randn(d_out, d_in, device="cuda", dtype=torch.bfloat16, generator=generator) / d_in ** 0.5
        x = torch.randn(tokens, d_in, device="cuda", dtype=torch.bfloat16, generator=generator)
        b = torch.randn(d_out, device="cuda", dtype=torch.bfloat16, generator=generator)
        epilog, gelu = epilog_named(name), name.startswith("GELU")
        activation = "gelu" if gelu else "relu"
        activate = (lambda y: functional.gelu(y, approximate="tanh")) if gelu else functional.relu
        mm = Matmul(w, x.T)
        mm.plan(epilog=epilog, epilog_inputs={"bias": b})
        cases = [("torch _addmm_activation", lambda: torch._addmm_activation(b, x, w.t(), use_gelu=gelu)),
                 ("nvblaslt matmul()", lambda: nvblaslt.matmul(w, x.T, epilog=epilog, epilog_inputs={"bias": b})),
                 ("nvblaslt Matmul.execute()", mm.execute),
                 # what PyTorch users call: nn.Linear + the activation, against nvblaslt.torch.linear (eager)
                 ("nn.Linear + activation", lambda: activate(functional.linear(x, w, b))),
                 ("nvblaslt.torch.linear", lambda: nvtorch.linear(x, w, b, activation))]
        if advanced is not None:
            nv = advanced.Matmul(w, x.T)
            nv.plan(epilog=advanced.MatmulEpilog[name], epilog_inputs={"bias": b})
            cases.append(("nvmath Matmul.execute()", nv.execute))
        reference = cases[0][1]()
        error = max_relative(torch, cases[1][1]().T, reference)
        if error > 3e-2:
            progress(f"  matmul() differs from torch by {error:.2e} (relative)")
        # bursts of about 5 ms (2 in --quick) so that the event pair's own cost does not count
        estimate = statistics.median(event_rounds(torch, cases[:1], 3, 5)[0])
        calls = max(3, min(200, round((2.0 if args.quick else 5.0) / max(estimate, 1e-3))))
        samples = event_rounds(torch, cases, args.layer_rounds, calls)
        torch_us = statistics.median(samples[0]) * 1000
        for (case, _), values in zip(cases, samples):
            us = statistics.median(values) * 1000
            rows.append({"tokens": tokens, "in": d_in, "out": d_out, "epilog": name, "case": case, "us": us,
                         "ratio": us / torch_us, "calls_per_sample": calls, "max_relative_error": error})
        if (tokens, (d_in, d_out), name) == configs[0]:
            results["breakdown"] = breakdown(args, torch, w, x, b, mm, epilog)
        del mm, cases
    free_memory(torch)
    results["layer"] = {"dtype": "bfloat16", "rounds": args.layer_rounds, "rows": rows,
                        "baseline": "torch _addmm_activation"}


def breakdown(args, torch, w, x, b, mm, epilog) -> dict:
    """Where matmul()'s host time goes on the smallest layer: the whole calls beside the pieces no
    function form can skip (cuBLASLt's own launch, the result's allocation, reading the arrays'
    layouts, the caller's ``x.T``), timed in the same interleaved rounds. The launch is the plan's
    own (``mm._launch``), its arguments fixed at this call's result and stream."""
    import nvblaslt
    from nvblaslt._frameworks import framework_of

    read = framework_of(w).layout_reader(type(w))
    assert read is not None  # torch tensors: a reader of their own
    stream = torch.cuda.current_stream().cuda_stream
    out = mm.execute()
    launch = mm._launch
    launch.d_argument.value, launch.stream_argument.value = out.data_ptr(), stream
    matmul, passed = launch.matmul, as_passed(launch.arguments)
    refused = (ctypes.c_void_p.from_param(None),) + passed[1:]  # no handle: cuBLASLt returns at its entry check
    allocate = mm._allocate_result
    assert allocate is not None  # not in place: the plan allocates D
    xt = x.T
    pieces = {
        "torch _addmm_activation(b, x, w.t())": lambda: torch._addmm_activation(b, x, w.t()),
        "nvblaslt matmul(w, x.T, …)": lambda: nvblaslt.matmul(w, x.T, epilog=epilog, epilog_inputs={"bias": b}),
        "nvblaslt Matmul.execute()": mm.execute,
        "cublasLtMatmul alone (bare, the plan's arguments)": lambda: matmul(*passed),
        "result allocation (torch new_empty_strided)": lambda: allocate(stream, stream),
        "layout read of w, x.T and bias": lambda: read((w, xt, None, b)),
        "x.T (the caller's view)": lambda: x.T,
        "w.t() (inside torch's call)": lambda: w.t(),
        "ctypes call + cuBLASLt's entry check (NULL handle)": lambda: matmul(*refused),
    }
    calls, rounds = max(200, args.calls // 4), args.rounds
    samples = host_rounds(pieces, rounds, calls, warmup=20, seed=1)
    us = {name: statistics.median(v) for name, v in samples.items()}
    keys = list(pieces)
    floor = us[keys[3]] + us[keys[4]] + us[keys[5]] + us[keys[6]]
    gpu = queued_gpu_us(torch, lambda: matmul(*passed), 200)  # a queue of 400 kernels never fills
    if gpu is not None:
        us["the launch's kernels on the GPU (queued behind a sleep)"] = gpu
    return {"problem": f"bf16 {x.shape[0]} tokens {w.shape[1]}->{w.shape[0]} {epilog.name}", "calls": calls,
            "rounds": rounds, "us": us, "floor_us": floor, "torch_us": us[keys[0]]}
