"""CPU fuzz of the public API (no GPU needed): hundreds of bad inputs — stand-in arrays, malformed
DLPack capsules and CAI dicts, bad scalars, epilogs, epilog inputs, options, preferences,
qualifiers, scales, streams, descriptor arguments — and valid calls beside them, through
``matmul``, ``Matmul(...).plan(...)``, ``MatrixLayout``, ``MatmulDesc`` and ``MatmulPreference``.

The cases live in ``_fuzz_inputs.py``. They run in worker processes, 60 to a process; when a
process dies, the case it was running is re-run alone to confirm the crash, and the rest of the
batch goes on in a new process. Required of every case:

- no crash and no hang (a worker that dies or stalls is a failure, never the end of the run);
- every refusal is an ``nvblaslt.NvblasltError`` (never a raw ctypes.ArgumentError, KeyError, …);
- an invalid input is refused by nvblaslt's own checks, before anything needs a GPU, and the
  message names the argument (``a:``, ``epilog_inputs['bias']``, ``alpha``, …);
- a valid input gets as far as the first step that needs a GPU, and fails there with a clear
  nvblaslt error about the missing GPU/driver;
- a refusal is also a ValueError or TypeError (issue 22), and an input accepted although it does
  nothing (as nvmath-python accepts it) gives a warning saying so.

Each test below asserts one of these and lists its offending inputs compactly, grouped.

By default the tests run a quick, deterministic part of the table (``quick_ids``): one case of every
family and variant — every kind of bad or valid input, each entry (``fn``/``obj``) and operand position
taken in turn — about a quarter of the cases, in about 10 s. A fault that shows at one operand
position or entry point alone may wait for the whole table: the same tests over it are marked
``slow`` as well, and run only when ``-m`` names it (tests/fuzz/conftest.py):

    python -m pytest -m fuzz tests                         # quick
    python -m pytest -m slow tests/fuzz                    # the whole table (30 s on 2 idle cores)
    python -m tests.fuzz.test_cpu_fuzz [--only PREFIX] [--quick]   # the report without pytest (repository root)
"""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKER = "tests.fuzz._fuzz_inputs"  # run as a module from ROOT: it imports nothing from the tests by path

pytestmark = pytest.mark.fuzz

BATCH = 60
WORKERS = max(1, min(4, os.cpu_count() or 1))
BATCH_TIMEOUT_S = 60


def _environment() -> dict:
    env = dict(os.environ)
    env.pop("NVBLASLT_LIBRARY", None)  # default discovery, as a user gets it
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "")  # a GPU machine fuzzes the CPU path too
    env["PYTHONFAULTHANDLER"] = "1"
    return env


def _spawn(args: list[str], timeout: float) -> tuple[int | None, str, str]:
    """(return code or None on timeout, stdout, stderr) of a worker."""
    try:
        done = subprocess.run([sys.executable, *args], cwd=ROOT, env=_environment(), capture_output=True,
                              text=True, timeout=timeout)
        return done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return None, out, err


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def _run_batch(ids: list[str]) -> dict[str, dict]:
    """Run ``ids`` in workers; every id gets a record, crashes and hangs included."""
    records: dict[str, dict] = {}
    pending = list(ids)
    while pending:
        code, out, err = _spawn(["-m", WORKER, *pending], BATCH_TIMEOUT_S)
        started, ended = None, False
        for line in out.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "start":
                started = event["id"]
            elif event.get("event") == "done":
                records[event["id"]] = event
                started = None
            elif event.get("event") == "end":
                ended = True
        if code == 0 and ended:
            break
        if ended:  # every case reported, then the interpreter died on the way out
            for case_id in pending:
                records.setdefault(case_id, {})["teardown"] = f"exit {code} after the last case: {_tail(err)}"
            break
        if started is None:  # died before its first case: nvblaslt (or the case table) cannot even load
            for case_id in pending:
                records[case_id] = {"outcome": "worker-failed", "message": f"exit {code}: {_tail(err, 12)}"}
            break
        what = "hang" if code is None else "crash"
        if len(pending) > 1:  # confirm alone: a crash only in company is still this case's
            alone_code, _, alone_err = _spawn(["-m", WORKER, started], BATCH_TIMEOUT_S)
            alone = alone_code != 0
            note = "" if alone else " (only after the cases before it in one process)"
            err = alone_err if alone else err
        else:
            note = ""
        records[started] = {"outcome": what, "message": f"exit {code}{note}: {_tail(err)}"}
        pending = [i for i in pending if i not in records]
    return records


