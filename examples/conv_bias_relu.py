"""Conv-Bias-ReLU as fused GEMMs, forward and backward: the seed's convolution fusion with nvblaslt's epilogs.

A convolution over channels-last (NHWC) memory is a GEMM over patches: cols (N·OH·OW, kH·kW·C) @ Wᵀ.
A 1×1 convolution needs no patches at all (x's memory is cols); a k×k one gets them by an im2col copy.
The backward passes are the transposed GEMMs: dW = dzᵀ cols (the seed's conv2d_backprop_filter),
dcols = dz W summed back onto the pixels (col2im: the seed's conv2d_backprop_input), db = Σ dz.

1. The seed's own small cases (NHWC, VALID): y, dw and dx as the seed prints them, through the
   decomposition by hand and through ``FusedConv2d``; and what the backward keeps: x, w and y only.
2. (GPU) Two pointwise Conv-Bias-ReLU layers by hand with ``nvblaslt.matmul``: RELU_AUX_BIAS keeps the
   first layer's ReLU bitmask, and the second layer's input-gradient GEMM applies it with DRELU_BGRAD,
   which also gives the first layer's bias gradient in the same call.
3. (GPU) A training step of a small conv net of ``FusedConv2d`` layers (3×3 and 1×1, stride, padding,
   dilation), every gradient checked against ``nn.functional.conv2d`` + bias + ReLU / tanh-GELU under
   autograd in float64, in float64 and in bfloat16; then a few SGD steps.

Without a GPU, part 1 runs (its GEMMs are torch's matmuls) and the program says the rest needs one.

    python examples/conv_bias_relu.py [--device cpu]
"""

import argparse
import copy
import sys

try:
    import torch
except ImportError:
    sys.exit("this example needs PyTorch")

from torch import nn
from torch.nn import functional as F

from nvblaslt.torch._conv import FusedConv2d, conv2d  # nvblaslt.torch.FusedConv2d once exported

parser = argparse.ArgumentParser()
parser.add_argument("--device", choices=["auto", "cpu"], default="auto",
                    help="cpu: only part 1, with torch's matmuls as the GEMMs, even where there is a GPU")
args = parser.parse_args()
device = "cuda" if args.device == "auto" and torch.cuda.is_available() else "cpu"
passed = []


def check(label: str, ok: bool) -> None:
    passed.append(bool(ok))
    print(f"{label}: {bool(ok)}")


def nhwc(t):
    """A seed tensor (N, H, W, C) as torch's (N, C, H, W) with channels-last memory: the same memory."""
    return t.permute(0, 3, 1, 2)


def grid(t) -> list:
    return t[0, 0].tolist()


# ---- 1. the seed's small cases -------------------------------------------------------------------------------
print(f"1. the seed's cases (NHWC, VALID), GEMMs on {device} ({'cuBLASLt' if device == 'cuda' else 'torch matmul'})")
x = torch.arange(9.0, device=device).reshape(1, 3, 3, 1)  # tf.reshape(tf.range(0, 9), (1, 3, 3, 1))
w_ones = torch.ones(1, 1, 2, 2, device=device)  # tf.ones((2, 2, 1, 1)), as torch's (out, in, kH, kW)
w_range = torch.arange(4.0, device=device).reshape(1, 1, 2, 2)  # tf.reshape(tf.range(0, 4), (2, 2, 1, 1))

# by hand: the four 2×2 patches of x are the rows of cols; y = cols @ w
cols = torch.stack([x[0, i:i + 2, j:j + 2, 0].reshape(4) for i in range(2) for j in range(2)])
print("cols (one patch per row):", cols.tolist())
y_by_hand = (cols @ w_ones.reshape(4)).reshape(2, 2)
dy = torch.ones(4, device=device)
dw_by_hand = (dy @ cols).reshape(2, 2)  # dW = dyᵀ cols: conv2d_backprop_filter
dcols = dy[:, None] * w_range.reshape(1, 4)  # dcols = dy W, then each column back onto its pixel: col2im
dx_by_hand = torch.zeros(3, 3, device=device)
for row, (i, j) in enumerate((i, j) for i in range(2) for j in range(2)):
    dx_by_hand[i:i + 2, j:j + 2] += dcols[row].reshape(2, 2)

seed_y, seed_dx = [[8.0, 12.0], [20.0, 24.0]], [[0.0, 1.0, 1.0], [2.0, 6.0, 4.0], [2.0, 5.0, 3.0]]
xs = nhwc(x).requires_grad_()
w1 = w_ones.clone().requires_grad_()
y = conv2d(xs, w1, torch.zeros(1, device=device), activation="relu")  # bias 0; every y > 0, so ReLU passes all
y.backward(torch.ones_like(y))
check(f"y = {grid(y)} (by hand {y_by_hand.tolist()}), the seed's {seed_y}",
      grid(y) == seed_y == y_by_hand.tolist())
