"""A whole training step of nvblaslt.torch layers with no Python host time: captured in one CUDA graph
(``torch.cuda.graph``, forward + backward + a plain SGD step), or compiled with
``torch.compile(mode="reduce-overhead")`` (CUDA-graph trees). Each replays to the same parameters as
the same steps run eagerly, on fresh random inputs; tuned plans (``nvblaslt.torch.autotune()``, with a
tuning cache of the test's own) are what the graph captures. The recipe is docs/guide/torch.md's
"A whole step with no host time"."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs an NVIDIA GPU", allow_module_level=True)
nn = torch.nn

from nvblaslt.torch import FusedConv2d, FusedLinear, autotune, fuse  # noqa: E402

STEPS = 4


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 128), nn.GELU(approximate="tanh"),
                          nn.Linear(128, 32))
    return fuse(model).to("cuda")


def _convnet() -> nn.Module:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(16, 48, 1), nn.ReLU(), nn.Conv2d(48, 16, 1), nn.GELU(approximate="tanh"),
                          nn.Conv2d(16, 8, 1))
    return fuse(model, convolutions=True).to("cuda", memory_format=torch.channels_last)


def _inputs(kind: str, count: int):
    generator = torch.Generator(device="cuda").manual_seed(7)
    if kind == "mlp":
        return [(torch.randn(96, 64, device="cuda", generator=generator),
                 torch.randn(96, 32, device="cuda", generator=generator)) for _ in range(count)]
    return [(torch.randn(4, 16, 6, 5, device="cuda", generator=generator).contiguous(memory_format=torch.channels_last),
             torch.randn(4, 8, 6, 5, device="cuda", generator=generator)) for _ in range(count)]


def _eager_steps(model, optimizer, batches) -> None:
    for x, target in batches:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x), target).backward()
        optimizer.step()


def _captured_steps(model, optimizer, batches) -> None:
    """PyTorch's whole-network capture: warm-up steps on a side stream (the plans are made there, outside
    the capture), one step captured, then the graph replayed with each batch copied into its inputs."""
    static_x, static_target = (t.clone() for t in batches[0])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # forward and backward only: the plain SGD step keeps no state to warm up
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            nn.functional.mse_loss(model(static_x), static_target).backward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loss = nn.functional.mse_loss(model(static_x), static_target)
        loss.backward()
        optimizer.step()
    for x, target in batches:
        static_x.copy_(x)
        static_target.copy_(target)
        graph.replay()


def _assert_same_parameters(mine: nn.Module, expected: nn.Module) -> None:
    for (name, got), want in zip(mine.named_parameters(), expected.parameters()):
        assert torch.isfinite(got).all(), name
        torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-5, msg=name)


@pytest.mark.parametrize("kind", ["mlp", "convnet"])
def test_a_captured_training_step_replays_as_the_eager_steps_train(kind):
    build = _mlp if kind == "mlp" else _convnet
    eager, graphed = build(), build()
    assert any(isinstance(m, (FusedLinear, FusedConv2d)) for m in graphed.modules())
    batches = _inputs(kind, STEPS)
    eager_optimizer = torch.optim.SGD(eager.parameters(), lr=0.05)
    graphed_optimizer = torch.optim.SGD(graphed.parameters(), lr=0.05)
    _eager_steps(eager, eager_optimizer, batches)
    _captured_steps(graphed, graphed_optimizer, batches)
    _assert_same_parameters(graphed, eager)
    assert any((p - q).abs().max() > 0 for p, q in zip(graphed.parameters(), build().parameters()))  # it trained


def test_a_step_tuned_first_is_captured_with_the_tuned_plans(tmp_path, monkeypatch):
    monkeypatch.setenv("NVBLASLT_CACHE_DIR", str(tmp_path))
    eager, graphed = _mlp(), _mlp()
    batches = _inputs("mlp", STEPS)
    x, target = batches[0]
    with autotune(iterations=2):  # searched, remembered on disk; the plans made after it recall the winners
        nn.functional.mse_loss(graphed(x), target).backward()
    assert any(tmp_path.rglob("*")), "autotune() remembered nothing in the tuning cache"
    graphed.zero_grad(set_to_none=True)
    eager_optimizer = torch.optim.SGD(eager.parameters(), lr=0.05)
    graphed_optimizer = torch.optim.SGD(graphed.parameters(), lr=0.05)
    _eager_steps(eager, eager_optimizer, batches)
    _captured_steps(graphed, graphed_optimizer, batches)
    _assert_same_parameters(graphed, eager)


def test_reduce_overhead_compiles_the_step_into_cuda_graphs_with_the_eager_gradients():
    eager, compiled_model = _mlp(), _mlp()
    compiled = torch.compile(compiled_model, mode="reduce-overhead", fullgraph=True)
    for x, target in _inputs("mlp", STEPS):
        for model, run in ((eager, eager), (compiled_model, compiled)):
            model.zero_grad(set_to_none=True)
            nn.functional.mse_loss(run(x), target).backward()
        for got, want in zip(compiled_model.parameters(), eager.parameters()):
            torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-6)
