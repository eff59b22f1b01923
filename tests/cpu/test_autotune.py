"""autotune(search=True) never loses to autotune() (issue 12 §2), checked without a GPU: the
statistics on simulated noisy, drifting timings, and the whole orchestration on a stand-in plan
whose "kernels" take simulated times."""

from __future__ import annotations

import inspect
import math
import random
import re
import time
import types

import pytest

from nvblaslt import _autotune, _duel, _search, _timing, _tuning_cache
from nvblaslt._duel import Contestant, duel, faster_confidence, median_bounds
from nvblaslt._epilogs import SPLIT_FORMS, MatmulEpilog
from tests.fakes import simulated_timer


# ---- the statistics ------------------------------------------------------------------------------
def test_median_bounds_hold_at_their_level():
    generator = random.Random(1)
    misses, trials = 0, 2000
    for _ in range(trials):
        samples = [generator.gauss(0, 1) for _ in range(30)]
        lower, upper = median_bounds(samples, 0.05)
        misses += upper < 0  # the true median is 0
    assert misses / trials <= 0.05 + 0.015  # 0.05 at most, and three standard errors of 2000 trials


def test_median_bounds_need_enough_samples():
    assert median_bounds([-1.0] * 5, 0.01) == (-math.inf, math.inf)  # 5 wins in 5 is p = 0.03
    lower, upper = median_bounds([-1.0 - i for i in range(10)], 0.005)
    assert upper == -1.0 and lower == -10.0


def test_faster_confidence_is_the_sign_test():
    assert faster_confidence([-1.0] * 10) == pytest.approx(1 - 2 ** -10)
    assert faster_confidence([1.0] * 10) == 0.0
    assert faster_confidence([]) == 0.0


class SimulatedGPU:
    """Times drawn from each contestant's true time, with noise and a slow clock drift."""

    def __init__(self, seed: int, noise: float = 0.01, drift: float = 0.04):
        self.random, self.noise, self.drift, self.calls, self.last = random.Random(seed), noise, drift, 0, None

    def __call__(self, run, prepare=None) -> float:
        if prepare is not None:
            prepare()
        run()
        self.calls += 1
        clock = 1 + self.drift * math.sin(self.calls / 40)
        return self.last * clock * math.exp(self.random.gauss(0, self.noise))

    def synchronize(self) -> None:
        pass

    def contestant(self, name: str, ms: float) -> Contestant:
        return Contestant(name, lambda: setattr(self, "last", ms))


def run_duel(seed: int, challenger_ms: list[float], noise: float = 0.01):
    gpu = SimulatedGPU(seed, noise)
    challengers = [gpu.contestant(f"c{i}", ms) for i, ms in enumerate(challenger_ms)]
    return duel(gpu, gpu.contestant("incumbent", 26.0), challengers, deadline=time.perf_counter() + 60,
                shuffler=random.Random(seed))


def test_equal_challengers_almost_never_win():
    switches = sum(run_duel(seed, [26.0] * 4, noise=0.02).winner() is not None for seed in range(1000))
    # ALPHA is 1 % a look; over a duel's sequential looks, with the 1.5 % MIN_GAIN, 0.6 % switch (12 of
    # 2000 seeds; 5 of these 1000). With a 0.5 % MIN_GAIN it was 2.2 %, which this bound refuses.
    assert switches <= 12


def test_no_contestant_keeps_the_same_neighbour():
    # What ran just before a kernel moves its time: at the seed's shape on an H200 the same kernel read up
    # to 6 % apart with a fixed neighbour. In a rotated order the first challenger follows the incumbent
    # in 4 rounds of 5; shuffled, each follows it in about a quarter of the rounds.
    gpu = SimulatedGPU(0)
    sequence: list[float] = []

    def record(run, prepare=None):
        ms = gpu(run, prepare)
        sequence.append(gpu.last)
        return ms
    record.synchronize = gpu.synchronize  # type: ignore[attr-defined]
    incumbent = gpu.contestant("incumbent", 26.0)
    challengers = [gpu.contestant(f"c{i}", 26.0 + 0.001 * (i + 1)) for i in range(4)]  # equal within noise
    duel(record, incumbent, challengers, deadline=time.perf_counter() + 60, max_rounds=40, min_rounds=1000,
         shuffler=random.Random(3))  # never judged: 40 full rounds
    assert len(sequence) == 5 * 40
    for challenger in (26.001, 26.002, 26.003, 26.004):
        runs = [i for i, ms in enumerate(sequence) if ms == challenger and i > 0]
        after_incumbent = sum(sequence[i - 1] == 26.0 for i in runs) / len(runs)
        assert 0.1 <= after_incumbent <= 0.45, (challenger, after_incumbent)


def test_slower_challengers_never_win_and_leave_early():
    for seed in range(100):
        outcome = run_duel(seed, [26.3, 26.5, 27.0])  # 1-4 % slower
        assert outcome.winner() is None
    assert outcome.rounds < _duel.MAX_ROUNDS


def test_a_challenger_faster_beyond_noise_wins():
    winners = [run_duel(seed, [26.0, 25.2, 26.1]).winner() for seed in range(100)]  # c1 is 3 % faster
    assert sum(w is not None and w.contestant.name == "c1" for w in winners) >= 95
    assert all(w is None or w.contestant.name == "c1" for w in winners)


def test_a_gain_below_the_minimum_is_not_worth_a_switch():
    wins = sum(run_duel(seed, [25.95], noise=0.002).winner() is not None for seed in range(50))  # 0.2 % faster
    assert wins <= 1


def test_the_duel_stops_at_its_deadline():
    gpu = SimulatedGPU(0)
    slow = Contestant("slow", lambda: (time.sleep(0.01), setattr(gpu, "last", 26.0)))
    started = time.perf_counter()
    outcome = duel(gpu, slow, [gpu.contestant("c", 26.0)], deadline=started + 0.3, shuffler=random.Random(0))
    assert time.perf_counter() - started < 0.6 and outcome.winner() is None