check(f"dw for dy = ones: {grid(w1.grad)} (by hand {dw_by_hand.tolist()}), the seed's {seed_y}",
      grid(w1.grad) == seed_y == dw_by_hand.tolist())
xs2 = nhwc(x.clone()).requires_grad_()
y2 = conv2d(xs2, w_range, torch.zeros(1, device=device), activation="relu")
saved = y2.grad_fn.saved_tensors  # what autograd keeps for the backward (read before backward frees it)
y2.backward(torch.ones_like(y2))
check(f"dx for w = {grid(w_range)}, dy = ones: {grid(xs2.grad)} (by hand {dx_by_hand.tolist()}), the seed's "
      f"{seed_dx}", grid(xs2.grad) == seed_dx == dx_by_hand.tolist())
# the seed's identities: dw = conv(x, dy); dx = conv(pad(dy), reverse(w))
dy4 = torch.ones(1, 1, 2, 2, device=device)
check("the seed's identities: dw = conv(x, dy), dx = conv(pad(dy), reverse(w))",
      grid(F.conv2d(nhwc(x), dy4)) == seed_y
      and grid(F.conv2d(F.pad(dy4, (1, 1, 1, 1)), w_range.flip(2, 3))) == seed_dx)
kept = [name for name, value in (("x", xs2), ("w", w_range), ("y", y2))
        if any(t.data_ptr() == value.data_ptr() and t.shape == value.shape for t in saved)]
others = [tuple(t.shape) for t in saved if t.numel() and not any(
    t.data_ptr() == v.data_ptr() for v in (xs2, w_range, y2))]
check(f"the backward keeps {', '.join(kept)} and nothing else ({others or 'no other tensor'})",
      kept == ["x", "w", "y"] and not others)

if device != "cuda":
    print("the GEMMs need a GPU: parts 2 and 3 run cuBLASLt and were skipped"
          + (" (no CUDA device)" if not torch.cuda.is_available() else " (--device cpu)"))
    print(f"all checks passed: {all(passed)}")
    sys.exit(0 if all(passed) else 1)

from nvblaslt import MatmulEpilog, matmul  # noqa: E402

# ---- 2. two pointwise layers by hand: the ReLU bitmask and DRELU_BGRAD --------------------------------------
print("\n2. two pointwise Conv-Bias-ReLU layers by hand with nvblaslt.matmul (float32)")
torch.manual_seed(0)
n, c, h, w_, mid, out_c = 4, 32, 10, 10, 64, 16
xb = torch.randn(n, c, h, w_, device="cuda").to(memory_format=torch.channels_last)
W1, b1 = torch.randn(mid, c, 1, 1, device="cuda") / c ** 0.5, torch.randn(mid, device="cuda")
W2, b2 = torch.randn(out_c, mid, 1, 1, device="cuda") / mid ** 0.5, torch.randn(out_c, device="cuda")
grad = torch.randn(n, out_c, h, w_, device="cuda").to(memory_format=torch.channels_last)
rows = lambda t: t.permute(0, 2, 3, 1).reshape(-1, t.shape[1])  # noqa: E731  (channels-last memory as (M, C))
x_rows, g_rows = rows(xb), rows(grad)  # views: no copy
A1, A2 = W1.reshape(mid, c), W2.reshape(out_c, mid)
# forward: D = W xᵀ is (features, M) column-major, the same memory as y (M, features) row-major
h1_t, aux1 = matmul(A1, x_rows.T, epilog=MatmulEpilog.RELU_AUX_BIAS, epilog_inputs={"bias": b1})
y_t = matmul(A2, h1_t, epilog=MatmulEpilog.RELU_BIAS, epilog_inputs={"bias": b2})  # its backward reads y
mask1 = aux1["relu_aux"]
# backward: layer 2's ReLU from its output; BGRADB gives db2 with dW2
dz2 = g_rows * (y_t.T > 0)
dW2_t, extra2 = matmul(h1_t, dz2, epilog=MatmulEpilog.BGRADB)
# layer 2's input-gradient GEMM applies layer 1's bitmask (DRELU) and sums layer 1's bias gradient (BGRAD)
dz1_t, extra1 = matmul(A2.T, dz2.T, epilog=MatmulEpilog.DRELU_BGRAD, epilog_inputs={"relu_aux": mask1})
dW1_t = matmul(x_rows.T, dz1_t.T)
dx_rows = matmul(A1.T, dz1_t).T
print(f"   forward kept: x, W1, W2, y and layer 1's ReLU bitmask ({tuple(mask1.shape)} {mask1.dtype}, "
      f"{mask1.numel()} bytes for {mid}×{n * h * w_} activations)")

