"""options.batch_invariant (issue 35): one algorithm pinned per problem with M left out, split-K off,
re-checked for every M, refused clearly where cuBLASLt does not accept it. No GPU: a stand-in launch
over real descriptors of the installed libcublasLt; the heuristics and cuBLASLt's check are answered by
the test."""

from __future__ import annotations

import random
import types

import pytest

import nvblaslt
from nvblaslt import Algorithm, HeuristicResult, MatmulDesc, MatmulPreference, MatrixLayout, _autotune
from nvblaslt import _batch_invariant, _search, _tuning_cache, _tuning_db
from nvblaslt._launch import Launch
from nvblaslt._tuning_db import TuningDatabase
from tests.cpu.test_autotune import StandInPlan
from tests.cpu.test_tuning_cache import GPU
from tests.fakes import simulated_timer

DRIVER = 13000


@pytest.fixture(autouse=True)
def isolated(monkeypatch):
    monkeypatch.setattr(_tuning_cache, "gpu_identity", lambda device: GPU)
    monkeypatch.setattr(_tuning_db, "_driver", lambda: DRIVER)
    monkeypatch.setattr(_batch_invariant, "_pins", {})
    nvblaslt.unload_tuning()
    yield
    nvblaslt.unload_tuning()


def launch_for(lib, m, n, k, *, transposed=False, transa=0):
    """A Launch of D (m×n) = op(A) (m×k) · B (k×n), column-major, over real descriptors (NULL handle)."""
    api = lib.api
    desc = MatmulDesc(api.CUBLAS_COMPUTE_32F, api.CUDA_R_32F, lib=lib)
    desc.set("TRANSA", transa)
    a = MatrixLayout(api.CUDA_R_16BF, k, m, k, lib=lib) if transa else MatrixLayout(api.CUDA_R_16BF, m, k, m, lib=lib)
    b = MatrixLayout(api.CUDA_R_16BF, k, n, k, lib=lib)
    c = MatrixLayout(api.CUDA_R_16BF, m, n, m, lib=lib)
    d = MatrixLayout(api.CUDA_R_16BF, m, n, m, lib=lib)
    preference = MatmulPreference(max_workspace_bytes=1 << 20, lib=lib)
    problem = types.SimpleNamespace(m=m, n=n, k=k, transposed=transposed,
                                    describe=lambda: f"({m}×{k} @ {k}×{n}, bfloat16)")
    return Launch(lib, problem, types.SimpleNamespace(handle=None), desc, [a, b, c, d], preference,
                  workspace_limit=1 << 20, device=0, alpha=None, beta=None)


def pinned_key(launch, which="rows"):
    extent = _batch_invariant.varying(launch.problem, which)
    description = _batch_invariant.pinned_description(_tuning_cache.problem_description(launch), extent)
    return _tuning_cache.problem_key(description), description


def result_of(lib, algo, workspace=0):
    raw = lib.api.cublasLtMatmulHeuristicResult_t()
    raw.algo, raw.workspaceSize = algo, workspace
    return HeuristicResult(raw, lib)


def algo_with(lib, algo_id, split_k=1):
    algo = lib.api.cublasLtMatmulAlgo_t()
    algorithm = Algorithm(algo, lib)
    algorithm.set("TILE_ID", algo_id)
    algorithm.set("SPLITK_NUM", split_k)
    return algo


# ---- the pinned key ----------------------------------------------------------------------------------------
def test_the_pinned_key_leaves_out_m_and_only_m(lib):
    key, description = pinned_key(launch_for(lib, 1, 4096, 4096))
    assert description["layouts"][3]["ROWS"] == "*" and description["layouts"][3]["LD"] == "*"
    assert description["layouts"][0]["ROWS"] == "*" and description["layouts"][1]["ROWS"] == 4096  # B is K×N
    for m in (7, 31, 64, 300, 8192):
        assert pinned_key(launch_for(lib, m, 4096, 4096))[0] == key, m
    assert pinned_key(launch_for(lib, 1, 1024, 4096))[0] != key  # another N
    assert pinned_key(launch_for(lib, 1, 4096, 8192))[0] != key  # another K
    # the key of a tuned choice is another: a pin is never taken for a tuned pick or the other way round
    assert key != _tuning_cache.problem_key(_tuning_cache.problem_description(launch_for(lib, 1, 4096, 4096)))


def test_m_equal_to_k_does_not_merge_keys(lib):
    # the extent is found by its place in the layouts, not by its value
    assert pinned_key(launch_for(lib, 1024, 4096, 1024))[0] != pinned_key(launch_for(lib, 4096, 4096, 4096))[0]


def test_columns_and_the_transposed_problem_pick_the_other_extent(lib):
    assert _batch_invariant.varying(types.SimpleNamespace(transposed=False), "rows") == "m"
    assert _batch_invariant.varying(types.SimpleNamespace(transposed=True), "rows") == "n"
    assert _batch_invariant.varying(types.SimpleNamespace(transposed=False), "columns") == "n"
    keys = {pinned_key(launch_for(lib, 4096, n, 4096), "columns")[0] for n in (1, 5, 300)}
    assert len(keys) == 1
    _, description = pinned_key(launch_for(lib, 4096, 5, 4096, transa=1), "columns")
    assert description["layouts"][1]["COLS"] == "*" and description["layouts"][0]["COLS"] == 4096


