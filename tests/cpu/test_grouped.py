"""Grouped GEMM without a GPU: the layout every group gets, checked by running cuBLASLt's column-major
semantics in NumPy on the very arrays, offsets and pointers the GPU kernel derives; argument checks;
the grouped descriptors against the real library; the derive kernel compiles."""

import ctypes
import types

import numpy as np
import pytest

from nvblaslt import _grouped_problem, _operands
from nvblaslt._errors import NvblasltTypeError, NvblasltUnsupportedError, NvblasltValueError


def op(array, name="x"):
    return _operands.read(array, name, 0)


def _strided(pointer: int, itemsize: int, rows: int, cols: int, ld: int) -> np.ndarray:
    """The column-major (rows × cols, lead ld) float16 matrix at ``pointer``, as cuBLASLt reads it."""
    first = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_uint16)), shape=(1,)).view(np.float16)
    return np.lib.stride_tricks.as_strided(first, shape=(rows, cols), strides=(itemsize, ld * itemsize))


def emulate(problem, a, b, offs) -> np.ndarray:
    """The result as cuBLASLt computes it from the per-group arrays (D = op(A) · op(B), column-major),
    into a float64 array laid out as the result (offsets in elements do not depend on the dtype)."""
    span = 1 + sum((n - 1) * s for n, s in zip(problem.out_shape, problem.out_strides)) if all(problem.out_shape) else 0
    flat = np.full(max(span, 1), np.nan)
    out = np.lib.stride_tricks.as_strided(flat, problem.out_shape, [8 * s for s in problem.out_strides])
    arrays = _grouped_problem.reference_arrays(problem, offs)
    a_ptr, b_ptr = a.__array_interface__["data"][0], b.__array_interface__["data"][0]
    for (ra, ca, lda, oa), (rb, cb, ldb, ob), (rd, cd, ldd, od) in zip(arrays["a"], arrays["b"], arrays["d"]):
        cublas_a = _strided(b_ptr + 2 * oa, 2, ra, ca, lda).astype(np.float64)
        cublas_b = _strided(a_ptr + 2 * ob, 2, rb, cb, ldb).astype(np.float64)
        op_a = cublas_a.T if problem.transa else cublas_a
        op_b = cublas_b.T if problem.transb else cublas_b
        assert op_a.shape[1] == op_b.shape[0]
        d = op_a @ op_b
        assert d.shape == (rd, cd)
        for j in range(cd):  # column-major store with lead ldd
            flat[od + j * ldd: od + j * ldd + rd] = d[:, j]
    return out


def expected(form, a, b, offs, groups):
    a, b = a.astype(np.float64), b.astype(np.float64)
    ends = list(offs) if offs is not None else None
    starts = [0, *ends[:-1]] if ends is not None else None
    if form == "2d3d":
        return np.concatenate([a[s:e] @ b[g] for g, (s, e) in enumerate(zip(starts, ends))])
    if form == "3d2d":
        return np.concatenate([a[g] @ b[:, s:e] for g, (s, e) in enumerate(zip(starts, ends))], axis=1)
    if form == "2d2d":
        return np.stack([a[:, s:e] @ b[s:e] for s, e in zip(starts, ends)])
    return np.stack([a[g] @ b[g] for g in range(groups)])


def _random(rng, shape, layout):
    """float16 values of ``shape``; layout "row" (C order), "col" (each matrix transposed in memory)."""
    values = rng.standard_normal(shape).astype(np.float16)
    if layout == "row":
        return values
    swapped = np.ascontiguousarray(np.swapaxes(values, -1, -2))
    return np.swapaxes(swapped, -1, -2)


# boundaries on 16 bytes (8 float16 elements): where the ragged extent runs along memory, plans assume it
SIZES = {1: [16], 3: [8, 0, 24], 5: [8, 16, 0, 8, 32]}


