"""Probe (GPU): where a fresh process's first result goes, and the floor any cuBLASLt caller pays (issue 33 target 7).

Each case runs in its own fresh interpreter, the cases interleaved round by round, after CuPy operands
(256×128 @ 128×64 fp32) exist and the GPU is synchronized, so the clock starts where a user's first call
starts. Cases:

- ``cupy a @ b``: CuPy's own first GEMM (cuBLAS), the target's baseline;
- ``nvblaslt.matmul``: ``import nvblaslt`` and the first ``matmul`` (the heuristics' list of 8);
- ``nvblaslt pieces``: the same, timed in pieces: import, ``Matmul(a, b)`` (handle, stream, layouts),
  ``plan()`` (the first heuristics query), ``execute()`` and synchronize;
- ``bare ctypes floor``: no nvblaslt: load libcublasLt with ctypes, ``cublasLtCreate``, the descriptors,
  one heuristics query for one algorithm, ``cublasLtMatmul`` and synchronize, each piece timed. This is
  what any caller of cuBLASLt pays before its first result, Python or not, with CuPy already imported;
- ``bare, algorithm given`` / ``bare, algorithm checked``: the same with the algorithm's 64 bytes known
  beforehand (as a tuning database holds them), launched as they are or after ``cublasLtMatmulAlgoCheck``:
  whether the first query's time is the heuristics' own or the library's first-use setup;
- ``nvblaslt.matmul(algorithm=…)``: nvblaslt's first call with a known algorithm (no heuristics query).

nvblaslt's bytecode is compiled first, as ``pip install`` does. Medians of the rounds, in ms.

    python -m tools.probe_cold_start [--rounds 5]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys

import nvblaslt
from nvblaslt.bench.import_time import _bytecode_compiled

_OPERANDS = ("import time\nimport cupy\n"
             "a = cupy.random.standard_normal((256, 128), dtype=cupy.float32)\n"
             "b = cupy.random.standard_normal((128, 64), dtype=cupy.float32)\n"
             "cupy.cuda.Device().synchronize()\n"
             "pieces = []\nt0 = time.perf_counter()\n"
             "def piece(name):\n    pieces.append((name, time.perf_counter()))\n")
_SYNC = "\ncupy.cuda.Device().synchronize()\npiece('sync')\n"
_REPORT = ("\nprevious = t0\nfor name, at in pieces:\n    print('PIECE', name, (at - previous) * 1e3)\n"
           "    previous = at\nprint('TOTAL', (pieces[-1][1] - t0) * 1e3)\n")


def _bare_floor(path: str, api) -> str:
    """The first GEMM through raw ctypes: D (n×m, column-major) = B (n×k) · A (k×m), C order's a @ b."""
    return f"""
import ctypes
lt = ctypes.CDLL({path!r}); piece('load libcublasLt')
v = ctypes.c_void_p
def ok(status, what):
    assert status == 0, (what, status)
handle = v(); ok(lt.cublasLtCreate(ctypes.byref(handle)), 'create'); piece('cublasLtCreate')
desc = v(); ok(lt.cublasLtMatmulDescCreate(ctypes.byref(desc), {api.CUBLAS_COMPUTE_32F}, {api.CUDA_R_32F}), 'desc')
m, k, n = 256, 128, 64
def layout(rows, cols):
    made = v(); ok(lt.cublasLtMatrixLayoutCreate(ctypes.byref(made), {api.CUDA_R_32F}, ctypes.c_uint64(rows),
                                                 ctypes.c_uint64(cols), ctypes.c_int64(rows)), 'layout')
    return made
la, lb, ld = layout(n, k), layout(k, m), layout(n, m)
preference = v(); ok(lt.cublasLtMatmulPreferenceCreate(ctypes.byref(preference)), 'preference')
piece('descriptors')
result = (ctypes.c_byte * {ctypes_size(api)})()
if ALGORITHM is None:
    returned = ctypes.c_int()
    ok(lt.cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, ld, ld, preference, 1, result, ctypes.byref(returned)),
       'heuristic')
    assert returned.value == 1
    print('ALGORITHM', bytes(result)[:64].hex())
    piece('first heuristics query')
else:
    ctypes.memmove(result, bytes.fromhex(ALGORITHM), 64)
    if CHECK:
        checked = (ctypes.c_byte * {ctypes_size(api)})()
        ok(lt.cublasLtMatmulAlgoCheck(handle, desc, la, lb, ld, ld, result, checked), 'check')
        piece('cublasLtMatmulAlgoCheck')
d = cupy.empty((m, n), dtype=cupy.float32)
alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
ok(lt.cublasLtMatmul(handle, desc, ctypes.byref(alpha), v(b.data.ptr), la, v(a.data.ptr), lb, ctypes.byref(beta),
                     v(d.data.ptr), ld, v(d.data.ptr), ld, result, None, ctypes.c_size_t(0), None), 'matmul')
piece('cublasLtMatmul')
"""


