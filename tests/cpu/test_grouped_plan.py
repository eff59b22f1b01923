"""GroupedMatmul and grouped_matmul driven end to end without a GPU: the handle, the heuristics, the derive
kernel and cublasLtMatmul are stand-ins that record their calls; everything else (reading the operands,
the problem, the descriptors on the real library, plan reuse and its refusals, the function form's cache)
is the real code. What the calls carry is checked against the layout the problem describes."""

from __future__ import annotations

import re

import pytest

import nvblaslt
from nvblaslt import (GroupedMatmul, NvblasltStateError, NvblasltValueError, _frameworks, _grouped, _grouped_function,
                      _launch)
from nvblaslt._descriptors import HeuristicResult
from tests.fakes import FakeDLPack

A, B, OUT, OFFS, OUT2 = 0x7F0000000000, 0x7F0000100000, 0x7F0000200000, 0x7F0000300000, 0x7F0000400000


@pytest.fixture
def gpu_standins(monkeypatch, default_lib):
    lib = default_lib
    if lib.version < 130200:
        pytest.skip("the loaded cuBLASLt has no grouped layouts")
    calls: dict[str, list] = {"arrays": [], "derive": [], "matmul": [], "heuristics": 0}

    class Handle:
        handle = 0x1234

    class Arrays:  # GroupedArrays without device memory or the kernel
        def __init__(self, problem, device, stream):
            self.groups = problem.groups
            calls["arrays"].append(problem.groups)

        def array(self, matrix, field):
            return 0x6000_0000 + 0x1000 * matrix + 0x100 * field

        def pointer_array(self, matrix):
            return 0x6100_0000 + 0x1000 * matrix

        def derive(self, offsets, offsets_64, total, bases, lds, stream, *, check=False):
            calls["derive"].append((offsets, offsets_64, total, bases, lds, stream, check))

        def release(self):
            pass

    def heuristics(handle, desc, a, b, c, d, preference, count=8):
        calls["heuristics"] += 1
        result = lib.api.cublasLtMatmulHeuristicResult_t()
        result.algo.data[0] = 7
        result.workspaceSize = 0
        return [HeuristicResult(result, lib)]

    def plain(argument):  # a c_void_p's value; what a prebuilt from_param() or byref() argument holds
        if hasattr(argument, "value"):
            return argument.value
        shown = re.fullmatch(r"<cparam '[PLQ]' \((\w+)\)>", repr(argument))  # from_param(int): no attribute
        if shown:
            return int(shown.group(1), 0)
        held = getattr(argument, "_obj", argument)
        return getattr(held, "value", held)

    def matmul(*arguments):
        calls["matmul"].append([plain(x) for x in arguments])
        return 0

    monkeypatch.setattr(_grouped.Handle, "for_device", classmethod(lambda cls, device: Handle()))
    monkeypatch.setattr(_grouped, "GroupedArrays", Arrays)
    monkeypatch.setattr(_launch, "heuristics", heuristics)  # the plan's Launch asks them
    monkeypatch.setattr(_launch, "raw_function", lambda function: matmul)
    monkeypatch.setattr(_grouped, "require_grouped", lambda lib: None)  # 13.4 and newer: the stand-ins run
    monkeypatch.setattr(_grouped._tuning_cache, "recall", lambda plan: (None, {}))
    monkeypatch.setattr(_grouped_function._tuning_cache, "generation", 0)
    _grouped_function.clear_grouped_plans()
    yield calls
    _grouped_function.clear_grouped_plans()


def operands(tokens=40, groups=4, k=64, n=96, a_ptr=A):
    a = FakeDLPack((tokens, k), dtype="bfloat16", ptr=a_ptr)
    weights = FakeDLPack((groups, n, k), dtype="bfloat16", ptr=B)           # (G, N, K) as nn.Linear keeps them
    b = FakeDLPack((groups, k, n), (n * k, 1, k), dtype="bfloat16", ptr=B)  # its (G, K, N) transpose
    offs = FakeDLPack((groups,), dtype="int32", ptr=OFFS)
    return a, b, offs, weights


def test_a_plan_runs_its_kernel_then_cublaslt_with_the_problems_layout(gpu_standins):
    a, b, offs, _ = operands()
    out = FakeDLPack((40, 96), dtype="bfloat16", ptr=OUT)
    plan = GroupedMatmul(a, b, offs)
    plan.plan()
    assert plan.execute(out=out) is out
    (offsets, wide, total, bases, lds, stream, check), = gpu_standins["derive"]
    assert (offsets, wide, total, bases, lds, check) == (OFFS, False, 40, (B, A, OUT), (64, 64, 96), False)
    call, = gpu_standins["matmul"]
    # handle, desc, alpha, A's pointers, A, B's pointers, B, beta, C's (D's), C, D's, D, algo, workspace, size, stream
    assert call[0] == 0x1234 and call[3] == 0x6100_0000 and call[5] == 0x6100_1000
    assert call[8] == call[10] == 0x6100_2000 and call[13] in (None, 0) and call[14] == 0
    assert plan._launch.desc.get("TRANSA") == nvblaslt.lt.CUBLAS_OP_T  # weights stored (G, N, K): TN
    # new tokens and offsets run the same plan; the kernel gets the new total
    a2, _, _, _ = operands(tokens=88)
    plan.execute(a2, out=FakeDLPack((88, 96), dtype="bfloat16", ptr=OUT2))
    assert gpu_standins["derive"][-1][2] == 88 and gpu_standins["arrays"] == [4]


