"""Where the NVIDIA headers come from: pinned wheels, or a path the user gives.

Headers are never committed. For a pin we look, in order, at an installed
distribution of the pinned version, the per-user cache (``cache_root``), and finally the
package index, where only the headers are read out of the wheel (``fetch``) and cached.
Every file is checked against its pinned sha256.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import tempfile
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from . import fetch, recipe

ROOT = Path(__file__).resolve().parent.parent
PINS_DIR = ROOT / "headers" / "pins"
STUBS_DIR = ROOT / "headers" / "stubs"
ENV_CACHE = "NVBLASLT_CODEGEN_CACHE"
MARKER = ".nvblaslt-codegen.json"  # a cache entry's manifest, written last
STAGING_PREFIX = ".staging-"


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
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _installed_file(dist_name: str, version: str, member: str) -> Path | None:
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != version:
        return None
    path = Path(dist.locate_file(member))
    return path if path.is_file() else None


def is_codegen_header(member: str) -> bool:
    """Whether a wheel member is one of the headers codegen reads (from an include directory)."""
    path = PurePosixPath(member)
    return path.name in recipe.NVIDIA_HEADERS and "include" in path.parts[:-1]


def cache_root() -> Path:
    """Where fetched headers are kept: ``$NVBLASLT_CODEGEN_CACHE``, else
    ``$XDG_CACHE_HOME/nvblaslt/codegen``, else ``~/.cache/nvblaslt/codegen``."""
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "nvblaslt" / "codegen"


_no_cache_dir: tempfile.TemporaryDirectory | None = None
_said: set[str] = set()  # what this process has already said where it took from


def use_cache(enabled: bool) -> None:
    """``False``: neither read nor write the cache; fetch into a temporary directory kept
    until the process ends (so one run fetches each wheel once)."""
    global _no_cache_dir
    if enabled:
        if _no_cache_dir is not None:
            _no_cache_dir.cleanup()
        _no_cache_dir = None
    elif _no_cache_dir is None:
        _no_cache_dir = tempfile.TemporaryDirectory(prefix="nvblaslt-codegen-nocache-")


def _store() -> Path:
    return Path(_no_cache_dir.name) if _no_cache_dir is not None else cache_root()


def _entry_files(entry: Path) -> dict[str, dict] | None:
    """The members an entry's marker lists, if the entry is complete and its files unaltered."""
    try:
        marker = json.loads((entry / MARKER).read_text())
        members = marker["members"]
        for member, spec in members.items():
            if sha256(entry / member) != spec["sha256"]:
                return None
        return members
    except (OSError, ValueError, KeyError, TypeError):
        return None


def cache_entries(root: Path | None = None) -> list[Path]:
    """The cache's entries (directories holding codegen's marker) and its left-over staging
    directories; nothing else under the cache directory is codegen's."""
    root = cache_root() if root is None else root
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir()
                  if p.is_dir() and ((p / MARKER).is_file() or p.name.startswith(STAGING_PREFIX)))


def clear_cache(root: Path | None = None) -> tuple[int, int]:
    """Delete codegen's cache entries; (entries deleted, bytes freed)."""
    count = size = 0
    for entry in cache_entries(root):
        size += sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
        shutil.rmtree(entry)
        count += 1
    return count, size


