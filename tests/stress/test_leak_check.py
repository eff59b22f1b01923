"""The leak check's pytest entry: a short run of ``gpu_leak_check`` in each mode (released with free(), and only
dropped), no leak. Marked ``gpu`` and ``stress``: skipped without a GPU (and without torch, which the script
draws its arrays with).

    python -m pytest -m stress tests
    python -m tests.stress.gpu_leak_check 5000 [--collect]      # the same run by hand, from the repository root
"""

from __future__ import annotations

import pytest

from tests.scripts import run_script

pytestmark = [pytest.mark.gpu, pytest.mark.stress]

CYCLES = 5000  # after the script's 2000 warm-up cycles


@pytest.mark.parametrize("mode", ["free", "collect"])
def test_leak_check_smoke_has_no_leak(mode):
    pytest.importorskip("torch")
    args = [str(CYCLES)] + (["--collect"] if mode == "collect" else [])
    run = run_script("tests.stress.gpu_leak_check", *args, timeout=540)
    summary = run.summary("gpu_leak_check: ")
    assert summary.endswith(": 0 leaks") and run.code == 0, f"{run.command}: {summary}\n{run.tail()}"
    assert summary.startswith(f"gpu_leak_check: {CYCLES} cycles"), summary
