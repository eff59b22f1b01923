"""The measured batch-invariant pin (issue 35) without a GPU: its candidates, the max-min choice on
timings from a simulated timer, the database round-trip of a pin that splits K, the problems of
``nvblaslt tune --batch-invariant``, and how the tuner reads a token's outputs."""

from __future__ import annotations

import random

import pytest

import nvblaslt
from nvblaslt import Algorithm, _batch_invariant, _invariant_choice, _invariant_ladder, _invariant_tune, _tune, _tune_suite
from nvblaslt import _tuning_db
from nvblaslt._duel import Contestant
from nvblaslt._launch import Launch
from nvblaslt._tuning_db import TuningDatabase
from tests.cpu.test_tuning_batch_invariant import DRIVER, algo_with, isolated, launch_for, result_of  # noqa: F401
from tests.fakes import on_grid, simulated_timer


def splits_of(lib, algo: bytes) -> tuple[int, int]:
    algorithm = Algorithm(lib.api.cublasLtMatmulAlgo_t.from_buffer_copy(algo), lib)
    return algorithm.get("SPLITK_NUM"), algorithm.get("REDUCTION_SCHEME")


# ---- candidates ------------------------------------------------------------------------------------------------
def test_each_base_comes_with_every_split_count_and_duplicates_are_left_out(lib):
    compute_type = int(lib.api.CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)
    first, second = bytes(algo_with(lib, 11, split_k=3)), bytes(algo_with(lib, 22))
    found = _invariant_choice.candidates(lib, [("a", first), ("b", second), ("a again", first)])
    assert [c.name for c in found] == ["a", "a, split-K 2", "a, split-K 4", "a, split-K 8",
                                       "b", "b, split-K 2", "b, split-K 4", "b, split-K 8"]
    assert [splits_of(lib, c.algo) for c in found[:4]] == [(1, 0), (2, compute_type), (4, compute_type),
                                                           (8, compute_type)]
    assert Algorithm(lib.api.cublasLtMatmulAlgo_t.from_buffer_copy(found[4].algo), lib).get("TILE_ID") == 22


def test_only_candidates_accepted_at_every_extent_are_kept(lib, monkeypatch):
    refused_at = {}

    def check(self, algo):
        rows, split = self.layouts[3].get("ROWS"), Algorithm(algo, lib).get("SPLITK_NUM")
        return None if refused_at.get(split) == rows else result_of(lib, algo, workspace=split << 10)
    monkeypatch.setattr(Launch, "check", check)
    launch = launch_for(lib, 1024, 4096, 4096)
    refused_at[8] = 32768  # split-K 8: refused beyond the timed extents (its workspace grows with M, say)
    with _batch_invariant.reference_launches(launch, "m", _invariant_choice.ACCEPTED_AT) as references:
        assert _batch_invariant.accepted(references, algo_with(lib, 11), 1 << 20)
        assert not _batch_invariant.accepted(references, algo_with(lib, 11, split_k=8), 1 << 20)
        assert not _batch_invariant.accepted(references, algo_with(lib, 11, split_k=4), 2 << 10)  # workspace
    assert 32768 in _invariant_choice.ACCEPTED_AT and set(_invariant_choice.SPEED_M) <= set(
        _invariant_choice.ACCEPTED_AT) and set(_invariant_choice.BITWISE_M) <= set(_invariant_choice.ACCEPTED_AT)


# ---- the choice ------------------------------------------------------------------------------------------------
def test_the_pin_maximizes_the_worst_speed_over_its_target():
    speeds = {
        "fast at large M only": {1: 0.40, 16: 0.45, 64: 0.6, 256: 0.95, 1024: 1.0, 8192: 1.0},
        "fast at small M only": {1: 1.0, 16: 0.98, 64: 0.97, 256: 0.6, 1024: 0.3, 8192: 0.2},
        "balanced": {1: 0.80, 16: 0.82, 64: 0.85, 256: 0.80, 1024: 0.78, 8192: 0.80},
    }
    assert _invariant_choice.ranking(speeds)[0] == "balanced"
    assert _invariant_choice.score(speeds["balanced"]) == pytest.approx(0.80 / 0.95)  # M = 1 against 0.95
    # each end alone ranks its own specialist first: what the entry records for a reader
    assert _invariant_choice.ranking(speeds, _invariant_choice.small)[0] == "fast at small M only"
    assert _invariant_choice.ranking(speeds, _invariant_choice.large)[0] == "fast at large M only"
    # a candidate whose bits change is never kept: the next one down the ranking is
    assert _invariant_choice.choose(speeds, lambda name: name != "balanced") == "fast at large M only"
    assert _invariant_choice.choose(speeds, lambda name: False) is None


