"""The batch-invariant ladder (issue 35) without a GPU: which member serves each range of M, on simulated
timings; classes from stand-in bits (a member whose bits change is dropped, a family that disagrees is
split and one class kept); the ladder's round trip through the database and its recall per M; an older
single-pin entry still serving every M; ``tune show`` / ``diff`` / ``merge`` of ladders."""

from __future__ import annotations

import json
import random
import re

import pytest

import nvblaslt
from nvblaslt import _batch_invariant, _invariant_choice, _invariant_ladder, _tune, _tuning_db
from nvblaslt._duel import Contestant
from nvblaslt._launch import Launch
from nvblaslt._tuning_db import TuningDatabase
from tests.cpu.test_tuning_batch_invariant import DRIVER, algo_with, isolated, launch_for, result_of  # noqa: F401
from tests.fakes import on_grid as spread, simulated_timer



def on_grid(values: dict) -> dict:
    return spread(values, _invariant_choice.SPEED_M)


# speed × the default at each M of SPEED_M: three kernels of one class, each fast at one end or the middle
SMALL = on_grid({1: 1.05, 16: 1.02, 64: 0.97, 256: 0.55, 1024: 0.40, 8192: 0.38})
MIDDLE = on_grid({1: 0.80, 16: 0.90, 64: 1.00, 256: 1.02, 1024: 0.75, 8192: 0.78})
LARGE = on_grid({1: 0.30, 16: 0.35, 64: 0.55, 256: 0.90, 1024: 0.99, 8192: 1.00})


# ---- one class's ladder ---------------------------------------------------------------------------------------
def test_each_m_gets_the_fastest_member_and_the_ranges_between_go_to_the_point_above():
    speeds = {"small": SMALL, "middle": MIDDLE, "large": LARGE}
    found = _invariant_ladder.ladder(list(speeds), speeds)
    assert found.rungs == ((16, "small"), (256, "middle"), (None, "large"))
    assert found.speed == on_grid({1: 1.05, 16: 1.02, 64: 1.00, 256: 1.02, 1024: 0.99, 8192: 1.00})
    # M between two points runs the member chosen at the point above; beyond the last, the last one's
    assert [found.serving(m) for m in (1, 2, 16, 17, 64, 65, 256, 257, 1024, 8192, 100_000)] == [
        "small", "small", "small", "middle", "middle", "middle", "middle", "large", "large", "large", "large"]
    # better than any single member on the max-min objective
    assert _invariant_choice.score(found.speed) > max(_invariant_choice.score(s) for s in speeds.values())


def test_a_member_stays_while_within_keep_within_of_the_fastest():
    near = {m: r * (1 - _invariant_ladder.KEEP_WITHIN / 2) for m, r in MIDDLE.items()}
    speeds = {"middle": MIDDLE, "near": {**near, 1: 1.2}}  # "near" is faster at M = 1, within 0.5 % later on
    found = _invariant_ladder.ladder(list(speeds), speeds)
    assert found.rungs == ((None, "near"),)  # noise-sized gains do not switch kernels
    assert _invariant_ladder.ladder(["middle"], speeds).rungs == ((None, "middle"),)


# ---- classes ---------------------------------------------------------------------------------------------------
def test_a_member_whose_bits_change_with_m_is_dropped_even_where_fastest():
    speeds = {"small": SMALL, "middle": MIDDLE, "large": LARGE,
              "fastest everywhere": {m: 1.2 for m in SMALL}}
    outcome = _invariant_ladder.build(speeds, lambda name: None if name == "fastest everywhere" else (1, 0, "a"))
    assert outcome.dropped == ["fastest everywhere"]
    assert outcome.ladder is not None and "fastest everywhere" not in dict(map(reversed, outcome.ladder.rungs))
    assert outcome.ladder.rungs == ((16, "small"), (256, "middle"), (None, "large"))
    assert outcome.reference == "middle"  # the class's best single kernel: the entry's algo


