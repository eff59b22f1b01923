"""Shared test set-up.

- The ``gpu`` marker skips without a GPU.
- ``lib`` is each installed libcublasLt (12.x and 13.x wheels); ``default_lib`` the one
  ``nvblaslt.library()`` finds. Both skip, with the loader's reason, where there is none.
- On a machine with no libcublasLt at all, a test that fails because nvblaslt could not find
  one is reported as skipped with that reason, so the suite runs to the end without cuBLAS.
"""

from __future__ import annotations

import functools
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


@functools.cache
def no_library_reason() -> str | None:
    """Why nvblaslt finds no libcublasLt here (the loader's message), or None when it finds one."""
    from nvblaslt import LibraryNotFoundError, library

    try:
        library()
    except LibraryNotFoundError as exc:
        return f"needs libcublasLt: {str(exc).split('. ')[0]}"  # the loader's first sentence: what failed
    return None


def pytest_collection_modifyitems(config, items):
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if item.get_closest_marker("gpu"):  # the marker, not the keyword: every item under tests/gpu/ has that one
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None:
        from nvblaslt import LibraryNotFoundError

        reason = no_library_reason()
        if reason and call.excinfo.errisinstance(LibraryNotFoundError):
            report.outcome = "skipped"
            report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {reason}")


def _load_or_skip(path: str | None):
    from nvblaslt import LibraryNotFoundError, load

    try:
        return load(path)
    except LibraryNotFoundError as exc:
        pytest.skip(f"needs libcublasLt: {str(exc).split('. ')[0]}")


@pytest.fixture(scope="session", params=installed_library_paths() or [None],
                ids=lambda p: Path(p).name if p else "default")
def lib(request):
    """Each installed libcublasLt (12.x and 13.x wheels), loaded with its bindings."""
    return _load_or_skip(request.param)


@pytest.fixture(scope="session")
def default_lib():
    """The libcublasLt that ``nvblaslt.library()`` finds (what ``nvblaslt.lt`` and ``info`` use)."""
    reason = no_library_reason()
    if reason:
        pytest.skip(reason)
    from nvblaslt import library

    return library()