def test_a_plan_refuses_other_operands_and_released_ones(gpu_standins):
    a, b, offs, _ = operands()
    plan = GroupedMatmul(a, b, offs)
    plan.plan()
    other_k = FakeDLPack((40, 32), dtype="bfloat16", ptr=A)
    with pytest.raises(NvblasltValueError):
        plan.execute(other_k, FakeDLPack((4, 32, 96), dtype="bfloat16", ptr=B), offs,
                     out=FakeDLPack((40, 96), dtype="bfloat16", ptr=OUT))
    with pytest.raises(NvblasltValueError, match="differ in more than the ragged extent"):
        plan.execute(FakeDLPack((40, 64), dtype="bfloat16", ptr=A + 2), out=FakeDLPack((40, 96), dtype="bfloat16",
                                                                                        ptr=OUT))
    with pytest.raises(NvblasltValueError, match=r"out: expected a bfloat16 array of shape \(40, 96\)"):
        plan.execute(out=FakeDLPack((40, 96), dtype="float32", ptr=OUT))
    plan.release_operands()
    with pytest.raises(NvblasltStateError, match="a, b, offs: expected arrays"):
        plan.execute(out=FakeDLPack((40, 96), dtype="bfloat16", ptr=OUT))
    with pytest.raises(NvblasltStateError, match=r"autotune: plan\(\) first|released"):
        plan.autotune()


def test_the_function_form_plans_once_per_problem(gpu_standins):
    a, b, offs, _ = operands()
    for tokens, ptr in ((40, OUT), (64, OUT2), (40, OUT)):
        a, _, _, _ = operands(tokens=tokens)
        nvblaslt.grouped_matmul(a, b, offs, out=FakeDLPack((tokens, 96), dtype="bfloat16", ptr=ptr))
    assert gpu_standins["arrays"] == [4] and gpu_standins["heuristics"] == 1 and len(gpu_standins["matmul"]) == 3
    nvblaslt.grouped_matmul(a, b, offs, out_dtype="float32", out=FakeDLPack((40, 96), dtype="float32", ptr=OUT))
    assert gpu_standins["arrays"] == [4, 4]  # another result type: another plan
    nvblaslt.clear_grouped_plans()
    nvblaslt.grouped_matmul(a, b, offs, out=FakeDLPack((40, 96), dtype="bfloat16", ptr=OUT))
    assert gpu_standins["arrays"] == [4, 4, 4]


def test_check_offsets_reaches_the_kernel_and_the_environment_sets_it_when_a_plan_is_made(gpu_standins, monkeypatch):
    a, b, offs, _ = operands()
    out = FakeDLPack((40, 96), dtype="bfloat16", ptr=OUT)
    nvblaslt.grouped_matmul(a, b, offs, out=out, check_offsets=True)
    monkeypatch.setenv("NVBLASLT_CHECK_OFFSETS", "1")
    nvblaslt.grouped_matmul(a, b, offs, out=out)  # the plan read the environment when it was made: unset
    nvblaslt.clear_grouped_plans()  # plans made from now on read it: set
    nvblaslt.grouped_matmul(a, b, offs, out=out)
    nvblaslt.grouped_matmul(a, b, offs, out=out, check_offsets=False)
    monkeypatch.setenv("NVBLASLT_CHECK_OFFSETS", "0")
    nvblaslt.grouped_matmul(a, b, offs, out=out)  # no environment read per call
    nvblaslt.clear_grouped_plans()
    nvblaslt.grouped_matmul(a, b, offs, out=out)
    assert [call[-1] for call in gpu_standins["derive"]] == [True, False, True, False, True, False]


STREAM = 0  # the stand-in current stream: what stream_of gives a fake array (a new one would be waited on)


@pytest.fixture
def reader(monkeypatch):
    """FakeDLPack arrays read as a package's layout reader reads its own: no export, the reads counted."""
    reads: list = []

    def read(arrays):
        reads.append(len(arrays))
        layouts = tuple(None if x is None else (x.shape, x.strides, x.dtype, x.device, x.ptr & 255 and x.ptr & -x.ptr)
                        for x in arrays)
        return [None if x is None else x.ptr for x in arrays], layouts

    monkeypatch.setitem(_frameworks._fast_readers, FakeDLPack, (None, read, lambda device: STREAM))
    return reads


