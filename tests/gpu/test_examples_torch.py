"""examples/torch_ddp_mlp.py under torchrun: on two GPUs (NCCL) when there are two, and on the CPU (gloo)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torch.distributed.run")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "torch_ddp_mlp.py"


def gpu_count() -> int:
    from nvblaslt import _cuda

    return _cuda.device_count()


def torchrun(*args: str) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off (the example sets these too)
    env.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(EXAMPLE),
               *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def check(out: str) -> None:
    for line in ("gradients before the all-reduce differ between ranks: True",
                 "gradients all-reduced (every rank holds the mean of the ranks' own): True",
                 "loss falls: True", "replicas identical at every step: True"):
        assert line in out, out
    assert "loss curves match nn.Linear" in out and out.rstrip().endswith("True"), out


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, activation", [("float32", "gelu"), ("bfloat16", "gelu"), ("bfloat16", "relu")])
def test_ddp_example_on_two_gpus(dtype, activation):
    """GELU layers are linked (DGELU in the next layer's GEMM), ReLU layers are not (their backward reads
    their output): both kinds of backward under DDP's gradient hooks."""
    if gpu_count() < 2:
        pytest.skip("needs two GPUs")
    out = torchrun("--dtype", dtype, "--activation", activation)
    assert "2 ranks (nccl, cuda)" in out and f"{dtype}, MLP 256,1024,512,64 {activation}" in out
    check(out)


def test_ddp_example_on_the_cpu_with_gloo():
    out = torchrun("--device", "cpu", "--steps", "12")
    assert "2 ranks (gloo, cpu)" in out
    check(out)
