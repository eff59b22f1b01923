"""MatMul → BiasAdd → GELU as one GELU_BIAS call, against the three separate ops.

cuBLASLt's GELU is the tanh approximation 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), the
"approximate" GELU that TensorFlow's grappler and PyTorch (approximate="tanh") also fuse; the
exact form uses erf. This prints how far each is from the fused result.

    python examples/gelu_fusion.py           (needs an NVIDIA GPU and PyTorch)
"""

import sys

try:
    import torch
except ImportError:
    sys.exit("this example needs PyTorch")
import nvblaslt

try:  # a GPU, a driver and a cuBLASLt nvblaslt can use: asked before any array is made on the GPU
    nvblaslt.Handle.for_device(0)
except nvblaslt.NvblasltError as missing:
    sys.exit(f"this example needs an NVIDIA GPU, its driver and cuBLASLt: {missing}")
if not torch.cuda.is_available():
    sys.exit("this example needs PyTorch with CUDA (torch.cuda.is_available() is False)")

from nvblaslt import MatmulEpilog, matmul

torch.manual_seed(0)
m, k, n = 4096, 2048, 1024
a = torch.randn(m, k, device="cuda", dtype=torch.float16) / k**0.5
b = torch.randn(k, n, device="cuda", dtype=torch.float16)
bias = torch.randn(m, device="cuda", dtype=torch.float16)

fused = matmul(a, b, epilog=MatmulEpilog.GELU_BIAS, epilog_inputs={"bias": bias})
preactivation = a.double() @ b.double() + bias.double()[:, None]
tanh_gelu = torch.nn.functional.gelu(preactivation, approximate="tanh")
erf_gelu = torch.nn.functional.gelu(preactivation)


def relative(x, y):
    return ((x.double() - y).norm() / y.norm()).item()


print(f"GELU_BIAS (fp16, {m}x{k} @ {k}x{n}) against float64 references:")
print(f"  vs tanh-approximate GELU: {relative(fused, tanh_gelu):.2e}   (rounding of fp16)")
print(f"  vs exact (erf) GELU:      {relative(fused, erf_gelu):.2e}   (the approximation itself)")
print(f"  tanh vs erf GELU, exact arithmetic: max |difference| {(tanh_gelu - erf_gelu).abs().max().item():.2e}")


def separate():
    return torch.nn.functional.gelu(a @ b + bias[:, None], approximate="tanh")


def one_call():
    return matmul(a, b, epilog=MatmulEpilog.GELU_BIAS, epilog_inputs={"bias": bias})


for fn in (separate, one_call):
    fn()
for label, fn in (("matmul, + bias, gelu (3 ops)", separate), ("GELU_BIAS (1 call)", one_call)):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        fn()
    stop.record()
    stop.synchronize()
    print(f"  {label:30s} {start.elapsed_time(stop) / 20:.3f} ms")
assert relative(fused, tanh_gelu) < 1e-2 and relative(fused, tanh_gelu) < relative(fused, erf_gelu)
