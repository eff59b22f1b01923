"""The enums the core pins at import (nvblaslt._pinned) against every generated module the package ships:
a member both know has the same value everywhere, and the epilogs, orders and operations exist in every
release line. A newly generated module (``python -m codegen``) is checked as soon as it is committed."""

import importlib
import pkgutil

import pytest

import nvblaslt._generated as generated
from nvblaslt._pinned import PINNED

MODULES = sorted(info.name for info in pkgutil.iter_modules(generated.__path__) if info.name.startswith("cublaslt_"))
EVERYWHERE = {"cublasLtEpilogue_t", "cublasLtOrder_t", "cublasOperation_t"}  # compute types grow by release


def test_the_package_ships_more_than_one_release_line():
    assert len(MODULES) >= 2, MODULES


@pytest.mark.parametrize("module_name", MODULES)
@pytest.mark.parametrize("enum_name", sorted(PINNED))
def test_a_pinned_enum_means_the_same_in_every_generated_module(module_name, enum_name):
    module = importlib.import_module(f"nvblaslt._generated.{module_name}")
    theirs = {member.name: member.value for member in getattr(module, enum_name)}
    ours = {member.name: member.value for member in PINNED[enum_name]}
    shared = ours.keys() & theirs.keys()
    assert shared, f"{module_name}.{enum_name} shares no member with the pinned enum"
    assert {name: theirs[name] for name in shared} == {name: ours[name] for name in shared}
    if enum_name in EVERYWHERE:
        assert theirs.keys() == ours.keys(), f"{module_name}.{enum_name}: {sorted(theirs.keys() ^ ours.keys())}"


def test_the_core_reads_its_pinned_enums_from_one_module():
    import nvblaslt._epilogs as epilogs
    import nvblaslt._problem as problem
    import nvblaslt._types as types

    assert epilogs.cublasLtEpilogue_t is PINNED["cublasLtEpilogue_t"]
    assert types.cublasComputeType_t is PINNED["cublasComputeType_t"]
    assert problem.cublasLtOrder_t is PINNED["cublasLtOrder_t"]
    assert problem.cublasOperation_t is PINNED["cublasOperation_t"]
