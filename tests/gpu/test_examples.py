"""Every program in examples/ is run here; the tutorial must print what the seed notebook shows."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# The outputs shown in NVIDIA's epilog tutorial (the seed), cell by cell.
SEED_TUTORIAL = """\
DEFAULT, RELU, RELU_AUX, BIAS, RELU_BIAS, RELU_AUX_BIAS, DRELU, DRELU_BGRAD, GELU, GELU_AUX, GELU_BIAS, GELU_AUX_BIAS, DGELU, DGELU_BGRAD, BGRADA, BGRADB

A @ B:
[[ 19. -22.]
 [-13.  14.]]

relu(A @ B):
[[19.  0.]
 [ 0. 14.]]

a @ b:
[[5. 5. 5. 5.]
 [5. 5. 5. 5.]
 [5. 5. 5. 5.]]

a @ b + bias:
[[ 5.  5.  5.  5.]
 [15. 15. 15. 15.]
 [25. 25. 25. 25.]]

a @ b:
[[ 19. -22.]
 [-13.  14.]]

a @ b + bias:
[[  9. -32.]
 [ -3.  24.]]

relu(a @ b + bias):
[[ 9.  0.]
 [ 0. 24.]]

a @ b:
[[ 19. -22.]
 [-13.  14.]]

relu(a @ b):
[[19.  0.]
 [ 0. 14.]]

aux is a <class 'dict'> with the following keys: dict_keys(['relu_aux'])
aux[relu_aux] is <class 'cupy.ndarray'> with dtype uint8
"""


def run(name: str, *args: str) -> str:
    result = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_every_example_has_a_test():
    tested = {"epilog_tutorial.py", "linear_layer.py", "digits_mlp.py", "gelu_fusion.py", "torch_autograd.py",
              "descriptor_level.py", "regenerate_bindings.py",
              "conv_bias_relu.py",  # run by test_example_conv.py (GPU) and tests/cpu/test_conv.py (CPU)
              "moe_experts.py",  # run by test_grouped_gpu.py (GPU) and tests/cpu/test_grouped_torch.py (CPU)
              "torch_ddp_mlp.py",  # run under torchrun by test_examples_torch.py
              "jax_mlp.py", "jax_moe.py"}  # jax_moe.py also runs on the CPU in tests/cpu/test_jax_nn.py
    assert {p.name for p in EXAMPLES.glob("*.py")} == tested


@pytest.mark.gpu
def test_epilog_tutorial_prints_what_the_seed_shows():
    pytest.importorskip("cupy")
    assert run("epilog_tutorial.py") == SEED_TUTORIAL


@pytest.mark.gpu
def test_linear_layer_fused_agrees_with_naive():
    pytest.importorskip("cupy")
    out = run("linear_layer.py")
    assert "forward RELU_AUX_BIAS  vs naive" in out and "backward DRELU_BGRAD vs naive" in out
    assert "backward DRELU_BGRAD" in out.split("timings")[1]


@pytest.mark.gpu
def test_digits_mlp_trains_to_95_percent_and_matches_autograd():
    pytest.importorskip("sklearn")
    out = run("digits_mlp.py")
    assert "largest relative difference" in out and "test accuracy" in out.splitlines()[-1]


@pytest.mark.gpu
def test_gelu_fusion_reports_the_tanh_approximation():
    out = run("gelu_fusion.py")
    assert "vs exact (erf) GELU" in out and "GELU_BIAS (1 call)" in out


@pytest.mark.gpu
def test_torch_autograd_function_passes_gradcheck():
    out = run("torch_autograd.py")
    assert "gradcheck in float" in out and ": True" in out
    assert "torch.bfloat16" in out


@pytest.mark.gpu
def test_jax_mlp_trains_with_optax_and_matches_jax_grad():
    pytest.importorskip("flax")
    pytest.importorskip("optax")
    out = run("jax_mlp.py")
    assert "gradients match jax.grad of the jnp expression: True" in out, out
    assert "loss falls: True" in out and "held-out accuracy" in out, out


@pytest.mark.gpu
def test_jax_moe_trains_with_optax_and_matches_a_loop_over_the_experts():
    pytest.importorskip("flax")
    pytest.importorskip("optax")
    out = run("jax_moe.py")
    assert "gradients match jax.grad of the plain loop (an empty expert, rows past the total): True" in out, out
    assert "loss falls: True" in out, out


@pytest.mark.gpu
def test_descriptor_level_example():
    assert "cublasLtMatmul with RELU_BIAS: relative error" in run("descriptor_level.py")


def test_regenerate_bindings_walkthrough():
    pytest.importorskip("pycparser")
    pytest.importorskip("jinja2")
    if not any(_installed(wheel) for wheel in ("nvidia-cublas", "nvidia-cublas-cu12")):
        pytest.skip("needs a cuBLAS wheel to generate from")
    out = run("regenerate_bindings.py")
    assert "2. -m codegen --header" in out and "3. pins for headers/pins" in out
    if "is not the release" in out:  # the committed module is compared by test_codegen_committed instead
        pytest.skip(f"installed headers are not the pinned ones: {out.splitlines()[-1].removeprefix('4. ')}")
    assert "4. body identical to the committed" in out and out.rstrip().endswith("True")


def _installed(dist_name: str) -> bool:
    try:
        importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True