def ctypes_size(api) -> int:
    return ctypes.sizeof(api.cublasLtMatmulHeuristicResult_t)


def _run(body: str) -> str:
    done = subprocess.run([sys.executable, "-c", _OPERANDS + body + _SYNC + _REPORT], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"exit {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def _printed(stdout: str, word: str) -> str:
    return next(line.split()[1] for line in stdout.splitlines() if line.startswith(word + " "))


def cases() -> dict[str, str]:
    lib = nvblaslt.library()
    bare = _bare_floor(lib.path, lib.api)
    # the algorithms each way would pick, found once in a process of their own
    bare_algorithm = _printed(_run("ALGORITHM = None\n" + bare), "ALGORITHM")
    ours = _printed(_run("import nvblaslt\nplan = nvblaslt.Matmul(a, b)\nplan.plan()\n"
                         "print('ALGORITHM', plan.algorithm.as_bytes().hex())\npiece('x')"), "ALGORITHM")
    return {
        "cupy a @ b": "r = a @ b\npiece('a @ b')",
        "nvblaslt.matmul": "import nvblaslt\npiece('import nvblaslt')\nr = nvblaslt.matmul(a, b)\npiece('matmul')",
        "nvblaslt pieces": ("import nvblaslt\npiece('import nvblaslt')\nplan = nvblaslt.Matmul(a, b)\n"
                            "piece('Matmul(a, b)')\nplan.plan()\npiece('plan(): first heuristics query')\n"
                            "r = plan.execute()\npiece('execute()')"),
        "nvblaslt, algorithm given": ("import nvblaslt\npiece('import nvblaslt')\n"
                                      f"r = nvblaslt.matmul(a, b, algorithm=bytes.fromhex({ours!r}))\n"
                                      "piece('matmul(algorithm=…)')"),
        "bare ctypes floor": "ALGORITHM = None\n" + bare,
        "bare, algorithm given": f"ALGORITHM, CHECK = {bare_algorithm!r}, False\n" + bare,
        "bare, algorithm checked": f"ALGORITHM, CHECK = {bare_algorithm!r}, True\n" + bare,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    compiled = _bytecode_compiled(("nvblaslt",))
    lib = nvblaslt.library()
    print(f"cuBLASLt {'.'.join(map(str, lib.version_tuple))} ({lib.path}); nvblaslt bytecode compiled: {compiled}")
    programs = cases()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in programs}
    for _ in range(args.rounds):
        for name, body in programs.items():
            timed: dict[str, float] = {}
            for line in _run(body).splitlines():
                word, *rest = line.split() or ['']
                if word == "PIECE":
                    timed[" ".join(rest[:-1])] = float(rest[-1])
                elif word == "TOTAL":
                    timed["TOTAL"] = float(rest[0])
            runs[name].append(timed)
    print(f"ms from the first call to its result, medians of {args.rounds} fresh processes (pieces in order):")
    for name, timings in runs.items():
        total = statistics.median(t["TOTAL"] for t in timings)
        pieces = ", ".join(f"{piece} {statistics.median(t[piece] for t in timings):.1f}"
                           for piece in timings[0] if piece != "TOTAL")
        print(f"  {name:20s} {total:7.1f}   {pieces}")


if __name__ == "__main__":
    main()