@pytest.mark.parametrize("groups", [1, 3, 5])
@pytest.mark.parametrize("a_layout", ["row", "col"])
@pytest.mark.parametrize("b_layout", ["row", "col"])
@pytest.mark.parametrize("form", ["2d3d", "3d2d", "2d2d", "3d3d"])
def test_every_group_is_laid_out_as_its_matrices_are(form, a_layout, b_layout, groups):
    rng = np.random.default_rng(groups * 7 + len(form))
    sizes = SIZES[groups]
    total = sum(sizes)
    m, n, k = 8, 16, 24  # 16-byte rows: what cuBLASLt's grouped kernels need
    ends = np.cumsum(sizes).astype(np.int32)
    offs = ends
    a_shape, b_shape = {"2d3d": ((total, k), (groups, k, n)), "3d2d": ((groups, m, k), (k, total)),
                        "2d2d": ((m, total), (total, n)), "3d3d": ((groups, m, k), (groups, k, n))}[form]
    a, b = _random(rng, a_shape, a_layout), _random(rng, b_shape, b_layout)
    if form == "3d3d":
        offs = None
    problem = _grouped_problem.describe(op(a, "a"), op(b, "b"), op(offs, "offs") if offs is not None else None)
    assert problem.form == form and problem.groups == groups
    got = emulate(problem, a, b, offs)
    want = expected(form, a, b, offs, groups)
    assert not np.isnan(got).any(), "an element of the result was never written"
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    for matrix in (problem.a, problem.b, problem.d):  # every group's matrix on 16 bytes
        assert matrix.alignment >= 16, matrix


def test_a_group_starting_off_16_bytes_along_memory_is_emptied_and_only_that_one():
    rng = np.random.default_rng(9)
    a = rng.standard_normal((6, 16)).astype(np.float16)             # (M, ΣK), K along memory
    b = rng.standard_normal((16, 8)).astype(np.float16)
    offs = np.array([8, 11, 16], np.int32)                          # group 2 starts at 11: 22 bytes
    problem = _grouped_problem.describe(op(a, "a"), op(b, "b"), op(offs, "offs"))
    assert problem.b.contiguous_ragged
    got = emulate(problem, a, b, offs)
    want = expected("2d2d", a, b, offs, 3)
    np.testing.assert_allclose(got[:2], want[:2], rtol=1e-12)     # group 1's 3 columns are fine: it starts on 16
    assert (got[2] == 0).all()                                      # emptied: K = 0
    arrays = _grouped_problem.reference_arrays(problem, offs)["b"]
    assert [rows * cols for rows, cols, _, _ in arrays] == [8 * 6, 3 * 6, 0]
    assert arrays[2][3] == 0  # and it points at the operand's aligned base, not at element 11


@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize("form", ["2d3d", "3d2d", "2d2d", "3d3d"])
def test_a_one_wide_operand_takes_the_order_whose_lead_is_aligned(form, layout):
    """A contiguous (…, K, 1) weight is as much column- as row-major; row-major its lead is one element,
    for which cuBLASLt has no kernel (NOT_SUPPORTED on the H200). It runs in the other order, its lead the
    extent rounded up to 16 bytes, and every group still gets its product."""
    rng = np.random.default_rng(len(form))
    sizes = [8, 0, 16]
    total, groups, m, k = sum(sizes), 3, 8, 24
    ends = np.cumsum(sizes).astype(np.int32)
    a_shape, b_shape = {"2d3d": ((total, k), (groups, k, 1)), "3d2d": ((groups, 1, k), (k, total)),
                        "2d2d": ((1, total), (total, 8)), "3d3d": ((groups, m, k), (groups, k, 1))}[form]
    a, b = _random(rng, a_shape, layout), _random(rng, b_shape, layout)
    offs = None if form == "3d3d" else ends
    problem = _grouped_problem.describe(op(a, "a"), op(b, "b"), op(offs, "offs") if offs is not None else None)
    np.testing.assert_allclose(emulate(problem, a, b, offs), expected(form, a, b, offs, groups), rtol=1e-12,
                               atol=1e-12)
    for matrix in (problem.a, problem.b, problem.d):
        assert matrix.alignment >= 16, matrix


