"""FusedConv2d on the GPU (issue 25): nvblaslt's cuBLASLt GEMMs against a float64 reference.

Every gradient (x, weight, bias) is compared with ``nn.functional.conv2d`` + bias + activation under
autograd in float64, on fresh random inputs: fp32 / fp16 / bf16; 1×1 and k×k; stride, padding and
dilation; channels-last and contiguous weights. Then the seed's own small cases, the GEMMs' operands
and epilogs (a pointwise convolution reads x in place), the fake implementations against the real
outputs, float64 gradcheck, torch.compile(fullgraph=True), CUDA graphs, and refusals of bad input
before any GEMM. The layout math alone is tested without a GPU in tests/cpu/test_conv.py.
"""

from __future__ import annotations

import copy

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional

from nvblaslt import NvblasltError, NvblasltValueError  # noqa: E402
from nvblaslt.torch import _gemms  # noqa: E402
from nvblaslt.torch._conv import FusedConv2d, conv2d  # noqa: E402

CL = torch.channels_last
ACTIVATIONS = {"relu": nn.ReLU, "gelu": lambda: nn.GELU(approximate="tanh"), "none": nn.Identity}
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}

# (N, C, H, W, O, kernel, stride, padding, dilation)
CASES = {
    "1x1": (4, 24, 9, 7, 40, 1, 1, 0, 1),
    "1x1-odd-widths": (3, 37, 5, 6, 19, 1, 1, 0, 1),
    "1x1-stride2": (4, 24, 9, 8, 32, 1, 2, 0, 1),
    "3x3": (4, 16, 10, 9, 24, 3, 1, 1, 1),
    "3x3-stride2": (4, 16, 11, 10, 24, 3, 2, 1, 1),
    "3x3-dilation2": (2, 8, 12, 12, 16, 3, 1, 2, 2),
    "3x2-mixed": (2, 8, 9, 8, 12, (3, 2), (2, 1), (1, 0), (1, 2)),
    "5x5-valid": (2, 6, 9, 9, 10, 5, 1, 0, 1),
    "one-output-channel": (2, 8, 5, 5, 1, 3, 1, 1, 1),  # D has one row: BGRADB sums a single column
}


def rel(a, b) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def pair(v):
    return v if isinstance(v, tuple) else (v, v)


def make(case, dtype, weight_format=torch.contiguous_format, seed=0):
    """(nn.Conv2d + activation module pieces, x channels-last, upstream gradient) on the GPU in ``dtype``."""
    n, c, h, w, o, k, s, p, d = CASES[case]
    torch.manual_seed(seed)
    conv = nn.Conv2d(c, o, pair(k), pair(s), pair(p), pair(d), device="cuda", dtype=dtype)
    conv = conv.to(memory_format=weight_format)
    x = torch.randn(n, c, h, w, device="cuda", dtype=dtype).contiguous(memory_format=CL)
    grad = torch.randn(conv(x).shape, device="cuda", dtype=dtype).contiguous(memory_format=CL)
    return conv, x, grad


def step(model, x, grad):
    """[y, dx, dW, db] of one forward + backward from zeroed gradients."""
    for p in model.parameters():
        p.grad = None
    xi = x.detach().clone().requires_grad_()
    y = model(xi)
    y.backward(grad)
    return [y.detach(), xi.grad] + [p.grad.clone() for p in model.parameters()]


class _Decided(nn.Module):
    """ReLU with its decisions given: z * mask (the float64 model taking the fused model's decisions)."""

    def __init__(self, mask):
        super().__init__()
        self.mask = mask

    def forward(self, z):
        return z * self.mask.to(z.dtype)


