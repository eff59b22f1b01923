"""The tuning database: the choices ``nvblaslt tune`` made, in a file a team can read, diff, merge,
check in and share, recalled by every plan through the tuning cache's recall path.

A database is JSON lines. The first line is the header: ``{"format": "nvblaslt-tuning-db",
"version": 1, "fingerprint": {...}}``; the fingerprint says where its choices hold (GPU name,
compute capability and SM count, driver, cuBLASLt version, and the format of the problem keys).
Every other line is one entry, keyed like the tuning cache (``_tuning_cache.problem_key``):

- ``"kind": "tuned"``: ``algo`` (the algorithm's 64 bytes in hex) beat the heuristics' first pick
  by ``ratio`` (its time over the first pick's, in an interleaved duel), and, where ``second_ratio`` is
  given, again on a second set of operands (other values at other addresses) by that ratio (``nvblaslt tune``
  since 2026-11-29 confirms the fused kernels it keeps; not a split form's, nor grouped GEMM's);
- ``"kind": "default"``: nothing beat the first pick: it stays, and nothing is searched again; with
  ``unconfirmed`` (a config), ``unconfirmed_ratio`` and ``second_ratio``, a kernel beat it on the tune's
  operands by that ratio but not on the second set (there it read ``second_ratio``); with ``best_ratio``
  and ``best_config``, the search's best challenger and its median paired ratio to the first pick, which
  did not win (short of ``MIN_GAIN``, or not faster beyond the noise); not on a split-form entry;
- on a ``tuned`` or ``default`` entry of a bias-gradient epilog, ``"bias_gradient_form": "split"``: the
  two-call form (``_split_bgrad``: D without the bias gradient, then a GEMV) beat the fused kernel; the
  first call's own kernel is the entry of its own problem, where the tune found one to keep;
- ``"kind": "pinned"``: the algorithm a ``batch_invariant`` plan runs for every M, keyed by the
  problem with M left out (``_batch_invariant``). A measured pin may add ``ladder``: rungs
  ``{"up_to": M or null, "algo": …}`` in ascending order, each serving the M above the previous rung's
  bound up to its own (null: every larger M), all of one bit class, verified at tune time
  (``_invariant_ladder``); ``algo`` is then that class's best single kernel, which an nvblaslt
  without ladders runs for every M, with the same bits. A ladder's entry may add ``members``: every
  kernel verified at tune time to be of the ladder's class, ``{"algo": …, "config": {…}}`` (its config
  attributes by name); a plan whose M the heuristics, asked as the default plan asks them (split-K not
  excluded), give one of them runs it, and the rung otherwise (``_batch_invariant.member_for``). A
  ``pinned`` entry without ``ladder`` (older files, problems the tuner could not vary) serves every M
  with ``algo``; one without ``members`` runs its rungs.

Loaded with ``load_tuning(path)`` or ``$NVBLASLT_TUNING`` (paths joined by ``os.pathsep``). A file
whose fingerprint does not match a GPU is ignored for it, with one log line. A corrupt file is
refused by ``load_tuning`` with its name and line number; through the environment it is skipped
with one warning: a database never breaks a call.
"""

from __future__ import annotations

import functools
import json
import math
import os
import stat
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from . import _cuda
from ._errors import NvblasltTypeError, NvblasltValueError
from ._logging import logger

FORMAT = "nvblaslt-tuning-db"
VERSION = 1  # of the file
KEY_FORMAT = 1  # of the problem keys (_tuning_cache.problem_description): a change makes every key stale
ENV_TUNING = "NVBLASLT_TUNING"
KINDS = ("tuned", "default", "pinned")
BIAS_GRADIENT_FORMS = ("fused", "split")  # a bias-gradient epilog's one kernel, or its two calls (_split_bgrad)
MAX_FILE_BYTES = 64 << 20
MAX_RUNGS = 64  # far beyond the M points a ladder is measured at: a longer one is not ours
MAX_MEMBERS = 256  # far beyond the kernels a tune verifies per class: a longer list is not ours
_FINGERPRINT_FIELDS = ("gpu", "cc", "sms", "driver", "cublaslt", "keys")


class TuningDatabaseWarning(UserWarning):
    """A database named in ``$NVBLASLT_TUNING`` could not be loaded; calls go on without it."""


