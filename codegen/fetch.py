"""A few files out of a wheel on a package index: found, announced, fetched with progress.

A wheel is a zip file, and a zip file's directory sits at its end. Where the server serves
byte ranges (PyPI's does), we read the directory, then only the members we want: two
headers, about 40 KB compressed, of a 581 MB cuBLAS wheel. A server that ignores ranges gets a whole
download instead, checked against the size and sha256 the index gives. Where the index
cannot be read at all (a mirror configured only in pip.conf, say), ``pip download`` fetches
the whole wheel. Standard library only: urllib, zipfile, hashlib.
"""

from __future__ import annotations

import hashlib
import html
import http.client
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

DEFAULT_INDEX = "https://pypi.org/simple/"
ENV_INDEX = "NVBLASLT_CODEGEN_INDEX_URL"
USER_AGENT = "nvblaslt-codegen (Python urllib)"
TIMEOUT = 60.0  # seconds without a byte before a request fails
TAIL = 64 * 1024 + 22  # the end-of-directory record with the longest comment a zip may carry
MIN_FETCH = 64 * 1024  # a range request reads at least this much: zipfile reads in small pieces
JOIN_GAP = 64 * 1024  # members closer than this are read in one request
CHUNK = 1 << 20


class FetchError(RuntimeError):
    pass


class IndexUnavailable(FetchError):
    """The index's page for a project could not be read (network, HTTP error, no such project)."""


class RangesUnsupported(FetchError):
    """The server answered a range request with something other than that range."""


def log(message: str) -> None:
    print(f"codegen: {message}", file=sys.stderr, flush=True)


def human(n: float) -> str:
    """Bytes as pip and PyPI print them (decimal units): 581.2 MB."""
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError  # unreachable


def normalize(name: str) -> str:
    """A project name as the simple index spells it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def index_url() -> str:
    return os.environ.get(ENV_INDEX) or os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX


@dataclass
class Stats:
    """What this process has transferred."""

    bytes: int = 0
    requests: int = 0
    seconds: float = 0.0  # spent fetching (counted by the caller)
    wheel_bytes: int = 0  # the size of the wheels the bytes came out of


STATS = Stats()


class Progress:
    """Bytes done of a total, on stderr: rewritten in place on a terminal (at most 5 times a
    second), else one line every ``interval`` seconds at most (default 5), none for a transfer
    that ends sooner."""

    def __init__(self, total: int | None, stream: IO[str] | None = None, interval: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval if interval is not None else (0.2 if self.tty else 5.0)
        self.clock = clock
        self.start = self.last = clock()
        self.done = 0
        self.shown = False

    def line(self) -> str:
        elapsed = max(self.clock() - self.start, 1e-9)
        rate = f"{human(self.done / elapsed)}/s"
        if self.total:
            return (f"codegen:   {human(self.done)} of {human(self.total)} "
                    f"({100 * self.done / self.total:.0f}%), {rate}")
        return f"codegen:   {human(self.done)}, {rate}"

    def update(self, n: int) -> None:
        self.done += n
        now = self.clock()
        if now - self.last >= self.interval:
            self.last = now
            self.shown = True
            if self.tty:
                self.stream.write("\r" + self.line().ljust(72))
            else:
                self.stream.write(self.line() + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.tty and self.shown:
            self.stream.write("\r" + self.line().ljust(72) + "\n")
            self.stream.flush()


def _open(url: str, headers: dict[str, str] | None = None):  # -> http.client.HTTPResponse
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, **(headers or {})})
    STATS.requests += 1
    return urllib.request.urlopen(request, timeout=TIMEOUT)


def _copy(response, sink: Callable[[bytes], object], progress: Progress | None) -> int:
    """Read a response to its end into ``sink``; the bytes read."""
    count = 0
    while chunk := response.read(CHUNK):
        sink(chunk)
        count += len(chunk)
        STATS.bytes += len(chunk)
        if progress is not None:
            progress.update(len(chunk))
    return count


# --- the index ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class WheelFile:
    filename: str
    url: str
    sha256: str | None
    size: int | None  # PEP 700; None where the index does not say


def list_files(dist: str, index: str | None = None) -> list[WheelFile]:
    """The files a simple index lists for a project (PEP 691 JSON, else PEP 503 HTML), unyanked."""
    page = urllib.parse.urljoin((index or index_url()).rstrip("/") + "/", normalize(dist) + "/")
    try:
        with _open(page, {"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"}) as response:
            body = response.read()
            content_type = response.headers.get("Content-Type", "")
            final = response.geturl()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise IndexUnavailable(f"could not read {page}: {exc}") from exc
    STATS.bytes += len(body)
    if "json" in content_type:
        data = json.loads(body)
        return [WheelFile(f["filename"], urllib.parse.urljoin(final, f["url"]),
                          f.get("hashes", {}).get("sha256"), f.get("size"))
                for f in data.get("files", []) if not f.get("yanked")]
    files = []
    for attributes, text in re.findall(r"<a\s([^>]*)>([^<]*)</a>", body.decode("utf-8", "replace"), re.I):
        href = re.search(r"""href\s*=\s*(?:"([^"]*)"|'([^']*)')""", attributes)
        if href is None or "data-yanked" in attributes:
            continue
        url, _, fragment = urllib.parse.urljoin(final, html.unescape(href[1] or href[2] or "")).partition("#")
        sha256 = fragment[len("sha256="):] if fragment.startswith("sha256=") else None
        filename = html.unescape(text).strip() or PurePosixPath(urllib.parse.urlparse(url).path).name
        files.append(WheelFile(filename, url, sha256, None))
    return files


