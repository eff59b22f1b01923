"""Time a plan's algorithms and choose one: ``autotune`` over the heuristic list, and the search
beyond it, which never loses to it.

Timing (``_timing``): CUDA events around each trial launch, L2 flushed before it (every run reads
its operands from device memory, as in a real workload), runs interleaved in shuffled rounds
(clocks drift as the GPU heats up; interleaving spreads the drift over every candidate alike).

The search keeps an incumbent, autotune's pick, and switches only to a challenger that is faster
beyond the measured noise. Candidates are screened cheaply first (one run each, next to a run of
the incumbent; the heuristics' other picks, then the most promising, until the screening budget is
spent). Then the few closest challengers duel the incumbent (``_duel``: interleaved rounds of paired
ratios; a challenger wins only faster beyond the noise by ``_duel.MIN_GAIN``; of near-equal winners, the
first in a fixed order), and otherwise the incumbent stays. For the bias-gradient epilogs the fused kernel
then duels the split form (the masking epilog or plain GEMM, then the bias gradient as a GEMV;
``_split_bgrad``) the same way.
The search's screening and duels start with the incumbent run back to back for ``_timing.SETTLE_S``:
whether the GPU sits at its power limit decides some duels, and large GEMMs run at it in real use.
Everything is budgeted: ``SEARCH_BUDGET_S`` per search.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import operator
import statistics
import time
from collections.abc import Iterator


from . import _search, _timing, _tuning_cache
from ._descriptors import HeuristicResult
from ._duel import MAX_ROUNDS, MIN_ROUNDS, PROGRESS_S, TIE, Contestant, Standing, duel, settle_on
from ._errors import CublasLtError, NvblasltTypeError, NvblasltValueError
from ._protocols import TunablePlan, TunedPlan
from ._tuning_result import TuningReport, TuningResult
from ._streams import stream_handle
from ._timing import Timer, shuffled_rounds

logger = logging.getLogger("nvblaslt")

SEARCH_BUDGET_S = 9.5  # a whole search, its autotune and the split form included; the last duel round and
#                       the pick's setup may run past it, and 10 s is what README promises
SHORTLIST = 4  # challengers that duel the incumbent, at least
SHORTLIST_MAX = 8  # ... and up to this many where the time left pays for all of them over MAX_ROUNDS: two
#                    tunes whose rescreens put near-equal kernels in another order shortlisted different
#                    ones, and kept kernels 2 % apart (bench.tuning's tune logs, H200, 2026-11-29)
SHORTLIST_RATIO = 1.02  # screened within this of the incumbent to be a challenger
RESCREEN_RATIO = 1.08  # screened within this of the incumbent: run again (one run is noise at a few %)
RESCREEN_MAX = 32
RESCREEN_ROUNDS = 15  # pairs with the incumbent per close one at most, as the rescreen's share of the budget
#                      allows: with 16 and 5 reruns, two tunes of a 0.02-0.2 ms GEMM shortlisted different
#                      near-equal kernels from one run's noise and kept kernels 2 % apart (bench.tuning, H200)
RESCREEN_MIN_PAIRS = 5  # ... and at least, while time is left: the least promising then keep their first ratio
RUNNERS_UP = 2  # heuristic picks within RUNNER_UP_RATIO of autotune's also duel (its pick was one sample)
RUNNER_UP_RATIO = 1.01
NEAR_FIRST = 1.03  # autotune()'s picks read within this of the first pick duel it, not only those read faster:
#                    its few unsettled rounds read a split form's GEMM kernel 3.5 % faster than the first pick
#                    as slower, and two tunes of one BGRADB problem kept forms 4 % apart (H200, 2026-11-29).
#                    A search screens every heuristic pick settled anyway: there only those read faster duel
SETTLE_SHARE = 30  # a search settles for at most its budget / this, four times at most (settle_time)


# ---- timing ---------------------------------------------------------------------------------------
def _algorithm(plan: TunablePlan, result: HeuristicResult, stream: int, name: str | None = None) -> Contestant:
    return Contestant(name or _tuning_cache.describe_algorithm(result), lambda: plan._trial_run(stream),
                      lambda: plan._launch.select(result), result)


def _runnable(plan: TunablePlan, candidates: list[HeuristicResult], stream: int) -> list[HeuristicResult]:
    """The candidates cublasLtMatmul runs: one offered by the heuristics may be refused at launch (seen:
    aux epilogs with M=1); those are left out of the timing and of the launch's list."""
    kept: list[HeuristicResult] = []
    refused: list[HeuristicResult] = []
    for candidate in candidates:
        # a grouped plan holds the workspace of its selected algorithm only; cuBLASLt answers a launch with
        # less than the algorithm needs with INVALID_VALUE (seen on cuBLASLt 13.8.2, H200)
        plan._launch.ensure_workspace(candidate.workspace_size, stream)
        plan._launch.select(candidate)
        try:
            plan._trial_run(stream)
        except CublasLtError as error:
            if error.status_name != "CUBLAS_STATUS_NOT_SUPPORTED" or (candidate is candidates[-1] and not kept):
                raise  # another failure, or nothing offered runs
            logger.info("autotune: cublasLtMatmul refused %s; left out", _tuning_cache.describe_algorithm(candidate))
            refused.append(candidate)
            continue
        kept.append(candidate)
    if refused:
        plan._launch.leave_out(refused)
    return kept


