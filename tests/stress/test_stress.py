r"""The GPU stress script's pytest entry: a few of its cases (``--only``), each in its own process as the
script runs them, none failing. Marked ``gpu`` and ``stress``: skipped without a GPU.

    python -m pytest -m stress tests
    python -m tests.stress.gpu_stress \
        --only bias-broadcast-batched,dlpack-huge-ndim,degenerate-shapes,nan-inf-propagate,graph-execute-out
"""

from __future__ import annotations

import re

import pytest

from tests.scripts import run_script

pytestmark = [pytest.mark.gpu, pytest.mark.stress]

SMOKE = ("bias-broadcast-batched", "dlpack-huge-ndim", "degenerate-shapes", "nan-inf-propagate", "graph-execute-out")


def test_gpu_stress_smoke_cases_pass():
    run = run_script("tests.stress.gpu_stress", "--only", ",".join(SMOKE), timeout=540)
    summary = run.summary("gpu_stress: ")
    found = re.match(r"gpu_stress: (\d+) cases: (\d+) passed, (\d+) failed", summary)
    assert found, summary
    counted, passed, failed = (int(g) for g in found.groups())
    assert failed == 0 and run.code == 0, f"{run.command}: {summary}\n{run.tail()}"
    if counted == 0:
        pytest.skip(f"every smoke case skipped on this machine: {summary}")
    assert passed == counted, summary