ref = [t.detach().double().requires_grad_() for t in (xb, W1, b1, W2, b2)]
h_ref = torch.relu(F.conv2d(ref[0], ref[1], ref[2]))
y_ref = torch.relu(F.conv2d(h_ref, ref[3], ref[4]))
y_ref.backward(grad.double())
got = {"y": y_t.T.reshape(n, h, w_, out_c).permute(0, 3, 1, 2), "dx": dx_rows.reshape(n, h, w_, c).permute(0, 3, 1, 2),
       "dW1": dW1_t.T.reshape(W1.shape), "db1": extra1["drelu_bgrad"], "dW2": dW2_t.T.reshape(W2.shape),
       "db2": extra2["bgradb"]}
expected = {"y": y_ref, "dx": ref[0].grad, "dW1": ref[1].grad, "db1": ref[2].grad, "dW2": ref[3].grad,
            "db2": ref[4].grad}
errors = {k: ((got[k].double() - expected[k]).norm() / expected[k].norm()).item() for k in got}
print("   relative error against float64 F.conv2d + bias + ReLU under autograd: "
      + ", ".join(f"{k} {e:.1e}" for k, e in errors.items()))
check("   DRELU_BGRAD: layer 1's ReLU backward and bias gradient in layer 2's input-gradient GEMM, every "
      "gradient within 1e-4", max(errors.values()) < 1e-4)


# ---- 3. a small conv net of FusedConv2d layers ----------------------------------------------------------------
def reference_net():
    return nn.Sequential(nn.Conv2d(8, 32, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(32, 64, 1), nn.ReLU(),
                         nn.Conv2d(64, 64, 3, stride=2, padding=2, dilation=2), nn.GELU(approximate="tanh"),
                         nn.Conv2d(64, 16, 1), nn.ReLU())


def fused_net(reference):
    layers = list(reference)
    activations = {nn.ReLU: "relu", nn.GELU: "gelu"}
    return nn.Sequential(*(FusedConv2d.from_conv(conv, activations[type(act)])
                           for conv, act in zip(layers[::2], layers[1::2])))


def step(model, x, grad):
    for p in model.parameters():
        p.grad = None
    xi = x.detach().clone().requires_grad_()
    y = model(xi)
    y.backward(grad)
    return [y.detach(), xi.grad] + [p.grad for p in model.parameters()]


def rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()


print("\n3. a conv net of FusedConv2d layers (3×3 ReLU, 1×1 ReLU, 3×3 stride 2 dilation 2 GELU, 1×1 ReLU), "
      "channels-last, against F.conv2d + bias + activation under autograd in float64")
torch.manual_seed(1)
reference = reference_net().to("cuda", memory_format=torch.channels_last)
names = ["y", "dx"] + [name for name, _ in reference.named_parameters()]
x3 = torch.randn(8, 8, 24, 24, device="cuda").to(memory_format=torch.channels_last)
for dtype, tolerance in ((torch.float64, 1e-9), (torch.bfloat16, None)):
    theirs = copy.deepcopy(reference).to(dtype)
    ours = fused_net(copy.deepcopy(theirs))
    exact = copy.deepcopy(reference).double()
    g3 = torch.randn(8, 16, 12, 12, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
    ours_grads, their_grads = step(ours, x3.to(dtype), g3), step(theirs, x3.to(dtype), g3)
    exact_grads = step(exact, x3.double(), g3.double())
    worst = max(rel(o, e) for o, e in zip(ours_grads, exact_grads))
    finite = all(torch.isfinite(t).all() for t in ours_grads)
    if tolerance is not None:
        check(f"   {dtype}: y and every gradient ({len(names) - 1}) within {tolerance:.0e} of float64 "
              f"(worst {worst:.1e}), finite", worst < tolerance and finite)
    else:  # no further from float64 than PyTorch in the same dtype, or bf16's rounding
        their_worst = [rel(t, e) for t, e in zip(their_grads, exact_grads)]
        ok = all(rel(o, e) <= max(3 * t, 2e-2) for o, t, e in zip(ours_grads, their_worst, exact_grads))
        check(f"   {dtype}: y and every gradient within max(3 × PyTorch's own {dtype} error, 2e-2) of float64 "
              f"(worst {worst:.1e}, PyTorch's worst {max(their_worst):.1e}), finite", ok and finite)

torch.manual_seed(2)
model = fused_net(reference_net().to("cuda", torch.bfloat16, memory_format=torch.channels_last))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
xt = torch.randn(32, 8, 24, 24, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
target = torch.randn(32, 16, 12, 12, device="cuda", dtype=torch.bfloat16).abs()
losses = []
for _ in range(20):
    optimizer.zero_grad()
    loss = F.mse_loss(model(xt).float(), target.float())
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
check(f"   20 SGD steps in bfloat16: loss {losses[0]:.4f} → {losses[-1]:.4f}, falls", losses[-1] < losses[0])
print(f"all checks passed: {all(passed)}")
sys.exit(0 if all(passed) else 1)
