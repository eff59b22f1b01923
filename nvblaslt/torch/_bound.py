"""GEMMs bound once: a planned ``Matmul`` driven by pointers alone, for a layer's hot step.

``matmul()`` finds its plan from its operands on every call: it reads each tensor's layout and
builds a key from them, and its result comes back as a view the layer reshapes. A layer whose step
runs the same GEMMs on tensors whose layouts it already knows can skip all of that: it finds its
``BoundGemm``s under a key it holds anyway (the input's shape, dtype and device, and the stream)
and hands over pointers of tensors it made in their final shape.

The plans are ``Matmul``'s, made as ``matmul()`` makes them (the heuristics after the tuning
database and cache, ``NVBLASLT_RECORD``), and each launch is their ``Launch.run``, with its fallback
when cuBLASLt refuses an algorithm at launch. Each stream has its own plans, so eager launches need no
ordering between streams; a CUDA graph capture on a stream with none borrows another stream's (as
``Matmul.execute`` runs inside a capture without ordering, the graph then shares that workspace).

A step leaves the cache when it is the least recently used one past ``_CACHE_SIZE``, or when a search
stores a better choice (it is then made again, and recalls it). It is never freed by the cache: an
autograd graph may still hold it for its backward pass, and its descriptors and workspace are freed
by their finalizers (stream-ordered) when the last holder lets go. A step a CUDA graph captured is
kept for the thread's life, since a replay still reads its workspace.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from .. import Matmul, MatmulEpilog
from .. import _cuda, _plan_cache, _tuning_cache

# Bound steps per thread, the least recently used dropped first: each holds up to four plans with a
# workspace of up to 32 MiB, and a step is made per input shape (an inference loop over many token
# counts makes many).
_CACHE_SIZE = 32


class BoundGemm:
    """One GEMM of a fixed problem: ``gemm(a, b, d, stream, *pointers)`` launches it on the pointers of
    the caller's A, B and D (the operands ``Matmul`` was made from, in that order) and of the epilog's
    vectors (``pointer_attributes``: the bias read, or the aux / bias gradient written), on the stream
    the plan was made for."""

    __slots__ = ("plan", "_launch", "_matmul", "_a", "_b", "_d", "_stream", "_setters", "_last", "_lock")

    def __init__(self, plan: Matmul, pointer_attributes: Sequence[str]) -> None:
        launch = plan._launch
        self.plan = plan
        self._launch = launch
        # Launch.run's body inlined in __call__ (one frame less on a layer's hot step): the same pointer
        # objects, the same prebuilt arguments (read per call: a fallback algorithm rebuilds them)
        self._matmul, self._d, self._stream = launch.matmul, launch.d_argument, launch.stream_argument
        # cuBLASLt's A is the caller's B where the plan runs the transposed problem
        swapped = launch.problem.a.source == "b"
        self._a, self._b = (launch.b_pointer, launch.a_pointer) if swapped else (launch.a_pointer, launch.b_pointer)
        self._setters = tuple(launch.pointer_setter(name) for name in pointer_attributes)
        # the vectors' pointers in the descriptor now: a descriptor write only when one changes
        self._last: tuple[int | None, ...] = (None,) * len(pointer_attributes)
        self._lock = threading.Lock()  # one launch at a time: the pointers live in the plan

    def __call__(self, a: int, b: int, d: int, stream: int, *pointers: int) -> None:
        with self._lock:
            self._a.value, self._b.value = a, b
            if pointers != self._last:  # one tuple comparison: a loop's bias stays put
                self._set_pointers(pointers)
            self._d.value, self._stream.value = d, stream
            launch = self._launch
            status = self._matmul(*launch.arguments)
            if status:
                launch.recover(status)  # the next algorithm where cuBLASLt refuses this one, else raises

    def _set_pointers(self, pointers: tuple[int, ...]) -> None:
        for setter, pointer, last in zip(self._setters, pointers, self._last):
            if pointer != last:
                setter(pointer)
        self._last = pointers

class BoundSplitGemm:
    """A bias-gradient GEMM that runs in the two-call form a tuning database or search chose
    (``_split_bgrad``), called as its ``BoundGemm`` would be: the first call writes D (taking every vector
    but the bias gradient), then the GEMV writes the bias gradient from D or the caller's A or B."""

    __slots__ = ("plan", "_first", "_sums", "_ones", "_summed", "_gradient_at")

    def __init__(self, plan: Matmul, pointer_attributes: Sequence[str]) -> None:
        split = plan._split_form
        assert split is not None  # bind() makes one only for a plan in the two-call form
        self.plan = plan  # holds the two plans (its split form)
        self._gradient_at = list(pointer_attributes).index("BIAS_POINTER")  # a *_BGRAD epilog writes it
        self._first = BoundGemm(split.main, [name for name in pointer_attributes if name != "BIAS_POINTER"])
        self._sums = BoundGemm(split.sums, ())
        self._ones, self._summed = split.ones.pointer, split.summed

    def __call__(self, a: int, b: int, d: int, stream: int, *pointers: int) -> None:
        at = self._gradient_at
        self._first(a, b, d, stream, *pointers[:at], *pointers[at + 1:])
        summed = self._summed
        self._sums(d if summed == "d" else a if summed == "a" else b, self._ones, pointers[at], stream)


