"""One owner of grouped plans: ``grouped_matmul``'s per-thread cache. The torch layer's bound calls run its plans
(``GroupedMatmul._cached``), so ``clear_grouped_plans()`` frees them too, and a plan a CUDA graph captured through
either caller is never run eagerly again. The stand-ins of test_grouped_plan stand for the GPU."""

from __future__ import annotations

import nvblaslt
from nvblaslt import GroupedMatmul, _grouped_function
from tests.cpu.test_grouped_plan import OUT, gpu_standins, operands, reader  # noqa: F401 - fixtures
from tests.fakes import FakeDLPack


def _cached_plans():
    return _grouped_function._local.plans.values()


def test_the_bound_path_runs_the_function_forms_plan_and_clearing_frees_it(gpu_standins):
    a, b, offs, _ = operands()
    nvblaslt.grouped_matmul(a, b, offs, out=FakeDLPack((40, 96), dtype="bfloat16", ptr=OUT))
    held, = _cached_plans()
    a88, _, _, _ = operands(tokens=88)
    plan, problem = GroupedMatmul._cached(a88, b, offs, None)  # another total: the same problem's plan
    assert plan is held and problem.total == 88 and problem.out_shape == (88, 96)
    assert gpu_standins["arrays"] == [4] and gpu_standins["heuristics"] == 1  # planned once for both
    nvblaslt.clear_grouped_plans()
    assert plan.algorithm is None  # freed: the torch layer's bound calls see it and bind anew
    again, _ = GroupedMatmul._cached(a, b, offs, None)
    assert again is not plan and again.algorithm is not None and _cached_plans() == [again]


def test_a_plan_captured_through_one_caller_is_left_to_the_graph_by_the_other(gpu_standins):
    a, b, offs, _ = operands()
    plan, _ = GroupedMatmul._cached(a, b, offs, "bfloat16")
    plan._captured = True  # what a bound call under capture leaves on the shared plan
    out = FakeDLPack((40, 96), dtype="bfloat16", ptr=OUT)
    nvblaslt.grouped_matmul(a, b, offs, out=out)  # a new plan for eager calls; the captured one is kept
    fresh, = _cached_plans()
    assert fresh is not plan and gpu_standins["arrays"] == [4, 4] and len(gpu_standins["matmul"]) == 1
    nvblaslt.clear_grouped_plans()
    assert plan.algorithm is not None and fresh.algorithm is None  # the graph's plan stays held
    assert GroupedMatmul._cached(a, b, offs, None)[0] not in (plan, fresh)


def test_the_function_forms_fast_path_leaves_a_captured_plan_to_the_graph(gpu_standins, reader):
    a, b, offs, _ = operands()
    out = FakeDLPack((40, 96), dtype="bfloat16", ptr=OUT)
    nvblaslt.grouped_matmul(a, b, offs, out=out)  # checked: the fast key aliased
    plan, = _cached_plans()
    plan._captured = True  # captured through the torch layer's bound call meanwhile
    nvblaslt.grouped_matmul(a, b, offs, out=out)
    fresh, = _cached_plans()
    assert fresh is not plan and len(gpu_standins["matmul"]) == 2 and gpu_standins["arrays"] == [4, 4]


def test_a_plan_captured_through_the_bound_path_is_never_freed_by_the_function_forms_cache(gpu_standins):
    a, b, offs, _ = operands()
    plan, _ = GroupedMatmul._cached(a, b, offs, None)
    plan._captured = True  # a bound call under capture: the plan is still in grouped_matmul's cache
    nvblaslt.clear_grouped_plans()  # no grouped_matmul() call in between to give it up
    assert plan.algorithm is not None  # the graph's replays read its arrays and workspace
    assert _cached_plans() == []
    # nor when the cache is full and it is the least recently used
    plan2, _ = GroupedMatmul._cached(a, b, offs, None)
    plan2._captured = True
    cache = _grouped_function._local.plans
    limit = cache._limit
    try:
        cache._limit = 0  # the next plan added pushes out the captured one
        a_other, b_other, offs_other, _ = operands(k=128)
        GroupedMatmul._cached(a_other, b_other, offs_other, None)
    finally:
        cache._limit = limit
    assert plan2.algorithm is not None