def settle_time(budget_s: float) -> float:
    """Seconds a search settles before its screening and each duel: ``_timing.SETTLE_S``, less for a small
    budget, so that its (up to four) settles take at most 4/30 of it."""
    return min(_timing.SETTLE_S, budget_s / SETTLE_SHARE)


def _round_robin(timer: Timer, contestants: list[Contestant], rounds: int) -> list[list[float]]:
    """Samples (ms) of each contestant over ``rounds`` shuffled rounds, after one warm-up run each."""
    for contestant in contestants:  # module load, first-launch costs
        if contestant.prepare is not None:
            contestant.prepare()
        contestant.run()
    timer.synchronize()
    return shuffled_rounds(contestants, rounds, lambda contestant: timer(contestant.run, contestant.prepare))


def _first_pick_unless_beaten(plan, timer: Timer, candidates: list[HeuristicResult], samples: list[list[float]],
                              stream: int, deadline: float, settle_s: float = 0.0,
                              near: float = NEAR_FIRST) -> tuple[list[tuple[HeuristicResult, float]], float]:
    """([(algorithm, ms)], fastest first, but the heuristics' first pick stays first unless another beats it
    in a duel: a median over a few rounds is noise at a 1-3 % difference (issue 35 saw autotune keep a
    kernel 4.6 % slower than the first pick), and autotune() must never keep a slower one; the kept one's
    paired ratio to the first pick in that duel, 1.0 where the first pick stays). The duel takes the
    ``RUNNERS_UP`` fastest picks read faster than the first pick or within ``near`` of it."""
    ranked = sorted(zip(candidates, map(statistics.median, samples)), key=lambda pair: pair[1])
    first, first_ms = candidates[0], statistics.median(samples[0])
    faster = [(result, ms) for result, ms in ranked
              if result is not first and ms < first_ms * near][:RUNNERS_UP]
    if not faster:
        return ranked, 1.0
    minimum_s = _duel_minimum_s(1 + len(faster), first_ms, settle_s, timer.sample_s)
    outcome = duel(timer, _algorithm(plan, first, stream), [_algorithm(plan, r, stream) for r, _ in faster],
                   deadline=max(deadline, time.perf_counter() + minimum_s), max_rounds=3 * MIN_ROUNDS,
                   what="autotune", settle_s=settle_s)
    winner = outcome.winner()
    timed = {id(s.contestant.result): statistics.median(s.samples) for s in outcome.standings if s.samples}
    ranked = [(r, timed.get(id(r), ms)) for r, ms in ranked]
    ranked = [(r, statistics.median(outcome.incumbent) if r is first else ms) for r, ms in ranked]
    kept = winner.contestant.result if winner is not None else first
    logger.info("autotune: %s the heuristics' first pick (duel of %d rounds)",
                "kept" if winner is None else f"{_tuning_cache.describe_algorithm(kept)} beat", outcome.rounds)
    return [next(p for p in ranked if p[0] is kept), *sorted((p for p in ranked if p[0] is not kept),
                                                             key=lambda pair: pair[1])], \
        (winner.ratio if winner is not None else 1.0)


