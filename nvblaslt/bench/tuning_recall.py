"""The recall part of ``python -m nvblaslt.bench.tuning``: a fresh process that loads database 1 through
``$NVBLASLT_TUNING`` plans every problem through ``Matmul``, ``matmul()`` and ``nvblaslt.torch``, and how
many of those plans ran exactly the database's choice (its algorithm, or the first pick it keeps)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from nvblaslt._tuning_cache import ENV_CACHE_DIR, key_of, problem_description, problem_summary

from .common import progress
from .tuning_problems import operands, plan_arguments, planned, torch_layer_route

ENV_TUNING = "NVBLASLT_TUNING"  # the documented variable a process loads databases from
RECALL_TIMEOUT_S = 240
PATHS = ("Matmul", "matmul()", "nvblaslt.torch")


def child_environment(cache: Path, tuning: Path | None = None) -> dict:
    """A child's environment: its own tuning cache, no database but ``tuning``, nothing recorded."""
    env = {k: v for k, v in os.environ.items() if k not in (ENV_TUNING, "NVBLASLT_RECORD")}
    env.update({ENV_CACHE_DIR: str(cache), "PYTHONUNBUFFERED": "1"})
    if tuning is not None:
        env[ENV_TUNING] = str(tuning)
    return env


class _Messages(logging.Handler):
    """The ``nvblaslt`` log's messages, kept: what each plan recalled."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def recall_status(messages: list[str], summary: str) -> str:
    """What a tuning database gave the plan of ``summary``: "hit" (its algorithm), "default" (the first
    pick stays), each with "+split" where it runs in the two-call bias-gradient form, "refused" (not
    accepted for the launch) or "none" (nothing said)."""
    for message in messages:
        if f"for {summary}" not in message:
            continue
        split = "+split" if "split bias-gradient form" in message else ""
        if message.startswith("tuning database hit"):
            return "hit" + split
        if message.startswith("tuning database") and "first pick stays" in message:
            return "default" + split
        if message.startswith("tuning database") and "not accepted" in message:
            return "refused"
    return "none"


def torch_layer_call(spec: dict, ops: dict):
    """The ``nvblaslt.torch`` call that plans ``spec``'s GEMM (``torch_layer_route`` says which), or None."""
    import torch

    from nvblaslt.torch import linear

    epilog = spec["epilog"]
    if torch_layer_route(spec) is None:
        return None
    a, b = ops["a"], ops["b"]
    if epilog == "DEFAULT":  # a = x (T, in), b = Wᵀ
        return lambda: linear(a, b.T)
    if epilog == "BGRADB":  # a = xᵀ, b = dz (T, out): the weight gradient of a layer with a bias
        w = torch.zeros(b.shape[1], a.shape[0], dtype=a.dtype, device="cuda", requires_grad=True)
        bias = torch.zeros(b.shape[1], dtype=a.dtype, device="cuda", requires_grad=True)
        return lambda: linear(a.T, w, bias).backward(b)
    activation = {"BIAS": None, "RELU_BIAS": "relu"}.get(epilog, "gelu")
    if epilog == "GELU_AUX_BIAS":  # a weight that wants its gradient: the forward keeps GELU's aux
        w = a.detach().clone().requires_grad_(True)
        return lambda: linear(b.T, w, ops["inputs"]["bias"], activation)

    def inference():
        with torch.no_grad():
            return linear(b.T, a, ops["inputs"]["bias"], activation)
    return inference


