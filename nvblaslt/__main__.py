"""``nvblaslt info`` (library, bindings, driver, GPUs) and ``nvblaslt bench``; also ``python -m nvblaslt``."""

from __future__ import annotations

import argparse
import os
import sys


def info() -> int:
    import cuda.bindings

    from . import _cuda
    from ._attributes import unsupported
    from ._errors import NvblasltError
    from ._loader import available_modules, library

    try:
        lib = library()
    except NvblasltError as exc:
        print(f"libcublasLt: not loaded: {exc}")
        return 1
    bindings = ".".join(map(str, lib.bindings_version))
    print(f"libcublasLt:   {lib.path}")
    print(f"  found via:   {lib.found_via}")
    print(f"  version:     {'.'.join(map(str, lib.version_tuple))} (cublasLtGetVersion {lib.version})")
    print(f"bindings:      {lib.api.__name__} (from cuBLAS {bindings} headers)")
    if lib.version_tuple > lib.bindings_version[:3]:
        print(f"  note:        the library is newer than these bindings: what it added since {bindings} is not bound")
    functions = len(lib.api.FUNCTIONS)
    print(f"  functions:   {functions - len(lib.missing)}/{functions} exported by this library")
    if lib.missing:
        print(f"    not exported: {', '.join(lib.missing)}")
    attributes = sum(len(types) for _getter, _setter, types in lib.api.ATTRIBUTES.values())
    unknown = unsupported(lib)
    print(f"  attributes:  {attributes - sum(map(len, unknown.values()))}/{attributes} known to this library")
    for enum_name, members in unknown.items():
        print(f"    unknown {enum_name}: {', '.join(members)}")
    print(f"  committed:   cuBLAS majors {sorted(available_modules())}")
    print(f"cuda-bindings: {cuda.bindings.__version__}")
    count = _cuda.device_count()
    if count == 0:
        print("driver/GPUs:   none found (descriptors work; creating a handle needs a GPU)")
        return 0
    version = _cuda.driver_version()
    print(f"driver:        CUDA {version // 1000}.{version % 1000 // 10}")
    for device in range(count):
        props = _cuda.device_properties(device)
        major, minor = _cuda.compute_capability(device)
        print(f"GPU {device}:         {props.name.decode()} (sm_{major}{minor}, "
              f"{props.totalGlobalMem / 2**30:.0f} GiB, {props.multiProcessorCount} SMs)")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # the benchmark parses its own options
        from .bench.cli import main as bench_main

        return bench_main(argv[1:])
    from ._version import __version__

    parser = argparse.ArgumentParser(prog="nvblaslt", description="also runs as `python -m nvblaslt`")
    parser.add_argument("--version", action="version", version=f"nvblaslt {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="library path and version, bindings module and what the library lacks, "
                                     "driver and GPUs")
    commands.add_parser("bench", help="benchmarks on the GPU: nvblaslt bench --help")
    parser.parse_args(argv)
    try:
        code = info()
        sys.stdout.flush()  # a reader that left shows here, not in the interpreter's exit
        return code
    except BrokenPipeError:  # `nvblaslt info | head`: stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return 0


if __name__ == "__main__":
    sys.exit(main())
