"""Probe (GPU): what the GEMMs a bench queues ahead of each sample do to the GPU's power and clock.

``bench.tuning`` queued 4096³ bf16 GEMMs on ``torch.ones`` ahead of each duel sample, to keep the SMs busy
as the layer before in a training step does. A tensor core's power depends on the values it multiplies,
and an H200 running large GEMMs sits at its power limit, where the clock follows the power drawn. This runs
the same GEMM back to back for a few seconds on each kind of data and reads the GPU's power and SM clock
(``nvidia-smi``, every 100 ms) and the GEMM's own rate in each phase.

    PYTHONPATH=. python -m tools.probe_ahead_power [--seconds 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import torch

PHASES = ("idle", "ones", "random", "ones", "random")


def _values(kind: str):
    if kind == "ones":
        return torch.ones(4096, 4096, device="cuda", dtype=torch.bfloat16)
    return torch.rand(4096, 4096, device="cuda", dtype=torch.bfloat16) * 2 - 1


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    options = parser.parse_args(argv)
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "100"], stdout=subprocess.PIPE, text=True)
    try:
        phases = _phases(options.seconds)
    finally:
        smi.terminate()
    _report(phases, smi.stdout.read().splitlines(), options.seconds)


def _phases(seconds: float) -> list:
    """(kind, started, stopped, TF/s of each burst) of each phase, after a second of the log alone."""
    time.sleep(1.0)
    phases = []
    for kind in PHASES:
        started = time.time()
        rates = []
        if kind == "idle":
            time.sleep(seconds)
        else:
            x, out = _values(kind), torch.empty(4096, 4096, device="cuda", dtype=torch.bfloat16)
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            while time.time() - started < seconds:
                begin.record()
                for _ in range(20):
                    torch.mm(x, x, out=out)
                end.record()
                end.synchronize()
                rates.append(20 * 2 * 4096**3 / (begin.elapsed_time(end) * 1e9))
        phases.append((kind, started, time.time(), rates))
    return phases


def _report(phases: list, lines: list[str], seconds: float) -> None:
    samples = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        try:
            stamp = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S")) + float(
                "0." + parts[0].split(".")[1])
            samples.append((stamp, float(parts[1]), float(parts[2])))
        except (IndexError, ValueError):
            continue
    print(f"{torch.cuda.get_device_name()}: 4096³ bf16 GEMMs back to back, {seconds} s a phase; the last "
          "half of each phase's nvidia-smi samples")
    print(f"  {'phase':8s} {'TF/s (median)':>14s} {'SM clock MHz':>13s} {'power W':>8s} {'samples':>8s}")
    for kind, start, stop, rates in phases:
        half = [s for s in samples if (start + stop) / 2 <= s[0] <= stop]
        clock = statistics.median(s[1] for s in half) if half else float("nan")
        power = statistics.median(s[2] for s in half) if half else float("nan")
        rate = f"{statistics.median(rates):14.0f}" if rates else f"{'-':>14s}"
        print(f"  {kind:8s} {rate} {clock:13.0f} {power:8.0f} {len(half):8d}")


if __name__ == "__main__":
    main()
