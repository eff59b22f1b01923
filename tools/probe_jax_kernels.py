"""Where the MLP training step's GPU time goes, kernel by kernel (bench.jax's and bench.mlp's steps, CUPTI).

For each row of ``bench.jax`` (nvblaslt.jax.dense, XLA's jnp.dot + bias + activation, the GEMM-only floor,
and the ablations), and with ``--torch`` of ``bench.mlp`` (FusedLinear's step per backward mode, nn.Linear's,
the floor), prints the kernels one step runs: count and µs a step for each, the sum, and the wall time a step
waited for beside it (the difference is the GPU idle between kernels). torch.profiler's CUPTI activity
records every kernel of the process, XLA's and cuBLASLt's alike. The GPU's clock moves a few % between rows
seconds apart: compare kernels within a row, and rows only through the bench's interleaved rounds. On a GPU:

    PYTHONPATH=. python tools/probe_jax_kernels.py [--steps 3] [--activations relu,gelu] [--tokens 8192] [--torch]
"""

from __future__ import annotations

import argparse
import collections
import os
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the GPU

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from nvblaslt.bench.jax import steps  # noqa: E402


def _short(name: str, width: int = 96) -> str:
    return name if len(name) <= width else name[:width - 1] + "…"


def _kernels(run, count: int) -> tuple[dict, float]:
    """({kernel name: (calls, µs)} over ``count`` steps, the wall ms a step with a wait after each)."""
    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        started = time.perf_counter()
        for _ in range(count):
            jax.block_until_ready(run())
        wall = (time.perf_counter() - started) * 1e3 / count
    found: dict = collections.defaultdict(lambda: [0, 0.0])
    for event in trace.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time_total > 0:
            found[event.name][0] += 1
            found[event.name][1] += event.device_time_total
    return found, wall


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--widths", default="4096,16384,4096,16384,4096")
    parser.add_argument("--activations", default="relu,gelu")
    parser.add_argument("--torch", action="store_true", help="also bench.mlp's torch steps")
    options = parser.parse_args(argv)
    widths = [int(w) for w in options.widths.split(",")]
    key = jax.random.key(0)
    params = []
    for n_in, n_out in zip(widths, widths[1:]):
        key, k1, k2 = jax.random.split(key, 3)
        params.append(((jax.random.normal(k1, (n_in, n_out)) / n_in ** 0.5).astype(jnp.bfloat16),
                       (0.1 * jax.random.normal(k2, (n_out,))).astype(jnp.bfloat16)))
    x = jax.random.normal(key, (options.tokens, widths[0])).astype(jnp.bfloat16)
    dy = jax.random.normal(jax.random.key(1), (options.tokens, widths[-1])).astype(jnp.bfloat16)
    torch.ones(1, device="cuda")  # torch's context and profiler ready before the first trace
    print(f"{torch.cuda.get_device_name()}, JAX {jax.__version__}, torch {torch.__version__}; bf16, {options.tokens} "
          f"tokens, MLP {'→'.join(map(str, widths))}; µs per step over {options.steps} steps")
    for activation in options.activations.split(","):
        rows = {label: (lambda step=step: step(params, x, dy))
                for label, (step, _, _) in steps(jax, activation, len(widths) - 1, ablation=True).items()}
        if options.torch:
            rows.update(_torch_steps(activation, widths, options.tokens))
        for label, run in rows.items():
            for _ in range(3):
                jax.block_until_ready(run())
            found, wall = _kernels(run, options.steps)
            total = sum(us for _, us in found.values()) / options.steps
            print(f"\n[{activation}] {label}: kernels {total / 1e3:.3f} ms a step, wall {wall:.3f} ms "
                  f"(idle {wall - total / 1e3:.3f} ms)")
            for name, (calls, us) in sorted(found.items(), key=lambda item: -item[1][1]):
                print(f"  {us / options.steps:9.1f} µs  {calls / options.steps:4.1f}×  {_short(name)}")


def _torch_steps(activation: str, widths: list[int], tokens: int) -> dict:
    """bench.mlp's eager steps (each synchronized, so that ``block_until_ready`` of None waits for it)."""
    from nvblaslt import torch as nvtorch
    from nvblaslt.bench.mlp import MODES, _mlp, _step

    torch.manual_seed(0)
    x = torch.randn(tokens, widths[0], device="cuda", dtype=torch.bfloat16)
    grad = torch.randn(tokens, widths[-1], device="cuda", dtype=torch.bfloat16)
    reference = _mlp(torch, widths, activation, True, "cuda", torch.bfloat16)
    floor = _mlp(torch, widths, None, False, "cuda", torch.bfloat16)
    models = {"torch: nn.Linear + activation": reference, "torch: GEMM-only floor": floor}
    models.update({f"torch: FusedLinear, backward={mode!r}": nvtorch.fuse(reference, backward=mode) for mode in MODES})

    def synced(step):
        def run():
            step()
            torch.cuda.synchronize()
        return run

    return {label: synced(_step(model, list(model.parameters()), x, grad)) for label, model in models.items()}


if __name__ == "__main__":
    main()
