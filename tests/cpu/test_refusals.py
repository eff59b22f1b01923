"""Refusals that came late, never, or as a crash (issue 37), each on a machine without a GPU.

- ``options.handle``: 0, negative, beyond 64 bits, misaligned, unreadable, or nvblaslt's handle of
  another GPU is refused before cuBLASLt dereferences it (a bad one killed the interpreter);
- a host ``__array_interface__`` whose memory cannot be read is refused before it is read;
- ``out=`` with host operands before anything is staged; a CAI's shapes before its pointer is
  queried; a CAI of an unknown version;
- grouped GEMM on CPU tensors, with nvblaslt's error naming the argument;
- ``nvblaslt bench --sections import`` and ``nvblaslt info`` without a GPU or a library;
- ``load(path, process_wide=True)``: a chosen library without an environment variable.

A crash cannot be caught in the process that crashes: those cases run in a child interpreter.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

import nvblaslt
from nvblaslt import (Matmul, MatmulOptions, NvblasltTypeError, NvblasltValueError, _address,
                      _descriptors, _operands)
from nvblaslt._launch import Launch
from tests.fakes import FakeCAI, FakeDLPack, Reached, forbid_gpu_work, reached

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _child(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter from the repository root."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, timeout=300)


def _assert_refused(done: subprocess.CompletedProcess, argument: str) -> None:
    assert done.returncode == 0, f"exit {done.returncode} (a negative one is a signal): {done.stderr[-2000:]}"
    assert f"refused NvblasltValueError {argument}:" in done.stdout, done.stdout + done.stderr[-2000:]


# ---- options.handle --------------------------------------------------------------------------------------

_HANDLE_PROGRAM = """
import numpy as np
import nvblaslt
a, b = np.ones((4, 3), np.float32), np.ones((3, 2), np.float32)
for call in (lambda: nvblaslt.matmul(a, b, options={{"handle": {handle}}}),
             lambda: nvblaslt.Matmul(a, b, options=nvblaslt.MatmulOptions(handle={handle}))):
    try:
        call()
    except nvblaslt.NvblasltError as error:
        print("refused", type(error).__name__, str(error))
    else:
        print("accepted")