# the no-GPU message test reads this one; the rotation below need not pick it
QUICK_ALWAYS = ("valid/plain/fn",)


def family_variant(case_id: str) -> str:
    """``operand/strides-negative`` of ``operand/strides-negative/bias/obj``: the input, wherever it goes."""
    return "/".join(case_id.split("/")[:2])


def quick_ids(cases: dict) -> list[str]:
    """One case of every family/variant, in table order. Which of a variant's cases (entry point,
    operand position) turns with the variant's index, so consecutive variants take different ones and
    every position and entry is exercised; the same ids on every run."""
    groups: dict[str, list[str]] = {}
    for case_id in cases:
        groups.setdefault(family_variant(case_id), []).append(case_id)
    chosen = {members[index % len(members)] for index, members in enumerate(groups.values())}
    chosen.update(i for i in QUICK_ALWAYS if i in cases)
    return [i for i in cases if i in chosen]


def run_all(only: str | None = None, quick: bool = False) -> tuple[dict, dict[str, dict]]:
    """(the cases that ran, their records): the whole table, or ``quick_ids`` of it."""
    from tests.fuzz._fuzz_inputs import build_cases

    table = build_cases()
    ids = [i for i in (quick_ids(table) if quick else table) if only is None or i.startswith(only)]
    cases = {i: table[i] for i in ids}
    batches = [ids[i:i + BATCH] for i in range(0, len(ids), BATCH)]
    records: dict[str, dict] = {}
    with ThreadPoolExecutor(WORKERS) as pool:
        for result in pool.map(_run_batch, batches):
            records.update(result)
    return cases, records


# ---- judging one case ------------------------------------------------------------------------------
def verdict(case, record: dict) -> tuple[str, str] | None:
    """(failure class, detail) or None when the case behaved."""
    found = _verdict(case, record)
    if found is None and case.warns:
        given = record.get("warnings") or []
        if not any(re.search(pattern, text) for pattern in case.warns for text in given):
            found = "unwarned", f"no warning matching {case.warns}; warnings: {given}"
    return found


def _verdict(case, record: dict) -> tuple[str, str] | None:
    outcome = record.get("outcome")
    if record.get("teardown"):
        return "crash", f"interpreter teardown: {record['teardown']}"
    if outcome in ("crash", "hang", "worker-failed"):
        return outcome if outcome != "worker-failed" else "crash", record.get("message", "")
    if outcome is None:
        return "crash", "no record"
    kind = case.kind
    message = record.get("message", "")
    short = f"{record.get('type')}: {message[:200]} [{record.get('where')}]"
    if outcome == "returned":
        if kind in ("ok", "any", "optional"):
            return None
        if kind == "invalid":
            return "accepted", "returned without an error"
        return "returned-without-gpu", "returned, though nothing can run without a GPU"
    if record.get("type") == "MemoryError":  # the worker's address-space cap caught a runaway read
        return "crash", f"{short} (without the worker's memory cap: exhausted memory or crashed)"
    if not record.get("nvblaslt"):
        return ("foreign-exception" if record.get("stand_in") else "raw-exception"), short
    if kind == "any":
        return None
    if kind == "ok":
        return "valid-refused", short
    no_gpu = record.get("no_gpu")
    if not no_gpu and not record.get("standard"):  # a refusal is an NvblasltError and ValueError or TypeError
        return "wrong-class", short
    named = any(re.search(token, message) for token in case.tokens)
    if kind == "optional":
        return None if named else ("unnamed", short)
    if kind == "valid":
        return None if no_gpu else ("valid-refused", short)
    if kind == "invalid" and no_gpu:
        return "not-checked-before-gpu", short
    if no_gpu:  # either
        return None
    return None if named else ("unnamed", short)


