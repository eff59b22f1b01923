"""``GroupedMatmul.execute()``'s fast path without a GPU: after a checked call, a call whose arrays have the
same layouts (shapes, strides, dtypes, devices, pointer alignment; ``out``'s and the scales' too) reads only
their pointers, and every other call is read and checked as before. The stand-ins of test_grouped_plan
record what reaches the derive kernel and cuBLASLt; a stand-in layout reader (what CuPy and PyTorch have)
reads the fake arrays, and a DLPack export (``FakeDLPack.streams``) is what the checked path's read leaves."""

from __future__ import annotations

import pytest

from nvblaslt import GroupedMatmul, NvblasltStateError, NvblasltTypeError, NvblasltValueError, _grouped
from tests.cpu.test_grouped_plan import (STREAM, A, B, OFFS, OUT, OUT2, gpu_standins, operands,  # noqa: F401 - fixtures
                                         reader)
from tests.fakes import FakeDLPack



@pytest.fixture
def allocations(monkeypatch):
    """Results allocated without GPU memory: a fake array at ``RESULT`` per call (the calls counted)."""
    made: list = []

    def strided_allocator(framework, shape, strides, dtype, device):
        def allocate(stream, framework_stream):
            made.append(shape)
            return FakeDLPack(shape, strides, dtype.name, ptr=RESULT), RESULT
        return allocate
    monkeypatch.setattr(_grouped._memory, "strided_allocator", strided_allocator)
    return made


RESULT = 0x7F0000600000


def _out(tokens=40, ptr=OUT, dtype="bfloat16"):
    return FakeDLPack((tokens, 96), dtype=dtype, ptr=ptr)


def _planned():
    a, b, offs, _ = operands()
    plan = GroupedMatmul(a, b, offs)
    plan.plan()
    return plan, a, b, offs


def test_a_like_call_reads_only_pointers_and_runs_the_new_ones(gpu_standins, reader, allocations):
    plan, a, b, offs = _planned()
    out = _out()
    assert plan.execute(a, b, offs, out=out) is out  # checked: read, and its layouts remembered
    exported = (len(a.streams), len(b.streams), len(offs.streams), len(out.streams))
    a2 = FakeDLPack((40, 64), dtype="bfloat16", ptr=A + 0x1000)  # new pointers, the same layouts
    offs2 = FakeDLPack((4,), dtype="int32", ptr=OFFS + 0x100)  # other offsets: other values, the same call
    out2 = _out(ptr=OUT2)
    assert plan.execute(a2, b, offs2, out=out2) is out2
    assert a2.streams == offs2.streams == out2.streams == []  # nothing exported: the key proved the checks
    assert (len(a.streams), len(b.streams), len(offs.streams), len(out.streams)) == exported
    first, second = gpu_standins["derive"]
    assert second[:5] == (OFFS + 0x100, False, 40, (B, A + 0x1000, OUT2), first[4]) and second[5] == STREAM
    assert len(gpu_standins["matmul"]) == 2
    # without out= a result is allocated: checked once for this key (no out), then the fast path
    for _ in range(2):
        assert plan.execute(a2, b, offs2).ptr == RESULT
    assert gpu_standins["derive"][-1][:4] == (OFFS + 0x100, False, 40, (B, A + 0x1000, RESULT))
    assert len(a2.streams) == 1 and allocations == [(40, 96)] * 2


def test_defaults_after_a_fast_call_are_its_arrays(gpu_standins, reader):
    plan, a, b, offs = _planned()
    plan.execute(a, b, offs, out=_out())
    a2 = FakeDLPack((40, 64), dtype="bfloat16", ptr=A + 0x2000)
    plan.execute(a2, out=_out())  # b and offs: the last ones
    plan.execute(out=_out(ptr=OUT2))  # every operand the last one: a2 now
    assert gpu_standins["derive"][-1][3] == (B, A + 0x2000, OUT2) and a2.streams == []
    # the checked path after a fast one reads the kept arrays again (a layout it has not seen: float32 out)
    with pytest.raises(NvblasltValueError, match=r"out: expected a bfloat16 array of shape \(40, 96\)"):
        plan.execute(out=_out(dtype="float32"))
    plan.execute(out=_out())
    assert gpu_standins["derive"][-1][3] == (B, A + 0x2000, OUT)
    plan.release_operands()
    with pytest.raises(NvblasltStateError, match="a, b, offs: expected arrays"):
        plan.execute(out=_out())
    with pytest.raises(NvblasltStateError, match="b, offs: expected arrays"):
        plan.execute(a2, out=_out())