# ---- the orchestration, on a stand-in plan -----------------------------------------------------------
class FakeAlgorithm:
    def __init__(self, algo_id: int):
        self.id, self.tile, self.stages = algo_id, "256x128", "AUTO"
        self.algo = bytes([algo_id % 256]) * 64

    def config(self) -> dict:
        return {"ID": self.id}


class FakeResult:
    def __init__(self, algo_id: int, workspace: int = 0):
        self.algorithm, self.workspace_size = FakeAlgorithm(algo_id), workspace


class FakeSplit:
    instances: list = []

    def __init__(self, plan, iterations):
        self.plan, self.freed = plan, False
        main_launch = types.SimpleNamespace(algorithm=FakeResult(900))
        self.main = types.SimpleNamespace(_launch=main_launch, algorithm=main_launch.algorithm)
        FakeSplit.instances.append(self)

    def trial_run(self, stream):
        self.plan.ran = "split"

    def free(self):
        self.freed = True


class StandInLaunch:
    """What autotune uses of a plan's Launch, by its public names (``_protocols.PlannedLaunch``)."""

    def __init__(self, heuristic_ids):
        self.algorithms: list = [FakeResult(i) for i in heuristic_ids]
        self.algorithm, self.workspace_limit, self.workspace = self.algorithms[0], 1 << 20, 0

    def check(self, algo):
        return None

    def select(self, result):
        self.algorithm = result

    def ensure_workspace(self, nbytes, stream):
        self.workspace = max(self.workspace, nbytes)

    def leave_out(self, refused):
        self.algorithms = [r for r in self.algorithms if all(r is not x for x in refused)] or self.algorithms

    def offer(self, algorithms):
        self.algorithms = list(algorithms)

    def keep(self, ordered, prune):
        self.algorithms = [*ordered, *(r for r in self.algorithms if all(r is not o for o in ordered))][:prune]


class LaunchAlgorithms:
    """A plan's ``algorithms`` and ``algorithm``: its launch's (the stand-in plans share them)."""

    _launch: StandInLaunch

    @property
    def algorithms(self):
        return self._launch.algorithms

    @property
    def algorithm(self):
        return self._launch.algorithm


class StandInPlan(LaunchAlgorithms):
    """What autotune uses of a Matmul, by the names ``_protocols.TunedPlan`` declares; ``speeds`` maps an
    algorithm id (or "split") to its true ms."""

    def __init__(self, heuristic_ids, speeds, epilog=MatmulEpilog.RELU_BIAS):
        self._launch = StandInLaunch(heuristic_ids)
        self.speeds, self._epilog = speeds, epilog
        self.ran, self._split_form, self.device, self.stream = None, None, 0, 0
        self.tuning_report, self.bias_gradient_form = None, None
        self._options = None  # a Matmul's MatmulOptions: none here, so not batch-invariant

    def _trial_run(self, stream):
        self.ran = self._launch.algorithm.algorithm.id

    def _splittable(self):
        return self._epilog in SPLIT_FORMS

    def _make_split_form(self, iterations):
        return FakeSplit(self, iterations)

    def _apply_tuning(self, result):
        """As Matmul._apply_tuning: the choice, the timed order, the form, the report."""
        self._launch.select(result.chosen)
        self._launch.keep(result.ordered(self._launch.algorithms), None)
        if result.bias_gradient_form is not None:
            held, self._split_form = self._split_form, result.split_form
            if held is not None and held is not result.split_form:
                held.free()
            self.bias_gradient_form = result.bias_gradient_form
        self.tuning_report = result.report
        return result.timings


def test_the_stand_ins_and_the_real_plans_meet_the_declared_protocols():
    from nvblaslt import GroupedMatmul, Matmul, _grouped_tuning, _launch, _protocols

    plan = StandInPlan([1], {1: 1.0})
    assert isinstance(plan, _protocols.TunedPlan) and isinstance(plan._launch, _protocols.PlannedLaunch)
    for cls, protocol in ((Matmul, _protocols.TunedPlan), (Matmul, _protocols.PlanInternals),
                          (_grouped_tuning.GroupedTrial, _protocols.TunablePlan),
                          (_launch.Launch, _protocols.PlannedLaunch)):
        members = [name for name in dir(protocol) if not name.startswith("__") and not name.startswith("_abc")
                   and name not in ("_is_protocol", "_is_runtime_protocol")]
        assert protocol is _protocols.PlannedLaunch or "_trial_run" in members or "_run" in members
        source = inspect.getsource(cls)  # state the protocol declares is assigned per instance
        missing = [name for name in members if not hasattr(cls, name)
                   and not re.search(rf"\bself\.{name}\b", source)]
        assert not missing, f"{cls.__name__} lacks {missing} of {protocol.__name__}"
    assert hasattr(GroupedMatmul, "_launch") is False  # an instance attribute: the plan's own Launch


@pytest.fixture
def simulated(monkeypatch):
    """autotune with simulated timings: returns (make a plan, what remember stored)."""
    stored = []
    FakeSplit.instances = []
    monkeypatch.setattr(_tuning_cache, "remember", lambda plan, result, ms, **facts: stored.append(
        (plan, result.algorithm.id, ms, facts)) or True)

    def make(heuristic_ids, speeds, pool_ids=(), seed=0, noise=0.01, epilog=MatmulEpilog.RELU_BIAS):
        plan = StandInPlan(heuristic_ids, speeds, epilog)
        generator = random.Random(seed)
        orders = random.Random(seed + 1000)  # the rounds' orders too: a run replays exactly
        monkeypatch.setattr(_timing, "new_shuffler", lambda: random.Random(orders.random()))

        Timer = simulated_timer(lambda: plan.speeds[plan.ran], generator, noise=noise)
        monkeypatch.setattr(_autotune, "Timer", Timer)
        monkeypatch.setattr(_search, "candidates", lambda p, **kw: iter([FakeResult(i, 4096) for i in pool_ids]))
        return plan
    return make, stored


def test_plain_autotune_picks_the_fastest_heuristic(simulated):
    make, stored = simulated
    plan = make([1, 2, 3], {1: 27.0, 2: 26.0, 3: 28.0})
    timings = _autotune.autotune(plan, iterations=5, search=False, remember=True, stream=None)
    assert [r.algorithm.id for r, _ in timings] == [2, 1, 3]
    assert plan.algorithm.algorithm.id == 2
    assert not plan.tuning_report.searched and stored == []  # only a search is remembered


