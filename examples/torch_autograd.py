"""A PyTorch autograd Function fused with nvblaslt epilogs: Linear → ReLU → Linear.

forward:  h = RELU_AUX_BIAS(W1 xᵀ + b1) keeps the ReLU mask;  y = BIAS(W2 h + b2)
backward: dW2 = g hᵀ with BGRADA (db2 in the same call);  dh = DRELU_BGRAD(W2ᵀ g, mask) (db1 too);
          dW1 = dh x (a plain GEMM for the weight gradient);  dx = (W1ᵀ dh)ᵀ
Checked with torch.autograd.gradcheck against nn.Linear + ReLU + nn.Linear, and compared in fp16/bf16.

    python examples/torch_autograd.py        (needs an NVIDIA GPU and PyTorch)
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

from nvblaslt import CublasLtError, MatmulEpilog, matmul


class FusedMLPBlock(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2):
        x, w1, b1, w2, b2 = (t.detach() for t in (x, w1, b1, w2, b2))  # DLPack refuses tensors needing grad
        h_t, aux = matmul(w1, x.t(), epilog=MatmulEpilog.RELU_AUX_BIAS, epilog_inputs={"bias": b1})
        y_t = matmul(w2, h_t, epilog=MatmulEpilog.BIAS, epilog_inputs={"bias": b2})
        ctx.save_for_backward(x, w1, w2, h_t, aux["relu_aux"])
        return y_t.t()

    @staticmethod
    def backward(ctx, grad_y):
        x, w1, w2, h_t, mask = ctx.saved_tensors
        g = grad_y.contiguous().t()  # (out, batch), column-major: what BGRADA reduces over K
        dw2, aux2 = matmul(g, h_t.t(), epilog=MatmulEpilog.BGRADA)
        dh_t, aux1 = matmul(w2.t(), g, epilog=MatmulEpilog.DRELU_BGRAD, epilog_inputs={"relu_aux": mask})
        dw1 = matmul(dh_t, x)
        dx = matmul(w1.t(), dh_t).t()
        return dx, dw1, aux1["drelu_bgrad"], dw2, aux2["bgrada"]


def reference(x, w1, b1, w2, b2):
    return torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x, w1, b1)), w2, b2)


def parameters(batch, features, hidden, outputs, dtype):
    torch.manual_seed(1)
    make = lambda *shape: torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=True)  # noqa: E731
    return make(batch, features), make(hidden, features), make(hidden), make(outputs, hidden), make(outputs)


# gradcheck: finite differences need float64; fall back to float32 where cuBLASLt has no fp64 epilog kernel.
inputs = parameters(6, 5, 16, 3, torch.float64)
try:
    passed = torch.autograd.gradcheck(FusedMLPBlock.apply, inputs, eps=1e-6, atol=1e-6)
    print(f"gradcheck in float64 against finite differences: {passed}")
except CublasLtError as error:
    print(f"float64 epilogs: {error.status_name}; running gradcheck in float32 with loose tolerances")
    inputs = parameters(6, 5, 16, 3, torch.float32)
    passed = torch.autograd.gradcheck(FusedMLPBlock.apply, inputs, eps=1e-2, atol=5e-2, rtol=5e-2,
                                      nondet_tol=1e-5, fast_mode=True)
    print(f"gradcheck in float32: {passed}")
assert passed

for dtype, tolerance in ((torch.float32, 1e-5), (torch.float16, 2e-2), (torch.bfloat16, 5e-2)):
    ours_in = parameters(256, 512, 1024, 128, dtype)
    theirs_in = [t.detach().clone().requires_grad_() for t in ours_in]
    ours, theirs = FusedMLPBlock.apply(*ours_in), reference(*theirs_in)
    upstream = torch.randn_like(ours)
    ours.backward(upstream)
    theirs.backward(upstream)
    worst = max(((a.grad.double() - b.grad.double()).norm() / b.grad.double().norm()).item()
                for a, b in zip(ours_in, theirs_in))
    output = ((ours.double() - theirs.double()).norm() / theirs.double().norm()).item()
    print(f"{str(dtype):15s} vs nn.Linear+ReLU+nn.Linear: output {output:.1e}, worst gradient {worst:.1e}")
    assert output < tolerance and worst < 3 * tolerance
