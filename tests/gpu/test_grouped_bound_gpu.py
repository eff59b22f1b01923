"""``nvblaslt.torch.grouped_mm``'s bound calls on the GPU: the same results as the checked path, with new
offsets each call, in a training step, and under CUDA graph capture. The control flow is tested without a
GPU in tests/cpu/test_grouped_bound.py."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

import nvblaslt  # noqa: E402
from nvblaslt.torch import _grouped_bound, grouped_mm  # noqa: E402

from tests.gpu.test_grouped_gpu import _grouped_gpu, needs_grouped  # noqa: E402, F401 (the skip condition reads it)

BF16 = torch.bfloat16


def _reference(x, weights, offs):
    ends = offs.tolist()
    starts = [0, *ends[:-1]]
    out = torch.zeros(x.shape[0], weights.shape[1], dtype=torch.float64, device=x.device)
    for g, (s, e) in enumerate(zip(starts, ends)):
        out[s:e] = x[s:e].double() @ weights[g].double().T
    return out


def _offsets(sizes):
    return torch.tensor(sizes, device="cuda", dtype=torch.int32).cumsum(0).to(torch.int32)


@needs_grouped
def test_bound_calls_give_the_checked_paths_results_on_new_tokens_and_offsets():
    _grouped_bound.clear()
    weights = torch.randn(4, 48, 64, device="cuda", dtype=BF16)
    splits = ([16, 16, 16, 16], [0, 32, 8, 24], [64, 0, 0, 0], [8, 8, 40, 8])  # empty groups included
    for call, sizes in enumerate(splits):
        x = torch.randn(64, 64, device="cuda", dtype=BF16)
        offs = _offsets(sizes)
        out = grouped_mm(x, weights.transpose(1, 2), offs)
        torch.testing.assert_close(out.double(), _reference(x, weights, offs), atol=0.1, rtol=0.02)
        checked = nvblaslt.grouped_matmul(x, weights.transpose(1, 2), offs)
        assert torch.equal(out, checked)  # the same plan's choice: the same bits
    assert len(_grouped_bound._local.entries) == 1  # bound on the second call, run on the later ones


@needs_grouped
def test_a_bound_training_step_gives_the_loops_gradients():
    _grouped_bound.clear()
    x = torch.randn(96, 64, device="cuda", dtype=BF16, requires_grad=True)
    weights = torch.randn(4, 32, 64, device="cuda", dtype=BF16, requires_grad=True)
    grad = torch.randn(96, 32, device="cuda", dtype=BF16)
    for sizes in ([24, 24, 24, 24], [0, 40, 16, 40], [24, 24, 24, 24], [8, 0, 80, 8]):
        offs = _offsets(sizes)
        x.grad = weights.grad = None
        grouped_mm(x, weights.transpose(1, 2), offs).backward(grad)
        xd, wd = x.detach().double().requires_grad_(), weights.detach().double().requires_grad_()
        _reference(xd, wd, offs).backward(grad.double())
        torch.testing.assert_close(x.grad.double(), xd.grad, atol=0.2, rtol=0.02)
        torch.testing.assert_close(weights.grad.double(), wd.grad, atol=0.2, rtol=0.02)


def _bound_on_a_side_stream():
    """(weights, x, offs) of a call run three times on a side stream (checked, bound, run bound), as a CUDA
    graph capture wants its warm-up."""
    _grouped_bound.clear()
    weights = torch.randn(4, 48, 64, device="cuda", dtype=BF16)
    x = torch.randn(64, 64, device="cuda", dtype=BF16)
    offs = _offsets([16, 16, 16, 16])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            grouped_mm(x, weights.transpose(1, 2), offs)
    torch.cuda.current_stream().wait_stream(side)
    return weights, x, offs


@needs_grouped
def test_a_captured_bound_call_replays_and_eager_calls_keep_their_own_plan():
    weights, x, offs = _bound_on_a_side_stream()
    graph = torch.cuda.CUDAGraph()
    held = len(_grouped_bound._local.captured)  # captures of earlier tests in this thread stay held, by design
    with torch.cuda.graph(graph):
        out = grouped_mm(x, weights.transpose(1, 2), offs)
    assert len(_grouped_bound._local.captured) == held + 1
    x.copy_(torch.randn_like(x))
    offs.copy_(_offsets([0, 40, 8, 16]))
    eager = grouped_mm(x, weights.transpose(1, 2), offs)  # eager calls never run the captured plan
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.double(), _reference(x, weights, offs), atol=0.1, rtol=0.02)
    torch.testing.assert_close(eager, out)


@needs_grouped
def test_bound_calls_run_the_function_forms_plan_and_clearing_frees_it():
    _grouped_bound.clear()
    nvblaslt.clear_grouped_plans()
    weights = torch.randn(4, 48, 64, device="cuda", dtype=BF16)
    offs = _offsets([16, 8, 24, 16])
    for _ in range(3):  # checked, bound, run bound
        x = torch.randn(64, 64, device="cuda", dtype=BF16)
        grouped_mm(x, weights.transpose(1, 2), offs)
    entry, = _grouped_bound._local.entries.values()
    plan = entry.plan
    cached, _ = nvblaslt.GroupedMatmul._cached(x, weights.transpose(1, 2), offs, BF16)
    assert cached is plan  # one plan per problem: the function form's
    nvblaslt.clear_grouped_plans()
    assert plan.algorithm is None  # freed: its workspace and arrays given back
    for _ in range(3):  # the bound key is dropped and bound anew, with right results throughout
        x = torch.randn(64, 64, device="cuda", dtype=BF16)
        out = grouped_mm(x, weights.transpose(1, 2), offs)
        torch.testing.assert_close(out.double(), _reference(x, weights, offs), atol=0.1, rtol=0.02)
    entry, = _grouped_bound._local.entries.values()
    assert entry.plan is not plan and entry.plan.algorithm is not None


@needs_grouped
def test_a_plan_a_graph_captured_survives_clearing_and_eviction():
    """A grouped plan captured through a bound call lives in ``grouped_matmul``'s cache until its next lookup:
    ``clear_grouped_plans()`` and eviction past the cache's limit must keep it, or the replays read freed memory."""
    from nvblaslt import _grouped

    nvblaslt.clear_grouped_plans()
    weights, x, offs = _bound_on_a_side_stream()
    entry, = _grouped_bound._local.entries.values()
    captured = entry.plan  # the function form's plan, run bound
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = grouped_mm(x, weights.transpose(1, 2), offs)
    assert captured._captured
    nvblaslt.clear_grouped_plans()
    for rows in range(1, _grouped._MAX_PLANS + 8):  # past the limit: every plan made before is evicted
        nvblaslt.grouped_matmul(torch.randn(rows * 16, 64, device="cuda", dtype=BF16), weights.transpose(1, 2),
                                _offsets([rows * 4] * 4))
    nvblaslt.clear_grouped_plans()
    assert captured.algorithm is not None  # held: its workspace and arrays are the graph's
    torch.cuda.synchronize()
    for sizes in ([0, 40, 8, 16], [64, 0, 0, 0]):
        x.copy_(torch.randn_like(x))
        offs.copy_(_offsets(sizes))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out.double(), _reference(x, weights, offs), atol=0.1, rtol=0.02)
