"""``python -m nvblaslt.bench.tuning``: issue 35's figures on the GPU, the tuning database and batch invariance.

Parts, in this order, each timed and written to ``--json`` as it ends:
  tunes       two fresh ``nvblaslt tune`` runs of the same problems, each in a fresh process, into two
              databases (their progress lines are printed as they come)
  duels       per problem, in interleaved rounds: the heuristics' first pick, each database's pick and
              torch's own call for the same GEMM; the geometric mean and the worst of first pick / database
              pick, and how many problems are slower than torch; then whether the two tunes agree (the
              same kernel, or kernels within 1 % in these rounds)
  recall      a fresh process that loads database 1 (``NVBLASLT_TUNING``) plans every problem through
              ``Matmul``, ``matmul()`` and ``nvblaslt.torch``: how many plans ran exactly the database's choice
  invariance  ``nvblaslt tune --batch-invariant`` of the suite's (N, K) pairs with BIAS / RELU_BIAS /
              GELU_BIAS (bf16) unless ``--invariance-database`` names its file; then the batch-invariant
              plan (each M its ladder's rung) against the default plan at M = 1 … 8192, and its rows at
              M = 1 … 300 and each power of two to 8192 compared bitwise with those at M = 8192

The problems are ``nvblaslt tune``'s LLM suite (``--quick``: a representative subset) without its grouped
GEMMs, with BIAS / RELU_BIAS / GELU_BIAS forms of the MLP's up projection (the suite has GELU_AUX_BIAS).
Times are GPU time, not host time: per sample about 1 ms of GEMMs on random values is queued ahead (the
host's time to issue the calls hidden, the SMs at the power a training step draws; ``--queue spin``: a sleep
kernel instead), the L2 is flushed, and CUDA events time a burst of calls (one call from 0.05 ms up).
``--seconds`` is the time share: each tune gets a quarter of it (``--tune-budget``), the duels stop where
the recall and invariance parts would lose their share, and parts cut short say so.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from nvblaslt._tuning_cache import key_of

from . import invariance, tuning_recall
from .common import STARTED, free_memory, own_tuning_cache, progress
from .tuning_problems import (QUEUES, QUICK_SUITE, QUICK_VARIANTS, SETTLE_S, burst_calls, flush_buffer, gpu_rounds,
                              launched_kernels, operands, paired, planned, problems, torch_baseline, torch_call)

PARTS = ("tunes", "duels", "recall", "invariance")
TARGETS = {"agreement": 0.95, "geomean": 1.05, "worst": 0.99}
AGREE_WITHIN = 0.01
GROUPED_FROM = (13, 4)  # the cuBLASLt that has grouped GEMM
TUNE_GRACE_S = 90.0  # past its budget a tune is stopped (its start-up, its last problem's duel)
RESERVE_S = {"recall": 35.0, "invariance": 60.0}  # kept for the later parts while the duels run


def arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m nvblaslt.bench.tuning", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"the representative subset ({len(QUICK_SUITE) + len(QUICK_VARIANTS)} problems)")
    parser.add_argument("--seconds", type=float,
                        help="the whole run's time share (default 300 with --quick, else 2400)")
    parser.add_argument("--tune-budget", type=float, help="seconds of each tune (default a quarter of --seconds)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds per duel (default 11 with --quick, else 21)")
    parser.add_argument("--queue", choices=QUEUES, default="gemm",
                        help="what runs ahead of each duel sample: gemm (about 1 ms of GEMMs, as the layer before "
                             "in a training step) or spin (a sleep kernel; it turns some verdicts, see "
                             "bench.tuning_problems)")
    parser.add_argument("--settle", type=float, default=SETTLE_S,
                        help=f"seconds of the first pick back to back before each duel (default {SETTLE_S}: the "
                             "GPU at the power its own work draws, as a tune's duels start; 0: none, as before "
                             "2026-11-29's third pass)")
    parser.add_argument("--invariance-rounds", type=int, help="rounds per M, invariance part (default 7, else 15)")
    parser.add_argument("--invariance-pairs", type=_pairs, help="N x K pairs of the invariance part, as "
                        "4096x14336,8192x1024 (default every (N, K) of the suite's dense layers)")
    parser.add_argument("--invariance-database", type=Path, help="the measured pins, from nvblaslt tune "
                        "--batch-invariant (default: the part tunes them first, into --out)")
    parser.add_argument("--invariance-tune-budget", type=float, help="seconds of that tune (default 3 per problem)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, from {','.join(PARTS)} "
                        "(duels and recall measure the tunes' databases)")
    parser.add_argument("--out", type=Path, default=Path("bench-results/tuning"),
                        help="where the problems, the two databases, their tunes' logs and the tuning caches go")
    parser.add_argument("--json", type=Path, help="every figure, written after each part")
    parser.add_argument("--recall-check", help=argparse.SUPPRESS)  # the recall part's fresh process
    given = parser.parse_args(argv)
    settings = dict(vars(given))  # the defaults that depend on --quick and --seconds filled in
    settings["parts"] = [p.strip() for p in given.parts.split(",") if p.strip()]
    unknown = sorted(set(settings["parts"]) - set(PARTS))
    if unknown:
        parser.error(f"--parts: unknown {unknown}; known: {','.join(PARTS)}")
    if {"duels", "recall"} & set(settings["parts"]) and "tunes" not in settings["parts"] \
            and not (given.out / "tuning-1.jsonl").is_file():
        parser.error(f"--parts: duels and recall measure the tunes' databases, and {given.out} holds none from an "
                     f"earlier run: add tunes")
    quick = given.quick
    defaults = {"seconds": 300.0 if quick else 2400.0, "rounds": 11 if quick else 21,
                "invariance_rounds": 7 if quick else 15}
    for name, value in defaults.items():
        settings[name] = value if settings[name] is None else settings[name]
    settings["tune_budget"] = settings["seconds"] / 4 if given.tune_budget is None else given.tune_budget
    for name in ("seconds", "tune_budget", "rounds", "invariance_rounds"):
        if not settings[name] > 0:
            parser.error(f"--{name.replace('_', '-')}: expected a positive number, got {settings[name]}")
    return argparse.Namespace(**settings)


def _pairs(text: str) -> list[tuple[int, int]]:
    try:
        return [(int(n), int(k)) for n, k in (pair.lower().split("x") for pair in text.split(",") if pair)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N x K pairs as 4096x14336,8192x1024, got {text!r}") from None


# ---- part 1: two fresh tunes ----------------------------------------------------------------------------------
def run_tune(index: int, problem_file: Path, database: Path, budget: float, out: Path) -> dict:
    command = [sys.executable, "-m", "nvblaslt", "tune", "--problems", str(problem_file), "-o", str(database),
               "--budget", f"{budget:g}", "--log", str(out / f"tune-{index}.log")]  # why the tunes differ
    progress(f"tune {index}: nvblaslt tune --problems {problem_file.name} -o {database.name} --budget {budget:g}")
    started, lines = time.perf_counter(), []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=tuning_recall.child_environment(out / f"cache-tune{index}")) as child:
        stopper = threading.Timer(budget + TUNE_GRACE_S, child.kill)
        stopper.start()
        try:
            assert child.stdout is not None
            for line in child.stdout:
                lines.append(line.rstrip("\n"))
                print(f"  tune {index} | {lines[-1]}", flush=True)
        finally:
            stopper.cancel()
        code = child.wait()
    return {"returncode": code, "stopped": code < 0, "seconds": time.perf_counter() - started, "lines": lines}


def read_database(path: Path):
    """The database at ``path`` (read and checked by ``load_tuning``, then unloaded), or None."""
    import nvblaslt

    try:
        return nvblaslt.load_tuning(path)
    except nvblaslt.NvblasltError as error:
        progress(f"{path.name}: not read ({error})")
        return None
    finally:
        nvblaslt.unload_tuning()


def pick_of(entry: dict | None, first: bytes) -> tuple | None:
    """What an entry runs: its algorithm, or the first pick for a ``default`` one, and its bias-gradient form
    (``"fused"`` or ``"split"``); None without one."""
    if entry is None or entry["kind"] not in ("tuned", "default"):
        return None
    return bytes.fromhex(entry["algo"]) if entry["kind"] == "tuned" else first, entry.get("bias_gradient_form",
                                                                                          "fused")


def entry_label(entry: dict) -> str:
    """An entry's kind as the duels' table shows it: ``+split`` for the two-call bias-gradient form,
    ``+unconfirmed`` for a default whose kernel did not win again on the tune's second set of operands."""
    return (entry["kind"] + ("+split" if entry.get("bias_gradient_form") == "split" else "")
            + ("+unconfirmed" if "unconfirmed" in entry else ""))


