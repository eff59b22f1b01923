"""The on-disk tuning cache: the algorithm ``autotune(search=True)`` chose, per GPU, cuBLASLt
version and problem, so that a later process plans it without searching again.

A cache must never break a plan. What is read is validated, and a bad file is ignored with one
warning; only regular files owned by this user are read, and they are opened non-blocking (a
FIFO in the cache's place cannot hang ``plan()``); a recalled algorithm is re-checked with
``cublasLtMatmulAlgoCheck`` before use. Writes merge with what is on disk under a file lock and
replace the file atomically through an unpredictable temporary name, with private permissions.
When the cache cannot be written, choices stay in memory for the process and one warning says why.
``recall`` asks the tuning databases loaded (``_tuning_db``: shared files ``nvblaslt tune`` writes)
first, with the same key and the same check.

File ``tuning.json`` in ``$NVBLASLT_CACHE_DIR`` (default ``$XDG_CACHE_HOME/nvblaslt`` or
``~/.cache/nvblaslt``): ``{"format": "nvblaslt-tuning-cache", "version": 1, "entries": {key: entry}}``,
an entry being ``{"algo": 128 hex digits, "ms": float, "stored": unix time, ...facts}``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
import math
import os
import stat
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: writes stay atomic, without the lock
    fcntl = None  # type: ignore[assignment]

from . import _cuda, _tuning_db
from ._descriptors import HeuristicResult
from ._errors import NvblasltError
from ._logging import logger


# The problem keys remember() stored in this process, and those of tuning databases loaded or unloaded, in
# order, and their count. Plans made before a choice for their problem may hold what the tuning cache now
# answers better: the function form's per-thread caches retire those plans when they see a new count.
stored_keys: list[str] = []
generation = 0
recall_enabled = True  # False while `nvblaslt tune` plans: it starts from the heuristics' own first pick


def key_of(launch) -> str | None:
    """``launch``'s problem key, or None where it cannot be described."""
    try:
        return problem_key(problem_description(launch))
    except Exception:  # noqa: BLE001 - the cache must never break a call
        return None

ENV_CACHE_DIR = "NVBLASLT_CACHE_DIR"
FORMAT = "nvblaslt-tuning-cache"
VERSION = 1
ALGO_BYTES = 64  # sizeof(cublasLtMatmulAlgo_t): uint64_t data[8]
MAX_FILE_BYTES = 16 << 20  # far beyond MAX_ENTRIES entries: a larger file is not ours
MAX_ENTRIES = 4096  # beyond this the oldest entries are dropped
LOCK_TIMEOUT_S = 10.0

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class TuningCacheWarning(UserWarning):
    """The tuning cache could not be read or written; planning goes on without it."""


class _Unwritable(Exception):
    """Why the cache file is not to be replaced (its text is the warning's)."""


def cache_path() -> Path | None:
    """Where the cache lives; None when there is no home directory to put it in."""
    root = os.environ.get(ENV_CACHE_DIR) or os.environ.get("XDG_CACHE_HOME")
    if root:
        directory = root if os.environ.get(ENV_CACHE_DIR) else os.path.join(root, "nvblaslt")
    else:
        home = os.path.expanduser("~")
        if home.startswith("~") or not os.path.isabs(home):  # no HOME and no passwd entry
            return None
        directory = os.path.join(home, ".cache", "nvblaslt")
    return Path(directory) / "tuning.json"


# ---- warnings: one per process, per path and topic -------------------------------------------------
_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def _warn_once(path: Path | None, topic: str, message: str) -> None:
    with _warned_lock:
        if (str(path), topic) in _warned:
            return
        _warned.add((str(path), topic))
    where = path if path is not None else "(no cache directory: HOME is not set)"
    warnings.warn(f"nvblaslt tuning cache {where}: {message}", TuningCacheWarning, stacklevel=4)


# ---- what a valid file and entry are -----------------------------------------------------------------
def valid_entry(entry) -> bool:
    """Whether ``entry`` is one that recall can use (an algorithm's bytes, a positive time…)."""
    if not isinstance(entry, dict):
        return False
    algo = entry.get("algo")
    if not isinstance(algo, str) or len(algo) != 2 * ALGO_BYTES:
        return False
    try:
        if len(bytes.fromhex(algo)) != ALGO_BYTES:  # fromhex skips whitespace
            return False
    except ValueError:
        return False
    for name, required in (("ms", True), ("stored", False)):
        if name not in entry and not required:
            continue
        value = entry.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            return False
    return entry.get("bias_gradient_form", "fused") in _tuning_db.BIAS_GRADIENT_FORMS