def recall_check(problem_file: str) -> int:
    """The fresh process: per problem, the algorithm a Matmul plan runs and what Matmul, matmul() and
    nvblaslt.torch recalled; then, every database unloaded, the heuristics' first pick. One JSON line."""
    import torch

    import nvblaslt

    handler = _Messages()
    logger = logging.getLogger("nvblaslt")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    specs = [json.loads(line) for line in Path(problem_file).read_text().splitlines() if line.strip()]
    found: dict[str, dict] = {}
    for spec in specs:
        ops = operands(spec)
        handler.messages.clear()
        with planned(spec, ops) as plan:
            launch = plan._launch
            summary = problem_summary(problem_description(launch), launch.lib.api)
            row = {"key": key_of(launch), "algo": plan.algorithm.as_bytes().hex(),
                   "Matmul": recall_status(handler.messages, summary)}
        nvblaslt.clear_plan_cache()
        handler.messages.clear()
        nvblaslt.matmul(ops["a"], ops["b"], epilog=spec["epilog"], epilog_inputs=ops["inputs"] or None,
                        **plan_arguments(spec))
        row["matmul()"] = recall_status(handler.messages, summary)
        call = torch_layer_call(spec, ops)
        if call is not None:
            nvblaslt.clear_plan_cache()
            handler.messages.clear()
            call()
            row["nvblaslt.torch"] = recall_status(handler.messages, summary)
        torch.cuda.synchronize()
        found[spec["name"]] = row
        del ops
    nvblaslt.unload_tuning()
    for spec in specs:  # the heuristics' first picks: what a "default" entry keeps
        with planned(spec, operands(spec)) as plan:
            found[spec["name"]]["first_pick"] = plan.algorithm.as_bytes().hex()
    print(json.dumps(found))
    return 0


def evaluate(found: dict, entries: dict) -> dict:
    """Per path, how many plans ran exactly database 1's choice (``entries``: its entries by key)."""
    counts = {path: [0, 0] for path in PATHS}
    misses, absent = [], []
    for name, row in found.items():
        entry = entries.get(row["key"])
        if entry is None or entry["kind"] not in ("tuned", "default"):
            absent.append(name)
            continue
        tuned = entry["kind"] == "tuned"
        status = ("hit" if tuned else "default") + ("+split" if entry.get("bias_gradient_form") == "split" else "")
        exact = {"Matmul": row["algo"] == (entry["algo"] if tuned else row["first_pick"]) and row["Matmul"] == status,
                 "matmul()": row["matmul()"] == status}
        if "nvblaslt.torch" in row:
            exact["nvblaslt.torch"] = row["nvblaslt.torch"] == status
        for path, same in exact.items():
            counts[path][0] += same
            counts[path][1] += 1
            if not same:
                misses.append(f"{name} through {path}: a {entry['kind']} entry, the plan said {row[path]!r}"
                              + (", another algorithm" if path == "Matmul" and row[path] == status else ""))
    return {"paths": {path: {"exact": n, "plans": total} for path, (n, total) in counts.items()},
            "misses": misses, "not_in_database": absent}


def run(problem_file: Path, database: Path, out: Path) -> dict:
    """The fresh process's findings ({"found": …}), or {"error": …}."""
    command = [sys.executable, "-m", "nvblaslt.bench.tuning", "--recall-check", str(problem_file)]
    progress(f"recall: a fresh process with {ENV_TUNING}={database.name} plans every problem")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=RECALL_TIMEOUT_S,
                              env=child_environment(out / "cache-recall", database))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {RECALL_TIMEOUT_S} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": f"exit {done.returncode}: {' | '.join(done.stderr.strip().splitlines()[-5:])}"}
    return {"found": json.loads(lines[-1])}


def report(result: dict) -> None:
    if "error" in result:
        print(f"recall: FAILED ({result['error']})")
        return
    for path, counts in result["paths"].items():
        if counts["plans"]:
            met = "met" if counts["exact"] == counts["plans"] else "MISSED"
            print(f"recall in a fresh process through {path}: {counts['exact']} of {counts['plans']} plans ran "
                  f"exactly database 1's choice (target: all: {met})")
    for miss in result["misses"]:
        print(f"  missed: {miss}")
    if result["not_in_database"]:
        print(f"  not in database 1 (its tune's budget ended first): {len(result['not_in_database'])} problems")