def _duel_minimum_s(contestants: int, call_ms: float, settle_s: float, sample_s: float = 0.0,
                    rounds: int = MIN_ROUNDS + 1) -> float:
    """Seconds a duel of ``contestants`` (the incumbent among them) needs for ``rounds`` after settling (by
    default its minimum and the warm-up: a decision on fewer is noise), each run at 2.5× a call's time (its
    L2 flush and the host's share) or at ``sample_s``, what the timer's samples have taken, if more (the
    flushes ahead of each sample: about 0.25 ms, 10× a decode GEMM)."""
    return settle_s + rounds * contestants * max(2.5 * call_ms / 1000, sample_s)


def _shortlist_width(close: int, call_ms: float, sample_s: float, remaining: float, settle_s: float) -> int:
    """How many of the ``close`` candidates duel: ``SHORTLIST``, up to ``SHORTLIST_MAX`` while a duel of
    them all through ``MAX_ROUNDS`` fits in three quarters of the ``remaining`` seconds."""
    width = min(close, SHORTLIST)
    # the duel with one more: the incumbent, width + 1 challengers and autotune's runners-up
    while width < min(close, SHORTLIST_MAX) and _duel_minimum_s(
            2 + width + RUNNERS_UP, call_ms, settle_s, sample_s, MAX_ROUNDS + 1) <= 0.75 * remaining:
        width += 1
    return width


# ---- the search -----------------------------------------------------------------------------------------
def _screen(plan, timer: Timer, incumbent: Contestant, pool: Iterator[HeuristicResult], stream: int,
            deadline: float) -> tuple[list[tuple[HeuristicResult, float]], int, bool]:
    """[(candidate, its ms over the incumbent's)] from one timed run each, after an untimed one, in groups
    of 8 each timed next to a run of the incumbent (so drift between groups cancels), until ``deadline``
    or the pool runs dry; how many failed to run; whether the pool ran dry. The untimed run loads the
    kernel: with CUDA's lazy loading a kernel's first launch waits for its module (H200, cuBLASLt 13.1:
    a median 6.8× the second run for 41 candidates of a 1.2 ms GELU_AUX_BIAS GEMM, 1.5× for a 0.19 ms
    DGELU), and a screening without it passes on mostly the kernels already loaded. Timed after their
    loading run, the pools of the quick LLM suite held a kernel or form ≥ 1 % faster than the first pick
    for 20 of 30 problems (``tools/probe_tuning_ceiling``, 2026-11-29)."""
    screened: list[tuple[HeuristicResult, float]] = []
    failed, last_report, started = 0, time.perf_counter(), time.perf_counter()

    def run() -> None:
        plan._trial_run(stream)

    def select_and_load(candidate: HeuristicResult) -> None:
        plan._launch.select(candidate)
        plan._trial_run(stream)
    exhausted = False
    while not exhausted and time.perf_counter() < deadline:
        group: list[HeuristicResult] = []
        while len(group) < 8:
            candidate = next(pool, None)  # enumerating may itself take time: one at a time
            if candidate is None:
                exhausted = True
                break
            group.append(candidate)
            if time.perf_counter() >= deadline:
                break
        if not group:
            break
        plan._launch.ensure_workspace(max(c.workspace_size for c in group), stream)
        reference = timer(incumbent.run, incumbent.prepare)
        for candidate in group:
            try:
                ms = timer(run, functools.partial(select_and_load, candidate))
            except CublasLtError as error:  # accepted by the check, refused at launch
                logger.debug("search: %s failed to run (%s)", _tuning_cache.describe_algorithm(candidate), error)
                failed += 1
                continue
            screened.append((candidate, ms / reference))
        now = time.perf_counter()
        if now - last_report > PROGRESS_S and screened:
            last_report = now
            logger.info("search: screened %d candidates in %.1f s, best %.3f× the incumbent", len(screened),
                        now - started, min(r for _, r in screened))
    return screened, failed, exhausted


