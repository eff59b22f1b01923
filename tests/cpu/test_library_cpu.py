"""The bindings against the real libcublasLt, on a machine with or without a GPU."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

import nvblaslt
from nvblaslt import CublasLtError, LibraryNotFoundError, _attributes, _loader

from tests.conftest import has_gpu

# One way to create a descriptor of each kind, given a Library.
DESCRIPTORS = {
    "cublasLtMatmulDescAttributes_t": lambda lib: nvblaslt.MatmulDesc(
        lib.api.CUBLAS_COMPUTE_32F, lib.api.CUDA_R_32F, lib=lib),
    "cublasLtMatrixLayoutAttribute_t": lambda lib: nvblaslt.MatrixLayout(
        lib.api.CUDA_R_16F, 64, 32, 64, lib=lib),
    "cublasLtMatmulPreferenceAttributes_t": lambda lib: nvblaslt.MatmulPreference(lib=lib),
}


def _transform_desc(lib):
    handle = ctypes.c_void_p()
    lib.cublasLtMatrixTransformDescCreate(ctypes.byref(handle), lib.api.CUDA_R_32F)
    return handle.value, lambda: lib.cublasLtMatrixTransformDescDestroy(handle.value)


def _emulation_desc(lib):
    handle = ctypes.c_void_p()
    lib.cublasLtEmulationDescCreate(ctypes.byref(handle))
    return handle.value, lambda: lib.cublasLtEmulationDescDestroy(handle.value)


def _handles(lib):
    """(attribute enum name, raw handle, cleanup) for every kind this library can create."""
    for enum_name, make in DESCRIPTORS.items():
        desc = make(lib)
        yield enum_name, desc.handle, desc.close
    handle, cleanup = _transform_desc(lib)
    yield "cublasLtMatrixTransformDescAttributes_t", handle, cleanup
    if "cublasLtEmulationDescCreate" in lib.api.FUNCTIONS and "cublasLtEmulationDescCreate" not in lib.missing:
        handle, cleanup = _emulation_desc(lib)
        yield "cublasLtEmulationDescAttributes_t", handle, cleanup
    # Setting needs an algorithm cublasLtMatmulAlgoInit made (a GPU); sizes and reads work on zeros.
    algo = lib.api.cublasLtMatmulAlgo_t()
    yield "cublasLtMatmulAlgoConfigAttributes_t", ctypes.byref(algo), None


def test_every_attribute_size_matches_the_typed_table_and_round_trips(lib):
    checked = 0
    for enum_name, handle, cleanup in _handles(lib):
        enum_type = getattr(lib.api, enum_name)
        _getter, _setter, types = lib.api.ATTRIBUTES[enum_type]
        assert set(types) == set(enum_type), f"{enum_name}: table must cover every member"
        for member, (ctype, is_array) in _attributes.supported(lib, enum_type).items():
            size = _attributes.attribute_size(lib, handle, member)
            assert size == ctypes.sizeof(ctype), f"{member.name}: library says {size} bytes"
            value = _attributes.get_attribute(lib, handle, member)
            if cleanup is not None:
                _attributes.set_attribute(lib, handle, member, value)
                assert _attributes.get_attribute(lib, handle, member) == value, member.name
            checked += 1
        if cleanup is not None:
            cleanup()
    assert checked >= 50  # all but the algorithm capabilities, which need a GPU (cuBLAS 12.0 knows 59)


def test_typed_values_change_and_read_back(lib):
    api = lib.api
    with nvblaslt.MatmulDesc(api.CUBLAS_COMPUTE_32F, api.CUDA_R_32F, lib=lib) as desc:
        desc.set(api.CUBLASLT_MATMUL_DESC_EPILOGUE, api.CUBLASLT_EPILOGUE_RELU_AUX_BIAS)
        desc.set("EPILOGUE_AUX_LD", 2**40)  # packs an int64: survives a value no int32 holds
        desc.set("BIAS_POINTER", 0x7F00DEAD0000)
        desc.set("TRANSA", api.CUBLAS_OP_T)
        assert desc.get("EPILOGUE") == 134
        assert desc.get("EPILOGUE_AUX_LD") == 2**40 and isinstance(desc.get("EPILOGUE_AUX_LD"), int)
        assert desc.get("BIAS_POINTER") == 0x7F00DEAD0000
        assert desc.get("TRANSA") == 1
    with nvblaslt.MatmulPreference(max_workspace_bytes=1 << 25, lib=lib) as pref:
        pref.set("MAX_WAVES_COUNT", 1.5)
        assert pref.get("MAX_WAVES_COUNT") == 1.5
        assert pref.get("MAX_WORKSPACE_BYTES") == 1 << 25
    with nvblaslt.MatrixLayout(api.CUDA_R_16BF, 128, 64, 256, order=api.CUBLASLT_ORDER_ROW,
                               batch_count=3, batch_stride=128 * 256, lib=lib) as layout:
        assert layout.get("ROWS") == 128 and layout.get("LD") == 256 and layout.get("ORDER") == 1
        assert layout.get("BATCH_COUNT") == 3 and layout.get("STRIDED_BATCH_OFFSET") == 128 * 256


def test_wrong_size_set_raises_invalid_value_with_status_name_and_library_text(lib):
    api = lib.api
    with nvblaslt.MatmulDesc(api.CUBLAS_COMPUTE_32F, api.CUDA_R_32F, lib=lib) as desc:
        four_bytes = ctypes.c_int32(1)
        with pytest.raises(CublasLtError) as info:
            lib.cublasLtMatmulDescSetAttribute(desc.handle, api.CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                               ctypes.byref(four_bytes), 4)
    error = info.value
    assert error.status == api.CUBLAS_STATUS_INVALID_VALUE
    assert error.status_name == "CUBLAS_STATUS_INVALID_VALUE"
    assert error.library_message == lib.status_string(error.status) and error.library_message
    assert error.function == "cublasLtMatmulDescSetAttribute"
    assert "CUBLASLT_LOG_LEVEL" in str(error)


def test_bad_python_values_are_refused_before_c(lib):
    api = lib.api
    with nvblaslt.MatmulDesc(api.CUBLAS_COMPUTE_32F, api.CUDA_R_32F, lib=lib) as desc:
        with pytest.raises(nvblaslt.NvblasltValueError, match="EPILOGUE_AUX_LD: expected int64_t"):
            desc.set("EPILOGUE_AUX_LD", 2**63)
        with pytest.raises(nvblaslt.NvblasltTypeError, match="BIAS_POINTER"):
            desc.set("BIAS_POINTER", "not a pointer")
        with pytest.raises(nvblaslt.NvblasltValueError, match="not a member"):
            desc.set("NO_SUCH_ATTRIBUTE", 1)
        with pytest.raises(nvblaslt.NvblasltTypeError, match="cublasLtMatmulDescAttributes_t"):
            desc.set(api.CUBLASLT_MATRIX_LAYOUT_LD, 1)
        with pytest.raises(nvblaslt.NvblasltValueError, match="BIAS_POINTER: expected a pointer"):
            desc.set("BIAS_POINTER", -1)
        desc.set("EPILOGUE_AUX_LD", np.int64(256))  # NumPy integers are integers
        assert desc.get("EPILOGUE_AUX_LD") == 256
    desc.close()
    with pytest.raises(nvblaslt.NvblasltValueError, match="closed"):
        desc.get("EPILOGUE")
    with pytest.raises(nvblaslt.NvblasltValueError, match=r"rows: expected an integer in \[0, "):
        nvblaslt.MatrixLayout(api.CUDA_R_32F, -1, 4, 4, lib=lib)
    with pytest.raises(nvblaslt.NvblasltTypeError, match=r"ld: expected an integer, got .*4\.0"):
        nvblaslt.MatrixLayout(api.CUDA_R_32F, 4, 4, np.float64(4.0), lib=lib)
    with pytest.raises(nvblaslt.NvblasltTypeError, match="compute_type: expected an integer"):
        nvblaslt.MatmulDesc(None, api.CUDA_R_32F, lib=lib)
    nvblaslt.MatrixLayout(api.CUDA_R_32F, np.int64(4), 4, 4, lib=lib).close()


def test_handle_without_gpu_raises_a_clear_error(lib):
    if has_gpu():
        pytest.skip("a GPU is present")
    with pytest.raises(CublasLtError, match="CUBLAS_STATUS_NOT_INITIALIZED.*no usable CUDA GPU"):
        nvblaslt.Handle(0, lib=lib)


def test_missing_library_error_says_what_was_searched_and_how_to_fix(monkeypatch, tmp_path):
    monkeypatch.setenv(_loader.ENV_LIBRARY, str(tmp_path / "libcublasLt.so.99"))
    with pytest.raises(LibraryNotFoundError, match=r"libcublasLt\.so\.99 \(from \$NVBLASLT_LIBRARY\)"):
        _loader.load()


def test_unsupported_major_error_names_the_codegen_command(monkeypatch, lib):
    monkeypatch.setattr(_loader, "available_modules", lambda: {})
    with pytest.raises(LibraryNotFoundError, match="python -m codegen --header"):
        _loader.load(lib.path)


def test_info_cli_prints_the_library(default_lib):
    out = subprocess.run([sys.executable, "-m", "nvblaslt", "info"], capture_output=True, text=True, check=True)
    assert "libcublasLt:" in out.stdout and "libcublasLt.so" in out.stdout
    assert "nvblaslt._generated.cublaslt_" in out.stdout
    assert "exported by this library" in out.stdout and "known to this library" in out.stdout


def test_lt_namespace_has_the_whole_api(default_lib):
    from nvblaslt import lt

    assert callable(lt.cublasLtMatmul) and lt.cublasLtMatmul.argtypes
    assert lt.CUBLASLT_EPILOGUE_DGELU_BGRAD == 208
    assert lt.cublasLtMatmul.__doc__.startswith("cublasStatus_t cublasLtMatmul(")
    assert lt.library_path == default_lib.path and "cublasLtMatmul" in dir(lt)


_LOGGING_PROGRAM = """
import logging, sys
import nvblaslt
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="LOGGED %(name)s %(message)s")
nvblaslt.set_log_level(5)
nvblaslt.MatmulDesc(nvblaslt.lt.CUBLAS_COMPUTE_32F, nvblaslt.lt.CUDA_R_32F).close()
"""


def test_set_log_level_sends_the_library_log_to_the_logger_only(default_lib):
    out = subprocess.run([sys.executable, "-c", _LOGGING_PROGRAM], capture_output=True, text=True, check=True)
    assert "LOGGED nvblaslt cublasLtMatmulDescCreate" in out.stderr
    assert out.stdout == ""  # by default cuBLASLt prints its log to stdout as well


_WITHOUT_A_LIBRARY = """
import nvblaslt
from nvblaslt import *
assert hasattr(nvblaslt, "lt") and lt.__name__ == "nvblaslt.lt"
try:
    lt.cublasLtMatmul
except LibraryNotFoundError as exc:
    print("refused:", exc)
"""


def test_star_import_and_lt_work_without_a_library(tmp_path):
    env = {**os.environ, _loader.ENV_LIBRARY: str(tmp_path / "libcublasLt.so.99")}
    out = subprocess.run([sys.executable, "-c", _WITHOUT_A_LIBRARY], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "refused: libcublasLt at" in out.stdout
