"""The array-package adapters (``nvblaslt._frameworks``) on a machine without a GPU: whose an array
is, what the NumPy and protocol-only adapters do, and the parts of the PyTorch and CuPy adapters
that need neither package nor GPU (stand-in classes named after their modules)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from nvblaslt import DeviceArray, NvblasltValueError, _dtypes, _operands
from nvblaslt._frameworks import BY_NAME, CUPY, JAX, NUMBA, NUMPY, PROTOCOL, TORCH, framework_of

from tests.fakes import FakeCAI, FakeDLPack


def stand_in(module: str, name: str = "Array", **members) -> type:
    """A class that claims to come from ``module``, as a package's array type does."""
    return type(name, (), {"__module__": module, **members})


@pytest.mark.parametrize("module, framework", [
    ("torch", TORCH), ("torch.nn.parameter", TORCH), ("cupy._core.core", CUPY), ("jax._src.array", JAX),
    ("jaxlib.xla_extension", JAX), ("numba.cuda.cudadrv.devicearray", NUMBA), ("numpy", NUMPY),
    ("dask.array.core", PROTOCOL), ("torchvision.tv_tensors", PROTOCOL),
])
def test_an_array_belongs_to_the_package_of_its_types_top_level_module(module, framework):
    assert framework_of(stand_in(module)()) is framework


def test_numpy_protocol_only_and_nvblaslts_own_arrays():
    assert framework_of(np.zeros(3)) is NUMPY
    assert framework_of(np.float32(1.0)) is NUMPY
    assert framework_of(FakeDLPack((2, 2))) is PROTOCOL
    assert framework_of(FakeCAI((2, 2))) is PROTOCOL
    assert framework_of(DeviceArray.__new__(DeviceArray)) is PROTOCOL
    assert framework_of([[1.0]]) is PROTOCOL


def test_each_adapter_is_found_by_its_name_and_prints_as_it():
    assert set(BY_NAME) == {"torch", "cupy", "jax", "numba", "numpy", "protocol"}
    for name, framework in BY_NAME.items():
        assert framework.name == name == str(framework)
        assert f"{framework}" == name
    assert [f for f in BY_NAME.values() if f.has_pool] == [TORCH, CUPY]


def test_an_operand_names_its_package_and_gives_its_adapter():
    op = _operands.read(np.zeros((2, 3), dtype=np.float32), "a", 0)
    assert op.host and op.kind == "numpy" and op.framework is NUMPY
    assert _operands.read(FakeDLPack((2, 3)), "a", 0).framework is PROTOCOL


@pytest.mark.parametrize("framework", [NUMPY, PROTOCOL, JAX, NUMBA])
def test_packages_without_streams_pools_or_hot_readers(framework):
    x = np.zeros((2, 3), dtype=np.float32)
    assert framework.stream_getter(None)() == 0
    assert framework.stream_getter(3)() == 0
    assert framework.stream_on(3) == 0
    assert framework.stream_of(x) == 0
    assert framework.fingerprint(x) is None
    assert framework.layout_reader(type(x)) is None
    assert framework.pool_allocator((2, 3), (3, 1), _dtypes.FLOAT32, 0) is None


def test_protocol_and_numpy_results_are_handed_back_as_they_are():
    array = object()
    assert NUMPY.hand_back(array) is array
    assert PROTOCOL.hand_back(array) is array


@pytest.mark.parametrize("framework", [NUMPY, PROTOCOL, CUPY, JAX])
@pytest.mark.parametrize("shape, strides", [((3, 4), (4, 1)), ((3, 4), (1, 3)), ((2, 3, 4), (12, 1, 3)),
                                            ((3, 4), (1, 5)), ((5,), (1,))])
def test_host_results_are_numpy_arrays_laid_out_as_asked(framework, shape, strides):
    dtype = _dtypes.COMPLEX64
    x = framework.empty_host(shape, strides, dtype)
    assert isinstance(x, np.ndarray) and x.dtype == np.complex64 and x.shape == shape
    assert x.strides == tuple(s * dtype.itemsize for s in strides)
    x[...] = 1 + 2j  # writable, and every element its own
    assert framework.host_pointer(x) == x.__array_interface__["data"][0]
    assert _operands.read(x, "d", 0).strides == strides


