"""Issue 22's bad inputs on a machine without a GPU: what used to be multiplied silently, escape
``NvblasltError`` or be accepted and ignored is refused where it is given, with an error that is
both an ``NvblasltError`` and the standard class and names the argument; what was refused though it
has a meaning (a reversed NumPy array, a CPU tensor as alpha, a NumPy integer as epilog) now gets
as far as staging its operands for the GPU."""

from __future__ import annotations

import dataclasses

import pytest

import nvblaslt
from nvblaslt import NvblasltError, NvblasltTypeError, NvblasltValueError, _host, _operands
from tests.fakes import FakeGpuScalar

np = pytest.importorskip("numpy")


class Staged(Exception):
    """Raised in place of the first host-to-GPU copy: every check before it passed."""


@pytest.fixture
def staging(monkeypatch):
    """The host operands each call got as far as staging (their Operands), with no GPU needed."""
    seen: list = []

    def stage(op, device, stream):
        seen.append(op)
        raise Staged(op)
    monkeypatch.setattr(_host, "stage", stage)
    return seen


class _FakeBuffer:
    pointer = 0x7F0000100000

    def release(self) -> None:
        pass


@pytest.fixture
def fake_staging(monkeypatch):
    """Host operands 'staged' to a fake device address (never used): a plan can be made up to the
    first step that needs a GPU. Returns the Operands staged."""
    seen: list = []

    def stage(op, device, stream):
        seen.append(op)
        copy = dataclasses.replace(op, ptr=_FakeBuffer.pointer, strides=_host.device_strides(op), device=device,
                                   host=False, conjugated=False)
        return copy, _FakeBuffer()
    monkeypatch.setattr(_host, "stage", stage)
    return seen


def refused(cls, pattern, call, *args, **kwargs):
    """``call`` raises ``cls`` (an NvblasltError subclass that is also a standard class) matching ``pattern``."""
    with pytest.raises(cls, match=pattern) as info:
        call(*args, **kwargs)
    assert isinstance(info.value, NvblasltError)
    assert isinstance(info.value, ValueError if issubclass(cls, ValueError) else TypeError)
    return info.value


def host_ab():
    rng = np.random.default_rng(0)
    return rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((4, 6)).astype(np.float32)


# ---- masked NumPy arrays --------------------------------------------------------------------------
def masked(array, every=3):
    mask = np.zeros(array.shape, bool)
    mask.flat[::every] = True
    return np.ma.masked_array(array, mask=mask)


@pytest.mark.parametrize("entry", ["fn", "obj"])
@pytest.mark.parametrize("position", ["a", "b", "c"])
def test_masked_operands_are_refused(entry, position, staging):
    a, b = host_ab()
    ops = {"a": a, "b": b, "c": np.ones((8, 6), np.float32)}
    ops[position] = masked(ops[position])
    call = nvblaslt.matmul if entry == "fn" else nvblaslt.Matmul
    error = refused(NvblasltValueError, rf"^{position}: expected an array without masked elements, got a NumPy "
                    r"masked array with \d+ of \d+ elements masked", call, ops["a"], ops["b"], ops["c"], beta=1.0)
    assert ".filled(" in str(error)
    assert staging == []  # refused before anything was copied


def test_masked_epilog_inputs_are_refused(fake_staging):
    a, b = host_ab()
    mm = nvblaslt.Matmul(a, b)
    refused(NvblasltValueError, r"^epilog_inputs\['bias'\]: expected an array without masked elements",
            mm.plan, epilog="BIAS", epilog_inputs={"bias": masked(np.ones(8, np.float32))})
    assert len(fake_staging) == 2  # a and b; the bias was refused when read, before its copy
    refused(NvblasltValueError, r"^a: expected an array without masked elements", mm.reset_operands, a=masked(a))
    mm.free()


def test_a_masked_array_with_nothing_masked_is_read_as_its_data(staging):
    a, b = host_ab()
    with pytest.raises(Staged):
        nvblaslt.matmul(np.ma.masked_array(a), np.ma.masked_array(b, mask=np.zeros(b.shape, bool)))
    assert [op.shape for op in staging] == [(8, 4)]


