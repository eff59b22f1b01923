"""Grouped GEMM on the GPU (issue 24): every group against a float64 reference, on fresh random inputs.

Needs cuBLASLt 13.4 or newer (``NVBLASLT_LIBRARY`` pointing at a newer ``libcublasLt.so.13`` where the
machine's wheel is older; docs/internals.md says how on the GPU machine). With an older library only
the refusal is tested.
The layout math alone is tested without a GPU in tests/cpu/test_grouped.py.
"""

from __future__ import annotations

import ctypes

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

import nvblaslt  # noqa: E402
from nvblaslt import GroupedMatmul, NvblasltUnsupportedError, NvblasltValueError, grouped_matmul  # noqa: E402
from nvblaslt import _grouped_problem, _tuning_cache  # noqa: E402

from tests.cpu.test_grouped_torch import CASES as GRADIENT_CASES  # noqa: E402

TOL = {torch.bfloat16: 2e-2, torch.float16: 3e-3, torch.float32: 1e-5}


def _grouped_available() -> bool:
    return torch.cuda.is_available() and nvblaslt.library().version >= 130400


def _grouped_gpu() -> bool:
    return _grouped_available() and torch.cuda.get_device_capability()[0] in (9, 10, 11)


needs_grouped = pytest.mark.skipif("not _grouped_gpu()", reason="needs cuBLASLt 13.4 or newer (set "
                                   "NVBLASLT_LIBRARY; docs/guide/grouped.md) on a Hopper or Blackwell GPU")


def test_an_older_library_is_refused_before_any_call():
    if nvblaslt.library().version >= 130400:
        pytest.skip("the loaded cuBLASLt has grouped GEMM")
    a = torch.randn(8, 16, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2, 16, 8, device="cuda", dtype=torch.bfloat16)
    offs = torch.tensor([3, 8], device="cuda", dtype=torch.int32)
    with pytest.raises(NvblasltUnsupportedError, match=r"13\.4 or newer.*NVBLASLT_LIBRARY"):
        grouped_matmul(a, b, offs)


def _ends(sizes):
    return torch.tensor(sizes, device="cuda", dtype=torch.int32).cumsum(0).to(torch.int32)


def _operand(shape, dtype, layout):
    """Fresh random values of ``shape``; "col": each matrix transposed in memory (strides swapped)."""
    if layout == "row":
        return torch.randn(shape, device="cuda", dtype=torch.float32).to(dtype)
    swapped = (*shape[:-2], shape[-1], shape[-2])
    return torch.randn(swapped, device="cuda", dtype=torch.float32).to(dtype).transpose(-1, -2)


def _reference(form, a, b, ends, groups):
    a, b = a.double(), b.double()
    if form == "3d3d":
        return torch.bmm(a, b)
    ends = ends.tolist()
    starts = [0, *ends[:-1]]
    if form == "2d3d":
        return torch.cat([a[s:e] @ b[g] for g, (s, e) in enumerate(zip(starts, ends))])
    if form == "3d2d":
        return torch.cat([a[g] @ b[:, s:e] for g, (s, e) in enumerate(zip(starts, ends))], dim=1)
    return torch.stack([a[:, s:e] @ b[s:e] for s, e in zip(starts, ends)])


def _check(got, want, dtype):
    assert not torch.isnan(got).any(), "NaN in the result (an element never written?)"
    scale = want.abs().max().clamp_min(1.0)
    error = ((got.double() - want).abs().max() / scale).item()
    assert error <= TOL[dtype], f"max error {error:.3g} relative to the largest value, over {TOL[dtype]}"


SIZES = {1: [96], 4: [40, 0, 72, 16], 8: [24, 64, 0, 8, 120, 0, 40, 32]}