# ---- what a database is -----------------------------------------------------------------------------
@dataclass
class TuningDatabase:
    """A tuning database: its fingerprint, its entries, and where it was read (``load_tuning`` returns one).

    Parameters
    ----------
    fingerprint : dict
        Where its choices hold: ``gpu`` (name), ``cc`` (compute capability), ``sms``, ``driver``
        (``cudaDriverGetVersion``), ``cublaslt`` (version) and ``keys`` (the problem keys' format).
    entries : dict
        ``{problem key: entry}``; an entry has ``kind`` (``"tuned"``, ``"default"`` or ``"pinned"``),
        ``algo`` (64 bytes in hex; not for ``"default"``), and facts for people (``problem``, ``ratio``
        to the heuristics' first pick, ``ms``, ``first_pick_ms``, ``config``, ``stored``).
    path : str, optional
        The file it was read from or last written to.

    Examples
    --------
    >>> from nvblaslt import TuningDatabase
    >>> database = TuningDatabase({"gpu": "NVIDIA H200", "cc": [9, 0], "sms": 132, "driver": 13000,
    ...                            "cublaslt": [13, 1, 0], "keys": 1}, {"ab" * 20: {"kind": "default"}})
    >>> len(database), database.counts()
    (1, {'tuned': 0, 'default': 1, 'pinned': 0})
    """

    fingerprint: dict
    entries: dict[str, dict] = field(default_factory=dict)
    path: str | None = None

    def __len__(self) -> int:
        return len(self.entries)

    def counts(self) -> dict[str, int]:
        """How many entries of each kind.

        Returns
        -------
        dict
            ``{"tuned": n, "default": n, "pinned": n}``.
        """
        return {kind: sum(e["kind"] == kind for e in self.entries.values()) for kind in KINDS}

    def matches(self, fingerprint: dict) -> bool:
        return all(self.fingerprint.get(name) == fingerprint.get(name) for name in _FINGERPRINT_FIELDS)

    def to_bytes(self) -> bytes:
        """The file: the header, then one line per entry in key order (so that diffs stay small)."""
        header = {"format": FORMAT, "version": VERSION, "fingerprint": self.fingerprint}
        lines = [json.dumps(header, sort_keys=True)]
        lines += [json.dumps({"key": key, **self.entries[key]}, sort_keys=True) for key in sorted(self.entries)]
        return ("\n".join(lines) + "\n").encode()

    def write(self, path: str | os.PathLike) -> None:
        """Write the database to ``path``, replacing it atomically (a reader sees the old file or the
        new one, never half of one); readable by everyone, as a file meant to be shared.

        Parameters
        ----------
        path : str or os.PathLike
            The file (JSON lines: the header, then one entry per line in key order).
        """
        import tempfile

        target = Path(path)
        directory = target.parent if str(target.parent) else Path(".")
        fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(self.to_bytes())
                file.flush()
                os.fsync(file.fileno())
            os.chmod(temporary, 0o644)  # meant to be shared, unlike the per-user cache
            os.replace(temporary, target)
        except BaseException:
            try:
                os.unlink(temporary)
            except OSError:
                pass
            raise
        self.path = str(target)


def fingerprint_of(gpu: dict, cublaslt, driver: int) -> dict:
    """A fingerprint from ``_tuning_cache.gpu_identity``'s dict, the library version and the driver's."""
    return {"gpu": gpu["name"], "cc": list(gpu["cc"]), "sms": gpu["sms"], "driver": int(driver),
            "cublaslt": list(cublaslt), "keys": KEY_FORMAT}


@functools.lru_cache(maxsize=None)
def _driver() -> int:
    return _cuda.driver_version()


def describe_fingerprint(fingerprint: dict) -> str:
    cublaslt = ".".join(map(str, fingerprint.get("cublaslt", [])))
    driver = fingerprint.get("driver", 0)
    cc = "".join(map(str, fingerprint.get("cc", [])))
    return (f"{fingerprint.get('gpu')} ({fingerprint.get('sms')} SMs, sm_{cc}), "
            f"driver {driver // 1000}.{driver % 1000 // 10}, cuBLASLt {cublaslt}, keys v{fingerprint.get('keys')}")