@pytest.mark.parametrize("a_shape, b_shape, ends", [((2, 3, 4), (2, 4, 0), None), ((6, 4), (2, 4, 0), [2, 6]),
                                                     ((3, 6), (6, 0), [2, 6]), ((2, 3, 1), (1, 0), [0, 0])])
def test_an_empty_result_is_described_as_the_product_it_is(a_shape, b_shape, ends):
    """A result with no columns is not a one-wide matrix: D keeps op(A)·op(B)'s extents (a one-wide rule
    that matched zero described it transposed)."""
    torch = pytest.importorskip("torch")  # its empty tensors' strides are those of a one-wide matrix (NumPy's are 0)
    a, b = torch.randn(a_shape, dtype=torch.float16), torch.empty(b_shape, dtype=torch.float16)
    offs = None if ends is None else torch.tensor(ends, dtype=torch.int32)
    problem = _grouped_problem.describe(op(a, "a"), op(b, "b"), op(offs, "offs") if offs is not None else None)
    assert emulate(problem, a.numpy(), b.numpy(), None if offs is None else offs.numpy()).size == 0
    # (emulate() asserts each group's D extents against op(A)·op(B)'s)


def test_a_one_token_total_keeps_the_plan_key_of_larger_totals():
    """A row-major (1, K) operand whose rows are the ragged extent keeps its lead (and so the plan key) at
    a total of one token, also where K's rows are not on 16 bytes."""
    b = _f16(2, 20, 16)
    offs = op(np.array([1, 1], np.int32))
    one = _grouped_problem.describe(op(_f16(1, 20)), op(b), offs)
    many = _grouped_problem.describe(op(_f16(16, 20)), op(b), op(np.array([8, 16], np.int32)))
    assert one.key == many.key


def test_results_rows_start_on_16_bytes():
    problem = _grouped_problem.describe(op(_f16(5, 8)), op(_f16(2, 8, 7)), op(np.array([2, 5], np.int32)))
    assert problem.out_shape == (5, 7) and problem.out_strides == (8, 1)


def test_row_major_weights_transposed_in_memory_run_as_tn():
    # experts' weights stored (G, N, K) as nn.Linear keeps them, passed as their (G, K, N) transpose
    rng = np.random.default_rng(3)
    weights = rng.standard_normal((4, 16, 8)).astype(np.float16)
    a = rng.standard_normal((10, 8)).astype(np.float16)
    offs = np.array([2, 5, 5, 10], np.int32)
    problem = _grouped_problem.describe(op(a), op(weights.transpose(0, 2, 1)), op(offs))
    assert problem.transa and not problem.transb
    assert (problem.a.rows, problem.a.cols, problem.a.ld) == (8, 16, 8)


def test_the_plan_key_ignores_the_ragged_total_and_sees_alignment():
    rng = np.random.default_rng(4)
    b = rng.standard_normal((2, 8, 16)).astype(np.float16)
    offs = np.array([3, 7], np.int32)
    small = _grouped_problem.describe(op(rng.standard_normal((7, 8)).astype(np.float16)), op(b), op(offs))
    large = _grouped_problem.describe(op(rng.standard_normal((700, 8)).astype(np.float16)), op(b), op(offs))
    assert small.key == large.key and small.total == 7 and large.total == 700
    # 3-D × 2-D: the leading dimension of b and of the result is the ragged total; the kernel writes it per call
    a3 = op(_f16(2, 8, 16))
    narrow = _grouped_problem.describe(a3, op(_f16(16, 16)), op(np.array([8, 16], np.int32)))
    wide = _grouped_problem.describe(a3, op(_f16(16, 800)), op(np.array([8, 800], np.int32)))
    assert narrow.key == wide.key
    assert (narrow.a.ld, wide.a.ld) == (16, 800) and (narrow.d.ld, wide.d.ld) == (16, 800)
    storage = np.zeros(7 * 8 + 1, np.float16)
    shifted = storage[1:].reshape(7, 8)  # 2 bytes past an aligned pointer
    misaligned = _grouped_problem.describe(op(shifted), op(b), op(offs))
    assert misaligned.b.alignment == 2 and misaligned.key != small.key