def _block_pairs(candidates: int, pair_s: float, remaining: float) -> int:
    """Pairs with the incumbent for the next of ``candidates`` still to rescreen: as many as ``remaining`` seconds
    pay for at ``pair_s`` a pair (RESCREEN_ROUNDS where that is not known yet), within
    RESCREEN_MIN_PAIRS..RESCREEN_ROUNDS."""
    if pair_s <= 0 or candidates <= 0:
        return RESCREEN_ROUNDS
    return max(RESCREEN_MIN_PAIRS, min(RESCREEN_ROUNDS, int(remaining / (pair_s * candidates))))


def _rescreen(timer: Timer, incumbent: Contestant, screened, plan, stream: int,
              deadline: float) -> list[tuple[HeuristicResult, float]]:
    """The close ones run again, the most promising first, each in a block of consecutive pairs with the
    incumbent (which of the two runs first drawn per pair) until ``deadline``; the median of a candidate's
    pairs replaces its first ratio (kept where it got none): one run of a short GEMM reads a few % off,
    either way. Each block's size is what the time left pays for, over the candidates left, at the pairs'
    measured time (before the first pair, the Timer's mean sample time).

    In a block the two kernels run back to back, alone. Cycled over every close candidate instead, the
    pairs read near-equal kernels by the mix around them: on one H200 start, a 64x256 GELU_AUX_BIAS kernel
    at 1.015x the incumbent and another at 1.041x, where 15 consecutive pairs and pair duels read both at
    0.97x (and the search's duels of 5 challengers the first at 0.973-0.975x), and a 192x128 one at
    1.008x that pairs read at 1.05x (docs/bench-tuning-1129-seventh-h200.txt, call 3). On another start the
    two ways agreed within about 1 % (call 4)."""
    screened = sorted(screened, key=lambda pair: pair[1])
    close = [pair for pair in screened[:RESCREEN_MAX] if pair[1] < RESCREEN_RATIO]
    shuffler = _timing.new_shuffler()
    pair_s, pairs_run, started = 2 * getattr(timer, "sample_s", 0.0), 0, time.perf_counter()
    again = []
    for index, (candidate, first) in enumerate(close):
        if pairs_run:
            pair_s = (time.perf_counter() - started) / pairs_run
        pairs = _block_pairs(len(close) - index, pair_s, deadline - time.perf_counter())
        contestant = _algorithm(plan, candidate, stream)
        ratios: list[float] = []
        while len(ratios) < pairs and time.perf_counter() < deadline:
            if shuffler.random() < 0.5:
                reference = timer(incumbent.run, incumbent.prepare)
                ms = timer(contestant.run, contestant.prepare)
            else:
                ms = timer(contestant.run, contestant.prepare)
                reference = timer(incumbent.run, incumbent.prepare)
            ratios.append(ms / reference)
        pairs_run += len(ratios)
        again.append((candidate, statistics.median(ratios) if ratios else first))
    return sorted(again + screened[len(close):], key=lambda pair: pair[1])


