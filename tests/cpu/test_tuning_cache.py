"""The tuning cache never breaks a plan (issue 10): bad files of every kind, FIFOs, unwritable
places, concurrent writers, permissions, and a problem key read from the C descriptors. No GPU:
the cache's load/store API is tested directly; recall and remember get a stand-in plan built from
real descriptors of the installed libcublasLt."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import types
import warnings
from pathlib import Path

import pytest

from nvblaslt import _tuning_cache
from nvblaslt._launch import Launch
from nvblaslt._tuning_cache import TuningCache, TuningCacheWarning, cache_at, cache_path, parse, valid_entry

ROOT = Path(__file__).resolve().parents[2]
ALGO = "ab" * 64


def entry(ms=1.5, **facts):
    return {"algo": ALGO, "ms": ms, **facts}


def document(entries):
    return {"format": _tuning_cache.FORMAT, "version": _tuning_cache.VERSION, "entries": entries}


def write(path: Path, content) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())


def cache_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, TuningCacheWarning)]


@pytest.fixture
def path(tmp_path, monkeypatch) -> Path:
    """A fresh cache file location, also what cache_path() answers."""
    monkeypatch.setenv("NVBLASLT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "tuning.json"


# ---- where it lives -------------------------------------------------------------------------------
def test_cache_path_honours_the_override_then_xdg_then_home(tmp_path, monkeypatch):
    monkeypatch.setenv("NVBLASLT_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_path() == tmp_path / "mine" / "tuning.json"
    monkeypatch.delenv("NVBLASLT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_path() == tmp_path / "xdg" / "nvblaslt" / "tuning.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_path() == tmp_path / "home" / ".cache" / "nvblaslt" / "tuning.json"


# ---- reading: every bad file is ignored with one warning ------------------------------------------------
BAD_FILES = {
    "list": [entry()],
    "string": "tuning",
    "null": None,
    "number": 3,
    "not json": b"{not json",
    "truncated": json.dumps(document({"k": entry()})).encode()[:-5],
    "binary": bytes(range(256)),
    "deeply nested": b"[" * 100_000 + b"]" * 100_000,
    "no format": {"version": 1, "entries": {"k": entry()}},
    "foreign format": {"format": "something else", "version": 1, "entries": {"k": entry()}},
    "version not a number": {"format": _tuning_cache.FORMAT, "version": "1", "entries": {"k": entry()}},
    "entries a list": {"format": _tuning_cache.FORMAT, "version": 1, "entries": [entry()]},
}


@pytest.mark.parametrize("kind", BAD_FILES)
def test_a_bad_file_is_ignored_with_one_warning(path, kind):
    write(path, BAD_FILES[kind])
    cache = TuningCache(path)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert cache.lookup("k") is None
        assert cache.lookup("k") is None
        assert cache_at(path).lookup("other") is None  # another instance, same path: still one warning
    assert len(cache_warnings(record)) == 1, cache_warnings(record)
    assert str(path) in cache_warnings(record)[0]


@pytest.mark.parametrize("kind", ["list", "not json", "entries a list"])
def test_a_bad_file_is_replaced_by_the_next_store(path, kind):
    write(path, BAD_FILES[kind])
    cache = TuningCache(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cache.store("k", entry())
    assert json.loads(path.read_text())["entries"]["k"]["algo"] == ALGO


BAD_ENTRIES = {
    "not a dict": [ALGO],
    "string": ALGO,
    "null": None,
    "no algo": {"ms": 1.0},
    "algo not hex": {"algo": "zz" * 64, "ms": 1.0},
    "algo too short": {"algo": "ab" * 63, "ms": 1.0},
    "algo with spaces": {"algo": "ab " * 42 + "ab", "ms": 1.0},
    "algo a number": {"algo": 7, "ms": 1.0},
    "no ms": {"algo": ALGO},
    "ms negative": {"algo": ALGO, "ms": -1.0},
    "ms nan": {"algo": ALGO, "ms": float("nan")},
    "ms bool": {"algo": ALGO, "ms": True},
    "ms string": {"algo": ALGO, "ms": "1.0"},
    "unknown form": {"algo": ALGO, "ms": 1.0, "bias_gradient_form": "sideways"},
    "stored string": {"algo": ALGO, "ms": 1.0, "stored": "yesterday"},
}


@pytest.mark.parametrize("kind", BAD_ENTRIES)
def test_a_bad_entry_is_skipped_and_the_good_ones_kept(path, kind):
    assert not valid_entry(BAD_ENTRIES[kind])
    write(path, document({"bad": BAD_ENTRIES[kind], "good": entry(2.0)}))
    cache = TuningCache(path)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert cache.lookup("bad") is None
        assert cache.lookup("good")["ms"] == 2.0
    assert len(cache_warnings(record)) == 1
    assert "1 of 2 entries" in cache_warnings(record)[0]


def test_parse_never_raises_on_random_bytes():
    import random

    generator = random.Random(0)
    for _ in range(300):
        contents = parse(bytes(generator.randrange(256) for _ in range(generator.randrange(64))))
        assert contents.entries == {}


def test_an_earlier_format_is_dropped_silently_and_replaced(path):
    write(path, {"0123abcd": {"algo": ALGO, "ms": 1.0, "config": {}}})  # what nvblaslt 0.1 wrote
    cache = TuningCache(path)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert cache.lookup("0123abcd") is None
        assert cache.store("k", entry())
    assert cache_warnings(record) == []
    assert json.loads(path.read_text())["version"] == _tuning_cache.VERSION


def test_a_newer_format_is_left_alone_and_choices_stay_in_memory(path):
    newer = {"format": _tuning_cache.FORMAT, "version": _tuning_cache.VERSION + 1, "entries": {"x": {"y": 1}}}
    write(path, newer)
    cache = TuningCache(path)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert cache.lookup("k") is None
        assert not cache.store("k", entry())
        assert not cache.store("k2", entry())
    assert cache.lookup("k")["algo"] == ALGO
    assert json.loads(path.read_text()) == newer
    texts = cache_warnings(record)
    assert len(texts) == 2 and "newer" in texts[0] and "cannot be written" in texts[1]


# ---- files that are not regular files ------------------------------------------------------------------
def run_isolated(code: str, env: dict, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter: a hang is a timeout here, not a stuck test session."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env={**os.environ, **env}, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("where", ["tuning.json", "tuning.json.lock"])
def test_a_fifo_never_hangs_lookup_or_store(tmp_path, where):
    directory = tmp_path / "cache"
    directory.mkdir()
    os.mkfifo(directory / where)
    done = run_isolated("""
        import warnings
        from nvblaslt._tuning_cache import TuningCache, cache_path
        warnings.simplefilter("always")
        cache = TuningCache(cache_path())
        assert cache.lookup("k") is None
        cache.store("k", {"algo": "ab" * 64, "ms": 1.0})
        assert cache.lookup("k")["ms"] == 1.0
        print("done")
    """, {"NVBLASLT_CACHE_DIR": str(directory), "PYTHONPATH": str(ROOT)}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "done" in done.stdout
    assert "TuningCacheWarning" in done.stderr


def test_a_directory_in_the_files_place_is_ignored_and_results_kept_in_memory(path):
    path.mkdir(parents=True)
    cache = TuningCache(path)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert cache.lookup("k") is None
        assert not cache.store("k", entry())
    assert cache.lookup("k")["ms"] == 1.5
    assert len(cache_warnings(record)) == 2  # one for reading, one for writing


# ---- writing: unwritable places, permissions, atomic replacement ----------------------------------------
def test_an_unwritable_directory_keeps_results_in_memory_and_warns_once(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("NVBLASLT_CACHE_DIR", str(blocker / "cache"))  # fails for root too
    cache = cache_at(cache_path())
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert not cache.store("k1", entry(1.0))
        assert not cache.store("k2", entry(2.0))
    assert cache.lookup("k1")["ms"] == 1.0 and cache.lookup("k2")["ms"] == 2.0
    texts = cache_warnings(record)
    assert len(texts) == 1 and "kept in memory" in texts[0]


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes anywhere")
def test_a_read_only_directory_keeps_results_in_memory(path):
    path.parent.mkdir(parents=True)
    path.parent.chmod(0o500)
    try:
        with pytest.warns(TuningCacheWarning, match="kept in memory"):
            assert not TuningCache(path).store("k", entry())
    finally:
        path.parent.chmod(0o700)


def test_a_missing_home_keeps_results_in_memory(tmp_path, monkeypatch):
    for name in ("NVBLASLT_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("HOME", str(blocker / "home"))
    with pytest.warns(TuningCacheWarning):
        assert not cache_at(cache_path()).store("k", entry())
    assert cache_at(cache_path()).lookup("k") is not None
    cache = TuningCache(None)  # no home at all: memory only
    with pytest.warns(TuningCacheWarning, match="HOME"):
        assert not cache.store("k", entry())
    assert cache.lookup("k")["ms"] == 1.5


def test_private_permissions_and_no_temporary_files_left(path):
    cache = TuningCache(path)
    for index in range(5):
        assert cache.store(f"k{index}", entry())
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.with_name("tuning.json.lock").stat().st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["tuning.json", "tuning.json.lock"]
    stored = json.loads(path.read_text())
    assert stored["format"] == _tuning_cache.FORMAT and len(stored["entries"]) == 5


def test_the_temporary_name_is_unpredictable(path, monkeypatch):
    names = []
    real = tempfile.mkstemp

    def spy(*args, **kwargs):
        fd, name = real(*args, **kwargs)
        names.append(Path(name))
        return fd, name
    monkeypatch.setattr(tempfile, "mkstemp", spy)  # the module _tuning_cache imports when it writes
    cache = TuningCache(path)
    cache.store("a", entry())
    cache.store("b", entry())
    assert len(set(names)) == 2
    assert all(n.parent == path.parent and str(os.getpid()) not in n.name for n in names)


def test_a_symlinked_lock_is_refused_and_its_target_untouched(path, tmp_path):
    target = tmp_path / "victim"
    target.write_text("precious")
    path.parent.mkdir(parents=True)
    (path.parent / "tuning.json.lock").symlink_to(target)
    with pytest.warns(TuningCacheWarning, match="kept in memory"):
        assert not TuningCache(path).store("k", entry())
    assert target.read_text() == "precious"


def test_a_symlinked_cache_file_is_replaced_not_written_through(path, tmp_path):
    target = tmp_path / "victim.json"
    target.write_text("precious")
    path.parent.mkdir(parents=True)
    path.symlink_to(target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the target is not a cache: one warning, then it is replaced
        assert TuningCache(path).store("k", entry())
    assert target.read_text() == "precious"
    assert not path.is_symlink()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown")
def test_a_file_owned_by_another_user_is_not_read_nor_replaced(path):
    write(path, document({"k": entry()}))
    os.chown(path, 12345, 12345)
    cache = TuningCache(path)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert cache.lookup("k") is None
        assert not cache.store("k2", entry())
    assert any("another user" in text for text in cache_warnings(record))
    assert path.stat().st_uid == 12345


def test_store_merges_with_what_another_writer_left(path):
    first, second = TuningCache(path), TuningCache(path)  # two processes, as far as the file goes
    first.store("a", entry(1.0))
    second.store("b", entry(2.0))
    assert first.lookup("b")["ms"] == 2.0  # the file changed: read again
    first.store("c", entry(3.0))
    assert set(json.loads(path.read_text())["entries"]) == {"a", "b", "c"}


def test_the_oldest_entries_go_beyond_the_limit(path, monkeypatch):
    monkeypatch.setattr(_tuning_cache, "MAX_ENTRIES", 5)
    cache = TuningCache(path)
    for index in range(8):
        cache.store(f"k{index}", entry())
    assert sorted(json.loads(path.read_text())["entries"]) == [f"k{i}" for i in range(3, 8)]


def _writer(directory: str, worker: int, count: int, start) -> None:
    start.wait()
    cache = TuningCache(Path(directory) / "tuning.json")
    for index in range(count):
        assert cache.store(f"w{worker}-{index}", {"algo": ALGO, "ms": 1.0 + index})


def test_concurrent_writers_in_several_processes_lose_nothing(path):
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    start = context.Event()
    workers, count = 6, 25
    processes = [context.Process(target=_writer, args=(str(path.parent), w, count, start)) for w in range(workers)]
    for process in processes:
        process.start()
    start.set()
    for process in processes:
        process.join(timeout=120)
        assert process.exitcode == 0
    entries = json.loads(path.read_text())["entries"]
    assert len(entries) == workers * count
    assert all(valid_entry(e) for e in entries.values())


# ---- the problem key, recall and remember, on a real Launch -----------------------------------------------
GPU = {"name": "Test GPU", "cc": [9, 0], "sms": 132}


def stand_in_plan(lib, *, ld=64, epilog=1, alignment=256, scale_pointer=None, bias_pointer=None):
    """What recall and remember read: a real ``Launch`` over real descriptors of ``lib`` (no GPU: the
    handle is NULL, so cuBLASLt's algorithm check refuses everything unless a test says otherwise)."""
    from nvblaslt import MatmulDesc, MatmulPreference, MatrixLayout

    api = lib.api
    desc = MatmulDesc(api.CUBLAS_COMPUTE_32F, api.CUDA_R_32F, lib=lib)
    desc.set("EPILOGUE", epilog)
    if scale_pointer is not None:
        desc.set("A_SCALE_POINTER", scale_pointer)
    if bias_pointer is not None:
        desc.set("BIAS_POINTER", bias_pointer)
    layouts = [MatrixLayout(api.CUDA_R_32F, 64, 32, ld, lib=lib) for _ in range(4)]
    preference = MatmulPreference(max_workspace_bytes=1 << 20, lib=lib)
    preference.set("MIN_ALIGNMENT_A_BYTES", alignment)
    return Launch(lib, None, types.SimpleNamespace(handle=None), desc, layouts, preference, workspace_limit=1 << 20,
                  device=0, alpha=None, beta=None)


@pytest.fixture
def plans(lib, monkeypatch):
    """stand_in_plan for ``lib``, with the GPU identity answered without a GPU."""
    monkeypatch.setattr(_tuning_cache, "gpu_identity", lambda device: GPU)
    return lambda **kwargs: stand_in_plan(lib, **kwargs)


def key_of(plan) -> str:
    return _tuning_cache.problem_key(_tuning_cache.problem_description(plan))


def test_the_key_reads_every_descriptor_and_changes_with_the_problem(plans, monkeypatch):
    base = key_of(plans())
    assert key_of(plans()) == base
    for different in (dict(ld=128), dict(epilog=6), dict(alignment=16), dict(scale_pointer=0x1000)):
        assert key_of(plans(**different)) != base, different
    monkeypatch.setattr(_tuning_cache, "gpu_identity", lambda device: {**GPU, "sms": 66})
    assert key_of(plans()) != base


def test_the_key_ignores_pointer_values_and_per_call_pointers(plans):
    a, b = plans(scale_pointer=0x1000), plans(scale_pointer=0x2000)
    assert key_of(a) == key_of(b)
    plan = plans(epilog=6, bias_pointer=0x1000)
    before = key_of(plan)
    plan.desc.set("BIAS_POINTER", 0x3000)
    plan.desc.set("EPILOGUE_AUX_POINTER", 0x4000)  # set by execute() for aux outputs
    plan.desc.set("AMAX_D_POINTER", 0x5000)  # and for result_amax
    assert key_of(plan) == before


def test_the_key_changes_with_the_library_version(plans):
    plan = plans()
    description = _tuning_cache.problem_description(plan)
    assert description["cublaslt"] == list(plan.lib.version_tuple)
    assert description["layouts"][0]["LD"] == 64 and description["desc"]["EPILOGUE"] == 1
    assert description["preference"]["MIN_ALIGNMENT_A_BYTES"] == 256
    assert "MAX_WORKSPACE_BYTES" not in description["preference"]  # checked at recall instead
    other = dict(description, cublaslt=[99, 0, 0])
    assert _tuning_cache.problem_key(other) != _tuning_cache.problem_key(description)


def fake_result(lib, workspace=0):
    from nvblaslt import HeuristicResult

    raw = lib.api.cublasLtMatmulHeuristicResult_t()
    raw.workspaceSize = workspace
    return HeuristicResult(raw, lib)


def test_remember_then_recall_round_trip(path, plans, monkeypatch, lib):
    plan = plans()
    result = fake_result(lib)
    assert _tuning_cache.remember(plan, result, 2.5, bias_gradient_form="split")
    checked = []
    monkeypatch.setattr(Launch, "check", lambda self, algo: checked.append(bytes(algo)) or result)
    recalled, stored = _tuning_cache.recall(plans())
    assert recalled is result and stored["bias_gradient_form"] == "split" and stored["ms"] == 2.5
    assert checked == [bytes(result.algorithm.algo)]  # the library is asked before the bytes are used


def test_recall_refuses_what_the_library_or_the_workspace_refuses(path, plans, monkeypatch, lib):
    plan = plans()
    _tuning_cache.remember(plan, fake_result(lib), 1.0)
    assert _tuning_cache.recall(plan) == (None, {})  # no GPU here: AlgoCheck refuses
    monkeypatch.setattr(Launch, "check", lambda self, algo: fake_result(lib, workspace=2 << 20))
    assert _tuning_cache.recall(plan) == (None, {})  # more workspace than the plan allows


@pytest.mark.parametrize("kind", ["algo not hex", "no ms", "not a dict", "unknown form"])
def test_a_bad_entry_makes_recall_return_none(path, plans, monkeypatch, lib, kind):
    plan = plans()
    write(path, document({key_of(plan): BAD_ENTRIES[kind]}))
    monkeypatch.setattr(Launch, "check", lambda self, algo: fake_result(lib))
    with pytest.warns(TuningCacheWarning):
        assert _tuning_cache.recall(plan) == (None, {})


@pytest.mark.parametrize("kind", ["list", "null", "deeply nested"])
def test_a_bad_file_makes_recall_return_none(path, plans, kind):
    write(path, BAD_FILES[kind])
    with pytest.warns(TuningCacheWarning):
        assert _tuning_cache.recall(plans()) == (None, {})


def test_recall_survives_a_plan_it_cannot_describe(path, plans):
    plan = plans()
    plan.layouts = None
    with pytest.warns(TuningCacheWarning, match="could not be described"):
        assert _tuning_cache.recall(plan) == (None, {})


def test_a_remembered_choice_retires_the_function_forms_cached_plans_of_that_problem(path, plans, lib):
    """Issue 23: a search that stores a choice (torch's autotune() after a warm-up step, or
    Matmul.autotune(search=True)) reaches the plans matmul() cached before it for that problem: each
    thread's cache drops them on its next call, and the next plan recalls the choice. The dropped plans
    are kept, not freed (a CUDA graph may have captured them), until clear_plan_cache()."""
    import nvblaslt
    from nvblaslt import _function_form
    from nvblaslt._plan_cache import PlanCache

    class CachedPlan:
        def __init__(self, launch):
            self._launch, self.freed = launch, 0

        def free(self):
            self.freed += 1

    nvblaslt.clear_plan_cache()
    _function_form._local.plans = cache = PlanCache(8, 32)  # made at the tuning cache's current generation
    tuned_problem, other_problem = plans(), plans(ld=128)
    tuned, other = CachedPlan(tuned_problem), CachedPlan(other_problem)
    cache.add("slow key", tuned)
    cache.add_alias("fast key", "slow key", tuned)  # a plan is found by its fast key too
    cache.add("other", other)
    with pytest.raises(nvblaslt.NvblasltTypeError):  # refused after the cache check, before any GPU work
        nvblaslt.matmul(None, None, epilog_inputs="not a dict")
    assert cache.values() == [tuned, other]  # nothing stored since: the plans stay
    before = _tuning_cache.generation
    _tuning_cache.remember(tuned_problem, fake_result(lib), 1.0)
    assert _tuning_cache.generation == before + 1
    with pytest.raises(nvblaslt.NvblasltTypeError):
        nvblaslt.matmul(None, None, epilog_inputs="not a dict")
    assert cache.values() == [other] and cache.retired == [tuned] and tuned.freed == 0
    assert cache.find("fast key") is None  # its fast key left with it
    assert cache.generation == _tuning_cache.generation
    nvblaslt.clear_plan_cache()
    assert tuned.freed == 1 and other.freed == 1 and cache.retired == []


def test_recall_refuses_a_split_k_reduction_the_plan_excludes(path, plans, monkeypatch, lib):
    # cuBLASLt's algorithm check does not read the preference's reduction mask: recall does
    plan = plans()
    plan.preference.set("REDUCTION_SCHEME_MASK", 3)  # INPLACE | COMPUTE_TYPE, nvblaslt's for a 16-bit D
    result = fake_result(lib)
    result.algorithm.set("SPLITK_NUM", 4)
    result.algorithm.set("REDUCTION_SCHEME", 4)  # OUTPUT_TYPE
    _tuning_cache.remember(plan, result, 1.0)
    monkeypatch.setattr(Launch, "check", lambda self, algo: result)
    assert _tuning_cache.recall(plan) == (None, {})
    result.algorithm.set("REDUCTION_SCHEME", 2)  # COMPUTE_TYPE: allowed
    assert _tuning_cache.recall(plan)[0] is result


def test_recall_refuses_a_kernel_past_the_plans_wave_limit(path, plans, monkeypatch, lib):
    # the heuristics honour MAX_WAVES_COUNT and cuBLASLt's algorithm check does not read it: recall does
    plan = plans()
    plan.preference.set("MAX_WAVES_COUNT", 2.0)
    result = fake_result(lib)
    result.waves = 3.0
    _tuning_cache.remember(plan, result, 1.0)
    monkeypatch.setattr(Launch, "check", lambda self, algo: result)
    assert _tuning_cache.recall(plan) == (None, {})
    result.waves = 1.5
    assert _tuning_cache.recall(plan)[0] is result
