"""The matmul layer on a machine without a GPU: operand reading, the normalizing step (layouts,
result order, the transposed problem, broadcasts, vectors, types), epilog rules on real
descriptors, plan-cache keys."""

from __future__ import annotations

import pytest

import nvblaslt
from nvblaslt import (MatmulEpilog, NvblasltError, NvblasltTypeError, NvblasltValueError, _dtypes, _function_form,
                      _operands)
from nvblaslt import _epilogs
from nvblaslt._epilogs import SPECS, outputs
from nvblaslt._plan import Matmul
from nvblaslt._problem import COL, OP_C, OP_N, OP_T, Operands, canonical

from tests.fakes import FakeCAI, FakeDLPack, fortran

E = MatmulEpilog


def test_dlpack_operand_is_read_with_stream_handshake():
    x = FakeDLPack((3, 5), dtype="bfloat16", ptr=0x7F0000001000)
    op = _operands.read(x, "a", stream=0x1234)
    assert (op.ptr, op.shape, op.strides, op.dtype, op.device) == (0x7F0000001000, (3, 5), (5, 1), _dtypes.BFLOAT16, 0)
    assert x.streams == [0x1234]
    _operands.read(x, "a", stream=0)
    assert x.streams[-1] == 1  # the legacy default stream is named 1 in DLPack


def test_fp8_and_complex_dtype_codes_are_read_from_dlpack():
    assert _operands.read(FakeDLPack((4, 4), dtype="float8_e4m3fn"), "a", 0).dtype is _dtypes.FLOAT8_E4M3
    assert _operands.read(FakeDLPack((4, 4), dtype="float8_e5m2"), "a", 0).dtype is _dtypes.FLOAT8_E5M2
    assert _operands.read(FakeDLPack((4, 4), dtype="complex64"), "a", 0).dtype is _dtypes.COMPLEX64


def test_cai_operand_strides_in_bytes_and_complex_typestrs(monkeypatch):
    monkeypatch.setattr(_operands, "_pointer_device", lambda pointer, name: 0)
    op = _operands.read(FakeCAI((3, 5), "<f2", strides=(2, 6)), "b", 0)
    assert op.strides == (1, 3) and op.dtype is _dtypes.FLOAT16
    assert _operands.read(FakeCAI((3, 5), "<c8"), "b", 0).dtype is _dtypes.COMPLEX64
    assert _operands.read(FakeCAI((3, 5), "<c16"), "b", 0).dtype is _dtypes.COMPLEX128


def test_host_arrays_are_read_as_host_operands():
    np = pytest.importorskip("numpy")
    x = np.asfortranarray(np.ones((4, 3), dtype=np.float32))
    op = _operands.read(x, "a", 0)
    assert op.host and op.kind == "numpy" and op.strides == (1, 4)


def test_non_arrays_and_malformed_exports_are_refused_by_name():
    with pytest.raises(NvblasltTypeError, match=r"b: expected an array .* got builtins.list"):
        _operands.read([[1.0]], "b", 0)
    with pytest.raises(NvblasltValueError, match="mask"):
        _operands.read(FakeCAI((2, 2), mask=object()), "c", 0)
    with pytest.raises(NvblasltTypeError, match="typestr '<V2'"):
        _operands.read(FakeCAI((2, 2), "<V2"), "c", 0)
    with pytest.raises(NvblasltValueError, match="c: negative extent"):
        _operands.read(FakeCAI((2, -2)), "c", 0)
    with pytest.raises(NvblasltTypeError, match="c: shape must be integers"):
        _operands.read(FakeCAI((2, 2.5)), "c", 0)
    with pytest.raises(NvblasltValueError, match="c: .*overflow"):
        _operands.read(FakeCAI((2**40, 2**40)), "c", 0)
    with pytest.raises(NvblasltValueError, match="c: NULL data pointer"):
        _operands.read(FakeCAI((2, 2), ptr=0), "c", 0)


def operands(a, b, c=None, **kw):
    api = nvblaslt.library().api
    read = lambda x, n: _operands.read(x, n, 0) if x is not None else None  # noqa: E731
    return Operands(api, read(a, "a"), read(b, "b"), read(c, "c"), **kw)


