"""How codegen gets the pinned headers without the network: a fake wheel served by a local
HTTP server (with and without byte ranges), the per-user cache, progress lines, the CLI options.

No NVIDIA text here: the fake headers are a few lines of our own.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import random
import re
import threading
import zipfile
from pathlib import Path, PurePath

import pytest

from codegen import fetch, sources

DIST, VERSION = "nvidia-fake-cu99", "1.2.3"
FILENAME = "nvidia_fake_cu99-1.2.3-py3-none-manylinux_2_27_x86_64.whl"
HEADERS = {  # member -> text; library_types.h lies before the big library, the others after it
    # and before a smaller one, further from the zip's end than the first range request reads
    "nvidia/fake/include/library_types.h": "typedef enum { FAKE_R_32F = 0 } fakeDataType;\n" * 40,
    "nvidia/fake/include/cublasLt.h": "/* not NVIDIA's */\nint fakeLtCreate(void **handle);\n" * 400,
    "nvidia/fake/include/cublas_api.h": "#define CUBLAS_VER_MAJOR 99\n" + "/* fake */\n" * 300,
}
LIBRARY_SIZE = 4_000_000


def make_wheel(members: dict[str, bytes | str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as wheel:
        wheel.writestr("nvidia/fake/include/library_types.h", HEADERS["nvidia/fake/include/library_types.h"])
        wheel.writestr("nvidia/fake/include/other.h", "int other;\n" * 1000)
        wheel.writestr(zipfile.ZipInfo("nvidia/fake/lib/libfake.so.99"),
                       random.Random(0).randbytes(LIBRARY_SIZE), zipfile.ZIP_STORED)
        for name in ("nvidia/fake/include/cublasLt.h", "nvidia/fake/include/cublas_api.h"):
            wheel.writestr(name, HEADERS[name])
        wheel.writestr(zipfile.ZipInfo("nvidia/fake/lib/libfakeLt.so.99"),  # keeps them out of the tail
                       random.Random(1).randbytes(200_000), zipfile.ZIP_STORED)
        for name, data in (members or {}).items():
            wheel.writestr(name, data)
        wheel.writestr("nvidia_fake_cu99-1.2.3.dist-info/METADATA", f"Name: {DIST}\nVersion: {VERSION}\n")
    return buffer.getvalue()


class Server(http.server.ThreadingHTTPServer):
    """A simple index (PEP 691 JSON or PEP 503 HTML) and its files, logging each request."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.files: dict[str, bytes] = {}
        self.ranges = True  # serve byte ranges
        self.html = False  # the index page as PEP 503 HTML (no sizes)
        self.listed_sha256: str | None = None  # what the index says, if not the file's own
        self.truncate: int | None = None  # send only this many bytes of a file, then hang up
        self.requests: list[tuple[str, str | None]] = []
        self.sent = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/simple/"

    def file_requests(self) -> list[str | None]:
        return [rng for path, rng in self.requests if path.startswith("/files/")]


class Handler(http.server.BaseHTTPRequestHandler):
    server: Server

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        server = self.server
        server.requests.append((self.path, self.headers.get("Range")))
        if self.path.startswith("/simple/"):
            body, content_type = self.index_page()
            status, headers = 200, {"Content-Type": content_type}
        elif self.path.startswith("/files/") and self.path[len("/files/"):] in server.files:
            data = server.files[self.path[len("/files/"):]]
            match = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range") or "")
            if match and server.ranges:
                if match[1]:
                    start, end = int(match[1]), min(int(match[2] or len(data) - 1), len(data) - 1)
                else:
                    start, end = max(len(data) - int(match[2]), 0), len(data) - 1
                body, status = data[start:end + 1], 206
                headers = {"Content-Range": f"bytes {start}-{end}/{len(data)}"}
            else:
                body, status, headers = data, 200, {}
        else:
            body, status, headers = b"not found", 404, {}
        self.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(key, value)
        self.end_headers()
        if server.truncate is not None and self.path.startswith("/files/"):
            body = body[: server.truncate]
        self.wfile.write(body)
        server.sent += len(body)

    def index_page(self) -> tuple[bytes, str]:
        server = self.server
        entries = []
        for filename, data in server.files.items():
            sha256 = server.listed_sha256 or hashlib.sha256(data).hexdigest()
            entries.append((filename, f"../../files/{filename}", sha256, len(data)))
        # another platform's wheel of the same release, listed first: the Linux x86_64 one is taken
        entries.insert(0, (FILENAME.replace("manylinux_2_27_x86_64", "win_amd64"), "../../files/absent.whl",
                           "0" * 64, 1))
        if server.html:
            links = "".join(f'<a href="{url}#sha256={sha}">{name}</a><br/>\n' for name, url, sha, _ in entries)
            return f"<!DOCTYPE html><html><body>\n{links}</body></html>".encode(), "text/html"
        files = [{"filename": name, "url": url, "hashes": {"sha256": sha}, "size": size}
                 for name, url, sha, size in entries]
        return (json.dumps({"meta": {"api-version": "1.1"}, "name": DIST, "files": files}).encode(),
                "application/vnd.pypi.simple.v1+json")


