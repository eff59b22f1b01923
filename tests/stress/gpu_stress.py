"""GPU stress script (issue 10, "Tests"): every risky case in its own process, with a timeout, so that
a crash or a hang is a recorded failure and not the end of the run.

    python -m tests.stress.gpu_stress [--only NAME[,NAME]] [--jobs J] [--log FILE] [--list] [--verbose]
    python -m pytest -m stress tests      # a smoke subset of the cases through this script (test_stress.py)

Run both from the repository root. The cases live in ``_stress_cases.py``
(``python -m tests.stress._stress_cases --list``). Independent cases run
``--jobs`` at a time (default 4); those marked exclusive (memory pressure) run alone at the end.
A case fails as: wrong (a wrong result returned without an error), error (an exception other than a
clean NvblasltError refusal, a broken capture, a library left unusable), crash (the process died), or
hang (it outlived its timeout). Summary:

    gpu_stress: N cases: P passed, F failed (W wrong results, C crashes, H hangs)

Exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # where ``tests`` imports from
CASE_RUNNER = "tests.stress._stress_cases"


_CACHE_DIR = None


def _environment() -> dict:
    global _CACHE_DIR
    if _CACHE_DIR is None:  # autotune(search=True) in a case must not write to the user's own tuning cache
        import atexit
        import shutil
        import tempfile

        _CACHE_DIR = tempfile.mkdtemp(prefix="nvblaslt-stress-tuning-")
        atexit.register(shutil.rmtree, _CACHE_DIR, True)
    env = dict(os.environ)
    env["NVBLASLT_CACHE_DIR"] = _CACHE_DIR
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    env["PYTHONFAULTHANDLER"] = "1"  # a crash prints the Python stack of every thread
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_one(name: str, timeout: float, scale: float) -> dict:
    """Run case ``name`` in a fresh process; its record: status, detail, notes, seconds."""
    start = time.perf_counter()
    limit = timeout * scale
    process = subprocess.Popen([sys.executable, "-m", CASE_RUNNER, name], cwd=ROOT,
                               env=_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=limit)
        hung = False
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the case and anything it started
        out, err = process.communicate()
        hung = True
    seconds = time.perf_counter() - start
    notes, status = [], None
    for line in (out or "").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if "note" in event:
            notes.append(event["note"])
        elif "status" in event:
            status = event
    tail = " | ".join(line.strip() for line in (err or "").strip().splitlines()[-8:])
    if hung:
        return {"name": name, "status": "hang", "detail": f"no result after {limit:.0f} s; stderr: {tail}"[:1500],
                "notes": notes, "seconds": seconds}
    if status is None or process.returncode < 0:
        how = f"signal {-process.returncode}" if process.returncode < 0 else f"exit {process.returncode}"
        return {"name": name, "status": "crash", "detail": f"{how} without a result; stderr: {tail}"[:1500],
                "notes": notes, "seconds": seconds}
    record = {"name": name, "status": status["status"], "detail": status.get("detail", ""), "notes": notes,
              "seconds": seconds}
    if status.get("where"):
        record["where"] = status["where"]
    return record


def main(argv=None) -> int:
    from tests.stress._stress_cases import CASES

    parser = argparse.ArgumentParser(description="nvblaslt GPU stress cases, each in its own process")
    parser.add_argument("--only", help="comma-separated names (or parts of names) of the cases to run")
    parser.add_argument("--jobs", type=int, default=4, help="cases run at once (exclusive ones always alone)")
    parser.add_argument("--log", help="write one JSON line per case here")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every case's timeout")
    parser.add_argument("--verbose", action="store_true", help="print every case's notes")
    args = parser.parse_args(argv)

    names = list(CASES)
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        names = [n for n in names if any(w == n or w in n for w in wanted)]
        if not names:
            parser.error(f"no case matches {args.only!r}; cases: {', '.join(CASES)}")
    if args.list:
        for name in names:
            function, timeout, exclusive = CASES[name]
            print(f"{name:34s} {timeout:4.0f}s{' exclusive' if exclusive else ''}  "
                  f"{function.__doc__.strip().splitlines()[0]}")
        return 0

    parallel = [n for n in names if not CASES[n][2]]
    alone = [n for n in names if CASES[n][2]]
    start = time.perf_counter()
    records = []
    log = open(args.log, "w") if args.log else None

    def report(record):
        records.append(record)
        status = record["status"]
        mark = {"pass": "PASS", "skip": "SKIP"}.get(status, f"FAIL[{status}]")
        print(f"{mark:12s} {record['name']} ({record['seconds']:.1f} s)"
              + (f": {record['detail']}" if status not in ("pass",) and record["detail"] else ""), flush=True)
        if status not in ("pass", "skip"):
            for line in record.get("where", [])[-3:]:
                print(f"{'':12s}   {line}")
        if args.verbose or status not in ("pass", "skip"):
            for note in record["notes"][-12:]:
                print(f"{'':12s} - {note}")
        if log:
            log.write(json.dumps(record) + "\n")
            log.flush()

    print(f"gpu_stress: {len(names)} cases, {min(args.jobs, max(len(parallel), 1))} at a time, "
          f"{len(alone)} alone", flush=True)
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = [pool.submit(run_one, name, CASES[name][1], args.timeout_scale) for name in parallel]
        for future in futures:
            report(future.result())
    for name in alone:
        report(run_one(name, CASES[name][1], args.timeout_scale))
    if log:
        log.close()

    counted = [r for r in records if r["status"] != "skip"]
    failed = [r for r in counted if r["status"] != "pass"]
    kinds = {k: sum(r["status"] == k for r in failed) for k in ("wrong", "crash", "hang", "error")}
    skipped = len(records) - len(counted)
    print(f"\ngpu_stress: {len(counted)} cases: {len(counted) - len(failed)} passed, {len(failed)} failed "
          f"({kinds['wrong']} wrong results, {kinds['crash']} crashes, {kinds['hang']} hangs"
          + (f", {kinds['error']} errors" if kinds["error"] else "") + ")"
          + (f", {skipped} skipped" if skipped else "") + f" [{time.perf_counter() - start:.0f} s]")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
