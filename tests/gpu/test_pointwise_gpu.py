"""The pointwise conv step on bound GEMMs (``nvblaslt.torch._pointwise``) on the GPU.

FusedConv2d's 1×1 layers run their three GEMMs as ``BoundGemm``s: plans found under the input's shape,
dtype, device and stream, launched with pointers alone. What could go wrong there and nowhere else:
a gradient some input does not want, an upstream gradient in another layout, a pointer aligned to less
than the plan assumed, another stream, a search that stores a new choice, a graph capture, a double
backward. Each is compared with nn.Conv2d + activation in float64 on fresh random inputs (every
element finite, every element written), and where the bound step must step aside, with the path it
steps aside to.
"""

from __future__ import annotations

import copy

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
nn = torch.nn

from nvblaslt import _tuning_cache  # noqa: E402
from nvblaslt.torch import _bound, _pointwise  # noqa: E402
from nvblaslt.torch._conv import FusedConv2d  # noqa: E402

CL = torch.channels_last
ACTIVATIONS = {"relu": nn.ReLU, "gelu": lambda: nn.GELU(approximate="tanh"), "none": nn.Identity}
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def layer(c, o, activation, dtype, bias=True, seed=0, weight_format=torch.contiguous_format):
    torch.manual_seed(seed)
    conv = nn.Conv2d(c, o, 1, bias=bias, device="cuda", dtype=dtype).to(memory_format=weight_format)
    return conv, FusedConv2d.from_conv(copy.deepcopy(conv), activation)


def images(n, c, h, w, dtype, seed=1):
    torch.manual_seed(seed)
    return torch.randn(n, c, h, w, device="cuda", dtype=dtype).contiguous(memory_format=CL)


def run(model, x, grad, x_grad=True):
    for p in model.parameters():
        p.grad = None
    xi = x.detach().clone().requires_grad_(x_grad)
    y = model(xi)
    y.backward(grad)
    grads = [p.grad for p in model.parameters()]
    return y.detach(), (xi.grad if x_grad else None), grads


def assert_like_float64(conv, fused, activation, x, grad, x_grad=True):
    """y and every gradient of ``fused`` against ``conv`` + activation: no further from float64 than
    torch's own in x's dtype (or the dtype's tolerance), finite, laid out as nn.Conv2d's."""
    dtype = x.dtype
    reference = nn.Sequential(conv, ACTIVATIONS[activation]())
    exact = copy.deepcopy(reference).double()
    ours, theirs = run(fused, x, grad, x_grad), run(reference, x, grad, x_grad)
    truth = run(exact, x.double(), grad.double(), x_grad)
    if activation == "relu":  # the float64 model takes our decisions (z ≈ 0 may go either way)
        mask = (ours[0] > 0).double()
        decided = nn.Sequential(exact[0], _Mask(mask))
        truth = run(decided, x.double(), grad.double(), x_grad)
    pairs = [(ours[0], theirs[0], truth[0])]
    if x_grad:
        pairs.append((ours[1], theirs[1], truth[1]))
    pairs += list(zip(ours[2], theirs[2], truth[2]))
    for o, t, e in pairs:
        if t is None:
            assert o is None
            continue
        assert o is not None and o.dtype == dtype and o.shape == e.shape and torch.isfinite(o).all()
        assert rel(o, e) <= max(3 * rel(t, e), TOL[dtype]), (rel(o, e), rel(t, e))
    assert ours[0].is_contiguous(memory_format=CL)
    if x_grad:
        assert ours[1].is_contiguous(memory_format=CL)


def _no_op_path(*args):
    raise AssertionError("the backward took the custom op's path, not its bound GEMMs")


def steps_for(shape, dtype) -> list:
    """This thread's cached steps for inputs of ``shape`` and ``dtype``."""
    return [step for (key, _), step in _bound.steps().items() if key[:2] == (shape, dtype)]


def bound_forward(shape, dtype, bias: bool) -> bool:
    """Whether this thread has a step for inputs of ``shape`` and ``dtype`` whose forward GEMM is bound: a
    convolution's step (keyed by x's shape and dtype first), or linear()'s (keyed by its call, "linear" first)."""
    for (key, _), step in _bound.steps().items():
        if isinstance(key[0], str) and key[0] == "linear":  # ("linear", activation, grad, shape, dtype, …, bias)
            found = key[3:5] == (shape, dtype) and (key[-1] is not None) == bias
        else:
            found = key[:2] == (shape, dtype) and key[4] == (not bias)
        if found and step.gemms[0] is not None:
            return True
    return False