def _platform_rank(filename: str) -> int:
    """Linux x86_64 first (the pins were taken from those wheels), other Linux next, then the rest."""
    platform = filename[: -len(".whl")].rsplit("-", 1)[-1]
    return 0 if "linux" in platform and "x86_64" in platform else 1 if "linux" in platform else 2


def find_wheel(dist: str, version: str, index: str | None = None) -> WheelFile:
    prefix = f"{re.sub(r'[-_.]+', '_', dist).lower()}-{version}-"
    wheels = [f for f in list_files(dist, index)
              if f.filename.lower().startswith(prefix) and f.filename.endswith(".whl")]
    if not wheels:
        raise FetchError(f"{index or index_url()} lists no wheel of {dist}=={version}")
    return min(wheels, key=lambda f: (_platform_rank(f.filename), f.filename))


# --- reading a remote zip ------------------------------------------------------------------------

def _content_range(response) -> tuple[int, int] | None:
    """(first byte, total size) of a 206 response's Content-Range."""
    match = re.fullmatch(r"bytes (\d+)-\d+/(\d+)", (response.headers.get("Content-Range") or "").strip())
    return (int(match[1]), int(match[2])) if match else None


class RangeFile(io.RawIOBase):
    """A remote file that zipfile can seek in and read: missing bytes are fetched with range
    requests (at least ``MIN_FETCH`` at a time) and kept."""

    def __init__(self, url: str, size: int) -> None:
        super().__init__()
        self.url, self.size = url, size
        self._pos = 0
        self._spans: list[tuple[int, bytes]] = []  # sorted, disjoint, not adjacent

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._pos = base + offset
        return self._pos

    def read(self, n: int | None = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self._pos + n, self.size)
        if end <= self._pos:
            return b""
        self.ensure(self._pos, end)
        start, data = next((s, d) for s, d in self._spans if s <= self._pos < s + len(d))
        out = data[self._pos - start: end - start]
        self._pos = end
        return out

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def add(self, start: int, data: bytes) -> None:
        spans = sorted([*self._spans, (start, data)], key=lambda span: span[0])
        merged: list[tuple[int, bytes]] = []
        for s, d in spans:
            if merged and s <= merged[-1][0] + len(merged[-1][1]):
                ms, md = merged[-1]
                merged[-1] = (ms, md + d[ms + len(md) - s:])
            else:
                merged.append((s, d))
        self._spans = merged

    def gaps(self, start: int, end: int) -> list[tuple[int, int]]:
        found, cursor = [], start
        for s, d in self._spans:
            if s + len(d) <= cursor:
                continue
            if s >= end:
                break
            if s > cursor:
                found.append((cursor, s))
            cursor = s + len(d)
        if cursor < end:
            found.append((cursor, end))
        return found

    def ensure(self, start: int, end: int, progress: Progress | None = None, exact: bool = False) -> None:
        """Fetch what is missing of bytes ``start:end`` (rounded up to ``MIN_FETCH`` unless ``exact``)."""
        for gap_start, gap_end in self.gaps(start, min(end, self.size)):
            if not exact:
                following = min((s for s, _ in self._spans if s >= gap_end), default=self.size)
                gap_end = max(gap_end, min(gap_start + MIN_FETCH, following))
            self.add(gap_start, self._fetch(gap_start, gap_end, progress))

    def _fetch(self, start: int, end: int, progress: Progress | None) -> bytes:
        parts: list[bytes] = []
        with _open(self.url, {"Range": f"bytes={start}-{end - 1}"}) as response:
            answered = _content_range(response)
            if response.status != 206 or answered is None or answered[0] != start:
                raise RangesUnsupported(f"asked for bytes {start}-{end - 1}, got HTTP {response.status} "
                                        f"{response.headers.get('Content-Range')}")
            _copy(response, parts.append, progress)
        data = b"".join(parts)
        if len(data) != end - start:
            raise FetchError(f"{self.url}: bytes {start}-{end - 1}: the server sent {len(data)} bytes")
        return data


