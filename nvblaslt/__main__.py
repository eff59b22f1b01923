"""``python -m nvblaslt info`` (library, bindings, driver, GPUs) and ``bench``."""

from __future__ import annotations

import argparse
import sys


def info() -> int:
    import cuda.bindings

    from . import _cuda
    from ._errors import NvblasltError
    from ._loader import available_modules, library

    try:
        lib = library()
    except NvblasltError as exc:
        print(f"libcublasLt: not loaded: {exc}")
        return 1
    print(f"libcublasLt:   {lib.path}")
    print(f"  found via:   {lib.found_via}")
    print(f"  version:     {'.'.join(map(str, lib.version_tuple))} (cublasLtGetVersion {lib.version})")
    print(f"bindings:      {lib.api.__name__} (from cuBLAS {'.'.join(map(str, lib.api.CUBLAS_VERSION))} "
          f"headers; {len(lib.api.FUNCTIONS) - len(lib.missing)}/{len(lib.api.FUNCTIONS)} functions bound)")
    if lib.missing:
        print(f"  not exported by this library: {', '.join(lib.missing)}")
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
        from ._bench import main as bench_main

        return bench_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m nvblaslt")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="library path and version, bindings module, driver and GPUs")
    commands.add_parser("bench", help="benchmarks on the GPU: python -m nvblaslt bench --help")
    parser.parse_args(argv)
    return info()


if __name__ == "__main__":
    sys.exit(main())