"""


@pytest.mark.parametrize("handle", [-1, 1, 0x5555_0000, 0, 0x7F00_0000_1004, 1 << 64],
                         ids=["negative", "one", "unmapped", "null", "misaligned", "beyond-64-bits"])
def test_a_handle_that_cannot_be_one_is_refused_in_a_child_that_survives(handle):
    done = _child(_HANDLE_PROGRAM.format(handle=handle))
    _assert_refused(done, "options.handle")
    assert done.stdout.count("refused NvblasltValueError options.handle:") == 2  # both forms


def test_the_handle_refusal_says_what_was_given_and_expected():
    with pytest.raises(NvblasltValueError, match=r"options.handle: expected a cublasLtHandle_t .*got -1"):
        MatmulOptions(handle=-1)
    with pytest.raises(NvblasltValueError, match="aligned to 8 bytes.*0x1004"):
        MatmulOptions(handle=0x1004)
    with pytest.raises(NvblasltValueError, match="cannot read"):
        MatmulOptions(handle=_unreadable_page())
    with pytest.raises(NvblasltTypeError, match="options.handle"):
        MatmulOptions(handle="0x1000")
    readable = (ctypes.c_uint64 * 8)()
    assert MatmulOptions(handle=ctypes.addressof(readable)).handle == ctypes.addressof(readable)


def test_a_handle_changed_after_the_options_were_made_is_checked_where_they_are_used():
    options = MatmulOptions()
    options.handle = -1  # a dataclass field: the object every call copies, and so checks again
    with pytest.raises(NvblasltValueError, match="options.handle"):
        nvblaslt.matmul(np.ones((4, 3), np.float32), np.ones((3, 2), np.float32), options=options)


@pytest.fixture
def fake_gpu(monkeypatch, default_lib):
    """Plans over stand-in GPU arrays: ``Launch.planned`` (where the handle is used) raises ``Reached``."""
    monkeypatch.setattr(Launch, "planned", classmethod(reached))


def test_nvblaslts_handle_of_another_gpu_is_refused_where_the_plan_is_made(fake_gpu, monkeypatch):
    memory = (ctypes.c_uint64 * 8)()  # readable, as a real handle is
    handle = ctypes.addressof(memory)
    a, b = FakeDLPack((8, 4)), FakeDLPack((4, 6), ptr=0x7F0000100000)  # on GPU 0
    monkeypatch.setitem(_descriptors._devices_of_handles, handle, 1)
    with pytest.raises(NvblasltValueError, match=r"options.handle: .*for GPU 0 .*Handle for GPU 1"):
        Matmul(a, b, options={"handle": handle})
    monkeypatch.setitem(_descriptors._devices_of_handles, handle, 0)
    with pytest.raises(Reached):  # the same handle made for GPU 0 is used
        Matmul(a, b, options={"handle": handle}).plan()


def test_a_destroyed_handle_leaves_the_registry_before_its_address_can_be_reused(monkeypatch):
    destroyed = []
    monkeypatch.setitem(_descriptors._devices_of_handles, 0x7000, 3)
    _descriptors._destroy_handle(destroyed.append, 0x7000)
    assert destroyed == [0x7000] and 0x7000 not in _descriptors._devices_of_handles
    _descriptors.check_handle_device(0x7000, 0)  # a caller's own handle: taken on trust


# ---- the address probe -----------------------------------------------------------------------------------

def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                              ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


def _unreadable_page() -> int:
    """A page mapped with no access (PROT_NONE): a C read of it crashes; /proc/self/mem would still read it."""
    page = _libc().mmap(None, 4096, 0, 0x22, -1, 0)  # PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS
    assert page not in (None, ctypes.c_void_p(-1).value)
    return page


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="maps pages with Linux's flags")
def test_the_probe_tells_readable_memory_from_a_protected_or_unmapped_page():
    memory = (ctypes.c_uint64 * 8)()
    assert _address.readable(ctypes.addressof(memory), 8) is True
    assert _address.readable(_unreadable_page(), 8) is False
    libc = _libc()
    page = libc.mmap(None, 4096, 3, 0x22, -1, 0)  # readable, then unmapped
    assert _address.readable(page, 8) is True
    libc.munmap(page, 4096)
    assert _address.readable(page, 8) is False
    assert _address.readable_range(ctypes.addressof(memory), ctypes.addressof(memory) + 64) is True
    assert _address.readable_range(ctypes.addressof(memory), page + 1) is False  # the last byte is gone


def test_the_probe_has_no_answer_where_the_kernel_cannot_be_asked(monkeypatch):
    monkeypatch.setattr(_address.os, "name", "nt")
    assert _address.readable(0x1000, 8) is None
    MatmulOptions(handle=0x7F00_0000_1000)  # no answer is no refusal


# ---- host array interfaces -------------------------------------------------------------------------------

_FAKE_HOST_ARRAY = """
import nvblaslt
class Fake:
    def __init__(self, shape, pointer):
        self.__array_interface__ = {{"data": (pointer, False), "shape": shape, "typestr": "<f4", "version": 3}}
try:
    {call}
except nvblaslt.NvblasltError as error:
    print("refused", type(error).__name__, str(error))
