"""linear()'s fast path on the GPU: a call like one already checked runs from its key, on the bound step
its first call made (no gradient) or straight into the autograd Function (with one). What could go wrong
there and nowhere else: a leading shape, a like call on new tensors, a call unlike the first one in what
the key does not hold (a pointer at an offset, another stream, a capture, autocast, a search), each
compared with torch's own layer in float64.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
F = torch.nn.functional

from nvblaslt import NvblasltTypeError  # noqa: E402
from nvblaslt.torch import _bound, autotune, linear  # noqa: E402

TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}
ACT = {"relu": F.relu, "gelu": lambda y: F.gelu(y, approximate="tanh"), "none": lambda y: y}


def rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def expected(x, weight, bias, activation):
    return ACT[activation](F.linear(x.double(), weight.double(), None if bias is None else bias.double()))


def tensors(lead, in_features, out_features, dtype, bias=True, seed=0):
    torch.manual_seed(seed)
    x = torch.randn(*lead, in_features, device="cuda", dtype=dtype)
    weight = (torch.randn(out_features, in_features, device="cuda", dtype=dtype) / in_features ** 0.5)
    return x, weight, torch.randn(out_features, device="cuda", dtype=dtype) if bias else None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("activation", ["relu", "gelu", "none"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("lead", [(1,), (16,), (2, 8), ()], ids=["M1", "M16", "3-D", "1-D"])
def test_gpu_like_calls_on_new_tensors_match_torch(dtype, activation, bias, lead):
    _bound.clear()
    for seed in range(3):  # the first call checks and binds; the next two run from the key
        x, weight, b = tensors(lead, 64, 48, dtype, bias, seed)
        with torch.no_grad():
            out = linear(x, weight, b, activation)
        assert out.shape == (*lead, 48) and out.dtype == dtype and out.is_contiguous()
        assert rel(out, expected(x, weight, b, activation)) < TOL[dtype]
    assert any(pair[0][0] == "linear" for pair in _bound._local.entries)


def test_gpu_what_the_key_does_not_hold_is_read_each_call():
    dtype = torch.bfloat16
    x, weight, bias = tensors((16,), 64, 48, dtype)
    with torch.no_grad():
        linear(x, weight, bias, "relu")
        # a pointer at an offset: the checked path (matmul())
        shifted = torch.randn(16 * 64 + 8, device="cuda", dtype=dtype)[8:].view(16, 64)
        assert rel(linear(shifted, weight, bias, "relu"), expected(shifted, weight, bias, "relu")) < TOL[dtype]
        # another stream: a step of its own
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = linear(x, weight, bias, "relu")
        torch.cuda.current_stream().wait_stream(side)
        assert rel(out, expected(x, weight, bias, "relu")) < TOL[dtype]
        # autocast: float32 inputs cast to bfloat16, as nn.Linear's
        x32, weight32, bias32 = x.float(), weight.float(), bias.float()
        linear(x32, weight32, bias32, "relu")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = linear(x32, weight32, bias32, "relu")
        assert out.dtype == torch.bfloat16
        assert rel(out, expected(x, weight, bias, "relu")) < TOL[dtype]
        # a bias of another dtype is refused, as on a first call
        with pytest.raises(NvblasltTypeError, match="bias"):
            linear(x, weight, bias32, "relu")
        # inside autotune(): _gemms' path, searched
        with autotune(iterations=1):
            assert rel(linear(x, weight, bias, "gelu"), expected(x, weight, bias, "gelu")) < TOL[dtype]


def test_gpu_a_captured_call_replays_and_keeps_its_step():
    dtype = torch.bfloat16
    x, weight, bias = tensors((4,), 64, 48, dtype)
    static_x = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        linear(static_x, weight, bias, "relu")  # warm-up on a side stream, as make_graphed_callables does
    torch.cuda.current_stream().wait_stream(side)
    kept = len(_bound._local.captured)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_out = linear(static_x, weight, bias, "relu")
    assert len(_bound._local.captured) == kept + 1  # kept for the thread's life: a replay reads its workspace
    _bound.clear()  # and a replay still runs after the cache lets go
    for seed in range(2):
        torch.manual_seed(seed + 10)
        static_x.copy_(torch.randn_like(static_x))
        graph.replay()
        torch.cuda.synchronize()
        assert rel(static_out, expected(static_x, weight, bias, "relu")) < TOL[dtype]


@pytest.mark.parametrize("lead", [(16,), (2, 8)], ids=["2-D", "3-D"])
def test_gpu_like_calls_with_a_gradient_match_torch(lead):
    for seed in range(2):
        x, weight, bias = tensors(lead, 64, 48, torch.float32, seed=seed)
        leaves = (x.requires_grad_(), weight.requires_grad_(), bias.requires_grad_())
        out = linear(x, weight, bias, "gelu")
        reference = expected(*leaves, "gelu")
        assert rel(out, reference) < 1e-5
        upstream = torch.randn_like(out)
        ours = torch.autograd.grad(out, leaves, upstream)
        theirs = torch.autograd.grad(reference, leaves, upstream.double())
        for mine, their in zip(ours, theirs):
            assert rel(mine, their) < 1e-4
