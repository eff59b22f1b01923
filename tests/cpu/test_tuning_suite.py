"""`nvblaslt tune` without a GPU (issue 35): the LLM suite's problems (what it covers, and that nvblaslt's
own checks accept every one: a plan reaches the handle), `--list`, the budget, continuing a database,
and `tune merge` / `diff` / `show`. The tuning itself is replaced by a stand-in; the GPU test tunes."""

from __future__ import annotations

import json

import pytest

import nvblaslt
from nvblaslt import Matmul, _scales, _tune, _tune_suite, _tuning_cache, _tuning_db
from nvblaslt._launch import Launch
from nvblaslt.__main__ import main
from nvblaslt._tuning_db import TuningDatabase
from tests.cpu.test_tuning_cache import GPU
from tests.fakes import FakeDLPack, Reached, reached

DRIVER = 13000


# ---- the suite ---------------------------------------------------------------------------------------------
def test_the_suite_covers_models_tokens_dtypes_epilogs_and_experts():
    problems = _tune_suite.llm_suite()
    names = [p["name"] for p in problems]
    for model in ("llama3-8b", "llama3-70b", "mixtral-8x7b", "qwen3-8b", "qwen3-30b-a3b"):
        assert any(name.startswith(model) for name in names), model
    for tokens in (1, 16, 128, 1024, 8192):
        assert any(name.endswith(f"T={tokens}") for name in names), tokens
    epilogs = {p.get("epilog") for p in problems}
    assert {"DEFAULT", "GELU_AUX_BIAS", "DGELU", "BGRADB"} <= epilogs
    assert any(p["a"]["dtype"] == "float8_e4m3fn" for p in problems)
    assert all(p["a"]["shape"][0] % 16 == 0 for p in problems if p["a"]["dtype"].startswith("float8"))
    grouped = [p for p in problems if p["kind"] == "grouped"]
    assert {p["b"]["shape"][0] for p in grouped} == {8, 128}
    assert all(p["offs"][-1] == p["a"]["shape"][0] for p in grouped)  # every routed token is in a group
    assert len(set(names)) == len(names)
    assert len(_tune_suite.llm_suite(["llama3-8b"], [128], ["bf16"])) == 5
    with pytest.raises(nvblaslt.NvblasltValueError, match="models: unknown"):
        _tune_suite.llm_suite(["gpt-5"])


def fake(spec: dict, ptr: int) -> FakeDLPack:
    return FakeDLPack(spec["shape"], spec["strides"], spec["dtype"], ptr=ptr)


@pytest.mark.parametrize("problem", [p for p in _tune_suite.llm_suite(tokens=[16, 1024])
                                     if p["kind"] == "matmul"], ids=lambda p: p["name"])
def test_nvblaslt_accepts_every_suite_problem_up_to_the_handle(problem, monkeypatch, default_lib):
    monkeypatch.setattr(Launch, "planned", classmethod(reached))
    monkeypatch.setattr(_scales.Scales, "stage", lambda self, *args, **kwargs: None)
    monkeypatch.setattr(_scales.Scales, "write", lambda self, *args, **kwargs: None)
    a, b = fake(problem["a"], 0x7F0000000000), fake(problem["b"], 0x7F0010000000)
    inputs = {key: fake(spec, 0x7F0020000000) for key, spec in problem["inputs"].items()}
    fp8 = problem["a"]["dtype"].startswith("float8")
    plan = Matmul(a, b, options=problem["options"], quantization_scales={"a": 1.0, "b": 1.0} if fp8 else None)
    with pytest.raises(Reached):
        plan.plan(epilog=problem["epilog"], epilog_inputs=inputs or None)


