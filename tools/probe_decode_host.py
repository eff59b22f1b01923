"""Probe (GPU): a decode step's fused layer, nvblaslt against torch's own fused call (issue 33 target 4).

For each token count M (1, 16, 256), width N (4096, 14336; K 4096, bf16) and epilog (RELU_BIAS,
GELU_BIAS: the tanh form, as both fuse it), five ways to compute act(x Wᵀ + b) are timed in interleaved rounds:
``torch._addmm_activation`` (torch's fused cuBLASLt call, the baseline), ``F.relu(F.linear)``,
``nvblaslt.torch.linear``, ``nvblaslt.matmul()`` (as the torch layer calls it: D = W xᵀ with the bias
along D's rows) and ``Matmul.execute()`` of a plan made once. Each is timed two ways: ``issue``, the
host's µs per call over a burst that never waits (drained before and after), and ``sync``, the wall µs
per call with a synchronize after each (a decode loop that reads its token). Medians of the rounds,
and each one's ratio to ``_addmm_activation``'s. ``--profile`` then runs ``linear`` and ``matmul()``
under cProfile (own time first), after each call's count of Python and C calls.

    python -m tools.probe_decode_host [--rounds 3] [--calls 200] [--profile]
"""

from __future__ import annotations

import argparse
import collections
import random
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import nvblaslt
import nvblaslt.torch as nvt
from nvblaslt import Matmul, MatmulEpilog
from nvblaslt._timing import shuffled_rounds
from tools.probe_conv_host import burst_us, profiled  # host µs per call over a burst that never waits; cProfile

TOKENS = (1, 16, 256)
WIDTHS = (4096, 14336)
IN_FEATURES = 4096
EPILOGS = {"RELU_BIAS": "relu", "GELU_BIAS": "gelu"}  # cuBLASLt's GELU is the tanh form, as _addmm_activation's
CONTESTANTS = ("addmm_act", "F.act(F.linear)", "nvt.linear", "matmul()", "Matmul.execute")


def _case(tokens: int, width: int, epilog: str) -> dict:
    """The five calls of one shape and epilog, on shared tensors (no gradient: a decode step)."""
    generator = torch.Generator(device="cuda").manual_seed(tokens * 7 + width)
    x = torch.randn(tokens, IN_FEATURES, device="cuda", dtype=torch.bfloat16, generator=generator)
    weight = torch.randn(width, IN_FEATURES, device="cuda", dtype=torch.bfloat16, generator=generator) * 0.02
    bias = torch.randn(width, device="cuda", dtype=torch.bfloat16, generator=generator)
    activation = EPILOGS[epilog]
    gelu = activation == "gelu"
    member = MatmulEpilog[epilog]
    inputs = {"bias": bias}
    plan = Matmul(weight, x.T)
    plan.plan(epilog=member, epilog_inputs=inputs)
    torch_act = (lambda y: F.gelu(y, approximate="tanh")) if gelu else F.relu
    calls = {
        "addmm_act": lambda: torch._addmm_activation(bias, x, weight.T, use_gelu=gelu),
        "F.act(F.linear)": lambda: torch_act(F.linear(x, weight, bias)),
        "nvt.linear": lambda: nvt.linear(x, weight, bias, activation),
        "matmul()": lambda: nvblaslt.matmul(weight, x.T, epilog=member, epilog_inputs=inputs),
        "Matmul.execute": lambda: plan.execute(),  # a lambda like the others: one frame each, not counted
    }
    expected = calls["addmm_act"]().float()
    for name, call in calls.items():  # the same values, and warm: plans made, steps bound
        for _ in range(5):
            got = call()
        got = got.T if name in ("matmul()", "Matmul.execute") else got
        torch.testing.assert_close(got.float(), expected, atol=0.1, rtol=0.02)
    return {"calls": calls, "plan": plan}


def _sync_us(call, calls: int) -> float:
    """Wall µs per call with a synchronize after each."""
    synchronize = torch.cuda.synchronize
    synchronize()
    begin = time.perf_counter()
    for _ in range(calls):
        call()
        synchronize()
    return (time.perf_counter() - begin) / calls * 1e6


def table(rounds: int, calls: int) -> None:
    print(f"{'M':>4s} {'N':>6s} {'epilog':10s} {'how':6s} " + " ".join(f"{name:>16s}" for name in CONTESTANTS))
    for epilog in EPILOGS:
        for width in WIDTHS:
            for tokens in TOKENS:
                case = _case(tokens, width, epilog)
                entries = [(name, how) for how in ("issue", "sync") for name in CONTESTANTS]
                timers = {"issue": burst_us, "sync": _sync_us}
                samples = shuffled_rounds(entries, rounds, lambda e: timers[e[1]](case["calls"][e[0]], calls),
                                          shuffler=random.Random(tokens + width))
                medians = {e: statistics.median(s) for e, s in zip(entries, samples)}
                for how in ("issue", "sync"):
                    base = medians["addmm_act", how]
                    cells = [f"{base:9.1f}       "] + [f"{medians[n, how]:9.1f} ({medians[n, how] / base:4.2f})"
                                                      for n in CONTESTANTS[1:]]
                    print(f"{tokens:4d} {width:6d} {epilog:10s} {how:6s} " + " ".join(f"{c:>16s}" for c in cells),
                          flush=True)
                case["plan"].free()


def call_counts(call) -> tuple[int, int, list[str]]:
    """(Python calls, C calls, their names in order) of one ``call()``, from ``sys.setprofile``: a count
    that no noise on the host changes, beside the timings."""
    names: list[str] = []
    counts = collections.Counter()

    def seen(frame, event, arg) -> None:
        if event in ("call", "c_call"):
            counts[event] += 1
            names.append(frame.f_code.co_name if event == "call" else getattr(arg, "__name__", "?"))
    sys.setprofile(seen)
    try:
        call()
    finally:
        sys.setprofile(None)
    return counts["call"] - 1, counts["c_call"] - 1, names[1:-1]  # less the probe's lambda and setprofile


def profile(calls: int) -> None:
    """Calls per hit, then cProfile of ``linear`` and ``matmul()`` at M 16, N 4096, RELU_BIAS (own time first)."""
    case = _case(16, 4096, "RELU_BIAS")
    print("\nCalls per call, M 16, N 4096, RELU_BIAS (after warm-up):")
    for name in CONTESTANTS:
        python_calls, c_calls, names = call_counts(case["calls"][name])
        print(f"  {name:16s} Python {python_calls:3d}  C {c_calls:3d}  {' '.join(names)}")
    for name in ("nvt.linear", "matmul()"):
        print(f"\ncProfile of {calls} calls of {name}, M 16, N 4096, RELU_BIAS (own time first):")
        print(profiled(case["calls"][name], calls))
    case["plan"].free()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians)")
    parser.add_argument("--calls", type=int, default=200, help="calls per measurement")
    parser.add_argument("--profile", action="store_true", help="cProfile linear and matmul() after the table")
    parser.add_argument("--profile-calls", type=int, default=5000)
    options = parser.parse_args(argv)
    lib = nvblaslt.library()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuBLASLt {lib.version}; bf16, K "
          f"{IN_FEATURES}; µs per call, median of {options.rounds} interleaved rounds of {options.calls} calls; "
          f"(ratio to torch._addmm_activation)")
    with torch.no_grad():
        table(options.rounds, options.calls)
        if options.profile:
            profile(options.profile_calls)


if __name__ == "__main__":
    main()