def test_search_keeps_the_incumbent_when_no_one_is_faster_beyond_noise(simulated):
    make, stored = simulated
    switched = 0
    for seed in range(20):
        speeds = {1: 26.0, 2: 27.5, **{i: 26.0 + 0.05 * (i % 3) for i in range(100, 160)}}  # none faster than #1
        plan = make([1, 2], speeds, pool_ids=range(100, 160), seed=seed, noise=0.015)
        timings = _autotune.autotune(plan, iterations=5, search=True, remember=True, stream=None)
        chosen = plan.algorithm.algorithm.id
        assert speeds[chosen] <= 26.0 + 1e-9, f"seed {seed}: chose {chosen} at {speeds[chosen]} ms"
        assert timings[0][0] is plan.algorithm and stored[-1][1] == chosen  # remembered even when kept
        switched += plan.tuning_report.switched
    assert switched <= 1  # an equal challenger may win by chance, rarely


def test_search_switches_to_a_clearly_faster_challenger_and_says_how_sure(simulated):
    make, stored = simulated
    speeds = {1: 26.0, 2: 26.5, **{i: 26.8 for i in range(100, 140)}, 117: 25.0}
    plan = make([1, 2], speeds, pool_ids=range(100, 140))
    timings = _autotune.autotune(plan, iterations=5, search=True, remember=True, stream=None)
    report = plan.tuning_report
    assert plan.algorithm.algorithm.id == 117 and timings[0][0].algorithm.id == 117
    assert report.switched and report.confidence > 0.99 and report.ratio < 0.98
    assert report.interval[1] < 1.0 and report.screened == 40
    assert plan._launch.workspace == 4096  # grown for the candidates that need it
    assert stored[-1][1] == 117 and stored[-1][3]["switched"] is True
    assert "switched to id 117" in str(report)


def test_a_heuristic_pick_autotune_misread_is_screened_and_can_win(simulated, monkeypatch):
    """autotune times the heuristic list unsettled, in a few rounds; a pick it read as slower must still
    reach the search's screening (on an H200 one such pick was 4 % faster than what a tune kept)."""
    make, stored = simulated
    misread = _autotune._first_pick_unless_beaten

    def unsettled(plan, timer, candidates, samples, *args, **kwargs):  # #2 read 10 % slow: no duel there
        samples = [[ms * 1.1 for ms in times] if r.algorithm.id == 2 else times for r, times in zip(candidates, samples)]
        return misread(plan, timer, candidates, samples, *args, **kwargs)
    monkeypatch.setattr(_autotune, "_first_pick_unless_beaten", unsettled)
    speeds = {1: 26.0, 2: 24.5, 3: 27.0, **{i: 26.8 for i in range(100, 120)}}
    plan = make([1, 2, 3], speeds, pool_ids=range(100, 120))
    _autotune.autotune(plan, iterations=5, search=True, remember=True, stream=None)
    report = plan.tuning_report
    assert plan.algorithm.algorithm.id == 2 and report.switched
    assert report.best_challenger.endswith("(heuristic)") and report.screened == 20  # beyond the 3 picks


def test_each_kernel_is_screened_once_and_duels_once_never_against_itself(simulated, monkeypatch):
    """The plan's list may hold one configuration twice (a recalled pick and the heuristics' own), and
    autotune's runners-up are also on it: two duel slots for one kernel widen every bound for nothing."""
    make, _ = simulated
    screened_ids, dueled_ids = [], []
    screen, run_duel_ = _autotune._screen, _autotune.duel

    def recording_screen(plan, timer, incumbent, pool, *args):
        pool = list(pool)
        screened_ids.extend(r.algorithm.id for r in pool)
        return screen(plan, timer, incumbent, iter(pool), *args)

    def recording_duel(timer, incumbent, challengers, **kwargs):
        if kwargs.get("what", "search") == "search":
            dueled_ids.append([c.result.algorithm.id for c in [incumbent, *challengers]])
        return run_duel_(timer, incumbent, challengers, **kwargs)
    monkeypatch.setattr(_autotune, "_screen", recording_screen)
    monkeypatch.setattr(_autotune, "duel", recording_duel)
    plan = make([1, 2, 3, 2], {1: 26.0, 2: 26.05, 3: 26.1, **{i: 30.0 for i in range(100, 104)}},
                pool_ids=range(100, 104), noise=0.002)
    _autotune.autotune(plan, iterations=5, search=True, remember=False, stream=None)
    incumbent = dueled_ids[0][0]
    assert sorted(screened_ids[:2]) == sorted({1, 2, 3} - {incumbent}) and screened_ids[2:] == [100, 101, 102, 103]
    assert len(dueled_ids) == 1 and len(set(dueled_ids[0])) == len(dueled_ids[0])  # no kernel twice
    assert set(dueled_ids[0][1:]) == {1, 2, 3} - {incumbent}  # the close ones all duel, the incumbent never


@pytest.mark.parametrize("widest", [_autotune.SHORTLIST_MAX, _autotune.SHORTLIST])
def test_where_all_near_equal_kernels_duel_every_tune_keeps_the_same_one(simulated, monkeypatch, widest):
    """Six kernels 4 % faster than the first pick and equal to each other: each tune's screening and rescreen
    put them in another order. Where the time allows, all six duel and the canonical one wins every tune; with
    room for four only, which four duel is up to the screening's noise (H200, 2026-11-29: two tunes shortlisted
    different near-equal kernels and kept kernels 2 % apart)."""
    make, _ = simulated
    monkeypatch.setattr(_autotune, "SHORTLIST_MAX", widest)
    dueled, kept = [], set()
    run_duel_ = _autotune.duel

    def recording_duel(timer, incumbent, challengers, **kwargs):
        if kwargs.get("what", "search") == "search":
            dueled.append({c.result.algorithm.id for c in challengers})
        return run_duel_(timer, incumbent, challengers, **kwargs)
    monkeypatch.setattr(_autotune, "duel", recording_duel)
    close = set(range(110, 116))
    speeds = {1: 0.026, 2: 0.027, **{i: 0.0275 for i in range(100, 140)}, **{i: 0.025 for i in close}}
    for seed in range(8):  # a decode GEMM's ms: a full duel of them all fits in the search's time
        plan = make([1, 2], speeds, pool_ids=range(100, 140), seed=seed, noise=0.005)
        _autotune.autotune(plan, iterations=5, search=True, remember=False, stream=None)
        kept.add(plan.algorithm.algorithm.id)
    assert len(dueled) == 8 and kept <= close
    if widest > _autotune.SHORTLIST:
        assert all(close <= ids for ids in dueled) and kept == {110}
    else:
        assert all(len(close & ids) == _autotune.SHORTLIST for ids in dueled)


