"""What ``python -m nvblaslt.bench.tuning`` measures on: its problems (``nvblaslt tune``'s LLM suite, or a
representative subset, with the bias epilogs' forms of the up projection), their operands and plans, torch's
own call for each, and the GPU clock every part times with."""

from __future__ import annotations

import json
import math
import statistics
from typing import Any

from nvblaslt import _tune_suite
from nvblaslt._duel import median_bounds
from nvblaslt._timing import SETTLE_S
from .timing import event_rounds

# The --quick subset: several models, every token count, forward bf16 and fp8, the epilogs with their backward.
QUICK_SUITE = (
    "llama3-8b.qkv forward bf16 T=1", "llama3-8b.qkv forward bf16 T=16", "llama3-8b.qkv forward bf16 T=128",
    "llama3-8b.qkv forward bf16 T=1024", "llama3-8b.qkv forward bf16 T=8192", "llama3-8b.down forward fp8 T=16",
    "llama3-8b.o forward fp8 T=1024", "llama3-8b.gate_up forward fp8 T=8192", "llama3-70b.down forward bf16 T=1",
    "llama3-70b.o forward bf16 T=128", "llama3-70b.qkv forward fp8 T=128", "llama3-70b.gate_up forward bf16 T=1024",
    "qwen3-8b.gate_up forward bf16 T=16", "qwen3-8b.down forward bf16 T=8192", "qwen3-30b-a3b.qkv forward bf16 T=1",
    "qwen3-30b-a3b.o forward bf16 T=1024",
    "llama3-8b.mlp_up GELU_AUX_BIAS forward bf16 T=16", "llama3-8b.mlp_up GELU_AUX_BIAS forward bf16 T=1024",
    "llama3-70b.mlp_up GELU_AUX_BIAS forward bf16 T=128", "qwen3-8b.mlp_up GELU_AUX_BIAS forward bf16 T=8192",
    "llama3-8b.mlp_up DGELU input gradient of the next layer bf16 T=1024",
    "qwen3-8b.mlp_up DGELU input gradient of the next layer bf16 T=8192",
    "llama3-8b.mlp_up BGRADB weight gradient bf16 T=1024", "llama3-70b.mlp_up BGRADB weight gradient bf16 T=8192",
    "qwen3-8b.mlp_up BGRADB weight gradient bf16 T=8192",
)
# The up projection without the aux output, as FusedLinear runs it when no backward pass follows: a suite
# GELU_AUX_BIAS problem's layouts with another bias epilog (the suite itself has GELU_AUX_BIAS only).
VARIANT_EPILOGS = ("BIAS", "RELU_BIAS", "GELU_BIAS")
QUICK_VARIANTS = (
    ("llama3-8b.mlp_up GELU_AUX_BIAS forward bf16 T=1", "BIAS"),
    ("llama3-8b.mlp_up GELU_AUX_BIAS forward bf16 T=128", "RELU_BIAS"),
    ("qwen3-8b.mlp_up GELU_AUX_BIAS forward bf16 T=1024", "RELU_BIAS"),
    ("llama3-8b.mlp_up GELU_AUX_BIAS forward bf16 T=8192", "GELU_BIAS"),
    ("llama3-70b.mlp_up GELU_AUX_BIAS forward bf16 T=16", "GELU_BIAS"),
)
BIAS_EPILOGS = ("BIAS", "RELU_BIAS", "GELU_BIAS", "GELU_AUX_BIAS")  # a = W, b = xᵀ, a bias per output feature

BURST_MS = 0.05  # calls per sample: enough to reach this, at most MAX_CALLS
MAX_CALLS = 16
SPIN_CYCLES = 200_000  # queued ahead of each sample (~0.1 ms), and SPIN_CYCLES_PER_CALL more per call in it
SPIN_CYCLES_PER_CALL = 80_000  # (~40 µs: twice what the host takes to issue one call, so its time stays hidden)


# ---- the problems ----------------------------------------------------------------------------------------------
def _by_name() -> dict[str, dict]:
    return {spec["name"]: spec for spec in _tune_suite.llm_suite() if spec["kind"] == "matmul"}


def with_epilog(spec: dict, epilog: str) -> dict:
    """A suite GELU_AUX_BIAS problem with another bias epilog on the same layouts."""
    return {**spec, "name": spec["name"].replace("GELU_AUX_BIAS", epilog), "epilog": epilog}


def problems(quick: bool) -> list[dict]:
    """The quick subset, or every distinct dense problem of the suite with the bias epilogs' forms of every
    up projection. The suite's grouped GEMMs are left out (the caller says so)."""
    suite = _by_name()
    if quick:
        return [suite[name] for name in QUICK_SUITE] + [with_epilog(suite[name], e) for name, e in QUICK_VARIANTS]
    chosen: dict[str, dict] = {}  # by signature: Mixtral's and Qwen3-8B's attention are Llama-3-8B's shapes
    for spec in suite.values():
        chosen.setdefault(signature(spec), spec)
    ups = [spec for spec in chosen.values() if spec["epilog"] == "GELU_AUX_BIAS"]
    return list(chosen.values()) + [with_epilog(spec, epilog) for spec in ups for epilog in VARIANT_EPILOGS]