def problem(a, b, c=None, epilog=E.DEFAULT, **kw):
    return canonical(operands(a, b, c, **kw), epilog)


def sides(p):
    return ((p.a.op, p.a.layout.order, p.a.layout.rows, p.a.layout.cols, p.a.layout.ld, p.a.source),
            (p.b.op, p.b.layout.order, p.b.layout.rows, p.b.layout.cols, p.b.layout.ld, p.b.source))


def test_column_major_operands_are_read_as_they_are():
    p = problem(fortran((4, 3)), fortran((3, 5)))
    assert not p.transposed and (p.m, p.n, p.k) == (4, 5, 3)
    assert sides(p) == ((OP_N, COL, 4, 3, 4, "a"), (OP_N, COL, 3, 5, 3, "b"))
    assert p.result_shape == (4, 5) and p.result_strides == (1, 4)  # D follows A's order: column-major


def test_row_major_a_gives_a_row_major_result_through_the_transposed_problem():
    p = problem(FakeDLPack((4, 3)), FakeDLPack((3, 5)))
    assert p.transposed and (p.m, p.n) == (5, 4)  # cuBLASLt computes Dᵀ = Bᵀ·Aᵀ
    assert sides(p) == ((OP_N, COL, 5, 3, 5, "b"), (OP_N, COL, 3, 4, 3, "a"))
    assert p.result_shape == (4, 5) and p.result_strides == (5, 1)


def test_bias_epilogs_keep_the_result_column_major_without_copies():
    p = problem(FakeDLPack((4, 3)), FakeDLPack((3, 5)), epilog=E.RELU_BIAS)
    assert not p.transposed and p.result_strides == (1, 4)
    assert sides(p) == ((OP_T, COL, 3, 4, 3, "a"), (OP_T, COL, 5, 3, 5, "b"))


def test_the_result_takes_c_order_and_a_row_major_c_with_a_bias_epilog_is_refused():
    p = problem(fortran((4, 3)), fortran((3, 5)), FakeDLPack((4, 5)))
    assert p.transposed and p.result_strides == (5, 1) and p.c.ld == 5
    with pytest.raises(NvblasltValueError, match="c: RELU_BIAS needs a column-major"):
        problem(fortran((4, 3)), fortran((3, 5)), FakeDLPack((4, 5)), epilog=E.RELU_BIAS)


def test_a_c_column_is_broadcast_over_n():
    p = problem(fortran((4, 3)), fortran((3, 5)), FakeDLPack((4, 1)))
    assert p.c.ld == 0 and p.c.order == COL and not p.transposed


def test_vectors_follow_numpy_matmul():
    p = problem(FakeDLPack((3,)), FakeDLPack((3, 5)))
    assert (p.result_shape, p.k) == ((5,), 3)
    p = problem(FakeDLPack((4, 3)), FakeDLPack((3,)))
    assert p.result_shape == (4,)
    p = problem(FakeDLPack((2, 4, 3)), FakeDLPack((3,)))
    assert p.result_shape == (2, 4)
    p = problem(FakeDLPack((3,)), FakeDLPack((3,)))
    assert p.result_shape == ()


def test_batches_broadcast_collapse_and_mismatch():
    p = problem(fortran((7, 4, 3)), fortran((3, 5)))
    assert (p.batch_count, p.a.layout.batch_stride, p.b.layout.batch_stride, p.d.batch_stride) == (7, 12, 0, 20)
    p = problem(FakeDLPack((2, 3, 4, 3)), FakeDLPack((2, 3, 3, 5)))
    assert p.batch_count == 6 and p.result_shape == (2, 3, 4, 5)
    with pytest.raises(NvblasltValueError, match="batch dimensions"):
        problem(FakeDLPack((7, 4, 3)), FakeDLPack((6, 3, 5)))
    with pytest.raises(NvblasltValueError, match="K"):
        problem(FakeDLPack((4, 3)), FakeDLPack((4, 5)))
    with pytest.raises(NvblasltValueError, match="extents must be strictly positive"):
        problem(FakeDLPack((0, 3)), FakeDLPack((3, 5)))
    with pytest.raises(NvblasltValueError, match="one stride"):
        problem(FakeDLPack((2, 3, 4, 3), (100, 12, 3, 1)), FakeDLPack((3, 5)))