class DLPackOnlyHostArray:
    """A CPU array that exports DLPack alone (no ``__array_interface__``)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_the_host_pointer_of_an_array_speaking_dlpack_alone():
    x = np.arange(24, dtype=np.float64).reshape(4, 6)[1:, 2:]
    wrapped = DLPackOnlyHostArray(x)
    assert PROTOCOL.host_pointer(wrapped) == x.__array_interface__["data"][0]
    assert _operands.read(wrapped, "c", 0).ptr == PROTOCOL.host_pointer(wrapped)


def test_cupy_results_without_a_numpy_dtype_are_nvblaslts_own(monkeypatch):
    # bfloat16 and fp8 have no typestr, so no CuPy array can hold them: nvblaslt's memory (CuPy not asked)
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    for dtype in (_dtypes.BFLOAT16, _dtypes.FLOAT8_E4M3, _dtypes.FLOAT8_E5M2):
        assert CUPY.pool_allocator((4, 4), (1, 4), dtype, 0) is None


def test_hot_readers_only_for_the_packages_own_array_types(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    for framework in (TORCH, CUPY):
        assert framework.layout_reader(stand_in("torch")) is None  # the package is not even loaded
    fake_cupy = stand_in("cupy", "module")
    fake_cupy.ndarray = stand_in("cupy._core.core", "ndarray")
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    assert CUPY.layout_reader(stand_in("cupy._core.core", "ndarray")) is None  # another type of that name
    read = CUPY.layout_reader(fake_cupy.ndarray)
    assert read is not None
    assert read([object()]) is None  # an array of another type: the checked path


# ---- PyTorch's lazy views, read through stand-in tensors (duck-typed like torch.Tensor) ----------
class Tensor:
    __module__ = "torch"

    def __init__(self, memory: FakeDLPack, conj=False, neg=False, requires_grad=False):
        self.memory, self.conj_bit, self.neg_bit, self.requires_grad = memory, conj, neg, requires_grad

    def is_conj(self):
        return self.conj_bit

    def is_neg(self):
        return self.neg_bit

    def conj(self):  # of a conjugate view: the same memory without the flag
        return Tensor(self.memory, not self.conj_bit, self.neg_bit, self.requires_grad)

    def detach(self):
        return Tensor(self.memory, self.conj_bit, self.neg_bit)

    def __dlpack__(self, **kwargs):
        if self.conj_bit or self.neg_bit or self.requires_grad:
            raise RuntimeError("PyTorch refuses to export this tensor")
        return self.memory.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.memory.__dlpack_device__()


def test_a_pytorch_conjugate_view_is_read_as_its_memory_with_the_bit_carried():
    memory = FakeDLPack((3, 4), dtype="complex64")
    tensor = Tensor(memory, conj=True)
    op = _operands.read(tensor, "a", 0x1234)
    assert op.obj is tensor and op.conjugated and op.kind == "torch"
    assert (op.ptr, op.shape, op.dtype) == (memory.ptr, (3, 4), _dtypes.COMPLEX64)
    assert memory.streams == [1]  # read on the legacy default stream, as the unconjugated view


def test_a_pytorch_tensor_requiring_grad_is_read_through_a_detached_view():
    memory = FakeDLPack((3, 4))
    tensor = Tensor(memory, requires_grad=True)
    op = _operands.read(tensor, "b", 0x1234)
    assert op.obj is tensor and not op.conjugated
    assert memory.streams == [0x1234]


def test_a_pytorch_negative_view_is_refused():
    with pytest.raises(NvblasltValueError, match=r"^c: a PyTorch negative-bit view .* \.resolve_neg\(\)"):
        _operands.read(Tensor(FakeDLPack((2, 2)), neg=True), "c", 0)


# ---- PyTorch itself, on the CPU (where it is installed) ------------------------------------------
@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def test_pytorch_tensors_and_parameters_are_torchs(torch):
    assert framework_of(torch.zeros(2)) is TORCH
    assert framework_of(torch.nn.Parameter(torch.zeros(2))) is TORCH
    assert _operands.read(torch.zeros(2, 3), "a", 0).framework is TORCH


def test_pytorch_host_results_are_cpu_tensors_laid_out_as_asked(torch):
    x = TORCH.empty_host((2, 3, 4), (12, 1, 3), _dtypes.BFLOAT16)
    assert isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.dtype == torch.bfloat16
    assert (tuple(x.shape), x.stride()) == ((2, 3, 4), (12, 1, 3))
    assert TORCH.host_pointer(x) == x.data_ptr()


def test_a_pytorch_fingerprint_and_its_lazy_views(torch):
    t = torch.zeros(3, 4, dtype=torch.complex64)[:, 1:]
    assert TORCH.fingerprint(t) == (t.data_ptr(), t.shape, (4, 1), torch.complex64, -1)
    assert TORCH.fingerprint(t.conj()) == (0, None, None, None, -1)  # not to be reused by a hot path


def test_the_hot_reader_leaves_cpu_tensors_to_the_checked_path(torch):
    read = TORCH.layout_reader(torch.Tensor)
    assert read is not None and TORCH.layout_reader(torch.nn.Parameter) is not None
    assert read([torch.zeros(2, 2), torch.zeros(2, 2)]) is None
    assert read([None]) == ([None], (None,))


def test_a_real_pytorch_conjugate_view_is_read_as_its_memory(torch):
    base = torch.randn(3, 4, dtype=torch.complex64)
    op = _operands.read(base.conj(), "a", 0)
    assert op.conjugated and op.host and op.framework is TORCH
    assert (op.ptr, op.shape, op.strides) == (base.data_ptr(), (3, 4), (4, 1))
    with pytest.raises(NvblasltValueError, match="negative-bit view"):
        _operands.read(base.conj().imag, "b", 0)  # the imaginary part of a conjugate view: negated lazily
