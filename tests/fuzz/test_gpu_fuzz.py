"""The GPU fuzz's pytest entry: ``gpu_fuzz`` for 300 calls at a fixed seed, no failure. Marked ``gpu`` and
``fuzz``: skipped without a GPU (and without torch, which the script draws its arrays with).

    python -m pytest -m fuzz tests
    python -m tests.fuzz.gpu_fuzz 300 2024      # the same run by hand, from the repository root
"""

from __future__ import annotations

import re

import pytest

from tests.scripts import run_script

pytestmark = [pytest.mark.gpu, pytest.mark.fuzz]

CALLS, SEED = 300, 2024


def test_gpu_fuzz_smoke_has_no_failure():
    pytest.importorskip("torch")
    run = run_script("tests.fuzz.gpu_fuzz", str(CALLS), str(SEED), timeout=540)
    summary = run.summary("gpu_fuzz: ")
    found = re.search(r"(\d+) calls .*?: (\d+) accepted and correct, (\d+) invalid calls refused, (\d+) failures",
                      summary)
    assert found, summary
    calls, correct, refused, failures = (int(g) for g in found.groups())
    assert failures == 0 and run.code == 0, f"{run.command}: {summary}\n{run.tail()}"
    assert calls == CALLS and correct > 0 and refused > 0, summary
