"""The ``search`` section: at the seed shape, per epilog, autotune(search=True) against autotune(),
re-timed in the same rounds, the search's time and confidence, and a second process that recalls
the remembered pick (no search) and must get the same kernel. It uses its own tuning cache under
``--out`` (``NVBLASLT_CACHE_DIR``), emptied at the start, so earlier runs cannot leak into the
autotuned rows."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from . import seed
from .common import free_memory, nvmath_advanced, progress
from .timing import event_rounds

SEARCH_EPILOGS = ("DEFAULT", "RELU_BIAS", "RELU_AUX_BIAS", "GELU_AUX_BIAS", "DRELU_BGRAD", "DGELU_BGRAD")
QUICK_SEARCH_EPILOGS = ("RELU_BIAS", "RELU_AUX_BIAS", "DRELU_BGRAD")


def section(args, torch, results: dict) -> None:
    cache_dir = args.out / "tuning-cache"
    shutil.rmtree(cache_dir, ignore_errors=True)
    previous = os.environ.get("NVBLASLT_CACHE_DIR")
    os.environ["NVBLASLT_CACHE_DIR"] = str(cache_dir)
    try:
        _rows(args, torch, results, cache_dir)
    finally:
        if previous is None:
            os.environ.pop("NVBLASLT_CACHE_DIR", None)
        else:
            os.environ["NVBLASLT_CACHE_DIR"] = previous


def _rows(args, torch, results: dict, cache_dir: Path) -> None:
    import nvblaslt
    from nvblaslt._duel import median_bounds

    a, b, bias = seed.operands(torch, args)
    inputs = seed.epilog_inputs(nvblaslt, a, b, bias)
    rows, plans = [], []
    for name in args.search_epilogs:
        progress(f"search: {name}: heuristic #0 and autotune()")
        first = seed.planned(a, b, name, inputs[name], args.limit)
        # autotune() then autotune(search=True) on one plan, as users do; the autotuned row runs
        # autotune()'s pick in a plan of its own, so both rows are timed side by side
        searched = seed.planned(a, b, name, inputs[name], args.limit)
        searched.autotune(iterations=5, remember=False)
        autotuned = seed.planned(a, b, name, inputs[name], args.limit)
        autotuned.plan(epilog=name, epilog_inputs=inputs[name], algorithms=[searched.algorithm.as_bytes()])
        progress(f"search: {name}: autotune(search=True)")
        started = time.perf_counter()
        searched.autotune(iterations=5, search=True, remember=True)
        seconds = time.perf_counter() - started
        report = getattr(searched, "tuning_report", None)
        plans.append((name, first, autotuned, searched))
        rows.append({"epilog": name, "search_s": seconds, "report": str(report) if report else "",
                     "switched": getattr(report, "switched", None), "confidence": getattr(report, "confidence", None),
                     "kernel_autotuned": seed.kernel(autotuned), "kernel_searched": seed.kernel(searched),
                     "same_kernel": autotuned.algorithm.algorithm.config() == searched.algorithm.algorithm.config(),
                     # the whole 64-byte algorithm and the workspace it is given: identical means the very
                     # same launch, so any difference the re-timing shows is measurement noise
                     "same_launch": autotuned.algorithm.as_bytes() == searched.algorithm.as_bytes()
                     and autotuned._launch.workspace_size == searched._launch.workspace_size,
                     "form": list(getattr(searched, "bias_gradient_form", None) or []) or None,
                     "config_searched": searched.algorithm.algorithm.config()})
    rivals = nvmath_autotuned(a, b, bias, [row["epilog"] for row in rows])  # the anchor's best, same rounds
    cases = [(f"{name} {what}", mm.execute) for name, *mms in plans
             for what, mm in zip(("heuristic #0", "autotuned", "searched"), mms)]
    cases += [(f"{name} nvmath autotuned", rival) for name, rival in rivals.items()]
    progress(f"search: re-timing {len(cases)} plans, {args.search_rounds} interleaved rounds, shuffled")
    samples = event_rounds(torch, cases, args.search_rounds)
    medians = [statistics.median(s) for s in samples]
    rival_samples = dict(zip(rivals, samples[3 * len(plans):]))

    def paired(numerator, denominator) -> tuple[float, list[float]]:
        """The median of per-round ratios (drift cancels) and a 95 % distribution-free bound on it
        (the sign test inverted, 2.5 % each side)."""
        ratios = [x / y for x, y in zip(numerator, denominator)]
        return statistics.median(ratios), list(median_bounds(ratios, 0.025))

    for index, row in enumerate(rows):
        first_ms, auto_ms, searched_ms = medians[3 * index: 3 * index + 3]
        ratio, bounds = paired(samples[3 * index + 2], samples[3 * index + 1])
        row.update(first_ms=first_ms, autotuned_ms=auto_ms, searched_ms=searched_ms,
                   searched_over_autotuned=ratio, searched_over_autotuned_bounds=bounds,
                   first_over_autotuned=first_ms / auto_ms)
        rival = rival_samples.get(row["epilog"])
        if rival is not None:
            row["nvmath_autotuned_ms"] = statistics.median(rival)
            row["autotuned_over_nvmath"], row["autotuned_over_nvmath_bounds"] = paired(samples[3 * index + 1], rival)
            row["searched_over_nvmath"], row["searched_over_nvmath_bounds"] = paired(samples[3 * index + 2], rival)
    del plans, cases, rivals, inputs, a, b, bias
    free_memory(torch)
    recalled = recall_in_another_process(args, [r["epilog"] for r in rows])
    for row in rows:
        other = recalled.get(row["epilog"], {})
        row["second_process"] = {"same_kernel": other.get("config") == row["config_searched"],
                                 "cache_hit": other.get("hit"), "plan_ms": other.get("plan_ms"),
                                 "error": other.get("error")}
    results["search"] = {"shape": [args.m, args.k, args.n], "rounds": args.search_rounds, "rows": rows,
                         "cache": str(cache_dir)}


def nvmath_autotuned(a, b, bias, epilogs: list[str]) -> dict:
    """nvmath-python's autotuned plan per epilog (its execute), each backward epilog fed the aux array
    of nvmath's own forward; empty without nvmath-python."""
    advanced = nvmath_advanced()
    if advanced is None:
        progress("search: nvmath-python not installed: no nvmath rows")
        return {}
    epilog = advanced.MatmulEpilog
    inputs: dict = {"DEFAULT": None}
    for forward, backward, key in (("RELU_AUX_BIAS", "DRELU_BGRAD", "relu_aux"),
                                   ("GELU_AUX_BIAS", "DGELU_BGRAD", "gelu_aux")):
        inputs[forward] = {"bias": bias}
        if backward in epilogs:
            try:
                _, aux = advanced.matmul(a, b, epilog=epilog[forward], epilog_inputs={"bias": bias})
                inputs[backward] = {key: aux[key]}
            except Exception as error:  # noqa: BLE001 - an optional comparison: lose one row, not the section
                progress(f"search: nvmath-python {forward} failed ({type(error).__name__}: {error}); "
                         f"no nvmath {backward} row")
    inputs["RELU_BIAS"] = inputs["GELU_BIAS"] = {"bias": bias}
    plans = {}
    for name in epilogs:
        if name not in inputs:
            continue
        progress(f"search: {name}: nvmath-python autotune()")
        try:
            mm = advanced.Matmul(a, b)
            mm.plan(epilog=None if name == "DEFAULT" else epilog[name], epilog_inputs=inputs[name])
            mm.autotune(iterations=5)
        except Exception as error:  # noqa: BLE001
            progress(f"search: nvmath-python {name} failed ({type(error).__name__}: {error}); no nvmath row")
            continue
        plans[name] = mm.execute
    return plans