def _choose_algorithm(plan, timer: Timer, heuristic: list[tuple[HeuristicResult, float]], stream: int,
                      started: float, deadline: float, settle_s: float) -> tuple[HeuristicResult, float, dict]:
    """The search over algorithms: (the choice, its ms, facts for the report and the timings list)."""
    incumbent_result, incumbent_ms = heuristic[0]
    incumbent = _algorithm(plan, incumbent_result, stream)
    settle_on(timer, incumbent, settle_s)  # the screening ranks as the duel will: settled
    remaining = deadline - time.perf_counter()
    # the duel's share: at least its minimum rounds with a full shortlist
    duel_minimum = settle_s + (1 + SHORTLIST + RUNNERS_UP) * (MIN_ROUNDS + 1) * max(1.2 * incumbent_ms / 1000,
                                                                                     timer.sample_s)
    screen_deadline = time.perf_counter() + max(0.0, min(0.55 * remaining, remaining - duel_minimum))
    logger.info("search: incumbent %s at %.4f ms (autotune's pick of %d); screening until %.1f s", incumbent.name,
                incumbent_ms, len(heuristic), screen_deadline - started)
    enumeration_started = time.perf_counter()
    # the plan's own list (the heuristics' picks, a recalled one first) is screened first, settled like the
    # rest: autotune timed it unsettled, in a few rounds, and a pick it misread never dueled (H200, a
    # 12288x8192 GELU_AUX_BIAS: a heuristic pick 4 % faster than the kernel a tune kept; bench.tuning,
    # 2026-11-29). Once each: a recalled pick may also be on the list.
    own = {_search.config_key(r): r for r in reversed(plan._launch.algorithms)}
    own.pop(_search.config_key(incumbent_result), None)
    others = list(reversed(own.values()))
    pool = itertools.chain(others, _search.candidates(plan._launch, workspace_limit=plan._launch.workspace_limit,
                                                      incumbent=incumbent_result))
    screened, failed, exhausted = _screen(plan, timer, incumbent, pool, stream, screen_deadline)
    logger.info("search: screened %d candidates, %d of them the plan's own picks (%d failed to run), in %.1f s%s",
                len(screened), sum(_search.config_key(c) in own for c, _ in screened), failed,
                time.perf_counter() - enumeration_started,
                "" if exhausted else "; the budget ended before the candidates did")
    duel_deadline = deadline
    screened = _rescreen(timer, incumbent, screened, plan, stream,
                         time.perf_counter() + 0.25 * (duel_deadline - time.perf_counter()))
    close = [c for c, ratio in screened[:SHORTLIST_MAX] if ratio < SHORTLIST_RATIO]
    shortlist = close[:_shortlist_width(len(close), incumbent_ms, timer.sample_s, duel_deadline - time.perf_counter(),
                                        settle_s)]
    dueling = {_search.config_key(c) for c in [incumbent_result, *shortlist]}
    for runner_up, ms in heuristic[1:1 + RUNNERS_UP]:  # each kernel duels once, never against itself
        if ms < incumbent_ms * RUNNER_UP_RATIO and _search.config_key(runner_up) not in dueling:
            shortlist.append(runner_up)
            dueling.add(_search.config_key(runner_up))
    challengers = [_algorithm(plan, c, stream, _tuning_cache.describe_algorithm(c) + " (heuristic)"
                              if _search.config_key(c) in own else None) for c in shortlist]
    facts = {"screened": sum(_search.config_key(c) not in own for c, _ in screened),
             "estimates": [(c, ratio * incumbent_ms) for c, ratio in screened]}
    if not challengers:
        facts["note"] = "no challenger within 2% in screening"
        return incumbent_result, incumbent_ms, facts
    logger.info("search: duel of the incumbent against %d challengers: %s", len(challengers),
                ", ".join(c.name for c in challengers))
    outcome = duel(timer, incumbent, challengers, deadline=duel_deadline, settle_s=settle_s)
    winner, best = outcome.winner(), outcome.best()
    facts.update(duel=outcome, best=best, incumbent_duel_ms=statistics.median(outcome.incumbent))
    if winner is None:
        return incumbent_result, statistics.median(outcome.incumbent), facts
    facts["winner"] = winner
    if best is not None and best is not winner and best.verdict == "faster":
        logger.info("search: %s at %.4f× and %s at %.4f× are within %.0f %%: the first in the fixed order wins",
                    winner.contestant.name, winner.ratio, best.contestant.name, best.ratio, 100 * TIE)
    chosen = winner.contestant.result
    assert chosen is not None  # every challenger here is an algorithm
    return chosen, statistics.median(winner.samples), facts


