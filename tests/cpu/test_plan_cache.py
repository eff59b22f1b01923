"""The plan cache both function forms keep per thread (``_plan_cache.PlanCache``), with stand-in plans:
least recently used freed first, aliases leaving with their plan, the last alias found without a lookup,
plans a stored choice retired (kept until cleared), captured plans never freed. No GPU, no library."""

from __future__ import annotations

import threading

import pytest

from nvblaslt import _cuda, _tuning_cache
from nvblaslt._plan_cache import PlanCache, PlanCaches


class Plan:
    def __init__(self, problem: str = "") -> None:
        self._launch, self.freed = problem, 0

    def free(self) -> None:
        self.freed += 1


@pytest.fixture
def stored(monkeypatch):
    """The tuning cache's stored keys, empty; a plan's key is its launch (the stand-in's problem)."""
    keys: list[str] = []
    monkeypatch.setattr(_tuning_cache, "stored_keys", keys)
    monkeypatch.setattr(_tuning_cache, "generation", 0)
    monkeypatch.setattr(_tuning_cache, "key_of", lambda launch: launch)
    monkeypatch.setattr(_cuda, "is_capturing", lambda stream: False)

    def store(key: str) -> None:
        keys.append(key)
        _tuning_cache.generation = len(keys)

    return store


def test_the_least_recently_used_plan_is_freed_past_the_limit():
    cache: PlanCache[Plan] = PlanCache(2, 8)
    first, second, third = Plan(), Plan(), Plan()
    cache.add("first", first)
    cache.add("second", second)
    assert cache.get("first") is first  # now the most recent: "second" goes first
    cache.add("third", third)
    assert cache.values() == [first, third] and (first.freed, second.freed, third.freed) == (0, 1, 0)
    assert cache.get("second") is None


def test_an_alias_finds_its_plan_and_makes_it_the_last_key():
    cache: PlanCache[Plan] = PlanCache(2, 8)
    plan, other = Plan(), Plan()
    cache.add("slow", plan)
    cache.add_alias("fast", "slow", (plan, "payload"))
    cache.add("other", other)
    assert cache.last_key is None  # adding reorders: no shortcut until an alias is found
    assert cache.find("fast") == (plan, "payload")
    assert cache.last_key == "fast" and cache.last_found == (plan, "payload")
    cache.add("third", Plan())  # "other" is the least recent now, not the aliased plan
    assert other.freed == 1 and plan.freed == 0
    assert cache.get("slow") is plan and cache.last_key is None  # the checked path reorders too
    assert cache.find("nothing") is None
    with pytest.raises(TypeError):
        cache.find(["unhashable"])
    cache.add_alias("stray", "no such key", plan)  # names no cached plan: not kept
    assert cache.find("stray") is None


def test_aliases_leave_with_their_plan_and_start_afresh_at_their_limit():
    cache: PlanCache[Plan] = PlanCache(1, 3)
    plan = Plan()
    cache.add("slow", plan)
    for alias in ("a", "b", "c"):
        cache.add_alias(alias, "slow", plan)
    assert cache.find("a") is plan
    cache.add_alias("d", "slow", plan)  # token counts that vary without end: the old ones go
    assert cache.find("a") is None and cache.find("d") is plan and cache.last_key == "d"
    cache.add("next", Plan())  # the plan is evicted: its aliases and the shortcut go with it
    assert plan.freed == 1 and cache.find("d") is None and cache.last_key is None


def test_a_stored_choice_retires_its_problems_plans_kept_until_cleared(stored):
    cache: PlanCache[Plan] = PlanCache(8, 8)
    tuned, other = Plan("tuned problem"), Plan("other problem")
    cache.add("tuned", tuned)
    cache.add_alias("fast", "tuned", tuned)
    cache.add("other", other)
    cache.retire_tuned(lambda: 0)
    assert cache.values() == [tuned, other]  # nothing stored since the cache was made
    stored("tuned problem")
    assert cache.generation != _tuning_cache.generation
    cache.retire_tuned(lambda: 0)
    assert cache.values() == [other] and cache.retired == [tuned] and tuned.freed == 0
    assert cache.find("fast") is None and cache.generation == _tuning_cache.generation
    cache.clear()
    assert (tuned.freed, other.freed) == (1, 1) and cache.retired == [] and cache.values() == []


def test_nothing_is_retired_while_the_calls_stream_is_captured(stored, monkeypatch):
    cache: PlanCache[Plan] = PlanCache(8, 8)
    tuned = Plan("tuned problem")
    cache.add("tuned", tuned)
    stored("tuned problem")
    monkeypatch.setattr(_cuda, "is_capturing", lambda stream: stream == 7)
    cache.retire_tuned(lambda: 7)  # planning again would break the capture
    assert cache.values() == [tuned] and cache.generation == 0
    cache.retire_tuned(lambda: 0)  # the next call outside the capture retires it
    assert cache.values() == [] and cache.retired == [tuned]

    def unreadable() -> int:
        raise ValueError("an odd stream argument")

    cache.add("again", Plan("tuned problem"))
    stored("tuned problem")
    cache.retire_tuned(unreadable)  # the call itself says what is wrong with its stream
    assert cache.values() == [] and len(cache.retired) == 2


def test_a_captured_plan_leaves_the_cache_and_is_never_freed_by_it():
    cache: PlanCache[Plan] = PlanCache(8, 8)
    captured = Plan()
    cache.add("key", captured)
    cache.add_alias("fast", "key", captured)
    cache.keep_captured("key")
    assert cache.get("key") is None and cache.find("fast") is None
    cache.clear()
    assert captured.freed == 0


def test_each_thread_has_its_own_cache_with_the_same_limits():
    caches = PlanCaches(1, 4)
    mine = caches.plans
    theirs: list[PlanCache] = []
    thread = threading.Thread(target=lambda: theirs.append(caches.plans))
    thread.start()
    thread.join()
    assert theirs[0] is not mine and caches.plans is mine
    plan = Plan()
    theirs[0].add("a", plan)
    theirs[0].add("b", Plan())  # its limit is 1 as well
    assert plan.freed == 1