def test_a_family_that_disagrees_is_split_into_classes_and_one_is_kept():
    speeds = {"small": SMALL, "middle": MIDDLE, "large": LARGE,
              "split small": {m: r * 1.1 for m, r in SMALL.items()}, "split large": {m: 1.0 for m in SMALL}}
    bits = {"small": (1, 0, "a"), "middle": (1, 0, "b"), "large": (1, 0, "a"),  # split-K 1: two classes
            "split small": (4, 2, "c"), "split large": (4, 2, "c")}  # split-K 4: one class
    outcome = _invariant_ladder.build(speeds, bits.__getitem__)
    assert sorted(sorted(c["members"]) for c in outcome.classes) == [["large", "small"], ["middle"],
                                                                     ["split large", "split small"]]
    assert outcome.ladder is not None and {name for _, name in outcome.ladder.rungs} == {"split small",
                                                                                          "split large"}
    # without the split family, the better of the two split-K 1 classes: small + large (its worst is 0.97 at 64
    # against middle's 0.80 at M = 1), never a ladder that mixes the two
    del speeds["split small"], speeds["split large"]
    outcome = _invariant_ladder.build(speeds, bits.__getitem__)
    assert outcome.ladder is not None and outcome.ladder.rungs == ((64, "small"), (None, "large"))
    assert outcome.ladder.speed[64] == 0.97 and outcome.reference in ("small", "large")
    assert _invariant_ladder.build(speeds, lambda name: None).ladder is None


def test_timed_in_interleaved_rounds_on_a_simulated_gpu_the_ladder_takes_each_ends_specialist():
    costs = {name: on_grid(ms) for name, ms in {
        "default": {1: 1.0, 16: 1.0, 64: 1.0, 256: 2.0, 1024: 4.0, 8192: 30.0},
        "small tile": {1: 0.95, 16: 0.97, 64: 1.02, 256: 3.5, 1024: 9.0, 8192: 80.0},
        "large tile": {1: 2.5, 16: 2.5, 64: 2.0, 256: 2.0, 1024: 4.0, 8192: 30.5},
        "changes bits": {8192: 0.5}}.items()}
    running = {"ms": 0.0}
    timer = simulated_timer(lambda: running["ms"], random.Random(5), noise=0.02)(0, 0)

    def contestants_at(m, names):
        return [Contestant(name, lambda name=name: running.update(ms=costs[name][m])) for name in ["default", *names]]
    screened = _invariant_choice.table(timer, contestants_at, ["small tile", "large tile", "changes bits"], 1)
    names = _invariant_ladder.timed_finalists(screened)
    assert set(names) == {"small tile", "large tile", "changes bits"}
    timed = _invariant_choice.table(timer, contestants_at, names, rounds=7)
    outcome = _invariant_ladder.build(timed, lambda name: None if name == "changes bits" else "one class")
    assert outcome.ladder is not None and outcome.ladder.rungs == ((64, "small tile"), (None, "large tile"))
    assert min(outcome.ladder.speed.values()) > 0.9


def test_the_finalists_add_each_ms_fastest_to_the_best_all_rounders():
    screened = {f"all-rounder {i}": {m: 0.8 - i / 100 for m in SMALL} for i in range(8)}
    screened["decode only"] = {**{m: 0.1 for m in SMALL}, 1: 1.1}
    names = _invariant_ladder.timed_finalists(screened, keep=["all-rounder 7"])
    assert names[:_invariant_choice.FINALISTS] == [f"all-rounder {i}" for i in range(_invariant_choice.FINALISTS)]
    assert "decode only" in names and "all-rounder 7" in names
    assert set(_invariant_choice.SPEED_M) <= set(_invariant_ladder.VERIFY_M)
    assert {m + 1 for m in _invariant_choice.SPEED_M[:-1]} <= set(_invariant_ladder.VERIFY_M)  # each range's ends


# ---- the database ------------------------------------------------------------------------------------------------
def ladder_entry(lib, launch, tiles=((16, 11), (256, 22), (None, 33)), reference=22):
    rungs = [{"up_to": bound, "source": f"tile {tile}",
              **_tuning_db.algorithm_fields(result_of(lib, algo_with(lib, tile)))} for bound, tile in tiles]
    return _batch_invariant.pinned_entry(launch, "rows", result_of(lib, algo_with(lib, reference)), ladder=rungs,
                                         source=f"tile {reference}", speed={"1": 1.0})


def write(tmp_path, launch, entries: dict, name="pins.jsonl"):
    description = _batch_invariant.pinned_key(launch, "rows")[1]
    fingerprint = _tuning_db.fingerprint_of(description["gpu"], description["cublaslt"], DRIVER)
    TuningDatabase(fingerprint, entries).write(tmp_path / name)
    return tmp_path / name


