"""``python -m nvblaslt.bench.mlp``: one training step of an MLP, FusedLinear against nn.Linear.

One step is forward + backward (no optimizer) of a 4-layer MLP, by default bf16, 8192 tokens,
widths 4096→16384→4096→16384→4096, the activation after every layer but the last. Rows, per
activation (ReLU, tanh-GELU), issue 13's table:

- ``nn.Linear`` + activation, eager;
- ``torch.compile`` of that model;
- the GEMM-only floor: the same GEMMs with no bias and no activation (bias-free nn.Linear layers);
- ``FusedLinear`` eager (``nvblaslt.torch.fuse`` of the same model, sharing its parameters);
- ``FusedLinear`` under ``torch.compile(fullgraph=True)``;

and, with ``--backward all``, a FusedLinear eager row for each ``FusedSequential.backward`` mode.
Under the table, a legend says which nvblaslt configuration each FusedLinear row ran: the backward
mode per activation, the epilogs it uses, and whether the plans were searched (``--search``:
one step of every fused model under ``nvblaslt.torch.autotune()`` first, winners remembered on disk).

Every row is timed in the same interleaved rounds (each case once per round, in a fresh order
each round; median), after warm-up (which includes compilation), so clock drift falls on all rows
alike. ``--timing``: by default the wall clock to a synchronize after each step, as a loop that logs
``loss.item()`` every step sees it (host time paid); ``spin``: CUDA events queued behind ~2 ms of GPU
work, GPU time with the host's time hidden; ``both``: a table for each, in rounds of their own. The JSON also keeps each row's host time to issue the step. ``nvblaslt bench
--sections mlp`` runs it as the bench's ``mlp`` section (``section``).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from typing import Any


from .common import captured, own_tuning_cache, progress
from .timing import TIMINGS, add_timing_argument, step_rounds, timing_modes

MODES = ("auto", "unfused", "bgradb", "epilog")
NAMES = {"relu": "ReLU", "gelu": "tanh-GELU"}
# what each FusedSequential.backward mode runs, per activation (forward; activation backward; bias gradient)
EPILOGS = {
    ("unfused", "relu"): "RELU_BIAS; torch threshold_backward; BGRADB",
    ("unfused", "gelu"): "GELU_AUX_BIAS; torch gelu_backward; BGRADB",
    ("bgradb", "relu"): "RELU_AUX_BIAS; DRELU in the next dx GEMM; BGRADB",
    ("bgradb", "gelu"): "GELU_AUX_BIAS; DGELU in the next dx GEMM; BGRADB",
    ("epilog", "relu"): "RELU_AUX_BIAS; DRELU_BGRAD in the next dx GEMM",
    ("epilog", "gelu"): "GELU_AUX_BIAS; DGELU_BGRAD in the next dx GEMM",
}


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


def _interleaved(torch, cases: list, rounds: int, warmup: int, cuda: bool,
                 timing: str = "sync") -> tuple[list[float], list[float]]:
    """(median ms, median host ms) of each case, every case once per round, each round in a fresh order
    (``nvblaslt._timing.shuffled_rounds``: no case always follows the same one), timed on CUDA as
    ``timing`` says (``timing.TIMINGS``). Host ms is the host's time to issue the step (wall clock on the
    CPU, where all are the same)."""
    for name, run in cases:
        _progress(f"warm-up: {name}")
        for _ in range(warmup):
            run()
    if cuda:
        torch.cuda.synchronize()
    return step_rounds(torch, cases, rounds, cuda, timing)


def _relative(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _resolved(mode: str, activation: str) -> str:
    if mode != "auto":
        return mode
    from nvblaslt.torch import AUTO_BACKWARD as _AUTO_BACKWARD

    return _AUTO_BACKWARD[activation] or "unfused"


def main(args=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m nvblaslt.bench.mlp", description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--widths", default="4096,16384,4096,16384,4096")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--activations", default="relu,gelu", help="comma-separated: relu, gelu")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="5 rounds, 2 warm-up steps")
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile rows")
    add_timing_argument(parser)
    parser.add_argument("--no-graphs", dest="graphs", action="store_false",
                        help="leave out the rows of each step captured in a CUDA graph (replayed: no host time)")
    parser.add_argument("--backward", choices=[*MODES, "all"], default="auto",
                        help="FusedSequential.backward of the FusedLinear rows; 'all' adds an eager row for "
                             "each mode besides 'auto'")
    parser.add_argument("--search", action="store_true",
                        help="first run one step of every fused model under nvblaslt.torch.autotune(): every "
                             "GEMM is searched and the winners remembered on disk (NVBLASLT_CACHE_DIR)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: a smoke test of this script (torch ops; wall-clock times mean nothing)")
    parser.add_argument("--json", help="write the results here")
    options = parser.parse_args(args)
    if options.quick:
        options.rounds, options.warmup = 5, 2
    if options.search:
        return _measure(options)
    # "heuristic plans" are the heuristics' own: a plan recalls what an earlier search stored on disk, so
    # this run reads and writes an empty tuning cache of its own
    with own_tuning_cache("nvblaslt-mlp-"):
        import nvblaslt

        nvblaslt.clear_plan_cache()  # plans an earlier section of `nvblaslt bench` made (this thread's only)
        return _measure(options)


def _measure(options) -> dict:
    import torch

    import nvblaslt
    from nvblaslt import torch as nvtorch

    cuda = options.device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("this benchmark needs an NVIDIA GPU (--device cpu only smoke-tests the script)")
    device, dtype = torch.device(options.device), getattr(torch, options.dtype)
    widths = [int(w) for w in options.widths.split(",")]
    activations = [a.strip() for a in options.activations.split(",") if a.strip()]
    mode = "auto" if options.backward == "all" else options.backward
    extra_modes = [m for m in MODES if m != "auto"] if options.backward == "all" else []
    plans = "searched plans" if options.search else "heuristic plans"
    started = time.time()

    generator = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(options.tokens, widths[0], device=device, dtype=dtype, generator=generator)
    grad = torch.randn(options.tokens, widths[-1], device=device, dtype=dtype, generator=generator)

    rows: list[tuple[str, str]] = []  # (key, label) in table order
    legend: dict[str, str] = {}  # FusedLinear row label -> its configuration
    cases: list[tuple[str, object]] = []  # ((activation, label), step)
    checks: dict[str, float] = {}
    for activation in activations:
        torch.manual_seed(0)
        reference = _mlp(torch, widths, activation, True, device, dtype)
        floor = _mlp(torch, widths, None, False, device, dtype)
        forms = {m: nvtorch.fuse(reference, backward=m) for m in [mode, *extra_modes]}  # sharing its parameters
        fused = forms[mode]
        fused_params = list(fused.parameters())

        if options.search:
            _progress(f"{activation}: searching every GEMM of the fused steps (remembered on disk)")
            with nvtorch.autotune():
                for model in forms.values():
                    _step(model, fused_params, x, grad)()

        # correctness first: each fused step against nn.Linear's, same parameters and inputs
        _step(reference, list(reference.parameters()), x, grad)()
        expected = [p.grad.clone() for p in reference.parameters()]
        for model in forms.values():
            _step(model, fused_params, x, grad)()
            worst = max(_relative(p.grad, e) for p, e in zip(fused_params, expected))
            checks[activation] = max(checks.get(activation, 0.0), worst)

        mine = [("eager", "nn.Linear + activation, eager", _step(reference, list(reference.parameters()), x, grad))]
        if not options.no_compile:
            mine.append(("compile", "torch.compile of that model",
                         _step(torch.compile(reference), list(reference.parameters()), x, grad)))
        mine.append(("floor", "GEMM-only floor (no bias, no activation)", _step(floor, list(floor.parameters()), x,
                                                                                 grad)))
        mine.append(("fused", "FusedLinear eager", _step(fused, fused_params, x, grad)))
        legend.setdefault("FusedLinear eager", f"backward={mode!r}")
        if not options.no_compile:
            mine.append(("fused_compile", "FusedLinear, torch.compile(fullgraph=True)",
                         _step(torch.compile(fused, fullgraph=True), fused_params, x, grad)))
            legend.setdefault("FusedLinear, torch.compile(fullgraph=True)", f"backward={mode!r}")
        if cuda and options.graphs:  # the whole step replayed: no host time in either
            for label, model, params in (("nn.Linear + activation, CUDA graph", reference,
                                          list(reference.parameters())),
                                         ("FusedLinear, CUDA graph", fused, fused_params)):
                graph, _ = captured(torch, _step(model, params, x, grad))
                mine.append((label, label, graph.replay))
        for other in extra_modes:
            label = f"FusedLinear eager [{other}]"
            mine.append((f"fused_{other}", label, _step(forms[other], fused_params, x, grad)))
            legend.setdefault(label, f"backward={other!r}")
        for key, label, run in mine:
            if (key, label) not in rows:
                rows.append((key, label))
            cases.append((f"{activation}: {label}", run))

    _progress(f"{len(cases)} cases, {options.warmup} warm-up steps each (compiling where asked)")
    modes = timing_modes(options.timing)
    shape = "→".join(map(str, widths))
    gpu = torch.cuda.get_device_name() if cuda else f"CPU ({platform.machine()})"
    version = getattr(nvblaslt.library(), "version_tuple", None) if cuda else None
    results: dict[str, Any] = {"rows": {}, "checks": checks, "options": vars(options), "gpu": gpu,
                               "torch": torch.__version__, "legend": {}, "timing": modes[0], "by_timing": {}}
    for index, timing in enumerate(modes):  # each mode in rounds of its own; the first after the warm-up
        medians, host = _interleaved(torch, cases, options.rounds, options.warmup if index == 0 else 0, cuda,
                                     timing)
        times, host_times = {}, {}
        for (label, _), ms, host_ms in zip(cases, medians, host):
            activation, _, row = label.partition(": ")
            times[activation, row], host_times[activation, row] = ms, host_ms
        print(f"one training step (forward + backward), {options.dtype}, tokens {options.tokens}, MLP {shape}; "
              f"median of {options.rounds} interleaved rounds, ms ({time.strftime('%Y-%m-%d')}); timed: "
              f"{TIMINGS[timing]}")
        print(f"{gpu}, torch {torch.__version__}, cuBLASLt {'.'.join(map(str, version)) if version else '?'}, "
              f"Python {platform.python_version()}")
        results["by_timing"][timing] = _table(rows, legend, activations, times, host_times)
    results["rows"] = results["by_timing"][modes[0]]
    print("* nvblaslt configuration of the FusedLinear rows (nvblaslt.torch.fuse(model, backward=…), " + plans + "):")
    for label, setting in legend.items():
        chosen = setting.split("=")[1].strip("'")
        parts = [f"{NAMES.get(a, a)}: {_resolved(chosen, a)} ({EPILOGS[_resolved(chosen, a), a]})"
                 for a in activations if (_resolved(chosen, a), a) in EPILOGS]
        print(f"  {label}: {setting}, {plans}; " + "; ".join(parts))
        results["legend"][label] = {"backward": chosen, "plans": plans,
                                    **{a: _resolved(chosen, a) for a in activations}}
    print("FusedLinear gradients vs nn.Linear's (largest relative difference over parameters and modes): "
          + ", ".join(f"{NAMES.get(a, a)} {checks[a]:.1e}" for a in activations))
    print(f"({time.time() - started:.0f} s in all, compilation included)")
    if options.json:
        with open(options.json, "w") as handle:
            json.dump(results, handle, indent=1)
    return results


def _table(rows: list[tuple[str, str]], legend: dict[str, str], activations: list[str], times: dict,
           host_times: dict) -> dict[str, dict]:
    """Print one timing mode's table; its rows as the JSON keeps them."""
    header = f"{'step':46s}" + "".join(f" | {NAMES.get(a, a):>9s} {'×eager':>7s} {'×floor':>7s}" for a in activations)
    print(header)
    print("-" * len(header))
    table: dict[str, dict] = {}
    floor_label = next(lb for k, lb in rows if k == "floor")
    for key, label in rows:
        line = f"{label + (' *' if label in legend else ''):46s}"
        for activation in activations:
            if (activation, label) not in times:
                line += f" | {'—':>9s} {'':7s} {'':7s}"
                continue
            ms = times[activation, label]
            eager = times[activation, rows[0][1]]
            floor_ms = times[activation, floor_label]
            line += f" | {ms:9.2f} {ms / eager:7.3f} {ms / floor_ms:7.3f}"
            table.setdefault(label, {})[activation] = {
                "ms": ms, "x_eager": ms / eager, "x_floor": ms / floor_ms, "host_ms": host_times[activation, label]}
        print(line)
    return table


# ---- the bench's mlp section ----------------------------------------------------------------------------
def section(args, torch, results: dict) -> None:
    """``nvblaslt bench --sections mlp``: this benchmark with the bench's ``--quick`` and ``--out``."""
    argv = ["--json", str(args.out / "mlp.json")] + (["--quick", "--no-compile"] if args.quick else [])
    progress(f"mlp: nvblaslt.bench.mlp.main({argv})")
    outcome = main(argv)
    results["mlp"] = outcome if isinstance(outcome, dict) else {"returned": repr(outcome)}
    results["mlp"]["summary_lines"] = short_table(results["mlp"])


def short_table(outcome: dict) -> list[str]:
    """Its table in short, for the bench's summary: each step's ms and × eager PyTorch, per activation."""
    rows = outcome.get("rows")
    if not isinstance(rows, dict):
        return []
    lines = []
    for label, per_activation in rows.items():
        cells = "  ".join(f"{activation} {figures['ms']:8.2f} ms {figures['x_eager']:6.3f}×"
                          for activation, figures in per_activation.items() if isinstance(figures, dict))
        lines.append(f"{label[:44]:44s} {cells}")
    return lines


if __name__ == "__main__":
    main()
