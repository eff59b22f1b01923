"""Probe (GPU): grouped GEMM's host path against ``torch._grouped_mm`` (issue 33 target 3).

For each experts shape (Mixtral-8x7B up, Qwen3-30B-A3B, DeepSeek-V3 and gpt-oss-20b at 8192 tokens, Qwen3 at
1024; bf16, balanced routing, the bench's split) two things are timed in interleaved rounds:

- the forward, no gradient: ``torch._grouped_mm`` (the baseline), ``nvblaslt.torch.grouped_mm``,
  ``nvblaslt.grouped_matmul()``, and a ``GroupedMatmul`` plan's ``execute()`` given its operands each call, and
  with ``out=`` (the stateful plan: its layout key proved on the first call, pointers alone after);
- the training step, the bench's way (``nvblaslt/bench/grouped.py``: ``.grad`` cleared, ``forward().backward(g)``
  into the input's and the weights' ``.grad``): through ``torch._grouped_mm`` (the baseline) and
  ``nvblaslt.torch.grouped_mm``; beside them the step's three GEMMs through ``grouped_matmul()`` without
  autograd (forward, input gradient, weight gradient), what autograd adds over them.

Each is timed two ways: ``issue``, the host's µs per call over a burst that never waits (drained before and
after), and ``sync``, the wall µs per call with a synchronize after each (a loop that logs its loss). Medians
of the rounds, and each one's ratio to torch's. Then the floor under the forward: the issue µs of its pieces
alone (the result's allocation, the derive kernel's launch, the bare ``cublasLtMatmul`` with prebuilt
arguments, and torch's ``_grouped_mm``). ``--profile`` runs the forward and the training step under
cProfile (own time first). Needs cuBLASLt 13.4 or newer (``NVBLASLT_LIBRARY``).

    python -m tools.probe_grouped_host [--rounds 3] [--calls 100] [--profile] [--shapes Qwen3,Mixtral]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any, NamedTuple

import torch

import nvblaslt
import nvblaslt.torch as nvt
from nvblaslt._timing import shuffled_rounds
from nvblaslt.bench.grouped import split
from tools.probe_conv_host import burst_us, profiled  # host µs per call over a burst that never waits; cProfile
from tools.probe_decode_host import _sync_us  # wall µs per call with a synchronize after each


class Shape(NamedTuple):
    label: str
    groups: int
    k: int
    n: int
    tokens: int


SHAPES = (Shape("Mixtral up", 8, 4096, 14336, 8192), Shape("Qwen3", 128, 2048, 768, 8192),
          Shape("DeepSeek-V3", 256, 7168, 2048, 8192), Shape("gpt-oss-20b", 32, 2880, 5760, 8192),
          Shape("Qwen3 1k", 128, 2048, 768, 1024))
FORWARD = ("torch._grouped_mm", "nvt.grouped_mm", "grouped_matmul()", "execute()", "execute(out=)")
STEP = ("torch._grouped_mm step", "nvt.grouped_mm step", "grouped_matmul() x3")
PIECES = ("result allocation", "derive kernel", "cublasLtMatmul", "torch._grouped_mm")
BUDGET_S = 0.08  # GPU time per measurement: enough calls to average, few enough for the whole run to fit


def _case(shape: Shape) -> dict[str, Any]:
    """The shape's operands and every call timed on them, checked against torch's results and warm."""
    sizes = split(torch, shape.tokens, shape.groups, False, seed=shape.groups + shape.tokens)
    offs = sizes.cumsum(0).to(device="cuda", dtype=torch.int32)
    generator = torch.Generator(device="cuda").manual_seed(shape.groups)
    x = torch.randn(shape.tokens, shape.k, device="cuda", dtype=torch.bfloat16, generator=generator)
    weights = (torch.randn(shape.groups, shape.n, shape.k, device="cuda", generator=generator)
               / shape.k ** 0.5).to(torch.bfloat16)
    grad = torch.randn(shape.tokens, shape.n, device="cuda", dtype=torch.bfloat16, generator=generator)
    w = weights.transpose(1, 2)  # the experts' weights as a layer passes them
    x_train, weights_train = x.clone().requires_grad_(), weights.clone().requires_grad_()

    def step(forward):
        def run():
            x_train.grad = weights_train.grad = None
            forward(x_train, weights_train.transpose(1, 2)).backward(grad)
            return x_train.grad, weights_train.grad
        return run

    plan = nvblaslt.GroupedMatmul(x, w, offs)  # the stateful form, given its operands on every call
    plan.plan()
    into = plan.execute(x, w, offs)

    def function_form_step():  # the step's three GEMMs as the op's backward runs them, no autograd
        return (nvblaslt.grouped_matmul(x, w, offs), nvblaslt.grouped_matmul(grad, weights, offs),
                nvblaslt.grouped_matmul(grad.T, x, offs))
    calls = {
        "torch._grouped_mm": lambda: torch._grouped_mm(x, w, offs=offs),
        "nvt.grouped_mm": lambda: nvt.grouped_mm(x, w, offs),
        "grouped_matmul()": lambda: nvblaslt.grouped_matmul(x, w, offs),
        "execute()": lambda: plan.execute(x, w, offs),
        "execute(out=)": lambda: plan.execute(x, w, offs, out=into),
        "torch._grouped_mm step": step(lambda a, b: torch._grouped_mm(a, b, offs=offs)),
        "nvt.grouped_mm step": step(lambda a, b: nvt.grouped_mm(a, b, offs)),
        "grouped_matmul() x3": function_form_step,
    }
    expected = calls["torch._grouped_mm"]().float()
    for name in FORWARD[1:]:
        torch.testing.assert_close(calls[name]().float(), expected, atol=0.05, rtol=0.02)
    expected_grads = [g.float() for g in calls["torch._grouped_mm step"]()]
    for got, want in zip(calls["nvt.grouped_mm step"](), expected_grads):
        torch.testing.assert_close(got.float(), want, atol=0.5, rtol=0.05)
    for call in calls.values():  # plans made and bound (grouped_mm binds a call the second time it is checked)
        for _ in range(3):
            call()
    torch.cuda.synchronize()
    return {"calls": calls, "operands": (x, w, offs), "plan": plan}


def _calls_for(call, most: int) -> int:
    """Calls per measurement: ``most``, fewer where one call's GPU time would make the run too long."""
    seconds = _sync_us(call, 3) / 1e6
    return max(10, min(most, int(BUDGET_S / max(seconds, 1e-6))))