def entry_said(entry: dict | None) -> str:
    """What a tune wrote for a problem, with its own readings: where two tunes differ, whether one kept a kernel
    near the gain a switch needs while the other's best challenger (maybe another kernel) fell just short."""
    if entry is None:
        return "no entry"
    label = entry_label(entry)
    form = f", the split form at {entry['form_ratio']:.3f}× the fused kernel" if "form_ratio" in entry else ""
    if "ratio" in entry:
        return f"{label} at {entry['ratio']:.3f}×{form}"
    if "unconfirmed_ratio" in entry and "second_ratio" in entry:
        return f"{label} ({entry['unconfirmed_ratio']:.3f}×, then {entry['second_ratio']:.3f}× on other operands)"
    if "best_ratio" in entry:
        return f"{label}, its best challenger {entry['best_ratio']:.3f}×"
    return label + form


def split_first_call(plan) -> bytes:
    """The kernel of the first call of ``plan``'s two-call form; refused where the plan runs fused (its
    database's split form was not recalled, which the recall part would report too)."""
    split = plan._split_form
    if split is None:
        plan.free()
        raise RuntimeError("a database's split bias-gradient form was not recalled: the plan runs fused")
    return split.main.algorithm.as_bytes()


def planned_pick(spec: dict, ops: dict, pick: tuple, database):
    """A plan running ``pick``: its kernel; in the two-call bias-gradient form, as a process that loaded
    ``database`` plans it (the form and its first call's kernel recalled from it)."""
    algorithm, form = pick[:2]
    if form == "fused":
        return planned(spec, ops, algorithm)
    import nvblaslt

    nvblaslt.load_tuning(database.path)
    try:
        return planned(spec, ops)
    finally:
        nvblaslt.unload_tuning()