def test_conjugate_qualifiers_use_op_c():
    p = problem(fortran((4, 3), "complex64"), fortran((3, 5), "complex64"), conjugate=(True, False))
    # conj(A) of a column-major A needs row-major storage; Aᴴ does not: so cuBLASLt computes Dᵀ = Bᵀ·Aᴴ
    assert p.transposed and p.b.op == OP_C and p.b.layout.order == COL and p.b.source == "a"
    p = problem(FakeDLPack((4, 3), dtype="complex64"), FakeDLPack((3, 5), dtype="complex64"), conjugate=(True, True))
    assert not p.transposed and (p.a.op, p.b.op) == (OP_C, OP_C)


def test_fp8_needs_transposed_a():
    p = problem(FakeDLPack((32, 16), dtype="float8_e4m3fn"), fortran((16, 48), "float8_e5m2"),
                result_type="bfloat16", epilog=E.BIAS)
    assert p.a.op == OP_T and p.b.op == OP_N and p.types.d is _dtypes.BFLOAT16


def test_type_rules():
    with pytest.raises(NvblasltTypeError, match="cannot be multiplied"):
        operands(FakeDLPack((4, 3), dtype="float16"), FakeDLPack((3, 5), dtype="float32"))
    t = operands(FakeDLPack((4, 3)), FakeDLPack((3, 5)), compute_type="tf32").types
    assert t.compute == "COMPUTE_32F_FAST_TF32"
    with pytest.raises(NvblasltValueError, match="compute_type"):
        operands(FakeDLPack((4, 3), dtype="float16"), FakeDLPack((3, 5), dtype="float16"), compute_type="tf32")
    t = operands(FakeDLPack((4, 3), dtype="float16"), FakeDLPack((3, 5), dtype="float16"), result_type="float32").types
    assert t.d is _dtypes.FLOAT32 and t.c is _dtypes.FLOAT32  # mixed precision: fp16 in, fp32 out
    t8 = operands(FakeDLPack((4, 16), dtype="float8_e4m3fn"), FakeDLPack((16, 8), dtype="float8_e5m2")).types
    assert t8.d is _dtypes.FLOAT8_E4M3 and t8.c is _dtypes.FLOAT16  # nvmath-python's default: A's type
    with pytest.raises(NvblasltTypeError, match="c: expected dtype float16"):
        operands(FakeDLPack((4, 3), dtype="float16"), FakeDLPack((3, 5), dtype="float16"),
                 FakeDLPack((4, 5), dtype="float32"), result_type="float16")


def epilog_attributes(epilog, a, b, inputs):
    """The attributes the plan sets on a real MatmulDesc for ``epilog`` (no GPU needed)."""
    mm = Matmul._from_operands(_operands.read(a, "a", 0), _operands.read(b, "b", 0), None, stream=0,
                              options=nvblaslt.MatmulOptions())
    p = canonical(mm._problem_operands, epilog)
    prepared = prepare_epilog(epilog, p, inputs)
    lib = nvblaslt.library()
    with nvblaslt.MatmulDesc(lib.api.CUBLAS_COMPUTE_32F, lib.api.CUDA_R_32F) as desc:
        _epilogs.configure(desc, lib.api, p, prepared, result_amax=False)
        return desc.attributes()


def prepare_epilog(epilog, problem, inputs):
    """``_epilogs``' steps of ``Matmul.plan``: the inputs read and checked, the outputs shaped."""
    given, scale = _epilogs.split_aux_scale(inputs)
    aux_dtype = _epilogs.aux_output_type(SPECS[epilog], problem.types, nvblaslt.MatmulEpilogPreferences(), scale, {})
    keys = _epilogs.input_keys(epilog, given, problem)
    read = {key: _operands.read(given[key], f"epilog_inputs['{key}']", 0) for key in keys}
    return _epilogs.prepare(epilog, problem, read, aux_dtype, False)