def test_the_widest_duel_can_still_decide_at_its_minimum_rounds():
    """Bonferroni over SHORTLIST_MAX + RUNNERS_UP challengers: a challenger that wins all of MIN_ROUNDS rounds
    must still pass, or the widest duels could never end early."""
    each = _duel.ALPHA / (_autotune.SHORTLIST_MAX + _autotune.RUNNERS_UP)
    assert median_bounds([-1.0] * _duel.MIN_ROUNDS, each)[1] < 0


def test_a_search_duels_only_the_picks_autotune_read_faster_it_screens_the_rest(simulated, monkeypatch):
    """autotune()'s near picks (within NEAR_FIRST) duel the first pick only outside a search: a search
    screens every heuristic pick settled anyway, and that duel would only take its time."""
    make, _ = simulated
    near = []
    misread = _autotune._first_pick_unless_beaten

    def recording(*args, **kwargs):
        near.append(args[7] if len(args) > 7 else kwargs.get("near", _autotune.NEAR_FIRST))
        return misread(*args, **kwargs)
    monkeypatch.setattr(_autotune, "_first_pick_unless_beaten", recording)
    for search in (True, False):
        plan = make([1, 2], {1: 26.0, 2: 26.3}, noise=0.003)
        _autotune.autotune(plan, iterations=5, search=search, remember=False, stream=None)
    assert near == [1.0, _autotune.NEAR_FIRST]


def test_the_shortlist_widens_only_as_far_as_the_time_left_pays_for_a_full_duel():
    width = _autotune._shortlist_width
    assert width(8, 0.05, 0.0003, 5.0, 0.1) == _autotune.SHORTLIST_MAX  # a decode GEMM: cheap rounds
    assert width(3, 0.05, 0.0003, 5.0, 0.1) == 3  # no more than were close
    assert width(8, 2.0, 0.0, 1.0, 0.1) == _autotune.SHORTLIST  # a 2 ms GEMM, 1 s left: the floor
    assert width(2, 2.0, 0.0, 1.0, 0.1) == 2
    # behind 8 flushes a 20 µs GEMM's sample takes ~0.27 ms: that, not the call, sets the rounds' cost
    assert width(8, 0.02, 0.0, 0.3, 0.1) == _autotune.SHORTLIST_MAX
    assert width(8, 0.02, 0.00027, 0.3, 0.1) < _autotune.SHORTLIST_MAX


def test_autotune_duels_a_pick_read_a_little_slower_than_the_first(simulated, monkeypatch):
    """autotune's few unsettled rounds can read a faster pick as slower; within NEAR_FIRST it still duels the
    first pick, and wins there (two tunes of a BGRADB problem kept split forms 4 % apart, H200)."""
    make, _ = simulated
    misread = _autotune._first_pick_unless_beaten

    def unsettled(plan, timer, candidates, samples, *args, **kwargs):  # #2 read 2 % slower than #1
        samples = [[ms * 1.06 for ms in times] if r.algorithm.id == 2 else times for r, times in zip(candidates, samples)]
        return misread(plan, timer, candidates, samples, *args, **kwargs)
    monkeypatch.setattr(_autotune, "_first_pick_unless_beaten", unsettled)
    plan = make([1, 2, 3], {1: 26.0, 2: 25.0, 3: 30.0}, noise=0.003)
    _autotune.autotune(plan, iterations=5, search=False, remember=False, stream=None)
    assert plan.algorithm.algorithm.id == 2 and plan.tuning_report.first_pick_ratio < 0.98


def _standing(algo_id: int, ratio: float, verdict: str = "faster") -> _duel.Standing:
    standing = _duel.Standing(Contestant(f"id {algo_id}", lambda: None, None, FakeResult(algo_id)))
    standing.log_ratios, standing.verdict = [math.log(ratio)] * 11, verdict
    return standing


@pytest.mark.parametrize("ratios, expected", [
    ({5: 0.955, 3: 0.960, 7: 0.990}, 3),  # 5 and 3 within TIE: the first in the fixed order
    ({3: 0.960, 5: 0.955}, 3),  # whatever order the duel had them in
    ({5: 0.940, 3: 0.960}, 5),  # 5 faster beyond TIE
    ({5: 0.955}, 5),
])
def test_a_duels_winner_is_the_fastest_or_of_near_equal_winners_the_canonical_one(ratios, expected):
    outcome = _duel.Duel([1.0], [_standing(i, r) for i, r in ratios.items()], 11)
    assert outcome.winner().contestant.result.algorithm.id == expected
    assert outcome.best().contestant.result.algorithm.id == min(ratios, key=ratios.get)


def test_a_challenger_not_judged_faster_never_wins_the_tie():
    outcome = _duel.Duel([1.0], [_standing(5, 0.955), _standing(3, 0.958, "undecided")], 11)
    assert outcome.winner().contestant.result.algorithm.id == 5


