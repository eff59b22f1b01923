"""fuse(…, sample=x): a convolution is converted only where its fused step is measured no slower. The
steps run on the CPU here; a simulated clock, advanced by each layer's forward, says how long they took."""

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from nvblaslt import NvblasltValueError  # noqa: E402
from nvblaslt.torch import _fuse_timing, fuse  # noqa: E402
from nvblaslt.torch._conv import FusedConv2d  # noqa: E402

CL = torch.channels_last


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    """A clock that a layer's forward advances by its cost: {weight id: (eager, fused)} in seconds."""
    clock, costs = Clock(), {}

    def advance(module, args, output):
        cost = costs.get(id(getattr(module, "weight", None)))
        if cost is not None and isinstance(module, (FusedConv2d, nn.Conv2d)):
            clock.now += cost[1] if isinstance(module, FusedConv2d) else cost[0]

    monkeypatch.setattr(_fuse_timing, "_clock", clock)
    handle = nn.modules.module.register_module_forward_hook(advance)
    yield costs
    handle.remove()


def model_and_sample(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(8, 16, 1), nn.ReLU(), nn.Conv2d(16, 8, 1), nn.GELU(approximate="tanh"),
                          nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
    return model.to(memory_format=CL), torch.randn(2, 8, 5, 5).contiguous(memory_format=CL)


@pytest.mark.parametrize("training", [True, False])
def test_only_the_convolutions_measured_faster_fused_are_converted(clock, training):
    model, x = model_and_sample()
    model.train(training)
    want = model(x).detach()
    clock[id(model[0].weight)] = (2e-6, 1e-6)  # fused faster: converted
    clock[id(model[2].weight)] = (1e-6, 3e-6)  # fused slower: left as it is
    fused = fuse(model, convolutions=True, sample=x)
    assert isinstance(fused[0], FusedConv2d) and isinstance(fused[1], nn.Identity)
    assert type(fused[2]) is nn.Conv2d and isinstance(fused[3], nn.GELU)
    assert fused[0].weight is model[0].weight  # the parameters are shared, not copied
    torch.testing.assert_close(fused(x), want, rtol=1e-5, atol=1e-5)
    assert all(p.grad is None for p in model.parameters())  # the measurement touched no .grad


def test_a_tie_converts_and_without_a_sample_every_candidate_is_converted(clock):
    model, x = model_and_sample()
    clock[id(model[0].weight)] = (1e-6, 1e-6)
    clock[id(model[2].weight)] = (1e-6, 5e-6)
    measured = fuse(model, convolutions=True, sample=x)
    assert isinstance(measured[0], FusedConv2d) and type(measured[2]) is nn.Conv2d
    model, x = model_and_sample()
    every = fuse(model, convolutions=True)
    assert isinstance(every[0], FusedConv2d) and isinstance(every[2], FusedConv2d)


def test_a_convolution_the_sample_does_not_reach_is_left_unfused(clock):
    class Branches(nn.Module):
        def __init__(self):
            super().__init__()
            self.used = nn.Sequential(nn.Conv2d(8, 8, 1), nn.ReLU())
            self.unused = nn.Sequential(nn.Conv2d(8, 8, 1), nn.ReLU())

        def forward(self, x):
            return self.used(x)

    torch.manual_seed(1)
    model = Branches().to(memory_format=CL)
    clock[id(model.used[0].weight)] = (2e-6, 1e-6)
    clock[id(model.unused[0].weight)] = (2e-6, 1e-6)
    fused = fuse(model, convolutions=True, sample=(torch.randn(1, 8, 3, 3).contiguous(memory_format=CL),))
    assert isinstance(fused.used[0], FusedConv2d)
    assert type(fused.unused[0]) is nn.Conv2d


def test_a_sample_without_convolutions_is_refused():
    model, x = model_and_sample()
    with pytest.raises(NvblasltValueError, match="^sample: .*convolutions=True"):
        fuse(model, sample=x)
