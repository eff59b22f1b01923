"""The tuning database (issue 35): a JSON-lines file with a fingerprint, entries keyed like the
tuning cache; corrupt files refused by name and line; a mismatched fingerprint ignored with one log
line; recall answers from it before the per-user cache; merge and diff. No GPU: recall gets a
stand-in plan over real descriptors of the installed libcublasLt (as tests/cpu/test_tuning_cache.py)."""

from __future__ import annotations

import json
import logging
import warnings

import pytest

import nvblaslt
from nvblaslt import _tuning_cache, _tuning_db
from nvblaslt._launch import Launch
from nvblaslt._tuning_db import TuningDatabase
from tests.cpu.test_tuning_cache import GPU, fake_result, key_of, plans  # noqa: F401 - plans is a fixture

DRIVER = 13000
KEY = "0123456789abcdef0123456789abcdef01234567"
ALGO = "cd" * 64


def fingerprint(**changes):
    return {**_tuning_db.fingerprint_of(GPU, [13, 1, 0], DRIVER), **changes}


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    """No database loaded before or after; the driver answered without a GPU; a private tuning cache."""
    monkeypatch.setattr(_tuning_db, "_driver", lambda: DRIVER)
    monkeypatch.setenv("NVBLASLT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(_tuning_db.ENV_TUNING, raising=False)
    nvblaslt.unload_tuning()
    yield
    nvblaslt.unload_tuning()


def database_for(plan, kind="tuned", **facts) -> TuningDatabase:
    description = _tuning_cache.problem_description(plan)
    fp = _tuning_db.fingerprint_of(description["gpu"], description["cublaslt"], DRIVER)
    entry = {"kind": kind, **({"algo": ALGO} if kind != "default" else {}), "ms": 1.0, **facts}
    return TuningDatabase(fp, {key_of(plan): entry})


# ---- the file -----------------------------------------------------------------------------------------
def test_the_file_is_json_lines_header_first_entries_in_key_order(tmp_path):
    entries = {"f" * 40: {"kind": "default"}, "a" * 40: {"kind": "tuned", "algo": ALGO, "ratio": 0.93}}
    path = tmp_path / "db.jsonl"
    TuningDatabase(fingerprint(), entries).write(path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0] == {"format": "nvblaslt-tuning-db", "version": 1, "fingerprint": fingerprint()}
    assert [line["key"] for line in lines[1:]] == ["a" * 40, "f" * 40]
    again = nvblaslt.load_tuning(path)
    assert again.entries == entries and again.fingerprint == fingerprint()
    assert again.counts() == {"tuned": 1, "default": 1, "pinned": 0}


CORRUPT = {  # (content, the line named, words of the message)
    "empty": ("", 1, "header"),
    "not json": ('{"format": "nvblaslt-tuning-db", "version": 1, "fingerprint": {}\n', 1, "not valid JSON"),
    "foreign header": ('{"format": "csv"}\n', 1, "is it a tuning database"),
    "newer version": ('{"format": "nvblaslt-tuning-db", "version": 99, "fingerprint": {}}\n', 1, "newer nvblaslt"),
    "no fingerprint": ('{"format": "nvblaslt-tuning-db", "version": 1}\n', 1, "fingerprint"),
    "bad entry json": (None, 3, "not valid JSON"),
    "bad kind": (None, 2, "kind"),
    "bad algo": (None, 2, "algo"),
    "negative ms": (None, 2, "ms"),
    "duplicate key": (None, 3, "already on line 2"),
    "bad form": (None, 2, "bias_gradient_form"),
    "pinned split form": (None, 2, "bias_gradient_form"),
    "binary": (b"\xff\xfe\x00", None, "not UTF-8"),
}


def corrupt_bytes(kind: str) -> bytes:
    content = CORRUPT[kind][0]
    if content is not None:
        return content if isinstance(content, bytes) else content.encode()
    header = json.dumps({"format": "nvblaslt-tuning-db", "version": 1, "fingerprint": fingerprint()})
    good = json.dumps({"key": KEY, "kind": "tuned", "algo": ALGO})
    lines = {"bad entry json": [good, '{"key": '], "bad kind": [json.dumps({"key": KEY, "kind": "fast"})],
             "bad algo": [json.dumps({"key": KEY, "kind": "tuned", "algo": "zz"})],
             "negative ms": [json.dumps({"key": KEY, "kind": "tuned", "algo": ALGO, "ms": -1})],
             "duplicate key": [good, good],
             "bad form": [json.dumps({"key": KEY, "kind": "default", "bias_gradient_form": "fastest"})],
             "pinned split form": [json.dumps({"key": KEY, "kind": "pinned", "algo": ALGO,
                                               "bias_gradient_form": "split"})]}[kind]
    return "\n".join([header, *lines]).encode()


@pytest.mark.parametrize("kind", sorted(CORRUPT))
def test_a_corrupt_file_is_refused_by_name_and_line(tmp_path, kind):
    path = tmp_path / f"{kind.replace(' ', '-')}.jsonl"
    path.write_bytes(corrupt_bytes(kind))
    _, line, words = CORRUPT[kind]
    with pytest.raises(nvblaslt.NvblasltValueError) as caught:
        nvblaslt.load_tuning(path)
    message = str(caught.value)
    assert str(path) in message and words in message, message
    if line is not None:
        assert f"line {line}:" in message, message
    assert _tuning_db.lookup({"gpu": GPU, "cublaslt": [13, 1, 0]}, KEY) is None  # nothing was loaded


def test_load_tuning_refuses_what_is_not_a_path_and_what_is_not_a_file(tmp_path):
    with pytest.raises(nvblaslt.NvblasltTypeError, match="path: expected a str"):
        nvblaslt.load_tuning(3)
    with pytest.raises(nvblaslt.NvblasltValueError, match="not a regular file"):
        nvblaslt.load_tuning(tmp_path)


# ---- recall ------------------------------------------------------------------------------------------------
def test_recall_answers_from_a_loaded_database_before_the_users_cache(plans, monkeypatch, lib, tmp_path):
    plan = plans()
    _tuning_cache.remember(plan, fake_result(lib), 5.0)  # this user's cache has another choice
    path = tmp_path / "team.jsonl"
    database_for(plan, ratio=0.9).write(path)
    nvblaslt.load_tuning(path)
    checked = []
    monkeypatch.setattr(Launch, "check", lambda self, algo: checked.append(bytes(algo)) or fake_result(lib))
    recalled, entry = _tuning_cache.recall(plans())
    assert recalled is not None and entry["kind"] == "tuned" and entry["ratio"] == 0.9
    assert checked == [bytes.fromhex(ALGO)]  # the database's algorithm, re-checked by cuBLASLt


def test_a_default_entry_keeps_the_heuristics_first_pick(plans, monkeypatch, lib, tmp_path):
    plan = plans()
    _tuning_cache.remember(plan, fake_result(lib), 5.0)
    database_for(plan, kind="default").write(tmp_path / "db.jsonl")
    nvblaslt.load_tuning(tmp_path / "db.jsonl")
    monkeypatch.setattr(Launch, "check", lambda self, algo: fake_result(lib))
    assert _tuning_cache.recall(plans()) == (None, {})


def test_a_default_entry_in_the_split_form_keeps_the_first_pick_and_says_the_form(plans, monkeypatch, lib,
                                                                                   tmp_path):
    plan = plans()
    database_for(plan, kind="default", bias_gradient_form="split", form_ratio=0.96).write(tmp_path / "db.jsonl")
    nvblaslt.load_tuning(tmp_path / "db.jsonl")
    monkeypatch.setattr(Launch, "check", lambda self, algo: fake_result(lib))
    assert _tuning_cache.recall(plans()) == (None, {"bias_gradient_form": "split"})


def test_a_tuned_entry_whose_kernel_is_refused_keeps_its_split_form(plans, monkeypatch, lib, tmp_path):
    plan = plans()
    database_for(plan, bias_gradient_form="split").write(tmp_path / "db.jsonl")
    nvblaslt.load_tuning(tmp_path / "db.jsonl")
    monkeypatch.setattr(Launch, "check", lambda self, algo: None)  # cuBLASLt no longer accepts the kernel
    assert _tuning_cache.recall(plans()) == (None, {"bias_gradient_form": "split"})


def test_diff_and_show_tell_the_split_form_apart_from_the_fused_one():
    fused = TuningDatabase(fingerprint(), {KEY: {"kind": "default"}})
    split = TuningDatabase(fingerprint(), {KEY: {"kind": "default", "bias_gradient_form": "split"}})
    (line,) = _tuning_db.diff(fused, split)
    assert line.startswith("~") and "split bias-gradient form" in line
    assert _tuning_db.diff(split, split) == []


def test_a_mismatched_fingerprint_is_ignored_with_one_log_line(plans, monkeypatch, lib, tmp_path, caplog):
    plan = plans()
    database = database_for(plan)
    database.fingerprint["driver"] = DRIVER + 10
    database.write(tmp_path / "other-machine.jsonl")
    nvblaslt.load_tuning(tmp_path / "other-machine.jsonl")
    monkeypatch.setattr(Launch, "check", lambda self, algo: fake_result(lib))
    with caplog.at_level(logging.INFO, logger="nvblaslt"):
        for _ in range(3):
            assert _tuning_cache.recall(plans()) == (None, {})
    lines = [r.getMessage() for r in caplog.records if "other-machine" in r.getMessage()]
    assert len(lines) == 1 and "ignored here" in lines[0], lines


def test_the_environment_variable_loads_files_and_a_corrupt_one_never_breaks_a_call(plans, monkeypatch, lib,
                                                                                      tmp_path):
    plan = plans()
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    database_for(plan).write(good)
    bad.write_text("not a database\n")
    monkeypatch.setattr(_tuning_db, "_environment_read", False)
    monkeypatch.setenv(_tuning_db.ENV_TUNING, f"{bad}:{good}")
    monkeypatch.setattr(Launch, "check", lambda self, algo: fake_result(lib))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        recalled, entry = _tuning_cache.recall(plans())
    assert recalled is not None and entry["kind"] == "tuned"
    messages = [str(w.message) for w in record if issubclass(w.category, _tuning_db.TuningDatabaseWarning)]
    assert len(messages) == 1 and str(bad) in messages[0] and "line 1" in messages[0]


def test_a_refused_database_algorithm_falls_back_to_the_heuristics(plans, tmp_path):
    database_for(plans()).write(tmp_path / "db.jsonl")
    nvblaslt.load_tuning(tmp_path / "db.jsonl")
    assert _tuning_cache.recall(plans()) == (None, {})  # no GPU: AlgoCheck refuses it


# ---- merge and diff ----------------------------------------------------------------------------------------
def test_merge_keeps_the_newest_entry_and_refuses_other_machines():
    a = TuningDatabase(fingerprint(), {"a" * 40: {"kind": "default", "stored": 1.0},
                                       "b" * 40: {"kind": "tuned", "algo": ALGO, "stored": 5.0}}, "a.jsonl")
    b = TuningDatabase(fingerprint(), {"b" * 40: {"kind": "default", "stored": 2.0},
                                       "c" * 40: {"kind": "default", "stored": 3.0}}, "b.jsonl")
    merged = _tuning_db.merge(a, b)
    assert set(merged.entries) == {"a" * 40, "b" * 40, "c" * 40}
    assert merged.entries["b" * 40]["kind"] == "tuned"  # stored later
    other = TuningDatabase(fingerprint(gpu="NVIDIA H100"), {}, "h100.jsonl")
    with pytest.raises(nvblaslt.NvblasltValueError, match="h100.jsonl is for NVIDIA H100"):
        _tuning_db.merge(a, other)


def test_diff_says_what_was_added_removed_and_changed():
    a = TuningDatabase(fingerprint(), {"a" * 40: {"kind": "default", "problem": "P1"},
                                       "b" * 40: {"kind": "tuned", "algo": ALGO, "problem": "P2"}})
    b = TuningDatabase(fingerprint(driver=1), {"b" * 40: {"kind": "default", "problem": "P2"},
                                               "c" * 40: {"kind": "default", "problem": "P3"}})
    lines = _tuning_db.diff(a, b)
    assert lines[0].startswith("fingerprint driver: 13000 -> 1")
    assert "- P1: default (the heuristics' first pick)" in lines
    assert "+ P3: default (the heuristics' first pick)" in lines
    assert any(line.startswith("~ P2: tuned") for line in lines)
    assert _tuning_db.diff(a, a) == []


# ---- plans cached before a load ---------------------------------------------------------------------------
def test_loading_and_unloading_make_every_threads_cached_plans_of_its_problems_plan_again(monkeypatch, tmp_path):
    """load_tuning() after plans were cached (a warmed-up training loop, whose backward plans live in
    autograd's thread): the caches of every thread retire the plans of the database's problems at their next
    call, as after a search stores a choice; plans of other problems stay. unload_tuning() likewise."""
    import threading

    from nvblaslt._plan_cache import PlanCache

    class Plan:
        def __init__(self, key):
            self._launch, self.freed = key, 0

        def free(self):
            self.freed += 1
    monkeypatch.setattr(_tuning_cache, "stored_keys", [])
    monkeypatch.setattr(_tuning_cache, "generation", 0)
    monkeypatch.setattr(_tuning_cache, "key_of", lambda launch: launch)  # a stand-in plan's key is its launch
    other = "f" * 40
    caches = {}

    def warm_up(name):  # each thread's own cache, as the function form keeps them
        cache = caches[name] = PlanCache(8, 8)
        cache.add("tuned problem", Plan(KEY))
        cache.add("other problem", Plan(other))
    for name in ("main", "autograd"):
        thread = threading.Thread(target=warm_up, args=(name,))
        thread.start()
        thread.join()
    path = tmp_path / "db.jsonl"
    TuningDatabase(fingerprint(), {KEY: {"kind": "tuned", "algo": ALGO}}).write(path)
    nvblaslt.load_tuning(path)
    for cache in caches.values():
        assert cache.generation != _tuning_cache.generation  # each call checks this first
        cache.retire_tuned(lambda: 0)
        assert cache.get("tuned problem") is None and cache.get("other problem") is not None
    caches["main"].add("tuned problem", Plan(KEY))
    nvblaslt.unload_tuning()
    caches["main"].retire_tuned(lambda: 0)
    assert caches["main"].get("tuned problem") is None and caches["main"].get("other problem") is not None