def _safe_target(dest: Path, member: str) -> Path:
    parts = PurePosixPath(member).parts
    if not parts or member.startswith("/") or ".." in parts or ":" in parts[0]:
        raise FetchError(f"refusing the zip member {member!r}")
    return dest.joinpath(*parts)


def extract(archive: zipfile.ZipFile, infos: list[zipfile.ZipInfo], dest: Path) -> list[str]:
    """Extract members (their CRC checked by zipfile) under ``dest``, keeping their paths."""
    for info in infos:
        target = _safe_target(dest, info.filename)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            with archive.open(info) as source, open(target, "wb") as out:
                shutil.copyfileobj(source, out)
        except zipfile.BadZipFile as exc:
            raise FetchError(f"{info.filename}: {exc}") from exc
    return [info.filename for info in infos]


def _member_span(info: zipfile.ZipInfo, size: int) -> tuple[int, int]:
    """The bytes that hold a member: its local header (whose extra field may differ in length
    from the directory's; 1 KB is allowed for that) and its data."""
    name = info.filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437")
    end = info.header_offset + 30 + len(name) + len(info.extra) + info.compress_size + 1024
    return info.header_offset, min(end, size)


def _joined(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    joined: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if joined and start - joined[-1][1] <= JOIN_GAP:
            joined[-1] = (joined[-1][0], max(joined[-1][1], end))
        else:
            joined.append((start, end))
    return joined


def _names(infos: list[zipfile.ZipInfo]) -> str:
    return ", ".join(PurePosixPath(i.filename).name for i in infos) or "none"


def _read_by_ranges(wheel: WheelFile, size: int, tail_start: int, tail: bytes,
                    wanted: Callable[[str], bool], dest: Path, interval: float | None) -> list[str]:
    STATS.wheel_bytes += size
    remote = RangeFile(wheel.url, size)
    remote.add(tail_start, tail)
    try:
        archive = zipfile.ZipFile(remote)
    except zipfile.BadZipFile as exc:
        raise FetchError(f"{wheel.filename} is not a zip file: {exc}") from exc
    with archive:
        infos = [i for i in archive.infolist() if wanted(i.filename)]
        spans = _joined([_member_span(i, size) for i in infos])
        missing = sum(e - s for start, end in spans for s, e in remote.gaps(start, end))
        log(f"  the server serves byte ranges: reading {len(infos)} of the wheel's "
            f"{len(archive.infolist())} files ({_names(infos)}): {human(missing)} "
            f"(uncompressed {human(sum(i.file_size for i in infos))}) of {human(size)}")
        progress = Progress(missing, interval=interval)
        for start, end in spans:
            remote.ensure(start, end, progress, exact=True)
        progress.close()
        return extract(archive, infos, dest)


def _read_whole(wheel: WheelFile, response, wanted: Callable[[str], bool], dest: Path,
                workdir: Path, interval: float | None) -> list[str]:
    """Download a whole wheel from an open response, check it, and extract the wanted members."""
    length = response.headers.get("Content-Length")
    total = wheel.size or (int(length) if length and length.isdigit() else None)
    STATS.wheel_bytes += total or 0
    path = workdir / PurePosixPath(wheel.filename).name
    digest = hashlib.sha256()
    progress = Progress(total, interval=interval)
    try:
        with open(path, "wb") as out:
            def sink(chunk: bytes) -> None:
                out.write(chunk)
                digest.update(chunk)
            received = _copy(response, sink, progress)
        progress.close()
        if total is not None and received != total:
            raise FetchError(f"{wheel.filename}: received {received} of {total} bytes")
        if wheel.sha256 and digest.hexdigest() != wheel.sha256:
            raise FetchError(f"{wheel.filename}: sha256 {digest.hexdigest()}, the index says {wheel.sha256}")
        return extract_local(path, wanted, dest)
    finally:
        path.unlink(missing_ok=True)


def extract_local(path: Path, wanted: Callable[[str], bool], dest: Path) -> list[str]:
    try:
        with zipfile.ZipFile(path) as archive:
            return extract(archive, [i for i in archive.infolist() if wanted(i.filename)], dest)
    except zipfile.BadZipFile as exc:
        raise FetchError(f"{path.name} is not a zip file: {exc}") from exc


def fetch_members(wheel: WheelFile, wanted: Callable[[str], bool], dest: Path, workdir: Path,
                  interval: float | None = None) -> tuple[list[str], str]:
    """Extract the members of a remote wheel that ``wanted`` accepts under ``dest``.

    Returns their names and how they came: ``"ranges"`` (the zip directory and those members
    only) or ``"whole"`` (the whole wheel, downloaded into ``workdir`` and deleted after).
    Progress lines come every ``interval`` seconds at most (see ``Progress``).
    """
    try:
        return _fetch_members(wheel, wanted, dest, workdir, interval)
    except (OSError, http.client.HTTPException) as exc:  # URLError, timeouts, a connection dropped
        raise FetchError(f"{wheel.url}: {exc!r}") from exc


def _fetch_members(wheel: WheelFile, wanted: Callable[[str], bool], dest: Path, workdir: Path,
                   interval: float | None) -> tuple[list[str], str]:
    try:
        response = _open(wheel.url, {"Range": f"bytes=-{TAIL}"})
    except urllib.error.HTTPError as exc:
        if exc.code != 416:  # 416: a server that refuses suffix ranges; try the whole file
            raise FetchError(f"{wheel.url}: {exc}") from exc
        response = None
    if response is not None:
        with response:
            answered = _content_range(response)
            if response.status == 206 and answered is not None:
                tail: list[bytes] = []
                _copy(response, tail.append, None)
                try:
                    return _read_by_ranges(wheel, answered[1], answered[0], b"".join(tail),
                                           wanted, dest, interval), "ranges"
                except RangesUnsupported as exc:
                    log(f"  a range request failed ({exc}): downloading the whole wheel")
            else:  # the server sent the whole file: keep reading it
                log(f"  the server does not serve byte ranges: downloading the whole wheel "
                    f"({human(wheel.size) if wheel.size else 'size not given'})")
                return _read_whole(wheel, response, wanted, dest, workdir, interval), "whole"
    with _open(wheel.url) as response:
        return _read_whole(wheel, response, wanted, dest, workdir, interval), "whole"


def pip_download(dist: str, version: str, workdir: Path) -> Path:
    """The whole wheel, by ``pip download`` (which knows the user's pip configuration); its
    output goes to stderr: what it downloads and its size, and pip's progress bar on a terminal
    (elsewhere pip draws the bar once, when done)."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--dest", str(workdir), f"{dist}=={version}"]
    log(f"  running {' '.join(command[1:])}")
    result = subprocess.run(command, stdout=sys.stderr, stderr=sys.stderr)
    wheels = sorted(workdir.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        raise FetchError(f"pip download {dist}=={version} failed (exit {result.returncode})")
    STATS.bytes += wheels[0].stat().st_size
    STATS.wheel_bytes += wheels[0].stat().st_size
    return wheels[0]
