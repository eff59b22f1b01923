"""``grouped_mm``'s calls bound once: a planned ``GroupedMatmul`` run with pointers alone.

The checked path (``_grouped._native`` → ``grouped_matmul``) reads every operand through the function
form's layout reader and keys its plan on each call. A call like one already checked skips all that: its
key is the exact tuple of what decides the checks and the plan (each operand's shape, strides, dtype,
device, pointer alignment and negative bit; the offsets' shape, strides, dtype, device and negative
bit; the result's dtype), and a hit reads the pointers, allocates the result and queues the derive kernel and the
GEMM. Offsets with other values are the same call: they never leave the GPU.

A key is bound the second time the checked path passes it: a loop over the same shapes (a training step)
binds at once, while token totals that vary without end (inference) stay on the checked path. The plan a key
binds is ``grouped_matmul``'s own for the problem (``GroupedMatmul._cached``): one plan per problem, owned by
the function form's cache, which frees it when it leaves the cache or ``nvblaslt.clear_grouped_plans()`` is
called; a bound key whose plan was freed, or captured by a CUDA graph through either path, is dropped and bound
anew. A thread keeps at most ``_LIMIT`` keys, the least recently used forgotten first. When a search stores a
choice (the tuning cache's generation moves) the keys are forgotten, to be bound again to plans that recall it,
never while a graph is captured. What no key proves is asked on every call: the stream, and whether it is
capturing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .. import _cuda, _tuning_cache
from ._tuning import tuning

_LIMIT = 32  # bound plans per thread (a training step binds three per experts layer: forward, dX, dW)
_SEEN_LIMIT = 256  # keys checked once, waiting for their second call; starts over past this many

_is_neg = Tensor.is_neg
# torch's own queries as C functions, where this torch has them: its current stream on a device as an int
# (no Stream object made), and whether the current device's current stream is capturing a CUDA graph
_raw_stream: Callable[[int], int] = getattr(torch._C, "_cuda_getCurrentRawStream", None) \
    or (lambda device: torch.cuda.current_stream(device).cuda_stream)
_current_capturing: Callable[[], bool] = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) \
    or torch.cuda.is_current_stream_capturing


class Entry:
    """One bound call: the plan, the call's problem, whether the offsets are 64-bit, the device."""

    __slots__ = ("plan", "problem", "offs_64", "device", "several_devices")

    def __init__(self, plan: Any, problem: Any, offs_64: bool, device: int) -> None:
        self.plan, self.problem, self.offs_64, self.device = plan, problem, offs_64, device
        # torch answers for the current device's stream: with one GPU, always the operands'
        self.several_devices = _cuda.several_devices()


class _Bound(threading.local):
    """One thread's bound calls by key (least recently used first), the keys checked once, the tuning
    cache's generation the plans recall, and the plans a CUDA graph captured through a bound call."""

    def __init__(self) -> None:
        self.entries: dict[tuple, Entry] = {}
        # the key found last and its entry: a loop's next call compares its key with it, no hashing
        self.last_key: tuple | None = None
        self.last_entry: Entry | None = None
        self.seen: set[tuple] = set()
        self.generation = _tuning_cache.generation
        self.captured: list = []


_local = _Bound()


def _key(a: Tensor, b: Tensor, offs: Tensor | None, out_dtype: torch.dtype | None, a_pointer: int,
         b_pointer: int) -> tuple:
    """What decides a call's checks and plan; the alignment term is the pointer's (0: 256 bytes or more)."""
    return (a.shape, a.stride(), a.dtype, a.device, a_pointer & 255 and a_pointer & -a_pointer, _is_neg(a),
            b.shape, b.stride(), b.dtype, b.device, b_pointer & 255 and b_pointer & -b_pointer, _is_neg(b),
            None if offs is None else (offs.shape, offs.stride(), offs.dtype, offs.device, _is_neg(offs)),
            out_dtype or a.dtype)


