"""``nvblaslt tune`` and ``nvblaslt.tune()``: tune a set of problems into a tuning database.

Each problem (the LLM suite's, ``_tune_suite``, or those ``NVBLASLT_RECORD`` wrote) is planned on
arrays of nvblaslt's own with the heuristics alone (neither a loaded database nor the user's cache is
recalled), then searched by ``_autotune``'s engine within its share of the budget: the heuristics' list
in shuffled rounds, where the first pick stays unless another beats it in an interleaved duel, then
``_search``'s candidates (the heuristics' deeper ranking, other epilogs' picks, cluster and swizzle
variants, every algorithm id and tile ``cublasLtMatmulAlgoCheck`` accepts), a challenger kept only when
it beats that incumbent in a duel by ``_duel.MIN_GAIN`` beyond the noise, and then beats the first pick
again on a second set of operands (``_confirmed``). The database records the winner (``tuned``, with its time
over the first pick's), or that the first pick stays (``default``). A
``batch_invariant`` problem records the algorithms pinned for it (``pinned``: a ladder, one kernel per
range of M, all of one verified bit class; ``_invariant_ladder``).

The database is written after each problem (atomically), so an interrupted run keeps what it tuned,
and a run into an existing file goes on where it stopped (problems already in it are skipped).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from . import _autotune, _cuda, _search, _tuning_cache, _tuning_db, _tuning_record
from ._cuda import cudart
from ._errors import NvblasltError, NvblasltTypeError, NvblasltValueError
from ._logging import logger
from ._tune_arrays import device_array
from ._tune_suite import invariant_suite, llm_suite

MIN_PROBLEM_S = 1.0  # below this share of the budget a search cannot finish its duels: the run stops
CONFIRM_SHARE = 0.25  # of a problem's share, for the kept kernel's second duel on other operands (_confirmed)
ITERATIONS = 5


@contextlib.contextmanager
def _heuristics_only():
    """Plans made inside ask the heuristics alone: tuning starts from their first pick."""
    previous, _tuning_cache.recall_enabled = _tuning_cache.recall_enabled, False
    try:
        yield
    finally:
        _tuning_cache.recall_enabled = previous


# ---- one problem --------------------------------------------------------------------------------------------
def _entry(report, launch, timings, first, first_ms: float, summary: str) -> dict:
    chosen, chosen_ms = timings[0]
    if _search.config_key(chosen) == _search.config_key(first):
        # how near a switch came (two tunes part where one challenger's gain sits near MIN_GAIN): the search's
        # best challenger against its incumbent, the first pick here unless autotune had switched from it
        best = report.best_challenger_config
        near = ({"best_ratio": round(report.ratio, 4), "best_config": best} if best and not report.switched
                and report.first_pick_ratio == 1.0 and math.isfinite(report.ratio) else {})
        return _tuning_db.entry_for(None, "default", problem=summary, first_pick_ms=round(first_ms, 5),
                                   seconds=round(report.seconds, 1), **near)
    # paired ratios only (medians of separate runs drift apart by a few % on a small GEMM, and read a kept
    # pick as slower than the first): autotune's duel of its pick against the first pick, times the search's
    # duel of the chosen against that pick where the search switched
    ratio = report.first_pick_ratio * (report.ratio if report.switched else 1.0)
    return _tuning_db.entry_for(chosen, "tuned", problem=summary, ms=round(chosen_ms, 5),
                                first_pick_ms=round(first_ms, 5), ratio=round(ratio, 4),
                                confidence=round(report.confidence, 4), seconds=round(report.seconds, 1))


def _first_pick_ms(timings, first) -> float:
    wanted = _search.config_key(first)
    return next((ms for result, ms in timings if _search.config_key(result) == wanted), timings[0][1])


def _tune_matmul(spec: dict, budget_s: float, device: int, patterns: dict, skip) -> tuple | None:
    """(key, entry) of ``spec``'s problem, then (key, entry) of a split form's first call where it has one;
    None where ``skip(key)``."""
    from ._plan import Matmul

    which = (spec.get("options") or {}).get("batch_invariant")
    if which:  # a measured pin (_invariant_tune), where it can vary the problem's tokens
        from ._invariant_tune import measure

        with _heuristics_only():
            found = measure(spec, "rows" if which is True else which, budget_s, device, patterns, skip)
        if found is not NotImplemented:
            return found
    with _cuda.on_device(device):
        stream = 0
        arrays = {name: device_array(spec[name], device, stream, patterns) for name in ("a", "b")}
        c = device_array(spec["c"], device, stream, patterns) if spec.get("c") else None
        inputs = {key: device_array(value, device, stream, patterns) for key, value in spec.get("inputs", {}).items()}
        fp8 = {name for name in ("a", "b") if spec[name]["dtype"].startswith("float8")}
        result_type = spec.get("options", {}).get("result_type", "")
        scales = {name: 1.0 for name in fp8 | ({"d"} if str(result_type).startswith("float8") else set())}
        with _heuristics_only(), Matmul(arrays["a"], arrays["b"], c, beta=0.0 if c is not None else None,
                                        options=spec.get("options"), quantization_scales=scales or None,
                                        stream=stream) as plan:
            plan.plan(epilog=spec.get("epilog", "DEFAULT"), epilog_inputs=inputs or None)
            launch = plan._launch
            invariant = plan._options.batch_invariant
            if invariant:  # today's pin: a problem the measured tuner cannot vary
                from ._batch_invariant import pinned_entry

                pin_key, entry = pinned_entry(launch, invariant)
                return None if skip(pin_key) else (pin_key, entry)
            key = _tuning_cache.key_of(launch)
            if key is None or skip(key):
                return None
            first = plan.algorithm
            description = _tuning_cache.problem_description(launch)
            summary = _tuning_cache.problem_summary(description, launch.lib.api)
            tuned = _autotune.tune(plan, iterations=ITERATIONS, search=True, remember=False, stream=stream,
                                   budget_s=budget_s)
            timings = tuned.timings
            entry = _entry(tuned.report, launch, timings, first, _first_pick_ms(timings, first), summary)
            if tuned.split_form is None or tuned.bias_gradient_form is None:
                if entry["kind"] == "tuned":
                    entry = _confirmed(entry, plan, spec, first, timings[0][0], budget_s, device, stream, patterns)
                return key, entry
            try:  # the two-call form won: the entry says so, and the first call's kernel goes beside it
                split_ms, fused_ms = tuned.bias_gradient_form[1:]
                for fused_only in ("best_ratio", "best_config"):  # the fused kernel's search: not what runs
                    entry.pop(fused_only, None)
                entry.update(bias_gradient_form="split", form_ratio=round(split_ms / fused_ms, 4))
                return (key, entry, *_first_call_entry(tuned.split_form.main))
            finally:
                tuned.split_form.free()


def _confirmed(entry: dict, plan, spec: dict, first, chosen, budget_s: float, device: int, stream: int,
               patterns: dict) -> dict:
    """``entry`` (a kept kernel) where that kernel beats the first pick again on a second set of operands (other
    values at other addresses, the epilog's inputs too: ``_autotune.confirm``), with its ratio there
    (``second_ratio``); else a ``default`` entry that names the kernel not kept (``unconfirmed``), its ratio on
    the tune's operands (``unconfirmed_ratio``) and on the others (``second_ratio``). On an H200, llama3-8b's
    40 µs GELU_AUX_BIAS GEMM at 16 tokens: its first pick read 2 % slower on the tune's arrays than on torch's,
    and five of seventeen fresh tunes kept a kernel at 0.956-0.964× it there that read 0.986-1.062× it on
    torch's arrays. Where the duel cannot run (the first pick refused at launch, as the heuristics offer for
    some aux epilogs at M = 1, where the search timed the next one; no memory for a second set), ``entry`` is
    returned as it was, without ``second_ratio``."""
    started = time.perf_counter()
    try:
        arrays = {name: device_array(spec[name], device, stream, patterns, seed=1) for name in ("a", "b")}
        c = device_array(spec["c"], device, stream, patterns, seed=1) if spec.get("c") else None
        inputs = {key: device_array(value, device, stream, patterns, seed=1)
                  for key, value in spec.get("inputs", {}).items()}
        plan.reset_operands(arrays["a"], arrays["b"], c, epilog_inputs=inputs or None)
        standing = _autotune.confirm(plan, first, chosen, first_ms=entry["first_pick_ms"], stream=stream,
                                     budget_s=CONFIRM_SHARE * budget_s, settle_s=_autotune.settle_time(budget_s))
    except NvblasltError as error:
        logger.info("confirmation: not run (%s); the kept kernel stays, unconfirmed", error)
        return entry
    seconds = round(entry["seconds"] + time.perf_counter() - started, 1)
    if standing.verdict == "faster":
        return {**entry, "second_ratio": round(standing.ratio, 4), "seconds": seconds}
    return _tuning_db.entry_for(None, "default", problem=entry["problem"], first_pick_ms=entry["first_pick_ms"],
                                unconfirmed=entry["config"], unconfirmed_ratio=entry["ratio"],
                                second_ratio=round(standing.ratio, 4), seconds=seconds)


def _first_call_entry(main) -> tuple[tuple[str, dict], ...]:
    """The split form's first plan (autotuned over the heuristics' list when it was made) as a database
    entry of its own problem, where autotune kept another kernel than the first pick: a later plan of the
    split form recalls it. Nothing where the first pick stays (the heuristics give it again)."""
    report, key = main.tuning_report, _tuning_cache.key_of(main._launch)
    if report is None or key is None or report.first_pick_ratio >= 1.0:  # 1.0 exactly: the first pick stayed
        return ()
    summary = _tuning_cache.problem_summary(_tuning_cache.problem_description(main._launch), main._launch.lib.api)
    return ((key, _tuning_db.entry_for(main.algorithm, "tuned", problem=summary, ms=round(report.chosen_ms, 5),
                                       ratio=round(report.first_pick_ratio, 4), of_split_form=True,
                                       seconds=round(report.seconds, 1))),)


def _tune_grouped(spec: dict, budget_s: float, device: int, patterns: dict, skip) -> tuple[str, dict] | None:
    from ._grouped import GroupedMatmul
    from ._grouped_version import require_grouped
    from ._loader import library

    require_grouped(library())  # NvblasltUnsupportedError: skipped, and said, by the caller
    with _cuda.on_device(device):
        stream = 0
        a = device_array(spec["a"], device, stream, patterns)
        b = device_array(spec["b"], device, stream, patterns)
        ends = (ctypes.c_int32 * len(spec["offs"]))(*spec["offs"])
        offs = device_array({"shape": [len(ends)], "strides": [1], "dtype": "int32"}, device, stream, patterns)
        _cuda.check(cudart.cudaMemcpy(offs.ptr, ctypes.addressof(ends), ctypes.sizeof(ends),
                                      cudart.cudaMemcpyKind.cudaMemcpyHostToDevice), "cudaMemcpy")
        plan = GroupedMatmul(a, b, offs, stream=stream)
        try:
            with _heuristics_only():
                plan.plan()
            key = _tuning_cache.key_of(plan._launch)
            if key is None or skip(key):
                return None
            first = plan.algorithm
            launch = plan._launch
            summary = _tuning_cache.problem_summary(_tuning_cache.problem_description(launch), launch.lib.api)
            timings = plan.autotune(iterations=ITERATIONS, search=True, budget_s=budget_s, remember=False)
            return key, _entry(plan.tuning_report, plan._launch, timings, first, _first_pick_ms(timings, first),
                               summary)
        finally:
            plan.free()


# ---- the run ------------------------------------------------------------------------------------------------
def _problems(problems, models, tokens, dtypes, pairs=None, epilogs=None) -> list[dict]:
    if isinstance(problems, str) and problems == "llm":
        return llm_suite(models, tokens, dtypes)
    if isinstance(problems, str) and problems == "llm-invariant":
        return invariant_suite(models, pairs, epilogs)
    if isinstance(problems, (str, os.PathLike)):
        return _tuning_record.read_problems(problems)
    if isinstance(problems, (list, tuple)) and all(isinstance(p, dict) for p in problems):
        return list(problems)
    raise NvblasltTypeError(f"problems: expected 'llm', 'llm-invariant', a path of recorded problems, or a list of "
                            f"problem dicts, got {type(problems).__name__}")


def _name(spec: dict) -> str:
    if "name" in spec:
        return spec["name"]
    a, b = spec["a"]["shape"], spec["b"]["shape"]
    return f"{spec.get('epilog', spec['kind'])} {a} @ {b} {spec['a']['dtype']}"


def _shown(entry: dict) -> str:
    """An entry's outcome in a progress line."""
    if "form_ratio" in entry:  # the split bias-gradient form won
        kernel = f"{entry['ratio']:.3f}× the first pick" if "ratio" in entry else "the first pick"
        return f"{kernel}, in the split bias-gradient form at {entry['form_ratio']:.3f}× the fused kernel"
    if "ratio" in entry:
        return f"{entry['ratio']:.3f}× the first pick"
    if "unconfirmed_ratio" in entry and "second_ratio" in entry:
        return (f"default (a kernel at {entry['unconfirmed_ratio']:.3f}× the first pick read "
                f"{entry['second_ratio']:.3f}× on other operands: not kept)")
    if "best_ratio" in entry:
        return f"default (the best challenger read {entry['best_ratio']:.3f}×)"
    if "speed" in entry:  # a measured pin: its (ladder's) speed × the default per M, and the others'
        def speeds(found: dict) -> str:
            return " ".join(f"{m}:{r:.2f}" for m, r in found.items())
        what = f"ladder of {len(entry['ladder'])}" if entry.get("ladder") else f"pinned {entry['source']}"
        single = f"; best single kernel {speeds(entry['single_speed'])}" if "single_speed" in entry else ""
        today = f"; today's pin {speeds(entry['today_speed'])}" if "today_speed" in entry else ""
        return f"{what}: × the default at M {speeds(entry['speed'])}{single}{today}"
    return entry["kind"]


