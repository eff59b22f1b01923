"""examples/conv_bias_relu.py on the GPU: the seed's cases through cuBLASLt, DRELU_BGRAD by hand, and a conv net
of FusedConv2d layers checked against float64 (its CPU part runs in tests/cpu/test_conv.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def test_conv_bias_relu_example_on_the_gpu():
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "conv_bias_relu.py")], capture_output=True,
                            text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for line in ("GEMMs on cuda (cuBLASLt)", "y = [[8.0, 12.0], [20.0, 24.0]]",
                 "dw for dy = ones: [[8.0, 12.0], [20.0, 24.0]]",
                 "dy = ones: [[0.0, 1.0, 1.0], [2.0, 6.0, 4.0], [2.0, 5.0, 3.0]]",
                 "the backward keeps x, w, y and nothing else (no other tensor): True",
                 "DRELU_BGRAD: layer 1's ReLU backward and bias gradient in layer 2's input-gradient GEMM",
                 "torch.float64: y and every gradient (9) within 1e-09 of float64",
                 "torch.bfloat16: y and every gradient within", "falls: True", "all checks passed: True"):
        assert line in out, out
    assert ": False" not in out, out
    assert "need a GPU" not in out
