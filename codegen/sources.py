"""Where the NVIDIA headers come from: pinned wheels, or a path the user gives.

Headers are never committed. For a pin we look, in order, at an installed
distribution of the pinned version, the project's ignored cache, and finally
``pip download`` of the wheel (only the headers are kept). Every file is checked
against its pinned sha256.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from . import recipe

ROOT = Path(__file__).resolve().parent.parent
PINS_DIR = ROOT / "headers" / "pins"
STUBS_DIR = ROOT / "headers" / "stubs"
CACHE_DIR = ROOT / ".cache" / "codegen"


class SourceError(RuntimeError):
    pass


@dataclass
class Pin:
    name: str  # cuda12, cuda13
    module: Path  # the committed bindings module
    wheels: dict[str, str]  # distribution name -> version
    headers: dict[str, dict[str, str]]  # header -> {wheel, path, sha256}

    @classmethod
    def load(cls, path: Path) -> Pin:
        data = json.loads(path.read_text())
        return cls(path.stem, ROOT / data["module"], data["wheels"], data["headers"])


@dataclass
class HeaderSet:
    """The NVIDIA headers one module is generated from, gathered in one directory.

    A set made by ``gather`` owns its temporary directory: use it in a ``with`` block (or
    call ``close``) to remove it. A set made on a directory of your own leaves it alone.
    """

    directory: Path
    provenance: list[str]  # banner lines: where each header came from
    _owned: tempfile.TemporaryDirectory | None = field(default=None, repr=False, compare=False)

    @classmethod
    def gather(cls, files: dict[str, Path], provenance: list[str]) -> HeaderSet:
        """Copy the headers into a fresh directory, so nothing else beside them is picked up."""
        owned = tempfile.TemporaryDirectory(prefix="nvblaslt-headers-")
        for name, path in files.items():
            shutil.copyfile(path, Path(owned.name) / name)
        return cls(Path(owned.name), provenance, owned)

    def close(self) -> None:
        if self._owned is not None:
            self._owned.cleanup()

    def __enter__(self) -> HeaderSet:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def pins() -> list[Pin]:
    return [Pin.load(p) for p in sorted(PINS_DIR.glob("*.json"))]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _installed_file(dist_name: str, version: str, member: str) -> Path | None:
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != version:
        return None
    path = Path(dist.locate_file(member))
    return path if path.is_file() else None


def _download_wheel_headers(dist_name: str, version: str, target: Path) -> None:
    """pip-download one wheel and keep only its headers under ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
               "--only-binary=:all:", "--dest", tmp, f"{dist_name}=={version}"]
        print(f"codegen: downloading {dist_name}=={version} for its headers", file=sys.stderr)
        result = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if result.returncode != 0 or not wheels:
            raise SourceError(f"could not download {dist_name}=={version}:\n{result.stderr.strip()}")
        extracted = Path(tmp) / "headers"
        with zipfile.ZipFile(wheels[0]) as wheel:
            for member in wheel.namelist():
                if "/include/" in member and member.endswith(".h"):
                    wheel.extract(member, extracted)
        # renamed into place whole, so an interrupted download leaves no half-filled cache
        shutil.rmtree(target, ignore_errors=True)
        extracted.rename(target)


def wheel_headers(dist_name: str, version: str) -> Path:
    """The directory holding one wheel's headers, in the project's cache (downloaded once)."""
    cached = CACHE_DIR / f"{dist_name}-{version}"
    if not cached.is_dir():
        _download_wheel_headers(dist_name, version, cached)
    return cached


def pinned_header(pin: Pin, header: str) -> tuple[Path, str]:
    """Path of one pinned header and a provenance line; verifies the sha256."""
    spec = pin.headers[header]
    dist_name, member = spec["wheel"], spec["path"]
    version = pin.wheels[dist_name]
    path = _installed_file(dist_name, version, member)
    if path is None:
        path = wheel_headers(dist_name, version) / member
        if not path.is_file():
            raise SourceError(f"{dist_name}=={version} has no {member}")
    digest = sha256(path)
    if digest != spec["sha256"]:
        raise SourceError(
            f"{header} from {dist_name}=={version} ({path}) has sha256 {digest}, "
            f"but {pin.name}.json pins {spec['sha256']}"
        )
    return path, f"{header}: {dist_name}=={version} ({member}, sha256 {digest[:16]}…)"


def from_pin(pin: Pin) -> HeaderSet:
    files, provenance = {}, []
    for header in recipe.NVIDIA_HEADERS:
        files[header], line = pinned_header(pin, header)
        provenance.append(line)
    return HeaderSet.gather(files, provenance)


def read_version(cublas_api_h: Path) -> tuple[int, int, int, int]:
    """The cuBLAS version a cublas_api.h declares: its ``recipe.VERSION_MACROS``, in order."""
    text = cublas_api_h.read_text()
    values = []
    for macro in recipe.VERSION_MACROS:
        match = re.search(rf"#define\s+{macro}\s+(\d+)", text)
        if not match:
            raise SourceError(f"{cublas_api_h} defines no {macro}")
        values.append(int(match.group(1)))
    return tuple(values)


def from_path(header: Path, include_dirs: list[Path]) -> HeaderSet:
    """Headers from a user's path: a cublasLt.h, or an include directory holding one.

    ``library_types.h`` is looked for beside it and in ``include_dirs``; failing that it
    comes from the pinned CUDA runtime wheel of the same major version.
    """
    header = header.resolve()
    lt_header = header / "cublasLt.h" if header.is_dir() else header
    if not lt_header.is_file():
        raise SourceError(f"no cublasLt.h at {header}")
    search = [lt_header.parent, *[d.resolve() for d in include_dirs]]
    files, provenance = {}, []
    for name in recipe.NVIDIA_HEADERS:
        found = next((d / name for d in search if (d / name).is_file()), None)
        if found is not None:
            files[name] = found
            provenance.append(f"{name}: {found} (sha256 {sha256(found)[:16]}…)")
    if "cublas_api.h" not in files:
        raise SourceError(f"no cublas_api.h beside {lt_header} or in --include directories")
    if "library_types.h" not in files:
        major = read_version(files["cublas_api.h"])[0]
        pin = next((p for p in pins() if p.name == f"cuda{major}"), None)
        if pin is None:
            raise SourceError(
                f"no library_types.h found for cuBLAS {major}: pass its directory with --include "
                f"(it ships in the CUDA runtime wheel or toolkit)"
            )
        files["library_types.h"], line = pinned_header(pin, "library_types.h")
        provenance.append(line)
    return HeaderSet.gather(files, provenance)