"""


def test_a_host_operand_whose_memory_cannot_be_read_is_refused_before_it_is_staged():
    done = _child(_FAKE_HOST_ARRAY.format(call="nvblaslt.matmul(Fake((4, 3), 0x55550000), Fake((3, 2), 0x55550000))"))
    _assert_refused(done, "a")
    assert "cannot be read in this process" in done.stdout


def test_a_host_fp8_scale_whose_memory_cannot_be_read_is_refused_not_read(default_lib):  # the scale is read by the plan
    pytest.importorskip("torch")
    call = ("import torch; a = torch.ones(16, 16).to(torch.float8_e4m3fn); "
            "nvblaslt.matmul(a, a.T, quantization_scales={'a': Fake((1,), 0x55550000), 'b': 1.0}, "
            "options={'result_type': 'bfloat16'})")
    done = _child(_FAKE_HOST_ARRAY.format(call=call))  # it read the float at the address: SIGSEGV
    _assert_refused(done, "quantization_scales['a']")


# ---- out=, CUDA array interface --------------------------------------------------------------------------

def test_out_with_host_operands_is_refused_before_anything_is_staged(monkeypatch, default_lib):
    touched = forbid_gpu_work(monkeypatch)
    a, b = np.ones((4, 3), np.float32), np.ones((3, 2), np.float32)
    with pytest.raises(NvblasltValueError, match="out: not available for host operands"):
        nvblaslt.matmul(a, b, out=np.empty((4, 2), np.float32))
    assert touched == []


@pytest.fixture
def no_driver(monkeypatch):
    """cudaPointerGetAttributes answers as on a machine without a driver, and records each question."""
    from cuda.bindings import runtime

    asked = []

    def pointer_attributes(pointer):
        asked.append(pointer)
        return runtime.cudaError_t.cudaErrorInsufficientDriver, None
    monkeypatch.setattr(_operands, "cudart", types.SimpleNamespace(
        cudaPointerGetAttributes=pointer_attributes, cudaError_t=runtime.cudaError_t,
        cudaMemoryType=runtime.cudaMemoryType))
    return asked


def test_cai_shapes_are_checked_though_no_driver_can_say_where_the_pointer_lives(no_driver, default_lib):
    with pytest.raises(NvblasltValueError, match="'K' extent must match"):
        nvblaslt.matmul(FakeCAI((4, 3)), FakeCAI((5, 2), ptr=0x7F0000100000))
    assert no_driver  # asked, and the shapes still came first
    with pytest.raises(NvblasltValueError, match="'K' extent must match"):
        Matmul(FakeCAI((4, 3)), FakeCAI((5, 2), ptr=0x7F0000100000))


@pytest.mark.parametrize("version", [99, 4, -1, "3", True])
def test_a_cai_of_a_version_the_specification_has_not_is_refused_by_name(version, no_driver):
    array = FakeCAI((4, 3))
    array.__cuda_array_interface__["version"] = version
    with pytest.raises(NvblasltValueError, match=r"a: __cuda_array_interface__ version .*reads versions 0 to 3"):
        _operands.read(array, "a", 0)
    assert no_driver == []  # refused before any question to CUDA


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_the_specifications_cai_versions_are_read(version, no_driver):
    array = FakeCAI((4, 3))
    array.__cuda_array_interface__["version"] = version
    assert _operands.read(array, "a", 0).shape == (4, 3)


# ---- grouped GEMM on CPU tensors -------------------------------------------------------------------------

def test_grouped_gemm_refuses_cpu_tensors_by_name():
    torch = pytest.importorskip("torch")
    a, b = torch.ones(64, 32, dtype=torch.bfloat16), torch.ones(4, 32, 16, dtype=torch.bfloat16)
    offs = torch.tensor([16, 32, 48, 64], dtype=torch.int32)
    for call in (lambda: nvblaslt.grouped_matmul(a, b, offs), lambda: nvblaslt.GroupedMatmul(a, b, offs),
                 lambda: nvblaslt.grouped_matmul(a, b, offs, stream=0)):
        with pytest.raises(NvblasltValueError, match=r"^a: expected an array on the GPU .*host Tensor"):
            call()
    with pytest.raises(NvblasltTypeError, match="^a: expected an array on the GPU, got None"):
        nvblaslt.grouped_matmul(None, b, offs)


# ---- the command line without a GPU or a library ---------------------------------------------------------

def test_bench_import_section_runs_without_a_gpu(tmp_path):
    done = subprocess.run([sys.executable, "-m", "nvblaslt", "bench", "--sections", "import", "--rounds", "1",
                           "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "import nvblaslt" in done.stdout and "no GPU" in done.stdout
    assert "first result, nvblaslt.matmul" not in done.stdout  # the rows that need a GPU


def test_bench_sections_that_need_a_gpu_say_which_one_runs_without(tmp_path):
    done = subprocess.run([sys.executable, "-m", "nvblaslt", "bench", "--sections", "percall", "--out",
                           str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 2
    assert "--sections import runs without one" in done.stderr or "needs PyTorch" in done.stderr


def test_info_without_a_library_still_prints_the_driver_lines(tmp_path):
    done = subprocess.run([sys.executable, "-m", "nvblaslt", "info"], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "NVBLASLT_LIBRARY": str(tmp_path / "libcublasLt.so.99")})
    assert done.returncode == 1
    assert "libcublasLt:   not loaded:" in done.stdout
    for line in ("cuda-bindings:", "driver:", "GPU"):
        assert line in done.stdout, done.stdout
    assert "features:" not in done.stdout


def test_info_lists_the_features_of_the_loaded_library(default_lib, capsys):
    from nvblaslt.__main__ import info

    assert info() == 0
    out = capsys.readouterr().out
    assert "features:" in out and "RELU_AUX_BIAS" in out
    assert "fp8:         yes" in out
    grouped = "yes" if default_lib.version >= 130400 else "no: grouped GEMM needs cuBLASLt 13.4"
    assert f"grouped:     {grouped}" in out
    assert "block scale:" in out


def test_info_says_how_to_get_grouped_gemm_where_the_library_is_too_old(default_lib, monkeypatch, capsys):
    from nvblaslt.__main__ import info

    monkeypatch.setattr(default_lib, "version", 130100)
    assert info() == 0
    out = capsys.readouterr().out
    assert "grouped:     no: grouped GEMM needs cuBLASLt 13.4 or newer; the loaded library is 13.1.0" in out
    assert "pip install --no-deps --target DIR 'nvidia-cublas>=13.4'" in out and "process_wide=True" in out


# ---- a chosen library without an environment variable ----------------------------------------------------

_PROCESS_WIDE = """
import nvblaslt
lib = nvblaslt.load({path!r}, process_wide=True)
assert nvblaslt.library() is lib and lib.found_via == "nvblaslt.load(process_wide=True)"
assert nvblaslt.load({path!r}, process_wide=True) is lib  # the same file again: the library in use
nvblaslt.MatmulDesc(nvblaslt.lt.CUBLAS_COMPUTE_32F, nvblaslt.lt.CUDA_R_32F).close()  # and it serves
try:
    nvblaslt.load("/elsewhere/libcublasLt.so.13", process_wide=True)
except nvblaslt.NvblasltStateError as error:
    print("refused", error)
"""


def test_load_process_wide_chooses_the_library_without_an_environment_variable(default_lib, tmp_path):
    done = _child(_PROCESS_WIDE.format(path=default_lib.path),
                  env={"NVBLASLT_LIBRARY": str(tmp_path / "libcublasLt.so.99")})  # not what is used
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused process_wide: nvblaslt already uses" in done.stdout


def test_load_process_wide_takes_a_link_to_the_library_in_use_as_that_library(default_lib, tmp_path):
    link = tmp_path / "libcublasLt.so.13"
    link.symlink_to(default_lib.path)
    done = _child(f"""
        import nvblaslt
        used = nvblaslt.library()
        assert nvblaslt.load({str(link)!r}, process_wide=True) is used
        print("same")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "same", done.stderr[-2000:]


def test_load_process_wide_must_be_a_bool(default_lib):
    with pytest.raises(NvblasltTypeError, match="process_wide: expected a bool"):
        nvblaslt.load(default_lib.path, process_wide="yes")