@dataclass
class Contents:
    """What a cache file holds: its valid entries, what was wrong with it (None if nothing), and
    whether a write may replace it (not when a newer nvblaslt wrote it)."""

    entries: dict[str, dict] = field(default_factory=dict)
    problem: str | None = None
    replaceable: bool = True


def parse(data: bytes) -> Contents:
    """Validate a cache file's bytes; never raises."""
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return Contents(problem="is not valid JSON; ignored (the next search will replace it)")
    if not isinstance(document, dict):
        return Contents(problem=f"holds a JSON {type(document).__name__}, not a tuning cache; ignored "
                                f"(the next search will replace it)")
    if "format" not in document and document and all(isinstance(v, dict) and "algo" in v
                                                      for v in document.values()):
        logger.debug("tuning cache: an earlier nvblaslt's format; its entries are not reused")
        return Contents()
    version = document.get("version")
    if document.get("format") != FORMAT or isinstance(version, bool) or not isinstance(version, int):
        return Contents(problem="is not a tuning cache (no format and version); ignored "
                                "(the next search will replace it)")
    if version > VERSION:
        return Contents(problem=f"was written by a newer nvblaslt (format version {version}); left as is, "
                                f"and this process keeps its choices in memory", replaceable=False)
    entries = document.get("entries")
    if not isinstance(entries, dict):
        return Contents(problem="has no entries table; ignored (the next search will replace it)")
    valid = {k: v for k, v in entries.items() if isinstance(k, str) and valid_entry(v)}
    bad = len(entries) - len(valid)
    return Contents(valid, f"{bad} of {len(entries)} entries are invalid and ignored" if bad else None)