@pytest.mark.parametrize("offsets, total, flags", [
    ([2, 5, 9], 9, [True, True, True]),
    ([5, 2, 9], 9, [True, False, True]),    # out of order: the second group is clamped to nothing
    ([2, 5, 12], 9, [True, True, False]),   # past the operand: clamped to its end
    ([-1, 5, 9], 9, [False, False, True]),  # both groups that touch the negative offset
])
def test_bad_offsets_are_clamped_inside_the_operand(offsets, total, flags):
    bounds = _grouped_problem.group_bounds(offsets, len(offsets), total)
    assert [good for _, _, good in bounds] == flags
    for start, size, _ in bounds:
        assert 0 <= start and size >= 0 and start + size <= total


def _f16(*shape):
    return np.zeros(shape, np.float16)


@pytest.mark.parametrize("a, b, offs, error, message", [
    (_f16(4, 8, 2, 2), _f16(2, 8, 4), None, NvblasltValueError, "expected 2-D or 3-D operands"),
    (np.zeros((4, 8), np.float32), np.zeros((2, 8, 4), np.float32), np.array([1, 4], np.int32),
     NvblasltUnsupportedError, "a: grouped GEMM runs bfloat16, float16, float8_e4m3fn and float8_e5m2 operands, got float32"),
    (_f16(4, 8), _f16(2, 6, 4), np.array([1, 4], np.int32), NvblasltValueError, "b: expected 8 rows"),
    (_f16(4, 8), _f16(2, 8, 4), None, NvblasltValueError, "offs: expected the groups' cumulative ends along M"),
    (_f16(4, 8), _f16(2, 8, 4), np.array([1, 4], np.float32), NvblasltTypeError, "offs: expected int32 or int64"),
    (_f16(4, 8), _f16(2, 8, 4), np.array([1, 2, 4], np.int32), NvblasltValueError, r"offs: expected shape \(2,\)"),
    (_f16(2, 4, 8), _f16(3, 8, 4), None, NvblasltValueError, "b: expected 2 groups"),
    (_f16(2, 4, 8), _f16(2, 8, 4), np.array([1, 4], np.int32), NvblasltValueError, "offs: expected None"),
    (_f16(4, 16)[:, ::2], _f16(2, 8, 4), np.array([1, 4], np.int32), NvblasltValueError,
     "a: expected each group's matrix row- or column-major"),
])
def test_bad_arguments_are_refused_by_name(a, b, offs, error, message):
    with pytest.raises(error, match=message):
        _grouped_problem.describe(op(a, "a"), op(b, "b"), op(offs, "offs") if offs is not None else None)


