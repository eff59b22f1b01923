"""Probe (GPU): where a pointwise Conv-Bias-ReLU training step's host time goes, FusedConv2d against cuDNN.

For each shape, the step (forward + backward into ``.grad``, x requiring grad, bf16, channels-last) of
``nn.Conv2d`` + ``nn.ReLU`` and of ``FusedConv2d`` sharing its parameters is timed three ways, in
interleaved rounds: the host's time to issue the step (the device drained before, not after), the wall
clock to a synchronize after it (a loop that logs the loss every step), and with autograd's backward in
the calling thread (``torch.autograd.set_multithreading_enabled(False)``). Then one shape's fused step runs
under cProfile, its functions by own time, and a torch.profiler trace gives the step's CPU time by op.

    python -m tools.probe_conv_host [--shapes small] [--profile-shape 1] [--steps 200]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import statistics
import time

import torch
from torch import nn

from nvblaslt._timing import shuffled_rounds
from nvblaslt.bench.conv import SHAPES, training_step
from nvblaslt.torch._conv import FusedConv2d


def _cases(shape):
    torch.manual_seed(0)
    conv = nn.Conv2d(shape.in_channels, shape.out_channels, 1, device="cuda",
                     dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    x = torch.randn(shape.batch, shape.in_channels, shape.size, shape.size, device="cuda",
                    dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last).requires_grad_()
    grad = torch.randn(shape.batch, shape.out_channels, shape.size, shape.size, device="cuda",
                       dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    return {"cuDNN": training_step(nn.Sequential(conv, nn.ReLU()), x, grad),
            "FusedConv2d": training_step(FusedConv2d.from_conv(conv, "relu"), x, grad)}


def _time(run, how: str, steps: int) -> float:
    """µs per step: ``issue`` (host time, drained before only), ``sync`` (to a synchronize after each),
    ``calling-thread`` (sync, backward in this thread)."""
    torch.cuda.synchronize()
    total = 0.0
    for _ in range(steps):
        begin = time.perf_counter()
        if how == "calling-thread":
            with torch.autograd.set_multithreading_enabled(False):
                run()
        else:
            run()
        if how == "issue":
            total += time.perf_counter() - begin
            torch.cuda.synchronize()
        else:
            torch.cuda.synchronize()
            total += time.perf_counter() - begin
    return total / steps * 1e6


def burst_us(fn, calls: int = 200) -> float:
    """Host µs per call over a burst that never waits for the GPU inside (drained before and after)."""
    torch.cuda.synchronize()
    begin = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - begin
    torch.cuda.synchronize()
    return elapsed / calls * 1e6

def profiled(call, count: int, rows: int = 28) -> str:
    """cProfile's table (own time first) of ``count`` calls, the device drained every 100 calls so that
    the queue never fills: the host is what is measured."""
    torch.cuda.synchronize()
    profile = cProfile.Profile()
    profile.enable()
    for index in range(count):
        call()
        if index % 100 == 99:
            torch.cuda.synchronize()
    profile.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(rows)
    return text.getvalue()


def breakdown(shape, rounds: int) -> None:
    """Host µs of each piece of a fused step beside cuDNN's: the step, the forward alone (no gradient, and
    under autograd), each of the step's three GEMMs through matmul(), Matmul.execute(out=) and the bare
    cublasLtMatmul of its plan's Launch."""
    import nvblaslt
    from nvblaslt import Matmul, MatmulEpilog

    cases = _cases(shape)
    conv = nn.Conv2d(shape.in_channels, shape.out_channels, 1, device="cuda",
                     dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    fused = FusedConv2d.from_conv(conv, "relu")
    reference = nn.Sequential(conv, nn.ReLU())
    x = torch.randn(shape.batch, shape.in_channels, shape.size, shape.size, device="cuda",
                    dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    xg = x.clone().requires_grad_()
    rows_x = x.permute(0, 2, 3, 1).reshape(-1, shape.in_channels)  # (M, C), x's memory
    w = conv.weight.detach().reshape(shape.out_channels, shape.in_channels)
    dz = torch.randn(rows_x.shape[0], shape.out_channels, device="cuda", dtype=torch.bfloat16)
    gemms = {  # (a, b, epilog, inputs): as nvblaslt.torch runs the step's GEMMs
        "forward RELU_BIAS": (w, rows_x.T, MatmulEpilog.RELU_BIAS, {"bias": conv.bias.detach()}),
        "dW BGRADB": (rows_x.T, dz, MatmulEpilog.BGRADB, None),
        "dx DEFAULT": (w.T, dz.T, MatmulEpilog.DEFAULT, None),
    }
    pieces = {"cuDNN step": cases["cuDNN"], "FusedConv2d step": cases["FusedConv2d"]}

    def no_grad(model):
        def run():
            with torch.no_grad():
                model(x)
        return run
    pieces["cuDNN forward, no_grad"] = no_grad(reference)
    pieces["FusedConv2d forward, no_grad"] = no_grad(fused)
    pieces["cuDNN forward, autograd"] = lambda: reference(xg)
    pieces["FusedConv2d forward, autograd"] = lambda: fused(xg)
    plans = []
    stream = torch.cuda.current_stream().cuda_stream
    for name, (a, b, epilog, inputs) in gemms.items():
        pieces[f"matmul() {name}"] = lambda a=a, b=b, e=epilog, i=inputs: nvblaslt.matmul(a, b, epilog=e,
                                                                                         epilog_inputs=i)
        plan = Matmul(a, b)
        plan.plan(epilog=epilog, epilog_inputs=inputs)
        result = plan.execute()
        out = result[0] if isinstance(result, tuple) else result
        plans.append((plan, out))
        pieces[f"Matmul.execute(out=) {name}"] = lambda plan=plan, out=out: plan.execute(out=out)
        pieces[f"bare cublasLtMatmul {name}"] = lambda plan=plan, out=out: plan._launch.run(out.data_ptr(), stream)
    for fn in pieces.values():
        for _ in range(10):
            fn()
    names = list(pieces)
    samples = shuffled_rounds(names, rounds, lambda n: burst_us(pieces[n]), shuffler=random.Random(1))
    print(f"\nhost µs per call, {shape.label}, N {shape.batch} (bursts of 200 that never wait; median of {rounds})")
    for name, values in zip(names, samples):
        print(f"  {name:48s} {statistics.median(values):8.1f}")
    for plan, _ in plans:
        plan.free()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="small", choices=list(SHAPES))
    parser.add_argument("--profile-shape", type=int, default=1, help="index of the shape to profile")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--breakdown-all", action="store_true", help="the host breakdown of every shape")
    options = parser.parse_args(argv)
    torch.backends.cudnn.benchmark = True
    shapes = SHAPES[options.shapes]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}; "
          f"µs per step, median of {options.rounds} interleaved rounds of {options.steps} steps")
    print(f"{'shape':44s} {'how':15s} {'cuDNN':>9s} {'Fused':>9s} {'ratio':>7s}")
    for shape in shapes:
        cases = _cases(shape)
        for run in cases.values():
            for _ in range(5):
                run()
        contestants = [(name, how) for how in ("issue", "sync", "calling-thread") for name in cases]
        samples = shuffled_rounds(contestants, options.rounds,
                                  lambda c: _time(cases[c[0]], c[1], options.steps), shuffler=random.Random(0))
        medians = {c: statistics.median(s) for c, s in zip(contestants, samples)}
        for how in ("issue", "sync", "calling-thread"):
            ours, theirs = medians["FusedConv2d", how], medians["cuDNN", how]
            print(f"{shape.label + ', N ' + str(shape.batch):44s} {how:15s} {theirs:9.1f} {ours:9.1f} "
                  f"{ours / theirs:7.3f}")
    shape = shapes[options.profile_shape]
    for each in (shapes if options.breakdown_all else [shape]):
        breakdown(each, options.rounds)
    cases = _cases(shape)
    run = cases["FusedConv2d"]
    for _ in range(20):
        run()
    torch.cuda.synchronize()
    print(f"\ncProfile of {options.steps} FusedConv2d steps, {shape.label} (own time first):")
    print(profiled(run, options.steps, rows=30))
    for name, step in cases.items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(20):
                step()
            torch.cuda.synchronize()
        print(f"\ntorch.profiler, {name}, 20 steps, CPU time by op:")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))


if __name__ == "__main__":
    main()