@needs_grouped
@pytest.mark.parametrize("groups", [1, 4, 8])
@pytest.mark.parametrize("layouts", [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")])
@pytest.mark.parametrize("form", ["2d3d", "3d2d", "2d2d", "3d3d"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_group_matches_a_float64_reference(dtype, form, layouts, groups):
    torch.manual_seed(groups * 31 + len(form))
    sizes = SIZES[groups]
    total, (m, n, k) = sum(sizes), (48, 64, 80)
    shapes = {"2d3d": ((total, k), (groups, k, n)), "3d2d": ((groups, m, k), (k, total)),
              "2d2d": ((m, total), (total, n)), "3d3d": ((groups, m, k), (groups, k, n))}[form]
    a, b = _operand(shapes[0], dtype, layouts[0]), _operand(shapes[1], dtype, layouts[1])
    ends = _ends(sizes)
    offs = None if form == "3d3d" else ends
    out = grouped_matmul(a, b, offs, check_offsets=True)
    assert isinstance(out, torch.Tensor) and out.dtype == dtype
    _check(out, _reference(form, a, b, ends, groups), dtype)


@needs_grouped
@pytest.mark.parametrize("n", [56, 52])  # rows of 16-byte multiples (dense), and rows padded to 16 bytes
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])  # 2- and 4-byte elements
def test_a_weight_gradient_writes_zeros_for_its_empty_groups_into_a_nan_filled_result(out_dtype, n):
    # only the empty groups' matrices are cleared (after the GEMM): every other element is the GEMM's
    torch.manual_seed(3)
    m = 40
    plan = None
    for sizes in ([0, 24, 0, 40, 16, 0], [32, 0, 8, 0, 0, 24]):  # the same plan, other groups empty
        ends = _ends(sizes)
        a = _operand((m, sum(sizes)), torch.bfloat16, "col")
        b = _operand((sum(sizes), n), torch.bfloat16, "col")  # its lead ΣK: aligned for any n
        if plan is None:
            plan = GroupedMatmul(a, b, ends, out_dtype=out_dtype)
            plan.plan()
        out = torch.empty_strided((len(sizes), m, n), _grouped_problem.padded_strides((len(sizes), m, n),
                                  out_dtype.itemsize), device="cuda", dtype=out_dtype).fill_(float("nan"))
        assert plan.execute(a, b, ends, out=out, check_offsets=True) is out
        _check(out, _reference("2d2d", a, b, ends, len(sizes)), torch.bfloat16)
        for g, size in enumerate(sizes):
            if size == 0:
                assert int(torch.count_nonzero(out[g])) == 0, f"group {g} (empty) is not all zeros"
    plan.free()


@needs_grouped
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_fp8_experts_with_per_tensor_scales_match_float64(out_dtype):
    from nvblaslt import CublasLtError

    torch.manual_seed(11)
    sizes = [48, 0, 112, 64, 32]
    ends, k, n = _ends(sizes), 128, 96
    x = torch.randn(sum(sizes), k, device="cuda").to(torch.float8_e4m3fn)
    w = (torch.randn(len(sizes), n, k, device="cuda") * 0.5).to(torch.float8_e4m3fn)  # (G, N, K): K contiguous
    scale_a, scale_b = torch.tensor([0.25], device="cuda"), torch.tensor(3.0, device="cuda")
    out = grouped_matmul(x, w.transpose(1, 2), ends, out_dtype=out_dtype, scale_a=scale_a, scale_b=scale_b,
                         check_offsets=True)
    assert out.dtype == out_dtype
    want = _reference("2d3d", x, w.transpose(1, 2), ends, len(sizes)) * 0.75
    _check(out, want, torch.bfloat16)
    scale_a.fill_(1.0)  # read on the GPU when the GEMM runs: the same cached plan follows the new value
    _check(grouped_matmul(x, w.transpose(1, 2), ends, out_dtype=out_dtype, scale_a=scale_a, scale_b=scale_b),
           want * 4, torch.bfloat16)
    _check(grouped_matmul(x, w.transpose(1, 2), ends, out_dtype=out_dtype), want / 0.75, torch.bfloat16)
    if torch.cuda.get_device_capability()[0] == 9:  # Hopper's fp8 kernels need K contiguous in both operands
        with pytest.raises(CublasLtError, match="CUBLAS_STATUS_NOT_SUPPORTED"):
            grouped_matmul(x, w.transpose(1, 2).contiguous(), ends)


@needs_grouped
@pytest.mark.parametrize("a_type, b_type", [(torch.float8_e5m2, torch.float8_e4m3fn),
                                            (torch.float8_e4m3fn, torch.float8_e5m2)])
def test_fp8_with_e5m2_in_either_operand_matches_float64(a_type, b_type):
    """An fp8 gradient (E5M2) times fp8 weights (E4M3), and the other way round, scaled; each on a plan of its own."""
    torch.manual_seed(12)
    sizes = [64, 0, 96, 32]
    ends, k, n = _ends(sizes), 256, 128
    x = torch.randn(sum(sizes), k, device="cuda").to(a_type)
    w = (torch.randn(len(sizes), n, k, device="cuda") * 0.5).to(b_type)
    scale_b = torch.tensor([2.0], device="cuda")
    out = grouped_matmul(x, w.transpose(1, 2), ends, out_dtype=torch.float32, scale_b=scale_b, check_offsets=True)
    _check(out, _reference("2d3d", x, w.transpose(1, 2), ends, len(sizes)) * 2, torch.bfloat16)
    with pytest.raises(NvblasltUnsupportedError, match="float8_e5m2 × float8_e5m2"):
        grouped_matmul(x.to(torch.float8_e5m2), w.transpose(1, 2).to(torch.float8_e5m2), ends)


@needs_grouped
def test_the_derive_kernel_writes_what_the_host_reference_says():
    torch.manual_seed(1)
    a = torch.randn(50, 32, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(3, 32, 16, device="cuda", dtype=torch.bfloat16)
    offs = torch.tensor([10, 10, 50], device="cuda", dtype=torch.int32)
    plan = GroupedMatmul(a, b, offs)
    plan.plan()
    out = plan.execute()
    torch.cuda.synchronize()
    arrays = plan._arrays
    words = (ctypes.c_longlong * (12 * 3))()
    from nvblaslt._cuda import cudart, check

    check(cudart.cudaMemcpy(ctypes.addressof(words), arrays.shapes, ctypes.sizeof(words),
                            cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost), "cudaMemcpy")
    problem = plan._problem
    reference = _grouped_problem.reference_arrays(problem, [10, 10, 50])
    bases = (b.data_ptr(), a.data_ptr(), out.data_ptr())
    for x, name in enumerate(("a", "b", "d")):
        matrix = getattr(problem, name)
        for g, (rows, cols, ld, offset) in enumerate(reference[name]):
            assert words[(3 * x) * 3 + g] == rows and words[(3 * x + 1) * 3 + g] == cols
            assert words[(3 * x + 2) * 3 + g] == ld
            assert words[9 * 3 + x * 3 + g] == bases[x] + offset * matrix.dtype.itemsize
    plan.free()


@needs_grouped
def test_a_plan_runs_again_with_new_offsets_and_a_new_token_count():
    torch.manual_seed(2)
    w = torch.randn(4, 64, 32, device="cuda", dtype=torch.bfloat16)  # (G, N, K) as nn.Linear keeps weights
    b = w.transpose(1, 2)
    a1 = torch.randn(100, 32, device="cuda", dtype=torch.bfloat16)
    plan = GroupedMatmul(a1, b, _ends([10, 20, 30, 40]))
    plan.plan()
    for sizes in ([10, 20, 30, 40], [0, 0, 7, 300], [77, 1, 1, 1]):
        a = torch.randn(sum(sizes), 32, device="cuda", dtype=torch.bfloat16)
        ends = _ends(sizes)
        _check(plan.execute(a, b, ends), _reference("2d3d", a, b, ends, 4), torch.bfloat16)
    with pytest.raises(NvblasltValueError, match="differ in more than the ragged extent"):
        plan.execute(torch.randn(10, 16, device="cuda", dtype=torch.bfloat16), torch.randn(4, 16, 64, device="cuda",
                     dtype=torch.bfloat16), _ends([1, 2, 3, 4]))


def _nan_filled(shape, dtype=torch.bfloat16):
    """A result array whose every element must be written: NaN until then, rows on 16 bytes."""
    return torch.empty_strided(shape, _grouped_problem.padded_strides(shape, dtype.itemsize), device="cuda",
                               dtype=dtype).fill_(float("nan"))


@needs_grouped
@pytest.mark.parametrize("into", [False, True], ids=["new result", "out="])
def test_execute_s_fast_path_after_new_offsets_a_layout_change_and_back(into):
    # execute() reads pointers alone for layouts a checked call passed: results on fresh inputs each call, through
    # new offsets values (the same key) and another token total (a new key: checked, then fast); a column-major a
    # is another problem, refused by name, and the plan runs on after it
    torch.manual_seed(5)
    w = torch.randn(4, 64, 32, device="cuda", dtype=torch.bfloat16)
    b = w.transpose(1, 2)
    first = torch.randn(96, 32, device="cuda", dtype=torch.bfloat16)
    plan = GroupedMatmul(first, b, _ends([24, 24, 24, 24]))
    plan.plan()
    calls = [(96, "row", [24, 24, 24, 24]), (96, "row", [0, 90, 3, 3]), (96, "row", [96, 0, 0, 0]),
             (160, "row", [10, 50, 0, 100]), (160, "row", [40, 40, 40, 40]), (96, "col", [1, 2, 3, 90]),
             (96, "col", [30, 30, 30, 6]), (96, "row", [5, 5, 5, 81])]
    for tokens, layout, sizes in calls:
        a = _operand((tokens, 32), torch.bfloat16, layout)
        ends = _ends(sizes)
        out = _nan_filled((tokens, 64)) if into else None
        if layout == "col":
            with pytest.raises(NvblasltValueError, match="differ in more than the ragged extent"):
                plan.execute(a, b, ends, out=out)
            continue
        got = plan.execute(a, b, ends, out=out)
        assert got is out or out is None
        _check(got, _reference("2d3d", a, b, ends, 4), torch.bfloat16)  # NaN-free: every element written
    assert len(plan._fast) == 2  # one key per layout: 96 row, 160 row
    with pytest.raises(NvblasltValueError, match="out: expected a bfloat16 array of shape"):
        plan.execute(a, b, ends, out=_nan_filled((96, 64), torch.float32))  # not what a key proved: checked
    offs64 = _ends([20, 20, 20, 36]).to(torch.int64)  # 64-bit offsets: another key, read as 64-bit on the GPU
    for _ in range(2):
        a = _operand((96, 32), torch.bfloat16, "row")
        _check(plan.execute(a, b, offs64, out=_nan_filled((96, 64)) if into else None),
               _reference("2d3d", a, b, offs64, 4), torch.bfloat16)


@needs_grouped
def test_execute_with_its_defaults_after_a_fast_call_runs_that_calls_arrays():
    torch.manual_seed(6)
    a = torch.randn(64, 32, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2, 32, 48, device="cuda", dtype=torch.bfloat16)
    plan = GroupedMatmul(a, b, _ends([32, 32]))
    plan.plan()
    plan.execute(a, b, _ends([32, 32]))  # checked: the key is known from here
    a2, ends2 = torch.randn(64, 32, device="cuda", dtype=torch.bfloat16), _ends([60, 4])
    plan.execute(a2, b, ends2)  # the fast path
    _check(plan.execute(), _reference("2d3d", a2, b, ends2, 2), torch.bfloat16)
    plan.autotune(iterations=1, remember=False)  # reads the fast call's arrays as the checked path would
    _check(plan.execute(out=_nan_filled((64, 48))), _reference("2d3d", a2, b, ends2, 2), torch.bfloat16)


@needs_grouped
def test_autotune_times_every_algorithm_and_keeps_the_results_right(monkeypatch, tmp_path):
    monkeypatch.setenv("NVBLASLT_CACHE_DIR", str(tmp_path))  # the choice is remembered: not in the user's cache
    torch.manual_seed(3)
    a = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4, 384, 256, device="cuda", dtype=torch.bfloat16)
    ends = _ends([128, 0, 256, 128])
    plan = GroupedMatmul(a, w.transpose(1, 2), ends)
    found = plan.plan(limit=8)
    out = torch.full((512, 384), float("nan"), device="cuda", dtype=torch.bfloat16)
    plan.execute(out=out)
    before = out.clone()
    timed = plan.autotune(iterations=3)
    torch.cuda.synchronize()
    assert torch.equal(out, before), "autotune wrote into the caller's result"
    assert {r.as_bytes() for r, _ in timed} <= {r.as_bytes() for r in found} and timed
    # the choice first (the heuristics' first pick stays unless another beats it in a duel: it may have timed
    # a little slower), then the others fastest first
    rest = [ms for _, ms in timed[1:]]
    assert rest == sorted(rest) and timed[0][1] > 0
    assert plan.algorithm is timed[0][0]
    _check(plan.execute(), _reference("2d3d", a, w.transpose(1, 2), ends, 4), torch.bfloat16)
    again = GroupedMatmul(a, w.transpose(1, 2), ends)  # the same problem: the tuning cache's choice comes first
    assert again.plan()[0].as_bytes() == timed[0][0].as_bytes()


@needs_grouped
def test_the_search_screens_beyond_the_heuristics_and_keeps_the_results_right(monkeypatch, tmp_path):
    """``autotune(search=True)``: candidates the heuristics did not return are screened, what is chosen
    runs right on new offsets, the caller's arrays are never written, and a later plan recalls the choice."""
    monkeypatch.setenv("NVBLASLT_CACHE_DIR", str(tmp_path))
    torch.manual_seed(5)
    a = torch.randn(1024, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(8, 256, 512, device="cuda", dtype=torch.bfloat16)
    ends = _ends([128, 0, 256, 64, 192, 128, 0, 256])
    plan = GroupedMatmul(a, w.transpose(1, 2), ends)
    planned = plan.plan(limit=4)
    out = torch.full((1024, 256), float("nan"), device="cuda", dtype=torch.bfloat16)
    plan.execute(out=out)
    before = out.clone()
    timed = plan.autotune(iterations=3, search=True, budget_s=4.0)
    torch.cuda.synchronize()
    assert torch.equal(out, before), "the search wrote into the caller's result"
    report = plan.tuning_report
    assert report.searched and report.heuristics == len(planned)
    assert report.screened > 0, f"nothing beyond the heuristics' {len(planned)} was screened: {report}"
    assert plan.algorithm is timed[0][0] and report.chosen == _tuning_cache.describe_algorithm(timed[0][0])
    assert len({r.as_bytes() for r, _ in timed}) == len(timed) > len(planned)
    other = _ends([0, 300, 12, 200, 0, 256, 100, 156])  # new offsets on the searched kernel
    _check(plan.execute(a, w.transpose(1, 2), other), _reference("2d3d", a, w.transpose(1, 2), other, 8),
           torch.bfloat16)
    again = GroupedMatmul(a, w.transpose(1, 2), ends)
    assert again.plan()[0].as_bytes() == timed[0][0].as_bytes(), "the searched choice was not recalled"


@needs_grouped
def test_a_step_under_the_torch_autotune_context_tunes_the_experts_three_gemms(monkeypatch, tmp_path):
    """GroupedLinear's forward and its two gradients (2d×3d, 2d×3d, 2d×2d), run inside
    ``nvblaslt.torch.autotune()``, are timed and remembered; a plan of each problem made afterwards
    recalls the pick; and the gradients stay right."""
    from nvblaslt.torch import GroupedLinear, autotune

    monkeypatch.setenv("NVBLASLT_CACHE_DIR", str(tmp_path))
    nvblaslt.clear_grouped_plans()
    torch.manual_seed(4)
    layer = GroupedLinear(4, 64, 96, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    ends = _ends([64, 0, 128, 64])
    with autotune(iterations=2):
        layer(x, ends).square().sum().backward()
    torch.cuda.synchronize()
    w = layer.weight.detach()
    grad = (2 * layer(x, ends)).detach()
    # the weight gradient in the weight's own (G, N, K) order: gradᵀ @ x per group
    for a, b in ((x.detach(), w.transpose(1, 2)), (grad, w), (grad.T, x.detach())):
        with GroupedMatmul(a, b, ends) as plan:
            tuned, _ = _tuning_cache.recall(plan._launch)
            assert tuned is not None, f"not remembered: {tuple(a.shape)} @ {tuple(b.shape)}"
            assert plan.plan()[0].as_bytes() == tuned.as_bytes()
    want = _reference("2d3d", x.detach(), w.transpose(1, 2), ends, 4)
    _check(layer(x, ends), want, torch.bfloat16)


@needs_grouped
def test_bad_offsets_are_refused_by_the_debug_check_and_never_reach_outside():
    a = torch.randn(20, 16, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2, 16, 8, device="cuda", dtype=torch.bfloat16)
    for offs, message in (([15, 5], "out of order"), ([5, 25], "past the operand"), ([5, 12], "last offset")):
        with pytest.raises(NvblasltValueError, match=message):
            grouped_matmul(a, b, torch.tensor(offs, device="cuda", dtype=torch.int32), check_offsets=True)
    # unchecked, the same offsets are clamped: no fault, and the groups inside the operand are right
    out = grouped_matmul(a, b, torch.tensor([5, 25], device="cuda", dtype=torch.int32))
    torch.cuda.synchronize()
    _check(out[:5], a[:5].double() @ b[0].double(), torch.bfloat16)


MISALIGNED = """
import torch, nvblaslt
storage = torch.randn(40 * 32 + 1, device="cuda", dtype=torch.bfloat16)
a = storage[1:].view(40, 32)  # 2 bytes past an aligned address
b = torch.randn(2, 32, 16, device="cuda", dtype=torch.bfloat16)
ends = torch.tensor([17, 40], device="cuda", dtype=torch.int32)
try:
    out = nvblaslt.grouped_matmul(a, b, ends)
except nvblaslt.CublasLtError as error:
    print("refused", error.status_name)
else:
    want = torch.cat([a[:17].double() @ b[0].double(), a[17:].double() @ b[1].double()])
    torch.cuda.synchronize()
    print("ran", float((out.double() - want).abs().max() / want.abs().max()))
"""


@needs_grouped
def test_misaligned_operands_run_right_or_are_refused():
    # in a fresh process: a kernel that faulted on a misaligned address would poison this one's context
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", MISALIGNED], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    verdict = done.stdout.split()
    assert verdict[0] in ("refused", "ran"), done.stdout
    if verdict[0] == "refused":
        assert verdict[1] == "CUBLAS_STATUS_NOT_SUPPORTED"
    else:
        assert float(verdict[1]) <= TOL[torch.bfloat16]


@needs_grouped
def test_a_boundary_off_16_bytes_along_memory_is_refused_by_the_debug_check():
    a = torch.randn(3, 16, 32, device="cuda", dtype=torch.bfloat16)   # 3-D × 2-D: N runs along memory
    b = torch.randn(32, 40, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(NvblasltValueError, match="multiple of 16 bytes"):
        grouped_matmul(a, b, torch.tensor([8, 13, 40], device="cuda", dtype=torch.int32), check_offsets=True)
    out = grouped_matmul(a, b, torch.tensor([8, 16, 40], device="cuda", dtype=torch.int32), check_offsets=True)
    _check(out, _reference("3d2d", a, b, torch.tensor([8, 16, 40]), 3), torch.bfloat16)


@needs_grouped
def test_float32_results_and_out():
    a = torch.randn(30, 16, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(3, 16, 24, device="cuda", dtype=torch.bfloat16)
    ends = _ends([5, 15, 10])
    out = torch.full((30, 24), float("nan"), device="cuda", dtype=torch.float32)
    assert grouped_matmul(a, b, ends, out_dtype=torch.float32, out=out) is out
    _check(out, _reference("2d3d", a, b, ends, 3), torch.bfloat16)


@needs_grouped
def test_a_cuda_graph_replays_with_new_offsets_written_into_the_same_array():
    a = torch.randn(64, 32, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4, 32, 48, device="cuda", dtype=torch.bfloat16)
    offs = _ends([16, 16, 16, 16])
    plan = GroupedMatmul(a, b, offs)
    plan.plan()
    out = torch.empty(64, 48, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    plan.execute(out=out)  # warm, on the default stream: the kernel is loaded before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        plan.execute(out=out, stream=torch.cuda.current_stream())
    assert plan._captured
    for sizes in ([64, 0, 0, 0], [1, 2, 3, 58], [16, 16, 16, 16]):
        offs.copy_(_ends(sizes))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(out, _reference("2d3d", a, b, offs, 4), torch.bfloat16)
    with pytest.raises(nvblaslt.NvblasltStateError, match="check_offsets"):
        with torch.cuda.graph(torch.cuda.CUDAGraph(), stream=stream):
            plan.execute(out=out, stream=torch.cuda.current_stream(), check_offsets=True)


@needs_grouped
def test_cupy_operands_come_back_as_cupy():
    cupy = pytest.importorskip("cupy")
    a = cupy.random.standard_normal((24, 16), dtype=cupy.float32).astype(cupy.float16)
    b = cupy.random.standard_normal((2, 16, 8), dtype=cupy.float32).astype(cupy.float16)
    offs = cupy.asarray([10, 24], dtype=cupy.int32)
    out = grouped_matmul(a, b, offs)
    cupy.cuda.get_current_stream().synchronize()
    assert isinstance(out, cupy.ndarray)
    want = cupy.concatenate([a[:10].astype(cupy.float64) @ b[0].astype(cupy.float64),
                             a[10:].astype(cupy.float64) @ b[1].astype(cupy.float64)])
    assert float(cupy.abs(out.astype(cupy.float64) - want).max()) <= 3e-3 * max(1.0, float(cupy.abs(want).max()))


@needs_grouped
@pytest.mark.parametrize("name, groups, k, n", [("mixtral", 8, 4096, 14336), ("qwen3-30b-a3b", 128, 2048, 768),
                                                ("deepseek-v3", 256, 7168, 2048)])
def test_the_issue_expert_shapes_with_skewed_routing(name, groups, k, n):
    torch.manual_seed(groups)
    tokens = 8192
    weights = torch.rand(groups, device="cuda") ** 4  # skewed, some experts nearly empty
    sizes = (weights / weights.sum() * tokens).floor().long()
    sizes[1] = 0  # an empty expert
    sizes[0] += tokens - int(sizes.sum())
    a = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(groups, n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    ends = sizes.cumsum(0).to(torch.int32)
    out = grouped_matmul(a, w.transpose(1, 2), ends, check_offsets=True)
    starts = [0, *ends.tolist()[:-1]]
    for g in range(0, groups, max(1, groups // 8)):  # a sample of groups: float64 over all is slow
        s, e = starts[g], int(ends[g])
        if e > s:
            _check(out[s:e], a[s:e].double() @ w[g].double().T, torch.bfloat16)


@needs_grouped
def test_the_torch_op_trains_experts_against_float64():
    from nvblaslt.torch import GroupedLinear

    torch.manual_seed(7)
    experts = GroupedLinear(4, 64, 96, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(200, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    offs = _ends([40, 0, 100, 60])
    out = experts(x, offs)
    out.sum().backward()  # an expanded gradient (zero strides) reaches the backward GEMMs
    x64, w64 = x.detach().double().requires_grad_(), experts.weight.detach().double().requires_grad_()
    want = torch.cat([x64[0:40] @ w64[0].T, x64[40:140] @ w64[2].T, x64[140:200] @ w64[3].T])
    want.sum().backward()
    _check(out, want.detach(), torch.bfloat16)
    _check(x.grad, x64.grad, torch.bfloat16)
    _check(experts.weight.grad, w64.grad, torch.bfloat16)
    assert experts.weight.grad[1].abs().max() == 0


@needs_grouped
@pytest.mark.parametrize("form, a_kind, b_kind, out_dtype", GRADIENT_CASES)
@pytest.mark.parametrize("upstream", ["random", "expanded"])
def test_no_gradient_asks_more_alignment_of_the_offsets_than_the_forward(form, a_kind, b_kind, out_dtype, upstream):
    """The CPU test's grid (tests/cpu/test_grouped_torch.py, there with cuBLASLt's alignment rule emulated)
    on the real library: offsets that start groups off 16 bytes, which the forward of each case takes, give
    right gradients too, against float64, whatever the inputs' layouts and the upstream gradient."""
    from nvblaslt.torch import grouped_mm

    torch.manual_seed(len(form) * 7 + len(a_kind) + len(b_kind))
    n = 1 if form.endswith("n=1") else 96
    form = form.split()[0]
    sizes = [20, 0, 36, 12] if form == "3d2d" else [19, 0, 36, 13]  # groups start off 16 bytes (bf16)
    ends = _ends(sizes)
    total, groups, m, k = sum(sizes), len(sizes), 48, 64
    shapes = {"2d3d": ((total, k), (groups, k, n)), "2d2d": ((m, total), (total, n)),
              "3d2d": ((groups, m, k), (k, total))}[form]
    make = {"row": lambda shape: _operand(shape, torch.bfloat16, "row"),
            "transposed": lambda shape: _operand(shape, torch.bfloat16, "col"),
            "expanded": lambda shape: torch.randn(shape[-2], 1, device="cuda").to(torch.bfloat16).expand(*shape)}
    a = make[a_kind](shapes[0]).detach().requires_grad_()
    b = make[b_kind](shapes[1]).detach().requires_grad_()
    out = grouped_mm(a, b, ends, out_dtype=out_dtype)
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    want = _reference(form, a64, b64, ends, groups)
    _check(out, want.detach(), out.dtype)
    grad = torch.ones((), device="cuda", dtype=out.dtype).expand(out.shape) if upstream == "expanded" \
        else torch.randn_like(out)
    got = torch.autograd.grad(out, (a, b), grad)
    expected = torch.autograd.grad(want, (a64, b64), grad.double())
    for g, w in zip(got, expected):
        assert g.shape == w.shape
        _check(g, w, torch.bfloat16)


@needs_grouped
def test_the_torch_op_under_compile_fullgraph_and_in_a_cuda_graph():
    from nvblaslt.torch import GroupedLinear, grouped_mm

    torch.manual_seed(8)
    experts = GroupedLinear(4, 64, 96, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(160, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    offs = _ends([32, 0, 64, 64])
    eager = experts(x, offs)
    eager_grads = torch.autograd.grad(eager.float().square().sum(), (x, experts.weight))
    compiled = torch.compile(lambda x, offs: experts(x, offs), fullgraph=True)
    out = compiled(x, offs)
    grads = torch.autograd.grad(out.float().square().sum(), (x, experts.weight))
    assert torch.equal(out, eager)  # the same cuBLASLt calls
    for got, want in zip(grads, eager_grads):
        assert torch.equal(got, want)
    # a CUDA graph: the plan is made by a call before the capture, then replayed with new offsets
    w = experts.weight.detach().transpose(1, 2)
    static_x = x.detach().clone()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        grouped_mm(static_x, w, offs)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        static_out = grouped_mm(static_x, w, offs)
    for sizes in ([160, 0, 0, 0], [8, 8, 8, 136]):
        offs.copy_(_ends(sizes))
        graph.replay()
        torch.cuda.synchronize()
        _check(static_out, _reference("2d3d", static_x, w, offs, 4), torch.bfloat16)


def test_host_offsets_are_refused_by_name():
    a = torch.randn(8, 16, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2, 16, 8, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(NvblasltValueError, match="offs: expected an array on the GPU"):
        grouped_matmul(a, b, torch.tensor([3, 8], dtype=torch.int32))


@needs_grouped
def test_the_moe_example_on_cublaslt():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(root / "examples" / "moe_experts.py")], capture_output=True, text=True,
                          timeout=300, cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    for line in ("grouped GEMMs on cuda (cuBLASLt), torch.bfloat16", "the empty expert's weight gradients are zero: "
                 "True", "all checks passed: True"):
        assert line in done.stdout, done.stdout


COEXIST = """
import os, torch, nvblaslt
a = torch.randn(64, 32, device="cuda", dtype=torch.bfloat16)
w = torch.randn(2, 32, 48, device="cuda", dtype=torch.bfloat16)
offs = torch.tensor([16, 64], device="cuda", dtype=torch.int32)
torch_out = torch.cat([a[:16] @ w[0], a[16:] @ w[1]])      # torch's own cuBLAS(Lt)
ours = nvblaslt.grouped_matmul(a, w, offs)                  # the newer one nvblaslt loaded
plain = nvblaslt.matmul(a, w[0])
torch.cuda.synchronize()
libs = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libcublasLt.so" in line})
print(len(libs), nvblaslt.library().path in libs, float((ours.float() - torch_out.float()).abs().max()),
      float((plain.float() - a.float() @ w[0].float()).abs().max()))
"""


@needs_grouped
def test_the_newer_library_sits_beside_torchs_own():
    import os
    import subprocess
    import sys

    if not os.environ.get("NVBLASLT_LIBRARY"):
        pytest.skip("the machine's own cuBLAS has grouped GEMM: nothing to load beside it")
    done = subprocess.run([sys.executable, "-c", COEXIST], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    count, ours_loaded, grouped_error, plain_error = done.stdout.split()
    assert int(count) == 2 and ours_loaded == "True", done.stdout  # torch's copy and nvblaslt's, both mapped
    assert float(grouped_error) <= 0.25 and float(plain_error) <= 0.25, done.stdout  # bf16 rounding of |x| ~ 10


@needs_grouped
def test_an_out_overlapping_an_operand_is_refused_and_a_separate_one_is_right():
    """out= sharing memory with a (a view of the same storage) is refused on grouped_matmul's checked and fast
    paths and on GroupedMatmul.execute()'s, before anything is queued; a separate out gets the float64 result."""
    generator = torch.Generator(device="cuda").manual_seed(3)
    storage = torch.randn(2 * 64 * 64, device="cuda", dtype=torch.bfloat16, generator=generator)
    a = storage[: 64 * 64].view(64, 64)
    weights = torch.randn(4, 64, 64, device="cuda", dtype=torch.bfloat16, generator=generator)  # (G, N, K)
    offs = torch.tensor([16, 32, 48, 64], device="cuda", dtype=torch.int32)
    overlapping = storage[32 * 64: 96 * 64].view(64, 64)  # a's second half and the memory after it
    expected = torch.cat([a[s:s + 16].double() @ weights[g].double().T for g, s in enumerate(range(0, 64, 16))])
    weights = weights.transpose(1, 2)  # (G, K, N), as nn.Linear's weights enter
    before = a.clone()
    for _ in range(2):  # checked, then the fast path
        with pytest.raises(NvblasltValueError, match="^out: overlaps a"):
            grouped_matmul(a, weights, offs, out=overlapping)
        out = torch.empty(64, 64, device="cuda", dtype=torch.bfloat16)
        assert grouped_matmul(a, weights, offs, out=out) is out
        torch.testing.assert_close(out.double(), expected, atol=0.1, rtol=0.02)
    plan = GroupedMatmul(a, weights, offs)
    plan.plan()
    for _ in range(2):
        plan.execute(a, weights, offs, out=torch.empty(64, 64, device="cuda", dtype=torch.bfloat16))
        with pytest.raises(NvblasltValueError, match="^out: overlaps a"):
            plan.execute(a, weights, offs, out=overlapping)
    torch.cuda.synchronize()
    assert torch.equal(a, before)  # nothing ran on the refused calls
    plan.free()