def test_fp8_operands_default_to_a_bfloat16_result_and_take_no_fp8_one():
    from tests.fakes import FakeDLPack

    import nvblaslt._dtypes as dt

    a = op(FakeDLPack((4, 16), dtype="float8_e4m3fn"))
    b = op(FakeDLPack((2, 16, 8), (128, 1, 16), dtype="float8_e4m3fn", ptr=0x7F0000100000))  # K contiguous
    offs = op(np.array([1, 4], np.int32))
    problem = _grouped_problem.describe(a, b, offs)
    assert problem.fp8 and problem.d.dtype is dt.BFLOAT16 and problem.transa  # TN, as Hopper's fp8 needs
    assert _grouped_problem.describe(a, b, offs, out_dtype=dt.FLOAT32).d.dtype is dt.FLOAT32
    with pytest.raises(NvblasltUnsupportedError, match="out_dtype: expected bfloat16 .*, float16 or float32"):
        _grouped_problem.describe(a, b, offs, out_dtype=dt.FLOAT8_E4M3)
    # E5M2 (a gradient's format) pairs with E4M3 either way; both E5M2 has no kernel
    a5 = op(FakeDLPack((4, 16), dtype="float8_e5m2"))
    b5 = op(FakeDLPack((2, 16, 8), (128, 1, 16), dtype="float8_e5m2", ptr=0x7F0000100000))
    for x, w in ((a5, b), (a, b5)):
        mixed = _grouped_problem.describe(x, w, offs)
        assert mixed.fp8 and (mixed.b.dtype, mixed.a.dtype) == (x.dtype, w.dtype)  # cuBLASLt's B is the caller's a
        assert mixed.key != problem.key
    with pytest.raises(NvblasltUnsupportedError, match="no fp8 kernel for float8_e5m2 × float8_e5m2"):
        _grouped_problem.describe(a5, b5, offs)
    with pytest.raises(NvblasltTypeError, match=r"b: expected the dtype of a \(bfloat16\), got float8_e4m3fn"):
        _grouped_problem.describe(op(FakeDLPack((4, 16), dtype="bfloat16")), b, offs)


def test_mixed_dtypes_and_result_types():
    import nvblaslt._dtypes as dt

    a, b, offs = op(_f16(4, 8)), op(_f16(2, 8, 4)), op(np.array([1, 4], np.int32))
    assert _grouped_problem.describe(a, b, offs, out_dtype=dt.FLOAT32).d.dtype is dt.FLOAT32
    with pytest.raises(NvblasltUnsupportedError, match="out_dtype: expected float16"):
        _grouped_problem.describe(a, b, offs, out_dtype=dt.FLOAT64)


# ---- against the real library (descriptors need no GPU) --------------------------------------------------

@pytest.fixture
def grouped_lib():
    nvblaslt = pytest.importorskip("nvblaslt")
    try:
        lib = nvblaslt.library()
    except nvblaslt.LibraryNotFoundError:
        pytest.skip("no libcublasLt installed")
    if lib.version < 130200:
        pytest.skip(f"cuBLASLt {lib.version} has no grouped layouts (13.2 and newer)")
    return lib


def test_a_grouped_layout_holds_the_arrays_and_the_64_bit_width(grouped_lib):
    from nvblaslt import GroupedMatrixLayout, lt

    layout = GroupedMatrixLayout(lt.CUDA_R_16BF, 8, 0x7000_0000, 0x7000_0040, 0x7000_0080)
    assert layout.get("BATCH_MODE") == lt.CUBLASLT_BATCH_MODE_GROUPED
    assert layout.get("BATCH_COUNT") == 8
    assert layout.get("GROUPED_MATRIX_LAYOUT_ROWS_ARRAY") == 0x7000_0000
    assert layout.get("GROUPED_MATRIX_LAYOUT_LD_ARRAY") == 0x7000_0080
    assert layout.get("GROUPED_MATRIX_LAYOUT_ROWS_COLS_ARRAY_INTEGER_WIDTH") == lt.CUBLASLT_INTEGER_WIDTH_64
    with pytest.raises(NvblasltValueError, match="group_count"):
        GroupedMatrixLayout(lt.CUDA_R_16BF, 0, 0, 0, 0)