def test_search_keeps_to_its_budget(simulated, monkeypatch):
    """On a clock that only the "kernels" advance (a millisecond each), so that a loaded machine cannot
    change what is measured: the search stops at its budget, having screened some of the pool."""
    make, _ = simulated
    speeds = {1: 1.0, 2: 1.05, **{i: 1.03 for i in range(100, 100_100)}}  # simulated ms close to the clock's
    plan = make([1, 2], speeds, pool_ids=range(100, 100_100))
    original = plan._trial_run
    clock = [1000.0]

    def slow_run(*args):  # each "kernel" takes a millisecond of the clock the search reads
        clock[0] += 0.001
        original(*args)
    plan._trial_run = slow_run
    monkeypatch.setattr(_autotune.time, "perf_counter", lambda: clock[0])
    _autotune.autotune(plan, iterations=3, search=True, remember=False, stream=None, budget_s=1.0)
    assert clock[0] - 1000.0 < 1.5  # the budget, and at most one round past it
    assert 0 < plan.tuning_report.screened < 100_000


def test_a_search_starts_its_screening_and_every_duel_settled_on_the_incumbent(simulated, monkeypatch):
    """Whether the GPU sits at its power limit decides some duels (H200: a GELU_AUX_BIAS pick 0.91x the first
    pick's time after 0.3 s of the first pick back to back, 1.03x after 1.5 s idle): the search runs its
    incumbent back to back before the screening and before each duel, the duels' first timed rounds after
    that; plain autotune() does not pay for it."""
    make, _ = simulated
    events: list = []
    real_settle = _timing.settle

    def settle(run, synchronize, seconds):
        events.append(("settle", plan._launch.algorithm.algorithm.id, seconds))
        real_settle(run, synchronize, seconds)
    monkeypatch.setattr(_timing, "settle", settle)
    speeds = {1: 26.0, 2: 25.9, 3: 26.5, **{i: 26.8 for i in range(100, 120)}, 111: 25.0, "split": 30.0}
    plan = make([1, 2, 3], speeds, pool_ids=range(100, 120), epilog=MatmulEpilog.BGRADB)
    _autotune.autotune(plan, iterations=5, search=True, remember=False, stream=None)
    settled = [event for event in events if event[0] == "settle"]
    assert [seconds for *_, seconds in settled] == [_timing.SETTLE_S] * len(settled)
    # the first pick's duel (2 reads faster in its rounds), the screening and the search's duel, all on the
    # incumbent of the moment; then the bias-gradient form's duel on the chosen fused kernel
    assert len(settled) == 4 and settled[0][1] == 1 and settled[-1][1] == plan.algorithm.algorithm.id
    incumbent = int(plan.tuning_report.incumbent.split()[1])  # autotune's pick: "id N tile …"
    assert settled[1][1] == settled[2][1] == incumbent, (settled, plan.tuning_report.incumbent)
    events.clear()
    plain = make([1, 2, 3], speeds)
    _autotune.autotune(plain, iterations=5, search=False, remember=False, stream=None)
    assert events == [] and plain.algorithm.algorithm.id in (1, 2)


def test_a_duel_settles_on_its_incumbent_before_its_first_timed_round():
    gpu = SimulatedGPU(0)
    log: list[str] = []
    incumbent = Contestant("incumbent", lambda: (log.append("incumbent"), setattr(gpu, "last", 26.0)),
                           prepare=lambda: log.append("select incumbent"))
    challenger = Contestant("c", lambda: (log.append("c"), setattr(gpu, "last", 25.0)),
                            prepare=lambda: log.append("select c"))

    def timed(run, prepare=None):
        log.append("timed")
        return gpu(run, prepare)
    timed.synchronize = lambda: log.append("sync")  # type: ignore[attr-defined]
    duel(timed, incumbent, [challenger], deadline=time.perf_counter() + 60, max_rounds=2, min_rounds=1000,
         shuffler=random.Random(0), settle_s=0.01)
    first_timed = log.index("timed")
    settling = log[log.index("sync") + 1:first_timed]  # after the warm-up's synchronize
    assert settling[0] == "select incumbent" and "c" not in settling and "select c" not in settling
    assert settling.count("incumbent") >= _timing.SETTLE_CHUNK and settling[-1] == "sync"


def test_a_small_budget_settles_less_and_still_screens(simulated, monkeypatch):
    """nvblaslt tune may give a problem 1 s: four full settles of 0.3 s would leave its screening nothing. On a
    clock only the "kernels" advance (1 ms each), with the real SETTLE_S and a first-pick duel to run."""
    make, _ = simulated
    monkeypatch.setattr(_timing, "SETTLE_S", 0.3)
    assert _autotune.settle_time(_autotune.SEARCH_BUDGET_S) == 0.3 and _autotune.settle_time(1.0) < 0.05
    speeds = {1: 1.0, 2: 0.99, **{i: 1.03 for i in range(100, 10_100)}}  # 2 reads faster: the first pick duels
    plan = make([1, 2], speeds, pool_ids=range(100, 10_100))
    original = plan._trial_run
    clock = [1000.0]

    def slow_run(*args):
        clock[0] += 0.001
        original(*args)
    plan._trial_run = slow_run
    monkeypatch.setattr(_autotune.time, "perf_counter", lambda: clock[0])
    _autotune.autotune(plan, iterations=3, search=True, remember=False, stream=None, budget_s=1.0)
    assert clock[0] - 1000.0 < 1.5 and plan.tuning_report.screened > 0


def test_a_split_forms_first_call_does_not_replace_its_problems_own_choice(simulated, monkeypatch):
    """For BGRADB the first call is the plain GEMM: a search of that GEMM stored its own choice, which the
    split form's unsearched kernel must not overwrite."""
    make, stored = simulated
    monkeypatch.setattr(_tuning_cache, "has_choice", lambda launch: launch is FakeSplit.instances[-1].main._launch)
    plan = make([1, 2], {1: 26.0, 2: 26.5, "split": 24.0}, epilog=MatmulEpilog.BGRADB, noise=0.01)
    _autotune.autotune(plan, iterations=5, search=True, remember=True, stream=None)
    assert plan.bias_gradient_form[0] == "split"
    assert stored[-1][3]["bias_gradient_form"] == "split"  # the plan's own choice, and nothing after it
    assert all(entry[0] is not FakeSplit.instances[-1].main._launch for entry in stored)