def _second_set(entry: dict) -> str:
    """What the confirmation on a second set of operands found, for ``tune show``."""
    if entry["kind"] == "default" and "unconfirmed_ratio" in entry:
        return (f"not kept: a kernel at {entry['unconfirmed_ratio']:.3f}× the first pick read "
                f"{entry['second_ratio']:.3f}× on a second set of operands")
    return f"on a second set of operands: {entry['second_ratio']:.3f}×"


def _print_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def tune(problems="llm", database=None, *, budget_s: float = 600.0, models=None, tokens=None, dtypes=None,
         pairs=None, epilogs=None, device: int = 0,
         progress: Callable[[str], None] | None = _print_progress) -> _tuning_db.TuningDatabase:
    """Tune a set of problems within a time budget into a tuning database (``nvblaslt tune``).

    Each problem is planned with the heuristics alone and searched by ``Matmul.autotune(search=True)``'s
    engine in its share of the budget; the database records the kernel that beat the heuristics' first
    pick in an interleaved duel (by 1.5 % at least, beyond the noise) and again on a second set of operands
    (other values at other addresses), or that the first pick stays.
    Problems marked ``batch_invariant`` record a measured ladder: of the heuristics' picks at M = 1 … 8192
    and the search's, each with split-K 1, 2, 4 and 8 (a fixed count, the COMPUTE_TYPE reduction), those
    whose first tokens are bitwise the same at every M checked, grouped into classes by those bits; the
    class whose ladder (its fastest member at each of M = 1 … 8192, each range of M between going to the
    member of the point above) has the highest worst speed × the default plan over M (against 0.95 at
    M ≤ 64, 0.85 from 256) is recorded. Needs a GPU.

    Parameters
    ----------
    problems : "llm", "llm-invariant", str or os.PathLike, or list of dict, default "llm"
        The built-in LLM suite (Llama-3-8B/70B, Mixtral-8x7B, Qwen3-8B and Qwen3-30B-A3B layer shapes at
        1 to 8192 tokens: forward bf16 and fp8, GELU_AUX_BIAS / DGELU / BGRADB, grouped experts), its
        batch-invariant form (every (N, K) of its dense layers with BIAS / RELU_BIAS / GELU_BIAS, bf16,
        as ``nvblaslt.torch`` runs them with ``batch_invariant=True``), a file ``NVBLASLT_RECORD`` wrote,
        or such problems as dicts.
    database : str or os.PathLike, optional
        Where the database is written, after each problem. An existing file is continued: its problems
        are not tuned again (its fingerprint must be this GPU's). None: kept in memory only.
    budget_s : float, default 600
        Seconds for the whole run; each problem gets an equal share of what is left (at most
        ``_autotune.SEARCH_BUDGET_S``). Problems beyond the budget are left for another run. A kept kernel's
        confirmation on a second set of operands takes up to a quarter of its problem's share more, so the
        last problem may end that much past the budget.
    models, tokens, dtypes : sequence, optional
        For the suite: model names (``llama3-8b``, ``llama3-70b``, ``mixtral-8x7b``, ``qwen3-8b``,
        ``qwen3-30b-a3b``), token counts, and ``"bf16"`` / ``"fp8"``; default all.
    pairs, epilogs : sequence, optional
        For ``"llm-invariant"``: (N, K) pairs (default the models' dense ones) and epilogs (default
        BIAS, RELU_BIAS, GELU_BIAS; DEFAULT, RELU and GELU run as ``x @ Wᵀ``).
    device : int, default 0
        The GPU.
    progress : callable, optional
        Called with one line per problem (default: printed to stderr); None for silence.

    Returns
    -------
    TuningDatabase
        The database (also written to ``database``).

    Raises
    ------
    NvblasltTypeError, NvblasltValueError
        Arguments of the wrong kind or value, an unreadable problems file (named, with the line), or a
        ``database`` file of another machine's fingerprint.

    Examples
    --------
    On a GPU (``nvblaslt tune --budget 600 -o tuning.jsonl`` does the same from a shell):

    .. code-block:: python

        import nvblaslt

        database = nvblaslt.tune("llm", "tuning.jsonl", models=["llama3-8b"], budget_s=600)
        print(database.counts())                 # {'tuned': …, 'default': …, 'pinned': 0}
        nvblaslt.load_tuning("tuning.jsonl")     # in any later process on this machine
    """
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not budget_s > 0:
        raise NvblasltValueError(f"budget_s: expected a positive number of seconds, got {budget_s!r}")
    specs = _problems(problems, models, tokens, dtypes, pairs, epilogs)
    from ._loader import library

    fingerprint = _tuning_db.fingerprint_of(_tuning_cache.gpu_identity(device), library().version_tuple,
                                            _cuda.driver_version())
    result = _tuning_db.TuningDatabase(fingerprint)
    if database is not None and Path(database).exists():
        result = _tuning_db.read(database)
        if not result.matches(fingerprint):
            raise NvblasltValueError(f"database: {os.fspath(database)} is for "
                                     f"{_tuning_db.describe_fingerprint(result.fingerprint)}, this GPU is "
                                     f"{_tuning_db.describe_fingerprint(fingerprint)}; write another file")
    say = progress or (lambda line: logger.info("%s", line))
    started = time.perf_counter()
    patterns: dict[str, bytes] = {}
    counts = {"tuned": 0, "default": 0, "pinned": 0, "skipped": 0, "failed": 0}
    # entries written beside a split form (this run's or a continued file's), which a problem of their own replaces
    companions = {key for key, entry in result.entries.items() if entry.get("of_split_form")}
    for index, spec in enumerate(specs):
        left = budget_s - (time.perf_counter() - started)
        share = min(_autotune.SEARCH_BUDGET_S, left / (len(specs) - index))
        if share < MIN_PROBLEM_S:
            say(f"budget spent: {len(specs) - index} of {len(specs)} problems left for another run")
            break
        begun = time.perf_counter()
        logger.info("tune: [%d/%d] %s, %.1f s", index + 1, len(specs), _name(spec), share)  # heads its search's log
        try:
            tune_one = _tune_grouped if spec["kind"] == "grouped" else _tune_matmul
            found = tune_one(spec, share, device, patterns,
                             lambda key: key in result.entries and key not in companions)
        except NvblasltError as error:  # a problem this GPU or library cannot run: said, and the run goes on
            counts["failed"] += 1
            say(f"[{index + 1}/{len(specs)}] {_name(spec)}: not tuned ({error})")
            continue
        if found is None:
            counts["skipped"] += 1
            continue
        (key, entry), beside = found[:2], found[2:]
        result.entries[key] = entry
        companions.discard(key)
        for other_key, other in beside:  # a split form's first call: a problem tuned on its own keeps its entry
            if other_key not in result.entries:
                result.entries[other_key] = other
                companions.add(other_key)
        counts[entry["kind"]] += 1
        if database is not None:
            result.write(database)
        say(f"[{index + 1}/{len(specs)}] {_name(spec)}: {_shown(entry)} ({time.perf_counter() - begun:.1f} s, "
            f"{budget_s - (time.perf_counter() - started):.0f} s left)")
    say(", ".join(f"{n} {kind}" for kind, n in counts.items() if n) or "nothing to tune")
    return result