Bound = BoundGemm | BoundSplitGemm  # what ``bind`` makes: called alike


def bind(a, b, epilog: MatmulEpilog, inputs: dict | None, stream: int, result: tuple,
         pointer_attributes: Sequence[str] = ()) -> Bound | None:
    """A ``BoundGemm`` of ``matmul(a, b, epilog=epilog, epilog_inputs=inputs)`` on ``stream`` (a
    ``BoundSplitGemm`` where it runs the two-call bias-gradient form), or None where its plan does not
    write D as ``result`` (shape, element strides) says: the caller then takes ``matmul()``'s path."""
    plan = Matmul(a, b, stream=stream)
    try:
        plan.plan(epilog=epilog, epilog_inputs=inputs)
        problem = plan._problem
        if (tuple(problem.result_shape), tuple(problem.result_strides)) != result:
            plan.free()
            return None
        plan._forget_arrays()  # the plan keeps no tensor of the caller's alive
    except BaseException:
        plan.free()
        raise
    return BoundGemm(plan, pointer_attributes) if plan._split_form is None else BoundSplitGemm(plan, pointer_attributes)


class _Steps(threading.local):
    """One thread's bound steps: ``entries`` maps (key, stream) to [step, when last used]; the tuning
    cache's generation they recall; and the steps a CUDA graph captured."""

    def __init__(self) -> None:
        self.entries: dict[tuple[Hashable, int], list] = {}
        self.generation = _tuning_cache.generation
        self.captured: list = []


_local = _Steps()
# When each step was last used. A hit stamps its entry (one hash of the key); the least recently used is
# found when one must go (a miss past _CACHE_SIZE), instead of moving every hit to the dict's end (three).
_clock = itertools.count()


def step(key: Hashable, stream: int, build: Callable[[], Any]):
    """This thread's step for ``key`` on ``stream``, made by ``build()`` on first use. A first use on a
    stream that is capturing a CUDA graph (planning allocates, which capture forbids) borrows the step of
    another stream with the same key, kept from then on (``keep_captured``); None where there is none.
    Where a search has stored a new choice since the steps were made, they are made again (not during a
    capture)."""
    found = find(key, stream)
    if found is not None:
        return found
    entries, pair = _local.entries, (key, stream)
    if _cuda.is_capturing(stream):
        # the least recently used of them, as before the stamps
        made = min((entry for made_pair, entry in entries.items() if made_pair[0] == key),
                   key=lambda entry: entry[1], default=None)
        if made is not None:
            keep_captured(made[0])
        return None if made is None else made[0]
    found = build()
    entries[pair] = [found, next(_clock)]
    while len(entries) > _CACHE_SIZE:
        oldest = min(entries.items(), key=lambda item: item[1][1])[0]
        del entries[oldest]  # dropped, not freed: an autograd graph may still hold it
    return found


def find(key: Hashable, stream: int):
    """This thread's step for ``key`` on ``stream`` (the most recently used from now on), or None where
    there is none. Where a search has stored a new choice since the steps were made, they are all
    forgotten first (not during a capture), to be made again."""
    local = _local
    if local.generation != _tuning_cache.generation and not _cuda.is_capturing(stream):
        local.entries = {}  # dropped, not freed: see the module's docstring
        local.generation = _tuning_cache.generation
    entry = local.entries.get((key, stream))
    if entry is None:
        return None
    entry[1] = next(_clock)
    return entry[0]


def steps() -> dict[tuple[Hashable, int], Any]:
    """This thread's steps by (key, stream), least recently used first (for tests and probes)."""
    return {pair: entry[0] for pair, entry in sorted(_local.entries.items(), key=lambda item: item[1][1])}


def keep_captured(found) -> None:
    """Keep ``found`` for the thread's life: a CUDA graph ran it, and a replay reads its workspace."""
    kept = _local.captured
    if all(found is not step for step in kept):
        kept.append(found)


def clear() -> None:
    """Forget this thread's bound steps but those a CUDA graph captured (their plans are freed when no
    autograd graph holds them any more). ``nvblaslt.clear_plan_cache()`` calls it."""
    _local.entries = {}


_plan_cache.forget_with_clear(clear)
