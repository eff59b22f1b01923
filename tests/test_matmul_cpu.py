"""The matmul layer on a machine without a GPU: operand reading, layouts, checks, epilog
attributes on real descriptors, plan-cache keys."""

from __future__ import annotations

import pytest

import nvblaslt
from nvblaslt import MatmulEpilog, NvblasltTypeError, NvblasltValueError, _dtypes, _matmul, _operands
from nvblaslt._epilogs import SPECS
from nvblaslt._problem import OP_N, OP_T, Problem, matrix_spec

from fakes import FakeCAI, FakeDLPack, fortran


def test_dlpack_operand_is_read_with_stream_handshake():
    x = FakeDLPack((3, 5), dtype="bfloat16", ptr=0x7F0000001000)
    op = _operands.read(x, "a", stream=0x1234)
    assert (op.ptr, op.shape, op.strides, op.dtype, op.device) == (0x7F0000001000, (3, 5), (5, 1), _dtypes.BFLOAT16, 0)
    assert x.streams == [0x1234]
    _operands.read(x, "a", stream=0)
    assert x.streams[-1] == 1  # the legacy default stream is named 1 in DLPack


def test_fp8_dtype_codes_are_read_from_dlpack():
    assert _operands.read(FakeDLPack((4, 4), dtype="float8_e4m3fn"), "a", 0).dtype is _dtypes.FLOAT8_E4M3
    assert _operands.read(FakeDLPack((4, 4), dtype="float8_e5m2"), "a", 0).dtype is _dtypes.FLOAT8_E5M2


def test_cai_operand_strides_in_bytes(monkeypatch):
    monkeypatch.setattr(_operands, "_pointer_device", lambda pointer, name: 0)
    op = _operands.read(FakeCAI((3, 5), "<f2", strides=(2, 6)), "b", 0)
    assert op.strides == (1, 3) and op.dtype is _dtypes.FLOAT16


def test_host_and_non_arrays_are_refused_by_name():
    with pytest.raises(NvblasltTypeError, match=r"a: expected an array in GPU memory, got a FakeDLPack on the host"):
        _operands.read(FakeDLPack((2, 2), device_type=1), "a", 0)
    with pytest.raises(NvblasltTypeError, match=r"b: expected a GPU array .* got builtins.list"):
        _operands.read([[1.0]], "b", 0)
    with pytest.raises(NvblasltValueError, match="mask"):
        _operands.read(FakeCAI((2, 2), mask=object()), "c", 0)
    with pytest.raises(NvblasltTypeError, match="typestr '<V2'"):
        _operands.read(FakeCAI((2, 2), "<V2"), "c", 0)


@pytest.mark.parametrize("shape,strides,expected", [
    ((4, 3), (3, 1), (OP_T, 3, 4, 3)),  # row-major (C order): stored transposed
    ((4, 3), (1, 4), (OP_N, 4, 3, 4)),  # column-major (Fortran order)
    ((4, 3), (1, 8), (OP_N, 4, 3, 8)),  # column-major with padding
    ((4, 1), (1, 1), (OP_N, 4, 1, 4)),  # a column vector
    ((1, 4), (4, 1), (OP_N, 1, 4, 1)),  # a row vector
])
def test_layouts_without_copies(shape, strides, expected):
    spec = matrix_spec(_operands.read(FakeDLPack(shape, strides), "a", 0), "a")
    assert (spec.trans, spec.rows, spec.cols, spec.ld) == expected


def test_transposed_view_is_a_layout_not_a_copy():
    w = FakeDLPack((100, 784))
    spec = matrix_spec(_operands.read(w.T, "a", 0), "a")
    assert (spec.trans, spec.rows, spec.cols, spec.ld) == (OP_N, 784, 100, 784)


def test_strides_without_a_unit_dimension_are_refused():
    with pytest.raises(NvblasltValueError, match="row- or column-major"):
        matrix_spec(_operands.read(FakeDLPack((4, 3), (6, 2)), "a", 0), "a")