def _read(path: Path) -> tuple[Contents, tuple | None]:
    """(contents, the file's identity for change detection) — never opening what is not a regular
    file owned by this user, and never blocking."""
    try:
        fd = os.open(path, os.O_RDONLY | _O_NONBLOCK | _O_CLOEXEC)
    except FileNotFoundError:
        return Contents(), None
    except OSError as error:
        return Contents(problem=f"cannot be read ({error.strerror}); ignored"), None
    try:
        info = os.fstat(fd)
        identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        if not stat.S_ISREG(info.st_mode):
            return Contents(problem="is not a regular file; ignored"), identity
        if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
            return Contents(problem=f"belongs to another user (uid {info.st_uid}); ignored",
                            replaceable=False), identity
        if info.st_size > MAX_FILE_BYTES:
            return Contents(problem=f"is larger than {MAX_FILE_BYTES >> 20} MiB; ignored"), identity
        with os.fdopen(os.dup(fd), "rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        return Contents(problem=f"cannot be read ({error.strerror}); ignored"), None
    finally:
        os.close(fd)
    return parse(data), identity


def _document(entries: dict[str, dict]) -> bytes:
    return json.dumps({"format": FORMAT, "version": VERSION, "entries": entries}, indent=1,
                      sort_keys=True).encode()


# ---- the cache of one path -------------------------------------------------------------------------
class TuningCache:
    """The tuning cache at ``path`` (None: memory only). ``lookup`` and ``store`` never raise for
    anything found on disk; they warn once per process and carry on."""

    def __init__(self, path: Path | None):
        self.path = path
        self._lock = threading.Lock()
        self._memory: dict[str, dict] = {}  # what this process stored, written or not
        self._disk: dict[str, dict] = {}
        self._identity: tuple | None = None  # of the file self._disk was read from

    def lookup(self, key: str) -> dict | None:
        """The entry for ``key`` (a copy), from this process's choices or the file; None if none."""
        with self._lock:
            entry = self._memory.get(key)
            if entry is None:
                self._refresh()
                entry = self._disk.get(key)
            return dict(entry) if entry is not None else None

    def entries(self) -> dict[str, dict]:
        """Every valid entry this process can see, the file's and its own."""
        with self._lock:
            self._refresh()
            return _newest(self._disk, self._memory)

    def store(self, key: str, entry: dict) -> bool:
        """Remember ``entry`` under ``key``: in memory at once, and on disk merged with what other
        processes wrote. Returns whether the file was written."""
        entry = {**entry, "stored": time.time()}
        if not valid_entry(entry):
            raise ValueError(f"not a valid tuning-cache entry: {entry!r}")
        with self._lock:
            self._memory[key] = entry
            if self.path is None:
                _warn_once(None, "write", "cannot be written; choices are kept in memory for this process")
                return False
            try:
                self._write(self.path)
            except (OSError, _Unwritable) as error:
                reason = error.strerror or str(error) if isinstance(error, OSError) else str(error)
                _warn_once(self.path, "write", f"cannot be written ({reason}); choices are kept in memory "
                                              f"for this process")
                return False
            return True

    def _refresh(self) -> None:
        """Re-read the file if it changed since it was last read."""
        if self.path is None:
            return
        try:
            info = os.stat(self.path)
            identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        except OSError:
            identity = None
        if identity is not None and identity == self._identity:
            return
        contents, self._identity = _read(self.path)
        self._disk = contents.entries
        if contents.problem:
            _warn_once(self.path, "read", contents.problem)

    def _write(self, path: Path) -> None:
        directory = path.parent
        os.makedirs(directory, mode=0o700, exist_ok=True)
        with self._locked(path):
            contents, _ = _read(path)  # read again under the lock: other processes' entries
            if not contents.replaceable:
                raise _Unwritable(contents.problem)
            merged = _newest(contents.entries, self._memory)
            if len(merged) > MAX_ENTRIES:
                kept = sorted(merged, key=lambda k: merged[k].get("stored", 0), reverse=True)[:MAX_ENTRIES]
                merged = {k: merged[k] for k in kept}
            import tempfile  # here, not at import (with shutil, bz2 and lzma under it): only a write needs it

            fd, temporary = tempfile.mkstemp(prefix=".tuning.", suffix=".tmp", dir=directory)  # mode 0o600
            try:
                with os.fdopen(fd, "wb") as file:
                    file.write(_document(merged))
                    file.flush()
                    os.fsync(file.fileno())
                os.replace(temporary, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise
            self._disk = merged
            try:
                info = os.stat(path)
                self._identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
            except OSError:
                self._identity = None

    @contextlib.contextmanager
    def _locked(self, path: Path):
        """An exclusive flock on ``tuning.json.lock``: writers take turns, so none loses another's entries."""
        if fcntl is None:
            yield
            return
        lock_path = path.with_name(path.name + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC, 0o600)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise _Unwritable(f"its lock file {lock_path.name} is not a regular file")
            deadline = time.monotonic() + LOCK_TIMEOUT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise _Unwritable(f"another process held {lock_path.name} for {LOCK_TIMEOUT_S:.0f} s")
                    time.sleep(0.005)
            yield
        finally:
            os.close(fd)  # releases the lock


def _newest(*tables: dict[str, dict]) -> dict[str, dict]:
    """The tables merged, keeping for each key the entry stored last."""
    merged: dict[str, dict] = {}
    for table in tables:
        for key, entry in table.items():
            if key not in merged or entry.get("stored", 0) >= merged[key].get("stored", 0):
                merged[key] = entry
    return merged


_caches: dict[Path | None, TuningCache] = {}
_caches_lock = threading.Lock()


def cache_at(path: Path | None) -> TuningCache:
    """This process's TuningCache for ``path`` (one per path, so warnings and memory are shared)."""
    with _caches_lock:
        cache = _caches.get(path)
        if cache is None:
            cache = _caches[path] = TuningCache(path)
        return cache


# ---- the problem key, read from the plan's C descriptors -----------------------------------------
# Outputs' pointers (aux, bias gradient, amax, output scales) are set per execute, so their nullness
# says only whether the plan has run; EPILOGUE says whether bias and aux exist, and the algorithm
# check at recall refuses a kernel that cannot write an amax the plan asks for.
_PER_CALL_POINTERS = frozenset({"BIAS_POINTER", "EPILOGUE_AUX_POINTER", "AMAX_D_POINTER", "EPILOGUE_AUX_AMAX_POINTER",
                                "D_OUT_SCALE_POINTER"})
# Checked at recall instead (a remembered algorithm must fit the plan's workspace), so that plans
# with other limits still find the entry.
_CHECKED_AT_RECALL = frozenset({"MAX_WORKSPACE_BYTES"})
# A grouped plan's average group shape: a hint made from the first call's token count. Left out of the
# key, so a choice tuned at one token count is found at another (the algorithm check still runs).
_GROUPED_HINTS = frozenset({"GROUPED_AVERAGE_REDUCTION_DIM", "GROUPED_DESC_D_AVERAGE_ROWS",
                            "GROUPED_DESC_D_AVERAGE_COLS"})


@functools.lru_cache(maxsize=None)
def gpu_identity(device: int) -> dict:
    """What makes one GPU's best kernel differ from another's: name, compute capability, SMs
    (a MIG slice keeps the name but has fewer)."""
    props = _cuda.device_properties(device)
    return {"name": props.name.decode(errors="replace"), "cc": list(_cuda.compute_capability(device)),
            "sms": int(props.multiProcessorCount)}


_unreadable: dict[tuple, set] = {}  # (library, enum) -> attributes the library does not have


def _attribute_values(descriptor, enum_name: str, skip=frozenset()) -> dict:
    """Every attribute the loaded library reports for ``descriptor``; pointers as set or not."""
    lib = descriptor.lib
    enum_type = getattr(lib.api, enum_name)
    unreadable = _unreadable.setdefault((lib.path, lib.version, enum_name), set())
    values = {}
    for member, (ctype, _is_array) in lib.api.ATTRIBUTES[enum_type][2].items():
        if member.name in skip or member in unreadable or (ctype is ctypes.c_void_p and
                                                          member.name in _PER_CALL_POINTERS):
            continue
        try:
            value = descriptor.get(member)
        except Exception:  # an attribute the loaded library does not have: it fails the same way every time
            unreadable.add(member)
            continue
        values[member.name] = value is not None and value != 0 if ctype is ctypes.c_void_p else value
    return values


def problem_description(launch) -> dict:
    """Everything the choice of kernel depends on, read from the launch's C descriptors: GPU,
    cuBLASLt version, every attribute of the four layouts, the matmul descriptor (pointers only as
    set or not) and the preference."""
    layouts = [_attribute_values(layout, "cublasLtMatrixLayoutAttribute_t") for layout in launch.layouts]
    grouped = int(getattr(launch.lib.api, "CUBLASLT_BATCH_MODE_GROUPED", -1))
    skip = _CHECKED_AT_RECALL | (_GROUPED_HINTS if any(l.get("BATCH_MODE") == grouped for l in layouts) else set())
    return {"gpu": gpu_identity(launch.device), "cublaslt": list(launch.lib.version_tuple),
            "desc": _attribute_values(launch.desc, "cublasLtMatmulDescAttributes_t"),
            "layouts": layouts,
            "preference": _attribute_values(launch.preference, "cublasLtMatmulPreferenceAttributes_t", skip=skip)}


def problem_key(description: dict) -> str:
    return hashlib.sha256(json.dumps(description, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:40]


def problem_summary(description: dict, api=None) -> str:
    """One line for people: epilogue, D's shape, types and GPU."""

    def name(enum_name, value):
        enum_type = getattr(api, enum_name, None)
        try:
            return enum_type(value).name if enum_type is not None else str(value)
        except ValueError:
            return str(value)

    desc, layouts = description.get("desc", {}), description.get("layouts", [{}] * 4)
    d = layouts[3] if len(layouts) == 4 else {}
    batch = d.get("BATCH_COUNT", 1)
    types = "/".join(name("cudaDataType_t", layout.get("TYPE")) for layout in layouts)
    return (f"{name('cublasLtEpilogue_t', desc.get('EPILOGUE'))} D {d.get('ROWS')}x{d.get('COLS')}"
            f"{f'x{batch}' if batch != 1 else ''} A/B/C/D {types} "
            f"transa={desc.get('TRANSA')} transb={desc.get('TRANSB')} on {description['gpu']['name']}")


def describe_algorithm(result) -> str:
    algorithm = result.algorithm
    try:
        return f"id {algorithm.id} tile {algorithm.tile} stages {algorithm.stages}"
    except Exception:  # a tile or stage value this module's enums do not name
        return f"id {algorithm.id}"


def reduces_as_allowed(result: HeuristicResult, allowed: int) -> bool:
    """Whether ``result`` splits K, if at all, with a reduction scheme of ``allowed`` (the launch's
    preference mask: ``cublasLtMatmulAlgoCheck`` does not read it, so a pick made for another epilog,
    or remembered, may reduce as the plan forbids, such as OUTPUT_TYPE into a 16-bit D)."""
    algorithm = result.algorithm
    return int(algorithm.get("SPLITK_NUM")) <= 1 or not int(algorithm.get("REDUCTION_SCHEME")) & ~allowed


def fits_preference(result: HeuristicResult, preference) -> bool:
    """Whether ``result`` keeps to what ``preference`` asks of an algorithm and ``cublasLtMatmulAlgoCheck``
    does not read: a split-K reduction of REDUCTION_SCHEME_MASK, numerical implementation flags (tensor-op
    kind, accumulator and input types) within IMPL_MASK, at most MAX_WAVES_COUNT waves (0: any). The
    heuristics honour all three; a pick made for another epilog, an enumerated one or a remembered one may
    not (an fp16 accumulator where the mask excludes it changes the result's precision)."""
    if not reduces_as_allowed(result, int(preference.get("REDUCTION_SCHEME_MASK"))):
        return False
    try:
        impl_mask = int(preference.get("IMPL_MASK"))
        max_waves = float(preference.get("MAX_WAVES_COUNT"))
    except NvblasltError:  # a library without these preferences asks nothing of them
        return True
    if max_waves > 0 and result.waves > max_waves:
        return False
    if impl_mask & _ALL_IMPL_FLAGS != _ALL_IMPL_FLAGS:
        try:
            flags = int(result.algorithm.capability("NUMERICAL_IMPL_FLAGS"))
        except NvblasltError:  # unknown: not provably within the mask
            return False
        return not flags & ~impl_mask
    return True


_ALL_IMPL_FLAGS = (1 << 64) - 1  # IMPL_MASK's default: every implementation allowed


# ---- what Matmul and autotune call ----------------------------------------------------------------
def recall(launch) -> tuple[HeuristicResult | None, dict]:
    """(the remembered HeuristicResult, if the library still accepts it for this launch and it fits the
    launch's workspace limit; the stored entry) — or (None, {}), or (None, {"bias_gradient_form": "split"})
    where the entry keeps the first pick, or a kernel not accepted here, in the two-call form. Never raises
    for the cache's sake."""
    if not recall_enabled:
        return None, {}
    try:
        description = problem_description(launch)
        key = problem_key(description)
        shared = _tuning_db.lookup(description, key)  # a loaded database's choice wins over this user's cache
        entry = shared if shared is not None else cache_at(cache_path()).lookup(key)
    except Exception as error:  # the cache must never break a launch
        _warn_once(cache_path(), "key", f"skipped: the problem could not be described ({error})")
        return None, {}
    summary = problem_summary(description, launch.lib.api)
    if entry is None or entry.get("kind") == "default":
        split = entry is not None and entry.get("bias_gradient_form") == "split"
        logger.debug("tuning %s for %s", "cache: nothing remembered" if entry is None else
                     "database: the heuristics' first pick stays" + (", in the split bias-gradient form" if split
                                                                     else ""), summary)
        return None, ({"bias_gradient_form": "split"} if split else {})
    algo_type = launch.lib.api.cublasLtMatmulAlgo_t
    raw = bytes.fromhex(entry["algo"])
    result = launch.check(algo_type.from_buffer_copy(raw)) if len(raw) == ctypes.sizeof(
        algo_type) else None
    source = "tuning database" if shared is not None else "tuning cache"
    if result is None or result.workspace_size > launch.workspace_limit \
            or not fits_preference(result, launch.preference):  # in the key, but the check does not read it
        logger.info("%s: the remembered algorithm for %s is not accepted for this launch; ignored", source, summary)
        split = entry.get("bias_gradient_form") == "split"  # the form holds whatever kernel runs fused
        return None, ({"bias_gradient_form": "split"} if split else {})
    form = entry.get("bias_gradient_form")
    logger.info("%s hit: %s for %s (%.3f ms when searched%s); no search", source, describe_algorithm(result),
                summary, entry.get("ms", math.nan), f", {form} bias-gradient form" if form else "")
    return result, entry


def has_choice(launch) -> bool:
    """Whether a loaded database or this user's cache holds a choice for ``launch``'s problem (unchecked)."""
    try:
        description = problem_description(launch)
        key = problem_key(description)
        return _tuning_db.lookup(description, key) is not None or cache_at(cache_path()).lookup(key) is not None
    except Exception:  # noqa: BLE001 - the cache must never break autotune
        return False


def _choices_changed(keys) -> None:
    """A tuning database was loaded or unloaded: its problems' plans, cached in any thread, are made again."""
    global generation
    stored_keys.extend(keys)
    generation = len(stored_keys)


_tuning_db.choices_changed.append(_choices_changed)


def remember(launch, result, milliseconds: float, **facts) -> bool:
    """Store ``result`` (its 64 bytes, valid for this library version) as the choice for ``launch``'s
    problem, with ``facts`` about the choice (such as ``bias_gradient_form``). Returns whether it
    reached the disk; it is in this process's memory either way."""
    try:
        description = problem_description(launch)
    except Exception as error:  # the cache must never break autotune
        _warn_once(cache_path(), "key", f"skipped: the problem could not be described ({error})")
        return False
    entry = {**facts, "algo": bytes(result.algorithm.algo).hex(), "ms": float(milliseconds),
             "config": {k: int(v) for k, v in result.algorithm.config().items()},
             "problem": problem_summary(description, launch.lib.api)}
    key = problem_key(description)
    stored = cache_at(cache_path()).store(key, entry)
    global generation
    stored_keys.append(key)
    generation = len(stored_keys)
    logger.info("tuning cache: remembered %s for %s%s", describe_algorithm(result), entry["problem"],
                "" if stored else " (in memory only)")
    return stored