# ---- part 2: duels, and the tunes' agreement --------------------------------------------------------------------
def duel_problem(spec: dict, databases: list, rounds: int, flush, queue: str = "gemm",
                 settle_s: float = SETTLE_S) -> dict:
    """The first pick, each database's pick (each kernel once) and torch's call, in interleaved rounds."""
    ops = operands(spec)
    first = planned(spec, ops)
    first_pick = (first.algorithm.as_bytes(), "fused")
    plans = {first_pick: first}
    try:
        key = key_of(first._launch)
        entries = [db.entries.get(key) if db is not None and key else None for db in databases]
        picks = [pick_of(entry, first_pick[0]) for entry in entries]
        for index, (pick, database) in enumerate(zip(picks, databases)):
            if pick is None or pick in plans:
                continue
            plan = planned_pick(spec, ops, pick, database)
            if pick[1] == "split":  # the same kernels only where the first calls' kernels are the same too
                pick = picks[index] = (*pick, split_first_call(plan))
                if pick in plans:
                    plan.free()
                    continue
            plans[pick] = plan
        kernels = list(plans)
        cases: list[tuple[str, Any]] = [(f"kernel {i}", plans[k].execute) for i, k in enumerate(kernels)]
        cases.append(("torch", torch_call(spec, ops)))
        calls = burst_calls(first.execute, flush, queue)
        samples = gpu_rounds(cases, rounds, calls, flush, queue, settle_s)
        # which kernels torch's call and database 1's pick launch: where they are the same, a gap is the duel's noise
        kernels_of = {"torch": cases[-1][1], "db1": plans[picks[0] or first_pick].execute}
        launched = {who: sorted(name for name, _ in launched_kernels(fn)) for who, fn in kernels_of.items()}
    finally:
        for plan in plans.values():
            plan.free()
        del ops
    timed = dict(zip(kernels, samples))
    first_samples, torch_samples = samples[0], samples[-1]
    kinds = [None if e is None else entry_label(e) for e in entries]
    row: dict[str, Any] = {"name": spec["name"], "key": key, "kinds": kinds, "said": [entry_said(e) for e in entries],
                           "tune_ratios": [e.get("ratio") if e else None for e in entries], "calls": calls,
                           "torch": torch_baseline(spec), "first_ms": statistics.median(first_samples),
                           "torch_ms": statistics.median(torch_samples)}
    row["same_kernels_as_torch"] = bool(launched["torch"]) and launched["torch"] == launched["db1"]
    row["torch_kernels"], row["db1_kernels"] = launched["torch"], launched["db1"]
    for index, pick in enumerate(picks, 1):
        if pick is None:
            continue
        row[f"db{index}_ms"] = statistics.median(timed[pick])
        row[f"first_over_db{index}"] = ({"ratio": 1.0, "same_kernel": True} if pick == first_pick
                                        else paired(first_samples, timed[pick]))
        row[f"torch_over_db{index}"] = paired(torch_samples, timed[pick])
    one, two = picks
    if one is not None and two is not None:
        row["same_pick"] = one == two
        row["db1_over_db2"] = {"ratio": 1.0, "same_kernel": True} if one == two else paired(timed[one], timed[two])
    return row


