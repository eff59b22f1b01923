"""nvblaslt.torch on the GPU: FusedLinear, FusedSequential, fuse() and the custom ops running
nvblaslt's cuBLASLt path, against nn.Linear, gradcheck, torch.compile, CUDA graphs and checkpoints.
The same ops' CPU implementation, and the CUDA path's orchestration against an emulated
nvblaslt.matmul, are tested in tests/cpu/test_torch.py, whose helpers these share.
"""

from __future__ import annotations

import copy
import io

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
nn = torch.nn

from nvblaslt.torch import FusedLinear, _functional, _gemms, _ops, fuse  # noqa: E402

from tests.cpu.test_torch import (  # noqa: E402
    VARIANTS, forward_backward, mlp, op_arguments, rel, run_both, unpack_relu_mask,
)

TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def _cuda_pair(widths, activation, dtype, bias=True, backward="auto"):
    """(nn.Linear model, the fused model sharing nothing with it); ``backward=None``: FusedLinear layers in a
    plain nn.Sequential (no links, each layer's activation backward as torch ops)."""
    reference = mlp(widths, activation, bias=bias).to("cuda", dtype)
    fused = fuse(copy.deepcopy(reference), backward=backward or "unfused")
    if backward is None:
        fused = nn.Sequential(*fused)
    return reference, fused


class _Decided(nn.Module):
    """A ReLU whose decisions are given: z * mask (the float64 model taking the fused model's decisions)."""

    def __init__(self, mask):
        super().__init__()
        self.mask = mask

    def forward(self, z):
        return z * self.mask.reshape(z.shape).to(z.dtype)


def _record_relu_decisions(monkeypatch) -> list:
    """Per ReLU layer the fused model runs, the decisions its backward takes: the bitmask where the next
    layer's GEMM takes the ReLU's backward (DRELU / DRELU_BGRAD mask with it), else the output > 0."""
    decisions = []
    layer = _functional.layer

    def recording(x2, weight, bias, activation, state, chain=None):
        out, passed = layer(x2, weight, bias, activation, state, chain)
        if activation == "relu":
            decisions.append(unpack_relu_mask(passed[1], out.shape[1]).T if passed is not None else out > 0)
        return out, passed

    eager_linear = _functional.eager_linear  # linear()'s fast path under autograd: a standalone layer's forward

    def recording_eager(x2, weight, bias, activation):
        out = eager_linear(x2, weight, bias, activation)
        if activation == "relu":
            decisions.append(out > 0)
        return out

    monkeypatch.setattr(_functional, "layer", recording)
    monkeypatch.setattr(_functional, "eager_linear", recording_eager)
    return decisions


def _float64_preactivations(reference, x) -> list:
    """The float64 model's input to each ReLU, (tokens, features)."""
    exact = copy.deepcopy(reference).double()
    seen = []
    hooks = [m.register_forward_hook(lambda m, args, out: seen.append(args[0].reshape(-1, args[0].shape[-1])))
             for m in exact if isinstance(m, nn.ReLU)]
    with torch.no_grad():
        exact(x.double())
    for hook in hooks:
        hook.remove()
    return seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_gpu_forward_and_backward_match_nn_linear(dtype, activation, variant, monkeypatch):
    """Odd widths, leading batch dims, random inputs; the fused result is compared with a float64 run of
    the same model: no further from it than nn.Linear in ``dtype`` is (or the dtype's tolerance).

    ReLU: a decision at z ≈ 0 may go either way in a 16/32-bit result (for some kernels cuBLASLt rounds
    the product to the result type before it adds the bias, so |z| below half an ulp of the product is
    a coin toss; one flipped decision moves the gradients of this small model by ~3 %). So the decisions
    must match float64's wherever |z| exceeds 1 % of the layer's largest, and the gradients are compared
    with the float64 model taking the fused model's own decisions (the bitmask where the backward masks
    with it)."""
    backward, bias = VARIANTS[variant]
    torch.manual_seed(9)
    reference, fused = _cuda_pair((37, 130, 53, 19), activation, dtype, bias=bias, backward=backward)
    decisions = _record_relu_decisions(monkeypatch)
    x = torch.randn(3, 7, 37, device="cuda", dtype=dtype, requires_grad=True)
    upstream = torch.randn(3, 7, 19, device="cuda", dtype=dtype)
    (y_ref, g_ref), (y_ours, g_ours) = run_both(reference, fused, x, upstream)
    y_64, g_64 = forward_backward(copy.deepcopy(reference).double(), x.double(), upstream.double())
    y_given, g_given = y_64, g_64
    if activation == "relu":
        preactivations = _float64_preactivations(reference, x)
        assert len(decisions) == len(preactivations) == 2
        for z, taken in zip(preactivations, decisions):
            decided = z.abs() > 1e-2 * z.abs().max()
            assert torch.equal(taken[decided], (z > 0)[decided])
        given = copy.deepcopy(reference).double()
        for index, mask in zip([i for i, m in enumerate(given) if isinstance(m, nn.ReLU)], decisions):
            given[index] = _Decided(mask)
        y_given, g_given = forward_backward(given, x.double(), upstream.double())
    assert y_ours.dtype == dtype and y_ours.shape == (3, 7, 19)
    assert rel(y_ours, y_given) <= max(3 * rel(y_ref, y_64), TOL[dtype])
    for ours, theirs, exact, given_grad in zip(g_ours, g_ref, g_64, g_given):
        assert ours.dtype == dtype and ours.shape == exact.shape and ours.is_contiguous()
        assert rel(ours, given_grad) <= max(3 * rel(theirs, exact), TOL[dtype])