@pytest.mark.parametrize("split_ms, expected", [(24.0, "split"), (26.1, "fused"), (25.9, "fused")])
def test_the_bias_gradient_form_changes_only_beyond_noise(simulated, split_ms, expected):
    make, stored = simulated
    plan = make([1, 2], {1: 26.0, 2: 26.5, "split": split_ms}, epilog=MatmulEpilog.DRELU_BGRAD, noise=0.01)
    _autotune.autotune(plan, iterations=5, search=True, remember=True, stream=None)
    form, form_ms, other_ms = plan.bias_gradient_form
    assert form == expected
    split = FakeSplit.instances[-1]
    if expected == "split":
        assert plan._split_form is split and not split.freed and form_ms < other_ms
        assert stored[-2][3]["bias_gradient_form"] == "split"
        assert stored[-1][0] is split.main._launch  # the first plan's own choice, for later plans
    else:
        assert plan._split_form is None and split.freed
        assert stored[-1][3]["bias_gradient_form"] == "fused"


def test_plain_autotune_times_fused_algorithms_and_keeps_a_recalled_split(simulated):
    make, _ = simulated
    plan = make([1, 2], {1: 26.0, 2: 25.0}, epilog=MatmulEpilog.DRELU_BGRAD)
    recalled = FakeSplit(plan, 0)
    plan._split_form = recalled
    _autotune.autotune(plan, iterations=3, search=False, remember=False, stream=None)
    assert plan._split_form is recalled and plan.algorithm.algorithm.id == 2


def test_each_candidate_has_its_workspace_before_its_trial_run():
    """cuBLASLt answers a launch given less workspace than the algorithm needs with INVALID_VALUE: a grouped
    plan holds its selected algorithm's workspace only, so every trial first makes the candidate's."""
    launch = StandInLaunch([1])
    launch.algorithms = [FakeResult(1, workspace=0), FakeResult(2, workspace=4096), FakeResult(3, workspace=1 << 16)]
    seen = []

    class Plan(LaunchAlgorithms):
        def __init__(self):
            self._launch = launch

        def _trial_run(self, stream):
            selected = launch.algorithm
            seen.append((selected.algorithm.id, launch.workspace >= selected.workspace_size))

    kept = _autotune._runnable(Plan(), list(launch.algorithms), stream=0)
    assert [r.algorithm.id for r in kept] == [1, 2, 3]
    assert seen == [(1, True), (2, True), (3, True)]


# ---- the search's pool ------------------------------------------------------------------------------
def _stand_in_kernel(custom_max: int, split_support: int, schemes: int, allowed: int):
    capabilities = {"CUSTOM_OPTION_MAX": custom_max, "SPLITK_SUPPORT": split_support, "REDUCTION_SCHEME_MASK": schemes}
    algorithm = types.SimpleNamespace(algo=b"base", capability=capabilities.__getitem__)
    launch = types.SimpleNamespace(preference=types.SimpleNamespace(get={"REDUCTION_SCHEME_MASK": allowed}.__getitem__))
    return launch, types.SimpleNamespace(algorithm=algorithm)


def test_option_variants_try_each_custom_option_and_split_count_with_the_allowed_reductions(monkeypatch):
    tried = []
    monkeypatch.setattr(_search, "_configured",
                        lambda launch, algo, settings, limit: tried.append(settings) or settings)
    # the kernel takes INPLACE and COMPUTE_TYPE and OUTPUT_TYPE; the launch allows INPLACE | COMPUTE_TYPE (16-bit D)
    launch, base = _stand_in_kernel(custom_max=2, split_support=1, schemes=7, allowed=3)
    found = list(_search._option_variants(launch, base, 1 << 25))
    assert found == tried
    assert {s["CUSTOM_OPTION"] for s in found} == {0, 1, 2}
    assert {(s["SPLITK_NUM"], s["REDUCTION_SCHEME"]) for s in found} == \
        {(1, 0)} | {(n, scheme) for n in _search.SPLITS[1:] for scheme in (1, 2)}  # never OUTPUT_TYPE (4)
    assert len(found) == 3 * (1 + 2 * (len(_search.SPLITS) - 1))


def test_option_variants_keep_split_k_off_where_the_kernel_cannot_split(monkeypatch):
    monkeypatch.setattr(_search, "_configured", lambda launch, algo, settings, limit: settings)
    launch, base = _stand_in_kernel(custom_max=0, split_support=0, schemes=7, allowed=7)
    assert list(_search._option_variants(launch, base, 1 << 25)) == \
        [{"CUSTOM_OPTION": 0, "SPLITK_NUM": 1, "REDUCTION_SCHEME": 0}]
    launch, base = _stand_in_kernel(custom_max=1000, split_support=0, schemes=7, allowed=7)
    assert len(list(_search._option_variants(launch, base, 1 << 25))) == _search.MAX_CUSTOM_OPTIONS


def _split_result(name: str, splits: int, scheme: int, waves: float = 1.0, impl_flags: int = 0x2):
    config = {"ID": name, "SPLITK_NUM": splits, "REDUCTION_SCHEME": scheme}
    algorithm = types.SimpleNamespace(config=lambda: dict(config), get=config.__getitem__,
                                      capability={"NUMERICAL_IMPL_FLAGS": impl_flags}.__getitem__)
    return types.SimpleNamespace(algorithm=algorithm, waves=waves)


def _preference(reductions: int = 7, impl_mask: int = (1 << 64) - 1, max_waves: float = 0.0):
    """A launch's preference as the pool reads it (cuBLASLt's defaults: any reduction, implementation, waves)."""
    values = {"REDUCTION_SCHEME_MASK": reductions, "IMPL_MASK": impl_mask, "MAX_WAVES_COUNT": max_waves}
    return types.SimpleNamespace(get=values.__getitem__)


def _pool_of(monkeypatch, offered, preference) -> list:
    """The search's pool where ``offered`` are the other epilogs' picks and nothing else is found."""
    monkeypatch.setattr(_search, "_deeper_heuristics", lambda launch: [])
    monkeypatch.setattr(_search, "_rechecked", lambda launch, results, limit: list(results))
    monkeypatch.setattr(_search, "_heuristics_of_other_epilogs", lambda launch, limit: offered)
    for source in ("_variants", "_option_variants"):
        monkeypatch.setattr(_search, source, lambda launch, base, limit: iter(()))
    monkeypatch.setattr(_search, "_enumerated", lambda launch, limit: iter(()))
    launch = types.SimpleNamespace(algorithms=[], preference=preference)
    return [r.algorithm.get("ID") for r in _search.candidates(launch, workspace_limit=1 << 20)]


