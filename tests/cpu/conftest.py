"""Set-up of the tests without a GPU."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def quick_settling(monkeypatch):
    """A search runs its incumbent back to back for ``_timing.SETTLE_S`` (0.3 s) before its screening and each
    duel, for the GPU's power state: on these tests' stand-in plans that is only wall time, so they settle for
    2 ms (tests that check the settling pass their own time or read the constant)."""
    from nvblaslt import _timing

    monkeypatch.setattr(_timing, "SETTLE_S", 0.002)