def test_relu_aux_bias_sets_bias_and_bitmask_ld():
    attrs = epilog_attributes(E.RELU_AUX_BIAS, FakeDLPack((100, 784)), FakeDLPack((784, 256)),
                              {"bias": FakeDLPack((100,), ptr=0x7F00000A0000)})
    assert attrs["BIAS_POINTER"] == 0x7F00000A0000
    assert attrs["BIAS_DATA_TYPE"] == nvblaslt.library().api.CUDA_R_32F
    assert attrs["EPILOGUE_AUX_LD"] == 128  # bits: 100 rows rounded up to a multiple of 128


def test_bias_shapes_as_nvmath_python_takes_them():
    for bias, stride in ((FakeDLPack((8,)), 0), (FakeDLPack((8, 1)), 0), (FakeDLPack((3, 8, 1)), 8),
                         (FakeDLPack((3, 8)), 8)):
        attrs = epilog_attributes(E.BIAS, FakeDLPack((3, 8, 4)), FakeDLPack((4, 6)), {"bias": bias})
        assert attrs["BIAS_BATCH_STRIDE"] == stride, bias.shape  # 0: one bias for every batch
    with pytest.raises(NvblasltValueError, match=r"epilog_inputs\['bias'\]: The batch dimensions of the bias \(1,\)"):
        epilog_attributes(E.BIAS, FakeDLPack((3, 8, 4)), FakeDLPack((4, 6)), {"bias": FakeDLPack((1, 8))})
    with pytest.raises(NvblasltValueError, match=r"batch dimensions of the bias \(2,\) must match"):
        epilog_attributes(E.BIAS, FakeDLPack((3, 8, 4)), FakeDLPack((4, 6)), {"bias": FakeDLPack((2, 8, 1))})
    with pytest.raises(NvblasltTypeError, match="expected dtype float16 for a float16 result"):
        epilog_attributes(E.BIAS, FakeDLPack((8, 4), dtype="float16"), FakeDLPack((4, 6), dtype="float16"),
                          {"bias": FakeDLPack((8,), dtype="float64")})


def test_drelu_bgrad_reads_the_forward_mask_and_checks_its_shape():
    mask = FakeDLPack((16, 256), (1, 16), dtype="int8", ptr=0x7F00000B0000)
    attrs = epilog_attributes(E.DRELU_BGRAD, FakeDLPack((100, 50)), FakeDLPack((50, 256)), {"relu_aux": mask})
    assert attrs["EPILOGUE_AUX_POINTER"] == 0x7F00000B0000 and attrs["EPILOGUE_AUX_LD"] == 128
    with pytest.raises(NvblasltValueError, match="relu_aux.*column-major"):
        epilog_attributes(E.DRELU_BGRAD, FakeDLPack((100, 50)), FakeDLPack((50, 256)),
                          {"relu_aux": FakeDLPack((16, 256), dtype="int8")})
    with pytest.raises(NvblasltValueError, match="leading dimension 8 bytes"):
        epilog_attributes(E.DRELU, FakeDLPack((100, 50)), FakeDLPack((50, 256)),
                          {"relu_aux": FakeDLPack((8, 256), (1, 8), dtype="int8")})


def test_aux_batch_strides_and_broadcast_aux():
    attrs = epilog_attributes(E.DGELU, FakeDLPack((3, 30, 8)), FakeDLPack((8, 20)), {"gelu_aux": fortran((3, 32, 20))})
    assert attrs["EPILOGUE_AUX_LD"] == 32 and attrs["EPILOGUE_AUX_BATCH_STRIDE"] == 32 * 20
    attrs = epilog_attributes(E.DGELU, FakeDLPack((3, 30, 8)), FakeDLPack((8, 20)), {"gelu_aux": fortran((32, 20))})
    assert attrs["EPILOGUE_AUX_BATCH_STRIDE"] == 0  # one aux for every batch, never read past its end


def test_outputs_are_shaped_as_nvmath_python_returns_them():
    p = problem(FakeDLPack((3, 8, 4)), FakeDLPack((4, 6)), epilog=E.DRELU_BGRAD)
    grad = [o for o in outputs(SPECS[E.DRELU_BGRAD], p, _dtypes.INT8) if o.key == "drelu_bgrad"][0]
    assert grad.shape == (3, 8, 1) and grad.batch_stride == 8
    p = problem(FakeDLPack((8, 4)), FakeDLPack((4, 6)), epilog=E.BGRADA)  # row-major A: transposed, BGRADB inside
    assert p.epilog == E.BGRADB and p.b.op == OP_T
    (grad,) = outputs(SPECS[E.BGRADA], p, _dtypes.INT8)
    assert grad.shape == (8,) and grad.key == "bgrada"


