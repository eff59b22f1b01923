"""GroupedMatmul.autotune's orchestration (``_grouped_tuning``) on a stand-in grouped plan, with simulated
timings: what it leaves in the plan after a refusal at launch, an interruption, a search that switches,
and a stale report. The engine itself (``_autotune``) is tested in test_autotune.py; the GPU runs in
tests/gpu/test_grouped_gpu.py."""

from __future__ import annotations

import contextlib
import ctypes
import random
import types

import pytest

from nvblaslt import GroupedMatmul, _autotune, _cuda, _grouped_tuning, _search, _timing, _tuning_cache
from nvblaslt._errors import CublasLtError
from tests.cpu.test_autotune import LaunchAlgorithms, StandInLaunch
from tests.fakes import simulated_timer


SCRATCH = types.SimpleNamespace(buffer=types.SimpleNamespace(release=lambda: None))  # the result timed runs write


class Algorithm:
    def __init__(self, algo_id: int):
        self.id, self.tile, self.stages = algo_id, "128x128", "AUTO"

    def config(self) -> dict:
        return {"ID": self.id}


class Result:
    def __init__(self, algo_id: int, workspace: int = 0):
        self.algorithm, self.workspace_size = Algorithm(algo_id), workspace

    def as_bytes(self) -> bytes:
        return bytes([self.algorithm.id % 256]) * 64


class StandInGroupedLaunch(StandInLaunch):
    """The grouped plan's Launch (``_protocols.PlannedLaunch``), by its public names."""

    def __init__(self, ids):
        self.algorithms = [Result(i) for i in ids]
        self.algorithm, self.workspace_limit, self.workspace = self.algorithms[0], 1 << 20, 0


class StandInGroupedPlan(LaunchAlgorithms):
    """What ``_grouped_tuning`` and ``GroupedMatmul._apply_tuning`` use of a GroupedMatmul, by the names
    it has; ``speeds`` maps an algorithm id to its true ms, ``refused`` the ids cuBLASLt refuses at launch."""

    def __init__(self, ids, speeds, refused=()):
        self._launch = StandInGroupedLaunch(ids)
        self.tuning_report = None
        self.speeds, self.refused, self.ran = speeds, set(refused), None
        self.device = 0

    def select(self, result):
        if result is not self.algorithm:
            self.tuning_report = None  # as GroupedMatmul.select: the report describes another algorithm
        self._launch.select(result)

    def run(self, bound, *, out, stream, check_offsets, trial=False):
        assert out is SCRATCH and trial, "a timed run must write scratch memory, and never fall back"
        if self.algorithm.algorithm.id in self.refused:
            raise CublasLtError("cublasLtMatmul", 15, "CUBLAS_STATUS_NOT_SUPPORTED", "refused at launch")
        self.ran = self.algorithm.algorithm.id


