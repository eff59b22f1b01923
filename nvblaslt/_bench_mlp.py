"""``python -m nvblaslt._bench_mlp``: one training step of an MLP, FusedLinear against nn.Linear.

One step is forward + backward (no optimizer) of a 4-layer MLP, by default bf16, 8192 tokens,
widths 4096→16384→4096→16384→4096, the activation after every layer but the last. Rows, per
activation (ReLU, tanh-GELU):

- ``nn.Linear`` + activation, eager;
- ``torch.compile`` of that model;
- the GEMM-only floor: the same GEMMs with no bias and no activation (bias-free nn.Linear layers);
- ``FusedLinear`` eager (``nvblaslt.torch.fuse`` of the same model, sharing its parameters);
- ``FusedLinear`` under ``torch.compile(fullgraph=True)``.

Every row is timed in the same interleaved rounds (each case once per round, CUDA events, median),
after warm-up (which includes compilation), so clock drift falls on all rows alike.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from typing import Any


def _progress(message: str) -> None:
    print(f"  … {message}", file=sys.stderr, flush=True)


def _mlp(torch, widths, activation, bias, device, dtype):
    nn = torch.nn
    layers = []
    for index, (n_in, n_out) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(n_in, n_out, bias=bias, device=device, dtype=dtype))
        if activation and index < len(widths) - 2:
            layers.append(nn.ReLU() if activation == "relu" else nn.GELU(approximate="tanh"))
    return nn.Sequential(*layers)


def _step(model, params, x, grad):
    """forward + backward of ``model``; gradients set to None first, as optimizer.zero_grad() does."""
    def run():
        for p in params:
            p.grad = None
        model(x).backward(grad)
    return run


def _interleaved(torch, cases: list, rounds: int, warmup: int, cuda: bool) -> list[float]:
    """Median ms of each case, every case once per round; CUDA events (wall clock on the CPU)."""
    for name, run in cases:
        _progress(f"warm-up: {name}")
        for _ in range(warmup):
            run()
    if cuda:
        torch.cuda.synchronize()
    samples: list[list[float]] = [[] for _ in cases]
    for _ in range(rounds):
        for index, (_, run) in enumerate(cases):
            if not cuda:
                begin = time.perf_counter()
                run()
                samples[index].append((time.perf_counter() - begin) * 1e3)
                continue
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            stop.record()
            stop.synchronize()
            samples[index].append(start.elapsed_time(stop))
    return [statistics.median(s) for s in samples]


def _relative(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main(args=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m nvblaslt._bench_mlp", description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--widths", default="4096,16384,4096,16384,4096")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--activations", default="relu,gelu", help="comma-separated: relu, gelu")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="5 rounds, 2 warm-up steps")
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile rows")
    parser.add_argument("--bias-gradient", choices=["epilog", "bgradb", "both"], default="epilog",
                        help="where a chained layer's bias gradient comes from (FusedSequential.bias_gradient); "
                             "'both' adds a FusedLinear eager row for the other")
    parser.add_argument("--search", action="store_true",
                        help="first run one step under nvblaslt.torch.autotune(search=True): every GEMM of the "
                             "fused model is searched and the winners remembered on disk")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: a smoke test of this script (torch ops; wall-clock times mean nothing)")
    parser.add_argument("--json", help="write the results here")
    options = parser.parse_args(args)
    if options.quick:
        options.rounds, options.warmup = 5, 2

    import torch

    import nvblaslt
    from nvblaslt import torch as nvtorch

    cuda = options.device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("this benchmark needs an NVIDIA GPU (--device cpu only smoke-tests the script)")
    device, dtype = torch.device(options.device), getattr(torch, options.dtype)
    widths = [int(w) for w in options.widths.split(",")]
    activations = [a.strip() for a in options.activations.split(",") if a.strip()]
    names = {"relu": "ReLU", "gelu": "tanh-GELU"}
    started = time.time()

    generator = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(options.tokens, widths[0], device=device, dtype=dtype, generator=generator)
    grad = torch.randn(options.tokens, widths[-1], device=device, dtype=dtype, generator=generator)

    rows: list[tuple[str, str]] = []  # (key, label) in table order
    cases: list[tuple[str, object]] = []  # ((activation, key) label, step)
    checks = {}
    for activation in activations:
        torch.manual_seed(0)
        reference = _mlp(torch, widths, activation, True, device, dtype)
        floor = _mlp(torch, widths, None, False, device, dtype)
        fused = nvtorch.fuse(reference)  # a FusedSequential sharing the reference's parameters
        fused_params = list(fused.parameters())
        forms = {"epilog": fused}
        if options.bias_gradient != "epilog":
            forms["bgradb"] = nvtorch.fuse(reference, bias_gradient="bgradb")
        if options.bias_gradient == "bgradb":
            fused = forms["bgradb"]

        if options.search:
            _progress(f"{activation}: searching every GEMM of the fused step (remembered on disk)")
            with nvtorch.autotune():
                for model in forms.values():
                    _step(model, list(model.parameters()), x, grad)()

        # correctness first: the fused step against nn.Linear's, same parameters and inputs
        _step(reference, list(reference.parameters()), x, grad)()
        expected = [p.grad.clone() for p in reference.parameters()]
        _step(fused, fused_params, x, grad)()
        checks[activation] = max(_relative(p.grad, e) for p, e in zip(fused_params, expected))

        mine = [("eager", "nn.Linear + activation, eager", _step(reference, list(reference.parameters()), x, grad))]
        if not options.no_compile:
            mine.append(("compile", "torch.compile of that model",
                         _step(torch.compile(reference), list(reference.parameters()), x, grad)))
        mine.append(("floor", "GEMM-only floor (no bias, no activation)", _step(floor, list(floor.parameters()), x,
                                                                                 grad)))
        suffix = " [BGRADB]" if options.bias_gradient == "bgradb" else ""
        mine.append(("fused", f"FusedLinear eager{suffix}", _step(fused, fused_params, x, grad)))
        if options.bias_gradient == "both":
            mine.append(("fused_bgradb", "FusedLinear eager [BGRADB]",
                         _step(forms["bgradb"], list(forms["bgradb"].parameters()), x, grad)))
        if not options.no_compile:
            mine.append(("fused_compile", "FusedLinear, torch.compile(fullgraph=True)",
                         _step(torch.compile(fused, fullgraph=True), fused_params, x, grad)))
        for key, label, run in mine:
            if (key, label) not in rows:
                rows.append((key, label))
            cases.append((f"{activation}: {label}", run))

    _progress(f"{len(cases)} cases, {options.warmup} warm-up steps each (compiling where asked)")
    medians = _interleaved(torch, cases, options.rounds, options.warmup, cuda)
    times = {}
    for (label, _), ms in zip(cases, medians):
        activation, _, row = label.partition(": ")
        times[activation, row] = ms

    shape = "→".join(map(str, widths))
    gpu = torch.cuda.get_device_name() if cuda else f"CPU ({platform.machine()})"
    print(f"one training step (forward + backward), {options.dtype}, tokens {options.tokens}, MLP {shape}; "
          f"median of {options.rounds} interleaved rounds, ms")
    version = getattr(nvblaslt.library(), "version_tuple", None) if cuda else None
    print(f"{gpu}, torch {torch.__version__}, cuBLASLt {'.'.join(map(str, version)) if version else '?'}, "
          f"Python {platform.python_version()}")
    header = f"{'step':46s}" + "".join(f" | {names.get(a, a):>9s} {'×eager':>7s} {'×floor':>7s}" for a in activations)
    print(header)
    print("-" * len(header))
    results: dict[str, Any] = {"rows": {}, "checks": checks, "options": vars(options), "gpu": gpu, "torch": torch.__version__}
    for key, label in rows:
        line = f"{label:46s}"
        for activation in activations:
            if (activation, label) not in times:
                line += f" | {'—':>9s} {'':7s} {'':7s}"
                continue
            ms = times[activation, label]
            eager = times[activation, rows[0][1]]
            floor_ms = times[activation, next(lb for k, lb in rows if k == "floor")]
            line += f" | {ms:9.2f} {ms / eager:7.3f} {ms / floor_ms:7.3f}"
            results["rows"].setdefault(label, {})[activation] = {"ms": ms, "x_eager": ms / eager,
                                                                 "x_floor": ms / floor_ms}
        print(line)
    print("FusedLinear gradients vs nn.Linear's (largest relative difference over parameters): "
          + ", ".join(f"{names.get(a, a)} {checks[a]:.1e}" for a in activations))
    print(f"({time.time() - started:.0f} s in all, compilation included)")
    if options.json:
        with open(options.json, "w") as handle:
            json.dump(results, handle, indent=1)
    return results


if __name__ == "__main__":
    main()
