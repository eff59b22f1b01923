"""Every example that needs a GPU ends, where there is none (or no driver nvblaslt can use), with one
line saying what it needs and exit status 1: never another library's traceback. The GPU is hidden
(``CUDA_VISIBLE_DEVICES=""``), so this runs alike on a CPU-only machine and a GPU one. The examples
with a CPU path (conv_bias_relu, moe_experts) run it without a GPU: tests/cpu/test_conv.py and
test_grouped_torch.py run them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NEED_A_GPU = {"descriptor_level.py": [], "digits_mlp.py": [], "epilog_tutorial.py": [], "gelu_fusion.py": [], "jax_mlp.py": [],
              "linear_layer.py": [], "torch_autograd.py": [], "torch_ddp_mlp.py": ["--device", "cuda"]}


@pytest.mark.parametrize("name", sorted(NEED_A_GPU))
def test_an_example_without_a_gpu_says_what_it_needs_in_one_line(name):
    done = subprocess.run([sys.executable, str(EXAMPLES / name), *NEED_A_GPU[name]], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and (lines[0].startswith("this example needs") or lines[0].startswith("no GPU")), lines
    assert done.stdout == ""


def test_every_example_is_sorted_into_one_that_needs_a_gpu_or_one_that_runs_without():
    runs_without = {"conv_bias_relu.py", "jax_moe.py", "moe_experts.py", "regenerate_bindings.py"}
    assert {p.name for p in EXAMPLES.glob("*.py")} == set(NEED_A_GPU) | runs_without
