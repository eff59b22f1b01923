"""The blog's linear layer: naive forward/backward against RELU_BIAS / RELU_AUX_BIAS and
DRELU_BGRAD, checked against each other and timed. The seed code runs with only its import
changed (``from nvblaslt import Matmul, MatmulEpilog``).

    python examples/linear_layer.py [--size small|blog]   (needs an NVIDIA GPU and CuPy)
"""

import argparse
import sys

try:
    import cupy
except ImportError:
    sys.exit("this example needs CuPy and an NVIDIA GPU")
import nvblaslt

try:  # a GPU, a driver and a cuBLASLt nvblaslt can use: asked before any array is made on the GPU
    nvblaslt.Handle.for_device(0)
except nvblaslt.NvblasltError as missing:
    sys.exit(f"this example needs an NVIDIA GPU, its driver and cuBLASLt: {missing}")

from nvblaslt import Matmul, MatmulEpilog

parser = argparse.ArgumentParser()
parser.add_argument("--size", choices=["small", "blog"], default="small",
                    help="small: the blog's 784→100 layer, batch 256; blog: its fp16 (65536,16384)@(16384,8192)")
args = parser.parse_args()

if args.size == "small":
    num_inputs, num_outputs, batch_size, dtype = 784, 100, 256, cupy.float32
else:
    num_inputs, num_outputs, batch_size, dtype = 16384, 65536, 8192, cupy.float16

weights = cupy.random.rand(num_outputs, num_inputs).astype(dtype)
bias = cupy.random.rand(num_outputs).astype(dtype)
x = (cupy.random.rand(num_inputs, batch_size) - 0.5).astype(dtype)  # the blog uses zeros; random inputs test more


def timed(fn, repeats=10):
    fn()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(repeats):
        fn()
    stop.record()
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) / repeats


# --- forward: naive (matmul, then bias and ReLU as array ops)
mm = Matmul(weights, x)
mm.plan()


def forward_naive():
    y = mm.execute()
    y += bias[:, cupy.newaxis]
    y[y < 0] = 0
    return y


# --- forward: RELU_BIAS, and RELU_AUX_BIAS which also keeps the mask for the backward pass
mm_relu_bias = Matmul(weights, x)
mm_relu_bias.plan(epilog=MatmulEpilog.RELU_BIAS, epilog_inputs={"bias": bias})


def forward_relu_bias():
    return mm_relu_bias.execute()


mm_aux = Matmul(weights, x)
mm_aux.plan(epilog=MatmulEpilog.RELU_AUX_BIAS, epilog_inputs={"bias": bias})
relu_mask = None


def forward():
    global relu_mask
    y, aux_outputs = mm_aux.execute()
    relu_mask = aux_outputs["relu_aux"]
    return y


y_naive, y_fused, y_aux = forward_naive(), forward_relu_bias(), forward()
tol = 1e-4 if dtype == cupy.float32 else 2e-2
for label, y in (("RELU_BIAS", y_fused), ("RELU_AUX_BIAS", y_aux)):
    err = float(cupy.abs(y - y_naive).max() / cupy.abs(y_naive).max())
    print(f"forward {label:14s} vs naive: max relative difference {err:.2e}")
    assert err < tol

# --- backward through the previous layer's ReLU: grad_t1 = (weights.T @ grad) masked, grad_bias = its row sums.
# Here "the previous layer" is this layer's own forward: its pre-activation has num_outputs rows,
# so the gradient flowing back has that shape and weights2 (num_outputs x num_outputs) feeds it.
grad = (cupy.random.rand(num_outputs, batch_size) - 0.5).astype(dtype)
weights2 = cupy.random.rand(num_outputs, num_outputs).astype(dtype)
mask = (weights @ x + bias[:, None]) < 0  # t1 < 0

mm_back = Matmul(weights2.T, grad)
mm_back.plan()


def backward_naive():
    grad_t1 = mm_back.execute()
    grad_t1[mask] = 0
    grad_bias = cupy.sum(grad_t1, axis=1)
    return grad_t1, grad_bias


mm_drelu = Matmul(weights2.T, grad)
mm_drelu.plan(epilog=MatmulEpilog.DRELU_BGRAD, epilog_inputs={"relu_aux": relu_mask})


def backward():
    grad_t1, aux_outputs = mm_drelu.execute()
    grad_bias = aux_outputs["drelu_bgrad"]
    return grad_t1, grad_bias


(g_naive, b_naive), (g_fused, b_fused) = backward_naive(), backward()
decided = cupy.abs(weights @ x + bias[:, None]) > 1e-3 * float(cupy.abs(weights @ x).max())
err_g = float(cupy.abs(cupy.where(decided, g_fused - g_naive, 0)).max() / cupy.abs(g_naive).max())
err_b = float(cupy.abs(b_fused - b_naive).max() / cupy.abs(b_naive).max())
print(f"backward DRELU_BGRAD vs naive: gradient {err_g:.2e}, bias gradient {err_b:.2e}")
assert err_g < tol and err_b < 10 * tol

print(f"\ntimings ({num_outputs}x{num_inputs} @ {num_inputs}x{batch_size}, {cupy.dtype(dtype).name}), ms per call:")
for label, fn in (("forward naive", forward_naive), ("forward RELU_BIAS", forward_relu_bias),
                  ("forward RELU_AUX_BIAS", forward), ("backward naive", backward_naive),
                  ("backward DRELU_BGRAD", backward)):
    print(f"  {label:22s} {timed(fn):9.3f}")