def test_the_function_form_recalls_a_known_layout_without_reading_the_arrays_again(gpu_standins, reader):
    # a package with a layout reader (CuPy, PyTorch): a layout seen before runs its plan on the new pointers
    a, b, offs, _ = operands()
    out = FakeDLPack((40, 96), dtype="bfloat16", ptr=OUT)
    nvblaslt.grouped_matmul(a, b, offs, out=out)
    a2 = FakeDLPack((40, 64), dtype="bfloat16", ptr=A + 0x1000)  # new pointers, the same layout
    offs2 = FakeDLPack((4,), dtype="int32", ptr=OFFS + 0x100)
    nvblaslt.grouped_matmul(a2, b, offs2, out=FakeDLPack((40, 96), dtype="bfloat16", ptr=OUT2))
    assert a2.streams == offs2.streams == [] and gpu_standins["heuristics"] == 1  # no DLPack export
    first, second = gpu_standins["derive"]
    assert second[0] == OFFS + 0x100 and second[3] == (B, A + 0x1000, OUT2) and second[1:3] == first[1:3]
    # another token count is another layout: read and bound once, the same plan run
    a3 = FakeDLPack((88, 64), dtype="bfloat16", ptr=A)
    nvblaslt.grouped_matmul(a3, b, offs, out=FakeDLPack((88, 96), dtype="bfloat16", ptr=OUT))
    assert len(a3.streams) == 1 and gpu_standins["arrays"] == [4] and gpu_standins["derive"][-1][2] == 88
    # a pointer off the plan's alignment is another layout too: another plan, for that alignment
    nvblaslt.grouped_matmul(FakeDLPack((40, 64), dtype="bfloat16", ptr=A + 2), b, offs, out=out)
    assert gpu_standins["arrays"] == [4, 4]
    # plans leaving the cache take the fast path's entries with them: the next call plans anew
    nvblaslt.clear_grouped_plans()
    nvblaslt.grouped_matmul(a2, b, offs2, out=FakeDLPack((40, 96), dtype="bfloat16", ptr=OUT2))
    assert gpu_standins["arrays"] == [4, 4, 4] and a2.streams  # read again, on the checked path
    # an out the plan cannot write into is refused on the fast path as well
    with pytest.raises(NvblasltValueError, match="out: expected a bfloat16 array of shape"):
        nvblaslt.grouped_matmul(a2, b, offs2, out=FakeDLPack((40, 96), dtype="float32", ptr=OUT))


def test_fp8_scales_reach_the_descriptor_per_call_and_are_checked(gpu_standins):
    SCALE_A, SCALE_B = 0x7F0000500000, 0x7F0000500100
    a = FakeDLPack((40, 64), dtype="float8_e4m3fn", ptr=A)
    b = FakeDLPack((4, 64, 96), (96 * 64, 1, 64), dtype="float8_e4m3fn", ptr=B)  # K contiguous: TN
    offs = FakeDLPack((4,), dtype="int32", ptr=OFFS)
    out = FakeDLPack((40, 96), dtype="bfloat16", ptr=OUT)  # fp8's default result type
    scale_a, scale_b = FakeDLPack((1,), ptr=SCALE_A), FakeDLPack((), ptr=SCALE_B)
    nvblaslt.grouped_matmul(a, b, offs, out=out, scale_a=scale_a, scale_b=scale_b)
    (plan,) = _grouped_function._local.plans.values()
    # cuBLASLt's A is the caller's b
    desc = plan._launch.desc
    assert desc.get("A_SCALE_POINTER") == SCALE_B and desc.get("B_SCALE_POINTER") == SCALE_A
    nvblaslt.grouped_matmul(a, b, offs, out=out)  # the same cached plan, no scales now: 1, not the last ones
    assert desc.get("A_SCALE_POINTER") in (0, None) and desc.get("B_SCALE_POINTER") in (0, None)
    with pytest.raises(NvblasltValueError, match=r"scale_b: expected one float32 value on GPU 0"):
        nvblaslt.grouped_matmul(a, b, offs, out=out, scale_b=FakeDLPack((2,), ptr=SCALE_B))
    with pytest.raises(NvblasltValueError, match=r"scale_a: expected one float32 value"):
        nvblaslt.grouped_matmul(a, b, offs, out=out, scale_a=FakeDLPack((1,), dtype="float16", ptr=SCALE_A))
    bf16, bf16_b, bf16_offs, _ = operands()
    with pytest.raises(NvblasltValueError, match="scale_a: per-tensor scales apply to float8 operands"):
        nvblaslt.grouped_matmul(bf16, bf16_b, bf16_offs, out=FakeDLPack((40, 96), dtype="bfloat16", ptr=OUT),
                                scale_a=scale_a)