def summarize_duels(rows: list[dict]) -> dict:
    """Geometric mean and worst of first pick / database 1's pick; the problems slower than torch's call beyond
    the duel's 95 % bounds (the target's verdict), by the median alone, and of those how many run the very
    kernels torch's call runs (there the gap is the duel's noise)."""
    timed = [r for r in rows if "first_over_db1" in r]
    ratios = [r["first_over_db1"]["ratio"] for r in timed]
    by_median = [r for r in timed if r["torch_over_db1"]["ratio"] < 1.0]
    found: dict[str, Any] = {
        "problems": len(rows), "with_entry": len(timed),
        "slower_than_torch": [r["name"] for r in by_median if r["torch_over_db1"]["bounds"][1] < 1.0],
        "slower_than_torch_by_median": [r["name"] for r in by_median],
        "slower_by_median_same_kernels": [r["name"] for r in by_median if r.get("same_kernels_as_torch")],
        "same_kernels_as_torch": sum(bool(r.get("same_kernels_as_torch")) for r in timed)}
    if ratios:
        found["geomean"] = math.exp(statistics.fmean(math.log(r) for r in ratios))
        found["worst"] = min(ratios)
        found["worst_problem"] = timed[ratios.index(found["worst"])]["name"]
    return found


def agreement(rows: list[dict]) -> dict:
    """Of the problems both tunes covered, how many got the same kernel or kernels within ``AGREE_WITHIN`` (the
    median of the duel's paired ratios: the target's verdict); of the others, how many are that far apart beyond
    the duel's 95 % bounds (both bounds outside ``AGREE_WITHIN``), the rest being within the duel's noise of it."""
    both = [r for r in rows if "same_pick" in r]
    agree = [r for r in both if r["same_pick"] or abs(r["db1_over_db2"]["ratio"] - 1.0) <= AGREE_WITHIN]

    def apart_beyond_bounds(row: dict) -> bool:
        low, high = row["db1_over_db2"].get("bounds", (1.0, 1.0))
        return low > 1.0 + AGREE_WITHIN or high < 1.0 - AGREE_WITHIN
    return {"both": len(both), "same": sum(r["same_pick"] for r in both), "agree": len(agree),
            "fraction": len(agree) / len(both) if both else None,
            "disagree": [{"name": r["name"], "db1_over_db2": r["db1_over_db2"]["ratio"],
                          "bounds": r["db1_over_db2"].get("bounds"), "beyond_bounds": apart_beyond_bounds(r),
                          "said": r.get("said")}
                         for r in both if r not in agree]}


def verdict(value, target: float) -> str:
    return "no figure" if value is None else ("met" if value >= target else "MISSED")


