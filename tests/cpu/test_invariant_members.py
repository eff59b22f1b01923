"""A batch-invariant ladder's verified members (issue 35) without a GPU: the entry format (round trip, old
entries load, corrupt members refused by name and line), the member-or-rung rule at plan time (stand-in
heuristics: the default plan's own pick for the plan's M runs where it is a verified member, the rung
otherwise), and the tune's part that finds the members (stand-in bits and picks) and says how far a split
count's workspace reaches."""

from __future__ import annotations

import pytest

import nvblaslt
from nvblaslt import _batch_invariant, _invariant_choice, _invariant_ladder, _invariant_tune, _tuning_db
from nvblaslt._errors import CublasLtError
from nvblaslt._launch import Launch
from nvblaslt._tuning_db import TuningDatabase
from tests.cpu.test_tuning_batch_invariant import DRIVER, algo_with, isolated, launch_for, result_of  # noqa: F401
from tests.cpu.test_tuning_invariant_ladder import StandInProblem, ladder_entry, refused_on_load, write

RUNG_TILES = ((16, 11), (256, 22), (None, 33))  # ladder_entry's rungs: M ≤ 16, ≤ 256, above


def kernel(lib, tile: int, split_k: int = 1):
    """A stand-in algorithm; one that splits K sums its parts with the COMPUTE_TYPE reduction (a split pin's)."""
    algo = algo_with(lib, tile, split_k)
    if split_k > 1:
        from nvblaslt import Algorithm

        Algorithm(algo, lib).set("REDUCTION_SCHEME", int(lib.api.CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE))
    return algo


def member(lib, tile: int, split_k: int = 1) -> dict:
    return _tuning_db.algorithm_fields(result_of(lib, kernel(lib, tile, split_k)))


def with_members(lib, launch, tiles=(11, 22, 33, 55)) -> tuple[str, dict]:
    key, entry = ladder_entry(lib, launch)
    return key, {**entry, "members": [member(lib, tile) for tile in tiles]}


@pytest.fixture
def picks(lib, monkeypatch):
    """The stand-in heuristics: {M: the tile they pick, or (tile, split count)} (absent: they offer
    nothing), and each query's preference mask; cuBLASLt's check accepts everything but what ``refused``
    names."""
    picked: dict[int, int | tuple[int, int]] = {}
    masks: list[int] = []
    refused: set[tuple[int, int]] = set()  # (M, tile)

    def heuristics(handle, desc, a, b, c, d, preference, count):
        masks.append(preference.get("REDUCTION_SCHEME_MASK"))
        tile = picked.get(d.get("ROWS"))
        if tile is None:
            raise CublasLtError("cublasLtMatmulAlgoGetHeuristic", 15, "CUBLAS_STATUS_NOT_SUPPORTED", "", "")
        return [result_of(lib, kernel(lib, *tile) if isinstance(tile, tuple) else kernel(lib, tile))]

    def check(self, algo):
        from nvblaslt import Algorithm

        return None if (self.layouts[3].get("ROWS"), Algorithm(algo, lib).get("TILE_ID")) in refused else \
            result_of(lib, algo)
    monkeypatch.setattr(_batch_invariant, "heuristics", heuristics)
    monkeypatch.setattr(Launch, "check", check)
    return picked, masks, refused


def tile_run_at(lib, m: int) -> int:
    return _batch_invariant.pinned(launch_for(lib, m, 4096, 4096), "rows").algorithm.get("TILE_ID")


# ---- the entry format ---------------------------------------------------------------------------------------------
def test_members_round_trip_and_show_in_the_ladder_and_the_diff(lib, tmp_path):
    launch = launch_for(lib, 64, 4096, 4096)
    key, entry = with_members(lib, launch)
    loaded = nvblaslt.load_tuning(write(tmp_path, launch, {key: entry}))
    assert loaded.entries[key]["members"] == entry["members"]
    assert _tuning_db.member_matching(loaded.entries[key], entry["members"][3]["config"]) == entry["members"][3]["algo"]
    assert _tuning_db.describe_ladder(entry).endswith("(and 4 verified members, run where the heuristics pick one)")
    fewer = TuningDatabase(loaded.fingerprint, {key: {**entry, "members": entry["members"][:3]}})
    assert [line[:2] for line in _tuning_db.diff(loaded, fewer)] == ["~ "]  # other members: another choice