def signature(spec: dict) -> str:
    """What makes two problems one (the name aside)."""
    return json.dumps({k: v for k, v in spec.items() if k != "name"}, sort_keys=True)


def suite_pairs() -> list[tuple[int, int]]:
    """Every (N, K) = (out features, in features) of the suite's dense layers and MLP up projections."""
    return _tune_suite.dense_pairs()


def torch_baseline(spec: dict) -> str:
    """What torch's own call for ``spec`` is (``torch_call`` makes it)."""
    epilog = spec["epilog"]
    if epilog == "DEFAULT":
        return "torch._scaled_mm (scales 1, bf16 out)" if spec["a"]["dtype"].startswith("float8") else "torch.mm"
    if epilog == "BIAS":
        return "torch.addmm(b, x, Wᵀ)"
    if epilog == "RELU_BIAS":
        return "torch._addmm_activation(b, x, Wᵀ)"
    if epilog == "GELU_BIAS":
        return "torch._addmm_activation(b, x, Wᵀ, use_gelu=True)"
    # torch fuses none of these: its own way to the same results, as nn.Linear + nn.GELU compute them
    if epilog == "GELU_AUX_BIAS":
        return "torch.nn.functional.gelu(torch.addmm(b, x, Wᵀ)), the pre-activation kept as training keeps it"
    if epilog == "DGELU":
        return "torch.ops.aten.gelu_backward(torch.mm(A, B), the pre-activation)"
    if epilog == "BGRADB":
        return "torch.mm(A, B) and B.sum(0), the bias gradient"
    return f"torch.mm (the GEMM alone: torch has no fused {epilog})"


def torch_layer_route(spec: dict) -> str | None:
    """How ``nvblaslt.torch`` plans ``spec``'s GEMM, or None where none of its calls maps to the problem."""
    if spec["a"]["dtype"] != "bfloat16":
        return None
    return {"DEFAULT": "linear(x, W)", "BIAS": "linear(x, W, b) without grad",
            "RELU_BIAS": "linear(x, W, b, 'relu') without grad", "GELU_BIAS": "linear(x, W, b, 'gelu') without grad",
            "GELU_AUX_BIAS": "linear(x, W, b, 'gelu') with grad (forward)",
            "BGRADB": "linear(x, W, b) backward: the weight gradient"}.get(spec["epilog"])


# ---- operands, plans and torch's calls ---------------------------------------------------------------------------
def tensor(layout: dict):
    """A CUDA tensor of ``layout`` (shape, element strides, dtype name) with values uniform in [-1, 1)."""
    import torch

    made = torch.empty_strided(layout["shape"], layout["strides"], dtype=getattr(torch, layout["dtype"]),
                               device="cuda")
    made.copy_(torch.rand(layout["shape"], device="cuda") * 2 - 1)
    return made


def operands(spec: dict) -> dict:
    return {"a": tensor(spec["a"]), "b": tensor(spec["b"]),
            "inputs": {name: tensor(layout) for name, layout in spec.get("inputs", {}).items()}}


def plan_arguments(spec: dict) -> dict:
    """Matmul's and matmul()'s keywords for ``spec``, as ``nvblaslt tune`` plans it (fp8 scales of 1)."""
    fp8 = {name: 1.0 for name in ("a", "b") if spec[name]["dtype"].startswith("float8")}
    return {"options": spec.get("options"), "quantization_scales": fp8 or None}


def planned(spec: dict, ops: dict, algorithm: bytes | None = None):
    """A planned Matmul of ``spec`` on ``ops``: the heuristics' first pick where nothing is loaded or
    remembered, else ``algorithm``'s 64 bytes."""
    from nvblaslt import Matmul

    plan = Matmul(ops["a"], ops["b"], **plan_arguments(spec))
    plan.plan(epilog=spec["epilog"], epilog_inputs=ops["inputs"] or None,
              algorithms=None if algorithm is None else [algorithm])
    return plan


