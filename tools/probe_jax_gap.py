"""Where the jitted MLP step's time goes beyond the GEMM-only floor (nvblaslt.jax.dense, bench.jax's step).

Prints, for the bf16 4-layer step (8192 tokens, 4096↔16384, ReLU): the optimized HLO's op counts
(copies, transposes, fusions, nvblaslt's calls), the Python entries and the outputs copied from
scratch per step (XLA placing a result below the 256-byte alignment a plan assumes), and the
alignments XLA gave the results. Writes the HLO text beside it. On a GPU:

    PYTHONPATH=. python tools/probe_jax_gap.py OUTDIR
"""

from __future__ import annotations

import collections
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

import nvblaslt.jax as nj
from nvblaslt.jax import _bridge

out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
widths, tokens, dtype = (4096, 16384, 4096, 16384, 4096), 8192, jnp.bfloat16
key = jax.random.key(0)
params = []
for n_in, n_out in zip(widths, widths[1:]):
    key, k1, k2 = jax.random.split(key, 3)
    params.append(((jax.random.normal(k1, (n_in, n_out)) / n_in ** 0.5).astype(dtype),
                   (0.1 * jax.random.normal(k2, (n_out,))).astype(dtype)))
x = jax.random.normal(key, (tokens, widths[0])).astype(dtype)
dy = jax.random.normal(jax.random.key(1), (tokens, widths[-1])).astype(dtype)

alignments: collections.Counter = collections.Counter()
launch = _bridge._launch


def recording(spec, outputs, ctx, outs, *ins):
    for buffer in outs if isinstance(outs, (tuple, list)) else (outs,):
        pointer = buffer.__cuda_array_interface__["data"][0]
        alignments[min(256, pointer & -pointer)] += 1
    return launch(spec, outputs, ctx, outs, *ins)


_bridge._launch = recording
for activation in ("relu", "gelu"):
    acts = (activation,) * 3 + ("none",)
    step = jax.jit(lambda p, x, dy: jax.vjp(lambda q: nj.dense(x, q, acts), p)[1](dy)[0])
    text = step.lower(params, x, dy).compile().as_text()
    (out_dir / f"hlo-{activation}.txt").write_text(text)
    entry = text[text.index("ENTRY"):]  # the step's own ops, not those inside fused computations
    ops = collections.Counter(re.findall(r" (copy|transpose|fusion|custom-call|convert|reduce|copy-start)\(", entry))
    print(f"{activation}: the ENTRY computation's ops {dict(ops)}")
    for line in entry.splitlines():
        if re.search(r" (copy|transpose|copy-start)\(", line):
            print("   ", line.strip()[:200])
    jax.block_until_ready(step(params, x, dy))
    alignments.clear()
    entries, copies = nj.python_entries(), _bridge._scratch_copies[0]
    for _ in range(3):
        jax.block_until_ready(step(params, x, dy))
    print(f"{activation}: per step {(nj.python_entries() - entries) / 3:g} Python entries, "
          f"{(_bridge._scratch_copies[0] - copies) / 3:g} outputs copied from scratch; output alignments "
          f"{dict(sorted(alignments.items()))}")
