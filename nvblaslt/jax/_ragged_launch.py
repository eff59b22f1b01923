"""``ragged_dot``'s grouped GEMM in XLA's callback: a plan made on the first run, launched on XLA's stream.

A call's plan (``GroupedMatmul``) is made on its first uncaptured run, on XLA's stream, for the call's
static form (shapes, dtypes, which operand is read transposed), its GPU and its pointers' alignments,
and kept. Every run launches it with XLA's pointers alone: the derive kernel (every group's size and
matrix pointers, from the offsets on the GPU), the GEMM, and, where the result is split by rows, a
kernel that zeroes the rows past the groups' total (what ``jax.lax.ragged_dot`` returns there; the
grouped GEMM leaves them unwritten). Nothing reads the group sizes on the host, allocates or
synchronizes, so XLA may capture the call in a command buffer: under capture it runs the plan its
uncaptured run made, and that plan is kept for the process's life (a replay reads its per-group
arrays and workspace).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import cast

from .. import DeviceArray, _cuda, _jit
from .._errors import NvblasltValueError
from .._memory import DeviceBuffer
from .._strides import c_strides
from . import _bridge, _tuning
from ._planning import dtype_of

_ALIGN = 256  # the most alignment a plan is keyed on: XLA's allocations give it

TAIL_KERNEL = "nvblaslt_ragged_zero_tail"
# Zeroes out[offs[groups - 1]:] (rows of row_bytes), clamped to the result: 16-byte stores where aligned.
TAIL_SOURCE = _jit.ZERO_SPAN_SOURCE + r"""
extern "C" __global__ void nvblaslt_ragged_zero_tail(const int* offs, int groups, long long rows,
                                                     long long row_bytes, unsigned char* out) {
    long long start = groups > 0 ? offs[groups - 1] : 0;
    start = start < 0 ? 0 : (start > rows ? rows : start);
    const long long thread = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long threads = (long long)gridDim.x * blockDim.x;
    zero_span(reinterpret_cast<char*>(out + start * row_bytes), (rows - start) * row_bytes, thread, threads);
}
"""
_TAIL_THREADS, _TAIL_MOST_BLOCKS = 256, 1024  # a grid-stride loop; an empty tail costs one read per thread
_TAIL_ARGUMENT_TYPES = (_jit.POINTER, _jit.INT32, _jit.INT64, _jit.INT64, _jit.POINTER)

_lock = threading.Lock()
_plans: dict[tuple, _Entry] = {}  # (form, GPU, stream, alignments) → its plan
_latest: dict[tuple, _Entry] = {}  # (form, GPU, alignments) → its newest plan, for a capture on another stream
_captured: list[_Entry] = []  # plans a command buffer replays: never freed


@dataclass(frozen=True)
class Form:
    """Everything static about one ``ragged_dot`` GEMM call, fixed at trace time."""

    shapes: tuple  # XLA's buffers: a, b, offsets, result (row-major)
    dtype: str  # the operands'
    out_dtype: str
    transposes: tuple[bool, bool]  # a, b read with their last two axes swapped (strided views, no copy)
    zero_tail: bool  # the result is split by rows: those past the groups' total are zeroed


class _Borrowed:
    """XLA's memory, lent for one call: a ``DeviceArray`` over it frees nothing."""

    __slots__ = ("pointer",)

    def __init__(self, pointer: int):
        self.pointer = pointer

    def used_on(self, stream: int) -> None:
        pass

    def release(self) -> None:
        pass


def view(shape: tuple, dtype: str, pointer: int, transposed: bool, stream: int, device: int) -> DeviceArray:
    """XLA's row-major buffer as a ``DeviceArray``, its last two axes swapped where ``transposed``."""
    strides = c_strides(shape)
    if transposed:
        shape = (*shape[:-2], shape[-1], shape[-2])
        strides = (*strides[:-2], strides[-1], strides[-2])
    return DeviceArray(cast(DeviceBuffer, _Borrowed(pointer)), shape, strides, dtype_of(dtype, "buffer"), device,
                       stream)


def _views(form: Form, pointers: tuple, stream: int, device: int) -> list[DeviceArray]:
    dtypes = (form.dtype, form.dtype, "int32", form.out_dtype)
    transposes = (*form.transposes, False, False)
    return [view(s, d, p, t, stream, device) for s, d, p, t in zip(form.shapes, dtypes, pointers, transposes)]


