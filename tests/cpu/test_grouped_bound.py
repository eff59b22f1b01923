"""``grouped_mm``'s bound calls without a GPU: a call like one checked twice before runs its bound plan with
its own pointers, and a call its key does not prove takes the checked path. The plans are stand-ins that
record what they run (no math); CPU tensors stand for CUDA ones, the stream and the capture state are
given. The math of the bound path runs on the GPU (tests/gpu/test_grouped_bound_gpu.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import nvblaslt  # noqa: E402
from nvblaslt import _cuda, _tuning_cache  # noqa: E402
from nvblaslt.torch import _grouped, _grouped_bound, autotune, grouped_mm  # noqa: E402
from tests.cpu.test_linear_fast_path import aligned as aligned_tensor  # noqa: E402

BF16 = torch.bfloat16
STREAM = 0x5000


class Plans:
    """The stand-in plans made so far, and whether the stream is capturing a CUDA graph."""

    def __init__(self):
        self.made: list = []
        self.capturing = False


@pytest.fixture
def plans(monkeypatch):
    made = Plans()

    class StandInPlan:
        def __init__(self, a, b, offs, *, out_dtype=None):
            self.operands = (tuple(a.shape), tuple(b.shape), None if offs is None else offs.dtype, out_dtype)
            self._problem = ("problem", *self.operands)
            self._out = (_grouped._out_shape(a, b, offs), out_dtype)
            self._captured = False
            self.runs: list = []
            self.planned = self.released = self.freed = False
            made.made.append(self)

        def plan(self):
            self.planned = True

        def release_operands(self):
            self.released = True

        def free(self):
            self.freed = True

        @property
        def algorithm(self):
            return None if self.freed else "the selected one"

        @classmethod
        def _cached(cls, a, b, offs, out_dtype):  # grouped_matmul's cache, stood in: a plan per call
            plan = cls(a, b, offs, out_dtype=out_dtype)
            plan.plan()
            plan.release_operands()
            return plan, plan._problem

        def _run_pointers(self, problem, a_pointer, b_pointer, offs_pointer, offs_64, *, out, stream, check_offsets,
                          capturing):
            assert problem is self._problem and out is None and check_offsets is None
            self.runs.append((a_pointer, b_pointer, offs_pointer, offs_64, stream, capturing))
            self._captured = self._captured or capturing
            shape, dtype = self._out
            return torch.zeros(shape, dtype=dtype)

    monkeypatch.setattr(nvblaslt, "GroupedMatmul", StandInPlan)
    monkeypatch.setattr(_grouped_bound, "_raw_stream", lambda device: STREAM)
    monkeypatch.setattr(_grouped_bound, "_current_capturing", lambda: made.capturing)
    monkeypatch.setattr(_cuda, "is_capturing", lambda stream: made.capturing)
    monkeypatch.setattr(_cuda, "several_devices", lambda: False)
    _grouped_bound.clear()
    yield made
    _grouped_bound.clear()


def aligned(*shape, dtype=BF16):
    """Random values at a 256-byte aligned address, as CUDA allocations are (CPU ones: 64 bytes)."""
    return aligned_tensor(*shape, dtype=dtype)


def experts(tokens=32, groups=4, k=16, n=24):
    """Tokens, the experts' weights as the layer passes them (a transposed view) and balanced offsets."""
    offs = torch.arange(1, groups + 1, dtype=torch.int32) * (tokens // groups)
    return aligned(tokens, k), aligned(groups, n, k).transpose(1, 2), offs


def bound(x, w, offs, out_dtype=BF16):
    """Checked twice (the second binds): what ``_native`` does for a call on CUDA it passes as it is."""
    assert _grouped_bound.bind(x, w, offs, out_dtype) is None  # the first: grouped_matmul runs it
    return _grouped_bound.bind(x, w, offs, out_dtype)


def test_a_like_call_runs_the_bound_plan_on_its_own_pointers_and_new_offsets(plans):
    x, w, offs = experts()
    assert _grouped_bound.run(x, w, offs, None) is None  # nothing bound yet
    out = bound(x, w, offs)
    plan, = plans.made
    assert plan.planned and plan.released and out.shape == (32, 24)  # the plan keeps no tensor
    assert plan.runs == [(x.data_ptr(), w.data_ptr(), offs.data_ptr(), False, STREAM, False)]
    x2, _, _ = experts()
    offs2 = torch.tensor([0, 5, 5, 32], dtype=torch.int32)  # other values, an empty group: the same call
    assert _grouped_bound.run(x2, w, offs2, None) is not None
    assert _grouped_bound.run(x2, w, offs2, BF16) is not None  # the result's dtype given as the default
    assert len(plans.made) == 1 and plan.runs[-1][:3] == (x2.data_ptr(), w.data_ptr(), offs2.data_ptr())
    assert len(plan.runs) == 3


def _aligned_off(x):
    """x's values at a pointer 2 bytes past a 16-byte boundary: another alignment, the same shape."""
    return torch.empty(x.numel() + 8, dtype=x.dtype)[1:x.numel() + 1].view(x.shape)


CHANGES = {
    "offs int64": lambda x, w, offs: (x, w, offs.to(torch.int64)),
    "offs another length": lambda x, w, offs: (x, torch.cat([w, w[:1]]), torch.cat([offs, offs[-1:]])),
    "offs on another device": lambda x, w, offs: (x, w, offs.to("meta")),
    "offs a negative view": lambda x, w, offs: (x, w, torch._neg_view(offs)),
    "offs strided": lambda x, w, offs: (x, w, torch.stack([offs, offs], 1)[:, 0]),
    "no offs": lambda x, w, offs: (x, w, None),
    "a float16": lambda x, w, offs: (x.half(), w, offs),
    "a on another device": lambda x, w, offs: (x.to("meta"), w, offs),
    "a another token total": lambda x, w, offs: (x[:24], w, offs),
    "a column-major": lambda x, w, offs: (x.T.contiguous().T, w, offs),
    "a off the alignment": lambda x, w, offs: (_aligned_off(x), w, offs),
    "b row-major": lambda x, w, offs: (x, w.contiguous(), offs),
    "b another dtype": lambda x, w, offs: (x, w.float(), offs),
    "b a negative view": lambda x, w, offs: (x, torch._neg_view(w), offs),
}


@pytest.mark.parametrize("change", CHANGES)
def test_a_call_the_key_does_not_prove_takes_the_checked_path(plans, change):
    x, w, offs = experts()
    bound(x, w, offs)
    changed = CHANGES[change](x, w, offs)
    assert _grouped_bound.run(*changed, None) is None
    assert len(plans.made[0].runs) == 1


def test_another_result_dtype_is_another_call(plans):
    x, w, offs = experts()
    bound(x, w, offs)
    assert _grouped_bound.run(x, w, offs, torch.float32) is None
    assert bound(x, w, offs, torch.float32).dtype == torch.float32 and len(plans.made) == 2


def test_grouped_mm_takes_the_bound_plan_and_autograd_still_records_when_a_gradient_is_wanted(plans):
    """requires_grad and grad mode are read on every call: the bound forward under autograd has a
    backward (the checked path's CPU math here), and without a gradient none."""
    x, w, offs = experts()
    bound(x, w, offs)
    plan, = plans.made
    out = grouped_mm(x, w, offs)
    assert len(plan.runs) == 2 and out.grad_fn is None
    weight = w.detach().transpose(1, 2).requires_grad_()
    out = grouped_mm(x, weight.transpose(1, 2), offs)  # the same key: autograd records the bound forward
    assert len(plan.runs) == 3 and out.grad_fn is not None
    out.float().sum().backward()
    assert weight.grad is not None and weight.grad.shape == weight.shape
    with torch.no_grad():
        assert grouped_mm(x, weight.transpose(1, 2), offs).grad_fn is None
    assert len(plan.runs) == 4


def test_a_captured_plan_is_kept_and_the_key_bound_anew(plans):
    x, w, offs = experts()
    bound(x, w, offs)
    first, = plans.made
    plans.capturing = True
    assert _grouped_bound.run(x, w, offs, None) is not None  # bound already: it runs, allocating nothing new
    assert first.runs[-1][-1] is True and len(plans.made) == 1
    assert _grouped_bound.run(x, w, offs, None) is None  # the graph owns it: never run eagerly again
    x2, w2, offs2 = experts(tokens=48)
    assert bound(x2, w2, offs2) is None and len(plans.made) == 1  # no plan made inside a capture
    plans.capturing = False
    _grouped_bound.clear()
    assert not first.freed  # a replay reads its arrays
    assert bound(x, w, offs) is not None and len(plans.made) == 2 and not plans.made[1].runs[-1][-1]


def test_a_stored_tuning_choice_makes_the_plans_again_but_not_inside_a_capture(plans, monkeypatch):
    x, w, offs = experts()
    x2, w2, offs2 = experts(tokens=40)
    bound(x, w, offs)
    bound(x2, w2, offs2)
    first, second = plans.made
    monkeypatch.setattr(_tuning_cache, "generation", _tuning_cache.generation + 1)
    plans.capturing = True
    assert _grouped_bound.run(x, w, offs, None) is not None  # a capture runs the plan it has (and keeps it)
    plans.capturing = False
    assert _grouped_bound.run(x2, w2, offs2, None) is None  # the checked path: grouped_matmul recalls the choice
    assert bound(x2, w2, offs2) is not None  # its bind forgot the plans bound before the choice
    assert len(plans.made) == 3 and plans.made[2].runs  # bound again: the cache's new plan recalls the choice
    assert not first.freed and not second.freed  # the function form's cache retires them (a graph may hold them)


def test_inside_an_autotune_context_the_checked_path_runs(plans):
    x, w, offs = experts()
    bound(x, w, offs)
    with autotune(iterations=1):
        assert _grouped_bound.run(x, w, offs, None) is None


def test_bound_calls_are_bounded_the_least_recently_used_forgotten(plans, monkeypatch):
    monkeypatch.setattr(_grouped_bound, "_LIMIT", 2)
    calls = [experts(tokens=tokens) for tokens in (8, 16, 24)]
    for call in calls[:2]:
        bound(*call)
    assert _grouped_bound.run(*calls[0], None) is not None  # the first is now the most recently used
    bound(*calls[2])
    assert [_grouped_bound.run(*call, None) is not None for call in calls] == [True, False, True]
    assert not any(plan.freed for plan in plans.made)  # forgotten: the function form's cache owns the plans


def test_a_plan_its_cache_freed_or_a_graph_captured_elsewhere_is_bound_anew(plans):
    x, w, offs = experts()
    bound(x, w, offs)
    first, = plans.made
    first.free()  # what clear_grouped_plans() or the cache's eviction does to the plan
    assert _grouped_bound.run(x, w, offs, None) is None and len(first.runs) == 1  # never run once freed
    assert bound(x, w, offs) is not None and len(plans.made) == 2
    second = plans.made[1]
    second._captured = True  # captured through grouped_matmul(), which shares it: a graph's now
    assert _grouped_bound.run(x, w, offs, None) is None and len(second.runs) == 1


def test_the_capture_query_is_the_runtimes_answer(monkeypatch):
    asked = []

    class Runtime:
        class cudaStreamCaptureStatus:
            cudaStreamCaptureStatusNone = 0

        @staticmethod
        def cudaStreamIsCapturing(stream):
            asked.append(stream)
            return (0, 1) if stream == 7 else (0, 0) if stream == 8 else (1, 0)

    monkeypatch.setattr(_cuda, "cudart", Runtime)
    assert _cuda.is_capturing(7) is True
    assert _cuda.is_capturing(8) is False
    assert _cuda.is_capturing(9) is False  # an error: not capturing (the caller's own checks then report it)
    assert asked == [7, 8, 9]


def test_the_derive_kernel_launches_with_every_per_call_value_as_given(monkeypatch):
    """derive() writes only the arguments that changed since the last launch; each launch still reads
    exactly this call's values (offsets, width, total, the three bases and leading dimensions)."""
    import ctypes

    from nvblaslt import _grouped_arrays, _jit

    seen = []

    class Kernel:
        def launch(self, device, grid, block, stream, arguments):
            slots = ctypes.cast(arguments.address, ctypes.POINTER(ctypes.c_void_p))
            seen.append(tuple(kind.from_address(slots[index]).value or 0 for index, kind in
                              zip(_grouped_arrays._PER_CALL, (ctypes.c_void_p, ctypes.c_int, *[ctypes.c_longlong] * 7))))

    class Buffer:
        def used_on(self, stream):
            pass

    arrays = _grouped_arrays.GroupedArrays.__new__(_grouped_arrays.GroupedArrays)
    arrays.groups, arrays.device, arrays.kernel, arrays.buffer, arrays._last_values = 4, 0, Kernel(), Buffer(), ()
    arrays._derive_arguments = _jit.Arguments(_grouped_arrays._ARGUMENT_TYPES, (0,) * 15)
    calls = [(0x1000, False, 64, (0xA000, 0xB000, 0xC000), (16, 16, 24)),
             (0x1000, False, 64, (0xA000, 0xB100, 0xC100), (16, 16, 24)),  # new tokens and result
             (0x2000, True, 48, (0xA000, 0xB100, 0xC200), (16, 16, 24)),   # new offsets, width, total
             (0x2000, True, 48, (0xA000, 0xB100, 0xC200), (16, 16, 24)),   # the same again
             (0x2000, False, 48, (0xA000, 0xB100, 0xC200), (8, 16, 32))]
    for offsets, wide, total, bases, lds in calls:
        arrays.derive(offsets, wide, total, bases, lds, stream=0)
    assert seen == [(offsets, int(wide), total, *bases, *lds) for offsets, wide, total, bases, lds in calls]


def test_strided_offsets_are_refused_by_name():
    """The derive kernel reads offs[g] g elements from the start: strided offsets would be misread."""
    from nvblaslt import NvblasltValueError, _grouped
    from tests.fakes import FakeDLPack

    a, b = FakeDLPack((40, 64), dtype="bfloat16"), FakeDLPack((4, 64, 96), dtype="bfloat16", ptr=0x7F0000100000)
    with pytest.raises(NvblasltValueError, match=r"offs: expected contiguous offsets \(stride 1\)"):
        _grouped.bind(a, b, FakeDLPack((4,), (2,), dtype="int32", ptr=0x7F0000300000), 0)
    assert _grouped.bind(a, b, FakeDLPack((4,), dtype="int32", ptr=0x7F0000300000), 0).problem.groups == 4
    assert _grouped.bind(a, FakeDLPack((1, 64, 96), dtype="bfloat16", ptr=0x7F0000100000),
                         FakeDLPack((1,), (5,), dtype="int32", ptr=0x7F0000300000), 0).problem.groups == 1