@pytest.mark.parametrize("value", [np.ma.masked, np.ma.masked_array([2.0], mask=[True])])
def test_masked_scalars_and_scales_are_refused(value, staging):
    a, b = host_ab()
    refused(NvblasltValueError, "^alpha: expected an array without masked elements", nvblaslt.matmul, a, b,
            alpha=value)
    from nvblaslt._scales import Scales

    from types import SimpleNamespace
    from nvblaslt import _dtypes
    f8 = _dtypes.FLOAT8_E4M3
    scales = Scales(types=SimpleNamespace(a=f8, b=f8, c=f8, d=_dtypes.FLOAT32), device=0, host=True)
    refused(NvblasltValueError, r"^quantization_scales\['a'\]: expected an array without masked elements",
            scales.check_values, {"a": value}, 0)


# ---- alpha and beta from host arrays ---------------------------------------------------------------
def test_one_element_host_arrays_and_cpu_tensors_are_alpha_and_beta(staging):
    torch = pytest.importorskip("torch")
    a, b = host_ab()
    c = np.ones((8, 6), np.float32)
    for alpha, beta in ((np.array(2.0), np.array([0.5])), (torch.tensor(2.0), torch.tensor([0.5])),
                        (torch.tensor(2.0, requires_grad=True), np.float32(0.5))):
        mm = nvblaslt.Matmul.__new__(nvblaslt.Matmul)
        with pytest.raises(Staged):
            mm.__init__(a, b, c, alpha=alpha, beta=beta)
        assert (mm._alpha.value, mm._beta.value) == (2.0, 0.5)


def test_a_gpu_scalar_is_read_as_nvmath_python_reads_it_and_several_elements_are_refused(staging):
    a, b = host_ab()
    mm = nvblaslt.Matmul.__new__(nvblaslt.Matmul)
    with pytest.raises(Staged):
        mm.__init__(a, b, alpha=FakeGpuScalar(3.0))  # its value copied back (nvmath-python reads a CUDA scalar so)
    assert mm._alpha.value == 3.0
    staging.clear()
    refused(NvblasltValueError, r"^alpha: expected a number or a one-element array, got a ndarray of shape \(2,\)",
            nvblaslt.matmul, a, b, alpha=np.array([1.0, 2.0]))
    refused(NvblasltTypeError, "^alpha: expected a number, got str", nvblaslt.matmul, a, b, alpha="2")
    assert staging == []


# ---- negative strides ------------------------------------------------------------------------------
REVERSED = {
    "rows": lambda x: x[::-1],
    "columns": lambda x: x[:, ::-1],
    "both, stepped": lambda x: x[::-2, ::-1],
    "transposed": lambda x: x[::-1].T,
    "batch": lambda x: x.reshape(2, 4, 4)[::-1, :, ::-1],
    "broadcast": lambda x: np.broadcast_to(x[0, ::-1], (3, 4)),
}


@pytest.mark.parametrize("name", list(REVERSED))
def test_host_arrays_with_negative_strides_are_packed_densely(name):
    source = REVERSED[name](np.arange(32, dtype=np.float64).reshape(8, 4))
    op = _operands.read(source, "a", 0)
    assert op.host and op.ptr == source.__array_interface__["data"][0] and min(op.strides) < 0
    strides = _host.device_strides(op)
    assert min(strides) >= 0
    packed = np.full(_host.span_elements(op.shape, strides), np.nan)
    _host._copy_strided(op.ptr, op.strides, packed.ctypes.data, strides, op.shape, 8)
    view = np.lib.stride_tricks.as_strided(packed, op.shape, tuple(8 * s for s in strides))
    assert np.array_equal(view, source)
    if 0 in op.strides:
        return  # a broadcast array is never written back
    # and back into the reversed memory (an in-place c's copy back)
    target = np.zeros(source.shape)[tuple(slice(None, None, -1) for _ in source.shape)]
    target_strides = tuple(s // 8 for s in target.strides)
    _host._copy_strided(packed.ctypes.data, strides, target.ctypes.data, target_strides, op.shape, 8)
    assert np.array_equal(target, source)


def test_conjugated_copy_reads_negative_strides():
    source = (np.arange(6) + 1j * np.arange(6)).reshape(2, 3)[::-1, ::-1]
    op = _operands.read(source, "a", 0)
    out = np.zeros((2, 3), np.complex128)
    _host._conjugate_strided(op, out.ctypes.data, (3, 1))
    assert np.array_equal(out, source.conj())


def test_reversed_host_operands_reach_staging(staging):
    a, b = host_ab()
    with pytest.raises(Staged):
        nvblaslt.matmul(a[::-1], b[:, ::-1])
    assert staging[0].strides == (-4, 1)
    assert _host.device_strides(staging[0]) == (4, 1)


def test_gpu_arrays_with_negative_strides_stay_refused():
    from tests.fakes import FakeDLPack

    refused(NvblasltValueError, r"^a: expected non-negative strides in a GPU array", _operands.read,
            FakeDLPack((8, 4), strides=(-4, 1), ptr=0x7F0000010000), "a", 0)


def test_host_array_reaching_below_address_zero_is_refused():
    class Interface:
        __array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (8, False), "strides": (-4,), "version": 3}
    refused(NvblasltValueError, "^a: shape .* runs past the end of the address space", _operands.read,
            Interface(), "a", 0)