def _choose_bias_gradient_form(plan: TunablePlan, timer: Timer, iterations: int, stream: int, recalled_split,
                               deadline: float, call_ms: float, settle_s: float):
    """Fused *_BGRAD against its two-call form (``_split_bgrad``); the form the plan had (fused, unless an
    earlier search's split form was recalled) stays unless the other is faster beyond noise.
    Returns ((form, its ms, the other form's ms), the SplitBiasGradient if the split form is chosen), or
    (None, None) where the split form cannot be made. A split form made here and not chosen is freed; a
    recalled one stays the plan's (it frees it on applying)."""
    split = recalled_split or plan._make_split_form(iterations)
    if split is None:  # its plans could not be made (logged): no choice, the plan keeps its form
        return None, None
    fused = Contestant("fused", lambda: plan._trial_run(stream))
    two_calls = Contestant("split", lambda: split.trial_run(stream))
    incumbent, challenger = (two_calls, fused) if recalled_split is not None else (fused, two_calls)
    # the duel gets its minimum rounds even past the budget: a decision on fewer would be noise
    deadline = max(deadline, time.perf_counter() + _duel_minimum_s(2, call_ms, settle_s, timer.sample_s))
    outcome = duel(timer, incumbent, [challenger], deadline=deadline, max_rounds=3 * MIN_ROUNDS,
                   what="bias-gradient form", settle_s=settle_s)
    standing = outcome.standings[0]
    measured = {incumbent.name: statistics.median(outcome.incumbent),
                challenger.name: statistics.median(standing.samples)}
    chosen = challenger.name if standing.verdict == "faster" else incumbent.name
    other = "fused" if chosen == "split" else "split"
    logger.info("search: %s bias-gradient form (%s at %.4f× %s, confidence %.1f%%, %d rounds)", chosen,
                challenger.name, standing.ratio, incumbent.name, 100 * standing.confidence, outcome.rounds)
    if chosen == "fused":
        if recalled_split is None:  # made here for the duel; a recalled one is the plan's to free
            split.free()
        split = None
    return (chosen, measured[chosen], measured[other]), split


def _form_reserve(plan, iterations: int, call_ms: float, remaining: float, settle_s: float,
                  sample_s: float = 0.0) -> float:
    """Seconds to keep for the bias-gradient form: autotuning its first plan (its rounds, then a duel of the
    picks near its first) and a short duel of the two forms."""
    if not plan._splittable():
        return 0.0
    calls = len(plan.algorithms) * (iterations + 1) + (1 + RUNNERS_UP + 2) * (MIN_ROUNDS + 1)
    return min(0.4 * remaining, calls * max(1.25 * call_ms / 1000, sample_s) + settle_s)


def tuning_iterations(value: object) -> int:
    """``iterations`` as a framework layer's autotune context takes it (nvblaslt.torch, nvblaslt.jax): an
    int ≥ 1, else refused by name."""
    try:
        count = None if isinstance(value, bool) else operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        count = None
    if count is None or count < 1:
        cls = NvblasltTypeError if count is None else NvblasltValueError
        raise cls(f"iterations: expected an int ≥ 1 (timed rounds per candidate), got {value!r}")
    return count


def autotune(plan: TunedPlan, *, iterations: int, search: bool, remember: bool, stream,
             budget_s: float = SEARCH_BUDGET_S) -> list[tuple[HeuristicResult, float]]:
    """``tune``, then the plan applies what was chosen (``plan._apply_tuning``): ``Matmul.autotune``'s
    work. A batch-invariant plan runs the algorithm pinned for every M: it is timed, never searched.
    Returns ``[(algorithm, ms)]``, the selected one first, the rest fastest first."""
    if search and getattr(plan._options, "batch_invariant", False):
        logger.info("search: skipped: a batch_invariant plan runs the algorithm pinned for every M")
        search = False
    return plan._apply_tuning(tune(plan, iterations=iterations, search=search, remember=remember, stream=stream,
                                  budget_s=budget_s))