def test_an_entry_without_members_loads_and_runs_its_rungs_without_asking_the_heuristics(lib, tmp_path, picks):
    launch = launch_for(lib, 64, 4096, 4096)
    key, entry = ladder_entry(lib, launch)
    picked, masks, _ = picks
    picked.update({m: 55 for m in (1, 17, 300)})
    nvblaslt.load_tuning(write(tmp_path, launch, {key: entry}))
    assert [tile_run_at(lib, m) for m in (1, 17, 300)] == [11, 22, 33]
    assert masks == []  # no members: nothing to match, no query
    assert _tuning_db.members_of(entry) == [] and "verified members" not in _tuning_db.describe_ladder(entry)


@pytest.mark.parametrize("members, fault", [
    ([], r"members: expected a list of 1 to 256 kernels"),
    ("tile 55", r"members: expected a list"),
    ([{"config": {"TILE_ID": 55}}], r"members\[0\]: expected an object with algo"),
    ([{"algo": "ab" * 64, "config": {}}], r"members\[0\].config: expected an object of config attributes"),
    ([{"algo": "ab" * 64, "config": {"TILE_ID": True}}], r"members\[0\].config: expected"),
    ([{"algo": "ab" * 64, "config": {"TILE_ID": "55"}}], r"members\[0\].config: expected"),
    ([{"algo": "ab" * 64, "config": {"TILE_ID": 5}}, "x"], r"members\[1\]: expected an object with algo"),
])
def test_corrupt_members_are_refused_by_name_and_line(tmp_path, members, fault):
    ladder = [{"up_to": None, "algo": "cd" * 64}]
    refused_on_load(tmp_path, {"kind": "pinned", "algo": "cd" * 64, "ladder": ladder, "members": members}, fault)


def test_members_without_a_ladder_are_refused(tmp_path):
    members = [{"algo": "ab" * 64, "config": {"TILE_ID": 5}}]
    refused_on_load(tmp_path, {"kind": "pinned", "algo": "cd" * 64, "members": members},
                    "members: only a pinned entry with a ladder")


# ---- the member-or-rung rule --------------------------------------------------------------------------------------
def test_the_default_s_own_pick_for_this_m_runs_where_it_is_a_verified_member_else_the_rung(lib, tmp_path, picks):
    launch = launch_for(lib, 64, 4096, 4096)
    key, entry = with_members(lib, launch)
    picked, masks, _ = picks
    picked.update({12: 55, 192: 55, 1536: 55,  # a member between the points: it runs
                   24: 77, 768: 77,  # not a member (never verified): the rung runs
                   48: (55, 4)})  # the default splits K there: another summation order, the rung runs
    nvblaslt.load_tuning(write(tmp_path, launch, {key: entry}))
    tiles = {m: tile_run_at(lib, m) for m in (12, 192, 1536, 24, 768, 48, 40000)}
    assert tiles == {12: 55, 192: 55, 1536: 55, 24: 22, 768: 33, 48: 22, 40000: 33}  # 40000: no pick offered
    # asked as the default plan asks (its own preference: split-K not excluded), so a member is its kernel
    assert masks == [launch.preference.get("REDUCTION_SCHEME_MASK")] * 7
    # the member runs its recorded (verified) bytes
    run = _batch_invariant.pinned(launch_for(lib, 1536, 4096, 4096), "rows")
    assert run.as_bytes().hex() == entry["members"][3]["algo"]


def test_a_member_whose_config_differs_in_any_attribute_is_not_run(lib, tmp_path, picks):
    launch = launch_for(lib, 64, 4096, 4096)
    key, entry = with_members(lib, launch)
    entry["members"][3]["config"] = {**entry["members"][3]["config"], "CTA_SWIZZLING": 1}
    picked, _, _ = picks
    picked[1536] = 55
    nvblaslt.load_tuning(write(tmp_path, launch, {key: entry}))
    assert tile_run_at(lib, 1536) == 33  # tile 55 with swizzling 0 was never verified: the rung


def test_a_member_cublaslt_refuses_at_this_m_leaves_the_rung(lib, tmp_path, picks):
    launch = launch_for(lib, 64, 4096, 4096)
    key, entry = with_members(lib, launch)
    picked, _, refused = picks
    picked[1536] = 55
    refused.add((1536, 55))
    nvblaslt.load_tuning(write(tmp_path, launch, {key: entry}))
    assert tile_run_at(lib, 1536) == 33


def test_a_split_class_runs_a_member_only_where_the_default_splits_k_the_same(lib, tmp_path, picks):
    launch = launch_for(lib, 64, 4096, 4096)
    key, entry = ladder_entry(lib, launch)
    entry["members"] = [member(lib, 11, split_k=4)]
    picked, _, _ = picks
    picked.update({100: (11, 4), 200: 11, 300: (11, 2)})
    nvblaslt.load_tuning(write(tmp_path, launch, {key: entry}))
    assert [tile_run_at(lib, m) for m in (100, 200, 300)] == [11, 22, 33]  # 200 and 300: their rungs


