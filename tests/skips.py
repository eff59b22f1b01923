"""Module-level skips the test files share."""

from __future__ import annotations

import pytest


def without_library() -> None:
    """Skip the calling test module where no libcublasLt loads: its shapes are planned by the library's rules."""
    import nvblaslt

    try:
        nvblaslt.library()
    except nvblaslt.LibraryNotFoundError:
        pytest.skip("no libcublasLt: shapes are planned with the library's own rules", allow_module_level=True)