def test_the_pool_leaves_out_split_k_with_a_reduction_the_launch_excludes(monkeypatch):
    # cuBLASLt's algorithm check does not read the preference's reduction mask: a pick the heuristics make for
    # another epilog (or any source) that reduces as the plan forbids (OUTPUT_TYPE, 4, into a 16-bit D) must
    # not reach the screen
    offered = [_split_result("output type", 4, 4), _split_result("compute type", 4, 2), _split_result("off", 1, 4),
               _split_result("in place", 2, 1)]
    # INPLACE | COMPUTE_TYPE, nvblaslt's for 16-bit D
    assert _pool_of(monkeypatch, offered, _preference(reductions=3)) == ["compute type", "off", "in place"]
    assert len(_pool_of(monkeypatch, offered, _preference())) == 4  # cuBLASLt's default: any


def test_the_pool_leaves_out_kernels_outside_the_implementation_mask_or_past_the_wave_limit(monkeypatch):
    # the heuristics honour IMPL_MASK and MAX_WAVES_COUNT; cuBLASLt's algorithm check reads neither
    hmma_32f, hmma_16f = 0x2 | 0x10000 * 2, 0x2 | 0x10000  # HMMA with an fp32 / fp16 accumulator (stand-in bits)
    offered = [_split_result("fp16 accumulator", 1, 0, impl_flags=hmma_16f),
               _split_result("fp32 accumulator", 1, 0, impl_flags=hmma_32f),
               _split_result("three waves", 1, 0, waves=3.0, impl_flags=hmma_32f)]
    no_16f = ((1 << 64) - 1) & ~0x10000
    assert _pool_of(monkeypatch, offered, _preference(impl_mask=no_16f)) == ["fp32 accumulator", "three waves"]
    assert _pool_of(monkeypatch, offered, _preference(max_waves=2.0)) == ["fp16 accumulator", "fp32 accumulator"]
    assert len(_pool_of(monkeypatch, offered, _preference())) == 3


def test_other_epilogs_heuristics_are_asked_with_the_launch_reduction_mask(monkeypatch, lib):
    from nvblaslt import MatmulDesc, MatmulPreference, MatrixLayout
    from nvblaslt._launch import Launch

    api = lib.api
    desc = MatmulDesc(api.CUBLAS_COMPUTE_32F, api.CUDA_R_32F, lib=lib)
    layouts = [MatrixLayout(api.CUDA_R_16BF, 64, 64, 64, lib=lib) for _ in range(4)]
    preference = MatmulPreference(max_workspace_bytes=1 << 20, lib=lib)
    preference.set("REDUCTION_SCHEME_MASK", 3)
    launch = Launch(lib, None, types.SimpleNamespace(handle=None), desc, layouts, preference, workspace_limit=1 << 20,
                    device=0, alpha=None, beta=None)
    asked = []
    monkeypatch.setattr(_search, "heuristics", lambda *args, count: asked.append(args[-1].get("REDUCTION_SCHEME_MASK"))
                        or [])
    assert _search._heuristics_of_other_epilogs(launch, 1 << 20) == []
    assert asked and set(asked) == {3}


def test_the_rescreen_ranks_close_candidates_by_the_median_of_their_reruns(monkeypatch):
    """One rerun reads a few % off on a short GEMM: a candidate truly 7 % faster whose first rerun reads 5 %
    slower must still reach the shortlist (within SHORTLIST_RATIO), and one whose single good reading was noise
    must fall behind it."""
    launch = StandInLaunch([1])
    plan = StandInPlan([1], {})
    plan._launch = launch
    reruns = _autotune.RESCREEN_ROUNDS - 1
    readings = {2: iter([1.05, *[0.93] * reruns]), 3: iter([0.95, *[1.04] * reruns])}

    def timer(run, prepare):
        prepare()
        run()
        return 1.0 if plan.ran == 1 else next(readings[plan.ran])
    monkeypatch.setattr(_autotune.time, "perf_counter", lambda: 0.0)  # the deadline never comes
    incumbent = _autotune._algorithm(plan, launch.algorithms[0], 0)
    first = [(FakeResult(2), 1.03), (FakeResult(3), 1.01), (FakeResult(4), 1.5)]
    again = _autotune._rescreen(timer, incumbent, first, plan, 0, deadline=1.0)
    assert [(r.algorithm.id, ratio) for r, ratio in again] == [(2, 0.93), (3, 1.04), (4, 1.5)]
    assert again[0][1] < _autotune.SHORTLIST_RATIO


def test_the_rescreen_keeps_the_first_ratio_of_what_it_had_no_time_to_rerun(monkeypatch):
    launch = StandInLaunch([1])
    plan = StandInPlan([1], {})
    plan._launch = launch
    clock = [0.0]

    def timer(run, prepare):
        prepare()
        run()
        clock[0] += 1.0
        return 1.0 if plan.ran == 1 else 0.9
    monkeypatch.setattr(_autotune.time, "perf_counter", lambda: clock[0])
    incumbent = _autotune._algorithm(plan, launch.algorithms[0], 0)
    again = _autotune._rescreen(timer, incumbent, [(FakeResult(2), 1.03), (FakeResult(3), 1.01)], plan, 0,
                                deadline=1.5)
    assert dict((r.algorithm.id, ratio) for r, ratio in again) == {3: 0.9, 2: 1.03}  # 3 ranked first: rerun once