def _pieces(case: dict[str, Any], calls: int) -> dict[str, float]:
    """Issue µs of the forward's pieces alone, on a plan made for the case (a floor for the host path)."""
    x, w, offs = case["operands"]
    stream = torch.cuda.current_stream().cuda_stream
    plan = nvblaslt.GroupedMatmul(x, w, offs)
    plan.plan()
    out = plan.execute()
    problem, launch, arrays = plan._problem, plan._launch, plan._arrays
    bases = (w.data_ptr(), x.data_ptr(), out.data_ptr())
    lds = (problem.a.ld, problem.b.ld, problem.d.ld)
    pieces = {"result allocation": lambda: x.new_empty_strided(tuple(out.shape), out.stride()),
              "derive kernel": lambda: arrays.derive(offs.data_ptr(), False, problem.total, bases, lds, stream),
              "cublasLtMatmul": lambda: launch.run(plan._d_array, stream),
              "torch._grouped_mm": case["calls"]["torch._grouped_mm"]}
    samples = shuffled_rounds(list(pieces), 3, lambda name: burst_us(pieces[name], calls),
                              shuffler=random.Random(7))
    torch.cuda.synchronize()
    plan.free()
    return {name: statistics.median(s) for name, s in zip(pieces, samples)}


def _row(label: str, names: tuple[str, ...], medians: dict) -> None:
    for how in ("issue", "sync"):
        base = medians[names[0], how]
        cells = [f"{base:8.1f}       "] + [f"{medians[name, how]:8.1f} ({medians[name, how] / base:4.2f})"
                                          for name in names[1:]]
        print(f"{label:12s} {how:5s} " + " ".join(f"{cell:>16s}" for cell in cells), flush=True)


