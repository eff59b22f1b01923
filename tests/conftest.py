"""Shared test set-up: the `gpu` marker skips without a GPU; the installed libcublasLt builds."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

# The NVIDIA wheels nvblaslt supports and where each keeps its libcublasLt.
_WHEEL_LIBRARIES = {
    "nvidia-cublas-cu12": "nvidia/cublas/lib/libcublasLt.so.12",
    "nvidia-cublas": "nvidia/cu13/lib/libcublasLt.so.13",
}


def installed_library_paths() -> list[str]:
    paths = []
    for dist_name, member in _WHEEL_LIBRARIES.items():
        try:
            path = Path(importlib.metadata.distribution(dist_name).locate_file(member))
        except importlib.metadata.PackageNotFoundError:
            continue
        if path.is_file():
            paths.append(str(path))
    return paths


def has_gpu() -> bool:
    from nvblaslt import _cuda

    return _cuda.device_count() > 0


def pytest_collection_modifyitems(config, items):
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", params=installed_library_paths() or [None],
                ids=lambda p: Path(p).name if p else "default")
def lib(request):
    """Each installed libcublasLt (12.x and 13.x wheels), loaded with its bindings."""
    from nvblaslt import load

    return load(request.param)