def test_a_member_whose_bytes_are_another_kernel_than_its_config_says_is_not_run(lib, tmp_path, picks):
    """A hand-edited member: its recorded config matches the default's pick, its bytes are another kernel
    (one never verified). The rung runs, not those bytes."""
    launch = launch_for(lib, 64, 4096, 4096)
    key, entry = with_members(lib, launch)
    entry["members"][3] = {**entry["members"][3], "algo": member(lib, 77)["algo"]}  # config: tile 55's
    picked, _, _ = picks
    picked[1536] = 55
    nvblaslt.load_tuning(write(tmp_path, launch, {key: entry}))
    assert tile_run_at(lib, 1536) == 33


def test_a_member_that_splits_k_as_no_pin_may_leaves_the_rung_instead_of_raising(lib, tmp_path, picks,
                                                                                 monkeypatch):
    """A hand-edited member whose split sums in an order that depends on M (INPLACE), where the default
    picks that very kernel: never run, and the call runs the rung (a pin of the class) rather than fail."""
    from nvblaslt import Algorithm

    launch = launch_for(lib, 64, 4096, 4096)
    key, entry = ladder_entry(lib, launch)
    inplace = kernel(lib, 11, split_k=4)
    Algorithm(inplace, lib).set("REDUCTION_SCHEME", int(lib.api.CUBLASLT_REDUCTION_SCHEME_INPLACE))
    entry["members"] = [_tuning_db.algorithm_fields(result_of(lib, inplace))]
    monkeypatch.setattr(_batch_invariant, "default_pick", lambda launch: result_of(lib, inplace))
    nvblaslt.load_tuning(write(tmp_path, launch, {key: entry}))
    assert tile_run_at(lib, 100) == 22


# ---- the tune's part ----------------------------------------------------------------------------------------------
class ClassedProblem(StandInProblem):
    """``StandInProblem`` whose outputs depend on the kernel's class: tile 99's bits are another class's."""

    def outputs(self, m, result, tokens):
        other = result.algorithm.get("TILE_ID") == 99
        return b"".join(bytes([t % 256, (t // 256) ^ other] * 4) for t in range(tokens))


def test_the_tune_keeps_the_picks_whose_bits_are_the_class_s_as_members(lib, monkeypatch):
    problem = ClassedProblem(lib)
    problem.reference = launch_for(lib, 4, 1024, 4096)
    by_m = {m: 55 if m % 3 == 0 else 99 if m % 5 == 0 else 22 for m in _invariant_ladder.MEMBER_M}
    by_m[7] = None  # no pick offered there

    by_m[6] = (55, 2)  # the default splits K there: never a member of a class without split-K

    def default_pick(reference):
        tile = by_m[reference.layouts[3].get("COLS")]
        if tile is None:
            return None
        return result_of(lib, kernel(lib, *tile) if isinstance(tile, tuple) else kernel(lib, tile))
    monkeypatch.setattr(_batch_invariant, "default_pick", default_pick)
    timed = [bytes(algo_with(lib, 11)), bytes(algo_with(lib, 22))]
    class_key = _invariant_tune._bits(problem, timed[0])
    members, member_at = _invariant_tune._members(problem, class_key, timed)
    assert [m["config"]["TILE_ID"] for m in members] == [11, 22, 55]  # one per configuration, 99 left out
    assert member_at == sorted(m for m, tile in by_m.items() if tile in (22, 55))
    assert set(_invariant_ladder.MEMBER_M) >= {12, 24, 48, 96, 192, 384, 768, 1536, 3072, 6144}  # the bench's


def test_a_split_count_refused_for_its_workspace_says_how_far_it_reaches():
    mib = 1 << 20
    ms = _invariant_choice.ACCEPTED_AT
    needs = [(2, {m: m * 4096 * 4 * 2 for m in ms}), (2, {m: m * 4096 * 4 * 2 if m < 4096 else None for m in ms}),
             (4, {m: m * 4096 * 4 * 4 for m in ms})]
    found = _invariant_tune._split_refused(needs, 32 * mib)
    assert found["2"] == {"within_limit_up_to_m": 1024, "limit_mib": 32.0, "mib_at_8192": 256.0,
                          "mib_at_32768": 1024.0}
    assert found["4"]["within_limit_up_to_m"] == 512 and found["4"]["mib_at_8192"] == 512.0
