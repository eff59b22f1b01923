"""Probe (GPU): how far is an untuned fused layer's first algorithm from the best it could run? For the
GEMMs a fused MLP step runs (bf16, 8192 tokens, 4096↔16384: the forward RELU_BIAS / GELU_AUX_BIAS / BIAS,
the weight gradient with BGRADB, the input gradient with DGELU), every algorithm the heuristics return
for the fused epilog (up to 8, their default) is timed, and so is every one they return for the plain GEMM
that ``cublasLtMatmulAlgoCheck`` accepts with the epilog, beside the plain GEMM itself (CUDA events,
interleaved rounds). An algorithm cuBLASLt refused at launch would run as the plan's next one: the probe
says so where it happens. What it finds decides how ``nvblaslt.torch`` picks its untuned plans (issue 23).

    python -m tools.probe_epilog_defaults
"""

from __future__ import annotations

import os
import statistics
import tempfile

import torch

TOKENS, HIDDEN, FFN = 8192, 4096, 16384
ROUNDS, CALLS = 5, 10


def _gpu_ms(plan) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    plan.execute()
    start.record()
    for _ in range(CALLS):
        plan.execute()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / CALLS


def _describe(result) -> str:
    return f"id {result.algo_id} tile {result.tile} stages {result.stages} split-k {result.split_k}"


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["NVBLASLT_CACHE_DIR"] = scratch  # the heuristics' own picks, nothing remembered
        _probe()


def _probe() -> None:
    import nvblaslt
    from nvblaslt import Matmul

    generator = torch.Generator(device="cuda").manual_seed(0)

    def random(*shape):
        return (torch.randn(*shape, device="cuda", generator=generator) / 32).to(torch.bfloat16)

    x, w1, b1, w2 = random(TOKENS, HIDDEN), random(FFN, HIDDEN), random(FFN), random(HIDDEN, FFN)
    upstream, hidden = random(TOKENS, HIDDEN), random(TOKENS, FFN)
    gelu_aux = nvblaslt.matmul(w1, x.T, epilog="GELU_AUX_BIAS", epilog_inputs={"bias": b1})[1]["gelu_aux"]
    problems = {  # as nvblaslt.torch runs them: (a, b, epilog, epilog inputs)
        f"forward {HIDDEN}->{FFN} RELU_BIAS": (w1, x.T, "RELU_BIAS", {"bias": b1}),
        f"forward {HIDDEN}->{FFN} GELU_AUX_BIAS": (w1, x.T, "GELU_AUX_BIAS", {"bias": b1}),
        f"forward {FFN}->{HIDDEN} BIAS": (w2, hidden.T, "BIAS", {"bias": b1[:HIDDEN]}),
        f"weight gradient {FFN}->{HIDDEN} BGRADB": (hidden.T, upstream, "BGRADB", None),
        f"input gradient {HIDDEN}->{FFN} DGELU": (w2.T, upstream.T, "DGELU", {"gelu_aux": gelu_aux}),
    }
    print(f"{torch.cuda.get_device_name()}, cuBLASLt {nvblaslt.library().version_tuple}, bf16, GPU ms a call "
          f"(median of {ROUNDS} interleaved rounds of {CALLS} calls)")
    for name, (a, b, epilog, inputs) in problems.items():
        plain = Matmul(a, b)
        plain_results = plain.plan()
        fused = Matmul(a, b)
        candidates = {f"heuristics #{i}": (fused, r) for i, r in
                      enumerate(fused.plan(epilog=epilog, epilog_inputs=inputs))}
        for i, result in enumerate(plain_results):  # the plain GEMM's picks, where the epilog takes them
            checked = Matmul(a, b)
            try:
                candidates[f"plain GEMM's #{i}"] = (checked, checked.plan(epilog=epilog, epilog_inputs=inputs,
                                                                           algorithms=[result])[0])
            except nvblaslt.NvblasltValueError:  # the algorithm check refuses it for the epilog
                checked.free()
        times: dict[str, list[float]] = {key: [] for key in candidates}
        times["plain GEMM, no epilog"] = []
        for _ in range(ROUNDS):
            for key, (plan, result) in candidates.items():
                plan.execute(algorithm=result)
                times[key].append(_gpu_ms(plan))
                if plan.algorithm is not result:  # refused at launch: the plan moved on to its next one
                    print(f"  ({key} was refused at launch; its row times another algorithm)")
            times["plain GEMM, no epilog"].append(_gpu_ms(plain))
        floor = statistics.median(times["plain GEMM, no epilog"])
        accepted = sum(key.startswith("plain GEMM's") for key in candidates)
        print(f"\n{name}: the plain GEMM {floor:.3f} ms; {accepted} of its {len(plain_results)} algorithms take "
              f"the epilog")
        for key, values in sorted(times.items(), key=lambda item: statistics.median(item[1])):
            found = candidates.get(key)
            print(f"  {key:24s} {statistics.median(values):7.3f} ms  {statistics.median(values) / floor:6.3f}× "
                  f"{_describe(found[1]) if found else ''}")
        for plan in {id(p): p for p, _ in candidates.values()}.values():
            plan.free()
        plain.free()


if __name__ == "__main__":
    main()