def test_gpu_relu_aux_matches_the_cpu_implementations_bitmask():
    torch.manual_seed(10)
    x, w, b = torch.randn(33, 20), torch.randn(150, 20), torch.randn(150)
    cpu = torch.ops.nvblaslt.linear(x, w, b, "relu", True, None, "none", None, None)
    gpu = torch.ops.nvblaslt.linear(x.cuda(), w.cuda(), b.cuda(), "relu", True, None, "none", None, None)
    assert gpu[1].shape == cpu[1].shape and gpu[1].stride() == cpu[1].stride() and gpu[1].dtype == torch.int8
    z = (x @ w.T + b).T
    decided = z.abs() > 1e-3
    assert torch.equal(unpack_relu_mask(gpu[1].cpu(), 150)[decided], (z > 0)[decided])
    torch.testing.assert_close(gpu[0].cpu(), cpu[0], rtol=1e-5, atol=1e-5)


def test_gpu_fake_implementations_match_the_real_outputs():
    """opcheck compares every output's shape, strides and dtype with the fake implementation's (the aux
    padding is not compared: cuBLASLt leaves it unwritten)."""
    first, chained, backward = op_arguments("cuda")
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    for op, args in ((torch.ops.nvblaslt.linear.default, first), (torch.ops.nvblaslt.linear.default, chained),
                     (torch.ops.nvblaslt.linear_backward.default, backward)):
        torch.library.opcheck(op, args, test_utils=utils)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_gpu_gradcheck_float64(activation, capsys):
    """float64 finite differences; where cuBLASLt has no float64 kernel for an epilog, that step runs as
    torch ops (nvblaslt.torch._refused_fp64 lists them)."""
    torch.manual_seed(11)
    model = fuse(mlp((4, 7, 6, 3), activation, last_activation=True).to("cuda", torch.float64))
    names = [n for n, _ in model.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in model.parameters())
    x = torch.randn(5, 4, device="cuda", dtype=torch.float64, requires_grad=True)

    def f(x, *params):
        return torch.func.functional_call(model, dict(zip(names, params)), (x,))

    assert torch.autograd.gradcheck(f, (x, *params), nondet_tol=1e-12)
    with capsys.disabled():
        refused = sorted(e.name for e in _gemms.refused_fp64)
        print(f"\n  float64 epilogs cuBLASLt refused (run as torch ops): {refused or 'none'}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gpu_torch_compile_fullgraph_matches_eager(dtype):
    torch._dynamo.reset()
    torch.manual_seed(12)
    _, model = _cuda_pair((64, 256, 128, 32), "gelu", dtype)
    x = torch.randn(8, 16, 64, device="cuda", dtype=dtype, requires_grad=True)
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    compiled = torch.compile(model, fullgraph=True)
    y0, g0 = forward_backward(model, x)
    for _ in range(2):  # the second call runs the compiled graphs again, without recompiling
        y1, g1 = forward_backward(compiled, x)
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(y1, y0, **tolerance)
    for a, e in zip(g1, g0):
        torch.testing.assert_close(a, e, **tolerance)


@pytest.mark.parametrize("backward", ["auto", "epilog"])
def test_gpu_make_graphed_callables_replays_like_eager(backward):
    torch.manual_seed(13)
    _, model = _cuda_pair((32, 128, 64, 16), "relu", torch.float32, backward=backward)
    eager = copy.deepcopy(model)
    sample = torch.randn(24, 32, device="cuda", requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(model, (sample,))
    for seed in range(3):
        torch.manual_seed(100 + seed)
        x = torch.randn(24, 32, device="cuda", requires_grad=True)
        upstream = torch.randn(24, 16, device="cuda")
        (y0, g0), (y1, g1) = run_both(eager, graphed, x, upstream)
        torch.testing.assert_close(y1, y0, rtol=1e-6, atol=1e-6)
        for a, e in zip(g1, g0):
            torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6)


def test_gpu_whole_training_step_captured_in_a_cuda_graph():
    """forward + backward + optimizer step captured once, replayed on new inputs written in place."""
    torch.manual_seed(14)
    _, model = _cuda_pair((32, 96, 48, 8), "gelu", torch.float32)
    eager = copy.deepcopy(model)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, eager)]
    static_x = torch.randn(16, 32, device="cuda")
    static_target = torch.randn(16, 8, device="cuda")

    def step(m, optimizer, x, target):
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(m(x), target)
        loss.backward()
        optimizer.step()
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: plans are made outside the capture
        for _ in range(3):
            step(eager, optimizers[1], static_x, static_target)
            step(model, optimizers[0], static_x, static_target)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizers[0].zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = step(model, optimizers[0], static_x, static_target)
    for seed in range(3):
        torch.manual_seed(200 + seed)
        x, target = torch.randn(16, 32, device="cuda"), torch.randn(16, 8, device="cuda")
        static_x.copy_(x)
        static_target.copy_(target)
        graph.replay()
        loss = step(eager, optimizers[1], x, target)
        torch.testing.assert_close(static_loss, loss, rtol=1e-5, atol=1e-6)
    for a, e in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


