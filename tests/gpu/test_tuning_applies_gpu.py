"""Issue 23: tuning always applies. A model warmed up before ``nvblaslt.torch.autotune()`` gets the
searched algorithms on its next ordinary step: the function form's cached plans are made again and
recall what the search stored."""

from __future__ import annotations

import pytest

import nvblaslt
from nvblaslt import _function_form, _tuning_cache

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def own_tuning_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NVBLASLT_CACHE_DIR", str(tmp_path))
    nvblaslt.clear_plan_cache()
    yield
    nvblaslt.clear_plan_cache()


def test_a_warmed_up_model_gets_the_searched_algorithms():
    from nvblaslt.torch import FusedLinear, autotune

    torch.manual_seed(0)
    model = torch.nn.Sequential(FusedLinear(512, 1024, activation="relu"), FusedLinear(1024, 256)).cuda()
    x = torch.randn(384, 512, device="cuda")

    def step():
        model.zero_grad()
        model(x).square().mean().backward()
        torch.cuda.synchronize()

    step()  # the warm-up step: matmul() caches heuristic plans
    warm = list(_function_form._local.plans.values())
    assert warm, "the forward GEMMs run through matmul()'s cache"
    before = _tuning_cache.generation
    with autotune(iterations=2):
        step()
    assert _tuning_cache.generation > before  # the search stored choices
    step()  # an ordinary step again
    plans = list(dict.fromkeys(_function_form._local.plans.values()))
    assert plans and not any(plan in warm for plan in plans)  # made again, not the warm-up's
    for plan in plans:
        tuned, facts = _tuning_cache.recall(plan._launch)
        assert tuned is not None, f"no choice stored for {plan!r}"
        assert plan.algorithm.as_bytes() == tuned.as_bytes()  # it runs the searched algorithm