def tune(plan: TunablePlan, *, iterations: int, search: bool, remember: bool, stream,
         budget_s: float = SEARCH_BUDGET_S) -> TuningResult:
    """Time ``plan``'s heuristic list (median of ``iterations`` interleaved rounds, L2 flushed) and
    choose the fastest. With ``search``, look beyond it within ``budget_s`` seconds and switch only to
    a challenger faster beyond the measured noise; for a bias-gradient epilog choose the fused or
    split form the same way; with ``remember``, store the choice on disk for later plans.

    The trial launches select algorithms on ``plan._launch`` (and leave out those cuBLASLt refuses at
    launch); nothing else of the plan changes. Returns a ``TuningResult`` for the plan to apply."""
    started = time.perf_counter()
    settle_s = settle_time(budget_s)
    stream_h = stream_handle(stream) if stream is not None else plan.stream
    recalled_split = plan._split_form  # a split form recalled from the tuning cache: the incumbent form
    with Timer(plan.device, stream_h) as timer:
        candidates = list(plan.algorithms)
        previous = plan.tuning_report
        if search and previous is not None and not previous.searched and plan.algorithm is not None:
            # autotune() already chose among the heuristic list: the search starts from its pick, so
            # that a search which finds nothing better leaves exactly autotune()'s kernel
            heuristic, first_ratio = [(plan.algorithm, previous.chosen_ms)], previous.first_pick_ratio
            logger.info("search: starting from autotune()'s pick %s", previous.chosen)
        else:
            logger.info("autotune: timing %d heuristic picks, %d interleaved rounds", len(candidates),
                        max(1, iterations))
            candidates = _runnable(plan, candidates, stream_h)
            samples = _round_robin(timer, [_algorithm(plan, c, stream_h) for c in candidates], iterations)
            # a search's duels start settled; autotune() alone stays as quick as its rounds
            heuristic, first_ratio = _first_pick_unless_beaten(plan, timer, candidates, samples, stream_h,
                                                               started + budget_s, settle_s if search else 0.0,
                                                               1.0 if search else NEAR_FIRST)
        incumbent, incumbent_ms = heuristic[0]
        if not search:
            report = TuningReport(False, _tuning_cache.describe_algorithm(incumbent), incumbent_ms,
                                  _tuning_cache.describe_algorithm(incumbent), incumbent_ms, False,
                                  heuristics=len(candidates), seconds=time.perf_counter() - started,
                                  first_pick_ratio=first_ratio)
            logger.info("%s", report)
            return TuningResult(heuristic, report)
        deadline = started + budget_s
        form_reserve = _form_reserve(plan, iterations, incumbent_ms, deadline - time.perf_counter(), settle_s,
                                     timer.sample_s)
        chosen, chosen_ms, facts = _choose_algorithm(plan, timer, heuristic, stream_h, started,
                                                     deadline - form_reserve, settle_s)
        plan._launch.select(chosen)  # the fused form duels with the chosen algorithm
        form = split = None
        if plan._splittable():
            form, split = _choose_bias_gradient_form(plan, timer, iterations, stream_h, recalled_split, deadline,
                                                     chosen_ms, settle_s)
    report = _report(chosen, chosen_ms, heuristic, facts, form, time.perf_counter() - started, first_ratio)
    logger.info("%s", report)
    if remember:
        facts_to_store = {"confidence": round(report.confidence, 4), "switched": report.switched}
        if form is not None:
            facts_to_store["bias_gradient_form"] = form[0]
        _tuning_cache.remember(plan._launch, chosen, chosen_ms, **facts_to_store)
        main = split.main if split is not None and form is not None else None
        # its first call's kernel, so that a later plan rebuilds the form without timing; a choice its own
        # problem already has (a search of the plain GEMM, say) stays
        if main is not None and form is not None and not _tuning_cache.has_choice(main._launch):
            autotuned = getattr(main, "tuning_report", None)  # the time of its call alone
            _tuning_cache.remember(main._launch, main.algorithm, autotuned.chosen_ms if autotuned else form[1])
    return TuningResult(_timings(chosen, chosen_ms, heuristic, facts), report, form, split)