class _Tail:
    """The kernel that zeroes a row-split result's rows past the groups' total, its arguments prebuilt."""

    def __init__(self, form: Form, device: int):
        rows, cols = form.shapes[3]
        row_bytes = cols * dtype_of(form.out_dtype, "out").itemsize
        self.kernel = _jit.kernel(TAIL_SOURCE, TAIL_KERNEL, device)  # compiled and loaded here, never under capture
        self.arguments = _jit.Arguments(_TAIL_ARGUMENT_TYPES, (0, form.shapes[2][0], rows, row_bytes, 0))
        self.blocks = max(1, min(_TAIL_MOST_BLOCKS, -(-rows * row_bytes // (16 * _TAIL_THREADS))))
        self.device = device

    def launch(self, offsets: int, out: int, stream: int) -> None:
        self.arguments.set(0, offsets)
        self.arguments.set(4, out)
        self.kernel.launch(self.device, self.blocks, _TAIL_THREADS, stream, self.arguments)


class _Entry:
    """One grouped plan for one form on one GPU, and what a launch needs beside it."""

    def __init__(self, form: Form, pointers: tuple, stream: int, device: int):
        from .. import GroupedMatmul  # grouped GEMM's modules load on first use

        a, b, offs, _ = _views(form, pointers, stream, device)
        self.plan = GroupedMatmul(a, b, offs, out_dtype=form.out_dtype, stream=stream)
        self.plan.plan()
        tuning = _tuning.active()
        self.generation = tuning.generation if tuning is not None else 0
        if tuning is not None:  # timed into scratch memory on XLA's stream, with XLA's operands and offsets
            self.plan.autotune(iterations=tuning.iterations, search=tuning.search)
        self.plan.release_operands()  # XLA's buffers are lent for this call only
        self.problem = self.plan._problem  # the shapes are static: every run poses this problem
        self.tail = _Tail(form, device) if form.zero_tail else None
        self.form, self.device = form, device
        self.captured = False  # a command buffer replays it: it is never freed
        self.lock = threading.Lock()  # the plan's kernel arguments are set per call

    def run(self, pointers: tuple, stream: int) -> None:
        a, b, offs, out = pointers
        result = view(self.form.shapes[3], self.form.out_dtype, out, False, stream, self.device)
        with self.lock:
            # check_offsets off: sizes summing below the rows are ragged_dot's semantics, not an error
            self.plan._run_pointers(self.problem, a, b, offs, False, out=result, stream=stream, check_offsets=False)
            if self.tail is not None:
                self.tail.launch(offs, out, stream)

    def keep(self) -> bool:
        """Mark the plan as one a command buffer replays (never freed); True the first time."""
        first, self.captured = not self.captured, True
        return first

    def free(self) -> None:
        if not self.captured:
            self.plan.free()


def _alignment(pointer: int) -> int:
    return min(_ALIGN, pointer & -pointer) if pointer else _ALIGN


def launch(form: Form, ctx, out, a, b, offs) -> None:
    """XLA's callback: the plan for this form, GPU and alignments (made on the first run), launched."""
    stream = int(ctx.stream)
    pointers = tuple(x.__cuda_array_interface__["data"][0] for x in (a, b, offs, out))
    device = _bridge.device_of(stream, pointers[3])
    _tuning.count_entry(device)
    with _cuda.on_device(device):  # a no-op with one GPU, or where XLA made that GPU current
        run(form, device, stream, pointers)


def run(form: Form, device: int, stream: int, pointers: tuple) -> None:
    alignments = tuple(_alignment(p) for p in pointers)
    key = (form, device, stream, alignments)
    entry = _plans.get(key)
    tuning = _tuning.active()
    if entry is None or (tuning is not None and entry.generation != tuning.generation):
        entry = _planned(key, (form, device, alignments), stream, pointers, entry)
    entry.run(pointers, stream)


def _planned(key: tuple, problem: tuple, stream: int, pointers: tuple, old: _Entry | None) -> _Entry:
    """The plan for a stream's first call; under a command buffer's capture, where nothing may allocate,
    the one the uncaptured first run made (on XLA's stream: XLA records on a stream of its own)."""
    with _lock:
        if _cuda.is_capturing(stream):
            entry = old or _latest.get(problem)
            if entry is None:
                raise NvblasltValueError("stream: XLA is recording a command buffer with an nvblaslt ragged_dot that "
                                         "never ran outside one, and planning allocates device memory, which capture "
                                         "forbids; run the program once before its command buffer is recorded "
                                         "(XLA's warm-up run does), or trace it outside "
                                         "nvblaslt.jax.command_buffers()")
            if entry.keep():
                _captured.append(entry)
        else:
            if old is not None:
                old.free()  # made before this autotune() context: made again, and timed (kept if a replay reads it)
            form, device, _ = problem
            entry = _latest[problem] = _Entry(form, pointers, stream, device)
        _plans[key] = entry
        return entry


def clear_plans() -> None:
    """Free the plans of ``nvblaslt.jax`` (the next run of each GEMM plans again).

    This thread's ``matmul`` and ``dense`` plans (XLA runs the callbacks in its own threads: call it
    where the GEMMs ran, or leave the plans to the process's end) and every ``ragged_dot`` plan. Plans
    a command buffer captured are kept (its replays still read them).

    Examples
    --------
    >>> import nvblaslt.jax
    >>> nvblaslt.jax.clear_plans()
    """
    _bridge.clear_plans()
    with _lock:
        for entry in {id(e): e for e in _plans.values()}.values():
            entry.free()
        _plans.clear()
        for problem, entry in list(_latest.items()):
            if not entry.captured:
                del _latest[problem]


__all__ = ["Form", "clear_plans", "launch", "view"]