CLASSES = {
    "crash": "crashed or failed to start (the whole process died)",
    "hang": f"hung (no answer in {BATCH_TIMEOUT_S} s)",
    "raw-exception": "raised something other than an NvblasltError",
    "foreign-exception": "let an exception raised by the caller's object escape unwrapped",
    "unnamed": "refused without naming the argument",
    "not-checked-before-gpu": "invalid, but not refused until a GPU was needed",
    "accepted": "invalid, but accepted",
    "valid-refused": "valid (nvmath-python accepts it), but refused",
    "returned-without-gpu": "returned although no GPU is present",
    "wrong-class": "refused with an NvblasltError that is neither a ValueError nor a TypeError",
    "unwarned": "accepted, but without the warning that says it has no effect",
}


def report(cases, records, classes=None) -> list[str]:
    """Failures grouped by class, then by case family/variant, with the positions/entries hit."""
    groups: dict[tuple[str, str], list] = collections.defaultdict(list)
    for case_id, case in cases.items():
        if case_id not in records:
            continue
        found = verdict(case, records[case_id])
        if found is None or (classes is not None and found[0] not in classes):
            continue
        parts = case_id.split("/")
        family = "/".join(parts[:2])
        groups[(found[0], family)].append(("/".join(parts[2:]) or "-", found[1]))
    lines = []
    for failure_class in CLASSES:
        families = sorted(k for k in groups if k[0] == failure_class)
        if not families:
            continue
        count = sum(len(groups[k]) for k in families)
        lines.append(f"{failure_class}: {CLASSES[failure_class]} — {count} cases in {len(families)} groups")
        for key in families:
            hits = groups[key]
            where = ", ".join(sorted({h[0] for h in hits}))
            lines.append(f"  {key[1]} [{where}]: {hits[0][1]}")
    return lines


# ---- pytest ----------------------------------------------------------------------------------------------
def _library_installed() -> str | None:
    code, _, err = _spawn(["-c", "import nvblaslt; nvblaslt.library()"], 120)
    if code == 0:
        return None
    if "LibraryNotFoundError" in err:
        return f"no libcublasLt installed: {_tail(err, 2)}"
    return None  # another failure: let the fuzz report it


@pytest.fixture(scope="module", params=["quick", pytest.param("full", marks=pytest.mark.slow)])
def fuzz(request):
    """(the cases run, their records): ``quick_ids`` by default, the whole table under ``-m slow``."""
    reason = _library_installed()
    if reason:
        pytest.skip(reason)
    start = time.perf_counter()
    cases, records = run_all(quick=request.param == "quick")
    print(f"\ncpu fuzz ({request.param}): {len(cases)} cases in {time.perf_counter() - start:.0f} s")
    return cases, records


def _check(fuzz, classes: set[str]):
    cases, records = fuzz
    lines = report(cases, records, classes)
    if lines:
        pytest.fail("\n".join(lines), pytrace=False)


def test_every_case_ran(fuzz):
    from tests.fuzz._fuzz_inputs import build_cases

    cases, records = fuzz
    assert set(records) == set(cases)
    table = build_cases()
    kinds = collections.Counter(case.kind for case in table.values())
    assert len(table) >= 500 and kinds["invalid"] >= 300 and kinds["valid"] >= 50, kinds
    # the quick part still holds every kind of input, every expectation, entry point and operand position
    assert {family_variant(i) for i in cases} == {family_variant(i) for i in table}
    assert {case.kind for case in cases.values()} == set(kinds)
    ran = {tuple(i.split("/")[2:]) for i in cases if i.startswith("operand/")}
    assert {part for parts in ran for part in parts} >= {"a", "b", "c", "bias", "relu_aux", "gelu_aux", "out",
                                                         "fn", "obj"}, ran