def recall_in_another_process(args, epilogs: list[str]) -> dict:
    """Plan each searched problem in a fresh process sharing the tuning cache: it must recall the
    pick (a cache hit, no search) and get the same kernel."""
    progress(f"search: planning the {len(epilogs)} problems again in a second process")
    spec = {"shape": [args.m, args.k, args.n], "limit": args.limit, "epilogs": epilogs}
    command = [sys.executable, "-m", "nvblaslt", "bench", "--recall-check", json.dumps(spec)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=os.environ.copy())
    except subprocess.TimeoutExpired:
        return {e: {"error": "timed out"} for e in epilogs}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip().splitlines()[-3:]
        return {e: {"error": f"exit {done.returncode}: {' | '.join(tail)}"} for e in epilogs}
    return json.loads(lines[-1])


def recall_check(spec: dict) -> int:
    """The second process of the search section: plan, never autotune, report what was recalled."""
    import torch

    import nvblaslt

    class Hits(logging.Handler):
        messages: list[str] = []

        def emit(self, record):
            Hits.messages.append(record.getMessage())

    logger = logging.getLogger("nvblaslt")
    logger.setLevel(logging.INFO)
    logger.addHandler(Hits())
    args = argparse.Namespace(m=spec["shape"][0], k=spec["shape"][1], n=spec["shape"][2])
    a, b, bias = seed.operands(torch, args)
    inputs = seed.epilog_inputs(nvblaslt, a, b, bias)
    found = {}
    for name in spec["epilogs"]:
        Hits.messages.clear()
        started = time.perf_counter()
        mm = seed.planned(a, b, name, inputs[name], spec["limit"])
        found[name] = {"config": mm.algorithm.algorithm.config(), "plan_ms": (time.perf_counter() - started) * 1e3,
                       "hit": any("tuning cache hit" in m for m in Hits.messages)}
        mm.execute()
    torch.cuda.synchronize()
    print(json.dumps(found))
    return 0
