#!/usr/bin/env python3
"""nvmath-python's own matmul tests, run against nvblaslt with only the import swapped.

    python tools/nvmath_suite.py fetch [--tag v0.9.0] [--dir build/nvmath-suite]
    python tools/nvmath_suite.py run --target nvmath --out nvmath.json       # the baseline
    python tools/nvmath_suite.py run --target nvblaslt --out nvblaslt.json   # the same tests on nvblaslt
    python tools/nvmath_suite.py compare nvmath.json nvblaslt.json

``fetch`` checks out the ``tests/`` folder of the public nvmath-python repository at a tag, with git
(NVIDIA's tests are Apache-2.0; nvblaslt never ships them). ``run`` runs pytest on its matmul tests in
a child process, with this file loaded as a pytest plugin. With ``--target nvblaslt`` the plugin puts
nvblaslt's public objects in place of ``nvmath.linalg.advanced``'s (``matmul``, ``Matmul``,
``MatmulEpilog``, the options classes) before the test modules import them, as a user who changed only
the import gets them. Two things stay nvmath-python's: the fp8 tests' reference helper, which computes
the expected result, and the error class the tests' skip helper compares by identity (a cuBLASLt
``NOT_SUPPORTED`` from nvblaslt is raised as nvmath-python's ``cuBLASLtError`` with the same status;
``--raw-errors`` turns that off). Each test's outcome goes to ``--out`` as JSON; ``compare`` lists the
tests that pass on the first file's target and not on the second's.

``run`` needs a GPU, and nvmath-python, CuPy, PyTorch, NumPy, hypothesis and pytest importable.
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPOSITORY = "https://github.com/NVIDIA/nvmath-python"
TAG = "v0.9.0"  # the tag the published comparison (docs/compatibility.md) used
DIRECTORY = Path("build/nvmath-suite")
MATMUL_TESTS = Path("nvmath_tests/linalg/advanced/matmul")  # under the checkout's tests/
# The matmul test files that reach nvmath-python's public entry points on any GPU nvblaslt supports. Left
# out: block scaling (MXFP8, NVFP4: Blackwell only, and not supported by nvblaslt), test_ifc.py (nvmath's
# descriptor internals), test_perf.py (asserts nothing).
FILES = ("test_epilog.py", "test_matmul_with_hypothesis.py", "test_input.py", "test_reset.py",
         "test_stateful.py", "test_fp8_epilogs.py", "test_fp8.py", "test_planning.py", "test_options.py",
         "test_reset_operands_unchecked.py")
# nvmath.linalg.advanced's public names that nvblaslt's replace
SWAPPED = ("matmul", "Matmul", "MatmulEpilog", "MatmulOptions", "MatmulPlanPreferences",
           "MatmulEpilogPreferences", "MatmulQuantizationScales", "matrix_qualifiers_dtype")
REFERENCE_HELPERS = ("fp8_utils",)  # test helper modules whose matmul computes the expected result
TARGETS = ("nvmath", "nvblaslt")
ENV_TARGET, ENV_OUT, ENV_RAW = "NVMATH_SUITE_TARGET", "NVMATH_SUITE_OUT", "NVMATH_SUITE_RAW_ERRORS"


# ---------------------------------------------------------------- the swap (in the pytest child)

def as_nvmath_error(error: BaseException) -> BaseException:
    """nvblaslt's CublasLtError as nvmath-python's cuBLASLtError with the same status, else the error itself."""
    import nvblaslt
    if not isinstance(error, nvblaslt.CublasLtError):
        return error
    try:
        from nvmath.bindings.cublasLt import cuBLASLtError
        return cuBLASLtError(error.status)
    except Exception:  # noqa: BLE001 - an nvmath-python without the class, or one that cannot name the status
        return error


def raising_nvmath_errors(function: Any) -> Any:
    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except Exception as error:
            mapped = as_nvmath_error(error)
            if mapped is error:
                raise
            raise mapped from error
    return call


def replacements(raw_errors: bool) -> dict[str, Any]:
    """nvblaslt's objects under nvmath-python's names (each callable raising nvmath's cuBLAS error class)."""
    import nvblaslt
    found = {name: getattr(nvblaslt, name) for name in SWAPPED if hasattr(nvblaslt, name)}
    if raw_errors:
        return found
    matmul_class = found["Matmul"]
    methods = {name: raising_nvmath_errors(getattr(matmul_class, name)) for name in ["__init__", *dir(matmul_class)]
               if (name == "__init__" or not name.startswith("_")) and callable(getattr(matmul_class, name))
               and not isinstance(getattr(matmul_class, name), type)}
    found["Matmul"] = type("Matmul", (matmul_class,), {"__module__": matmul_class.__module__,
                                                       "__qualname__": matmul_class.__qualname__, **methods})
    found["matmul"] = raising_nvmath_errors(found["matmul"])
    return found


_ORIGINALS: dict[str, Any] = {}


def install(raw_errors: bool = False) -> dict[str, Any]:
    """Put nvblaslt's objects in place of nvmath.linalg.advanced's; returns what was replaced."""
    advanced = importlib.import_module("nvmath.linalg.advanced")
    swaps = replacements(raw_errors)
    for name, new in swaps.items():
        _ORIGINALS.setdefault(name, getattr(advanced, name, None))
        setattr(advanced, name, new)
    return swaps


def restore_reference_helpers(swaps: dict[str, Any]) -> list[str]:
    """The reference helpers compute expected results with nvmath-python itself, never with nvblaslt."""
    restored = []
    for module_name, module in list(sys.modules.items()):
        if module is None or module_name.rsplit(".", 1)[-1] not in REFERENCE_HELPERS:
            continue
        for name, new in swaps.items():
            if getattr(module, name, None) is new:
                setattr(module, name, _ORIGINALS[name])
                restored.append(f"{module_name}.{name}")
    return restored


# ---------------------------------------------------------------- the pytest plugin (in the child)

_OUTCOMES: dict[str, dict[str, str]] = {}
_SWAPS: dict[str, Any] = {}


def pytest_configure(config: Any) -> None:
    if os.environ.get(ENV_TARGET) == "nvblaslt" and not _SWAPS:
        _SWAPS.update(install(raw_errors=os.environ.get(ENV_RAW) == "1"))


def pytest_collection_modifyitems(session: Any, config: Any, items: list[Any]) -> None:
    if _SWAPS:
        restore_reference_helpers(_SWAPS)


def pytest_runtest_makereport(item: Any, call: Any) -> None:
    if call.excinfo is not None and call.excinfo.typename not in ("Skipped", "XFailed"):
        _OUTCOMES.setdefault(item.nodeid, {}).setdefault("type", call.excinfo.typename)  # the first failure's class


def pytest_runtest_logreport(report: Any) -> None:
    entry = _OUTCOMES.setdefault(report.nodeid, {})
    if report.failed:
        entry["outcome"] = "failed" if report.when == "call" else "error"
    elif report.skipped and entry.get("outcome") not in ("failed", "error"):
        entry["outcome"] = "skipped"
    elif report.when == "call" and report.passed and "outcome" not in entry:
        entry["outcome"] = "passed"


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    out = os.environ.get(ENV_OUT)
    if not out:
        return
    tests = {nodeid: entry for nodeid, entry in sorted(_OUTCOMES.items()) if "outcome" in entry}
    Path(out).write_text(json.dumps({"target": os.environ.get(ENV_TARGET), "env": versions(),
                                     "swapped": sorted(_SWAPS), "tests": tests}, indent=1) + "\n")


def versions() -> dict[str, str]:
    found = {"python": sys.version.split()[0]}
    for name in ("nvmath", "nvblaslt", "cupy", "torch", "numpy"):
        module = sys.modules.get(name)
        if module is not None:
            found[name] = str(getattr(module, "__version__", "?"))
    return found


# ---------------------------------------------------------------- the commands (in the parent)

def fetch(tag: str, directory: Path, repository: str) -> int:
    """A shallow clone of the repository at the tag, with only its top-level files and tests/ checked out."""
    if directory.exists() and any(directory.iterdir()):
        print(f"--dir: {directory} exists and is not empty; remove it, or give another --dir", file=sys.stderr)
        return 2
    commands = [["git", "clone", "--quiet", "--depth", "1", "--branch", tag, "--filter=blob:none", "--sparse",
                 repository, str(directory)],
                ["git", "-C", str(directory), "sparse-checkout", "set", "tests"]]
    for command in commands:
        result = subprocess.run(command)
        if result.returncode:
            print(f"`{' '.join(command)}` exited with {result.returncode}", file=sys.stderr)
            return result.returncode
    print(f"nvmath-python {tag}'s tests are in {directory / 'tests'} (its LICENSE beside them)")
    return 0


def run(target: str, directory: Path, files: list[str], out: Path | None, raw_errors: bool,
        pytest_args: list[str]) -> int:
    tests = directory / "tests"
    missing = [name for name in files if not (tests / MATMUL_TESTS / name).is_file()]
    if not tests.is_dir() or missing:
        what = f"no {tests}" if not tests.is_dir() else f"no {', '.join(missing)} in {tests / MATMUL_TESTS}"
        print(f"--dir / --files: {what}; run `python tools/nvmath_suite.py fetch` first", file=sys.stderr)
        return 2
    here = Path(__file__).resolve().parent
    env = dict(os.environ, **{ENV_TARGET: target, ENV_RAW: "1" if raw_errors else "0"})
    env["PYTHONPATH"] = os.pathsep.join([str(here), str(here.parent), *filter(None, [env.get("PYTHONPATH")])])
    if out is not None:
        env[ENV_OUT] = str(out.resolve())
    command = [sys.executable, "-m", "pytest", "-p", Path(__file__).stem, "-p", "no:cacheprovider",
               "--rootdir", str(tests.resolve()), *(str(MATMUL_TESTS / name) for name in files), *pytest_args]
    return subprocess.run(command, cwd=tests, env=env).returncode


def load(path: Path) -> dict[str, Any]:
    """One target's results: this tool's JSON, or the published runs' (docs/peer-results, gunzipped)."""
    data = json.loads(path.read_text())
    if "results" in data:  # {"results": {target: {...}}}
        (data,) = data["results"].values()
    return data


def compare(base_path: Path, candidate_path: Path, top: int = 40) -> int:
    base, candidate = load(base_path), load(candidate_path)
    for label, data in (("base", base), ("candidate", candidate)):
        counts = collections.Counter(entry["outcome"] for entry in data["tests"].values())
        print(f"{label} ({data.get('target')}, {base_path if label == 'base' else candidate_path}): " +
              ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "error", "skipped") if counts[k]))
    passed = [nodeid for nodeid, entry in base["tests"].items() if entry["outcome"] == "passed"]
    lost = {nodeid: candidate["tests"].get(nodeid, {"outcome": "not run"}) for nodeid in passed}
    lost = {nodeid: entry for nodeid, entry in lost.items() if entry["outcome"] != "passed"}
    print(f"of {len(passed)} tests passed on the base, the candidate passes {len(passed) - len(lost)}")
    groups = collections.Counter((entry["outcome"], entry.get("type", "")) for entry in lost.values())
    for (outcome, kind), count in groups.most_common():
        print(f"  {count:6d} {outcome} {kind}".rstrip())
    for nodeid, entry in sorted(lost.items())[:top]:
        print(f"    {entry['outcome']:8s} {entry.get('type', ''):24s} {nodeid}")
    if len(lost) > top:
        print(f"    … and {len(lost) - top} more")
    return 1 if lost else 0


