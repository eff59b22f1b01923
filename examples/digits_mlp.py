"""Digit recognition: a 64→128→10 MLP trained from scratch where every matmul is an nvblaslt epilog.

Forward: h = RELU_AUX_BIAS(W1 @ x + b1) keeps the ReLU mask; logits = BIAS(W2 @ h + b2).
Backward: dW2 = dlogits @ hᵀ with a BGRADA epilog giving db2 (the sum of dlogits over the batch);
dh = DRELU_BGRAD(W2ᵀ @ dlogits, mask) gives the masked gradient and db1 at once; dW1 = dh @ xᵀ.
Softmax, loss and SGD are plain PyTorch array ops. Data: scikit-learn's bundled 8×8 digits.
Activations are feature-major (features × batch), as in NVIDIA's epilog blog.

    python examples/digits_mlp.py            (needs an NVIDIA GPU, PyTorch and scikit-learn)
"""

import sys
import time

try:
    import torch
    from sklearn.datasets import load_digits
except ImportError as missing:
    sys.exit(f"this example needs PyTorch and scikit-learn: {missing}")
import nvblaslt

try:  # a GPU, a driver and a cuBLASLt nvblaslt can use: asked before any array is made on the GPU
    nvblaslt.Handle.for_device(0)
except nvblaslt.NvblasltError as missing:
    sys.exit(f"this example needs an NVIDIA GPU, its driver and cuBLASLt: {missing}")
if not torch.cuda.is_available():
    sys.exit("this example needs PyTorch with CUDA (torch.cuda.is_available() is False)")

from nvblaslt import MatmulEpilog, matmul

torch.manual_seed(0)
images, labels = load_digits(return_X_y=True)
order = torch.randperm(len(labels))
images = torch.tensor(images, dtype=torch.float32)[order].cuda() / 16.0
labels = torch.tensor(labels)[order].cuda()
split = int(0.8 * len(labels))
train_x, test_x, train_y, test_y = images[:split], images[split:], labels[:split], labels[split:]

hidden, classes, batch, epochs, lr = 128, 10, 64, 40, 0.5
W1 = torch.randn(hidden, 64, device="cuda") * (2 / 64) ** 0.5
b1 = torch.zeros(hidden, device="cuda")
W2 = torch.randn(classes, hidden, device="cuda") * (1 / hidden) ** 0.5
b2 = torch.zeros(classes, device="cuda")


def column_major(t):
    """The same values stored column-major: BGRADA reduces A over K only in that layout."""
    return t.t().contiguous().t()


def forward(x):
    """x: (64, batch) feature-major. Returns logits (10, batch), hidden h and its ReLU mask."""
    h, aux = matmul(W1, x, epilog=MatmulEpilog.RELU_AUX_BIAS, epilog_inputs={"bias": b1})
    logits = matmul(W2, h, epilog=MatmulEpilog.BIAS, epilog_inputs={"bias": b2})
    return logits, h, aux["relu_aux"]


def gradients(x, y):
    logits, h, mask = forward(x)
    probabilities = torch.softmax(logits, dim=0)
    onehot = torch.nn.functional.one_hot(y, classes).t().to(probabilities.dtype)
    loss = -(onehot * torch.log(probabilities + 1e-12)).sum() / x.shape[1]
    dlogits = column_major((probabilities - onehot) / x.shape[1])
    dW2, aux2 = matmul(dlogits, h.t(), epilog=MatmulEpilog.BGRADA)
    dh, aux1 = matmul(W2.t(), dlogits, epilog=MatmulEpilog.DRELU_BGRAD, epilog_inputs={"relu_aux": mask})
    dW1 = matmul(dh, x.t())
    return loss, {"W1": dW1, "b1": aux1["drelu_bgrad"], "W2": dW2, "b2": aux2["bgrada"]}


def accuracy(x, y):
    return (forward(x.t())[0].argmax(dim=0) == y).float().mean().item()


def autograd_check(x, y):
    """The same network in PyTorch autograd on one batch: the largest relative gradient difference."""
    params = {name: p.clone().requires_grad_() for name, p in (("W1", W1), ("b1", b1), ("W2", W2), ("b2", b2))}
    h = torch.relu(params["W1"] @ x + params["b1"][:, None])
    logits = params["W2"] @ h + params["b2"][:, None]
    loss = torch.nn.functional.cross_entropy(logits.t(), y)
    loss.backward()
    _, ours = gradients(x, y)
    return max(((ours[n] - p.grad).norm() / p.grad.norm()).item() for n, p in params.items())


print(f"digits: {split} training and {len(labels) - split} test images, MLP 64→{hidden}→{classes}")
difference = autograd_check(train_x[:batch].t(), train_y[:batch])
print(f"gradients against PyTorch autograd on one batch: largest relative difference {difference:.2e}")

start = time.perf_counter()
for epoch in range(1, epochs + 1):
    permutation = torch.randperm(split, device="cuda")
    total = 0.0
    for first in range(0, split, batch):
        chosen = permutation[first:first + batch]
        loss, grads = gradients(train_x[chosen].t(), train_y[chosen])
        total += loss.item() * len(chosen)
        for name, p in (("W1", W1), ("b1", b1), ("W2", W2), ("b2", b2)):
            p -= lr * grads[name]
    if epoch % 5 == 0 or epoch == 1:
        print(f"epoch {epoch:2d}: loss {total / split:.4f}, train accuracy {accuracy(train_x, train_y):.3f}, "
              f"test accuracy {accuracy(test_x, test_y):.3f}")
torch.cuda.synchronize()
elapsed = time.perf_counter() - start
final = accuracy(test_x, test_y)
print(f"trained in {elapsed:.1f} s; test accuracy {final:.3f}")
assert difference < 1e-4, "gradients disagree with autograd"
assert final >= 0.95, "test accuracy below 95 %"
