"""The hot paths' hits on the GPU (issue 33, target 4): after linear()'s and the pointwise conv's like calls
have bound their steps, a lazy negation (a neg-bit view, whose key is its base's) is refused by name as
matmul() refuses it, or computed as torch computes it, never multiplied as its unnegated memory; a like
call after it runs bound again and matches torch. The bound steps' LRU under more shapes than the cache
holds keeps giving torch's values."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
F = torch.nn.functional

from nvblaslt import NvblasltValueError  # noqa: E402
from nvblaslt.torch import _bound, conv2d, linear  # noqa: E402


def rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def refused_or_right(call, want) -> None:
    """``call()`` refuses the neg-bit view by name, or gives torch's values."""
    try:
        got = call()
    except NvblasltValueError as error:
        assert "negative-bit view" in str(error)
    else:
        assert rel(got, want) < 1e-5


@pytest.mark.parametrize("negated", ["x", "weight", "bias"])
def test_gpu_linear_refuses_a_lazy_negation_after_like_calls(negated):
    torch.manual_seed(0)
    tensors = {"x": torch.randn(16, 64, device="cuda"), "weight": torch.randn(48, 64, device="cuda") / 8,
               "bias": torch.randn(48, device="cuda")}
    with torch.no_grad():
        for _ in range(2):
            linear(tensors["x"], tensors["weight"], tensors["bias"], "relu")
        viewed = dict(tensors, **{negated: torch._neg_view(tensors[negated])})
        refused_or_right(lambda: linear(viewed["x"], viewed["weight"], viewed["bias"], "relu"),
                         F.relu(F.linear(*(t.double() for t in viewed.values()))))
        out = linear(tensors["x"], tensors["weight"], tensors["bias"], "relu")
    assert rel(out, F.relu(F.linear(*(t.double() for t in tensors.values())))) < 1e-5


def test_gpu_pointwise_conv_refuses_a_lazy_negation_after_like_calls():
    torch.manual_seed(0)
    x = torch.randn(2, 32, 8, 8, device="cuda").contiguous(memory_format=torch.channels_last)
    weight, bias = torch.randn(16, 32, 1, 1, device="cuda") / 6, torch.randn(16, device="cuda")
    with torch.no_grad():
        for _ in range(2):
            conv2d(x, weight, bias, activation="relu")
        negated = torch._neg_view(x)
        refused_or_right(lambda: conv2d(negated, weight, bias, activation="relu"),
                         F.relu(F.conv2d(negated.double(), weight.double(), bias.double())))
        out = conv2d(x, weight, bias, activation="relu")
    assert rel(out, F.relu(F.conv2d(x.double(), weight.double(), bias.double()))) < 1e-5


def test_gpu_more_shapes_than_the_cache_holds_keep_matching_torch():
    torch.manual_seed(0)
    weight, bias = torch.randn(48, 64, device="cuda") / 8, torch.randn(48, device="cuda")
    with torch.no_grad():
        for round_ in range(2):  # the second round finds the recent shapes and remakes the evicted ones
            for rows in range(1, _bound._CACHE_SIZE + 6):
                x = torch.randn(rows, 64, device="cuda")
                out = linear(x, weight, bias, "gelu")
                want = F.gelu(F.linear(x.double(), weight.double(), bias.double()), approximate="tanh")
                assert rel(out, want) < 1e-5, (round_, rows)
    assert len(_bound.steps()) <= _bound._CACHE_SIZE