def report_duels(rows: list[dict], summary: dict, agreed: dict) -> None:
    print(f"\n{'problem':64s} {'first ms':>9s} {'db ms':>9s} {'torch ms':>9s} {'first/db':>8s} {'torch/db':>8s}"
          f"  entries (tune 1/2)")
    for r in rows:
        db = f"{r['db1_ms']:9.4f}" if "db1_ms" in r else f"{'-':>9s}"
        ratio = f"{r['first_over_db1']['ratio']:7.3f}×" if "first_over_db1" in r else f"{'-':>8s}"
        versus = f"{r['torch_over_db1']['ratio']:7.3f}×" if "torch_over_db1" in r else f"{'-':>8s}"
        print(f"{r['name'][:64]:64s} {r['first_ms']:9.4f} {db} {r['torch_ms']:9.4f} {ratio} {versus}  "
              f"{'/'.join(str(k) for k in r['kinds'])}")
    print("torch's calls: " + "; ".join(sorted({r["torch"] for r in rows})))
    if "geomean" in summary:
        print(f"first pick / database pick over {summary['with_entry']} problems: geometric mean "
              f"{summary['geomean']:.3f}× (target ≥ {TARGETS['geomean']}: "
              f"{verdict(summary['geomean'], TARGETS['geomean'])}), worst {summary['worst']:.3f}× at "
              f"{summary['worst_problem']} (target ≥ {TARGETS['worst']}: "
              f"{verdict(summary['worst'], TARGETS['worst'])})")
    slower, by_median = summary["slower_than_torch"], summary["slower_than_torch_by_median"]
    met = "no figure" if not summary["with_entry"] else "met" if not slower else "MISSED"
    print(f"slower than torch's call beyond the duel's 95 % bounds: {len(slower)} of {summary['with_entry']} "
          f"(target 0: {met}){': ' + ', '.join(slower) if slower else ''}")
    print(f"  by the median alone: {len(by_median)}, {len(summary['slower_by_median_same_kernels'])} of them running "
          f"the very kernels torch's call runs; the database's pick runs torch's kernels on "
          f"{summary['same_kernels_as_torch']} of {summary['with_entry']} problems")
    if not agreed["both"]:
        print("agreement: no problem is in both databases")
        return
    print(f"two fresh tunes agree on {agreed['agree']} of the {agreed['both']} problems both tuned "
          f"({agreed['same']} the same kernel, the rest within {AGREE_WITHIN:.0%}): {agreed['fraction']:.1%} "
          f"(target ≥ {TARGETS['agreement']:.0%}: {verdict(agreed['fraction'], TARGETS['agreement'])})")
    beyond = sum(miss["beyond_bounds"] for miss in agreed["disagree"])
    if agreed["disagree"]:
        print(f"  of the {len(agreed['disagree'])} that differ, {beyond} more than {AGREE_WITHIN:.0%} apart beyond the "
              f"duel's 95 % bounds, the rest within its noise of {AGREE_WITHIN:.0%}")
    for miss in agreed["disagree"]:
        bounds = "" if miss["bounds"] is None else f" (bounds {miss['bounds'][0]:.3f}–{miss['bounds'][1]:.3f})"
        said = "; ".join(f"tune {i}: {what}" for i, what in enumerate(miss.get("said") or (), 1))
        print(f"  differ: {miss['name']}: database 1's pick at {miss['db1_over_db2']:.3f}× database 2's{bounds}"
              + (f" ({said})" if said else ""))


# ---- the run -------------------------------------------------------------------------------------------------------
def write(args, results: dict) -> None:
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1, default=str))


def run_tunes(args, problem_file: Path, results: dict) -> list:
    databases = []
    results["tunes"] = []
    for index in (1, 2):
        path = args.out / f"tuning-{index}.jsonl"
        path.unlink(missing_ok=True)  # a fresh tune: an existing file would be continued
        results["tunes"].append(run_tune(index, problem_file, path, args.tune_budget, args.out))
        databases.append(read_database(path))
        if databases[-1] is not None:
            results["tunes"][-1]["counts"] = databases[-1].counts()
            print(f"tune {index}: {len(databases[-1])} entries {databases[-1].counts()} in "
                  f"{results['tunes'][-1]['seconds']:.0f} s")
    return databases