def test_a_plans_descriptors_build_on_the_real_library(grouped_lib):
    from nvblaslt import GroupedMatmul, lt

    rng = np.random.default_rng(5)
    w = rng.standard_normal((4, 32, 16)).astype(np.float16)  # (G, N, K): TN
    problem = _grouped_problem.describe(op(_f16(40, 16)), op(w.transpose(0, 2, 1)), op(np.array([8, 16, 30, 40],
                                                                                              np.int32)))

    class FakeArrays:  # device pointers the descriptors only store
        def array(self, matrix, field):
            return 0x7000_0000 + 0x1000 * matrix + 0x100 * field

    plan = GroupedMatmul.__new__(GroupedMatmul)
    plan._lib, plan._problem, plan._arrays, plan._workspace_bytes = grouped_lib, problem, FakeArrays(), 1 << 20
    desc, layouts, preference = plan._descriptors()
    assert desc.get("TRANSA") == lt.CUBLAS_OP_T and desc.get("TRANSB") == lt.CUBLAS_OP_N
    assert [layout.get("BATCH_COUNT") for layout in layouts] == [4, 4, 4, 4]
    assert layouts[0].get("GROUPED_MATRIX_LAYOUT_COLS_ARRAY") == 0x7000_0100
    assert layouts[3].get("GROUPED_MATRIX_LAYOUT_LD_ARRAY") == 0x7000_2200
    # the averages are the heuristics' only view of the shapes: 8-byte values (the header says 4)
    assert preference.get("GROUPED_AVERAGE_REDUCTION_DIM") == 16
    assert preference.get("GROUPED_DESC_D_AVERAGE_ROWS") == 32 and preference.get("GROUPED_DESC_D_AVERAGE_COLS") == 10


def test_an_older_library_is_refused_with_the_way_to_a_newer_one(grouped_lib, monkeypatch):
    import dataclasses

    from nvblaslt._grouped_version import require_grouped

    old = dataclasses.replace(grouped_lib, version=130100)
    with pytest.raises(NvblasltUnsupportedError, match=r"needs cuBLASLt 13\.4 or newer; the loaded library is "
                                                       r"13\.1\.0 .*nvidia-cublas>=13\.4.*NVBLASLT_LIBRARY"):
        require_grouped(old)
    require_grouped(grouped_lib, 130200)


def test_the_derive_kernel_compiles_for_hopper_and_blackwell():
    pytest.importorskip("cuda.bindings.nvrtc")
    from nvblaslt import _grouped_arrays, _jit
    from nvblaslt._errors import CudaError

    try:
        cubins = [_jit.compile_cubin(_grouped_arrays.SOURCE, arch) for arch in ("sm_90", "sm_100")]
    except CudaError as error:
        if "not available" in str(error):
            pytest.skip(f"no libnvrtc here: {error}")
        raise
    assert all(cubin[:4] == b"\x7fELF" and len(cubin) > 1000 for cubin in cubins)
    assert _grouped_arrays.KERNEL.encode() in cubins[0] and _grouped_arrays.ZERO_KERNEL.encode() in cubins[0]


def test_autotune_refuses_bad_iterations_and_an_unplanned_plan():
    from nvblaslt import GroupedMatmul
    from nvblaslt._errors import NvblasltStateError

    plan = GroupedMatmul.__new__(GroupedMatmul)  # as __init__ leaves it before plan(), without the GPU
    plan._launch, plan._freed = types.SimpleNamespace(algorithms=[], algorithm=None), False
    plan._operands = (None, None, None)
    for bad in (0, -1, 2.5, True, "5"):
        with pytest.raises(NvblasltValueError, match="iterations: expected a positive int"):
            plan.autotune(iterations=bad)
    with pytest.raises(NvblasltStateError, match=r"autotune: plan\(\) first"):
        plan.autotune()


