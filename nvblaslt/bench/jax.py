"""``python -m nvblaslt.bench.jax``: one MLP training step inside ``jax.jit``, nvblaslt.jax against XLA.

One step is the forward and the backward (weight and bias gradients; no optimizer) of an MLP, by
default bf16, 8192 tokens, widths 4096→16384→4096→16384→4096, the activation after every layer but
the last, jitted, with one ``block_until_ready`` per step (host time paid). Rows, per activation
(ReLU, tanh-GELU):

- ``nvblaslt.jax.dense``: one fused GEMM per layer, its backward as ``backward="auto"`` runs it;
- XLA's own lowering of ``jnp.dot`` + bias + activation;
- the GEMM-only floor: the same ``jnp.dot``\\ s with no bias and no activation;
- where the gap goes (``--no-ablation`` leaves them out): ``nvblaslt.jax.dense`` with no bias and no
  activation (the same GEMMs as the floor, through the bridge and nvblaslt's plans), with the bias but
  no activation (adds BIAS and BGRADA), with ``backward="epilog"`` (DRELU_BGRAD / DGELU_BGRAD), and with
  the backward "auto" does not pick (ReLU: DRELU in the GEMM, "bgradb"; GELU: XLA's elementwise derivative
  from the kept pre-activation, "unfused"), which splits GELU's cost between its forward and DGELU.
- ``nvblaslt.jax.dense`` traced inside ``nvblaslt.jax.command_buffers()`` (``--no-command-buffers``
  leaves it out): its GEMMs marked ``command_buffer_compatible``, so that XLA may capture them into
  its command buffers (CUDA graphs) and replay them without entering Python. Whether it does is
  XLA's choice (``XLA_FLAGS``: ``--xla_gpu_enable_command_buffer``, ``--xla_gpu_graph_min_graph_size``),
  printed with the Python entries per step of every nvblaslt row.

Every row is timed in the same interleaved rounds (``nvblaslt._timing.shuffled_rounds``: every case once
per round, in a fresh order; median of the per-step times), first with the plans as the heuristics pick
them, then (``--tune``, default ``list``) again after one step of every nvblaslt row ran under
``nvblaslt.jax.autotune()``, as XLA autotunes its own GEMMs when it compiles. Both phases use a tuning
cache of their own (a temporary directory), so no earlier search leaks into the heuristic plans. The
Python entries per step (``nvblaslt.jax.python_entries()``) and the gradients against XLA's are printed.
``--device cpu`` smoke-tests the script: XLA's rows run on the CPU, nvblaslt's are only traced.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

from nvblaslt._timing import shuffled_rounds

from .common import own_tuning_cache

NAMES = {"relu": "ReLU", "gelu": "tanh-GELU"}
TUNES = ("none", "list", "search")


def _progress(message: str) -> None:
    print(f"  … {message}", file=sys.stderr, flush=True)


def parse(args=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m nvblaslt.bench.jax", description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--widths", default="4096,16384,4096,16384,4096")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--activations", default="relu,gelu", help="comma-separated: relu, gelu")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=5, help="steps per sample, each waited for")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="6 rounds of 3 steps, 2 warm-up steps")
    parser.add_argument("--tune", choices=TUNES, default="list",
                        help="after the heuristic plans, time again with every nvblaslt GEMM tuned by "
                             "nvblaslt.jax.autotune(): 'list' times the heuristics' list, 'search' searches "
                             "beyond it (about 10 s per distinct GEMM); 'none' leaves that phase out")
    parser.add_argument("--no-ablation", dest="ablation", action="store_false",
                        help="leave out the rows that split the gap (nvblaslt GEMMs alone, and with the bias)")
    parser.add_argument("--no-command-buffers", dest="command_buffers", action="store_false",
                        help="leave out the row traced inside nvblaslt.jax.command_buffers()")
    parser.add_argument("--device", choices=["gpu", "cpu"], default="gpu",
                        help="cpu: a smoke test of this script (XLA's rows only; times mean nothing)")
    parser.add_argument("--json", help="write the results here")
    options = parser.parse_args(args)
    if options.quick:
        options.rounds, options.steps, options.warmup = 6, 3, 2
    for name in ("tokens", "rounds", "steps"):
        if getattr(options, name) < 1:
            parser.error(f"--{name}: expected a positive int, got {getattr(options, name)}")
    options.widths = [int(w) for w in options.widths.split(",")]
    options.activations = [a.strip() for a in options.activations.split(",") if a.strip()]
    if len(options.widths) < 2 or min(options.widths) < 1:
        parser.error(f"--widths: expected two or more positive widths, got {options.widths}")
    if not options.activations or set(options.activations) - set(NAMES):
        parser.error(f"--activations: expected some of {', '.join(NAMES)}, got {options.activations}")
    return options


# ---- the steps ------------------------------------------------------------------------------------
def _act(jax, activation: str):
    if activation == "relu":
        return jax.nn.relu
    if activation == "gelu":
        return lambda z: jax.nn.gelu(z, approximate=True)
    return lambda z: z


def _activations(count: int, activation: str) -> tuple:
    return (activation,) * (count - 1) + ("none",)


CAPTURED = "nvblaslt.jax.dense, command buffers"
OTHER_BACKWARD = {"relu": "bgradb", "gelu": "unfused"}  # beside "auto" (relu: unfused, gelu: bgradb)


class Captured:
    """A step traced inside ``nvblaslt.jax.command_buffers()`` on its first call; ``retrace()`` makes a
    fresh one (a command buffer keeps the plans it recorded: after ``autotune()``, a new trace takes the
    tuned ones)."""

    def __init__(self, make):
        self.make, self.step = make, None

    def __call__(self, *args):
        if self.step is None:
            import nvblaslt.jax as nj

            self.step = self.make()
            with nj.command_buffers():
                return self.step(*args)
        return self.step(*args)

    def retrace(self) -> None:
        self.step = None


def steps(jax, activation: str, count: int, ablation: bool, command_buffers: bool = False) -> dict:
    """{row label: (step(params, x, dy) → gradients, uses the bias, is nvblaslt's)}, each jitted."""
    import nvblaslt.jax as nj

    jnp = jax.numpy
    act = _act(jax, activation)

    def xla(params, x):
        for index, (kernel, bias) in enumerate(params):
            x = jnp.dot(x, kernel) + bias
            x = act(x) if index < count - 1 else x
        return x

    def floor(params, x):
        for kernel, _ in params:
            x = jnp.dot(x, kernel)
        return x

    def fused(acts, bias: bool, backward: str = "auto"):
        return lambda params, x: nj.dense(x, params if bias else [(k, None) for k, _ in params], acts,
                                          backward=backward)

    def grads(forward):
        return jax.jit(lambda params, x, dy: jax.vjp(lambda p: forward(p, x), params)[1](dy)[0])

    rows = {"nvblaslt.jax.dense": (grads(fused(_activations(count, activation), True)), True, True),
            "XLA: jnp.dot + bias + activation": (grads(xla), True, False),
            "GEMM-only floor (jnp.dot, no bias/activation)": (grads(floor), False, False)}
    if ablation:
        rows["nvblaslt.jax.dense, no bias/activation"] = (grads(fused(("none",) * count, False)), False, True)
        rows["nvblaslt.jax.dense, bias, no activation"] = (grads(fused(("none",) * count, True)), True, True)
        rows["nvblaslt.jax.dense, backward='epilog'"] = (grads(fused(_activations(count, activation), True, "epilog")),
                                                         True, True)
        other = OTHER_BACKWARD[activation]  # the activation's backward "auto" does not run: DGELU's cost, isolated
        rows[f"nvblaslt.jax.dense, backward='{other}'"] = (grads(fused(_activations(count, activation), True, other)),
                                                          True, True)
    if command_buffers:  # a fresh function per trace: JAX keeps a function's trace
        rows[CAPTURED] = (Captured(lambda: grads(fused(_activations(count, activation), True))), True, True)
    return rows


def _relative(jax, got, expected) -> float:
    jnp = jax.numpy
    worst = 0.0
    for g, e in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(expected)):
        g, e = g.astype(jnp.float32), e.astype(jnp.float32)
        worst = max(worst, float(jnp.linalg.norm(g - e) / jnp.maximum(jnp.linalg.norm(e), 1e-30)))
    return worst


def _timed(jax, run, steps_per_sample: int) -> float:
    """ms per step over ``steps_per_sample`` steps, each waited for."""
    started = time.perf_counter()
    for _ in range(steps_per_sample):
        jax.block_until_ready(run())
    return (time.perf_counter() - started) * 1e3 / steps_per_sample


def _phase(jax, cases: list, options, title: str, gpu: str, results: dict) -> None:
    """One table: every case in the same shuffled rounds, the median ms per step, × the floor and × XLA."""
    import nvblaslt.jax as nj

    entries: dict[str, float] = {}
    for label, run, ours in cases:  # warm-up, and the Python entries per step of nvblaslt's rows
        for _ in range(options.warmup):
            jax.block_until_ready(run())
        if ours:
            before = nj.python_entries()
            jax.block_until_ready(run())
            entries[label] = nj.python_entries() - before
    samples = shuffled_rounds([run for _, run, _ in cases], options.rounds,
                              lambda run: _timed(jax, run, options.steps))
    medians = {label: statistics.median(s) for (label, _, _), s in zip(cases, samples)}
    shape = "→".join(map(str, options.widths))
    print(f"\n{title}: one training step inside jax.jit, {options.dtype}, {options.tokens} tokens, MLP {shape}; "
          f"median of {options.rounds} interleaved rounds of {options.steps} steps, ms per step, each step waited "
          f"for ({time.strftime('%Y-%m-%d')}; {gpu})")
    rows = list(dict.fromkeys(label.partition(": ")[2] for label, _, _ in cases))
    header = f"{'step':46s}" + "".join(f" | {NAMES[a]:>9s} {'×floor':>7s} {'×XLA':>7s}" for a in options.activations)
    print(header)
    print("-" * len(header))
    table: dict[str, dict] = {}
    for row in rows:
        line = f"{row:46s}"
        for activation in options.activations:
            ms = medians.get(f"{activation}: {row}")
            if ms is None:
                line += f" | {'—':>9s} {'':7s} {'':7s}"
                continue
            floor = medians[f"{activation}: GEMM-only floor (jnp.dot, no bias/activation)"]
            xla = medians[f"{activation}: XLA: jnp.dot + bias + activation"]
            line += f" | {ms:9.2f} {ms / floor:7.3f} {ms / xla:7.3f}"
            table.setdefault(row, {})[activation] = {"ms": ms, "x_floor": ms / floor, "x_xla": ms / xla,
                                                     "python_entries": entries.get(f"{activation}: {row}")}
        print(line)
    if entries:
        print(entries_line(entries))
    results["phases"][title] = table


def entries_line(entries: dict) -> str:
    """The Python entries per step: op by op (every nvblaslt row but the captured one), and captured."""
    plain = sorted({v for label, v in entries.items() if not label.endswith(CAPTURED)})
    captured = sorted({v for label, v in entries.items() if label.endswith(CAPTURED)})
    line = f"Python entries per step: {', '.join(map(str, plain)) or '—'} op by op (one per cuBLASLt GEMM that runs"
    line += "; XLA drops the unused input gradient of the first layer)"
    if captured:
        flags = os.environ.get("XLA_FLAGS", "").strip() or "XLA's defaults"
        line += (f"; {', '.join(map(str, captured))} traced inside nvblaslt.jax.command_buffers() "
                 f"(command_buffer_compatible=True; XLA_FLAGS: {flags})")
    return line


def main(args=None) -> dict:
    options = parse(args)
    with own_tuning_cache("nvblaslt-bench-jax-"):  # heuristic plans are the heuristics' own; a search stays here
        return _measure(options)


def _measure(options) -> dict:
    import jax

    import nvblaslt
    import nvblaslt.jax as nj

    jnp = jax.numpy
    gpu_run = options.device == "gpu"
    if gpu_run and jax.default_backend() != "gpu":
        sys.exit("this benchmark needs JAX with CUDA and a GPU (--device cpu only smoke-tests the script)")
    device = jax.devices("gpu" if gpu_run else "cpu")[0]
    dtype = jnp.dtype(options.dtype)
    widths, count = options.widths, len(options.widths) - 1
    started = time.time()
    key = jax.random.key(0)
    params = []
    for n_in, n_out in zip(widths, widths[1:]):
        key, k1, k2 = jax.random.split(key, 3)
        params.append((jax.device_put((jax.random.normal(k1, (n_in, n_out)) / n_in ** 0.5).astype(dtype), device),
                       jax.device_put((0.1 * jax.random.normal(k2, (n_out,))).astype(dtype), device)))
    key, kx, kd = jax.random.split(key, 3)
    x = jax.device_put(jax.random.normal(kx, (options.tokens, widths[0])).astype(dtype), device)
    dy = jax.device_put(jax.random.normal(kd, (options.tokens, widths[-1])).astype(dtype), device)

    cases: list[tuple[str, Any, bool]] = []
    captured_steps: list[Captured] = []
    checks: dict[str, float] = {}
    replay_checks: dict[str, float] = {}
    for activation in options.activations:
        rows = steps(jax, activation, count, options.ablation, options.command_buffers and gpu_run)
        for label, (step, _, ours) in rows.items():
            if ours and not gpu_run:  # traced only: the CPU has no cuBLASLt GEMM
                jax.eval_shape(step, params, x, dy)
                continue
            cases.append((f"{activation}: {label}", lambda step=step: step(params, x, dy), ours))
            if isinstance(step, Captured):
                captured_steps.append(step)
        if gpu_run:
            fused, xla = rows["nvblaslt.jax.dense"][0], rows["XLA: jnp.dot + bias + activation"][0]
            checks[activation] = _relative(jax, fused(params, x, dy), xla(params, x, dy))
            if CAPTURED in rows:  # the third step: run op by op, recorded, then replayed from the command buffer
                replayed = [rows[CAPTURED][0](params, x, dy) for _ in range(3)][-1]
                replay_checks[activation] = _relative(jax, replayed, fused(params, x, dy))
    gpu = device.device_kind if gpu_run else f"CPU ({platform.machine()})"
    version = ".".join(map(str, nvblaslt.library().version_tuple)) if gpu_run else "—"
    print(f"{gpu}, JAX {jax.__version__}, cuBLASLt {version}, Python {platform.python_version()}")
    results: dict[str, Any] = {"options": {k: v for k, v in vars(options).items()}, "gpu": gpu, "jax": jax.__version__,
                               "cublaslt": version, "checks": checks, "phases": {}}
    _phase(jax, cases, options, "heuristic plans", gpu, results)
    if gpu_run and options.tune != "none":
        _progress(f"tuning every nvblaslt GEMM (nvblaslt.jax.autotune(search={options.tune == 'search'}))")
        tuning_started = time.time()
        with nj.autotune(search=options.tune == "search"):
            for _, run, ours in cases:
                if ours:
                    jax.block_until_ready(run())
        results["tuning_s"] = time.time() - tuning_started
        for captured in captured_steps:
            captured.retrace()  # its command buffer holds the heuristic plans: trace it again
        _phase(jax, cases, options, f"tuned plans ({'searched' if options.tune == 'search' else 'heuristics list timed'})",
               gpu, results)
        print(f"(tuning took {results['tuning_s']:.0f} s)")
    if checks:
        print("nvblaslt.jax.dense gradients vs XLA's (largest relative difference over the parameters): "
              + ", ".join(f"{NAMES[a]} {v:.1e}" for a, v in checks.items()))
    if replay_checks:
        print("nvblaslt.jax.dense traced inside command_buffers() vs op by op, third step (largest relative "
              "difference): " + ", ".join(f"{NAMES[a]} {v:.1e}" for a, v in replay_checks.items()))
    results["replay_checks"] = replay_checks
    print(f"({time.time() - started:.0f} s in all, compilation included)")
    if options.json:
        with open(options.json, "w") as handle:
            json.dump(results, handle, indent=1)
    return results


if __name__ == "__main__":
    main()