# ---- nvblaslt.set_log_level and Handle -------------------------------------------------------------
@pytest.mark.parametrize("level, cls", [("x", NvblasltTypeError), (99, NvblasltValueError),
                                        (-1, NvblasltValueError), (True, NvblasltTypeError),
                                        (2.0, NvblasltTypeError), (None, NvblasltTypeError)])
def test_set_log_level_refuses_what_cublaslt_cannot_take(level, cls, default_lib):
    refused(cls, r"^level: expected an int from 0 \(off\) to 5 \(API trace\), got", nvblaslt.set_log_level, level)


def test_set_log_level_takes_numpy_integers(default_lib):
    nvblaslt.set_log_level(np.int64(0))


@pytest.mark.parametrize("device, cls, pattern", [
    (-1, NvblasltValueError, r"^device: expected an integer in \[0, "),
    ("cuda:0", NvblasltTypeError, r"^device: expected an integer, got 'cuda:0' \(str\)"),
    (0.0, NvblasltTypeError, r"^device: expected an integer, got 0\.0"),
    (True, NvblasltTypeError, r"^device: expected an integer, got True"),
])
def test_handle_refuses_a_device_that_is_no_gpu_ordinal(device, cls, pattern, default_lib):
    refused(cls, pattern, nvblaslt.Handle, device)


def test_handle_refuses_a_gpu_this_process_does_not_see(default_lib, monkeypatch):
    from nvblaslt import _cuda

    monkeypatch.setattr(_cuda, "device_count", lambda: 2)
    refused(NvblasltValueError, r"^device: expected a GPU ordinal below 2 .*, got 2", nvblaslt.Handle, 2)


# ---- options: compute_type, fast_accumulation, qualifiers -----------------------------------------
@pytest.mark.parametrize("value, cls, pattern", [
    ("bogus", NvblasltValueError, r"'bogus' is not a member of cublasComputeType_t in any cuBLAS release"),
    (-5, NvblasltValueError, "-5 is not a value of cublasComputeType_t"),
    (72, NvblasltValueError, "COMPUTE_32I is not a compute type for floating-point matmuls"),
    (68.5, NvblasltTypeError, "expected a name or a cublasComputeType_t value, got float 68.5"),
    (object(), NvblasltTypeError, "expected a name or a cublasComputeType_t value"),
])
def test_matmul_options_refuse_a_compute_type_no_cublas_has_when_made(value, cls, pattern):
    refused(cls, rf"^options\.compute_type: {pattern}", nvblaslt.MatmulOptions, compute_type=value)
    refused(cls, rf"^options\.compute_type: {pattern}", nvblaslt.Matmul, *host_ab(),
            options={"compute_type": value})