def assert_near_float64(conv, activation, x, grad, dtype):
    """FusedConv2d (on a copy of ``conv``) against ``conv`` + activation in float64: y and every gradient no
    further from float64 than PyTorch's own conv2d in ``dtype`` is (or the dtype's tolerance), all finite.

    ReLU: a decision at z ≈ 0 may go either way in a 16/32-bit result, so the decisions must match
    float64's where |z| exceeds 1 % of the largest, and the gradients are compared with the float64
    model taking the fused model's own decisions (its output > 0, which is what its backward reads)."""
    reference = nn.Sequential(conv, ACTIVATIONS[activation]())
    fused = FusedConv2d.from_conv(copy.deepcopy(conv), activation)
    ours, theirs = step(fused, x, grad), step(reference, x, grad)
    exact_model = copy.deepcopy(reference).double()
    exact = step(exact_model, x.double(), grad.double())
    given = exact
    if activation == "relu":
        with torch.no_grad():
            z = exact_model[0](x.double())
        decided = z.abs() > 1e-2 * z.abs().max()
        assert torch.equal((ours[0] > 0)[decided], (z > 0)[decided])
        given = step(nn.Sequential(exact_model[0], _Decided(ours[0] > 0)), x.double(), grad.double())
    for name, o, t, e, g in zip(["y", "dx", "dW", "db"], ours, theirs, exact, given):
        assert o.dtype == dtype and o.shape == e.shape and torch.isfinite(o).all(), name
        assert rel(o, g) <= max(3 * rel(t, e), TOL[dtype]), (name, rel(o, g), rel(t, e))
    assert ours[0].is_contiguous(memory_format=CL) and ours[1].is_contiguous(memory_format=CL)
    return fused


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("activation", ["relu", "gelu", "none"])
@pytest.mark.parametrize("case", CASES)
def test_gpu_every_gradient_matches_float64(case, activation, dtype):
    conv, x, grad = make(case, dtype)
    assert_near_float64(conv, activation, x, grad, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", ["1x1", "3x3-stride2", "3x2-mixed"])
def test_gpu_channels_last_weights_and_no_bias(case, dtype):
    conv, x, grad = make(case, dtype, weight_format=CL, seed=1)
    conv.bias = None
    fused = assert_near_float64(conv, "relu", x, grad, dtype)
    weight, grad = fused.weight, fused.weight.grad  # the same memory order (strides of size-1 dims are free)
    assert all(g == w for g, w, size in zip(grad.stride(), weight.stride(), weight.shape) if size > 1)


@pytest.mark.parametrize("shape", [(8, 64, 28, 256, 1, 0), (8, 256, 14, 64, 1, 0), (4, 64, 28, 64, 3, 1)],
                         ids=["resnet-1x1-expand", "resnet-1x1-reduce", "resnet-3x3"])
def test_gpu_network_sized_layers_in_bf16(shape):
    n, c, size, o, k, p = shape
    torch.manual_seed(2)
    conv = nn.Conv2d(c, o, k, padding=p, device="cuda", dtype=torch.bfloat16).to(memory_format=CL)
    x = torch.randn(n, c, size, size, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=CL)
    grad = torch.randn(conv(x).shape, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=CL)
    assert_near_float64(conv, "relu", x, grad, torch.bfloat16)


# ---- the seed's cases --------------------------------------------------------------------------------------------

def seed_input(dtype):
    return torch.arange(9.0, device="cuda", dtype=dtype).reshape(1, 3, 3, 1).permute(0, 3, 1, 2)  # NHWC memory


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("activation", [None, "relu"])
def test_gpu_the_seeds_small_cases(dtype, activation):
    """x = 0..8 (3×3), VALID: y = [[8, 12], [20, 24]] for w = ones (2×2); for dy = ones, dw = y and, with
    w = [[0, 1], [2, 3]], dx = [[0, 1, 1], [2, 6, 4], [2, 5, 3]]. Small integers: exact in bf16 too."""
    x = seed_input(dtype).requires_grad_()
    w = torch.ones(1, 1, 2, 2, device="cuda", dtype=dtype, requires_grad=True)
    y = conv2d(x, w, torch.zeros(1, device="cuda", dtype=dtype), padding="valid", activation=activation)
    y.backward(torch.ones_like(y))
    assert y[0, 0].tolist() == [[8, 12], [20, 24]] and w.grad[0, 0].tolist() == [[8, 12], [20, 24]]
    assert x.grad[0, 0].tolist() == [[1, 2, 1], [2, 4, 2], [1, 2, 1]]
    x2 = seed_input(dtype).requires_grad_()
    w2 = torch.arange(4.0, device="cuda", dtype=dtype).reshape(1, 1, 2, 2)
    y2 = conv2d(x2, w2, activation=activation)
    y2.backward(torch.ones_like(y2))
    assert x2.grad[0, 0].tolist() == [[0, 1, 1], [2, 6, 4], [2, 5, 3]]


# ---- what runs: operands and epilogs -----------------------------------------------------------------------------

@pytest.fixture
def recorded(monkeypatch):
    """Every nvblaslt.matmul call of the torch layer: (epilog name, A, B)."""
    calls = []
    real = _gemms.matmul

    def recording(a, b, *, epilog=None, epilog_inputs=None):
        calls.append((getattr(epilog, "name", str(epilog)), a, b))
        return real(a, b, epilog=epilog, epilog_inputs=epilog_inputs)
    monkeypatch.setattr(_gemms, "matmul", recording)
    return calls


def test_gpu_pointwise_runs_on_xs_memory_with_the_fused_epilogs(bound_calls):
    conv, x, grad = make("1x1", torch.bfloat16)
    fused = FusedConv2d.from_conv(conv, "relu")
    xi = x.detach().clone().requires_grad_()
    y = fused(xi)
    assert [c[0] for c in bound_calls] == ["RELU_BIAS"]
    assert bound_calls[0][2] == xi.data_ptr()  # D = W xᵀ: B is x itself, no copy
    y.backward(grad)
    assert sorted(c[0] for c in bound_calls[1:]) == ["BGRADB", "DEFAULT"]  # dW with db; dx
    assert any(xi.data_ptr() in (a, b) for _, a, b in bound_calls[1:])
    gelu = FusedConv2d.from_conv(conv, "gelu")
    bound_calls.clear()
    gelu(x.detach().clone().requires_grad_())
    assert [c[0] for c in bound_calls] == ["GELU_AUX_BIAS"]


@pytest.fixture
def bound_calls(monkeypatch):
    """Every bound GEMM the pointwise step launches: (epilog name, A pointer, B pointer)."""
    from nvblaslt.torch import _bound

    calls = []
    real = _bound.BoundGemm.__call__

    def recording(self, a, b, d, stream, *pointers):
        calls.append((self.plan._epilog.name, a, b))
        return real(self, a, b, d, stream, *pointers)
    monkeypatch.setattr(_bound.BoundGemm, "__call__", recording)
    return calls


def test_gpu_fake_implementations_match_the_real_outputs():
    """opcheck compares the real outputs' shapes, strides and dtypes with the fake implementation's."""
    conv, x, grad = make("3x2-mixed", torch.float32)
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    for activation, keep in (("gelu", True), ("relu", False), ("none", False)):
        args = (x, conv.weight.detach(), conv.bias.detach(), activation, keep, [2, 1], [1, 0], [1, 2])
        out, aux = torch.ops.nvblaslt.conv2d(*args)
        torch.library.opcheck(torch.ops.nvblaslt.conv2d.default, args, test_utils=utils)
        backward = (grad, x, conv.weight.detach(), out if activation == "relu" else None, aux, activation, True,
                    [2, 1], [1, 0], [1, 2], True, True)
        torch.library.opcheck(torch.ops.nvblaslt.conv2d_backward.default, backward, test_utils=utils)


def test_gpu_gradcheck_float64():
    """float64 finite differences; where cuBLASLt has no float64 kernel for an epilog, that step runs as
    torch ops (as for FusedLinear)."""
    torch.manual_seed(3)
    net = nn.Sequential(FusedConv2d(2, 3, 3, padding=1, activation="gelu"), FusedConv2d(3, 3, 1, activation="relu"),
                        FusedConv2d(3, 2, (2, 3), stride=(2, 1), dilation=(1, 2))).to("cuda", torch.float64)
    names = [n for n, _ in net.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in net.parameters())
    x = torch.randn(2, 2, 4, 5, device="cuda", dtype=torch.float64).contiguous(memory_format=CL).requires_grad_()

    def f(x, *params):
        return torch.func.functional_call(net, dict(zip(names, params)), (x,))

    assert torch.autograd.gradcheck(f, (x, *params), nondet_tol=1e-12)


def small_net(dtype):
    return nn.Sequential(FusedConv2d(16, 64, 1, activation="relu"),
                         FusedConv2d(64, 64, 3, padding=1, activation="gelu"),
                         FusedConv2d(64, 32, 3, stride=2, padding=1, activation="relu"),
                         FusedConv2d(32, 16, 1)).to("cuda", dtype, memory_format=CL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gpu_torch_compile_fullgraph_matches_eager(dtype):
    torch._dynamo.reset()
    torch.manual_seed(4)
    model = small_net(dtype)
    x = torch.randn(8, 16, 16, 16, device="cuda", dtype=dtype).contiguous(memory_format=CL).requires_grad_()
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    compiled = torch.compile(model, fullgraph=True)
    grad = torch.randn(8, 16, 8, 8, device="cuda", dtype=dtype).contiguous(memory_format=CL)
    eager = step(model, x, grad)
    for _ in range(2):  # the second call runs the compiled graphs again, without recompiling
        got = step(compiled, x, grad)
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    for a, e in zip(got, eager):
        torch.testing.assert_close(a, e, **tolerance)


def test_gpu_make_graphed_callables_replays_like_eager():
    torch.manual_seed(5)
    model = nn.Sequential(FusedConv2d(16, 32, 1, activation="relu"), FusedConv2d(32, 8, 1)).to("cuda",
                                                                                              memory_format=CL)
    eager = copy.deepcopy(model)
    sample = torch.randn(4, 16, 8, 8, device="cuda").contiguous(memory_format=CL).requires_grad_()
    graphed = torch.cuda.make_graphed_callables(model, (sample,))
    for seed in range(3):
        torch.manual_seed(100 + seed)
        x = torch.randn(4, 16, 8, 8, device="cuda").contiguous(memory_format=CL)
        grad = torch.randn(4, 8, 8, 8, device="cuda").contiguous(memory_format=CL)
        for a, e in zip(step(graphed, x, grad), step(eager, x, grad)):
            torch.testing.assert_close(a, e)


# ---- bad input ----------------------------------------------------------------------------------------------------

def test_gpu_bad_input_is_refused_before_any_gemm(recorded):
    layer = FusedConv2d(8, 16, 3, padding=1, activation="relu").cuda()
    x = torch.randn(2, 8, 6, 6, device="cuda")  # channels-first
    for call, match in ((lambda: layer(x), "x: expected channels-last memory"),
                        (lambda: FusedConv2d(8, 16, 3, groups=2), "groups: only 1"),
                        (lambda: FusedConv2d(8, 16, 3, padding_mode="reflect"), "padding_mode: only 'zeros'"),
                        (lambda: conv2d(x.contiguous(memory_format=CL), layer.weight.cpu()), "weight: on cpu")):
        with pytest.raises(NvblasltValueError, match=match) as info:
            call()
        assert isinstance(info.value, (NvblasltError, ValueError))
    assert recorded == []
    layer(x.contiguous(memory_format=CL)).sum().backward()  # the conversion the error names
    assert layer.weight.grad is not None


def test_gpu_fuse_with_a_sample_times_each_candidate_and_keeps_the_models_results(caplog):
    """fuse(…, sample=x) on the GPU: one decision logged per pointwise candidate, made from its own input
    (the second layer sees the first's output), and the returned model, fused or not, trains as eager does."""
    import logging

    from nvblaslt.torch import fuse

    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(16, 48, 1), nn.ReLU(), nn.Conv2d(48, 16, 1), nn.GELU(approximate="tanh"),
                          nn.Conv2d(16, 16, 3, padding=1), nn.ReLU()).cuda().to(memory_format=CL)
    x = torch.randn(8, 16, 12, 12, device="cuda").contiguous(memory_format=CL)
    reference = copy.deepcopy(model).double()
    with caplog.at_level(logging.INFO, logger="nvblaslt"):
        fused = fuse(model, convolutions=True, sample=x)
    decisions = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fuse: ")]
    assert len(decisions) == 2, decisions  # the two pointwise layers; the 3×3 is no candidate
    assert "(8, 16, 12, 12)" in decisions[0] and "(8, 48, 12, 12)" in decisions[1]
    for decision, index in zip(decisions, (0, 2)):
        assert isinstance(fused[index], FusedConv2d) == decision.endswith(": fused")
    assert all(p.grad is None for p in model.parameters())  # timing left the model's gradients alone
    xg, xd = x.clone().requires_grad_(), x.double().requires_grad_()
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # an unfused layer runs cuDNN in fp32
        fused(xg).square().sum().backward()
        reference(xd).square().sum().backward()
    assert rel(xg.grad, xd.grad) < 1e-4
    for got, want in zip(model.parameters(), reference.parameters()):
        assert torch.isfinite(got.grad).all() and rel(got.grad, want.grad) < 1e-4
