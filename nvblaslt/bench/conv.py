"""``python -m nvblaslt.bench.conv``: a Conv-Bias-ReLU training step, FusedConv2d against torch's conv2d.

One step is forward + backward (no optimizer; x requires grad, as inside a network) of one
``nn.Conv2d`` + bias + ``nn.ReLU``, channels-last, bf16 by default, on issue 25's shapes: the 1×1
(pointwise) convolutions of ResNet-50's bottlenecks, ConvNeXt-T and MobileNetV2 at batch 64-256, and
ResNet-50's 3×3 convolutions, which FusedConv2d runs through an im2col. Rows per shape:

- torch eager: ``nn.Conv2d`` + ``nn.ReLU`` (cuDNN, ``cudnn.benchmark`` on unless ``--no-cudnn-benchmark``);
- ``torch.compile`` of it (static shapes; its compilation is part of the warm-up, not the time);
- ``FusedConv2d`` eager, sharing the conv's parameters: RELU_BIAS forward; ReLU's backward from the
  output; BGRADB weight-and-bias-gradient GEMM; input-gradient GEMM (+ col2im for k×k);
- (k×k only) the im2col and col2im copies alone, as a fused step makes them (im2col in the forward and
  again for dW, col2im once): their share of the fused step is printed.

Every row of a shape is timed in the same interleaved rounds (each case once per round, in a fresh
order: ``nvblaslt._timing.shuffled_rounds``), median; the ratios are of the same run. ``--timing``: by
default the wall clock to a synchronize after each step, as a loop that logs the loss every step sees it
(the host's time to issue the step is paid); ``spin`` times CUDA events queued behind ~2 ms of GPU work,
GPU time with the host's time hidden; ``both`` prints each. The host's time to issue a step is kept too. The gradients of the fused step are checked against eager's
first. ``--quick`` (7 shapes, fewer rounds) takes about two minutes on an H100, the full run about five;
``--shapes small`` runs the six small pointwise layers alone. ``--device cpu`` smoke-tests the script (wall clock, meaningless times).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from typing import Any, NamedTuple


from .common import captured, progress
from .timing import TIMINGS, add_timing_argument, step_rounds, timing_modes



class Shape(NamedTuple):
    label: str
    batch: int
    in_channels: int
    out_channels: int
    size: int  # input height = width
    kernel: int = 1
    stride: int = 1
    padding: int = 0


POINTWISE = [
    Shape("ResNet-50 1×1 256→64 @56²", 128, 256, 64, 56),
    Shape("ResNet-50 1×1 64→256 @56²", 128, 64, 256, 56),
    Shape("ResNet-50 1×1 512→128 @28²", 256, 512, 128, 28),
    Shape("ResNet-50 1×1 128→512 @28²", 256, 128, 512, 28),
    Shape("ResNet-50 1×1 1024→256 @14²", 256, 1024, 256, 14),
    Shape("ResNet-50 1×1 512→2048 @7²", 256, 512, 2048, 7),
    Shape("ConvNeXt-T 1×1 96→384 @56²", 64, 96, 384, 56),
    Shape("ConvNeXt-T 1×1 384→96 @56²", 64, 384, 96, 56),
    Shape("ConvNeXt-T 1×1 384→1536 @14²", 128, 384, 1536, 14),
    Shape("MobileNetV2 1×1 24→144 @56²", 128, 24, 144, 56),
    Shape("MobileNetV2 1×1 144→24 @56²", 128, 144, 24, 56),
    Shape("MobileNetV2 1×1 96→576 @14²", 256, 96, 576, 14),
]
# Small pointwise layers, where the host's time to issue a step is most of it (an H200 run synced per step
# found FusedConv2d's step at 1.5-2.2× cuDNN's here before the eager path skipped the custom ops' dispatch)
SMALL = [
    Shape("EfficientNet-B0 1×1 40→240 @28²", 128, 40, 240, 28),
    Shape("EfficientNet-B0 1×1 240→40 @28²", 128, 240, 40, 28),
    Shape("ResNet-101 1×1 1024→256 @14²", 128, 1024, 256, 14),
    Shape("RegNet 1×1 368→368 @14²", 128, 368, 368, 14),
    Shape("ConvNeXt-B 1×1 128→512 @56²", 32, 128, 512, 56),
    Shape("ResNet-50 1×1 256→64 @56²", 32, 256, 64, 56),
]
KXK = [
    Shape("ResNet-50 3×3 64→64 @56²", 64, 64, 64, 56, 3, 1, 1),
    Shape("ResNet-50 3×3 256→256 @14²", 128, 256, 256, 14, 3, 1, 1),
    Shape("ResNet-50 3×3/2 128→128 @56²", 64, 128, 128, 56, 3, 2, 1),
]
SHAPES = {
    "full": POINTWISE + SMALL + KXK,
    "pointwise": POINTWISE + SMALL,
    "small": SMALL,
    "quick": [POINTWISE[0], POINTWISE[1], POINTWISE[6], POINTWISE[10], SMALL[0], SMALL[4], KXK[0]],
    "tiny": [Shape("pointwise 8→16 @6²", 2, 8, 16, 6), Shape("3×3 8→8 @6²", 2, 8, 8, 6, 3, 1, 1)],
}
ROWS = {"eager": "torch conv2d + bias + ReLU, eager", "compile": "torch.compile of it",
        "fused": "FusedConv2d eager", "fuse_sample": "fuse(…, sample=x)'s choice, eager",
        "im2col": "im2col + col2im alone",
        "eager_graph": "the eager step captured in a CUDA graph", "fused_graph": "FusedConv2d's step, CUDA graph"}


def _label(shape: Shape) -> str:
    return f"{shape.label}, N {shape.batch}"


def _interleaved(torch, cases: list, rounds: int, cuda: bool, timing: str) -> tuple[list[float], list[float]]:
    """(median ms, median host ms) of each (name, run) case, every case once per round in a fresh order."""
    return step_rounds(torch, cases, rounds, cuda, timing)


def training_step(model, x, grad):
    """forward + backward; gradients set to None first, as optimizer.zero_grad() does."""
    params = [x, *model.parameters()]

    def run():
        for p in params:
            p.grad = None
        model(x).backward(grad)
    return run


def _relative(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()


def _copies(torch, x, shape: Shape):
    """The im2col / col2im work of one fused step: im2col twice (forward; dW's backward), col2im once."""
    from nvblaslt.torch._im2col import Geometry, col2im, im2col, nhwc

    g = Geometry((shape.kernel,) * 2, (shape.stride,) * 2, (shape.padding,) * 2, (1, 1))
    xh = nhwc(x.detach())
    cols = im2col(xh, g)
    dcols = torch.randn_like(cols)

    def run():
        im2col(xh, g)
        im2col(xh, g)
        col2im(dcols, g, tuple(xh.shape))
    return run


def _measure_shape(torch, shape: Shape, options, device, dtype, compile_rows: bool) -> dict[str, Any]:
    from nvblaslt.torch import fuse
    from nvblaslt.torch._conv import FusedConv2d

    nn = torch.nn
    generator = torch.Generator(device=device).manual_seed(0)
    torch.manual_seed(0)
    conv = nn.Conv2d(shape.in_channels, shape.out_channels, shape.kernel, shape.stride, shape.padding,
                     device=device, dtype=dtype).to(memory_format=torch.channels_last)
    reference = nn.Sequential(conv, nn.ReLU())
    fused = FusedConv2d.from_conv(conv, "relu")  # the same parameters
    x = torch.randn(shape.batch, shape.in_channels, shape.size, shape.size, device=device, dtype=dtype,
                    generator=generator).contiguous(memory_format=torch.channels_last).requires_grad_()
    out_shape = reference(x).shape
    grad = torch.randn(out_shape, device=device, dtype=dtype,
                       generator=generator).contiguous(memory_format=torch.channels_last)

    # correctness first: the fused step's gradients against eager's, same parameters and inputs
    training_step(reference, x, grad)()
    expected = [t.grad.clone() for t in (x, *reference.parameters())]
    training_step(fused, x, grad)()
    check = max(_relative(t.grad, e) for t, e in zip((x, *reference.parameters()), expected))

    cases = [("eager", training_step(reference, x, grad))]
    if compile_rows:
        cases.append(("compile", training_step(torch.compile(reference, dynamic=False), x, grad)))
    cases.append(("fused", training_step(fused, x, grad)))
    # what fuse() keeps when it measures both on this input, synchronized per step
    chosen = fuse(nn.Sequential(conv, nn.ReLU()), convolutions=True, sample=x.detach())
    cases.append(("fuse_sample", training_step(chosen, x, grad)))
    fuse_converted = any(isinstance(m, FusedConv2d) for m in chosen.modules())
    if device.type == "cuda" and options.graphs:  # the whole step replayed: no host time in either
        for name, model in (("eager_graph", reference), ("fused_graph", fused)):
            graph, _ = captured(torch, training_step(model, x, grad))
            cases.append((name, graph.replay))
    if shape.kernel > 1:
        cases.append(("im2col", _copies(torch, x, shape)))
    warm_s, compile_error = {}, None
    for name, run in list(cases):
        begin = time.perf_counter()
        try:
            for _ in range(options.warmup):
                run()
        except Exception as error:  # torch.compile "if it works": a failure drops its row, said in the table
            if name != "compile":
                raise
            compile_error = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
            cases = [case for case in cases if case[0] != "compile"]
        if device.type == "cuda":
            torch.cuda.synchronize()
        warm_s[name] = time.perf_counter() - begin
    by_timing: dict[str, dict[str, Any]] = {}
    for timing in timing_modes(options.timing):  # each mode in rounds of its own
        medians, host = _interleaved(torch, cases, options.rounds, device.type == "cuda", timing)
        times = {name: value for (name, _), value in zip(cases, medians)}
        by_timing[timing] = {"ms": times, "host_ms": {name: value for (name, _), value in zip(cases, host)},
                             "x_eager": times["fused"] / times["eager"]}
        if "fuse_sample" in times:
            by_timing[timing]["x_fuse_sample"] = times["fuse_sample"] / times["eager"]
        if "fused_graph" in times:
            by_timing[timing]["x_graph"] = times["fused_graph"] / times["eager_graph"]
    first = by_timing[timing_modes(options.timing)[0]]  # the headline: sync per step unless asked otherwise
    ms = first["ms"]
    row: dict[str, Any] = {"label": _label(shape), "shape": shape._asdict(), "family":
                           "pointwise" if shape.kernel == 1 else f"{shape.kernel}×{shape.kernel}",
                           "ms": ms, "host_ms": first["host_ms"], "timing": timing_modes(options.timing)[0],
                           "by_timing": by_timing, "check": check, "warmup_s": warm_s, "x_eager": first["x_eager"]}
    if "x_graph" in first:
        row["x_graph"] = first["x_graph"]
    if "x_fuse_sample" in first:
        row["x_fuse_sample"], row["fuse_converted"] = first["x_fuse_sample"], fuse_converted
    if compile_error:
        row["compile_error"] = compile_error
    if "compile" in ms:
        row["x_compile"] = ms["fused"] / ms["compile"]
    if "im2col" in ms:
        row["im2col_share"] = ms["im2col"] / ms["fused"]
    return row


def _gmean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def summary(rows: list[dict], timing: str | None = None) -> list[str]:
    """The verdict lines under the table: per family, where FusedConv2d stands against eager and compile
    (timed as the rows' headline, or as ``timing``, one of the modes the rows were timed in)."""
    lines = []
    if timing is not None:
        rows = [{**r, "x_eager": r["by_timing"][timing]["x_eager"],
                 **({"x_compile": r["by_timing"][timing]["ms"]["fused"] / r["by_timing"][timing]["ms"]["compile"]}
                    if "compile" in r["ms"] else {})} for r in rows]
    for family in dict.fromkeys(r["family"] for r in rows):
        mine = [r for r in rows if r["family"] == family]
        eager = [r["x_eager"] for r in mine]
        text = (f"{family}: FusedConv2d ≤ 1.0× eager on {sum(v <= 1.0 for v in eager)}/{len(mine)} shapes "
                f"(geometric mean {_gmean(eager):.3f}×)")
        compiled = [r["x_compile"] for r in mine if "x_compile" in r]
        if compiled:
            text += (f"; ≤ torch.compile on {sum(v <= 1.0 for v in compiled)}/{len(compiled)} "
                     f"(geometric mean {_gmean(compiled):.3f}×)")
        shares = [r["im2col_share"] for r in mine if "im2col_share" in r]
        if shares:
            text += f"; im2col + col2im are {statistics.mean(shares):.0%} of the fused step on average"
        if family != "pointwise" and _gmean(eager) > 1.0:
            text += " — slower than cuDNN: no speed claim"
        lines.append(text)
        graphs = [r["x_graph"] for r in mine if "x_graph" in r]
        if graphs and timing is None:
            lines.append(f"{family}, each step replayed from a CUDA graph: FusedConv2d ≤ 1.0× cuDNN's graph on "
                         f"{sum(v <= 1.0 for v in graphs)}/{len(graphs)} shapes (geometric mean {_gmean(graphs):.3f}×)")
    measured = [r for r in rows if "x_fuse_sample" in r]
    if measured and timing is None:
        worst = max(measured, key=lambda r: r["x_fuse_sample"])
        lines.append(f"fuse(…, sample=x): converted {sum(r['fuse_converted'] for r in measured)}/{len(measured)} "
                     f"layers; the model it returns ≤ 1.0× eager on {sum(r['x_fuse_sample'] <= 1.0 for r in measured)}"
                     f"/{len(measured)} shapes, ≤ 1.02× on {sum(r['x_fuse_sample'] <= 1.02 for r in measured)}, worst "
                     f"{worst['x_fuse_sample']:.3f}× ({worst['label']}, "
                     f"{'converted' if worst['fuse_converted'] else 'left unfused'})")
    pointwise = [r["x_eager"] for r in rows if r["family"] == "pointwise"]
    if pointwise and timing is None:
        verdict = "pays" if _gmean(pointwise) <= 1.0 else "does not pay"
        lines.append(f"fuse(): converting pointwise Conv2d + ReLU {verdict} here (geometric mean "
                     f"{_gmean(pointwise):.3f}× eager); k×k stays nn.Conv2d (nvblaslt.torch._conv.FUSED_KERNELS)")
    return lines


def main(args=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m nvblaslt.bench.conv", description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", choices=list(SHAPES), help="which shapes (default: full; quick with --quick)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--rounds", type=int, help="interleaved rounds per shape (default 20, quick 7)")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up steps per case (compilation included)")
    parser.add_argument("--quick", action="store_true", help="7 shapes, 7 rounds, 2 warm-up steps: about two minutes")
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile rows")
    parser.add_argument("--compile-budget", type=float,
                        help="seconds of torch.compile warm-up (compilation) after which the remaining shapes go "
                             "without the compile row, said in the table (default 150, quick 50)")
    add_timing_argument(parser)
    parser.add_argument("--no-graphs", dest="graphs", action="store_false",
                        help="leave out the rows of each step captured in a CUDA graph (replayed: no host time)")
    parser.add_argument("--no-cudnn-benchmark", action="store_true", help="cuDNN's heuristics instead of its search")
    parser.add_argument("--search", action="store_true",
                        help="first run one fused step per shape under nvblaslt.torch.autotune() (slow; winners "
                             "remembered on disk)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: a smoke test of this script (torch ops; wall-clock times mean nothing)")
    parser.add_argument("--json", help="write the results here")
    options = parser.parse_args(args)
    if options.quick:
        options.warmup = min(options.warmup, 2)
    options.rounds = options.rounds or (7 if options.quick else 20)
    if options.compile_budget is None:
        options.compile_budget = 50.0 if options.quick else 150.0
    shapes = SHAPES[options.shapes or ("quick" if options.quick else "full")]

    import torch

    import nvblaslt

    cuda = options.device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("this benchmark needs an NVIDIA GPU (--device cpu only smoke-tests the script)")
    device, dtype = torch.device(options.device), getattr(torch, options.dtype)
    if not cuda and dtype != torch.float32:
        dtype = torch.float32  # the CPU smoke test: bf16 convolutions on the CPU are slow and beside the point
    torch.backends.cudnn.benchmark = not options.no_cudnn_benchmark
    started = time.time()
    rows = []
    compiling_s = 0.0
    for index, shape in enumerate(shapes):
        progress(f"conv {index + 1}/{len(shapes)}: {_label(shape)}")
        if options.search and cuda:
            from nvblaslt.torch import autotune
            from nvblaslt.torch._conv import FusedConv2d

            layer = FusedConv2d(shape.in_channels, shape.out_channels, shape.kernel, shape.stride, shape.padding,
                                activation="relu", device=device, dtype=dtype)
            x = torch.randn(shape.batch, shape.in_channels, shape.size, shape.size, device=device,
                            dtype=dtype).contiguous(memory_format=torch.channels_last).requires_grad_()
            with autotune():
                layer(x).sum().backward()
            del layer, x
        compile_rows = not options.no_compile and compiling_s < options.compile_budget
        rows.append(_measure_shape(torch, shape, options, device, dtype, compile_rows))
        compiling_s += rows[-1]["warmup_s"].get("compile", 0.0)
        if cuda:
            torch._dynamo.reset()
            torch.cuda.empty_cache()

    gpu = torch.cuda.get_device_name() if cuda else f"CPU ({platform.machine()})"
    version = getattr(nvblaslt.library(), "version_tuple", None) if cuda else None
    dtype_name = str(dtype).removeprefix("torch.")
    modes = timing_modes(options.timing)
    print(f"Conv2d + bias + ReLU, one training step (forward + backward, x requires grad), {dtype_name}, "
          f"channels-last; median of {options.rounds} interleaved rounds, ms ({time.strftime('%Y-%m-%d')}); "
          f"timed: {TIMINGS[modes[0]]}")
    print(f"{gpu}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version() if cuda else '-'} "
          f"(benchmark {'on' if torch.backends.cudnn.benchmark else 'off'}), cuBLASLt "
          f"{'.'.join(map(str, version)) if version else '-'}, Python {platform.python_version()}")
    header = (f"{'shape':42s} {'eager':>8s} {'compile':>8s} {'fused':>8s} {'×eager':>7s} {'×compile':>8s} "
              f"{'im2col':>7s} {'host ms e/f':>12s} {'grad diff':>9s}"
              + "".join(f" {'×eager ' + mode:>12s}" for mode in modes[1:]) + f" {'graph ×':>8s} {'fuse(x) ×':>11s}")
    print(header)
    print("-" * len(header))
    for row in rows:
        ms, host = row["ms"], row["host_ms"]
        compile_ms = f"{ms['compile']:8.3f}" if "compile" in ms else f"{'—':>8s}"
        x_compile = f"{row['x_compile']:8.3f}" if "x_compile" in row else f"{'—':>8s}"
        share = f"{row['im2col_share']:7.0%}" if "im2col_share" in row else f"{'':7s}"
        print(f"{row['label']:42s} {ms['eager']:8.3f} {compile_ms} {ms['fused']:8.3f} {row['x_eager']:7.3f} "
              f"{x_compile} {share} {host['eager']:5.2f}/{host['fused']:<6.2f} {row['check']:9.1e}"
              + "".join(f" {row['by_timing'][mode]['x_eager']:12.3f}" for mode in modes[1:])
              + (f" {row['x_graph']:8.3f}" if "x_graph" in row else f" {'—':>8s}")
              + (f" {row['x_fuse_sample']:9.3f} {'F' if row['fuse_converted'] else 'U'}" if "x_fuse_sample" in row
                 else f" {'—':>11s}"))
    print("columns: eager = " + ROWS["eager"] + "; compile = " + ROWS["compile"] + "; fused = " + ROWS["fused"]
          + " (RELU_BIAS; ReLU backward from y; BGRADB; dx GEMM; k×k through im2col/col2im); im2col = share of "
          "the fused step spent in " + ROWS["im2col"] + "; host ms = the host's time to issue a step, eager/fused; "
          "grad diff = fused vs eager gradients (relative)"
          + "".join(f"; ×eager {mode} = the same ratio timed as {TIMINGS[mode]}" for mode in modes[1:])
          + "; graph × = " + ROWS["fused_graph"] + " over " + ROWS["eager_graph"] + " (replays: no host time)"
          + "; fuse(x) × = " + ROWS["fuse_sample"] + " over eager, F: it fused the layer, U: left it unfused")
    skipped = [r["label"] for r in rows if "compile" not in r["ms"] and "compile_error" not in r]
    if skipped and not options.no_compile:
        print(f"no torch.compile row for {len(skipped)} shape(s): the compile budget ({options.compile_budget:.0f} s "
              f"of compilation) was spent")
    for r in rows:
        if "compile_error" in r:
            print(f"torch.compile failed for {r['label']}: {r['compile_error']}")
    lines = summary(rows)
    for mode in modes[1:]:
        lines += [f"[{mode}] {line}" for line in summary(rows, mode)]
    for line in lines:
        print(line)
    print(f"({time.time() - started:.0f} s in all, compilation included)")
    results = {"rows": rows, "summary": lines, "gpu": gpu, "torch": torch.__version__,
               "cublaslt": ".".join(map(str, version)) if version else None, "options": vars(options)}
    if options.json:
        with open(options.json, "w") as handle:
            json.dump(results, handle, indent=1)
    return results


# ---- as a section of nvblaslt bench ----------------------------------------------------------------------------
def section(args, torch, results: dict) -> None:
    """``nvblaslt bench --sections conv``: this benchmark with the bench's ``--quick`` and ``--out``."""
    argv = ["--json", str(args.out / "conv.json")] + (["--quick"] if args.quick else [])
    progress(f"conv: nvblaslt.bench.conv.main({argv})")
    outcome = main(argv)
    results["conv"] = outcome
    results["conv"]["summary_lines"] = [f"{r['label'][:44]:44s} {r['ms']['fused']:8.3f} ms {r['x_eager']:6.3f}× eager"
                                        for r in outcome["rows"]] + outcome["summary"]


if __name__ == "__main__":
    main()