def run_duels(args, specs: list[dict], databases: list, results: dict, deadline: float, flush) -> None:
    import torch

    rows, left = [], []
    for index, spec in enumerate(specs):
        if time.perf_counter() > deadline:
            left = [s["name"] for s in specs[index:]]
            progress(f"duels: out of time; {len(left)} problems left out (the later parts keep their share)")
            break
        progress(f"duels: [{index + 1}/{len(specs)}] {spec['name']}")
        try:
            rows.append(duel_problem(spec, databases, args.rounds, flush, args.queue, args.settle))
        except Exception as error:  # noqa: BLE001 - one problem's failure must not lose the others' figures
            rows.append({"name": spec["name"], "error": f"{type(error).__name__}: {error}"})
            progress(f"duels: {spec['name']}: {rows[-1]['error']}")
        free_memory(torch)
    timed = [r for r in rows if "error" not in r]
    summary, agreed = summarize_duels(timed), agreement(timed)
    results["duels"] = {"rounds": args.rounds, "queue": args.queue, "rows": rows, "summary": summary,
                        "left_out": left}
    results["agreement"] = agreed
    report_duels(timed, summary, agreed)
    for row in rows:
        if "error" in row:
            print(f"  not timed: {row['name']}: {row['error']}")


def main(argv: list[str] | None = None) -> int:
    args = arguments(sys.argv[1:] if argv is None else argv)
    if args.recall_check:
        return tuning_recall.recall_check(args.recall_check)
    try:
        import torch
    except ImportError:
        print("bench.tuning: needs PyTorch (timing events, torch's calls)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench.tuning: needs an NVIDIA GPU", file=sys.stderr)
        return 2
    import nvblaslt

    from .report import machine

    ends = STARTED + args.seconds
    args.out.mkdir(parents=True, exist_ok=True)
    for stale in args.out.glob("cache-*"):  # the children's tuning caches of an earlier run
        shutil.rmtree(stale, ignore_errors=True)
    nvblaslt.unload_tuning()  # this process plans from the heuristics alone: no $NVBLASLT_TUNING here
    specs = problems(args.quick)
    problem_file = args.out / "problems.jsonl"
    problem_file.write_text("".join(json.dumps(spec, sort_keys=True) + "\n" for spec in specs))
    version = nvblaslt.library().version_tuple
    grouped = ("grouped GEMM: left out (cuBLASLt {} has none; it needs {})" if version < GROUPED_FROM else
               "grouped GEMM: left out of this bench (python -m nvblaslt.bench.grouped --search times it)")
    results: dict[str, Any] = {"machine": machine(torch), "quick": args.quick, "problems": len(specs),
                               "seconds_share": args.seconds, "tune_budget": args.tune_budget, "elapsed": {},
                               "grouped": grouped.format(".".join(map(str, version)),
                                                         ".".join(map(str, GROUPED_FROM)))}
    print(f"bench.tuning on {results['machine']['gpu']}, cuBLASLt {results['machine']['cublaslt']}, torch "
          f"{torch.__version__}: {len(specs)} problems{' (--quick)' if args.quick else ''}; {results['grouped']}",
          flush=True)
    with own_tuning_cache("nvblaslt-bench-tuning-"):  # nor the user's remembered picks
        run_parts(args, specs, problem_file, results, ends)
    print("\n".join(["", "issue 35's targets, as measured:", *targets_lines(results)]))
    return 1 if results.get("errors") else 0