def test_gpu_checkpoint_of_nn_linear_model_loads():
    torch.manual_seed(15)
    reference = mlp((48, 96, 24), "relu").cuda()
    buffer = io.BytesIO()
    torch.save(reference.state_dict(), buffer)
    buffer.seek(0)
    fused = fuse(mlp((48, 96, 24), "relu")).cuda()
    fused.load_state_dict(torch.load(buffer, map_location="cuda"))
    x = torch.randn(10, 48, device="cuda")
    torch.testing.assert_close(fused(x), reference(x), rtol=1e-5, atol=1e-5)


def test_gpu_other_consumers_in_place_and_inference():
    torch.manual_seed(16)
    x = torch.randn(12, 20, device="cuda")
    w1, b1 = torch.randn(40, 20, device="cuda", requires_grad=True), torch.randn(40, device="cuda", requires_grad=True)
    w2, b2 = torch.randn(8, 40, device="cuda", requires_grad=True), torch.randn(8, device="cuda", requires_grad=True)
    params = (w1, b1, w2, b2)
    h, state = _ops.layer(x, w1, b1, "gelu", None, "epilog")
    assert state is not None
    y, _ = _ops.layer(h, w2, b2, "none", state)
    ours = torch.autograd.grad(y.sum() + (h ** 2).sum(), params)
    h_ref = nn.functional.gelu(nn.functional.linear(x, w1, b1), approximate="tanh")
    theirs = torch.autograd.grad(nn.functional.linear(h_ref, w2, b2).sum() + (h_ref ** 2).sum(), params)
    for a, e in zip(ours, theirs):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
    layer = FusedLinear(20, 40, activation="gelu", device="cuda")
    out = layer(x)
    out += 1.0
    out.sum().backward()
    with torch.no_grad():
        expected = nn.functional.gelu(nn.functional.linear(x, layer.weight, layer.bias), approximate="tanh")
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