def test_matmul_options_take_every_spelling_nvmath_python_and_nvblaslt_take():
    import enum

    class ComputeType(enum.IntEnum):  # nvmath-python's nvmath.linalg.ComputeType, as it numbers them
        COMPUTE_32F_FAST_TF32 = 77

    for value in (None, 77, np.int32(68), ComputeType.COMPUTE_32F_FAST_TF32, "tf32", "float32", "COMPUTE_32F",
                  "CUBLAS_COMPUTE_32F_FAST_16BF", "compute_64f"):
        assert nvblaslt.MatmulOptions(compute_type=value).compute_type is value  # kept as given


def test_every_generated_binding_knows_no_compute_type_the_construction_check_misses():
    import importlib
    import pkgutil

    from nvblaslt import _generated
    from nvblaslt._generated import cublaslt_13

    newest = set(cublaslt_13.cublasComputeType_t.__members__.items())
    for module in pkgutil.iter_modules(_generated.__path__):
        members = importlib.import_module(f"nvblaslt._generated.{module.name}").cublasComputeType_t.__members__
        assert set(members.items()) <= newest, module.name


def test_with_shortcuts_applies_the_keywords_and_refuses_one_given_twice():
    from nvblaslt._options import MatmulOptions, with_shortcuts

    given = MatmulOptions(inplace=True)
    made = with_shortcuts(given, "tf32", "float16")
    assert (made.compute_type, made.result_type, made.inplace) == ("tf32", "float16", True)
    assert given.compute_type is None  # the caller's options are not changed
    assert with_shortcuts(None).compute_type is None and with_shortcuts({"result_type": "float32"}).result_type
    refused(NvblasltValueError, r"^compute_type: given both as a keyword \('tf32'\) and in options.compute_type "
            r"\('float32'\); give it once", with_shortcuts, {"compute_type": "float32"}, "tf32")
    refused(NvblasltValueError, r"^compute_type: given both", with_shortcuts, {"compute_type": "tf32"}, "tf32")
    refused(NvblasltValueError, r"^result_type: given both as a keyword \('float16'\) and in options.result_type",
            with_shortcuts, MatmulOptions(result_type="float32"), None, "float16")
    refused(NvblasltValueError, "^compute_type: 'bogus' is not a member", with_shortcuts, None, "bogus")


def test_fast_accumulation_for_non_fp8_operands_is_accepted_with_a_warning(default_lib):
    """nvmath-python (0.9) sets FAST_ACCUM on any matmul descriptor and cuBLASLt ignores it but for
    fp8: a call nvmath-python accepts keeps working, and the warning says the option does nothing."""
    from tests.fakes import FakeDLPack

    mm = nvblaslt.Matmul(FakeDLPack((8, 4)), FakeDLPack((4, 6), ptr=0x7F0000100000),
                         options={"fast_accumulation": True})
    with pytest.warns(UserWarning, match=r"^options\.fast_accumulation: has an effect on fp8 operands only; "
                                         r"ignored for float32 × float32") as record:
        try:
            mm.plan()
        except NvblasltError:
            pass  # no GPU: the handle
    assert record[0].filename == __file__  # pointed at the caller's plan()


def qualifiers(*conjugate, n=3):
    from nvblaslt import matrix_qualifiers_dtype

    found = np.zeros(n, dtype=matrix_qualifiers_dtype)
    for index, value in enumerate(conjugate):
        found[index]["is_conjugate"] = value
    return found


def test_qualifiers_of_another_length_or_flag_are_refused():
    from nvblaslt._options import conjugate_flags

    assert conjugate_flags(qualifiers(1, 0)) == (True, False)
    assert conjugate_flags([{"is_conjugate": False}, {"is_conjugate": True}, {"is_conjugate": 0}]) == (False, True)
    for n in (0, 2, 4):
        refused(NvblasltValueError, rf"^qualifiers: expected 3 entries \(A, B, C\), got {n}", conjugate_flags,
                qualifiers(n=n))
    refused(NvblasltValueError, r"^qualifiers\['a'\]\['is_conjugate'\]: expected the integer 0 or 1 \(or a bool\), "
            r"got (np.int32\()?2\b", conjugate_flags, qualifiers(2))  # NumPy < 2 prints it as 2
    refused(NvblasltValueError, r"^qualifiers\['b'\]\['is_conjugate'\]: expected the integer 0 or 1",
            conjugate_flags, [{"is_conjugate": 0}, {"is_conjugate": 0.5}, {"is_conjugate": 0}])
    refused(NvblasltTypeError, r"^qualifiers: expected an array of 3 matrix qualifiers \(A, B, C\), got dict",
            conjugate_flags, {"x": 0, "y": 0, "z": 0})
    refused(NvblasltValueError, r"^qualifiers: expected 3 entries", nvblaslt.Matmul, *host_ab(),
            qualifiers=qualifiers(n=2))


