"""The ``import`` section: cold start in fresh interpreters — ``import nvblaslt`` beside ``import cupy``,
and the time to a first result (import, first GEMM on CuPy arrays, synchronize) of nvblaslt, CuPy and
nvmath-python. Each row runs in its own fresh process, the rows interleaved round by round. Without a
GPU only the imports are timed (this section alone then runs: ``WITHOUT_GPU``)."""

from __future__ import annotations

import compileall
import importlib.util
import platform
import random
import statistics
import subprocess
import sys
import time

_CLOCK = "import time; t = time.perf_counter()\n"
_DONE = "\nprint(time.perf_counter() - t)"
_OPERANDS = ("import cupy\na = cupy.random.standard_normal((256, 128), dtype=cupy.float32)\n"
             "b = cupy.random.standard_normal((128, 64), dtype=cupy.float32)\n")
_SYNC = "\ncupy.cuda.Device().synchronize()"
ROWS = {
    "import nvblaslt": "import nvblaslt",
    "import cupy": "import cupy",
    "first result, nvblaslt.matmul": _OPERANDS + "import nvblaslt\nr = nvblaslt.matmul(a, b)" + _SYNC,
    "first result, cupy a @ b": _OPERANDS + "r = a @ b" + _SYNC,
    "first result, nvmath matmul": _OPERANDS + "import nvmath\nr = nvmath.linalg.advanced.matmul(a, b)" + _SYNC,
}


WITHOUT_GPU = ("import",)  # the sections that run without a GPU
_IMPORT_ROWS = ("import nvblaslt", "import cupy")  # the rows that need none


def machine_without_gpu(torch) -> dict:
    """``report.machine``'s fields where there is no GPU to describe."""
    import nvblaslt

    try:
        cublaslt = ".".join(map(str, nvblaslt.library().version_tuple))
    except nvblaslt.LibraryNotFoundError:
        cublaslt = "not found"
    return {"gpu": "no GPU", "driver_cuda": "-", "cublaslt": cublaslt,
            "torch": torch.__version__ if torch is not None else "-", "nvmath": None,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M")}


def _fresh(name: str, code: str) -> float | None:
    """Seconds to run ``code`` in a fresh interpreter; None where a peer package is missing there. A
    failing nvblaslt row raises: the section must not report a cold start that did not happen."""
    done = subprocess.run([sys.executable, "-c", _CLOCK + code + _DONE], capture_output=True, text=True)
    if done.returncode == 0 and done.stdout.strip():
        return float(done.stdout.split()[-1])
    if "nvblaslt" in name:
        raise RuntimeError(f"{name}: the fresh interpreter failed (exit {done.returncode}): "
                           f"{done.stderr.strip()[-2000:]}")
    return None


def _bytecode_compiled(packages=("nvblaslt", "nvmath")) -> dict[str, bool]:
    """Compile each package's modules to bytecode first, as ``pip install`` does, so that no row times
    Python compiling source: a checkout run where bytecode is not written (``PYTHONDONTWRITEBYTECODE``,
    as on the GPU machines) would otherwise pay about 0.14 s per fresh process for nvblaslt alone,
    which no installed package pays. {package: compiled}; False where its folder is not writable; a
    package not installed is left out."""
    compiled = {}
    for name in packages:
        spec = importlib.util.find_spec(name)
        folders = list(spec.submodule_search_locations or []) if spec is not None else []
        if folders:  # a package not installed here has no row to time
            compiled[name] = all(compileall.compile_dir(folder, quiet=2) for folder in folders)
    return compiled


def section(args, torch, results: dict) -> None:
    bytecode = _bytecode_compiled()
    rounds = args.rounds or (3 if args.quick else 7)
    rows = ROWS if getattr(args, "gpu", True) else {name: ROWS[name] for name in _IMPORT_ROWS}
    runs: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(rounds):
        order = list(rows)
        random.shuffle(order)
        for name in order:
            seconds = _fresh(name, rows[name])
            if seconds is not None:  # a package missing here (CuPy, nvmath-python): the row is left out
                runs[name].append(seconds)
    results["import"] = {name: {"seconds": statistics.median(times), "runs": times}
                         for name, times in runs.items() if times}
    results["import_bytecode"] = bytecode