@pytest.fixture
def simulated(monkeypatch):
    """(make a stand-in plan, what remember stored, the timer's hook): timings simulated with noise and drift."""
    stored, hook = [], {"before": None}
    generator, orders = random.Random(0), random.Random(1)
    monkeypatch.setattr(_timing, "new_shuffler", lambda: random.Random(orders.random()))
    monkeypatch.setattr(_tuning_cache, "remember", lambda plan, result, ms, **facts: stored.append(
        (result.algorithm.id, ms, facts)) or True)
    monkeypatch.setattr(_cuda, "is_capturing", lambda stream: False)
    monkeypatch.setattr(_cuda, "on_device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(_grouped_tuning._memory, "own_allocator", lambda *a: lambda s1, s2: (SCRATCH, 0))
    plans = []

    Timer = simulated_timer(lambda: plans[-1].speeds[plans[-1].ran], generator, drift=0.02,
                            before=lambda calls: hook["before"] and hook["before"](calls))
    monkeypatch.setattr(_autotune, "Timer", Timer)

    def make(ids, speeds, refused=(), pool=()):
        plans.append(StandInGroupedPlan(ids, speeds, refused))
        monkeypatch.setattr(_search, "candidates", lambda launch, **kw: iter([Result(i) for i in pool]))
        return plans[-1]
    return make, stored, hook


def _tune(plan, **kw):
    bound = types.SimpleNamespace(problem=types.SimpleNamespace(out_shape=(4, 4), out_strides=(4, 1),
                                                           d=types.SimpleNamespace(dtype=None)))
    result = _grouped_tuning.autotune(plan, bound, 7, iterations=3, remember=True, budget_s=2.0, **kw)
    return GroupedMatmul._apply_tuning(plan, result)  # the real plan's way of applying it


def test_a_refused_algorithm_leaves_the_plans_list_and_the_fastest_is_selected(simulated):
    make, stored, _ = simulated
    plan = make([1, 2, 3], {1: 2.0, 2: 1.5, 3: 1.0}, refused={3})
    timings = _tune(plan, search=False)
    assert [r.algorithm.id for r, _ in timings] == [2, 1]
    assert plan.algorithm is timings[0][0] and [r.algorithm.id for r in plan.algorithms] == [2, 1]
    assert stored == [(2, timings[0][1], {})] and not plan.tuning_report.searched


def test_an_interruption_leaves_the_plan_as_it_was_and_raises_itself(simulated):
    make, stored, hook = simulated
    plan = make([1, 2, 3], {1: 2.0, 2: 1.5, 3: 1.0}, refused={3})
    planned, chosen = list(plan.algorithms), plan.algorithm

    def interrupt(calls):
        if calls == 4:
            raise KeyboardInterrupt
    hook["before"] = interrupt
    with pytest.raises(KeyboardInterrupt):
        _tune(plan, search=False)
    assert plan.algorithms == planned and plan.algorithm is chosen and stored == []


def test_a_search_switches_to_a_clearly_faster_candidate_and_remembers_how_sure(simulated):
    make, stored, _ = simulated
    plan = make([1, 2], {1: 1.0, 2: 1.2, 100: 0.8, 101: 1.3}, pool=[100, 101])
    timings = _tune(plan, search=True)
    report = plan.tuning_report
    assert report.searched and report.switched and plan.algorithm.algorithm.id == 100
    assert timings[0][0] is plan.algorithm and [r.algorithm.id for r in plan.algorithms] == [100, 1, 2]
    assert stored[-1][0] == 100 and set(stored[-1][2]) == {"confidence", "switched"}


def test_a_search_starts_from_autotunes_pick_only_while_the_plan_still_runs_it(simulated):
    make, _, _ = simulated
    plan = make([1, 2], {1: 1.0, 2: 1.2, 100: 1.0}, pool=[100])
    _tune(plan, search=False)
    _tune(plan, search=True)
    assert plan.tuning_report.heuristics == 1  # autotune's pick, not the list timed again
    _tune(plan, search=False)
    plan.select(plan.algorithms[1])  # the caller runs another: autotune's report no longer describes the plan
    _tune(plan, search=True)
    assert plan.tuning_report.heuristics == 2  # the list timed again, not the other one taken for autotune's pick


def test_select_takes_the_plans_own_results_and_a_failed_workspace_leaves_the_plan_whole(monkeypatch):
    """``GroupedMatmul.select``: a planned algorithm or one its ``check()`` accepted within the workspace
    limit (the search's candidates), run with what cuBLASLt said of it here; anything else refused by
    name. A workspace that cannot be made leaves the old one in place."""
    from nvblaslt import _grouped, _launch
    from nvblaslt._errors import NvblasltTypeError, NvblasltValueError

    class Buffer:
        def __init__(self, size, stream):
            if size > 1 << 20:
                raise MemoryError("out of device memory")
            self.size, self.released = size, False

        def release(self):
            self.released = True

    monkeypatch.setattr(_launch, "DeviceBuffer", Buffer)
    monkeypatch.setattr(_launch, "raw_function", lambda function: None)
    launch = _launch.Launch(types.SimpleNamespace(cublasLtMatmul=None), None, None, None, [], None,
                            workspace_limit=1 << 20, device=0, alpha=None, beta=None)
    launch._build_arguments = lambda: None  # type: ignore[method-assign]  # no descriptors: nothing runs
    plan = _grouped.GroupedMatmul.__new__(_grouped.GroupedMatmul)  # without the GPU: the state select() reads
    planned, searched, evicted = Result(1, 256), Result(100, 4096), Result(101, 512)
    launch.offer([planned])
    plan._launch, plan._freed, plan._checked = launch, False, {searched.as_bytes(): searched}
    plan._captured, plan._last_stream = False, 0
    plan._workspace_bytes, plan.tuning_report = 1 << 20, "autotune's report"
    # cuBLASLt's check, for what select() has not seen: it accepts #101 (over the limit for #102) only
    plan._lib = types.SimpleNamespace(api=types.SimpleNamespace(cublasLtMatmulAlgo_t=ctypes.c_byte * 64))
    launch.check = lambda algo: {evicted.as_bytes(): evicted, Result(102).as_bytes(): Result(102, 2 << 20)}.get(
        bytes(algo))
    plan.select(Result(1))  # the same bytes as a planned one: the plan's own result runs
    assert plan.algorithm is planned and plan._launch.workspace.size == 256 and plan.tuning_report is None
    plan.select(Result(100))  # a candidate check() accepted, with the workspace cuBLASLt asked for there
    assert plan.algorithm is searched and plan._launch.workspace.size == 4096
    plan.select(Result(101))  # one no longer held (evicted): checked again
    assert plan.algorithm is evicted
    for refused in (Result(7), Result(102)):  # refused by the check; over the workspace limit
        with pytest.raises(NvblasltValueError, match="algorithm: expected one of this plan's algorithms"):
            plan.select(refused)
    with pytest.raises(NvblasltTypeError, match="algorithm: expected a HeuristicResult .*, got str"):
        plan.select("id 66")
    held = plan._launch.workspace
    with pytest.raises(MemoryError):
        plan._ensure_workspace(2 << 20)
    assert plan._launch.workspace is held and not held.released