CHANGES = {  # what no fast key of the first call proves: each is read and checked (and refused where wrong)
    "another token total": lambda a, b, offs, out: (FakeDLPack((88, 64), dtype="bfloat16", ptr=A), b, offs,
                                                    _out(88)),
    "64-bit offsets": lambda a, b, offs, out: (a, b, FakeDLPack((4,), dtype="int64", ptr=OFFS), out),
    "offsets of another length": lambda a, b, offs, out: (a, b, FakeDLPack((5,), dtype="int32", ptr=OFFS), out),
    "offsets on another device": lambda a, b, offs, out: (a, b, FakeDLPack((4,), dtype="int32", ptr=OFFS, device=1),
                                                          out),
    "strided offsets": lambda a, b, offs, out: (a, b, FakeDLPack((4,), (2,), dtype="int32", ptr=OFFS), out),
    "a float16": lambda a, b, offs, out: (FakeDLPack((40, 64), dtype="float16", ptr=A), b, offs, out),
    "a off the alignment": lambda a, b, offs, out: (FakeDLPack((40, 64), dtype="bfloat16", ptr=A + 2), b, offs, out),
    "out float32": lambda a, b, offs, out: (a, b, offs, _out(dtype="float32")),
    "out off the alignment": lambda a, b, offs, out: (a, b, offs, _out(ptr=OUT + 2)),
    "out of another shape": lambda a, b, offs, out: (a, b, offs, FakeDLPack((40, 95), dtype="bfloat16", ptr=OUT)),
}
REFUSED = {"offsets of another length", "offsets on another device", "strided offsets", "a float16",
           "a off the alignment", "out float32", "out off the alignment", "out of another shape"}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_what_the_key_does_not_prove_is_read_and_checked(gpu_standins, reader, change):
    plan, a, b, offs = _planned()
    plan.execute(a, b, offs, out=_out())
    plan.execute(a, b, offs, out=_out())  # the fast path
    runs = len(gpu_standins["derive"])
    args = CHANGES[change](a, b, offs, _out())
    exports = sum(len(x.streams) for x in args)
    if change in REFUSED:
        with pytest.raises((NvblasltValueError, NvblasltTypeError)):
            plan.execute(*args[:3], out=args[3])
        assert len(gpu_standins["derive"]) == runs  # refused before any work
        plan.execute(a, b, offs, out=_out())  # a refused call leaves the plan's defaults and keys as they were
        assert gpu_standins["derive"][-1][3] == (B, A, OUT)
        return
    plan.execute(*args[:3], out=args[3])
    assert sum(len(x.streams) for x in args) > exports  # read: the checked path
    derived = gpu_standins["derive"][-1]
    assert derived[1] == (change == "64-bit offsets") and derived[2] == (88 if "total" in change else 40)
    again = CHANGES[change](a, b, offs, _out())
    plan.execute(*again[:3], out=again[3])  # now known: the fast path, the same values reach the kernel
    assert all(x.streams == [] for x in again if x is not a and x is not b and x is not offs)
    assert gpu_standins["derive"][-1][:3] == derived[:3]


def test_a_package_without_a_layout_reader_takes_the_checked_path_every_call(gpu_standins):
    plan, a, b, offs = _planned()
    for _ in range(3):
        plan.execute(a, b, offs, out=_out())
    assert len(a.streams) == 1 + 3 and len(gpu_standins["derive"]) == 3  # made, then each execute


def test_an_odd_argument_on_the_fast_path_is_named_by_the_checked_path(gpu_standins, reader):
    plan, a, b, offs = _planned()
    plan.execute(a, b, offs, out=_out())
    plan.execute(a, b, offs, out=_out())  # the fast path
    with pytest.raises(NvblasltValueError, match="out: its pointer is aligned to 2 bytes; this plan needs 64"):
        plan.execute(a, b, offs, out=_out(ptr=OUT + 2))
    with pytest.raises(NvblasltTypeError, match="offs: expected int32 or int64, got dtype float32"):
        plan.execute(a, b, FakeDLPack((4,), dtype="float32", ptr=OFFS), out=_out())


def test_another_threads_call_between_the_fast_paths_stores_never_runs_another_layouts_problem(gpu_standins, reader):
    # two threads share a plan (its launches are serialized): one thread's call may run while another is
    # between the writes that remember the layout found last, and must still run its own layout's problem
    class Interleaved(GroupedMatmul):
        between = None  # a call to make after the next write of the fast path's state

        def __setattr__(self, name, value):
            super().__setattr__(name, value)
            call = type(self).between
            if call is not None and name.startswith("_fast"):
                type(self).between = None
                call()

    a, b, offs, _ = operands()
    plan = Interleaved(a, b, offs)
    plan.plan()
    a88 = FakeDLPack((88, 64), dtype="bfloat16", ptr=A)
    for _ in range(2):  # both layouts checked, then each found once: 88 is the one found last
        plan.execute(a, b, offs, out=_out())
        plan.execute(a88, b, offs, out=_out(88))
    Interleaved.between = lambda: plan.execute(a, b, offs, out=_out(ptr=OUT2))
    plan.execute(a, b, offs, out=_out())
    assert Interleaved.between is None
    interleaved = [run for run in gpu_standins["derive"] if run[3][2] == OUT2]
    assert [run[2] for run in interleaved] == [40]  # 40 rows of a: never the 88 of the layout found before


