"""One thread's cache of plans for a function form: ``matmul()``'s ``Matmul`` plans and
``grouped_matmul()``'s ``GroupedMatmul`` plans alike.

A plan is cached under the key its checked path builds from the operands as read; a fast path
(arrays whose layout is read with no DLPack export) names it by an alias, its own key, with what
that path needs beside the plan. The least recently used plan is freed when the cache is full. A
plan leaves the cache without being freed where something else may still hold it: when a search
stored a choice for its problem (retired: a CUDA graph may have captured it; freed by ``clear``),
or when a CUDA graph captured it (kept for the thread's life: the graph holds its memory).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, Protocol, TypeVar

from . import _cuda, _tuning_cache


class CachedPlan(Protocol):
    """What the cache needs of a plan: its launch (``_launch``: the tuning cache's key is read off it) and ``free``."""

    @property
    def _launch(self) -> Any: ...

    def free(self) -> None: ...


PlanT = TypeVar("PlanT", bound=CachedPlan)


class PlanCache(Generic[PlanT]):
    """Plans by key, least recently used first, and aliases naming them.

    ``last_key`` is the alias found last and ``last_found`` what it names; that plan is the most
    recently used, so a loop calling with like arrays compares its alias with ``last_key`` and
    skips the lookup and the reordering (0.5 µs a call on an H200 host). ``generation`` is how
    many of the tuning cache's stored choices the plans have been checked against."""

    __slots__ = ("last_key", "last_found", "generation", "_plans", "_aliases", "_limit", "_alias_limit",
                 "_retired", "_captured", "_held")

    def __init__(self, limit: int, alias_limit: int, held: Callable[[PlanT], bool] | None = None) -> None:
        self.last_key: Hashable | None = None
        self.last_found: Any = None
        self.generation = _tuning_cache.generation  # a new cache holds no plan made before a stored choice
        self._plans: OrderedDict[Hashable, PlanT] = OrderedDict()
        self._aliases: dict[Hashable, tuple[Hashable, Any]] = {}  # alias -> (its plan's key, what it names)
        self._limit, self._alias_limit = limit, alias_limit
        self._retired: list[PlanT] = []  # a stored choice replaced them: kept until clear()
        self._captured: list[PlanT] = []  # a CUDA graph holds them: never freed here
        # whether a CUDA graph captured a cached plan through another caller (grouped plans, which the torch
        # layer's bound calls run too): such a plan is kept, never freed, when it leaves the cache
        self._held = held

    # ---- lookups ----------------------------------------------------------------------------------
    def get(self, key: Hashable) -> PlanT | None:
        """The plan under ``key``, now the most recently used; None where there is none."""
        plan = self._plans.get(key)
        if plan is not None:
            self._plans.move_to_end(key)
            self.last_key = self.last_found = None  # the last alias's plan is no longer the most recent
        return plan

    def find(self, alias: Hashable) -> Any:
        """What ``alias`` names, its plan now the most recently used (and ``alias`` the last key); None
        where it names nothing. Raises ``TypeError`` for an unhashable alias."""
        named = self._aliases.get(alias)
        if named is None:
            return None
        key, found = named
        self._plans.move_to_end(key)
        self.last_key, self.last_found = alias, found
        return found

    def values(self) -> list[PlanT]:
        """The cached plans, least recently used first (retired and captured ones are not)."""
        return list(self._plans.values())

    @property
    def retired(self) -> list[PlanT]:
        """The plans a stored choice retired, kept until ``clear()``."""
        return list(self._retired)

    # ---- changes ----------------------------------------------------------------------------------
    def add(self, key: Hashable, plan: PlanT) -> None:
        """Cache ``plan`` under ``key``; past the limit the least recently used plans are freed."""
        self._plans[key] = plan
        self.last_key = self.last_found = None  # the plan just added is the most recent now
        while len(self._plans) > self._limit:
            old_key, old = self._plans.popitem(last=False)
            self._drop_aliases(old_key)
            self._free(old)

    def add_alias(self, alias: Hashable, key: Hashable, found: Any) -> None:
        """Let ``alias`` name the plan under ``key``, ``find`` returning ``found`` (the plan, or what the
        fast path needs with it). Aliases that vary without end (token counts) start afresh at the limit."""
        if key not in self._plans:
            return
        if len(self._aliases) >= self._alias_limit:
            self._aliases.clear()
            self.last_key = self.last_found = None
        self._aliases[alias] = (key, found)

    def keep_captured(self, key: Hashable) -> None:
        """The plan under ``key`` leaves the cache and is never freed by it: a CUDA graph captured it,
        and holds its memory. The next call makes a plan of its own, never racing the graph's replays."""
        self._captured.append(self._remove(key))

    def retire_tuned(self, stream: Callable[[], int]) -> None:
        """Plans of problems a search stored a choice for since they were made leave the cache, kept,
        not freed (a CUDA graph may have captured them): the next call plans again and recalls the
        choice. ``stream()`` is the call's stream: while a graph is captured on it nothing changes, for
        planning would break the capture."""
        try:
            if _cuda.is_capturing(stream()):
                return
        except Exception:  # noqa: BLE001 - an odd argument: the call itself says what is wrong with it
            pass
        stored = set(_tuning_cache.stored_keys[self.generation:])
        self.generation = _tuning_cache.generation
        tuned = [key for key, plan in self._plans.items() if _tuning_cache.key_of(plan._launch) in stored]
        for key in tuned:
            self._retired.append(self._remove(key))

    def clear(self) -> None:
        """Free every cached plan and every retired one (stream-ordered); captured plans stay held."""
        self.last_key = self.last_found = None
        self._aliases.clear()
        while self._plans:
            self._free(self._plans.popitem()[1])
        retired, self._retired = self._retired, []
        for plan in retired:
            self._free(plan)

    def _free(self, plan: PlanT) -> None:
        if self._held is not None and self._held(plan):  # a graph's replays read its memory
            self._captured.append(plan)
        else:
            plan.free()

    def _remove(self, key: Hashable) -> PlanT:
        plan = self._plans.pop(key)
        self._drop_aliases(key)
        return plan

    def _drop_aliases(self, key: Hashable) -> None:
        self.last_key = self.last_found = None
        for alias in [alias for alias, (named, _) in self._aliases.items() if named == key]:
            del self._aliases[alias]


class PlanCaches(threading.local):
    """One ``PlanCache`` per thread (cuBLASLt handles and the plans' streams are per thread), as
    ``plans``: made on a thread's first use, with the same limits (and ``held``) in every thread."""

    def __init__(self, limit: int, alias_limit: int, held: Callable[[Any], bool] | None = None) -> None:
        self.plans: PlanCache[Any] = PlanCache(limit, alias_limit, held)


# Layers over the core that keep plans of their own for a hot step (nvblaslt.torch's bound steps) forget them
# with matmul()'s: one clear_plan_cache() gives back what the calling thread's plans hold.
_layer_forgets: list[Callable[[], None]] = []


def forget_with_clear(forget: Callable[[], None]) -> None:
    """Have ``clear_plan_cache()`` call ``forget()`` too (once per function; it runs in the calling thread)."""
    if forget not in _layer_forgets:
        _layer_forgets.append(forget)


def forget_layer_plans() -> None:
    """Each layer's ``forget`` given to ``forget_with_clear``, in the order given."""
    for forget in list(_layer_forgets):
        forget()


__all__ = ["CachedPlan", "PlanCache", "PlanCaches", "forget_layer_plans", "forget_with_clear"]