def test_epilog_values_match_every_generated_module():
    from nvblaslt._generated import cublaslt_12, cublaslt_13

    for module in (cublaslt_12, cublaslt_13):
        for epilog in MatmulEpilog:
            assert module.cublasLtEpilogue_t[epilog.name] == epilog.value


def test_plan_cache_key_separates_what_changes_the_plan():
    sig = _function_form._signature
    read = lambda x: _operands.read(x, "a", 0)  # noqa: E731
    base = sig(read(FakeDLPack((4, 3), ptr=0x7F0000000000)))
    assert base == sig(read(FakeDLPack((4, 3), ptr=0x7F0000010000)))  # another pointer, same plan
    assert base != sig(read(FakeDLPack((4, 3), ptr=0x7F0000000010)))  # less aligned: other kernels
    assert base != sig(read(FakeDLPack((3, 4), (1, 3))))
    assert base != sig(read(FakeDLPack((4, 3), dtype="float16")))


def test_a_cache_miss_reads_the_call_and_checks_the_plan_arguments_once(monkeypatch):
    """Issue 36: the function form reads its call once (a ``MatmulRequest``) and the plan made from it
    checks the plan arguments and builds the canonical problem once, ``out=``'s check included (four
    problems and two checks of the arguments before)."""
    from nvblaslt import _cuda, _plan

    class Planned(Exception):
        """Stands for the heuristics, which need a GPU: what reached them is looked at."""

    counts = {"canonical": 0, "checked": 0}
    real_checked = Matmul._checked_plan_arguments

    def counted_canonical(*arguments):
        counts["canonical"] += 1
        return canonical(*arguments)

    def counted_checked(*arguments):
        counts["checked"] += 1
        return real_checked(*arguments)

    def planned(lib, problem, prepared, **keywords):
        raise Planned(problem, prepared, keywords)

    monkeypatch.setattr(_plan, "canonical", counted_canonical)
    monkeypatch.setattr(Matmul, "_checked_plan_arguments", counted_checked)
    monkeypatch.setattr(_plan.Launch, "planned", planned)
    monkeypatch.setattr(_cuda, "is_capturing", lambda stream: False)
    a, b = FakeDLPack((8, 4), ptr=0x7F0000000000), FakeDLPack((4, 6), ptr=0x7F0000100000)
    bias, out = FakeDLPack((8,), ptr=0x7F0000200000), FakeDLPack((8, 6), (1, 8), ptr=0x7F0000300000)
    with pytest.raises(Planned) as reached:
        nvblaslt.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}, out=out, preferences={"limit": 3})
    problem, prepared, keywords = reached.value.args
    assert counts == {"canonical": 1, "checked": 1}
    assert problem.epilog == E.RELU_BIAS and keywords["preferences"].limit == 3 and keywords["algorithms"] is None
    assert prepared.inputs["bias"].ptr == 0x7F0000200000 and len(a.streams) == len(bias.streams) == 1  # read once
    with pytest.raises(NvblasltValueError, match="out: overlaps a"):  # out= still checked before the heuristics
        nvblaslt.matmul(a, b, out=FakeDLPack((8, 6), ptr=0x7F0000000000))


def test_nvmath_call_surface_is_checked_before_the_gpu():
    a, b, c = FakeDLPack((8, 4)), FakeDLPack((4, 6)), FakeDLPack((8, 6))
    with pytest.raises(NvblasltValueError, match="beta: A value for beta must be provided if operand C is provided"):
        Matmul(a, b, c)
    with pytest.raises(NvblasltValueError, match="options: unknown keys"):
        Matmul(a, b, options={"bogus": 1})
    with pytest.raises(NvblasltValueError, match="options.inplace"):
        Matmul(a, b, options={"inplace": True})
    np = pytest.importorskip("numpy")
    with pytest.raises(NvblasltTypeError, match="one array package"):
        Matmul(a, np.ones((4, 6), dtype=np.float32))