def targets_lines(results: dict) -> list[str]:
    """One line per target: its figure and whether it is met ("no figure" where its part did not run)."""
    duels, agreed = results.get("duels", {}).get("summary", {}), results.get("agreement", {})
    lines = [f"  first pick / database pick, {what} ≥ {TARGETS[name]}: "
             + (f"{duels[name]:.3f}× " if name in duels else "") + verdict(duels.get(name), TARGETS[name])
             for name, what in (("geomean", "geometric mean"), ("worst", "worst problem"))]
    slower = duels.get("slower_than_torch")
    shown = "no figure" if not duels.get("with_entry") else f"{len(slower)} {'met' if not slower else 'MISSED'}"
    lines.append(f"  problems slower than torch's call (beyond the duel's 95 % bounds) = 0: {shown}")
    lines.append(f"  two fresh tunes agree ≥ {TARGETS['agreement']:.0%}: "
                 + (f"{agreed['fraction']:.1%} " if agreed.get("fraction") is not None else "")
                 + verdict(agreed.get("fraction"), TARGETS["agreement"]))
    recall = results.get("recall", {}).get("paths", {})
    for path, counts in recall.items():
        if counts["plans"]:
            lines.append(f"  recall through {path}, all exact: {counts['exact']}/{counts['plans']} "
                         f"{'met' if counts['exact'] == counts['plans'] else 'MISSED'}")
    if not recall:
        lines.append("  recall: no figure")
    speed = results.get("invariance", {}).get("summary", {})
    for kind, bound in (("small", f"M ≤ {invariance.SMALL_M}"), ("large", f"M ≥ {invariance.LARGE_M}")):
        lowest = speed.get(f"lowest_{kind}")
        shown = "" if lowest is None else f"lowest {lowest:.3f}× "
        lines.append(f"  batch_invariant (measured ladder) speed at {bound} ≥ {invariance.TARGETS[kind]}: {shown}"
                     f"{verdict(lowest, invariance.TARGETS[kind])}")
    if speed:
        lines.append(f"  batch_invariant rows bitwise the same at M = 1 … {invariance.LARGEST_M}: "
                     f"{'met' if not speed['bitwise_differs'] else 'MISSED'}")
    lines += [f"  {part} failed: {error}" for part, error in results.get("errors", {}).items()]
    return lines


def run_invariance(args, ends: float, flush) -> dict:
    """The measured pins (tuned here unless ``--invariance-database`` names them), then the section."""
    pairs = args.invariance_pairs or invariance.suite_pairs()
    database = str(args.invariance_database) if args.invariance_database else None
    if database is None:
        budget = args.invariance_tune_budget or 3.0 * len(pairs) * len(invariance.EPILOGS)
        budget = min(budget, max(ends - time.perf_counter() - 60.0, 10.0))  # a minute kept for the timing
        begun = time.perf_counter()
        database = invariance.tune_database(pairs, args.out / "invariant.jsonl", budget)
        print(f"[invariance tune: {time.perf_counter() - begun:.0f} s]", flush=True)
    return invariance.section(pairs, args.invariance_rounds, ends - 5.0, flush, database, args.queue)


def run_parts(args, specs: list[dict], problem_file: Path, results: dict, ends: float) -> None:
    # without the tunes part, the duels run on the databases an earlier run left in --out
    databases: list = [None, None] if "tunes" in args.parts else [
        read_database(path) if path.is_file() else None for path in (args.out / f"tuning-{i}.jsonl" for i in (1, 2))]
    flush = None
    for part in [p for p in PARTS if p in args.parts]:
        begun = time.perf_counter()
        progress(f"part {part}")
        try:
            if part == "tunes":
                databases = run_tunes(args, problem_file, results)
                continue
            flush = flush if flush is not None else flush_buffer()
            if part == "duels":
                reserve = sum(RESERVE_S[p] for p in ("recall", "invariance") if p in args.parts)
                run_duels(args, specs, databases, results, ends - reserve, flush)
            elif part == "recall":
                found = tuning_recall.run(problem_file, args.out / "tuning-1.jsonl", args.out)
                entries = databases[0].entries if databases[0] is not None else {}
                results["recall"] = tuning_recall.evaluate(found["found"], entries) if "found" in found else found
                print()
                tuning_recall.report(results["recall"])
            else:
                results["invariance"] = run_invariance(args, ends, flush)
                results["invariance"]["summary"] = invariance.summarize(results["invariance"])
                invariance.report(results["invariance"], results["invariance"]["summary"])
        except Exception as error:  # noqa: BLE001 - one failed part must not lose the others' figures
            import traceback

            traceback.print_exc()
            results.setdefault("errors", {})[part] = f"{type(error).__name__}: {error}"
        finally:
            results["elapsed"][part] = time.perf_counter() - begun
            print(f"[part {part}: {results['elapsed'][part]:.0f} s; {time.perf_counter() - STARTED:.0f} s in all]",
                  flush=True)
            write(args, results)


if __name__ == "__main__":
    sys.exit(main())