def _fetch_into(staging: Path, dist_name: str, version: str, needed: list[str]) -> dict:
    """Fetch one wheel's codegen headers under ``staging``; the marker's contents."""
    why = f"for {len(needed)} header{'s' * (len(needed) != 1)} ({', '.join(needed)})" if needed else \
        "for its headers"
    staging.mkdir()
    workdir = staging.parent / (staging.name + ".wheel")
    workdir.mkdir()
    started = time.monotonic()
    try:
        try:
            wheel = fetch.find_wheel(dist_name, version)
        except fetch.IndexUnavailable as exc:
            fetch.log(f"{dist_name}=={version}: {exc}; asking pip to download the whole wheel {why}")
            path = fetch.pip_download(dist_name, version, workdir)
            members, how = fetch.extract_local(path, is_codegen_header, staging), "pip download"
            wheel = fetch.WheelFile(path.name, "", sha256(path), path.stat().st_size)
        else:
            size_text = fetch.human(wheel.size) if wheel.size else "size not given by the index"
            fetch.log(f"{dist_name}=={version}: fetching {wheel.filename} ({size_text}) {why}, "
                      f"from {urllib.parse.urlsplit(wheel.url).netloc}")
            members, how = fetch.fetch_members(wheel, is_codegen_header, staging, workdir)
    except fetch.FetchError as exc:
        raise SourceError(f"could not fetch the headers of {dist_name}=={version}: {exc}") from exc
    finally:
        fetch.STATS.seconds += time.monotonic() - started
        shutil.rmtree(workdir, ignore_errors=True)
    return {"format": 1, "wheel": {"dist": dist_name, "version": version, "filename": wheel.filename,
                                   "url": wheel.url or None, "size": wheel.size, "sha256": wheel.sha256},
            "fetched_by": how, "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "members": {m: {"sha256": sha256(staging / m), "size": (staging / m).stat().st_size}
                        for m in members}}


def wheel_headers(dist_name: str, version: str, needed: list[str] | None = None) -> Path:
    """The directory holding one wheel's codegen headers at their paths in the wheel: a cache
    entry, fetched (only those members where the server serves byte ranges) when missing.

    An entry is made in a staging directory and renamed into place whole, with a marker that
    lists each file's sha256: an interrupted fetch leaves no entry, and an entry whose files
    changed is fetched again. ``needed`` only words the announcement.
    """
    root = _store()
    key = f"{fetch.normalize(dist_name)}-{version}"
    entry = root / key
    members = _entry_files(entry)
    if members is None:
        if entry.exists():
            fetch.log(f"{dist_name}=={version}: the cache entry {entry} is incomplete or altered; fetching again")
            shutil.rmtree(entry)
        try:
            root.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{key}-", dir=root))
        except OSError as exc:
            raise SourceError(f"cannot write the header cache at {root} ({exc}): set {ENV_CACHE} "
                              f"to another directory, or pass --no-cache") from exc
        try:
            marker = _fetch_into(staging / "entry", dist_name, version, needed or [])
            (staging / "entry" / MARKER).write_text(json.dumps(marker, indent=1) + "\n")
            try:
                (staging / "entry").rename(entry)
            except OSError:  # another process put it there first
                if _entry_files(entry) is None:
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        members = _entry_files(entry) or {}
        fetch.log(f"{dist_name}=={version}: {len(members)} header{'s' * (len(members) != 1)} "
                  + ("kept until this run ends (--no-cache)" if _no_cache_dir is not None else f"cached in {entry}"))
        _said.add(key)
    elif key not in _said:
        _said.add(key)
        names = ", ".join(PurePosixPath(m).name for m in members)
        fetch.log(f"{dist_name}=={version}: {names} from the cache ({entry}); nothing downloaded")
    return entry


def fetch_report() -> str:
    """One line on what this process downloaded ("" if it looked for no header)."""
    stats = fetch.STATS
    if not _said:
        return ""
    if not stats.requests and not stats.bytes:
        return "downloaded nothing"
    of = f", out of wheels of {fetch.human(stats.wheel_bytes)}" if stats.wheel_bytes else ""
    return (f"downloaded {fetch.human(stats.bytes)} in {stats.requests} HTTP requests, "
            f"{stats.seconds:.1f} s{of}")


def pinned_header(pin: Pin, header: str) -> tuple[Path, str]:
    """Path of one pinned header and a provenance line; verifies the sha256."""
    spec = pin.headers[header]
    dist_name, member = spec["wheel"], spec["path"]
    version = pin.wheels[dist_name]
    path = _installed_file(dist_name, version, member)
    if path is None:
        needed = [h for h, s in pin.headers.items() if s["wheel"] == dist_name]
        path = wheel_headers(dist_name, version, needed) / member
        if not path.is_file():
            raise SourceError(f"{dist_name}=={version} has no {member}")
    elif f"installed:{dist_name}" not in _said:
        _said.add(f"installed:{dist_name}")
        fetch.log(f"{dist_name}=={version}: headers from the installed distribution; nothing downloaded")
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