def confirm(plan: TunablePlan, first: HeuristicResult, chosen: HeuristicResult, *, first_ms: float, stream,
            budget_s: float, settle_s: float) -> Standing:
    """``chosen`` against ``first`` (the heuristics' first pick) in a fresh duel, settled, on the operands the plan
    points at now; the standing's ``verdict`` is ``"faster"`` where it still wins by ``MIN_GAIN`` beyond the
    noise. ``nvblaslt tune`` calls it after pointing the plan at a second set of operands (other values at other
    addresses): a database pick serves every process and every placement of its problem's arrays, and a pick
    that wins on one set only is not kept. The duel settles on ``first`` for ``settle_s`` and gets its minimum
    rounds even past ``budget_s``."""
    stream_h = stream_handle(stream) if stream is not None else plan.stream
    minimum_s = _duel_minimum_s(2, first_ms, settle_s)
    with Timer(plan.device, stream_h) as timer:
        plan._launch.ensure_workspace(max(first.workspace_size or 0, chosen.workspace_size or 0), stream_h)
        outcome = duel(timer, _algorithm(plan, first, stream_h), [_algorithm(plan, chosen, stream_h)],
                       deadline=time.perf_counter() + max(budget_s, minimum_s), what="confirmation",
                       settle_s=settle_s)
    plan._launch.select(chosen)
    standing = outcome.standings[0]
    logger.info("confirmation: %s at %.4f× the first pick on other operands (%d rounds): %s", standing.contestant.name,
                standing.ratio, outcome.rounds, "kept" if standing.verdict == "faster" else "not kept")
    return standing


def _report(chosen, chosen_ms, heuristic, facts: dict, form, seconds: float, first_ratio: float) -> TuningReport:
    incumbent, incumbent_ms = heuristic[0]
    winner, best = facts.get("winner"), facts.get("best")
    shown = winner or best
    return TuningReport(
        True, _tuning_cache.describe_algorithm(chosen), chosen_ms, _tuning_cache.describe_algorithm(incumbent),
        facts.get("incumbent_duel_ms", incumbent_ms), winner is not None,
        ratio=shown.ratio if shown else 1.0, confidence=shown.confidence if shown else 0.0,
        interval=(shown.lower, shown.upper) if shown else (math.nan, math.nan),
        best_challenger=shown.contestant.name if shown else None,
        best_challenger_config=_config_of(shown.contestant.result) if shown else None,
        rounds=facts["duel"].rounds if "duel" in facts else 0, heuristics=len(heuristic),
        screened=facts.get("screened", 0), seconds=seconds, bias_gradient_form=form, note=facts.get("note", ""),
        first_pick_ratio=first_ratio)


def _config_of(result: HeuristicResult | None) -> dict | None:
    return None if result is None else dict(_search.config_key(result))


def _timings(chosen, chosen_ms, heuristic, facts: dict) -> list[tuple[HeuristicResult, float]]:
    """The chosen algorithm first, then every other one timed, fastest first; each at its most
    precise measurement (duel median, else autotune's median, else the screening estimate)."""
    best: dict[tuple, tuple[HeuristicResult, float]] = {}
    for result, ms in [*facts.get("estimates", []), *heuristic]:
        best[_search.config_key(result)] = (result, ms)
    if "duel" in facts:
        for standing in facts["duel"].standings:
            best[_search.config_key(standing.contestant.result)] = (standing.contestant.result,
                                                                    statistics.median(standing.samples))
    chosen_key = _search.config_key(chosen)
    best.pop(chosen_key, None)
    return [(chosen, chosen_ms), *sorted(best.values(), key=lambda pair: pair[1])]