# ---- choosing and applying the pin -------------------------------------------------------------------------
def test_the_pin_is_the_first_pick_accepted_at_every_reference_m_with_split_k_off(lib, monkeypatch):
    offered = [result_of(lib, algo_with(lib, 11, split_k=4)), result_of(lib, algo_with(lib, 22, split_k=3))]
    monkeypatch.setattr(_batch_invariant, "heuristics", lambda *args, count: offered)
    asked_at = []

    def check(self, algo):
        rows = self.layouts[3].get("ROWS")
        asked_at.append((Algorithm(algo, lib).get("TILE_ID"), rows))
        if Algorithm(algo, lib).get("TILE_ID") == 11 and rows == 1:
            return None  # the first pick is refused for a single row
        return result_of(lib, algo)
    monkeypatch.setattr(Launch, "check", check)
    launch = launch_for(lib, 300, 4096, 4096)
    result = _batch_invariant.pinned(launch, "rows")
    assert result.algorithm.get("TILE_ID") == 22 and result.algorithm.get("SPLITK_NUM") == 1
    assert result.algorithm.get("REDUCTION_SCHEME") == 0
    assert {rows for algo_id, rows in asked_at} == {1, 7, 1024, 300}  # the references, then this plan's M
    # the next plan of the problem, at another M, runs the same pin without asking the heuristics again
    monkeypatch.setattr(_batch_invariant, "heuristics", lambda *args, count: pytest.fail("chosen again"))
    assert _batch_invariant.pinned(launch_for(lib, 5, 4096, 4096), "rows").as_bytes() == result.as_bytes()


def test_a_pin_cublaslt_refuses_for_this_m_is_refused_clearly(lib, monkeypatch):
    monkeypatch.setattr(_batch_invariant, "heuristics", lambda *args, count: [result_of(lib, algo_with(lib, 11))])
    monkeypatch.setattr(Launch, "check", lambda self, algo: None if self.layouts[3].get("ROWS") == 3000 else
                        result_of(lib, algo))
    _batch_invariant.pinned(launch_for(lib, 16, 4096, 4096), "rows")
    with pytest.raises(nvblaslt.NvblasltUnsupportedError, match=r"batch_invariant: .* at M = 3000"):
        _batch_invariant.pinned(launch_for(lib, 3000, 4096, 4096), "rows")


def test_no_algorithm_without_split_k_is_refused_clearly(lib, monkeypatch):
    monkeypatch.setattr(_batch_invariant, "heuristics", lambda *args, count: [result_of(lib, algo_with(lib, 11))])
    monkeypatch.setattr(Launch, "check", lambda self, algo: None)  # no GPU: cuBLASLt's check refuses everything
    with pytest.raises(nvblaslt.NvblasltUnsupportedError, match="no algorithm .* without split-K"):
        _batch_invariant.pinned(launch_for(lib, 16, 4096, 4096), "rows")


def test_a_database_pin_wins_and_one_that_splits_k_is_refused(lib, monkeypatch, tmp_path):
    launch = launch_for(lib, 64, 4096, 4096)
    key, description = pinned_key(launch)
    fingerprint = _tuning_db.fingerprint_of(description["gpu"], description["cublaslt"], DRIVER)
    monkeypatch.setattr(_batch_invariant, "heuristics", lambda *args, count: pytest.fail("the database has it"))
    monkeypatch.setattr(Launch, "check", lambda self, algo: result_of(lib, algo))
    TuningDatabase(fingerprint, {key: {"kind": "pinned", "algo": bytes(algo_with(lib, 33)).hex()}}).write(
        tmp_path / "db.jsonl")
    nvblaslt.load_tuning(tmp_path / "db.jsonl")
    assert _batch_invariant.pinned(launch, "rows").algorithm.get("TILE_ID") == 33
    TuningDatabase(fingerprint, {key: {"kind": "pinned", "algo": bytes(algo_with(lib, 33, split_k=2)).hex()}}).write(
        tmp_path / "db.jsonl")
    nvblaslt.load_tuning(tmp_path / "db.jsonl")
    with pytest.raises(nvblaslt.NvblasltValueError, match="splits K"):
        _batch_invariant.pinned(launch, "rows")


def test_autotune_times_only_the_pin_of_a_batch_invariant_plan(monkeypatch):
    plan = StandInPlan([7], {7: 1.0})
    plan._options = nvblaslt.MatmulOptions(batch_invariant=True)
    monkeypatch.setattr(_autotune, "Timer", simulated_timer(lambda: 1.0, random.Random(0), noise=0.0, drift=0.0))
    monkeypatch.setattr(_search, "candidates", lambda *a, **k: pytest.fail("searched"))
    timings = _autotune.autotune(plan, iterations=2, search=True, remember=True, stream=None)
    assert [r.algorithm.id for r, _ in timings] == [7] and not plan.tuning_report.searched


def test_options_take_the_switch_and_refuse_other_values():
    assert nvblaslt.MatmulOptions(batch_invariant=True).batch_invariant == "rows"
    assert nvblaslt.MatmulOptions(batch_invariant="columns").batch_invariant == "columns"
    assert nvblaslt.MatmulOptions(batch_invariant=None).batch_invariant is False
    with pytest.raises(nvblaslt.NvblasltTypeError, match="options.batch_invariant: expected False, True"):
        nvblaslt.MatmulOptions(batch_invariant="M")
