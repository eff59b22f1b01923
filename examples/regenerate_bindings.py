"""Regenerating bindings for a new CUDA release, step by step, on the headers of an installed wheel.

1. Find the release's headers: a CUDA toolkit include directory, or an NVIDIA wheel's
   (nvidia/cu13/include holds cublasLt.h, cublas_api.h and, from the runtime wheel, library_types.h).
2. Generate: python -m codegen --header DIR --out nvblaslt/_generated/cublaslt_NN.py
3. Pin it for `python -m codegen` and `--check`: headers/pins/cudaNN.json with each header's
   wheel, path and sha256 (this script prints them).
4. Run the tests; `python -m codegen.survey` reports what changed against earlier releases.

This script does steps 1–3 into a temporary directory and, when the installed wheel is the
release the committed module was generated from, compares the two, so it changes nothing in
the checkout. Run it from a source checkout:

    python examples/regenerate_bindings.py     (needs pycparser, jinja2 and a cuBLAS wheel; no GPU)
"""

import hashlib
import importlib.metadata
import json
import subprocess
import sys
import tempfile
from pathlib import Path

WHEELS = {"nvidia-cublas": ("nvidia/cu13/include", "cublaslt_13"),
          "nvidia-cublas-cu12": ("nvidia/cublas/include", "cublaslt_12")}
ROOT = Path(__file__).resolve().parent.parent


def pinned_version(wheel: str) -> str | None:
    """The release of ``wheel`` the committed bindings were generated from (headers/pins)."""
    for pin in sorted((ROOT / "headers" / "pins").glob("*.json")):
        wheels = json.loads(pin.read_text())["wheels"]
        if wheel in wheels:
            return wheels[wheel]
    return None


for wheel, (include, module) in WHEELS.items():
    try:
        distribution = importlib.metadata.distribution(wheel)
    except importlib.metadata.PackageNotFoundError:
        continue
    header_dir = Path(distribution.locate_file(include))
    print(f"1. headers of {wheel}=={distribution.version}: {header_dir}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{module}.py"
        command = [sys.executable, "-m", "codegen", "--header", str(header_dir), "--out", str(out)]
        print("2.", " ".join(command[1:]))
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if result.returncode != 0:
            sys.exit(result.stderr)
        print("  ", result.stdout.strip())
        print("3. pins for headers/pins (sha256 of each header):")
        for name in ("cublasLt.h", "cublas_api.h", "library_types.h"):
            path = header_dir / name
            if path.exists():
                print(f"     {name}: {hashlib.sha256(path.read_bytes()).hexdigest()}")
        committed = ROOT / "nvblaslt" / "_generated" / f"{module}.py"
        pinned = pinned_version(wheel)
        if distribution.version != pinned:
            print(f"4. {wheel}=={distribution.version} is not the release {committed.name} was generated from "
                  f"({pinned}): `python -m codegen --check` compares it with the pinned headers instead")
        else:
            same = out.read_text().splitlines()[6:] == committed.read_text().splitlines()[6:]
            print(f"4. body identical to the committed {committed.name} (banners name their sources): {same}")
    break
else:
    sys.exit("install nvidia-cublas or nvidia-cublas-cu12 to have headers to generate from")