def test_within_a_tie_the_geometric_mean_decides():
    speeds = {"flat": {1: 0.90, 8192: 0.90}, "better elsewhere": {1: 0.895, 8192: 1.2}}
    assert _invariant_choice.ranking(speeds) == ["better elsewhere", "flat"]
    assert _invariant_choice.finalists({f"c{i}": {1: i / 10} for i in range(10)}, keep=["c0", "absent"]) == [
        "c9", "c8", "c7", "c6", "c5", "c4", "c0"]


def test_timed_in_interleaved_rounds_the_balanced_kernel_wins_on_a_simulated_gpu():
    # ms per kernel at each M: the default's, and three candidates
    costs = {name: on_grid(ms, _invariant_choice.SPEED_M) for name, ms in {
        "default": {1: 1.0, 16: 1.0, 64: 1.0, 256: 2.0, 1024: 4.0, 8192: 30.0},
        "small tile": {1: 1.0, 16: 1.05, 64: 1.1, 256: 3.5, 1024: 9.0, 8192: 80.0},
        "large tile": {1: 2.5, 16: 2.5, 64: 2.0, 256: 2.0, 1024: 4.0, 8192: 30.5},
        "middle": {1: 1.1, 16: 1.15, 64: 1.2, 256: 2.2, 1024: 4.5, 8192: 33.0}}.items()}
    running = {"ms": 0.0}
    timer = simulated_timer(lambda: running["ms"], random.Random(3), noise=0.02)(0, 0)

    def contestants_at(m, names):
        def kernel(name):
            return Contestant(name, lambda: running.update(ms=costs[name][m]))
        return [kernel("default")] + [kernel(name) for name in names]
    names = ["small tile", "large tile", "middle"]
    timed = _invariant_choice.table(timer, contestants_at, names, rounds=7)
    assert timed["large tile"][1] == pytest.approx(0.4, rel=0.05)
    assert timed["small tile"][8192] == pytest.approx(30 / 80, rel=0.05)
    assert _invariant_choice.choose(timed, lambda name: True) == "middle"


# ---- the database round-trip -------------------------------------------------------------------------------------
def test_a_measured_pin_that_splits_k_round_trips_through_the_database(lib, monkeypatch, tmp_path):
    compute_type = int(lib.api.CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)
    launch = launch_for(lib, 64, 4096, 4096)
    split = _invariant_choice.with_split(lib, bytes(algo_with(lib, 44)), 4)
    chosen = result_of(lib, lib.api.cublasLtMatmulAlgo_t.from_buffer_copy(split))
    key, entry = _batch_invariant.pinned_entry(launch, "rows", chosen, source="heuristics at M=16 #1, split-K 4",
                                               speed={"1": 0.97, "8192": 0.9}, worst_over_target=1.02)
    assert entry["kind"] == "pinned" and entry["config"]["SPLITK_NUM"] == 4
    description = _batch_invariant.pinned_key(launch, "rows")[1]
    fingerprint = _tuning_db.fingerprint_of(description["gpu"], description["cublaslt"], DRIVER)
    TuningDatabase(fingerprint, {key: entry}).write(tmp_path / "pins.jsonl")
    monkeypatch.setattr(_batch_invariant, "heuristics", lambda *args, count: pytest.fail("the database has it"))
    monkeypatch.setattr(Launch, "check", lambda self, algo: result_of(lib, algo))
    loaded = nvblaslt.load_tuning(tmp_path / "pins.jsonl")
    assert loaded.entries[key]["speed"] == {"1": 0.97, "8192": 0.9}
    for m in (1, 7, 300, 8192):  # every M of the problem recalls the same pin, split-K and all
        pinned = _batch_invariant.pinned(launch_for(lib, m, 4096, 4096), "rows")
        assert pinned.as_bytes() == split and splits_of(lib, pinned.as_bytes()) == (4, compute_type)
    # the same split with another reduction (in place: partial sums in the output type) is refused, never run
    inplace = lib.api.cublasLtMatmulAlgo_t.from_buffer_copy(split)
    Algorithm(inplace, lib).set("REDUCTION_SCHEME", int(lib.api.CUBLASLT_REDUCTION_SCHEME_INPLACE))
    TuningDatabase(fingerprint, {key: {**entry, "algo": bytes(inplace).hex()}}).write(tmp_path / "pins.jsonl")
    nvblaslt.load_tuning(tmp_path / "pins.jsonl")
    with pytest.raises(nvblaslt.NvblasltValueError, match="splits K without the COMPUTE_TYPE reduction"):
        _batch_invariant.pinned(launch, "rows")