# ---- reading: every fault named, with its line ---------------------------------------------------------
def _positive(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _hex(value, length: int) -> bool:
    if not isinstance(value, str) or len(value) != length:
        return False
    try:
        return len(bytes.fromhex(value)) * 2 == length
    except ValueError:
        return False


def _entry_fault(entry) -> str | None:
    """What is wrong with one entry line's object, or None."""
    if not isinstance(entry, dict):
        return f"expected a JSON object (an entry), got a JSON {type(entry).__name__}"
    if not _hex(entry.get("key"), 40):
        return f"key: expected a problem key (40 hex digits), got {entry.get('key')!r}"
    kind = entry.get("kind")
    if kind not in KINDS:
        return f"kind: expected one of {KINDS}, got {kind!r}"
    if kind != "default" and not _hex(entry.get("algo"), 128):
        return f"algo: expected an algorithm's 64 bytes as 128 hex digits for a {kind!r} entry"
    form = entry.get("bias_gradient_form", "fused")
    if form not in BIAS_GRADIENT_FORMS or (form != "fused" and kind == "pinned"):
        return (f"bias_gradient_form: expected one of {BIAS_GRADIENT_FORMS} on a 'tuned' or 'default' entry, got "
                f"{form!r} on a {kind!r} one")
    for name in ("ms", "first_pick_ms", "ratio", "form_ratio", "second_ratio", "unconfirmed_ratio", "best_ratio",
                 "stored"):
        if name in entry and not _positive(entry[name]):
            return f"{name}: expected a positive number, got {entry[name]!r}"
    if "best_config" in entry:
        fault = _config_fault(entry["best_config"], "best_config")
        if fault:
            return fault
    if "ladder" in entry:
        fault = _ladder_fault(entry) if kind == "pinned" else f"ladder: only a 'pinned' entry has one, not {kind!r}"
        if fault:
            return fault
    if "members" in entry:
        return _members_fault(entry["members"]) if "ladder" in entry else "members: only a pinned entry with a " \
                                                                           "ladder has them"
    return None


def _ladder_fault(entry: dict) -> str | None:
    """What is wrong with a pinned entry's ``ladder``, or None."""
    rungs = entry["ladder"]
    if not isinstance(rungs, list) or not 1 <= len(rungs) <= MAX_RUNGS:
        return f"ladder: expected a list of 1 to {MAX_RUNGS} rungs, got {type(rungs).__name__} {rungs!r:.60}"
    previous = 0
    for index, rung in enumerate(rungs):
        if not isinstance(rung, dict) or not _hex(rung.get("algo"), 128):
            return f"ladder[{index}]: expected an object with algo (an algorithm's 64 bytes as 128 hex digits)"
        bound, last = rung.get("up_to", "missing"), index == len(rungs) - 1
        if last and bound is not None:
            return f"ladder[{index}].up_to: expected null (the last rung serves every larger M), got {bound!r}"
        if not last and (isinstance(bound, bool) or not isinstance(bound, int) or bound <= previous):
            return f"ladder[{index}].up_to: expected an int above {previous} (bounds ascend), got {bound!r}"
        previous = bound if not last else previous
    return None


def _members_fault(members) -> str | None:
    """What is wrong with a ladder's ``members``, or None."""
    if not isinstance(members, list) or not 1 <= len(members) <= MAX_MEMBERS:
        return f"members: expected a list of 1 to {MAX_MEMBERS} kernels, got {type(members).__name__} {members!r:.60}"
    for index, member in enumerate(members):
        if not isinstance(member, dict) or not _hex(member.get("algo"), 128):
            return f"members[{index}]: expected an object with algo (an algorithm's 64 bytes as 128 hex digits)"
        fault = _config_fault(member.get("config"), f"members[{index}].config")
        if fault:
            return fault
    return None


def _config_fault(config, name: str) -> str | None:
    """What is wrong with an algorithm's config (``{attribute name: int}``), or None."""
    if not isinstance(config, dict) or not config or not all(
            isinstance(key, str) and isinstance(value, int) and not isinstance(value, bool)
            for key, value in config.items()):
        return f"{name}: expected an object of config attributes (name: int), got {config!r:.60}"
    return None


def members_of(entry: dict) -> list[dict]:
    """A pinned entry's verified class members (``{"algo": hex, "config": {name: int}}``); [] without."""
    return list(entry.get("members") or ())


def member_matching(entry: dict, config: dict) -> str | None:
    """The algorithm (hex) of ``entry``'s verified member whose config is ``config`` (every attribute
    equal: a kernel not verified is never run), or None."""
    wanted = {name: int(value) for name, value in config.items()}
    return next((member["algo"] for member in members_of(entry) if member["config"] == wanted), None)


def pinned_algo(entry: dict, size: int) -> tuple[str, int | None]:
    """(the algorithm in hex, its rung's bound) a ``pinned`` entry runs at ``size`` (the varying extent):
    the ladder's rung whose range holds ``size``, or ``algo`` for every M (bound None) without a ladder."""
    for rung in entry.get("ladder") or ():
        if rung["up_to"] is None or size <= rung["up_to"]:
            return rung["algo"], rung["up_to"]
    return entry["algo"], None


def parse(data: bytes, name: str) -> TuningDatabase:
    """A database from a file's bytes; NvblasltValueError naming ``name`` and the line of any fault."""
    try:
        text = data.decode()
    except UnicodeDecodeError as error:
        raise NvblasltValueError(f"tuning database {name}: not UTF-8 text (byte {error.start}); is it a tuning "
                                 f"database?") from None
    lines = text.splitlines()
    if not lines or not lines[0].strip():
        raise NvblasltValueError(f"tuning database {name}: line 1: expected the header "
                                 f'{{"format": "{FORMAT}", ...}}, got an empty line')
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append((number, json.loads(line)))
        except (ValueError, RecursionError) as error:
            raise NvblasltValueError(f"tuning database {name}: line {number}: not valid JSON ({error})") from None
    (_, header), *rows = records
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise NvblasltValueError(f"tuning database {name}: line 1: expected the header "
                                 f'{{"format": "{FORMAT}", "version": {VERSION}, "fingerprint": ...}}; is it a '
                                 f"tuning database?")
    version = header.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise NvblasltValueError(f"tuning database {name}: line 1: version: expected a positive int, got {version!r}")
    if version > VERSION:
        raise NvblasltValueError(f"tuning database {name}: line 1: written by a newer nvblaslt (format version "
                                 f"{version}; this one reads {VERSION}): upgrade nvblaslt to use it")
    fingerprint = header.get("fingerprint")
    missing = [f for f in _FINGERPRINT_FIELDS if not isinstance(fingerprint, dict) or f not in fingerprint]
    if missing:
        raise NvblasltValueError(f"tuning database {name}: line 1: fingerprint: expected the fields "
                                 f"{list(_FINGERPRINT_FIELDS)}, missing {missing}")
    entries: dict[str, dict] = {}
    lines_of: dict[str, int] = {}
    for number, entry in rows:
        fault = _entry_fault(entry)
        if fault:
            raise NvblasltValueError(f"tuning database {name}: line {number}: {fault}")
        key = entry.pop("key")
        if key in entries:
            raise NvblasltValueError(f"tuning database {name}: line {number}: key {key} is already on line "
                                     f"{lines_of[key]} (merge files with `nvblaslt tune merge`)")
        entries[key], lines_of[key] = entry, number
    assert isinstance(fingerprint, dict)  # checked above: every field is there
    return TuningDatabase(fingerprint, entries, name)


def read(path: str | os.PathLike) -> TuningDatabase:
    """The database at ``path``: a regular file, opened without blocking (a FIFO cannot hang a plan)."""
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise NvblasltValueError(f"tuning database {name}: cannot be read ({error.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NvblasltValueError(f"tuning database {name}: not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise NvblasltValueError(f"tuning database {name}: larger than {MAX_FILE_BYTES >> 20} MiB; is it a "
                                     f"tuning database?")
        with os.fdopen(os.dup(fd), "rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    return parse(data, name)


# ---- merging and comparing ------------------------------------------------------------------------------
def merge(*databases: TuningDatabase) -> TuningDatabase:
    """One database with every entry; where two have a key, the one stored last (the later file's on a tie).
    Databases of different fingerprints are refused: their choices hold on different machines."""
    first = databases[0]
    for other in databases[1:]:
        if not other.matches(first.fingerprint):
            raise NvblasltValueError(f"merge: {other.path or 'a database'} is for "
                                     f"{describe_fingerprint(other.fingerprint)}, {first.path or 'the first'} for {describe_fingerprint(first.fingerprint)}; "
                                     f"keep one file per machine (load several with {ENV_TUNING}=a{os.pathsep}b)")
    merged: dict[str, dict] = {}
    for database in databases:
        for key, entry in database.entries.items():
            if key not in merged or entry.get("stored", 0) >= merged[key].get("stored", 0):
                merged[key] = entry
    return TuningDatabase(dict(first.fingerprint), merged)


def describe_config(entry: dict) -> str:
    """An entry's or a rung's algorithm for people: its id, tile, stages and split-K."""
    config = entry.get("config") or {}
    shown = ", ".join(f"{k.lower()} {v}" for k, v in config.items() if k in ("ID", "TILE_ID", "STAGES_ID",
                                                                               "SPLITK_NUM"))
    return shown or entry["algo"][:16]


def describe_ladder(entry: dict) -> str:
    """A pinned entry's rungs for people, as ``M ≤ 16: id 66, tile 20, …; M > 16: …``, and how many
    verified members it has; empty without a ladder."""
    rungs, shown, low = entry.get("ladder") or [], [], 0
    for rung in rungs:
        where = f"M ≤ {rung['up_to']}" if rung["up_to"] is not None else f"M > {low}" if low else "every M"
        shown.append(f"{where}: {describe_config(rung)}")
        low = rung["up_to"] if rung["up_to"] is not None else low
    members = members_of(entry)
    return "; ".join(shown) + (f" (and {len(members)} verified members, run where the heuristics pick one)"
                               if members else "")


def _choice(entry: dict) -> str:
    form = ", split bias-gradient form" if entry.get("bias_gradient_form") == "split" else ""
    if entry["kind"] == "default":
        unconfirmed = (f"; a kernel at {entry['unconfirmed_ratio']:.3f}× it read {entry['second_ratio']:.3f}× on other "
                       "operands" if "unconfirmed_ratio" in entry and "second_ratio" in entry else "")
        near = f"; its best challenger read {entry['best_ratio']:.3f}×" if "best_ratio" in entry else ""
        return f"default (the heuristics' first pick{form}{unconfirmed}{near})"
    ratio = f" at {entry['ratio']:.3f}× the first pick" if "ratio" in entry else ""
    ladder = f" (ladder {describe_ladder(entry)})" if entry.get("ladder") else ""
    return f"{entry['kind']} {describe_config(entry)}{ratio}{form}{ladder}"


def _chosen(entry: dict) -> tuple:
    """What a plan runs for an entry: two entries with the same run the same kernels at every M."""
    rungs = tuple((r["up_to"], r["algo"]) for r in entry.get("ladder") or ())
    return (entry["kind"], entry.get("algo"), entry.get("bias_gradient_form", "fused"), rungs,
            tuple(sorted(m["algo"] for m in members_of(entry))))


def diff(a: TuningDatabase, b: TuningDatabase) -> list[str]:
    """Lines for people: the fingerprint's differences, then ``-`` (only in a), ``+`` (only in b) and
    ``~`` (another choice) per problem; empty when the two agree."""
    lines = [f"fingerprint {name}: {a.fingerprint.get(name)!r} -> {b.fingerprint.get(name)!r}"
             for name in _FINGERPRINT_FIELDS if a.fingerprint.get(name) != b.fingerprint.get(name)]
    for key in sorted(set(a.entries) | set(b.entries)):
        old, new = a.entries.get(key), b.entries.get(key)
        what = (new or old or {}).get("problem", key)
        if new is None:
            assert old is not None  # the key is in one of the two
            lines.append(f"- {what}: {_choice(old)}")
        elif old is None:
            lines.append(f"+ {what}: {_choice(new)}")
        elif _chosen(old) != _chosen(new):
            lines.append(f"~ {what}: {_choice(old)} -> {_choice(new)}")
    return lines


# ---- the databases this process recalls from -------------------------------------------------------------
_loaded: list[TuningDatabase] = []
_lock = threading.Lock()
_environment_read = False
_logged: set[tuple] = set()
# Told the problem keys whose choice a load_tuning() or unload_tuning() may change (the tuning cache's
# generation, which every thread's cached plans and nvblaslt.torch's bound steps check, registers here).
choices_changed: list[Callable[[Iterable[str]], None]] = []


def _tell(keys: Iterable[str]) -> None:
    for listener in choices_changed:
        listener(keys)


def load_tuning(path: str | os.PathLike) -> TuningDatabase:
    """Recall the choices of the tuning database at ``path`` in every later plan of this process.

    ``matmul()``, ``Matmul``, ``nvblaslt.torch`` and grouped GEMM plans then start from its choices
    (each re-checked by cuBLASLt for the plan, as the tuning cache's are); a database's entry wins over
    the per-user tuning cache's. A database whose fingerprint does not match a GPU is ignored for that
    GPU, with one log line. Loading the same path again replaces it; the last one loaded is asked first.
    The plans ``matmul()``, grouped GEMM and ``nvblaslt.torch`` cached for its problems, in every thread,
    are made again at their next call (as after a search stores a choice); a ``Matmul`` you hold keeps its
    algorithms until ``plan()`` is called again. ``$NVBLASLT_TUNING`` (paths joined by ``os.pathsep``)
    loads files at the first plan instead.

    Parameters
    ----------
    path : str or os.PathLike
        A file written by ``nvblaslt tune`` (JSON lines; see the tuning guide).

    Returns
    -------
    TuningDatabase
        What was loaded: ``fingerprint``, ``entries`` (``len()`` counts them), ``counts()`` by kind.

    Raises
    ------
    NvblasltTypeError
        ``path`` is not a str or path.
    NvblasltValueError
        The file cannot be read, or is not a tuning database: the message names the file and the line.

    Examples
    --------
    >>> import nvblaslt
    >>> nvblaslt.load_tuning("no-such-file.jsonl")
    Traceback (most recent call last):
        ...
    nvblaslt.NvblasltValueError: tuning database no-such-file.jsonl: cannot be read (No such file or directory)
    """
    if not isinstance(path, (str, os.PathLike)):
        raise NvblasltTypeError(f"path: expected a str or os.PathLike naming a tuning database, got "
                                f"{type(path).__name__}")
    database = read(path)
    replaced = _add(database)
    _tell([*database.entries, *(replaced.entries if replaced is not None else ())])
    logger.info("tuning database %s: %d entries for %s", database.path, len(database),
                describe_fingerprint(database.fingerprint))
    return database


def unload_tuning() -> None:
    """Forget every tuning database loaded (``$NVBLASLT_TUNING`` is not read again); later plans
    recall from the per-user tuning cache only. The plans cached for their problems are made again at
    their next call, as after ``load_tuning``; a ``Matmul`` you hold keeps its algorithms.

    Examples
    --------
    >>> import nvblaslt
    >>> nvblaslt.unload_tuning()   # nothing loaded: nothing to forget
    """
    global _environment_read
    with _lock:
        forgotten = [key for database in _loaded for key in database.entries]
        _loaded.clear()
        _logged.clear()
        _environment_read = True
    if forgotten:
        _tell(forgotten)


def _add(database: TuningDatabase) -> TuningDatabase | None:
    """Ask ``database`` first from now on; returns the one of the same path it replaces, if any."""
    with _lock:
        replaced = next((d for d in _loaded if d.path == database.path), None)
        _loaded[:] = [d for d in _loaded if d.path != database.path]
        _loaded.insert(0, database)
    return replaced


def _read_environment() -> None:
    """Load ``$NVBLASLT_TUNING``'s files once, each fault a warning: the variable must never break a call."""
    global _environment_read
    with _lock:
        if _environment_read:
            return
        _environment_read = True
    for path in filter(None, os.environ.get(ENV_TUNING, "").split(os.pathsep)):
        try:
            _add(read(path))
        except NvblasltValueError as error:
            warnings.warn(f"{ENV_TUNING}: {error}; skipped", TuningDatabaseWarning, stacklevel=5)


def lookup(description: dict, key: str) -> dict | None:
    """The entry for ``key`` in the first loaded database whose fingerprint matches ``description``'s GPU
    and library (``_tuning_cache.problem_description``), or None. A database of another fingerprint is
    passed over with one log line per GPU."""
    _read_environment()
    if not _loaded:
        return None
    gpu = description["gpu"]
    wanted = fingerprint_of(gpu, description["cublaslt"], _driver())
    for database in list(_loaded):
        if not database.matches(wanted):
            seen = (database.path, json.dumps(wanted, sort_keys=True))
            if seen not in _logged:
                _logged.add(seen)
                import logging  # a warning, so that it shows by default: someone expected this file to apply

                logging.getLogger("nvblaslt").warning(
                    "tuning database %s: made for %s, not this %s; ignored here", database.path,
                    describe_fingerprint(database.fingerprint), describe_fingerprint(wanted))
            continue
        entry = database.entries.get(key)
        if entry is not None:
            return dict(entry)
    return None


def entry_for(result, kind: str, **facts) -> dict:
    """A database entry for ``result`` (a HeuristicResult; None for a ``default`` entry)."""
    entry = {"kind": kind, "stored": time.time(), **facts}
    if result is not None:
        entry.update(algorithm_fields(result))
    return entry


def algorithm_fields(result) -> dict:
    """``algo`` (hex) and ``config`` of ``result`` (a HeuristicResult): an entry's or a ladder rung's."""
    return {"algo": bytes(result.algorithm.algo).hex(),
            "config": {k: int(v) for k, v in result.algorithm.config().items()}}
