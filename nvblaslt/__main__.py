"""``nvblaslt info`` (library, bindings, driver, GPUs), ``nvblaslt bench`` and ``nvblaslt tune``; also
``python -m nvblaslt``."""

from __future__ import annotations

import argparse
import os
import sys


def info() -> int:
    """Print the library, the bindings, the driver and GPUs, and the features the loaded library has;
    1 where no library could be loaded (the driver lines still print)."""
    from ._errors import NvblasltError
    from ._loader import library

    try:
        lib = library()
    except NvblasltError as exc:
        print(f"libcublasLt:   not loaded: {exc}")
        lib = None
    unknown = _print_library(lib) if lib is not None else {}
    capabilities = _print_driver(lib is not None)
    if lib is not None:
        _print_features(lib, unknown, capabilities)
    return 0 if lib is not None else 1


def _print_library(lib) -> dict[str, list[str]]:
    """The library and its bindings; returns the attributes the library does not know, by enum."""
    from ._attributes import unsupported
    from ._loader import available_modules

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
    return unknown


def _print_driver(has_library: bool) -> list[tuple[int, int]]:
    """cuda-bindings, the driver and the GPUs; returns each GPU's compute capability."""
    try:
        import cuda.bindings
        from cuda.bindings import runtime as cudart
    except ImportError as exc:
        print(f"cuda-bindings: not installed ({exc}): pip install 'nvblaslt[cu13]' (or [cu12])")
        return []
    from . import _cuda
    from ._errors import CudaError

    print(f"cuda-bindings: {cuda.bindings.__version__}")
    error, driver = cudart.cudaDriverGetVersion()
    if error != _cuda.SUCCESS or not driver:
        print("driver:        none installed (no NVIDIA driver library in this process)")
    else:
        print(f"driver:        CUDA {driver // 1000}.{driver % 1000 // 10}")
    error, count = cudart.cudaGetDeviceCount()
    if error != _cuda.SUCCESS or not count:
        reason = ""
        try:
            _cuda.check((error, count), "cudaGetDeviceCount")
        except CudaError as exc:  # CUDA's words and what to check
            reason = f": {exc}"
        usable = " (descriptors work; creating a handle needs a GPU)" if has_library else ""
        print(f"GPUs:          none usable{reason}{usable}")
        return []
    capabilities = []
    for device in range(count):
        props = _cuda.device_properties(device)
        major, minor = _cuda.compute_capability(device)
        capabilities.append((major, minor))
        print(f"GPU {device}:         {props.name.decode()} (sm_{major}{minor}, "
              f"{props.totalGlobalMem / 2**30:.0f} GiB, {props.multiProcessorCount} SMs)")
    return capabilities


FP8_CAPABILITY = (8, 9)  # cuBLASLt's fp8 kernels: Ada (sm_89), Hopper and newer


def _print_features(lib, unknown: dict[str, list[str]], capabilities: list[tuple[int, int]]) -> None:
    """What the loaded library offers nvblaslt's callers, and for each missing feature what to do."""
    from ._errors import NvblasltUnsupportedError
    from ._grouped_version import require_grouped

    api = lib.api
    version = ".".join(map(str, lib.version_tuple))
    desc_unknown = set(unknown.get("cublasLtMatmulDescAttributes_t", []))
    print("features:")
    epilogs = [name for name in api.cublasLtEpilogue_t.__members__ if name != "DEFAULT"]
    print(f"  epilogs:     {', '.join(epilogs)}")
    if hasattr(api, "CUDA_R_8F_E4M3") and "A_SCALE_POINTER" not in desc_unknown:
        short = [f"GPU {i}" for i, capability in enumerate(capabilities) if capability < FP8_CAPABILITY]
        gpus = f"; not on {', '.join(short)} (fp8 needs sm_89 or newer)" if short else ""
        print(f"  fp8:         yes (E4M3, E5M2; per-tensor scales, result amax){gpus}")
    else:
        print(f"  fp8:         no: cuBLASLt {version} has no fp8 scales; install a newer nvidia-cublas")
    try:
        require_grouped(lib)
        print("  grouped:     yes (grouped_matmul, GroupedMatmul, nvblaslt.torch.grouped_mm; experimental)")
    except NvblasltUnsupportedError as missing:  # the refusal grouped_matmul would raise: what to do
        print(f"  grouped:     no: {str(missing).split(' (cuBLASLt answers')[0]}")
    if "A_SCALE_MODE" in desc_unknown or not hasattr(api, "cublasLtMatmulMatrixScale_t"):
        print(f"  block scale: no: cuBLASLt {version} has no scale modes (cuBLAS 12.8 or newer has them)")
    else:
        modes = [m for m in api.cublasLtMatmulMatrixScale_t.__members__ if m.startswith(("VEC", "BLK"))]
        print(f"  block scale: not in matmul()/Matmul yet (options.block_scaling is refused); the library's "
              f"A_SCALE_MODE takes {', '.join(modes)} through MatmulDesc / nvblaslt.lt")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # the benchmark parses its own options
        from .bench.cli import main as bench_main

        return bench_main(argv[1:])
    if argv[:1] == ["tune"]:  # so does tuning
        from ._tune import main as tune_main

        return tune_main(argv[1:])
    from ._version import __version__

    parser = argparse.ArgumentParser(prog="nvblaslt", description="also runs as `python -m nvblaslt`")
    parser.add_argument("--version", action="version", version=f"nvblaslt {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="library path and version, bindings module and what the library lacks, "
                                     "driver and GPUs")
    commands.add_parser("bench", help="benchmarks on the GPU: nvblaslt bench --help")
    commands.add_parser("tune", help="tuning databases (tune on the GPU, merge, diff, show): nvblaslt tune --help")
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
