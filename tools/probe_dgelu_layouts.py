"""Probe (GPU): the input-gradient GEMM of a GELU layer in each operand layout, with and without DGELU.

In ``nvblaslt.jax.dense`` the kernel is (in, out) row-major, as flax keeps it, so the input gradient
dx = dz @ kernelᵀ reads both operands along their contiguous axis (cuBLASLt's TN); the torch layer's weight
is (out, in), and the same product is NN. On an H200 (cuBLASLt 13.1) the TN DGELU ran an older xmma kernel
17–25 % slower than the plain TN GEMM (tools/probe_jax_kernels.py). This prints, for the step's two shapes,
the GPU time of: the plain GEMM and DGELU in each layout, a copy that transposes the kernel (what the NN
form would cost per step in JAX), and the elementwise DGELU that ``backward="unfused"`` runs instead (torch,
as a stand-in for XLA's fusion). The kernels' names are printed beside.

    PYTHONPATH=. python -m tools.probe_dgelu_layouts [--tokens 8192]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

import nvblaslt
from nvblaslt import MatmulEpilog


def _ms(run, calls: int = 10, rounds: int = 5) -> float:
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    run()
    samples = []
    for _ in range(rounds):
        torch.cuda._sleep(2_000_000)
        start.record()
        for _ in range(calls):
            run()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) / calls)
    return statistics.median(samples)


def _kernel(run) -> str:
    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        run()
        torch.cuda.synchronize()
    names = [e.name for e in trace.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return " + ".join(name[:70] for name in names) or "?"


def _gelu_backward(dx, z):
    """dx · gelu'(z), the tanh form, in float32 (the unfused backward's elementwise pass)."""
    zf = z.float()
    inner = 0.7978845608028654 * (zf + 0.044715 * zf ** 3)
    t = torch.tanh(inner)
    grad = 0.5 * (1 + t) + 0.5 * zf * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * zf * zf)
    return (dx.float() * grad).to(dx.dtype)


def probe(tokens: int, n_in: int, n_out: int) -> None:
    torch.manual_seed(0)
    bf16 = torch.bfloat16
    x0 = torch.randn(tokens, 1024, device="cuda", dtype=bf16)
    kernel = torch.randn(n_in, n_out, device="cuda", dtype=bf16) / n_in ** 0.5  # flax's (in, out)
    weight = kernel.t().contiguous()  # torch's (out, in)
    dz = torch.randn(tokens, n_out, device="cuda", dtype=bf16)
    below_kernel = torch.randn(1024, n_in, device="cuda", dtype=bf16) / 32  # (in₀, in)
    bias = torch.randn(n_in, device="cuda", dtype=bf16)
    print(f"\ninput gradient dx ({tokens}, {n_in}) = dz ({tokens}, {n_out}) @ kernelᵀ, bf16; GPU ms (spin)")
    # nvblaslt's problem as the JAX layer poses it: D = dxᵀ (in, T) = kernel @ dzᵀ, the bias and aux along D's rows;
    # the GELU aux of the layer below is its forward's, D (in, T) = below @ x0ᵀ
    _, aux = nvblaslt.matmul(below_kernel.t().contiguous(), x0.t(), epilog=MatmulEpilog.GELU_AUX_BIAS,
                             epilog_inputs={"bias": bias})
    gelu_aux = {"gelu_aux": aux["gelu_aux"]}
    cases = {
        "TN plain (jax: kernel as flax keeps it)": lambda: nvblaslt.matmul(kernel, dz.t()),
        "TN DGELU": lambda: nvblaslt.matmul(kernel, dz.t(), epilog=MatmulEpilog.DGELU, epilog_inputs=gelu_aux),
        "NN plain (torch's weight)": lambda: nvblaslt.matmul(weight.t(), dz.t()),
        "NN DGELU": lambda: nvblaslt.matmul(weight.t(), dz.t(), epilog=MatmulEpilog.DGELU, epilog_inputs=gelu_aux),
        "kernel transposed (a copy)": lambda: kernel.t().contiguous(),
        "elementwise DGELU (unfused)": lambda: _gelu_backward(dz.new_empty(tokens, n_in), x0.new_empty(tokens, n_in)),
    }
    for name, run in cases.items():
        try:
            ms = _ms(run)
            print(f"  {name:42s} {ms:8.3f} ms  {_kernel(run)}")
        except nvblaslt.NvblasltError as error:
            print(f"  {name:42s} refused: {type(error).__name__}: {str(error)[:160]}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    options = parser.parse_args(argv)
    print(f"{torch.cuda.get_device_name()}, cuBLASLt {nvblaslt.library().version}")
    for n_in, n_out in ((16384, 4096), (4096, 16384)):
        probe(options.tokens, n_in, n_out)


if __name__ == "__main__":
    main()