# ---- the command ----------------------------------------------------------------------------------------------
def _csv(kind):
    return lambda text: [kind(item) for item in text.split(",") if item]


def _pair(text: str) -> tuple[int, int]:
    import argparse

    try:
        n, k = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N x K as 4096x14336, got {text!r}") from None
    return n, k


def _databases(paths) -> list[_tuning_db.TuningDatabase]:
    return [_tuning_db.read(path) for path in paths]


def main(argv: list[str]) -> int:
    """``nvblaslt tune …``: tune (the suite or recorded problems), or ``merge`` / ``diff`` / ``show`` files."""
    import argparse

    command = argv[0] if argv[:1] and argv[0] in ("merge", "diff", "show") else None
    parser = argparse.ArgumentParser(prog=f"nvblaslt tune{' ' + command if command else ''}",
                                     description="tuning databases: see docs/guide/tuning.md")
    if command == "merge":
        parser.add_argument("inputs", nargs="+", help="databases of one machine's fingerprint")
        parser.add_argument("-o", "--output", required=True, help="the merged database (may be one of the inputs)")
    elif command == "diff":
        parser.add_argument("old")
        parser.add_argument("new")
    elif command == "show":
        parser.add_argument("database")
    else:
        source = parser.add_mutually_exclusive_group()
        source.add_argument("--suite", choices=["llm"], default="llm", help="the built-in LLM suite (default)")
        source.add_argument("--problems", help="a file NVBLASLT_RECORD wrote")
        source.add_argument("--batch-invariant", action="store_true",
                            help="the suite's (N, K) pairs as batch-invariant problems: a measured pin for each")
        parser.add_argument("-o", "--output", help="the database to write (an existing one is continued)")
        parser.add_argument("--budget", type=float, default=600.0, help="seconds for the whole run (default 600)")
        parser.add_argument("--models", type=_csv(str), help="suite models, comma-separated")
        parser.add_argument("--tokens", type=_csv(int), help="suite token counts, comma-separated")
        parser.add_argument("--dtypes", type=_csv(str), help="suite dtypes: bf16,fp8")
        parser.add_argument("--pairs", type=_csv(_pair), help="with --batch-invariant: N x K pairs, as 4096x14336,…")
        parser.add_argument("--epilogs", type=_csv(str), help="with --batch-invariant: epilogs (default "
                            "BIAS,RELU_BIAS,GELU_BIAS)")
        parser.add_argument("--device", type=int, default=0)
        parser.add_argument("--log", help="write the search's log to this file: for each problem what it screened, "
                            "which kernels dueled, what won and by how much")
        parser.add_argument("--list", action="store_true", help="print the problems and stop (no GPU needed)")
    args = parser.parse_args(argv[1:] if command else argv)
    try:
        if command == "merge":
            merged = _tuning_db.merge(*_databases(args.inputs))
            merged.write(args.output)
            print(f"{args.output}: {len(merged)} entries ({_counts(merged)})")
            return 0
        if command == "diff":
            lines = _tuning_db.diff(*_databases([args.old, args.new]))
            print("\n".join(lines) if lines else "the same choices")
            return 1 if lines else 0
        if command == "show":
            database = _tuning_db.read(args.database)
            print(f"{args.database}: {_tuning_db.describe_fingerprint(database.fingerprint)}")
            print(f"  {len(database)} entries ({_counts(database)})")
            for key in sorted(database.entries, key=lambda k: database.entries[k].get("problem", k)):
                entry = database.entries[key]
                ratio = f" {entry['ratio']:.3f}×" if "ratio" in entry else ""
                print(f"  {entry['kind']:8}{ratio:>8}  {entry.get('problem', key)}")
                if entry.get("ladder"):
                    print(f"{'':18}ladder: {_tuning_db.describe_ladder(entry)}")
                if "second_ratio" in entry:
                    print(f"{'':18}{_second_set(entry)}")
                if "best_ratio" in entry:
                    print(f"{'':18}the best challenger read {entry['best_ratio']:.3f}×: "
                          f"{_tuning_db.describe_config({'config': entry.get('best_config'), 'algo': '?'})}")
            return 0
        problems = args.problems or ("llm-invariant" if args.batch_invariant else args.suite)
        if args.list:
            if args.log:
                parser.error("--log: --list runs no search to log")
            for spec in _problems(problems, args.models, args.tokens, args.dtypes, args.pairs, args.epilogs):
                print(_name(spec))
            return 0
        with _search_log(args.log) as progress:
            tune(problems, args.output, budget_s=args.budget, models=args.models, tokens=args.tokens,
                 dtypes=args.dtypes, pairs=args.pairs, epilogs=args.epilogs, device=args.device, progress=progress)
        if args.output:
            print(f"written: {args.output}")
        return 0
    except NvblasltError as error:
        print(f"nvblaslt tune: {error}", file=sys.stderr)
        return 2


