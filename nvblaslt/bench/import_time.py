"""The ``import`` section: ``import nvblaslt`` in fresh interpreters."""

from __future__ import annotations

import statistics
import subprocess
import sys


def section(args, torch, results: dict) -> None:
    code = "import time; t = time.perf_counter(); import nvblaslt; print(time.perf_counter() - t)"
    runs = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 check=True).stdout) for _ in range(3 if args.quick else 5)]
    results["import"] = {"seconds": statistics.median(runs), "runs": runs}
