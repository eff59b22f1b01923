"""The ``slow`` marker's rule: a slow test (the whole CPU fuzz table) runs only when ``-m`` names
``slow`` (``python -m pytest -m slow tests/fuzz``); otherwise it is deselected, so the default suite
and ``-m fuzz`` run the quick part alone."""

from __future__ import annotations

import re


def pytest_collection_modifyitems(config, items):
    if re.search(r"(?<!not )\bslow\b", config.getoption("markexpr") or ""):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        items[:] = [item for item in items if not item.get_closest_marker("slow")]
        config.hook.pytest_deselected(items=slow)