def test_list_prints_the_problems_without_a_gpu(capsys):
    assert main(["tune", "--list", "--models", "qwen3-30b-a3b", "--tokens", "128", "--dtypes", "bf16"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["qwen3-30b-a3b.qkv forward bf16 T=128", "qwen3-30b-a3b.o forward bf16 T=128",
                     "qwen3-30b-a3b.experts.gate_up grouped 128 experts bf16 T=128",
                     "qwen3-30b-a3b.experts.down grouped 128 experts bf16 T=128"]


# ---- the run, with the tuning of one problem replaced ------------------------------------------------------
@pytest.fixture
def stand_in_tuning(monkeypatch):
    """tune() on this machine: the fingerprint answered, each problem "tuned" at once (its key from its name)."""
    monkeypatch.setattr(_tuning_cache, "gpu_identity", lambda device: GPU)
    monkeypatch.setattr(_tune._cuda, "driver_version", lambda: DRIVER)
    monkeypatch.setattr(_tune._tuning_db, "_driver", lambda: DRIVER)
    tuned = []

    def tune_one(spec, share, device, patterns, skip):
        key = f"{abs(hash(spec['name'])):040x}"[-40:]
        if skip(key):
            return None
        tuned.append((spec["name"], share))
        return key, _tuning_db.entry_for(None, "default", problem=spec["name"], first_pick_ms=1.0)
    monkeypatch.setattr(_tune, "_tune_matmul", tune_one)
    monkeypatch.setattr(_tune, "_tune_grouped", tune_one)
    return tuned


def test_tune_writes_after_each_problem_and_continues_a_database(stand_in_tuning, tmp_path):
    path = tmp_path / "db.jsonl"
    lines = []
    first = nvblaslt.tune("llm", path, models=["llama3-8b"], tokens=[1], budget_s=60, progress=lines.append)
    assert len(first) == 5 and path.exists() and len(path.read_text().splitlines()) == 6
    assert lines[0].startswith("[1/5] llama3-8b.qkv forward bf16 T=1: default") and lines[-1] == "5 default"
    assert all(share <= _tune._autotune.SEARCH_BUDGET_S for _, share in stand_in_tuning)
    stand_in_tuning.clear()
    again = nvblaslt.tune("llm", path, models=["llama3-8b"], tokens=[1, 16], budget_s=60, progress=None)
    assert len(again) == 5 + 9 and [name for name, _ in stand_in_tuning][0] == "llama3-8b.qkv forward bf16 T=16"


def test_tune_stops_when_the_budget_is_spent(stand_in_tuning, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(_tune.time, "perf_counter", lambda: clock[0])
    tune_one = _tune._tune_matmul

    def slow(*args):  # each problem takes 2 s of the clock tune() reads
        clock[0] += 2.0
        return tune_one(*args)
    monkeypatch.setattr(_tune, "_tune_matmul", slow)
    lines = []
    nvblaslt.tune("llm", None, models=["llama3-8b"], tokens=[1], budget_s=5.5, progress=lines.append)
    # 5.5 s over 5 problems is a share of 1.1 s; after one, 3.5 s over 4 is below MIN_PROBLEM_S
    assert len(stand_in_tuning) == 1 and stand_in_tuning[0][1] == pytest.approx(1.1)
    assert "budget spent: 4 of 5 problems left for another run" in lines


def test_tune_refuses_another_machines_database_and_bad_arguments(stand_in_tuning, tmp_path):
    path = tmp_path / "h100.jsonl"
    TuningDatabase({**_tuning_db.fingerprint_of(GPU, [13, 1, 0], DRIVER), "gpu": "NVIDIA H100"}).write(path)
    with pytest.raises(nvblaslt.NvblasltValueError, match="h100.jsonl is for NVIDIA H100"):
        nvblaslt.tune("llm", path, progress=None)
    with pytest.raises(nvblaslt.NvblasltValueError, match="budget_s: expected a positive number"):
        nvblaslt.tune("llm", budget_s=0)
    with pytest.raises(nvblaslt.NvblasltTypeError, match="problems: expected 'llm'"):
        nvblaslt.tune(42)


# ---- merge, diff, show -------------------------------------------------------------------------------------
def write_database(path, entries, **fingerprint):
    TuningDatabase({**_tuning_db.fingerprint_of(GPU, [13, 1, 0], DRIVER), **fingerprint}, entries).write(path)


def test_the_merge_diff_and_show_commands(tmp_path, capsys):
    a, b, merged = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "merged.jsonl"
    write_database(a, {"a" * 40: {"kind": "default", "problem": "P1", "stored": 1.0}})
    write_database(b, {"b" * 40: {"kind": "tuned", "algo": "cd" * 64, "ratio": 0.91, "problem": "P2", "stored": 2.0}})
    assert main(["tune", "merge", str(a), str(b), "-o", str(merged)]) == 0
    assert "2 entries (1 tuned, 1 default, 0 pinned)" in capsys.readouterr().out
    assert len(nvblaslt.load_tuning(merged)) == 2
    nvblaslt.unload_tuning()
    assert main(["tune", "diff", str(a), str(merged)]) == 1
    assert capsys.readouterr().out.splitlines() == ["+ P2: tuned " + "cd" * 8 + " at 0.910× the first pick"]
    assert main(["tune", "diff", str(a), str(a)]) == 0
    assert capsys.readouterr().out.strip() == "the same choices"
    assert main(["tune", "show", str(merged)]) == 0
    out = capsys.readouterr().out
    assert "Test GPU (132 SMs, sm_90)" in out and "0.910×  P2" in out


def test_the_commands_name_a_bad_file_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"format": "nvblaslt-tuning-db", "version": 1}) + "\n")
    assert main(["tune", "show", str(bad)]) == 2
    assert f"tuning database {bad}: line 1: fingerprint" in capsys.readouterr().err
    other = tmp_path / "other.jsonl"
    write_database(other, {}, sms=66)
    write_database(tmp_path / "mine.jsonl", {})
    assert main(["tune", "merge", str(tmp_path / "mine.jsonl"), str(other), "-o", str(tmp_path / "m.jsonl")]) == 2
    assert "keep one file per machine" in capsys.readouterr().err