def _measure(shape: Shape, rounds: int, most_calls: int) -> tuple[dict, dict[str, float]]:
    """One shape's medians by (name, how), and its pieces' issue µs; its tensors go when it returns."""
    case = _case(shape)
    calls = {name: _calls_for(call, most_calls) for name, call in case["calls"].items()}
    entries = [(name, how) for how in ("issue", "sync") for name in FORWARD + STEP]
    timers = {"issue": burst_us, "sync": _sync_us}
    samples = shuffled_rounds(entries, rounds, lambda e: timers[e[1]](case["calls"][e[0]], calls[e[0]]),
                              shuffler=random.Random(shape.groups + shape.tokens))
    print(f"{shape.label} ({shape.groups} experts, K {shape.k}, N {shape.n}, {shape.tokens} tokens; "
          f"{min(calls.values())}-{max(calls.values())} calls per measurement)")
    pieces = _pieces(case, min(most_calls, 100))
    torch.cuda.synchronize()
    case["plan"].free()
    return {entry: statistics.median(s) for entry, s in zip(entries, samples)}, pieces


def table(shapes: list[Shape], rounds: int, most_calls: int) -> None:
    print(f"{'':12s} {'how':5s} " + " ".join(f"{name:>16s}" for name in FORWARD)
          + "   (train step: torch, nvt.grouped_mm, grouped_matmul() x3 with no autograd)")
    floors = {}
    for shape in shapes:
        medians, floors[shape.label] = _measure(shape, rounds, most_calls)
        _row("  forward", FORWARD, medians)
        _row("  train step", STEP, medians)
        torch.cuda.empty_cache()
    print("\nThe forward's pieces alone, host µs to issue one (the floor under nvt.grouped_mm's issue time):")
    print(f"{'shape':12s} " + " ".join(f"{name:>18s}" for name in PIECES))
    for label, pieces in floors.items():
        print(f"{label:12s} " + " ".join(f"{pieces[name]:18.1f}" for name in PIECES), flush=True)


def profile(shape: Shape, calls: int) -> None:
    """cProfile of ``nvt.grouped_mm``'s forward and of its training step (own time first)."""
    case = _case(shape)
    for name, count in (("nvt.grouped_mm", calls), ("nvt.grouped_mm step", max(1, calls // 4))):
        print(f"\ncProfile of {count} calls of {name}, {shape.label} (own time first):")
        print(profiled(case["calls"][name], count))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians)")
    parser.add_argument("--calls", type=int, default=100, help="most calls per measurement")
    parser.add_argument("--shapes", default="", help="comma-separated label prefixes (default: all)")
    parser.add_argument("--profile", action="store_true", help="cProfile the forward and the step after the table")
    parser.add_argument("--profile-calls", type=int, default=2000)
    options = parser.parse_args(argv)
    wanted = [prefix.strip() for prefix in options.shapes.split(",") if prefix.strip()]
    shapes = [s for s in SHAPES if not wanted or any(s.label.startswith(prefix) for prefix in wanted)]
    lib = nvblaslt.library()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuBLASLt {lib.version}; bf16, balanced "
          f"routing; µs per call, median of {options.rounds} interleaved rounds; (ratio to torch._grouped_mm's)")
    began = time.perf_counter()
    table(shapes, options.rounds, options.calls)
    if options.profile:
        profile(next((s for s in shapes if s.label == "Qwen3 1k"), shapes[-1]), options.profile_calls)
    print(f"\n{time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
