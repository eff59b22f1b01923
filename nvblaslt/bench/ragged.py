"""``python -m nvblaslt.bench.ragged``: MoE expert GEMMs inside ``jax.jit``, ``nvblaslt.jax.ragged_dot``
against ``jax.lax.ragged_dot``, forward and forward + backward (``jax.vjp``: the input and the weight
gradients), beside ``nvblaslt.torch.grouped_mm``'s GPU time on the same shapes in the same run.

Shapes (bf16): Mixtral-8x7B's up projection (8 experts, K 4096 → N 14336, 16,384 rows, balanced),
Qwen3-30B-A3B's gate+up (128 experts, K 2048 → N 1536, 65,536 rows, Zipf-skewed), gpt-oss-20b's gate+up
(32 experts, K 2880 → N 5760, 16,384 rows, balanced) and DeepSeek-V3's experts (32 local experts, K 7168
→ N 4096, 16,384 rows, Zipf-skewed). Each JAX case is one jitted call timed as the wall clock over a burst
waited for once (the GEMMs bound it), every case once per round in a fresh order; torch's with CUDA events
around a burst. Needs a GPU and a cuBLASLt with grouped GEMM (13.4 or newer: ``NVBLASLT_LIBRARY``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from .common import progress


class Shape(NamedTuple):
    label: str
    experts: int
    k: int
    n: int
    rows: int
    skewed: bool


SHAPES = (Shape("Mixtral-8x7B up", 8, 4096, 14336, 16384, False),
          Shape("Qwen3-30B-A3B gate+up", 128, 2048, 1536, 65536, True),
          Shape("gpt-oss-20b gate+up", 32, 2880, 5760, 16384, False),
          Shape("DeepSeek-V3 experts", 32, 7168, 4096, 16384, True))


def group_sizes(shape: Shape) -> list[int]:
    """Rows per expert: equal shares, or Zipf-skewed (expert i's share ∝ 1/(i+1)), summing to ``rows``."""
    if not shape.skewed:
        sizes = [shape.rows // shape.experts] * shape.experts
    else:
        weights = [1.0 / (i + 1) for i in range(shape.experts)]
        total = sum(weights)
        sizes = [int(shape.rows * w / total) for w in weights]
    sizes[0] += shape.rows - sum(sizes)
    return sizes


def _wall_ms(fn, calls: int) -> float:
    begin = time.perf_counter()
    for _ in range(calls):
        out = fn()
    _block(out)
    return (time.perf_counter() - begin) / calls * 1e3


def _block(out) -> None:
    import jax

    jax.block_until_ready(out)


CAPTURED_FWD = "nvblaslt ragged_dot fwd, command buffers"
CAPTURED_BOTH = "nvblaslt ragged_dot fwd+bwd, command buffers"


def measure(shape: Shape, rounds: int, calls: int, command_buffers: bool = True) -> dict:
    import jax
    import jax.numpy as jnp
    import torch

    import nvblaslt.jax as nj
    from nvblaslt.torch import grouped_mm

    sizes = group_sizes(shape)
    key = jax.random.PRNGKey(0)
    k1, k2, k3 = jax.random.split(key, 3)
    lhs = jax.random.normal(k1, (shape.rows, shape.k), jnp.bfloat16)
    rhs = (jax.random.normal(k2, (shape.experts, shape.k, shape.n), jnp.bfloat16) / shape.k ** 0.5).astype(jnp.bfloat16)
    cotangent = jax.random.normal(k3, (shape.rows, shape.n), jnp.bfloat16)
    groups = jnp.asarray(sizes, jnp.int32)

    def forward(ragged):
        return jax.jit(lambda l, r, g: ragged(l, r, g))

    def both(ragged):
        def step(l, r, g, ct):
            _, pullback = jax.vjp(lambda a, b: ragged(a, b, g), l, r)
            return pullback(ct)
        return jax.jit(step)

    cases: dict[str, Callable[..., Any]] = {
        "XLA ragged_dot fwd": (lambda f=forward(jax.lax.ragged_dot): f(lhs, rhs, groups)),
        "nvblaslt ragged_dot fwd": (lambda f=forward(nj.ragged_dot): f(lhs, rhs, groups)),
        "XLA ragged_dot fwd+bwd": (lambda f=both(jax.lax.ragged_dot): f(lhs, rhs, groups, cotangent)),
        "nvblaslt ragged_dot fwd+bwd": (lambda f=both(nj.ragged_dot): f(lhs, rhs, groups, cotangent)),
    }
    if command_buffers:  # traced inside the context on their first call (fresh functions: jit keeps a trace)
        with nj.command_buffers():
            captured_fwd, captured_both = forward(nj.ragged_dot), both(nj.ragged_dot)
            _block(captured_fwd(lhs, rhs, groups))
            _block(captured_both(lhs, rhs, groups, cotangent))
        cases[CAPTURED_FWD] = lambda: captured_fwd(lhs, rhs, groups)
        cases[CAPTURED_BOTH] = lambda: captured_both(lhs, rhs, groups, cotangent)
    ours = cases["nvblaslt ragged_dot fwd"]()
    theirs = jax.lax.ragged_dot(lhs, rhs, groups, precision=jax.lax.Precision.HIGHEST,
                                preferred_element_type=jnp.float32)
    error = float(jnp.linalg.norm(ours.astype(jnp.float32) - theirs) / jnp.linalg.norm(theirs))
    finite = bool(jnp.isfinite(ours).all())
    for fn in cases.values():  # compile and warm up (a command buffer: run op by op, then recorded)
        for _ in range(3):
            _block(fn())
    entries = {}  # Python entries per call, in steady state: one per grouped GEMM op by op, none replayed
    for name, fn in cases.items():
        if name.startswith("nvblaslt"):
            before = nj.python_entries()
            _block(fn())
            entries[name] = nj.python_entries() - before
    replayed = {}  # a replayed command buffer against the op-by-op call: the largest difference, expected 0
    if command_buffers:
        for name, plain in (("fwd", "nvblaslt ragged_dot fwd"), ("fwd+bwd", "nvblaslt ragged_dot fwd+bwd")):
            got = jax.tree_util.tree_leaves(cases[CAPTURED_FWD if name == "fwd" else CAPTURED_BOTH]())
            want = jax.tree_util.tree_leaves(cases[plain]())
            replayed[name] = max(float(jnp.abs(g.astype(jnp.float32) - w.astype(jnp.float32)).max())
                                 for g, w in zip(got, want))
    # torch's grouped_mm on the same values, its GPU time from CUDA events
    a = torch.from_dlpack(lhs)
    b = torch.from_dlpack(rhs)
    offs = torch.tensor(sizes, dtype=torch.int32, device="cuda").cumsum(0, dtype=torch.int32)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def torch_ms() -> float:
        start.record()
        for _ in range(calls):
            grouped_mm(a, b, offs)
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / calls
    grouped_mm(a, b, offs)
    torch.cuda.synchronize()
    names = [*cases, "nvblaslt.torch.grouped_mm fwd (GPU time)"]
    samples: dict[str, list[float]] = {name: [] for name in names}
    shuffler = random.Random(0)
    for _ in range(rounds):
        order = names[:]
        shuffler.shuffle(order)
        for name in order:
            samples[name].append(torch_ms() if name not in cases else _wall_ms(cases[name], calls))
    ms = {name: statistics.median(values) for name, values in samples.items()}
    flops = 2.0 * shape.rows * shape.k * shape.n
    return {"shape": shape._asdict(), "group_sizes": sizes, "ms": ms, "relative_error": error, "finite": finite,
            "python_entries": entries, "replayed_max_difference": replayed,
            "tflops": {name: (3 if "bwd" in name else 1) * flops / (value * 1e-3) / 1e12 for name, value in ms.items()}}


def report(rows: list[dict]) -> None:
    captured = all(CAPTURED_FWD in row["ms"] for row in rows)
    print(f"{'shape':24s} {'XLA fwd':>9s} {'ours fwd':>9s} {'×':>6s} {'XLA f+b':>9s} {'ours f+b':>9s} {'×':>6s} "
          f"{'torch fwd':>9s} {'ours/torch':>10s} {'TF/s ours fwd':>13s} {'rel err':>8s}"
          + (f" {'cb fwd':>9s} {'cb/torch':>8s} {'cb f+b':>9s} {'cb ×':>6s}" if captured else ""))
    for row in rows:
        ms = row["ms"]
        torch_ms = ms["nvblaslt.torch.grouped_mm fwd (GPU time)"]
        forward = ms["XLA ragged_dot fwd"] / ms["nvblaslt ragged_dot fwd"]
        both = ms["XLA ragged_dot fwd+bwd"] / ms["nvblaslt ragged_dot fwd+bwd"]
        line = (f"{row['shape']['label']:24s} {ms['XLA ragged_dot fwd']:9.3f} {ms['nvblaslt ragged_dot fwd']:9.3f} "
                f"{forward:6.1f} {ms['XLA ragged_dot fwd+bwd']:9.3f} {ms['nvblaslt ragged_dot fwd+bwd']:9.3f} "
                f"{both:6.1f} {torch_ms:9.3f} {torch_ms / ms['nvblaslt ragged_dot fwd']:10.3f} "
                f"{row['tflops']['nvblaslt ragged_dot fwd']:13.0f} {row['relative_error']:8.1e}")
        if captured:
            line += (f" {ms[CAPTURED_FWD]:9.3f} {torch_ms / ms[CAPTURED_FWD]:8.3f} {ms[CAPTURED_BOTH]:9.3f} "
                     f"{ms['XLA ragged_dot fwd+bwd'] / ms[CAPTURED_BOTH]:6.1f}")
        print(line)
    print("columns: ms per call (JAX: wall over a burst waited for once; torch: CUDA events); × = speed-up over "
          "XLA's jax.lax.ragged_dot (targets ≥ 10); ours/torch = nvblaslt.torch.grouped_mm's GPU time over "
          "nvblaslt.jax.ragged_dot's (target ≥ 0.95); rel err = forward against XLA's at HIGHEST precision in float32"
          + ("; cb = nvblaslt.jax.ragged_dot traced inside nvblaslt.jax.command_buffers()" if captured else ""))
    entries = {name: sorted({row["python_entries"].get(name) for row in rows}, key=str)
               for name in rows[0]["python_entries"]}
    flags = os.environ.get("XLA_FLAGS", "").strip() or "XLA's defaults"
    print("Python entries per call: " + "; ".join(f"{name.removeprefix('nvblaslt ragged_dot ')} "
                                                  f"{', '.join(map(str, counts))}" for name, counts in entries.items())
          + f" (XLA_FLAGS: {flags})")
    if captured:
        print("replayed command buffer vs op by op, largest absolute difference: "
              + "; ".join(f"{row['shape']['label']} " + ", ".join(f"{k} {v:.1e}"
                                                                  for k, v in row["replayed_max_difference"].items())
                          for row in rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5, help="calls per sample")
    parser.add_argument("--no-command-buffers", dest="command_buffers", action="store_false",
                        help="leave out the rows traced inside nvblaslt.jax.command_buffers()")
    parser.add_argument("--json", help="write the results here")
    options = parser.parse_args(argv)
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch allocates in the same process
    import jax
    import torch

    import nvblaslt

    if not torch.cuda.is_available():
        print("nvblaslt.bench.ragged needs an NVIDIA GPU", file=sys.stderr)
        return 2
    version = nvblaslt.library().version
    print(f"{torch.cuda.get_device_name()}, cuBLASLt {version}, JAX {jax.__version__}, torch {torch.__version__}")
    rows = []
    for index, shape in enumerate(SHAPES):
        progress(f"ragged {index + 1}/{len(SHAPES)}: {shape.label}")
        rows.append(measure(shape, options.rounds, options.calls, options.command_buffers))
    report(rows)
    if options.json:
        with open(options.json, "w") as handle:
            json.dump({"device": torch.cuda.get_device_name(), "cublaslt": version, "rows": rows}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