def test_a_ladder_round_trips_and_each_m_recalls_its_rung(lib, monkeypatch, tmp_path):
    launch = launch_for(lib, 64, 4096, 4096)
    key, entry = ladder_entry(lib, launch)
    monkeypatch.setattr(_batch_invariant, "heuristics", lambda *args, count: pytest.fail("the database has it"))
    checked_at = []
    monkeypatch.setattr(Launch, "check", lambda self, algo: checked_at.append(self.layouts[3].get("ROWS")) or
                        result_of(lib, algo))
    loaded = nvblaslt.load_tuning(write(tmp_path, launch, {key: entry}))
    assert loaded.entries[key]["ladder"][0]["up_to"] == 16
    tiles = {m: _batch_invariant.pinned(launch_for(lib, m, 4096, 4096), "rows").algorithm.get("TILE_ID")
             for m in (1, 16, 17, 256, 257, 8192, 40000)}
    assert tiles == {1: 11, 16: 11, 17: 22, 256: 22, 257: 33, 8192: 33, 40000: 33}
    assert checked_at == [1, 16, 17, 256, 257, 8192, 40000]  # each plan re-checks its rung at its own M


def test_a_rung_cublaslt_refuses_at_this_m_is_refused_never_replaced(lib, monkeypatch, tmp_path):
    launch = launch_for(lib, 64, 4096, 4096)
    key, entry = ladder_entry(lib, launch)
    monkeypatch.setattr(_batch_invariant, "heuristics", lambda *args, count: pytest.fail("no other kernel"))
    monkeypatch.setattr(Launch, "check", lambda self, algo: None if self.layouts[3].get("ROWS") == 100 else
                        result_of(lib, algo))
    nvblaslt.load_tuning(write(tmp_path, launch, {key: entry}))
    with pytest.raises(nvblaslt.NvblasltUnsupportedError, match=r"batch_invariant: .*tuning database's ladder.* "
                                                                r"at M = 100"):
        _batch_invariant.pinned(launch_for(lib, 100, 4096, 4096), "rows")


def test_an_older_single_pin_entry_still_serves_every_m(lib, monkeypatch, tmp_path):
    launch = launch_for(lib, 64, 4096, 4096)
    key, _ = _batch_invariant.pinned_key(launch, "rows")
    old = {"kind": "pinned", "algo": bytes(algo_with(lib, 44)).hex(), "source": "heuristics at M=64 #2",
           "speed": {"1": 0.8}, "stored": 1.0}
    path = write(tmp_path, launch, {key: old})
    header = json.loads(path.read_text().splitlines()[0])
    assert header["version"] == 1  # the format did not change: a ladder is an optional field of a pinned entry
    monkeypatch.setattr(Launch, "check", lambda self, algo: result_of(lib, algo))
    nvblaslt.load_tuning(path)
    assert {_batch_invariant.pinned(launch_for(lib, m, 4096, 4096), "rows").algorithm.get("TILE_ID")
            for m in (1, 31, 300, 8192)} == {44}
    assert _tuning_db.pinned_algo(old, 5) == (old["algo"], None)


def refused_on_load(tmp_path, entry: dict, fault: str) -> None:
    """A database of ``entry`` alone is refused where loaded, with ``fault`` (a regex) after its file and line."""
    fingerprint = {"gpu": "G", "cc": [9, 0], "sms": 1, "driver": 1, "cublaslt": [13, 1, 0], "keys": 1}
    path = tmp_path / "bad.jsonl"
    TuningDatabase(fingerprint, {"ab" * 20: entry}).write(path)
    with pytest.raises(nvblaslt.NvblasltValueError, match=f"bad.jsonl: line 2: {fault}"):
        nvblaslt.load_tuning(path)


@pytest.mark.parametrize("ladder, fault", [
    ([], "ladder: expected a list of 1 to"),
    ("rungs", "ladder: expected a list"),
    ([{"up_to": None, "algo": "ab"}], r"ladder\[0\]: expected an object with algo"),
    ([{"up_to": 16, "algo": "ab" * 64}], r"ladder\[0\].up_to: expected null"),
    ([{"up_to": 16, "algo": "ab" * 64}, {"up_to": 16, "algo": "ab" * 64}, {"up_to": None, "algo": "ab" * 64}],
     r"ladder\[1\].up_to: expected an int above 16"),
    ([{"up_to": True, "algo": "ab" * 64}, {"up_to": None, "algo": "ab" * 64}], r"ladder\[0\].up_to: expected an int"),
])
def test_a_corrupt_ladder_is_refused_by_name_and_line(tmp_path, ladder, fault):
    refused_on_load(tmp_path, {"kind": "pinned", "algo": "cd" * 64, "ladder": ladder}, fault)
    refused_on_load(tmp_path, {"kind": "tuned", "algo": "cd" * 64, "ladder": ladder}, "ladder: only a 'pinned' entry")