@contextlib.contextmanager
def _search_log(path: str | None):
    """The ``nvblaslt`` logger at INFO into ``path`` while tuning, each line stamped with the milliseconds
    since ``logging`` was imported (about the process's start); yields the progress function for ``tune``,
    which prints each problem's line and logs it there too. Warnings still reach stderr where no one has
    set up logging, and an error that ends the run is logged before it propagates. Two tunes' logs side by
    side say why they chose differently. Nothing of this where ``path`` is None."""
    if path is None:
        yield _print_progress
        return
    import logging

    try:
        handler = logging.FileHandler(path, mode="w", encoding="utf-8")
    except OSError as error:
        raise NvblasltValueError(f"--log: cannot write {path!r} ({error.strerror or error})") from None
    handler.setFormatter(logging.Formatter("%(relativeCreated)9.0f %(message)s"))
    handler.setLevel(logging.INFO)
    package_logger = logging.getLogger("nvblaslt")
    added: list[logging.Handler] = [handler]
    if not package_logger.handlers and not logging.getLogger().handlers:  # the file would take lastResort's place
        warnings = logging.StreamHandler(sys.stderr)
        warnings.setLevel(logging.WARNING)
        added.append(warnings)
    level = package_logger.level
    for each in added:
        package_logger.addHandler(each)
    if package_logger.getEffectiveLevel() > logging.INFO:
        package_logger.setLevel(logging.INFO)

    def progress(line: str) -> None:
        _print_progress(line)
        package_logger.info("%s", line)
    try:
        yield progress
    except Exception as error:
        package_logger.error("nvblaslt tune stopped: %s", error)
        raise
    finally:
        for each in added:
            package_logger.removeHandler(each)
        package_logger.setLevel(level)
        handler.close()


def _counts(database: _tuning_db.TuningDatabase) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in database.counts().items())