def test_the_rescreen_times_each_candidate_in_a_block_of_pairs_with_the_incumbent(monkeypatch):
    """Cycled over every close candidate, one H200 start's rescreen read a kernel 1.5 % slower than the incumbent
    that pairs and duels read 3 % faster: each candidate now runs its pairs back to back, alone with the incumbent,
    the most promising first, and which of the two runs first is drawn per pair."""
    launch = StandInLaunch([1])
    plan = StandInPlan([1], {})
    plan._launch = launch
    ran: list[int] = []

    def timer(run, prepare):
        prepare()
        run()
        ran.append(plan.ran)
        return 1.0
    monkeypatch.setattr(_autotune.time, "perf_counter", lambda: 0.0)  # the deadline never comes
    monkeypatch.setattr(_autotune._timing, "new_shuffler", lambda: random.Random(0))
    incumbent = _autotune._algorithm(plan, launch.algorithms[0], 0)
    _autotune._rescreen(timer, incumbent, [(FakeResult(2), 1.03), (FakeResult(3), 1.01), (FakeResult(4), 1.02)], plan,
                        0, deadline=1.0)
    pairs = _autotune.RESCREEN_ROUNDS  # no time known per run: the most pairs
    assert len(ran) == 3 * 2 * pairs
    blocks = [ran[i * 2 * pairs:(i + 1) * 2 * pairs] for i in range(3)]
    assert [sorted(set(block) - {1}) for block in blocks] == [[3], [4], [2]]  # by the first ratio, one at a time
    assert all(block.count(1) == pairs for block in blocks)
    firsts = [ran[i] for i in range(0, len(ran), 2)]
    assert 1 in firsts and set(firsts) - {1}  # the incumbent runs first in some pairs, second in others


class _ClockedTimer:
    """A Timer whose every run takes ``sample_s`` on a fake clock; a candidate reads ``readings[id]`` in turn."""

    def __init__(self, plan, clock: list, sample_s: float, readings: dict | None = None):
        self.plan, self.clock, self.sample_s, self.readings = plan, clock, sample_s, readings or {}
        self.runs: list[int] = []

    def __call__(self, run, prepare):
        prepare()
        run()
        self.clock[0] += self.sample_s
        self.runs.append(self.plan.ran)
        return 1.0 if self.plan.ran == 1 else next(self.readings.get(self.plan.ran, iter(())), 1.0)


def _rescreened(monkeypatch, timer, first: list, deadline: float) -> dict:
    monkeypatch.setattr(_autotune.time, "perf_counter", lambda: timer.clock[0])
    incumbent = _autotune._algorithm(timer.plan, timer.plan._launch.algorithms[0], 0)
    again = _autotune._rescreen(timer, incumbent, first, timer.plan, 0, deadline=deadline)
    return {r.algorithm.id: ratio for r, ratio in again}


def test_the_rescreen_sizes_each_block_by_the_time_left_over_the_candidates_left(monkeypatch):
    # a run takes 0.25 s, a pair 0.5 s: 8.75 s pay for 5 pairs of each of 3 (the Timer's sample time), then, at the
    # pairs' measured time, 6 of each of the 2 left and 6 of the last
    plan = StandInPlan([1], {})
    timer = _ClockedTimer(plan, [0.0], 0.25)
    _rescreened(monkeypatch, timer, [(FakeResult(2), 1.01), (FakeResult(3), 1.02), (FakeResult(4), 1.03)], 8.75)
    assert [timer.runs.count(i) for i in (2, 3, 4)] == [5, 6, 6]


def test_the_rescreen_stops_mid_block_at_its_deadline_and_the_rest_keep_their_first_ratio(monkeypatch):
    # 4 s: the first gets the least block (5 pairs), the second 3 pairs before the deadline (the median of its 3
    # readings), the third none
    plan = StandInPlan([1], {})
    timer = _ClockedTimer(plan, [0.0], 0.25, {3: iter([0.9, 1.2, 0.95])})
    found = _rescreened(monkeypatch, timer, [(FakeResult(2), 1.01), (FakeResult(3), 1.02), (FakeResult(4), 1.03)],
                        4.0)
    assert [timer.runs.count(i) for i in (2, 3, 4)] == [5, 3, 0]
    assert found == {2: 1.0, 3: 0.95, 4: 1.03}


def test_the_rescreen_s_blocks_fit_its_time():
    # 15 pairs where the time pays for them; fewer, down to 5, where it does not; 15 where a pair's time is not known
    assert _autotune._block_pairs(10, 0.002, 1.0) == _autotune.RESCREEN_ROUNDS
    assert _autotune._block_pairs(10, 0.002, 0.16) == 8
    assert _autotune._block_pairs(32, 0.002, 0.05) == _autotune.RESCREEN_MIN_PAIRS
    assert _autotune._block_pairs(10, 0.0, 0.05) == _autotune.RESCREEN_ROUNDS
    assert _autotune._block_pairs(0, 0.002, 0.05) == _autotune.RESCREEN_ROUNDS


def test_screening_times_each_candidate_after_an_untimed_run_that_loads_its_kernel(monkeypatch):
    """With CUDA's lazy loading a kernel's first launch waits for its module (several ms on an H200): a
    screening that timed first launches ranked candidates by their loading, and missed faster kernels."""
    plan = StandInPlan([1], {})
    runs: dict[int, int] = {}

    def trial_run(stream):
        plan.ran = plan._launch.algorithm.algorithm.id
        runs[plan.ran] = runs.get(plan.ran, 0) + 1

    plan._trial_run = trial_run
    speed = {1: 1.0, 2: 0.9, 3: 1.2}

    def timer(run, prepare=None):
        if prepare is not None:
            prepare()
        run()
        return speed[plan.ran] * (8.0 if runs[plan.ran] == 1 else 1.0)  # a first launch loads the kernel
    monkeypatch.setattr(_autotune.time, "perf_counter", lambda: 0.0)
    incumbent = _autotune._algorithm(plan, plan._launch.algorithms[0], 0)
    trial_run(0)  # the incumbent ran before (autotune's rounds)
    screened, failed, exhausted = _autotune._screen(plan, timer, incumbent, iter([FakeResult(2), FakeResult(3)]), 0,
                                                    deadline=1.0)
    assert exhausted and failed == 0
    assert [(r.algorithm.id, round(ratio, 3)) for r, ratio in screened] == [(2, 0.9), (3, 1.2)]