def test_a_split_forms_first_call_goes_beside_it_until_that_problem_is_tuned_itself(stand_in_tuning,
                                                                                     monkeypatch):
    """A problem whose search chose the two-call bias-gradient form writes its first call's kernel under
    that call's own key; a later problem with that key is tuned all the same and replaces it."""
    keys = iter(["a" * 40, "b" * 40, "c" * 40, "d" * 40, "e" * 40])
    tuned = []

    def tune_one(spec, share, device, patterns, skip):
        key = next(keys)
        if skip(key):
            return None
        tuned.append(key)
        entry = _tuning_db.entry_for(None, "default", problem=spec["name"])
        if key == "a" * 40:  # its first call is problem "c"'s GEMM
            entry.update(bias_gradient_form="split", form_ratio=0.95)
            return key, entry, ("c" * 40, {"kind": "tuned", "algo": "ab" * 64, "of_split_form": True})
        return key, entry
    monkeypatch.setattr(_tune, "_tune_matmul", tune_one)
    lines = []
    found = nvblaslt.tune("llm", None, models=["llama3-8b"], tokens=[1], budget_s=60, progress=lines.append)
    assert tuned == ["a" * 40, "b" * 40, "c" * 40, "d" * 40, "e" * 40]  # "c" tuned though written beside "a"
    assert found.entries["a" * 40]["bias_gradient_form"] == "split"
    assert found.entries["c" * 40]["kind"] == "default" and "of_split_form" not in found.entries["c" * 40]
    assert "split bias-gradient form at 0.950× the fused kernel" in lines[0]


def test_a_continued_file_tunes_a_problem_whose_entry_was_written_beside_a_split_form(stand_in_tuning, tmp_path):
    """An `of_split_form` entry is the first call's autotuned kernel, never searched: a run continuing the
    file tunes that problem when it comes to it, as the run that wrote it would have."""
    path = tmp_path / "db.jsonl"
    nvblaslt.tune("llm", path, models=["llama3-8b"], tokens=[1], budget_s=60, progress=None)
    written = _tuning_db.read(path)
    key = next(iter(written.entries))
    written.entries[key] = {"kind": "tuned", "algo": "ab" * 64, "of_split_form": True}
    written.write(path)
    stand_in_tuning.clear()
    nvblaslt.tune("llm", path, models=["llama3-8b"], tokens=[1], budget_s=60, progress=None)
    assert len(stand_in_tuning) == 1  # that problem alone: the others are in the file
    assert _tuning_db.read(path).entries[key]["kind"] == "default"  # the stand-in's own outcome replaced it