def problem(a, b, c=None, **kw):
    lib = nvblaslt.library()
    read = lambda x, n: _operands.read(x, n, 0) if x is not None else None  # noqa: E731
    return Problem(lib, read(a, "a"), read(b, "b"), read(c, "c"), **kw)


def test_batch_broadcast_and_mismatch():
    p = problem(FakeDLPack((7, 4, 3)), FakeDLPack((3, 5)))
    assert (p.batch, p.a.batch_stride, p.b.batch_stride, p.d.batch_stride) == ((7,), 12, 0, 20)
    with pytest.raises(NvblasltValueError, match="batch sizes"):
        problem(FakeDLPack((7, 4, 3)), FakeDLPack((6, 3, 5)))
    with pytest.raises(NvblasltValueError, match="K"):
        problem(FakeDLPack((4, 3)), FakeDLPack((4, 5)))
    with pytest.raises(NvblasltValueError, match="zero-size"):
        problem(FakeDLPack((0, 3)), FakeDLPack((3, 5)))


def test_type_rules():
    with pytest.raises(NvblasltTypeError, match="cannot be multiplied"):
        problem(FakeDLPack((4, 3), dtype="float16"), FakeDLPack((3, 5), dtype="float32"))
    p = problem(FakeDLPack((4, 3), dtype="float32"), FakeDLPack((3, 5)), compute_type="tf32")
    assert p.compute_type_name == "CUBLAS_COMPUTE_32F_FAST_TF32"
    with pytest.raises(NvblasltValueError, match="compute_type"):
        problem(FakeDLPack((4, 3), dtype="float16"), FakeDLPack((3, 5), dtype="float16"), compute_type="tf32")
    p8 = problem(FakeDLPack((4, 16), dtype="float8_e4m3fn"), FakeDLPack((16, 8), dtype="float8_e5m2"))
    assert p8.d_dtype is _dtypes.BFLOAT16 and p8.fp8
    with pytest.raises(NvblasltValueError, match="c: expected a column-major"):
        problem(FakeDLPack((4, 3)), FakeDLPack((3, 5)), FakeDLPack((4, 5)))


def planned_attributes(epilog, a, b, inputs):
    """The attributes Matmul sets on a real MatmulDesc for ``epilog`` (no GPU needed)."""
    mm = _matmul.Matmul._from_operands(_operands.read(a, "a", 0), _operands.read(b, "b", 0), None, stream=0,
                                       alpha=1.0, beta=None, compute_type=None, result_type=None,
                                       quantization_scales=None)
    ops = {k: _operands.read(v, k, 0) for k, v in inputs.items()}
    mm._check_epilog_inputs(ops)
    lib = nvblaslt.library()
    with nvblaslt.MatmulDesc(lib.api.CUBLAS_COMPUTE_32F, lib.api.CUDA_R_32F) as desc:
        mm._configure_epilog(desc, SPECS[epilog], ops)
        return desc.attributes()


def test_relu_aux_bias_sets_bias_and_bitmask_ld():
    attrs = planned_attributes(MatmulEpilog.RELU_AUX_BIAS, FakeDLPack((100, 784)), FakeDLPack((784, 256)),
                               {"bias": FakeDLPack((100,), ptr=0x7F00000A0000)})
    assert attrs["BIAS_POINTER"] == 0x7F00000A0000
    assert attrs["BIAS_DATA_TYPE"] == nvblaslt.library().api.CUDA_R_32F
    assert attrs["EPILOGUE_AUX_LD"] == 128  # bits: 100 rows rounded up to a multiple of 128