# ---- out never overlaps an operand ------------------------------------------------------------------------------
A_BYTES = 40 * 64 * 2  # a (40, 64) bf16 at A
B_BYTES = 4 * 64 * 96 * 2  # b (4, 64, 96) bf16 at B
OUT_BYTES = 40 * 96 * 2  # the result, (40, 96) bf16
# where an out overlaps an operand, 256-byte aligned as the plan needs: a's last bytes, a's first, b's, offs's
OVERLAPPING = [(A + A_BYTES - 256, "a"), (A - OUT_BYTES + 256, "a"), (B + 0x100, "b"), (OFFS - 0x100, "offs")]
# where one touches an operand's first or last byte and no more
ADJACENT = [A + A_BYTES, A - OUT_BYTES, B + B_BYTES, B - OUT_BYTES, OFFS - OUT_BYTES]


@pytest.mark.parametrize("where, name", OVERLAPPING)
def test_an_out_overlapping_an_operand_is_refused_on_the_checked_and_the_fast_path(gpu_standins, reader, where,
                                                                                   name):
    """The GEMM would read what it writes: refused before anything is queued, on the first (checked) call of a
    layout and on a later call the layout key would otherwise take straight to the launch."""
    plan, a, b, offs = _planned()
    with pytest.raises(NvblasltValueError, match=f"^out: overlaps {name}; write to separate memory"):
        plan.execute(a, b, offs, out=_out(ptr=where))  # checked
    plan.execute(a, b, offs, out=_out())  # a good out: the layout key is kept
    launched = len(gpu_standins["matmul"])
    overlapping = _out(ptr=where)
    with pytest.raises(NvblasltValueError, match=f"^out: overlaps {name}"):
        plan.execute(a, b, offs, out=overlapping)  # the same layouts: the fast path
    assert overlapping.streams == []  # not exported: the fast path refused it, not the checked one
    assert len(gpu_standins["matmul"]) == launched  # nothing reached cuBLASLt


@pytest.mark.parametrize("where, name", OVERLAPPING)
def test_grouped_matmul_refuses_an_overlapping_out_on_its_checked_and_its_fast_path(gpu_standins, reader, where,
                                                                                    name):
    """The refused checked call has already keyed its layouts to the plan, so the next like call takes the
    fast path: it must refuse as well."""
    import nvblaslt

    a, b, offs, _ = operands()
    exported = []
    for _ in range(2):  # checked, then the function form's fast path
        with pytest.raises(NvblasltValueError, match=f"^out: overlaps {name}; write to separate memory"):
            nvblaslt.grouped_matmul(a, b, offs, out=_out(ptr=where))
        exported.append(len(a.streams))
    nvblaslt.grouped_matmul(a, b, offs, out=_out())  # a good out runs
    with pytest.raises(NvblasltValueError, match=f"^out: overlaps {name}"):
        nvblaslt.grouped_matmul(a, b, offs, out=_out(ptr=where))
    exported.append(len(a.streams))
    assert exported[0] == exported[1] == exported[2] > 0  # a read on the first call alone: then the fast path
    assert len(gpu_standins["matmul"]) == 1


@pytest.mark.parametrize("where", ADJACENT)
def test_an_out_right_beside_an_operand_is_not_an_overlap(gpu_standins, reader, where):
    plan, a, b, offs = _planned()
    out = _out(ptr=where)
    assert plan.execute(a, b, offs, out=out) is out and plan.execute(a, b, offs, out=out) is out
    import nvblaslt

    for _ in range(2):  # checked, then the function form's fast path
        assert nvblaslt.grouped_matmul(a, b, offs, out=out) is out
    assert len(gpu_standins["matmul"]) == 4


def test_an_out_overlapping_an_fp8_scale_is_refused_on_every_path(gpu_standins, reader):
    import nvblaslt

    a = FakeDLPack((40, 64), dtype="float8_e4m3fn", ptr=A)
    b = FakeDLPack((4, 64, 96), (96 * 64, 1, 64), dtype="float8_e4m3fn", ptr=B)  # K contiguous: TN
    offs = FakeDLPack((4,), dtype="int32", ptr=OFFS)
    out = _out()  # bfloat16, fp8's default result type
    for scale_name in ("scale_a", "scale_b"):
        # the result's last float32, and the one right before its first: the same pointer alignment (4 bytes),
        # so one layout key, and the second call of each kind takes the fast path
        apart = {scale_name: FakeDLPack((1,), ptr=OUT - 4)}
        plan = GroupedMatmul(a, b, offs)
        plan.plan()
        for call in (plan.execute, nvblaslt.grouped_matmul):
            for fast in (False, True):
                scale = {scale_name: FakeDLPack((1,), ptr=OUT + OUT_BYTES - 4)}
                with pytest.raises(NvblasltValueError, match=f"^out: overlaps {scale_name}; write to separate"):
                    call(a, b, offs, out=out, **scale)
                assert call(a, b, offs, out=out, **apart) is out
                assert (scale[scale_name].streams == []) == fast  # read (exported) on the checked path alone
    assert len(gpu_standins["matmul"]) == 8