@pytest.fixture
def server(monkeypatch):
    server = Server()
    server.files[FILENAME] = make_wheel()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    monkeypatch.setenv(fetch.ENV_INDEX, server.url)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.setenv(name, "*")
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    """A cache of this test's own, and a process that has fetched and said nothing yet."""
    monkeypatch.setenv(sources.ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.setattr(fetch, "STATS", fetch.Stats())
    monkeypatch.setattr(sources, "_said", set())
    yield
    sources.use_cache(True)


def fake_pin() -> sources.Pin:
    headers = {PurePath(member).name: {"wheel": DIST, "path": member,
                                        "sha256": hashlib.sha256(text.encode()).hexdigest()}
               for member, text in HEADERS.items()}
    return sources.Pin("cuda99", Path("unused.py"), {DIST: VERSION}, headers)


def entries(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


# --- where the cache is --------------------------------------------------------------------------

def test_cache_root_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(sources.ENV_CACHE, str(tmp_path / "mine"))
    assert sources.cache_root() == tmp_path / "mine"
    monkeypatch.delenv(sources.ENV_CACHE)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert sources.cache_root() == tmp_path / "xdg" / "nvblaslt" / "codegen"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert sources.cache_root() == tmp_path / "home" / ".cache" / "nvblaslt" / "codegen"


# --- fetching --------------------------------------------------------------------------------------

def test_byte_ranges_read_only_the_headers_then_the_cache_reads_nothing(server, capsys):
    wheel_size = len(server.files[FILENAME])
    entry = sources.wheel_headers(DIST, VERSION, ["cublasLt.h", "cublas_api.h"])
    assert entry == sources.cache_root() / f"{DIST}-{VERSION}"
    for member, text in HEADERS.items():
        assert (entry / member).read_text() == text
    assert not (entry / "nvidia/fake/include/other.h").exists()  # not a header codegen reads
    assert not list(entry.rglob("*.so*"))
    # the tail (the zip's directory), then the two runs of headers: around the library, not through it
    ranges = server.file_requests()
    assert ranges[0] == f"bytes=-{fetch.TAIL}" and len(ranges) == 3, ranges
    assert server.sent < wheel_size / 10
    marker = json.loads((entry / sources.MARKER).read_text())
    assert marker["fetched_by"] == "ranges" and marker["wheel"]["filename"] == FILENAME
    assert marker["wheel"]["sha256"] == hashlib.sha256(server.files[FILENAME]).hexdigest()
    assert set(marker["members"]) == set(HEADERS)
    err = capsys.readouterr().err
    assert f"{DIST}=={VERSION}: fetching {FILENAME} ({fetch.human(wheel_size)}) for 2 headers" in err
    assert "the server serves byte ranges: reading 3 of the wheel's 7 files" in err
    assert f"3 headers cached in {entry}" in err
    assert re.search(r"downloaded [\d.]+ KB in 4 HTTP requests", sources.fetch_report())

    requests_before = len(server.requests)
    sources._said.clear()
    assert sources.wheel_headers(DIST, VERSION) == entry
    assert len(server.requests) == requests_before
    assert "from the cache" in capsys.readouterr().err


def test_a_server_without_ranges_gets_a_whole_download_checked_and_not_kept(server, capsys):
    server.ranges = False
    entry = sources.wheel_headers(DIST, VERSION)
    assert (entry / "nvidia/fake/include/cublasLt.h").read_text() == HEADERS["nvidia/fake/include/cublasLt.h"]
    assert server.file_requests() == [f"bytes=-{fetch.TAIL}"]  # its answer, the whole file, was kept reading
    assert json.loads((entry / sources.MARKER).read_text())["fetched_by"] == "whole"
    assert entries(sources.cache_root()) == [entry.name]  # no wheel, no staging left
    assert not list(sources.cache_root().rglob("*.whl"))
    assert "does not serve byte ranges: downloading the whole wheel" in capsys.readouterr().err


def test_the_whole_download_shows_progress_lines(server, capsys, tmp_path):
    server.ranges = False
    wheel = fetch.find_wheel(DIST, VERSION)
    members, how = fetch.fetch_members(wheel, sources.is_codegen_header, tmp_path / "out", tmp_path,
                                       interval=0)
    assert how == "whole" and len(members) == 3
    lines = [line for line in capsys.readouterr().err.splitlines() if "%" in line]
    total = fetch.human(len(server.files[FILENAME]))
    assert len(lines) >= 4 and all(f" of {total} (" in line for line in lines)
    assert lines[-1].startswith(f"codegen:   {total} of {total} (100%)")


def test_a_wheel_whose_sha256_differs_from_the_index_is_refused(server):
    server.ranges = False
    server.listed_sha256 = "f" * 64
    with pytest.raises(sources.SourceError, match="sha256"):
        sources.wheel_headers(DIST, VERSION)
    assert entries(sources.cache_root()) == []


@pytest.mark.parametrize("ranges", [True, False], ids=["ranges", "whole"])
def test_an_interrupted_download_leaves_nothing_in_the_cache(server, ranges):
    server.ranges = ranges
    server.truncate = 1000
    with pytest.raises(sources.SourceError, match="could not fetch"):
        sources.wheel_headers(DIST, VERSION)
    assert entries(sources.cache_root()) == []
    server.truncate = None
    entry = sources.wheel_headers(DIST, VERSION)
    assert (entry / sources.MARKER).is_file()


def test_an_altered_cache_entry_is_fetched_again(server, capsys):
    entry = sources.wheel_headers(DIST, VERSION)
    (entry / "nvidia/fake/include/cublasLt.h").write_text("edited\n")
    requests_before = len(server.requests)
    assert sources.wheel_headers(DIST, VERSION) == entry
    assert len(server.requests) > requests_before
    assert (entry / "nvidia/fake/include/cublasLt.h").read_text() == HEADERS["nvidia/fake/include/cublasLt.h"]
    assert "incomplete or altered; fetching again" in capsys.readouterr().err


def test_the_html_index_works_too(server):
    server.html = True  # PEP 503: sha256 in the link's fragment, no size
    entry = sources.wheel_headers(DIST, VERSION)
    marker = json.loads((entry / sources.MARKER).read_text())
    assert marker["wheel"]["size"] is None
    assert marker["wheel"]["sha256"] == hashlib.sha256(server.files[FILENAME]).hexdigest()


def test_no_cache_neither_reads_nor_writes_the_cache(server, capsys):
    sources.wheel_headers(DIST, VERSION)  # a cached entry that --no-cache must not read
    requests_before = len(server.requests)
    sources.use_cache(False)
    entry = sources.wheel_headers(DIST, VERSION)
    assert sources.cache_root() not in entry.parents
    assert len(server.requests) > requests_before
    again = len(server.requests)
    assert sources.wheel_headers(DIST, VERSION) == entry  # fetched once per run
    assert len(server.requests) == again
    assert "kept until this run ends (--no-cache)" in capsys.readouterr().err
    sources.use_cache(True)
    assert not entry.exists()
    assert entries(sources.cache_root()) == [f"{DIST}-{VERSION}"]


def test_clear_cache_deletes_only_codegen_entries(server):
    sources.wheel_headers(DIST, VERSION)
    root = sources.cache_root()
    (root / "someone-elses").mkdir()
    (root / "notes.txt").write_text("keep me")
    (root / f"{sources.STAGING_PREFIX}left-over").mkdir()
    count, size = sources.clear_cache()
    assert count == 2 and size > 0
    assert entries(root) == ["notes.txt", "someone-elses"]


def test_a_member_outside_the_wheel_is_refused(server):
    server.files[FILENAME] = make_wheel({"nvidia/include/../../../escape/cublasLt.h": "x"})
    with pytest.raises(sources.SourceError, match="refusing the zip member"):
        sources.wheel_headers(DIST, VERSION)
    assert not (sources.cache_root().parent / "escape").exists()


def test_an_unreadable_index_falls_back_to_pip_download(server, monkeypatch, capsys):
    monkeypatch.setenv(fetch.ENV_INDEX, server.url.replace("/simple/", "/no-such-index/"))
    calls = []

    def pip_download(dist: str, version: str, workdir: Path) -> Path:
        calls.append(f"{dist}=={version}")
        path = workdir / FILENAME
        path.write_bytes(server.files[FILENAME])
        return path

    monkeypatch.setattr(fetch, "pip_download", pip_download)
    entry = sources.wheel_headers(DIST, VERSION)
    assert calls == [f"{DIST}=={VERSION}"]
    assert json.loads((entry / sources.MARKER).read_text())["fetched_by"] == "pip download"
    assert "asking pip to download the whole wheel" in capsys.readouterr().err


def test_from_pin_takes_fetched_headers_and_checks_their_sha256(server):
    pin = fake_pin()
    with sources.from_pin(pin) as headers:
        assert {p.name for p in headers.directory.iterdir()} == set(sources.recipe.NVIDIA_HEADERS)
        assert any(f"{DIST}=={VERSION}" in line for line in headers.provenance)
    pin.headers["cublasLt.h"]["sha256"] = "0" * 64
    with pytest.raises(sources.SourceError, match="but cuda99.json pins"):
        sources.from_pin(pin)


# --- the pieces ------------------------------------------------------------------------------------

class FakeStream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_off_a_terminal_is_one_line_every_few_seconds():
    now = [0.0]
    stream = FakeStream(tty=False)
    progress = fetch.Progress(12_000_000, stream, clock=lambda: now[0])
    assert progress.interval == 5.0
    for _ in range(12):  # 1 MB a second for 12 s
        now[0] += 1
        progress.update(1_000_000)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert lines == ["codegen:   5.0 MB of 12.0 MB (42%), 1.0 MB/s",
                     "codegen:   10.0 MB of 12.0 MB (83%), 1.0 MB/s"]


def test_progress_on_a_terminal_rewrites_one_line():
    now = [0.0]
    stream = FakeStream(tty=True)
    progress = fetch.Progress(None, stream, clock=lambda: now[0])
    for _ in range(3):
        now[0] += 1
        progress.update(2_000)
    progress.close()
    text = stream.getvalue()
    assert text.count("\r") == 4 and text.endswith("\n") and text.count("\n") == 1
    assert "codegen:   6.0 KB, 2.0 KB/s" in text


def test_a_short_transfer_prints_no_progress():
    stream = FakeStream(tty=False)
    progress = fetch.Progress(100, stream)
    progress.update(100)
    progress.close()
    assert stream.getvalue() == ""


def test_range_file_keeps_what_it_read(monkeypatch):
    data = bytes(range(256)) * 1000
    fetched: list[tuple[int, int]] = []

    def fake_fetch(self, start, end, progress):
        fetched.append((start, end))
        return data[start:end]

    monkeypatch.setattr(fetch.RangeFile, "_fetch", fake_fetch)
    remote = fetch.RangeFile("http://unused", len(data))
    remote.add(len(data) - 100, data[-100:])
    remote.seek(-50, io.SEEK_END)
    assert remote.read() == data[-50:] and fetched == []
    remote.seek(10)
    assert remote.read(20) == data[10:30]
    assert fetched == [(10, 10 + fetch.MIN_FETCH)]
    assert remote.read(100) == data[30:130] and len(fetched) == 1
    remote.ensure(200_000, 200_010, exact=True)
    assert fetched[-1] == (200_000, 200_010)
    assert remote.gaps(0, len(data)) == [(0, 10), (10 + fetch.MIN_FETCH, 200_000),
                                         (200_010, len(data) - 100)]
    remote.seek(0)
    assert remote.read() == data


@pytest.mark.parametrize("member, wanted", [
    ("nvidia/cublas/include/cublasLt.h", True),
    ("nvidia/cu13/include/library_types.h", True),
    ("nvidia/cu13/include/cublas.h", False),
    ("nvidia/cublas/lib/cublasLt.h", False),
    ("cublasLt.h", False),
])
def test_which_members_are_codegen_headers(member, wanted):
    assert sources.is_codegen_header(member) is wanted


def test_help_documents_the_cache_and_its_options(capsys):
    pytest.importorskip("pycparser")
    pytest.importorskip("jinja2")
    from codegen.__main__ import main

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for text in ("--no-cache", "--clear-cache", "NVBLASLT_CODEGEN_CACHE", "XDG_CACHE_HOME",
                 str(sources.cache_root()), "range requests", "NVBLASLT_CODEGEN_INDEX_URL"):
        assert text in out, text


def test_main_clear_cache(server, capsys):
    pytest.importorskip("pycparser")
    pytest.importorskip("jinja2")
    from codegen.__main__ import main

    sources.wheel_headers(DIST, VERSION)
    assert main(["--clear-cache"]) == 0
    assert "deleted 1 cache entries" in capsys.readouterr().out
    assert entries(sources.cache_root()) == []
