"""The differential harness's own CPU self-test (no GPU, no nvmath-python): ``nvmath_diff --self-test`` runs a
NumPy stand-in for both libraries through the harness's arrays, references and verdicts. Marked
``differential``; it runs on every machine, with the GPU hidden as the CPU fuzz hides it.

    python -m pytest tests/differential/test_nvmath_diff_harness.py
    python -m tests.differential.nvmath_diff --self-test none --cases 150      # by hand, from the repository root
"""

from __future__ import annotations

import os
import re

import pytest

from tests.scripts import run_script

pytestmark = pytest.mark.differential


@pytest.mark.parametrize("planted", ["none", "value", "order", "aux-dtype", "refuse-bias"])
def test_nvmath_diff_harness_judges_a_numpy_stand_in(planted):
    """The differential test's own machinery (arrays, references, verdicts), without a GPU: a NumPy stand-in
    for both libraries agrees with itself, and each defect planted in its nvblaslt half is caught."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", ""), PYTHONFAULTHANDLER="1")
    env.pop("NVBLASLT_LIBRARY", None)  # default discovery, as a user gets it
    run = run_script("tests.differential.nvmath_diff", "--self-test", planted, "--cases", "150", timeout=300, env=env)
    summary = next((line for line in run.out.splitlines() if line.startswith("nvmath_diff: ") and "cases:" in line),
                   "")
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (both ok|both refused|gaps|mismatches|wrong \(nvblaslt\))",
                                              summary)}
    assert summary, f"no summary line (exit {run.code}): {run.tail(12)}"
    if planted == "none":
        assert run.code == 0 and counts["both ok"] > 50 and not counts["gaps"] and not counts["mismatches"], summary
    else:
        caught = {"value": "wrong (nvblaslt)", "order": "mismatches", "aux-dtype": "mismatches",
                  "refuse-bias": "gaps"}[planted]
        assert counts[caught] > 0, summary