def run(a: Tensor, b: Tensor, offs: Tensor | None, out_dtype: torch.dtype | None) -> Tensor | None:
    """The call's result where it is bound, else None (the checked path then runs it)."""
    if tuning():  # an autotune() context searches a problem on its first call: the checked path
        return None
    local = _local
    try:
        a_pointer, b_pointer = a.data_ptr(), b.data_ptr()
        offs_pointer = 0 if offs is None else offs.data_ptr()
        key = _key(a, b, offs, out_dtype, a_pointer, b_pointer)
        entry = local.last_entry if key == local.last_key else local.entries.pop(key, None)
    except Exception:  # noqa: BLE001 - a tensor without data or strides: the checked path says what is wrong
        return None
    if entry is None:
        return None
    plan = entry.plan
    if plan._captured or plan.algorithm is None:  # a graph holds it, or its cache freed it: bound anew
        local.entries.pop(key, None)
        _local.last_key = _local.last_entry = None
        return None
    if entry is not local.last_entry:
        local.entries[key] = entry  # the most recently used last
        _local.last_key, _local.last_entry = key, entry
    stream = _raw_stream(entry.device)
    capturing = _cuda.is_capturing(stream) if entry.several_devices else _current_capturing()
    if local.generation != _tuning_cache.generation and not capturing:
        return None  # a search stored a choice: the checked path, whose bind() makes the plans again
    out = plan._run_pointers(entry.problem, a_pointer, b_pointer, offs_pointer, entry.offs_64, out=None,
                                   stream=stream, check_offsets=None, capturing=capturing)
    if capturing:  # the graph holds the plan now: eager calls bind one of their own, never racing its replays
        local.captured.append(plan)
        del local.entries[key]
        _local.last_key = _local.last_entry = None
    return out


def bind(a: Tensor, b: Tensor, offs: Tensor | None, out_dtype: torch.dtype) -> Tensor | None:
    """For a CUDA call the checked path has passed, with no copy of ``a`` or ``b`` made for cuBLASLt: the
    second time its key is met, its plan made, bound and run (the result); else None (``grouped_matmul``
    runs it). Never while a CUDA graph is captured on the stream: planning allocates."""
    local = _local
    a_pointer, b_pointer = a.data_ptr(), b.data_ptr()
    key = _key(a, b, offs, out_dtype, a_pointer, b_pointer)
    device = a.get_device()
    if _cuda.is_capturing(_raw_stream(device)):
        return None
    if local.generation != _tuning_cache.generation:
        _forget()
        _local.generation = _tuning_cache.generation
    if key not in local.entries:
        if key not in local.seen:
            if len(local.seen) >= _SEEN_LIMIT:
                local.seen.clear()
            local.seen.add(key)
            return None
        local.seen.discard(key)
        local.entries[key] = _planned(a, b, offs, out_dtype, device)
        while len(local.entries) > _LIMIT:  # forgotten, not freed: the function form's cache owns the plan
            del local.entries[next(iter(local.entries))]
            _local.last_key = _local.last_entry = None
    return run(a, b, offs, out_dtype)


def _planned(a: Tensor, b: Tensor, offs: Tensor | None, out_dtype: torch.dtype, device: int) -> Entry:
    """The call bound to ``grouped_matmul``'s plan for its problem (made and cached where there is none)."""
    import nvblaslt

    plan, problem = nvblaslt.GroupedMatmul._cached(a, b, offs, out_dtype)
    return Entry(plan, problem, offs is not None and offs.dtype == torch.int64, device)


def _forget() -> None:
    _local.entries = {}
    _local.last_key = _local.last_entry = None


def clear() -> None:
    """Forget this thread's bound calls and the keys checked once (``nvblaslt.clear_grouped_plans()`` frees
    the plans, which the function form's cache owns); plans a CUDA graph captured stay held."""
    _forget()
    _local.seen.clear()