def test_a_grouped_plans_autotuned_choice_is_keyed_and_recalled(grouped_lib, monkeypatch, tmp_path):
    # the tuning cache reads a grouped plan as it reads a Matmul's launch: from its C descriptors
    from nvblaslt import GroupedMatmul, _tuning_cache
    from nvblaslt._descriptors import HeuristicResult
    from nvblaslt._launch import Launch

    monkeypatch.setenv("NVBLASLT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_tuning_cache, "gpu_identity", lambda device: {"name": "test GPU", "cc": [9, 0], "sms": 132})

    class FakeArrays:
        def array(self, matrix, field):
            return 0x7000_0000 + 0x1000 * matrix + 0x100 * field

    def plan_for(groups, tokens=40):
        # 256-byte aligned operands: their alignment is part of the problem, and NumPy's varies
        w = _aligned_f16(groups, 32, 16)
        problem = _grouped_problem.describe(op(_aligned_f16(tokens, 16)), op(w.transpose(0, 2, 1)),
                                            op(np.arange(1, groups + 1, dtype=np.int32) * (tokens // groups)))
        plan = GroupedMatmul.__new__(GroupedMatmul)
        plan._lib, plan._problem, plan._arrays = grouped_lib, problem, FakeArrays()
        plan._workspace_bytes, plan.device = 1 << 20, 0
        desc, layouts, preference = plan._descriptors()
        # the grouped plan's Launch, as GroupedMatmul makes it (no handle: nothing runs)
        launch = Launch.given(grouped_lib, None, desc, layouts, preference, workspace_limit=1 << 20, device=0,
                              pointers=(0x100, 0x200, 0x300), description="4 groups")
        # cuBLASLt's algorithm check needs a GPU: this one accepts any algorithm
        launch.check = lambda algo: HeuristicResult(_result(grouped_lib, algo), grouped_lib)  # type: ignore
        return launch

    four, eight = plan_for(4), plan_for(8)
    assert _tuning_cache.key_of(four) != _tuning_cache.key_of(eight)
    # the average group shape set from the first call's token count is a hint, not part of the problem
    assert four.preference.get("GROUPED_DESC_D_AVERAGE_COLS") != plan_for(4, tokens=400).preference.get(
        "GROUPED_DESC_D_AVERAGE_COLS")
    assert _tuning_cache.key_of(four) == _tuning_cache.key_of(plan_for(4, tokens=400))
    assert _tuning_cache.recall(four) == (None, {})
    algo = grouped_lib.api.cublasLtMatmulAlgo_t()
    algo.data[0] = 42  # any 64 bytes: the fake check accepts them
    chosen = HeuristicResult(_result(grouped_lib, algo), grouped_lib)
    assert _tuning_cache.remember(four, chosen, 0.5)
    recalled, entry = _tuning_cache.recall(four)
    assert recalled is not None and recalled.as_bytes() == chosen.as_bytes() and entry["ms"] == 0.5
    assert _tuning_cache.recall(eight) == (None, {})


def _aligned_f16(*shape):
    count = int(np.prod(shape))
    storage = np.zeros(count + 128, np.float16)
    skip = (-storage.ctypes.data % 256) // 2
    return storage[skip:skip + count].reshape(shape)


def _result(lib, algo):
    result = lib.api.cublasLtMatmulHeuristicResult_t()
    result.algo = algo
    result.workspaceSize = 0
    return result


def test_kernel_arguments_live_in_memory_a_launch_points_at():
    import ctypes

    from nvblaslt import _jit

    arguments = _jit.Arguments((_jit.POINTER, _jit.INT32, _jit.INT64), (0x7F00_0000_0000, 3, -5))
    addresses = [arguments.pointers[i] for i in range(3)]
    assert ctypes.cast(arguments.address, ctypes.POINTER(ctypes.c_void_p))[1] == addresses[1]
    arguments.set(2, 1 << 40)  # a new value, at the address the launch already holds
    assert ctypes.c_longlong.from_address(addresses[2]).value == 1 << 40
    assert ctypes.c_int.from_address(addresses[1]).value == 3
    assert ctypes.c_void_p.from_address(addresses[0]).value == 0x7F00_0000_0000
    with pytest.raises(ValueError, match="2 values for 3 argument types"):
        _jit.Arguments((_jit.POINTER, _jit.INT32, _jit.INT64), (0, 1))