def parser() -> argparse.ArgumentParser:
    commands = argparse.ArgumentParser(prog="python tools/nvmath_suite.py", description=__doc__.split("\n\n")[0])
    sub = commands.add_subparsers(dest="command", required=True)
    get = sub.add_parser("fetch", help="check out nvmath-python's tests at a tag, with git")
    get.add_argument("--tag", default=TAG, help=f"the tag (default {TAG})")
    get.add_argument("--dir", type=Path, default=DIRECTORY, help=f"where (default {DIRECTORY})")
    get.add_argument("--repository", default=REPOSITORY, help="the repository's URL or path")
    tests = sub.add_parser("run", help="run the matmul tests against one target (needs a GPU)")
    tests.add_argument("--target", choices=TARGETS, required=True,
                       help="nvmath: the tests as they are; nvblaslt: with nvmath-python's names swapped for nvblaslt's")
    tests.add_argument("--dir", type=Path, default=DIRECTORY, help=f"the checkout `fetch` made (default {DIRECTORY})")
    tests.add_argument("--files", default=",".join(FILES),
                       help="comma-separated test files of the matmul folder (default: every file nvblaslt is judged by)")
    tests.add_argument("--out", type=Path, help="write each test's outcome to this JSON file")
    tests.add_argument("--raw-errors", action="store_true",
                       help="leave nvblaslt's CublasLtError as it is (the tests' skip helper then fails on it)")
    tests.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: passed to pytest (-k, -x, -n …)")
    diff = sub.add_parser("compare", help="the tests that pass on the first file's target and not on the second's")
    diff.add_argument("base", type=Path)
    diff.add_argument("candidate", type=Path)
    diff.add_argument("--top", type=int, default=40, help="list at most this many tests (default 40)")
    return commands


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "fetch":
        return fetch(args.tag, args.dir, args.repository)
    if args.command == "run":
        files = [name.strip() for name in args.files.split(",") if name.strip()]
        extra = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
        return run(args.target, args.dir, files, args.out, args.raw_errors, extra)
    return compare(args.base, args.candidate, args.top)


if __name__ == "__main__":
    sys.exit(main())