def test_no_crash_and_no_hang(fuzz):
    _check(fuzz, {"crash", "hang"})


def test_every_refusal_is_an_nvblaslt_error(fuzz):
    _check(fuzz, {"raw-exception"})


def test_exceptions_from_callers_objects_are_wrapped(fuzz):
    """A producer whose ``__dlpack__`` (or ``__float__``, stream method, …) raises: the refusal is
    still an NvblasltError naming the argument, with the producer's exception as its cause."""
    _check(fuzz, {"foreign-exception"})


def test_invalid_inputs_are_refused_naming_the_argument(fuzz):
    _check(fuzz, {"unnamed", "accepted"})


def test_every_refusal_is_also_a_standard_class(fuzz):
    """Issue 22: an invalid input is refused with an NvblasltError that is also ValueError or TypeError."""
    _check(fuzz, {"wrong-class"})


def test_accepted_but_ignored_options_say_so(fuzz):
    """Issue 22: what nvmath-python accepts and nvblaslt must accept, though it does nothing
    (fast_accumulation for non-fp8 operands), gives a warning."""
    _check(fuzz, {"unwarned"})


def test_issue_22_items_are_all_covered(fuzz):
    """Every issue-22 item the CPU can judge has cases (masked arrays, escaping errors, meaningless
    arguments, the small inconsistencies), and they ran."""
    cases, records = fuzz
    for prefix in ("masked/a/", "masked/bias/", "masked/quantization_scales-a/", "masked/alpha-1-element/",
                   "masked/reset_operands-a/", "masked/out-with-host-operands/", "escape/set_log_level-",
                   "meaningless/fast_accumulation-float32/", "meaningless/compute_type-keyword-and-option/",
                   "meaningless/qualifiers-is_conjugate-2/", "qualifiers/length-4/",
                   "meaningless/MatmulOptions-compute_type-bogus", "meaningless/Handle-", "valid/numpy-host-reversed-a/",
                   "scalar/alpha-numpy-0-d/", "scalar/alpha-gpu-scalar/", "epilog/numpy-int64-RELU/"):
        assert any(i.startswith(prefix) and i in records for i in cases), prefix
    torch_cases = [i for i in cases if i.startswith(("escape/torch-", "meaningless/torch-autotune"))]
    if importlib.util.find_spec("torch") is not None:  # each torch variant, once at least
        assert len({family_variant(i) for i in torch_cases}) >= 14 and all(i in records for i in torch_cases)


def test_invalid_inputs_are_refused_before_a_gpu_is_needed(fuzz):
    _check(fuzz, {"not-checked-before-gpu"})


def test_valid_inputs_get_as_far_as_the_gpu(fuzz):
    _check(fuzz, {"valid-refused", "returned-without-gpu"})


def test_no_gpu_error_says_so_in_nvblaslts_words(fuzz):
    """Issue 10, first contact: without a driver the error is nvblaslt's own, naming the GPU/driver."""
    cases, records = fuzz
    record = records.get("valid/plain/fn", {})
    message = record.get("message", "")
    assert record.get("nvblaslt") and re.search(r"\bGPU\b", message) and re.search(r"driver", message, re.I), (
        f"matmul without a GPU said: {record.get('type')}: {message}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run only the case ids starting with this")
    parser.add_argument("--quick", action="store_true", help="one case of each family/variant (the pytest default)")
    options = parser.parse_args()
    begin = time.perf_counter()
    all_cases, all_records = run_all(options.only, options.quick)
    lines = report({k: v for k, v in all_cases.items() if k in all_records}, all_records)
    print("\n".join(lines))
    failed = sum(1 for k in all_records if verdict(all_cases[k], all_records[k]) is not None)
    print(f"cpu fuzz: {len(all_records)} cases in {time.perf_counter() - begin:.0f} s, {failed} failed")
    sys.exit(1 if failed else 0)