def test_host_operands_with_gaps_are_packed_for_the_gpu():
    """A host array whose memory has gaps (padded rows, steps) or broadcast axes is staged densely,
    keeping its matrices' order, as nvmath-python's copies are; a dense one is copied as it is."""
    np = pytest.importorskip("numpy")
    from nvblaslt import _host

    def host_op(array):
        return _operands.read(array, "x", 0)

    rng = np.random.default_rng(0)
    padded_column = rng.standard_normal((2, 3, 4))[:, :, :1]  # (2, 3, 1), rows 4 apart
    cases = {
        "dense C": (rng.standard_normal((3, 5)), (5, 1)),
        "dense F": (np.asfortranarray(rng.standard_normal((3, 5))), (1, 3)),
        "padded rows": (rng.standard_normal((3, 8))[:, :5], (5, 1)),
        "padded column": (padded_column, (3, 1, 3)),
        "stepped F": (np.asfortranarray(rng.standard_normal((6, 5)))[::2], (1, 3)),
        "broadcast batch": (np.broadcast_to(rng.standard_normal((3, 4)), (2, 3, 4)), (12, 4, 1)),
        "batch innermost": (np.asfortranarray(rng.standard_normal((2, 3, 5))), (15, 1, 3)),
        "dense batched F": (rng.standard_normal((2, 5, 3)).transpose(0, 2, 1), (15, 1, 3)),
    }
    for name, (array, expected) in cases.items():
        op = host_op(array)
        strides = _host.device_strides(op)
        assert strides == expected, name
        packed = np.empty(max(_host._span_bytes(op.shape, strides, op.dtype) // 8, 1))
        _host._copy_strided(op.ptr, op.strides, packed.ctypes.data, strides, op.shape, 8)
        view = np.lib.stride_tricks.as_strided(packed, op.shape, tuple(8 * s for s in strides))
        assert np.array_equal(view, array), name
        if 0 in op.strides:
            continue  # a broadcast array is never written back
        # and back, into memory laid out as the original (an in-place c's copy back)
        memory = np.zeros(max(_host._span_bytes(op.shape, op.strides, op.dtype) // 8, 1))
        _host._copy_strided(packed.ctypes.data, strides, memory.ctypes.data, op.strides, op.shape, 8)
        back = np.lib.stride_tricks.as_strided(memory, op.shape, tuple(8 * s for s in op.strides))
        assert np.array_equal(back, array), name


def test_memory_limit_is_read_as_nvmath_python_reads_it():
    from nvblaslt._options import memory_limit_bytes

    total = 80 << 30
    expected = {0: 0, 4096: 4096, 0.25: 20 << 30, 2.0: 2, 1e12: 10**12, "10%": 8 << 30, "1 GiB": 1 << 30,
                "1GB": 10**9, "1.5 MiB": 3 << 19, "512 kb": 512000, ".5 GB": 5 * 10**8, "5e7 B": 5 * 10**7, "3 B": 3}
    assert {limit: memory_limit_bytes(limit, total) for limit in expected} == expected
    for limit in expected:
        nvblaslt.MatmulOptions(memory_limit=limit)
    for bad in ("lots", -5, "-1 GiB", True, "0.5", "150%", "0%", float("nan")):
        with pytest.raises(NvblasltError, match="options.memory_limit"):
            nvblaslt.MatmulOptions(memory_limit=bad)


def test_epilog_missing_from_the_loaded_library_is_refused(monkeypatch):
    import enum

    lib = nvblaslt.library()
    monkeypatch.setattr(lib.api, "cublasLtEpilogue_t", enum.IntEnum("cublasLtEpilogue_t", {"DEFAULT": 1}))
    mm = Matmul(FakeDLPack((8, 4)), FakeDLPack((4, 6)))
    with pytest.raises(NvblasltValueError, match="epilog: GELU_BIAS is not an epilogue of the loaded cuBLASLt"):
        mm.plan(epilog="GELU_BIAS", epilog_inputs={"bias": FakeDLPack((8,))})