def torch_call(spec: dict, ops: dict):
    """torch's own call for ``spec`` (``torch_baseline`` names it), on the same tensors."""
    import torch

    a, b, epilog = ops["a"], ops["b"], spec["epilog"]
    if epilog == "DEFAULT" and spec["a"]["dtype"].startswith("float8"):
        one = torch.ones((), device="cuda", dtype=torch.float32)
        return lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)
    if epilog in BIAS_EPILOGS:  # a = W, b = xᵀ: torch runs the layer as x Wᵀ + b
        x, w_t, bias = b.T, a.T, ops["inputs"]["bias"]
        if epilog == "BIAS":
            return lambda: torch.addmm(bias, x, w_t)
        if epilog == "GELU_AUX_BIAS":  # the pre-activation is the aux: a training step keeps it
            return lambda: torch.nn.functional.gelu(torch.addmm(bias, x, w_t), approximate="tanh")
        gelu = epilog != "RELU_BIAS"
        return lambda: torch._addmm_activation(bias, x, w_t, use_gelu=gelu)
    if epilog == "DGELU":  # D has the aux's shape: the next layer's input gradient through this GELU
        aux = ops["inputs"]["gelu_aux"]
        return lambda: torch.ops.aten.gelu_backward(torch.mm(a, b), aux, approximate="tanh")
    if epilog == "BGRADB":  # B is dY (tokens, out): its column sums are the bias gradient
        return lambda: (torch.mm(a, b), b.sum(0))
    return lambda: torch.mm(a, b)


def launched_kernels(fn, calls: int = 3) -> list[tuple[str, float]]:
    """(name, mean µs per call) of each CUDA kernel ``fn()`` launches (torch.profiler), over ``calls`` calls
    after two untimed: which kernels torch's call and a plan run, told apart by name."""
    import collections

    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as profiled:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total: dict[str, float] = collections.defaultdict(float)
    for event in profiled.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.name and not event.name.startswith("Memset"):
            total[event.name] += event.device_time
    return [(name, us / calls) for name, us in total.items()]


# ---- the clock -------------------------------------------------------------------------------------------------
def flush_buffer():
    """Twice the L2 cache, zeroed before each sample: every sample reads its operands from memory."""
    import torch

    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 64 << 20
    return torch.empty(2 * l2, dtype=torch.uint8, device="cuda")


# What runs ahead of each sample, so that the host's time to issue it stays hidden. "gemm": GEMMS_AHEAD 4096³
# bf16 GEMMs on random values (about 1 ms: the SMs busy and drawing power, as the layer before in a training
# step). On ones they drew 424 W against 689 W and the clock ran 195 MHz higher than a training step lets it
# (tools/probe_ahead_power, H200, 2026-11-29), and tuned picks read up to 8 % slower behind them than behind
# the problem's own kernel (tools/probe_tune_timing: qwen3-8b's DGELU at 8192 tokens, 0.937× against
# 0.864×). "spin": a sleep kernel, as before the seventh pass of 2026-11-28: behind it two of eleven tuned
# picks read slower than the first pick, and faster in every other context tried then.
QUEUES = ("gemm", "spin")
GEMMS_AHEAD = 5


def gpu_rounds(cases: list[tuple[str, Any]], rounds: int, calls: int, flush, queue: str = "gemm",
               settle_s: float = 0.0) -> list[list[float]]:
    """ms per call of each ``(name, fn)`` case over ``rounds`` interleaved rounds, after two warm-up calls
    each and the first case back to back for ``settle_s`` (the duels pass ``SETTLE_S``: the GPU at the power
    its own work draws, as ``nvblaslt tune``'s duels start): per sample the L2 flushed, the host's time hidden
    behind what ``queue`` names (one of ``QUEUES``), CUDA events around ``calls`` calls."""
    import torch

    if queue not in QUEUES:
        raise ValueError(f"queue: expected one of {QUEUES}, got {queue!r}")
    ahead = torch.rand(4096, 4096, device="cuda", dtype=torch.bfloat16) * 2 - 1 if queue == "gemm" else None
    product = torch.empty_like(ahead) if ahead is not None else None

    def before() -> None:
        if ahead is not None:
            for _ in range(GEMMS_AHEAD):
                torch.mm(ahead, ahead, out=product)
        flush.zero_()
        if ahead is None:
            torch.cuda._sleep(SPIN_CYCLES + SPIN_CYCLES_PER_CALL * calls)
    return event_rounds(torch, cases, rounds, calls, before=before, settle_s=settle_s)


def burst_calls(fn, flush, queue: str = "gemm") -> int:
    """Calls per sample for cases of about ``fn``'s time: one from ``BURST_MS`` up, at most ``MAX_CALLS``
    (``fn`` timed behind what ``queue`` names, as the samples will be)."""
    ms = gpu_rounds([("probe", fn)], 1, 1, flush, queue, settle_s=0.0)[0][0]
    return max(1, min(MAX_CALLS, math.ceil(BURST_MS / max(ms, 1e-4))))


def paired(numerator: list[float], denominator: list[float]) -> dict:
    """The median of per-round ratios (drift cancels) and 95 % distribution-free bounds on it."""
    ratios = [x / y for x, y in zip(numerator, denominator)]
    low, high = median_bounds(ratios, 0.025)
    return {"ratio": statistics.median(ratios), "bounds": [low, high]}