def test_drelu_bgrad_reads_the_forward_mask_and_checks_its_shape():
    mask = FakeDLPack((16, 256), (1, 16), dtype="int8", ptr=0x7F00000B0000)
    attrs = planned_attributes(MatmulEpilog.DRELU_BGRAD, FakeDLPack((100, 50)), FakeDLPack((50, 256)),
                               {"relu_aux": mask})
    assert attrs["EPILOGUE_AUX_POINTER"] == 0x7F00000B0000 and attrs["EPILOGUE_AUX_LD"] == 128
    with pytest.raises(NvblasltValueError, match="relu_aux.*column-major"):
        planned_attributes(MatmulEpilog.DRELU_BGRAD, FakeDLPack((100, 50)), FakeDLPack((50, 256)),
                           {"relu_aux": FakeDLPack((16, 256), dtype="int8")})
    with pytest.raises(NvblasltValueError, match="leading dimension 8 bytes"):
        planned_attributes(MatmulEpilog.DRELU, FakeDLPack((100, 50)), FakeDLPack((50, 256)),
                           {"relu_aux": FakeDLPack((8, 256), (1, 8), dtype="int8")})


def test_gelu_aux_ld_and_batch_strides():
    attrs = planned_attributes(MatmulEpilog.DGELU, FakeDLPack((3, 30, 8)), FakeDLPack((8, 20)),
                               {"gelu_aux": fortran((3, 32, 20))})
    assert attrs["EPILOGUE_AUX_LD"] == 32 and attrs["EPILOGUE_AUX_BATCH_STRIDE"] == 32 * 20


def test_bias_checks_name_the_argument():
    with pytest.raises(NvblasltValueError, match=r"epilog_inputs\['bias'\]: expected length M=100"):
        planned_attributes(MatmulEpilog.BIAS, FakeDLPack((100, 784)), FakeDLPack((784, 256)),
                           {"bias": FakeDLPack((99,))})
    with pytest.raises(NvblasltTypeError, match="expected dtype float32"):
        planned_attributes(MatmulEpilog.BIAS, FakeDLPack((100, 784)), FakeDLPack((784, 256)),
                           {"bias": FakeDLPack((100,), dtype="float16")})


def test_epilog_values_match_every_generated_module():
    from nvblaslt._generated import cublaslt_12, cublaslt_13

    for module in (cublaslt_12, cublaslt_13):
        for epilog in MatmulEpilog:
            assert module.cublasLtEpilogue_t[epilog.name] == epilog.value
    assert ", ".join(e.name for e in MatmulEpilog) == (
        "DEFAULT, RELU, RELU_AUX, BIAS, RELU_BIAS, RELU_AUX_BIAS, DRELU, DRELU_BGRAD, GELU, GELU_AUX, "
        "GELU_BIAS, GELU_AUX_BIAS, DGELU, DGELU_BGRAD, BGRADA, BGRADB")


def test_plan_cache_key_separates_what_changes_the_plan():
    sig = _matmul._signature
    read = lambda x: _operands.read(x, "a", 0)  # noqa: E731
    base = sig(read(FakeDLPack((4, 3), ptr=0x7F0000000000)))
    assert base == sig(read(FakeDLPack((4, 3), ptr=0x7F0000010000)))  # another pointer, same plan
    assert base != sig(read(FakeDLPack((4, 3), ptr=0x7F0000000010)))  # less aligned: other kernels
    assert base != sig(read(FakeDLPack((3, 4), (1, 3))))
    assert base != sig(read(FakeDLPack((4, 3), dtype="float16")))


def test_epilog_missing_from_the_loaded_library_is_refused(monkeypatch):
    import enum

    lib = nvblaslt.library()
    monkeypatch.setattr(lib.api, "cublasLtEpilogue_t", enum.IntEnum("cublasLtEpilogue_t", {"DEFAULT": 1}))
    mm = _matmul.Matmul._from_operands(_operands.read(FakeDLPack((8, 4)), "a", 0),
                                       _operands.read(FakeDLPack((4, 6)), "b", 0), None, stream=0, alpha=1.0,
                                       beta=None, compute_type=None, result_type=None, quantization_scales=None)
    with pytest.raises(NvblasltValueError, match="epilog: GELU_BIAS is not an epilogue of the loaded cuBLASLt"):
        mm.plan(epilog="GELU_BIAS", epilog_inputs={"bias": FakeDLPack((8,))})