def test_without_a_database_entry_todays_rule_still_pins(lib, monkeypatch):
    monkeypatch.setattr(_batch_invariant, "heuristics", lambda *args, count: [result_of(lib, algo_with(lib, 11, 2))])
    monkeypatch.setattr(Launch, "check", lambda self, algo: result_of(lib, algo))
    pinned = _batch_invariant.pinned(launch_for(lib, 64, 4096, 4096), "rows")
    assert splits_of(lib, pinned.as_bytes()) == (1, 0)


# ---- the problems and the tuner's reading ---------------------------------------------------------------------
def test_the_invariant_suite_runs_layers_as_nvblaslt_torch_does():
    specs = _tune_suite.invariant_suite(pairs=[(4096, 14336)], epilogs=["RELU_BIAS", "DEFAULT"])
    bias, plain = specs
    assert bias["options"]["batch_invariant"] == "columns" and bias["a"]["shape"] == [4096, 14336]
    assert bias["b"]["strides"] == [1, 14336] and bias["inputs"]["bias"]["shape"] == [4096]
    assert plain["options"]["batch_invariant"] == "rows" and plain["a"]["strides"] == [14336, 1]
    assert len(_tune_suite.invariant_suite()) == 3 * len(_tune_suite.dense_pairs())
    assert _invariant_tune.token_axes(bias, "columns") == ("b", 1)
    assert _invariant_tune.token_axes(plain, "rows") == ("a", 0)
    column_major = {**plain, "a": {**plain["a"], "strides": [1, 1024]}}  # the tokens not outermost
    assert _invariant_tune.token_axes(column_major, "rows") is None
    with pytest.raises(nvblaslt.NvblasltValueError, match="epilogs: unknown"):
        _tune_suite.invariant_suite(epilogs=["DGELU"])
    with pytest.raises(nvblaslt.NvblasltValueError, match="pairs: expected"):
        _tune_suite.invariant_suite(pairs=[(4096, 0)])


def test_the_command_lists_the_batch_invariant_problems(capsys):
    assert _tune.main(["--batch-invariant", "--pairs", "4096x4096,8192x1024", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"batch-invariant N={n} K={k} {e} bf16" for n, k in ((4096, 4096), (8192, 1024))
                     for e in _tune_suite.INVARIANT_EPILOGS]


def test_a_prefix_of_tokens_is_cut_from_either_layout():
    itemsize, tokens = 2, 3
    # contiguous: one line per token (D's columns, column-major): the first lines
    raw = bytes(range(12))
    assert _invariant_ladder.prefix(raw, True, tokens, 2, itemsize) == raw[:8]
    # strided: ``tokens`` elements of every line (D's rows, column-major): the first elements of each line
    raw = b"".join(bytes([10 * j + t, 0]) for j in range(4) for t in range(tokens))
    assert _invariant_ladder.prefix(raw, False, tokens, 2, itemsize) == b"".join(
        bytes([10 * j + t, 0]) for j in range(4) for t in range(2))
    assert _invariant_ladder.prefix(raw, False, tokens, tokens, itemsize) == raw
    assert _invariant_tune.is_contiguous({"ORDER": 0}, "n") and not _invariant_tune.is_contiguous({"ORDER": 0}, "m")
