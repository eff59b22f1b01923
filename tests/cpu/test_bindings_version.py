"""One bindings module per cuBLAS major, generated from its newest release, serving every release
of that major: chosen by the loaded library's version, offering only what that library has."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

import nvblaslt
from nvblaslt import _attributes, _loader


def test_module_is_chosen_by_the_library_major(lib):
    assert lib.api.__name__ == f"nvblaslt._generated.cublaslt_{lib.version_tuple[0]}"
    assert lib.bindings_version[0] == lib.version_tuple[0]


def test_attribute_table_offers_only_what_the_library_knows(lib):
    probed = ["cublasLtMatmulDescAttributes_t", "cublasLtMatrixLayoutAttribute_t",
              "cublasLtMatmulPreferenceAttributes_t", "cublasLtMatmulAlgoConfigAttributes_t"]
    with nvblaslt.MatmulDesc(lib.api.CUBLAS_COMPUTE_32F, lib.api.CUDA_R_32F, lib=lib) as desc:
        for enum_name in probed:
            enum_type = getattr(lib.api, enum_name)
            table = lib.api.ATTRIBUTES[enum_type][2]
            offered = _attributes.supported(lib, enum_type)
            assert offered and set(offered) <= set(table)
            for member in set(table) - set(offered):
                with pytest.raises(nvblaslt.NvblasltValueError, match=f"{member.name}: cuBLASLt .* does not know"):
                    _attributes.attribute_spec(lib, member)
        # every value of every attribute the library knows reads back (failed on cuBLAS 12.4.5.8 before)
        enum_type = lib.api.cublasLtMatmulDescAttributes_t
        assert set(desc.attributes()) == {m.name for m in _attributes.supported(lib, enum_type)}


def test_the_release_a_module_was_generated_from_knows_all_of_it(lib):
    if lib.version_tuple != lib.bindings_version[:3]:
        pytest.skip(f"cuBLASLt {lib.version_tuple} is not the release the bindings come from ({lib.bindings_version})")
    assert _attributes.unsupported(lib) == {}


def test_an_older_library_lacks_what_came_later(lib):
    if lib.version_tuple >= lib.bindings_version[:3]:
        pytest.skip("the library is not older than its bindings (the lowest-versions CI step installs older ones)")
    unknown = _attributes.unsupported(lib)
    assert unknown or lib.missing, "an older release should lack something the newest one has"


def test_a_library_newer_than_its_bindings_warns_once(monkeypatch, lib):
    monkeypatch.setattr(lib.api, "CUBLAS_VERSION", (lib.version_tuple[0], 0, 0, 0))
    monkeypatch.setattr(_loader, "_warned", set())
    if lib.version_tuple == (lib.version_tuple[0], 0, 0):
        pytest.skip("the library is an x.0.0 release: nothing older to pretend the bindings are")
    with pytest.warns(UserWarning, match="newer than nvblaslt's newest bindings.*python -m codegen --header"):
        _loader.load(lib.path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _loader.load(lib.path)


def test_info_reports_what_the_library_lacks(lib):
    run = subprocess.run([sys.executable, "-m", "nvblaslt", "info"], capture_output=True, text=True,
                         env={**os.environ, _loader.ENV_LIBRARY: lib.path})
    out = run.stdout
    assert run.returncode == 0, run.stderr
    functions = len(lib.api.FUNCTIONS)
    assert f"{functions - len(lib.missing)}/{functions} exported by this library" in out
    for name in lib.missing:
        assert name in out
    for enum_name, members in _attributes.unsupported(lib).items():
        assert f"unknown {enum_name}: {', '.join(members)}" in out