# ---- epilog given as a NumPy integer ----------------------------------------------------------------
def test_epilog_takes_any_integer_and_refuses_floats_and_bools():
    from nvblaslt._epilogs import as_epilog

    for value in (np.int64(2), np.uint8(2), np.int32(2), 2, "relu"):
        assert as_epilog(value) is nvblaslt.MatmulEpilog.RELU
    refused(NvblasltValueError, "^epilog: expected one of DEFAULT, .* got value 12345", as_epilog, np.int64(12345))
    for value in (2.0, np.float64(2.0), True, np.True_, [2]):
        refused(NvblasltTypeError, r"^epilog: expected a MatmulEpilog, its name or its value, got", as_epilog, value)


def test_numpy_integer_epilog_reaches_staging(staging):
    with pytest.raises(Staged):
        nvblaslt.matmul(*host_ab(), epilog=np.int64(2))


# ---- nvblaslt.torch --------------------------------------------------------------------------------
def test_torch_linear_refuses_what_is_not_a_tensor():
    torch = pytest.importorskip("torch")
    nt = pytest.importorskip("nvblaslt.torch")
    x, weight = torch.ones(2, 4), torch.ones(3, 4)
    refused(NvblasltTypeError, r"^x: expected a torch.Tensor, got numpy.ndarray", nt.linear, np.ones((2, 4)), weight)
    refused(NvblasltTypeError, r"^weight: expected a torch.Tensor, got numpy.ndarray", nt.linear, x, np.ones((3, 4)))
    refused(NvblasltTypeError, r"^bias: expected a torch.Tensor or None, got numpy.ndarray", nt.linear, x, weight,
            np.ones(3))
    refused(NvblasltTypeError, r"^x: expected a torch.Tensor, got builtins.list", nt.linear, [[1.0] * 4], weight)


def test_torch_fuse_and_fused_linear_refuse_bad_arguments():
    torch = pytest.importorskip("torch")
    nt = pytest.importorskip("nvblaslt.torch")
    refused(NvblasltTypeError, r"^module: expected a torch.nn.Module, got builtins.int", nt.fuse, 5)
    refused(NvblasltTypeError, r"^module: expected a torch.nn.Module, got builtins.list", nt.fuse,
            [torch.nn.Linear(2, 2)])
    refused(NvblasltValueError, r"^in_features: expected an int ≥ 0, got -1", nt.FusedLinear, -1, 4)
    refused(NvblasltValueError, r"^out_features: expected an int ≥ 0, got -2", nt.FusedLinear, 4, -2)
    refused(NvblasltTypeError, r"^in_features: expected an int ≥ 0, got float 4.0", nt.FusedLinear, 4.0, 4)
    refused(NvblasltTypeError, r"^out_features: expected an int ≥ 0, got bool True", nt.FusedLinear, 4, True)
    layer = nt.FusedLinear(np.int64(4), 3)
    assert (layer.in_features, layer.weight.shape) == (4, (3, 4)) and type(layer.in_features) is int


def test_torch_autotune_refuses_iterations_where_given():
    nt = pytest.importorskip("nvblaslt.torch")
    refused(NvblasltValueError, r"^iterations: expected an int ≥ 1 \(timed rounds per candidate\), got 0",
            nt.autotune, iterations=0)
    refused(NvblasltTypeError, r"^iterations: expected an int ≥ 1", nt.autotune, iterations=2.5)
    refused(NvblasltTypeError, r"^iterations: expected an int ≥ 1", nt.autotune, iterations=True)
    with nt.autotune(iterations=np.int64(2)):
        from nvblaslt.torch import _tuning

        assert _tuning.first_search(lambda: "problem") == 2