class _Mask(nn.Module):
    def __init__(self, mask):
        super().__init__()
        self.mask = mask

    def forward(self, z):
        return z * self.mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("activation", ["relu", "gelu", "none"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_gpu_bound_step_matches_float64(dtype, activation, bias, monkeypatch):
    conv, fused = layer(40, 72, activation, dtype, bias)
    x = images(6, 40, 7, 9, dtype)
    grad = torch.randn(6, 72, 7, 9, device="cuda", dtype=dtype).contiguous(memory_format=CL)
    monkeypatch.setattr(_pointwise, "_as_op", _no_op_path)
    assert_like_float64(conv, fused, activation, x, grad)
    assert bound_forward(x.shape, dtype, bias)  # the forward ran bound, and the backward never took the op


@pytest.mark.parametrize("frozen", ["weight", "bias", "x", "weight-and-bias"])
def test_gpu_only_the_wanted_gradients(frozen):
    conv, fused = layer(24, 40, "relu", torch.float32, seed=3)
    for module in (conv, fused):
        if "weight" in frozen:
            module.weight.requires_grad_(False)
        if "bias" in frozen:
            module.bias.requires_grad_(False)
    x = images(4, 24, 5, 6, torch.float32)
    grad = torch.randn(4, 40, 5, 6, device="cuda").contiguous(memory_format=CL)
    assert_like_float64(conv, fused, "relu", x, grad, x_grad=frozen != "x")


@pytest.mark.parametrize("layout", ["contiguous", "expanded"])
def test_gpu_upstream_gradient_in_another_layout(layout):
    conv, fused = layer(16, 24, "gelu", torch.float32, seed=4)
    x = images(3, 16, 6, 5, torch.float32)
    if layout == "expanded":  # y.sum().backward(): a gradient of zero strides
        grad = torch.ones(1, device="cuda").expand(3, 24, 6, 5)
    else:
        grad = torch.randn(3, 24, 6, 5, device="cuda")  # NCHW, not channels-last
    assert not grad.is_contiguous(memory_format=CL)
    assert_like_float64(conv, fused, "gelu", x, grad)


def test_gpu_a_misaligned_input_takes_the_ops_path_and_is_right():
    conv, fused = layer(3, 8, "relu", torch.float32, seed=5)
    big = images(3, 3, 5, 3, torch.float32)
    x = big[1:]  # 5·3·3 floats in: 180 bytes, not a multiple of 256
    assert x.is_contiguous(memory_format=CL) and x.data_ptr() % 256
    before = dict(_bound._local.entries)
    with torch.no_grad():
        got, want = fused(x), torch.relu(conv.double()(x.double()))
    assert rel(got, want) < 1e-5 and dict(_bound._local.entries).keys() == before.keys()


def test_gpu_inference_no_grad_and_another_stream():
    conv, fused = layer(32, 48, "gelu", torch.bfloat16, seed=6)
    x = images(2, 32, 9, 4, torch.bfloat16)
    want = nn.functional.gelu(conv.double()(x.double()), approximate="tanh")
    with torch.no_grad():
        first = fused(x)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            second = fused(x)
        torch.cuda.current_stream().wait_stream(side)
    streams = {stream for (key, stream) in _bound._local.entries if key[0] == x.shape and key[-1] is False}
    assert len(streams) >= 2  # each stream its own plans
    for got in (first, second):
        assert got.is_contiguous(memory_format=CL) and torch.isfinite(got).all() and rel(got, want) < 2e-2


def test_gpu_a_stored_search_choice_rebuilds_the_steps(monkeypatch):
    conv, fused = layer(24, 32, "relu", torch.float16, seed=7)
    x = images(4, 24, 4, 4, torch.float16)
    grad = torch.randn(4, 32, 4, 4, device="cuda", dtype=torch.float16).contiguous(memory_format=CL)
    run(fused, x, grad)
    before = steps_for(x.shape, torch.float16)
    monkeypatch.setattr(_tuning_cache, "generation", _tuning_cache.generation + 1)
    assert_like_float64(conv, fused, "relu", x, grad)
    after = steps_for(x.shape, torch.float16)
    assert before and after and all(step is not old for step in after for old in before)  # made again


def test_gpu_double_backward_is_refused_by_name():
    _, fused = layer(8, 8, "gelu", torch.float32, seed=8)
    x = images(2, 8, 3, 3, torch.float32).requires_grad_()
    grad_weight, = torch.autograd.grad(fused(x).square().sum(), fused.weight, create_graph=True)
    assert grad_weight.requires_grad  # recorded by the op's backward, not detached by the bound one
    with pytest.raises(RuntimeError, match="conv2d_backward"):  # never a silent second derivative
        grad_weight.sum().backward()


def test_gpu_cuda_graph_capture_of_a_whole_step():
    """A step captured on a fresh stream: its first use there borrows the warm-up stream's plans."""
    conv, fused = layer(16, 32, "relu", torch.float32, seed=9)
    x = images(4, 16, 6, 6, torch.float32).requires_grad_()
    grad = torch.randn(4, 32, 6, 6, device="cuda").contiguous(memory_format=CL)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm-up on a side stream, as torch's docs do
            fused.weight.grad = fused.bias.grad = x.grad = None
            fused(x).backward(grad)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    fused.weight.grad = fused.bias.grad = x.grad = None
    with torch.cuda.graph(graph):
        y = fused(x)
        y.backward(grad)
    with torch.no_grad():
        x.copy_(images(4, 16, 6, 6, torch.float32, seed=11))
    graph.replay()
    torch.cuda.synchronize()
    reference = nn.Sequential(conv, nn.ReLU()).double()
    xd = x.detach().double().requires_grad_()
    want = reference(xd)
    want.backward(grad.double())
    assert rel(y, want) < 1e-5 and rel(x.grad, xd.grad) < 1e-5
    assert rel(fused.weight.grad, reference[0].weight.grad) < 1e-5


# ---- the linear layer's inference on the same bound forward ------------------------------------------------------

@pytest.mark.parametrize("tokens", [1, 16, 257])
@pytest.mark.parametrize("activation", ["relu", "gelu", "none"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_gpu_linear_inference_runs_bound_and_matches_float64(tokens, activation, bias):
    from nvblaslt.torch import linear

    torch.manual_seed(tokens)
    dtype = torch.bfloat16
    x = torch.randn(tokens, 96, device="cuda", dtype=dtype)
    weight = torch.randn(136, 96, device="cuda", dtype=dtype) / 10
    b = torch.randn(136, device="cuda", dtype=dtype) if bias else None
    z = x.double() @ weight.double().T + (b.double() if bias else 0)
    want = {"relu": torch.relu, "gelu": lambda t: nn.functional.gelu(t, approximate="tanh"),
            "none": lambda t: t}[activation](z)
    theirs = {"relu": torch.relu, "gelu": lambda t: nn.functional.gelu(t, approximate="tanh"),
              "none": lambda t: t}[activation](nn.functional.linear(x, weight, b))
    with torch.no_grad():
        got = linear(x, weight, b, activation)
    assert got.shape == (tokens, 136) and got.is_contiguous() and torch.isfinite(got).all()
    assert rel(got, want) <= max(3 * rel(theirs, want), 2e-2)
    assert bound_forward(x.shape, dtype, bias)


def test_gpu_linear_inference_with_a_transposed_weight_or_batch_invariance_takes_matmul():
    from nvblaslt.torch import linear

    torch.manual_seed(3)
    x = torch.randn(8, 64, device="cuda")
    weight_t = torch.randn(64, 48, device="cuda")  # weight = weight_t.T: not row-major
    b = torch.randn(48, device="cuda")
    want = torch.relu(x.double() @ weight_t.double() + b.double())
    before = set(_bound._local.entries)
    with torch.no_grad():
        got = linear(x, weight_t.T, b, "relu")
        invariant = linear(x, weight_t.T.contiguous(), b, "relu", batch_invariant=True)
    assert rel(got, want) < 1e-5 and rel(invariant, want) < 1e-5
    assert set(_bound._local.entries) == before  # neither ran bound



def test_gpu_a_gradient_at_an_offset_takes_the_ops_path_and_is_right():
    """torch.cat of two outputs: the second one's gradient starts 150 bytes into the upstream gradient."""
    conv, fused = layer(4, 3, "none", torch.float16, seed=12)
    a, b = images(1, 4, 5, 5, torch.float16, seed=13), images(1, 4, 5, 5, torch.float16, seed=14)
    a.requires_grad_(), b.requires_grad_()
    out = torch.cat([fused(a), fused(b)], 0)
    upstream = torch.randn_like(out)
    out.backward(upstream)
    exact = conv.double()
    ad, bd = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    torch.cat([exact(ad), exact(bd)], 0).backward(upstream.double())
    for got, want in ((a.grad, ad.grad), (b.grad, bd.grad), (fused.weight.grad, exact.weight.grad),
                      (fused.bias.grad, exact.bias.grad)):
        assert torch.isfinite(got).all() and rel(got, want) < 3e-3


def test_gpu_steps_dropped_from_the_cache_still_serve_a_live_graph(monkeypatch):
    """More input shapes than the cache holds, all forwards first: the first shapes' steps leave the cache
    while their autograd graph still needs them, and the backward must still be right."""
    monkeypatch.setattr(_bound, "_CACHE_SIZE", 4)
    conv, fused = layer(8, 16, "relu", torch.float32, seed=15)
    xs = [images(2, 8, 3 + i, 4, torch.float32, seed=20 + i).requires_grad_() for i in range(9)]
    total = sum(fused(x).square().sum() for x in xs)
    assert len(_bound._local.entries) <= 4
    total.backward()
    reference = nn.Sequential(conv, nn.ReLU()).double()
    xds = [x.detach().double().requires_grad_() for x in xs]
    sum(reference(xd).square().sum() for xd in xds).backward()
    for x, xd in zip(xs, xds):
        assert rel(x.grad, xd.grad) < 1e-5
    assert rel(fused.weight.grad, reference[0].weight.grad) < 1e-5


def test_gpu_channels_last_weights_run_bound():
    conv, fused = layer(24, 32, "gelu", torch.bfloat16, seed=16, weight_format=CL)
    x = images(3, 24, 5, 7, torch.bfloat16)
    grad = torch.randn(3, 32, 5, 7, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=CL)
    assert_like_float64(conv, fused, "gelu", x, grad)
    assert bound_forward(x.shape, torch.bfloat16, True)
