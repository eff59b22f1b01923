"""``python -m nvblaslt.bench.grouped``: mixture-of-experts grouped GEMMs, nvblaslt against torch.

Issue 24's expert shapes (Mixtral-8x7B G=8 K=4096 N=14336, and back; Qwen3-30B-A3B G=128 K=2048
N=768; DeepSeek-V3 G=256 K=7168 N=2048), bf16, at 8k and 32k tokens, routed balanced and skewed (a
few experts take most tokens, some none). The experts' weights are stored (G, N, K) as
``nn.Linear`` keeps them. Rows per case, all timed in the same interleaved rounds (each once per
round, in a fresh order), median; ``--timing sync`` (the default) times the wall clock over bursts of
calls with a synchronize after each call, as a loop that waits for every step sees it (host time paid);
``--timing spin`` times CUDA events around the bursts (GPU time; the host's time hidden while the GPU is
the slower). Rows:

- ``torch._grouped_mm`` (CUTLASS on Hopper), where this torch has it;
- a per-expert ``torch.mm`` loop over the same split (its offsets read on the host once, before timing);
- ``nvblaslt.grouped_matmul`` (its cached plan: the heuristics' first algorithm, or a tuned one the cache holds);
- ``GroupedMatmul.execute(out=)`` with every algorithm the heuristics offer, the best kept;
- ``GroupedMatmul.execute()`` after ``autotune()`` (its pick, allocating the result as the function form does);
- with ``--search``, ``GroupedMatmul.execute()`` after ``autotune(search=True)``, its tuning report printed;
- ``grouped_matmul`` on the same values in fp8 (E4M3, the weights' per-tensor scale), a bfloat16 result.

Each result is checked against the loop's first (bf16 rounding) before timing. TFLOP/s count 2·ΣM·K·N.
The ``train`` section times the experts layer's forward + backward (input and weight gradients) the
three ways, under autograd: ``nvblaslt.torch.grouped_mm``, ``torch._grouped_mm``, the loop (6·ΣM·K·N);
ours and torch's also through ``backward()`` into ``.grad`` (as a training loop runs them), eager and
captured in a CUDA graph (the GPU's time alone);
then its three GEMMs one at a time (forward, input gradient, weight gradient; bursts of 5 calls), and the
same after each is autotuned and remembered (in a tuning cache of the run's own; ``--no-tune`` leaves it
out). Steps run in bursts of about 2 ms; the loop in rounds of its own. The host time of each piece of
the step (``host_rows``) is printed under it.
``--quick`` runs the 8k-token cases only. Needs cuBLASLt 13.4 or newer (``NVBLASLT_LIBRARY``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
from typing import Any, NamedTuple

from .common import captured, free_memory, max_relative, progress
from .timing import TIMINGS, add_timing_argument, event_rounds, wall_rounds


class Experts(NamedTuple):
    label: str
    groups: int
    k: int
    n: int


SHAPES = [Experts("Mixtral-8x7B up", 8, 4096, 14336), Experts("Mixtral-8x7B down", 8, 14336, 4096),
          Experts("Qwen3-30B-A3B", 128, 2048, 768), Experts("DeepSeek-V3", 256, 7168, 2048)]


def split(torch, tokens: int, groups: int, skewed: bool, seed: int):
    """Tokens per expert: even, or skewed (weights ~ U⁴: a few experts take most, some get none)."""
    generator = torch.Generator().manual_seed(seed)
    if not skewed:
        sizes = torch.full((groups,), tokens // groups, dtype=torch.long)
    else:
        weights = torch.rand(groups, generator=generator) ** 4
        weights[torch.randperm(groups, generator=generator)[: max(1, groups // 8)]] = 0  # empty experts
        sizes = (weights / weights.sum() * tokens).floor().long()
    sizes[0] += tokens - int(sizes.sum())
    return sizes


def run_case(torch, nvblaslt, shape: Experts, tokens: int, skewed: bool, rounds: int, calls: int,
             search: bool = False, timer=event_rounds) -> dict[str, Any]:
    sizes = split(torch, tokens, shape.groups, skewed, seed=shape.groups + tokens)
    offs = sizes.cumsum(0).to(device="cuda", dtype=torch.int32)
    x = torch.randn(tokens, shape.k, device="cuda", dtype=torch.bfloat16)
    weights = torch.randn(shape.groups, shape.n, shape.k, device="cuda", dtype=torch.bfloat16) / shape.k ** 0.5
    b = weights.transpose(1, 2)
    ends = offs.tolist()
    starts = [0, *ends[:-1]]

    def loop():
        out = torch.empty(tokens, shape.n, device="cuda", dtype=torch.bfloat16)
        for g, (s, e) in enumerate(zip(starts, ends)):
            if e > s:
                torch.mm(x[s:e], b[g], out=out[s:e])
        return out

    cases: list[tuple[str, Any]] = [("torch mm loop", loop)]
    try:
        grouped_mm = torch._grouped_mm
    except AttributeError:  # a torch without it (before 2.8)
        pass
    else:
        cases.append(("torch._grouped_mm", lambda: grouped_mm(x, b, offs=offs)))
    cases.append(("nvblaslt.grouped_matmul", lambda: nvblaslt.grouped_matmul(x, b, offs)))
    # fp8: the same tokens and weights in E4M3, the weights scaled into its range by a per-tensor scale
    # (its error against the bf16 loop is E4M3's rounding, a few per cent)
    weight_scale = weights.abs().max().float() / 448
    x8, b8 = x.to(torch.float8_e4m3fn), (b / weight_scale).to(torch.float8_e4m3fn)
    scale = weight_scale.reshape(1)
    cases.append(("nvblaslt fp8 E4M3, bf16 out", lambda: nvblaslt.grouped_matmul(x8, b8, offs, scale_b=scale)))
    plan = nvblaslt.GroupedMatmul(x, b, offs)
    algorithms = plan.plan(limit=16)
    out = torch.empty(tokens, shape.n, device="cuda", dtype=torch.bfloat16)
    reference = loop()
    errors = {}
    for name, fn in cases:
        errors[name] = max_relative(torch, fn(), reference)
    per_algorithm = []
    for index, result in enumerate(algorithms):  # the heuristics' algorithms, each timed alone: the best is kept
        plan.select(result)
        errors[f"algorithm #{index} (id {result.algo_id})"] = max_relative(torch, plan.execute(out=out), reference)
        per_algorithm.append(statistics.median(
            event_rounds(torch, [("one", lambda: plan.execute(out=out))], max(3, rounds // 2), calls)[0]))
    best = min(range(len(algorithms)), key=per_algorithm.__getitem__)
    plan.select(algorithms[best])
    errors["GroupedMatmul best of heuristics"] = errors[f"algorithm #{best} (id {algorithms[best].algo_id})"]
    cases.append(("GroupedMatmul best of heuristics", lambda: plan.execute(out=out)))
    reports = {}
    with contextlib.ExitStack() as plans:
        tuned = plans.enter_context(nvblaslt.GroupedMatmul(x, b, offs))
        tuned.plan(limit=16)
        tuned.autotune(remember=False)  # autotune()'s own pick (L2 flushed), as a tuned function form runs it
        errors["GroupedMatmul autotuned, execute()"] = max_relative(torch, tuned.execute(), reference)
        cases.append(("GroupedMatmul autotuned, execute()", lambda: tuned.execute()))
        if search:  # beyond the heuristics' list: only a challenger faster beyond noise replaces autotune's pick
            searched = plans.enter_context(nvblaslt.GroupedMatmul(x, b, offs))
            searched.plan(limit=16)
            searched.autotune(search=True, remember=False)
            reports["GroupedMatmul searched, execute()"] = str(searched.tuning_report)
            errors["GroupedMatmul searched, execute()"] = max_relative(torch, searched.execute(), reference)
            cases.append(("GroupedMatmul searched, execute()", lambda: searched.execute()))
        times = timer(torch, cases, rounds, calls, seed=tokens)
    flops = 2 * tokens * shape.k * shape.n
    rows = {name: {"ms": statistics.median(t), "tflops": flops / statistics.median(t) / 1e9} for (name, _), t in
            zip(cases, times)}
    plan.free()
    return {"shape": shape.label, "groups": shape.groups, "k": shape.k, "n": shape.n, "tokens": tokens,
            "routing": "skewed" if skewed else "balanced", "empty_groups": int((sizes == 0).sum()),
            "rows": rows, "errors": errors, "algorithms": [r.algo_id for r in algorithms], "reports": reports,
            "algorithm_ms": per_algorithm}


class _Step(NamedTuple):
    x: Any
    weights: Any
    grad: Any
    offs: Any
    loop: Any
    ours: Any
    theirs: Any  # torch._grouped_mm's step, or None on a torch without it
    ours_backward: Any  # the same steps through backward(), the gradients accumulated into .grad as a training
    theirs_backward: Any  # loop has them (autograd then copies a gradient whose layout is not its tensor's)


def _step(torch, shape: Experts, tokens: int, skewed: bool, device: str, dtype) -> _Step:
    """The experts layer's operands and its training step three ways (each returns the input and weight
    gradients)."""
    from nvblaslt.torch import grouped_mm

    sizes = split(torch, tokens, shape.groups, skewed, seed=shape.groups + tokens + 1)
    offs = sizes.cumsum(0).to(device=device, dtype=torch.int32)
    x = torch.randn(tokens, shape.k, device=device, dtype=dtype, requires_grad=True)
    weights = (torch.randn(shape.groups, shape.n, shape.k, device=device) / shape.k ** 0.5).to(dtype).requires_grad_()
    grad = torch.randn(tokens, shape.n, device=device, dtype=dtype)
    ends = offs.tolist()
    starts = [0, *ends[:-1]]

    def loop():
        out = torch.cat([x[s:e] @ weights[g].T for g, (s, e) in enumerate(zip(starts, ends))])
        return torch.autograd.grad(out, (x, weights), grad)

    def ours():
        return torch.autograd.grad(grouped_mm(x, weights.transpose(1, 2), offs), (x, weights), grad)

    def accumulating(forward):
        def step():
            x.grad = weights.grad = None
            forward().backward(grad)
            return x.grad, weights.grad
        return step

    try:
        torch_grouped = torch._grouped_mm
    except AttributeError:  # a torch without it (before 2.8)
        theirs = theirs_backward = None
    else:
        def theirs():
            return torch.autograd.grad(torch_grouped(x, weights.transpose(1, 2), offs=offs), (x, weights), grad)
        theirs_backward = accumulating(lambda: torch_grouped(x, weights.transpose(1, 2), offs=offs))
    return _Step(x, weights, grad, offs, loop, ours, theirs,
                 accumulating(lambda: grouped_mm(x, weights.transpose(1, 2), offs)), theirs_backward)


def train_case(torch, shape: Experts, tokens: int, skewed: bool, rounds: int, *, device: str = "cuda",
               dtype=None, timer=event_rounds) -> dict[str, Any]:
    """One experts layer's forward + backward (input and weight gradients): ``nvblaslt.torch.grouped_mm``,
    ``torch._grouped_mm`` under autograd where this torch has it (each through ``autograd.grad`` and through
    ``backward()`` into ``.grad``, and that captured in a CUDA graph), and a per-expert ``torch.mm`` loop; then
    the step's three GEMMs one at a time. Plans as the tuning cache has them (none tuned, in the bench)."""
    step = _step(torch, shape, tokens, skewed, device, dtype or torch.bfloat16)
    cases: list[tuple[str, Any]] = [("torch mm loop", step.loop), ("nvblaslt.torch.grouped_mm", step.ours),
                                    ("nvblaslt.torch.grouped_mm, backward()", step.ours_backward)]
    if step.theirs is not None:
        cases += [("torch._grouped_mm", step.theirs), ("torch._grouped_mm, backward()", step.theirs_backward)]
    if device == "cuda":  # the backward() steps captured in CUDA graphs: the GPU's time alone, no host path
        for name, fn in list(cases):
            if name.endswith("backward()"):
                cases.append((name.replace("backward()", "backward(), CUDA graph"), graphed(torch, fn)))
    reference = step.loop()
    errors, refused = {}, {}
    for name, fn in list(cases):
        try:
            got = fn()
        except RuntimeError as error:  # torch._grouped_mm takes bf16/fp16/fp32 on some GPUs only
            refused[name] = f"{type(error).__name__}: {error}"
            cases.remove((name, fn))
            continue
        errors[name] = max(max_relative(torch, g, r) for g, r in zip(got, reference))
        del got
    del reference
    times = _step_times(torch, cases, rounds, timer) if device == "cuda" else [[0.0] for _ in cases]
    flops = 3 * 2 * tokens * shape.k * shape.n  # the forward and the two gradients
    rows = {name: {"ms": statistics.median(t), "tflops": flops / max(statistics.median(t), 1e-9) / 1e9}
            for (name, _), t in zip(cases, times)}
    return {"shape": shape.label, "groups": shape.groups, "k": shape.k, "n": shape.n, "tokens": tokens,
            "routing": "skewed" if skewed else "balanced", "rows": rows, "errors": errors, "refused": refused,
            "forms": form_rows(torch, step.x.detach(), step.weights.detach(), step.grad, step.offs, rounds, timer)
            if device == "cuda" else {},
            "host_us": host_rows(torch, step, max(3, rounds // 3)) if device == "cuda" else {}}


def graphed(torch, step):
    """``step`` (which returns its gradients) captured in a CUDA graph; a replay that returns the captured
    gradients."""
    graph, gradients = captured(torch, step)

    def replay():
        graph.replay()
        return gradients
    return replay


def host_rows(torch, step: _Step, rounds: int, calls: int = 20) -> dict[str, float]:
    """Where a training step's host time goes: µs of host time per call, over bursts of ``calls`` that
    do not wait for the GPU inside (it is drained before each), median of ``rounds`` interleaved rounds.
    Each GEMM through the function form and through the op, the op under autograd, and the step with its
    backward in autograd's own thread (as always) and in the calling thread."""
    import random
    import time

    import nvblaslt
    from nvblaslt._timing import shuffled_rounds
    from nvblaslt.torch import grouped_mm

    x, w, grad, offs = step.x.detach(), step.weights.detach(), step.grad, step.offs
    forms = {"forward": (x, w.transpose(1, 2)), "input gradient": (grad, w), "weight gradient": (x.T, grad)}
    cases: dict[str, Any] = {f"grouped_matmul, {form}": (lambda a=a, b=b: nvblaslt.grouped_matmul(a, b, offs))
                             for form, (a, b) in forms.items() if x.is_cuda}  # the function form: GPU only
    cases["nvblaslt.torch.grouped_mm, forward, no gradient"] = lambda: grouped_mm(x, w.transpose(1, 2), offs)
    cases["nvblaslt.torch.grouped_mm, forward, under autograd"] = \
        lambda: grouped_mm(step.x, step.weights.transpose(1, 2), offs)
    cases["step"] = step.ours

    def in_this_thread():
        with torch.autograd.set_multithreading_enabled(False):
            return step.ours()
    cases["step, backward in the calling thread"] = in_this_thread
    if step.theirs is not None:
        cases["torch._grouped_mm step"] = step.theirs
    drain = torch.cuda.synchronize if step.x.is_cuda else (lambda: None)

    def burst(name: str) -> float:
        drain()
        start = time.perf_counter()
        for _ in range(calls):
            cases[name]()
        elapsed = time.perf_counter() - start
        drain()
        return elapsed / calls * 1e6
    names = list(cases)
    for name in list(names):  # warm-up: plans made, caches filled
        try:
            burst(name)
        except RuntimeError:  # torch._grouped_mm takes bf16/fp16/fp32 on some GPUs only: left out
            if name != "torch._grouped_mm step":
                raise
            names.remove(name)
    samples = shuffled_rounds(names, rounds, burst, shuffler=random.Random(5))
    return {name: statistics.median(values) for name, values in zip(names, samples)}


def _step_times(torch, cases: list, rounds: int, timer) -> list[list[float]]:
    """ms per step of each case. The per-expert loop is timed in rounds of its own: at G=128 it is 60 ms of
    host work and small allocations, which slowed the host-bound steps timed right after it by up to 50 %
    (torch's too). The others run in bursts of about 2 ms, so one step's launch latency is not all a sample."""
    loop = [case for case in cases if case[0] == "torch mm loop"]
    others = [case for case in cases if case[0] != "torch mm loop"]
    estimate = statistics.median(timer(torch, others[:1], 3, 1, seed=1)[0])
    calls = max(1, min(20, round(2.0 / max(estimate, 1e-3))))
    times = dict(zip((name for name, _ in others), timer(torch, others, rounds, calls, seed=2)))
    if loop:
        times["torch mm loop"] = timer(torch, loop, max(3, rounds // 3), 1, seed=3)[0]
    return [times[name] for name, _ in cases]


def tuned_rows(torch, shape: Experts, tokens: int, skewed: bool, rounds: int, timer=event_rounds,
               search: bool = False) -> dict[str, Any]:
    """Each of the step's three grouped GEMMs autotuned (``search``: searched) and remembered
    (``GroupedMatmul.autotune``), then
    the step and the GEMMs again: the op's cached plans are made anew with the tuned picks. Timed in rounds
    of their own, with torch's step beside them. The bench runs these after every untuned row."""
    import nvblaslt

    step = _step(torch, shape, tokens, skewed, "cuda", torch.bfloat16)
    data, w = step.x.detach(), step.weights.detach()
    reports: list[str] = []
    for a, b in ((data, w.transpose(1, 2)), (step.grad, w), (data.T, step.grad)):
        with nvblaslt.GroupedMatmul(a, b, step.offs) as plan:
            plan.plan(limit=16)
            plan.autotune(remember=True, search=search)
            reports.append(str(plan.tuning_report))
    cases = [("nvblaslt.torch.grouped_mm, tuned", step.ours)]
    if step.theirs is not None:
        cases.append(("torch._grouped_mm", step.theirs))
    times = _step_times(torch, cases, rounds, timer)
    return {"step": {name: statistics.median(t) for (name, _), t in zip(cases, times)},
            "forms": form_rows(torch, data, w, step.grad, step.offs, rounds, timer), "reports": reports}


def form_rows(torch, x, weights, grad, offs, rounds: int, timer) -> dict[str, dict[str, float]]:
    """The step's three grouped GEMMs one by one, ms: nvblaslt's function form (its cached plan) beside
    ``torch._grouped_mm`` — forward x @ Wᵀ, input gradient grad @ W, weight gradient xᵀ @ grad (ragged K)."""
    import nvblaslt

    forms = {"forward": (x, weights.transpose(1, 2)), "input gradient": (grad, weights),
             "weight gradient": (x.T, grad)}
    cases = [(f"{form} nvblaslt", lambda a=a, b=b: nvblaslt.grouped_matmul(a, b, offs)) for form, (a, b) in forms.items()]
    try:
        theirs = torch._grouped_mm
    except AttributeError:  # a torch without it (before 2.8)
        pass
    else:
        cases += [(f"{form} torch", lambda a=a, b=b: theirs(a, b, offs=offs)) for form, (a, b) in forms.items()]
    times = timer(torch, cases, rounds, 5, seed=7)  # bursts: one call's launch latency is not all a sample
    return {name: statistics.median(t) for (name, _), t in zip(cases, times)}


def _print_case(case: dict[str, Any]) -> None:
    base = case["rows"].get("torch._grouped_mm", case["rows"]["torch mm loop"])["ms"]
    print(f"\n{case['section']}: {case['shape']} (G={case['groups']}, K={case['k']}, N={case['n']}), "
          f"{case['tokens']} tokens, {case['routing']}")
    accumulating = case["rows"].get("torch._grouped_mm, backward()", {"ms": base})["ms"]
    for name, row in case["rows"].items():
        # backward() rows beside torch's own, the graphed ones beside torch's graph
        against = {"backward()": accumulating, "CUDA graph": case["rows"].get(
            "torch._grouped_mm, backward(), CUDA graph", {"ms": base})["ms"]}.get(name.rsplit(", ", 1)[-1], base)
        print(f"  {name:50s} {row['ms']:8.3f} ms  {row['tflops']:6.0f} TF/s  {against / row['ms']:5.2f}× torch  "
              f"err {case['errors'].get(name, float('nan')):.1e}")
    for name, report in case.get("reports", {}).items():
        print(f"    {name}: {report}")
    for name, why in case.get("refused", {}).items():
        print(f"  {name:50s} not timed: {why}")
    if case.get("forms"):
        print("  one GEMM at a time, ms: " + ", ".join(f"{name} {ms:.3f}" for name, ms in case["forms"].items()))
    if case.get("host_us"):
        print("  host µs a call: " + ", ".join(f"{name} {us:.0f}" for name, us in case["host_us"].items()))


def _print_tuned(case: dict[str, Any]) -> None:
    step = case["tuned"]["step"]
    mine, theirs = step["nvblaslt.torch.grouped_mm, tuned"], step.get("torch._grouped_mm")
    print(f"\ntrain, tuned: {case['shape']}, {case['tokens']} tokens, {case['routing']}: nvblaslt.torch.grouped_mm "
          f"{mine:.3f} ms" + (f", torch._grouped_mm {theirs:.3f} ms (own rounds), {theirs / mine:.2f}× torch"
                              if theirs else ""))
    print("  one GEMM at a time, ms: " + ", ".join(f"{name} {ms:.3f}" for name, ms in case["tuned"]["forms"].items()))
    for form, report in zip(("forward", "input gradient", "weight gradient"), case["tuned"].get("reports", [])):
        print(f"    {form}: {report}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8k tokens only, fewer rounds")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--tokens", help="comma-separated token counts (default 8192,32768; --quick 8192)")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--sections", default="forward,train",
                        help="forward (the GEMM alone), train (the experts layer's forward + backward), or both")
    parser.add_argument("--no-tune", action="store_true", help="leave out the tuned rows (autotune of each GEMM)")
    add_timing_argument(parser, both=False)
    parser.add_argument("--shapes", help="comma-separated parts of the shapes' labels to run (default: every "
                                         "shape), e.g. Qwen3,Mixtral")
    parser.add_argument("--search", action="store_true",
                        help="also search beyond the heuristics (autotune(search=True), about 10 s a GEMM): a "
                             "searched row in forward, and the train section's tuned rows searched")
    args = parser.parse_args(argv)
    sections = set(args.sections.split(","))
    # A tuning cache of the run's own, read afresh by every plan: the untuned rows recall nothing (not the
    # user's picks), and the tuned rows' picks never reach the user's cache.
    cache_dir = tempfile.mkdtemp(prefix="nvblaslt-bench-grouped-")
    previous = os.environ.get("NVBLASLT_CACHE_DIR")
    os.environ["NVBLASLT_CACHE_DIR"] = cache_dir
    try:
        return _run(args, sections)
    finally:
        if previous is None:
            os.environ.pop("NVBLASLT_CACHE_DIR", None)
        else:
            os.environ["NVBLASLT_CACHE_DIR"] = previous
        shutil.rmtree(cache_dir, ignore_errors=True)


def _run(args, sections: set[str]) -> int:
    import torch

    import nvblaslt

    nvblaslt.clear_grouped_plans()
    rounds = args.rounds or (7 if args.quick else 15)
    token_counts = [8192] if args.quick else [8192, 32768]
    if args.tokens:
        token_counts = [int(count) for count in args.tokens.split(",")]
    shapes = [shape for shape in SHAPES
              if not args.shapes or any(part.lower() in shape.label.lower() for part in args.shapes.split(","))]
    if not shapes:
        print(f"--shapes {args.shapes!r} matches none of: {', '.join(shape.label for shape in SHAPES)}",
              file=sys.stderr)
        return 2
    lib = nvblaslt.library()
    header = (f"{torch.cuda.get_device_name()}, cuBLASLt {'.'.join(map(str, lib.version_tuple))} ({lib.path}), "
              f"torch {torch.__version__}, Python {platform.python_version()}, bf16")
    timer = wall_rounds if args.timing == "sync" else event_rounds  # the kernels' own choice stays GPU-timed
    print(header)
    print(f"timed: {TIMINGS[args.timing]}")
    results = []
    cases = [(section, shape, tokens, skewed) for section in ("forward", "train") if section in sections
             for shape in shapes for tokens in token_counts for skewed in (False, True)]
    for section, shape, tokens, skewed in cases:  # every untuned row first: a tuned pick is remembered
        progress(f"{section}: {shape.label} {tokens} tokens {'skewed' if skewed else 'balanced'}")
        case = (run_case(torch, nvblaslt, shape, tokens, skewed, rounds, calls=5, search=args.search, timer=timer)
                if section == "forward"
                else train_case(torch, shape, tokens, skewed, rounds, timer=timer))
        case["section"] = section
        results.append(case)
        _print_case(case)
        free_memory(torch)
    if "train" in sections and not args.no_tune:
        for case, (section, shape, tokens, skewed) in zip(results, cases):
            if section == "train":
                progress(f"train, tuned: {shape.label} {tokens} tokens {'skewed' if skewed else 'balanced'}")
                case["tuned"] = tuned_rows(torch, shape, tokens, skewed, rounds, timer, search=args.search)
                _print_tuned(case)
                free_memory(torch)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"machine": header, "timing": args.timing, "cases": results}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