def test_show_diff_and_merge_handle_ladders(lib, tmp_path, capsys):
    launch = launch_for(lib, 64, 4096, 4096)
    key, entry = ladder_entry(lib, launch)
    _, other = ladder_entry(lib, launch, tiles=((64, 11), (None, 33)))
    first = write(tmp_path, launch, {key: entry}, "first.jsonl")
    second = write(tmp_path, launch, {key: {**other, "stored": entry["stored"] + 1}}, "second.jsonl")
    assert _tune.main(["show", str(first)]) == 0
    shown = capsys.readouterr().out
    assert re.search(r"ladder: M ≤ 16: [^;]*tile_id 11; M ≤ 256: [^;]*tile_id 22; M > 256: [^;]*tile_id 33\n",
                     shown)
    assert _tune.main(["diff", str(first), str(first)]) == 0
    assert capsys.readouterr().out.strip() == "the same choices"
    assert _tune.main(["diff", str(first), str(second)]) == 1  # the same algo, another ladder: another choice
    changed = capsys.readouterr().out
    assert changed.startswith("~ ") and re.search(r"-> pinned .*M ≤ 64: [^;]*tile_id 11; M > 64", changed)
    assert _tune.main(["merge", str(first), str(second), "-o", str(tmp_path / "merged.jsonl")]) == 0
    merged = _tuning_db.read(tmp_path / "merged.jsonl")
    assert merged.entries[key]["ladder"] == other["ladder"]  # the newer entry, ladder and all


def test_the_progress_line_shows_the_ladder_and_the_single_kernel():
    entry = {"kind": "pinned", "ladder": [{}, {}], "source": "x", "speed": {"1": 1.01, "8192": 0.99},
             "single_speed": {"1": 0.8, "8192": 0.99}, "today_speed": {"1": 0.4, "8192": 1.0}}
    assert _tune._shown(entry) == ("ladder of 2: × the default at M 1:1.01 8192:0.99; best single kernel "
                                   "1:0.80 8192:0.99; today's pin 1:0.40 8192:1.00")


# ---- the tuner's bit check, on a stand-in problem -------------------------------------------------------------
class StandInProblem:
    """The part of ``_invariant_tune._Problem`` that ``_bits`` reads: D's first tokens per M (columns of a
    column-major D, 4 outputs each, bf16), changed at ``changes_at`` for the algorithm ``changing``."""

    extent, itemsize = "n", 2

    def __init__(self, lib, changing: bytes | None = None, changes_at: int = 0, refused_at: int = 0):
        self.reference = type("Reference", (), {"lib": lib})()
        self.lib, self.changing, self.changes_at, self.refused_at = lib, changing, changes_at, refused_at

    def layout(self, m):
        return {"ROWS": 4, "COLS": m, "LD": 4, "ORDER": 0}

    def checked(self, m, algo):
        api = self.lib.api
        return None if m == self.refused_at else result_of(self.lib, api.cublasLtMatmulAlgo_t.from_buffer_copy(algo))

    def outputs(self, m, result, tokens):
        flip = result.as_bytes() == self.changing and m == self.changes_at
        return b"".join(bytes([t % 256, (t // 256) ^ flip] * 4) for t in range(tokens))


def test_the_tuners_bit_check_keys_a_class_and_drops_a_kernel_whose_tokens_change(lib):
    from nvblaslt import _invariant_tune

    steady, split = bytes(algo_with(lib, 11)), _invariant_choice.with_split(lib, bytes(algo_with(lib, 11)), 4)
    assert split is not None
    key = _invariant_tune._bits(StandInProblem(lib), steady)
    assert key is not None and key[:2] == (1, 0)
    assert _invariant_tune._bits(StandInProblem(lib), bytes(algo_with(lib, 22))) == key  # same bits: one class
    split_key = _invariant_tune._bits(StandInProblem(lib), split)
    assert split_key is not None and split_key[:2] == (4, int(lib.api.CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE))
    for m in (2, 17, 257, 1025):  # a range's boundary too
        assert _invariant_tune._bits(StandInProblem(lib, steady, changes_at=m), steady) is None, m
    assert _invariant_tune._bits(StandInProblem(lib, refused_at=65), steady) is None
