"""Deciding on noisy paired samples: ``duel``, an incumbent against challengers in interleaved, shuffled
rounds, each round giving one paired ratio per challenger (its time over the incumbent's in that round), so
that clock drift cancels. A challenger wins when the distribution-free upper bound on its median ratio
(``median_bounds``: the sign test inverted, Bonferroni over the challengers) is below 1 and its median
gains at least ``MIN_GAIN``; of winners within ``TIE`` of the best, the one first in a fixed order
(``Duel.winner``). ``_autotune`` runs duels for autotune's first pick, the search and the bias-gradient
form; ``Contestant`` is what every tuner times."""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from . import _search, _timing
from ._descriptors import HeuristicResult
from ._logging import logger
from ._timing import Timer, shuffled

ALPHA = 0.01  # chance of switching to a challenger that is not faster, over all challengers, at each look;
#              over a duel's looks (one per BLOCK rounds), with MIN_GAIN, 0.6 % in simulation
#              (tests/cpu/test_autotune.py; 2.2 % with a 0.5 % MIN_GAIN)
MIN_GAIN = 0.015  # a switch must gain at least this much (median). Below it, what ran before a kernel decides
#                  its rank: at the seed's shape on an H200 the same few kernels read up to 3 % apart, either
#                  way, after themselves, after each other and after an L2 flush (.scratch-style A/B, 2026-11-22)
TIE = 0.01  # winners of a duel within this of the best one's median ratio are equal: the canonical one wins
MIN_ROUNDS = 10  # with 10 rounds a challenger must win all of them to pass at ALPHA
MAX_ROUNDS = 60
BLOCK = 5  # rounds between decisions
DROP_RATIO = 1.01  # a challenger whose median is this much slower leaves the duel
PROGRESS_S = 2.0  # seconds between progress lines


@dataclass
class Contestant:
    """One thing to time: ``prepare`` (untimed) then ``run`` (timed)."""

    name: str
    run: Callable[[], object]
    prepare: Callable[[], object] | None = None
    result: HeuristicResult | None = None


def settle_on(timer: Timer, contestant: Contestant, seconds: float) -> None:
    """``contestant`` back to back for ``seconds``: the GPU in the power state its own work keeps it in."""
    if contestant.prepare is not None:
        contestant.prepare()
    _timing.settle(contestant.run, timer.synchronize, seconds)


def _upper_tail(n: int, k: int) -> float:
    """P(Binomial(n, 1/2) >= k)."""
    return sum(math.comb(n, i) for i in range(max(k, 0), n + 1)) / 2 ** n


def median_bounds(samples: list[float], alpha: float) -> tuple[float, float]:
    """(lower, upper) bounds on the median of the distribution ``samples`` come from, each holding
    with probability at least 1 - ``alpha``, whatever the distribution: order statistics (the sign
    test inverted). ±inf where there are too few samples for that confidence."""
    ordered, n = sorted(samples), len(samples)
    rank = next((u for u in range(1, n + 1) if _upper_tail(n, u) <= alpha), None)
    if rank is None:
        return -math.inf, math.inf
    return ordered[n - rank], ordered[rank - 1]


def faster_confidence(log_ratios: list[float]) -> float:
    """Confidence that the median log ratio is below 0 (the challenger is faster): 1 - the one-sided
    sign test's p-value. Ties are left out."""
    faster = sum(1 for x in log_ratios if x < 0)
    slower = sum(1 for x in log_ratios if x > 0)
    return 1.0 - _upper_tail(faster + slower, faster) if faster + slower else 0.0


@dataclass
class Standing:
    """One challenger's record against the incumbent."""

    contestant: Contestant
    samples: list[float] = field(default_factory=list)  # its ms
    log_ratios: list[float] = field(default_factory=list)  # log(its ms / the incumbent's ms), same round
    verdict: str = "undecided"  # "faster", "slower" or "undecided"
    lower: float = -math.inf  # bounds on the median ratio
    upper: float = math.inf

    @property
    def ratio(self) -> float:
        return math.exp(statistics.median(self.log_ratios)) if self.log_ratios else math.nan

    @property
    def confidence(self) -> float:
        return faster_confidence(self.log_ratios)

    def judge(self, alpha: float, min_gain: float, min_rounds: int = 0) -> None:
        """The verdict on the rounds so far; "faster" only after ``min_rounds`` of them."""
        lower, upper = median_bounds(self.log_ratios, alpha)
        self.lower, self.upper = math.exp(lower), math.exp(upper)
        ratio, rounds = self.ratio, len(self.log_ratios)
        if self.upper < 1.0 and ratio < 1.0 - min_gain:
            self.verdict = "faster" if rounds >= min_rounds else "undecided"
        elif self.lower > 1.0 or ratio > DROP_RATIO or (rounds >= 2 * MIN_ROUNDS and ratio > 1.0 - min_gain / 2):
            self.verdict = "slower"  # slower beyond noise, or too close to ever gain min_gain


@dataclass
class Duel:
    """The outcome: the incumbent's samples, each challenger's standing, and the rounds run."""

    incumbent: list[float]
    standings: list[Standing]
    rounds: int

    def winner(self) -> Standing | None:
        """The fastest challenger judged faster; of those within ``TIE`` of it, the one first in a fixed
        order (``_canonical``). Near-equal kernels swap places from one tune to the next (the order of a
        few kernels 1-3 % apart moves with the operands and what ran before), and two tunes of one problem
        should write the same kernel where they can."""
        faster = [s for s in self.standings if s.verdict == "faster"]
        if not faster:
            return None
        fastest = min(s.ratio for s in faster)
        return min((s for s in faster if s.ratio <= fastest * (1 + TIE)), key=_canonical)

    def best(self) -> Standing | None:
        """The challenger with the lowest median ratio, winner or not."""
        measured = [s for s in self.standings if s.log_ratios]
        return min(measured, key=lambda s: s.ratio) if measured else None


def _canonical(standing: Standing) -> tuple:
    """A fixed order over contestants: algorithms by their configuration, then anything else by name."""
    result = standing.contestant.result
    return (0, _search.config_key(result), "") if result is not None else (1, (), standing.contestant.name)


def duel(timer, incumbent: Contestant, challengers: list[Contestant], *, deadline: float,
         alpha: float = ALPHA, min_gain: float = MIN_GAIN, min_rounds: int = MIN_ROUNDS,
         max_rounds: int = MAX_ROUNDS, what: str = "search", shuffler: random.Random | None = None,
         settle_s: float = 0.0) -> Duel:
    """Interleaved rounds of the incumbent and the challengers still undecided, until every
    challenger is judged faster or slower, ``max_rounds`` pass, or the clock reaches ``deadline``
    (``time.perf_counter()``); an undecided challenger does not win. ``shuffler`` orders each round
    (default: freshly seeded, so that no order is shared by every duel). With ``settle_s`` the incumbent
    runs back to back that long before the first round (``_timing.settle``), or until the deadline."""
    standings = [Standing(c) for c in challengers]
    each_alpha = alpha / max(1, len(challengers))
    incumbent_samples: list[float] = []
    rounds, last_report = 0, time.perf_counter()
    shuffler = shuffler or _timing.new_shuffler()
    for contestant in [incumbent, *challengers]:  # warm-up
        if contestant.prepare is not None:
            contestant.prepare()
        contestant.run()
    timer.synchronize()
    if settle_s > 0:  # within the deadline: a duel called late settles less
        settle_on(timer, incumbent, min(settle_s, max(0.0, deadline - time.perf_counter())))
    while rounds < max_rounds:
        alive = [s for s in standings if s.verdict == "undecided"]
        if not alive:
            break
        round_started = time.perf_counter()
        order: list = [None, *alive]  # None: the incumbent
        times = {}
        for entry in (order[i] for i in shuffled(shuffler, len(order))):
            contestant = incumbent if entry is None else entry.contestant
            times[id(entry)] = timer(contestant.run, contestant.prepare)
        incumbent_ms = times[id(None)]
        incumbent_samples.append(incumbent_ms)
        for standing in alive:
            ms = times[id(standing)]
            standing.samples.append(ms)
            standing.log_ratios.append(math.log(ms / incumbent_ms) if ms > 0 and incumbent_ms > 0 else 0.0)
        rounds += 1
        if rounds >= min_rounds and (rounds - min_rounds) % BLOCK == 0:
            for standing in alive:
                standing.judge(each_alpha, min_gain)
        now = time.perf_counter()
        if now - last_report > PROGRESS_S:
            last_report = now
            best = min(alive, key=lambda s: s.ratio)
            logger.info("%s: duel round %d, %d challengers undecided, best %s at %.4f× the incumbent", what,
                        rounds, sum(s.verdict == "undecided" for s in standings), best.contestant.name, best.ratio)
        if now + (now - round_started) > deadline:
            break
    for standing in standings:  # final bounds for the report, whatever stopped the duel
        if standing.log_ratios and standing.verdict == "undecided":
            standing.judge(each_alpha, min_gain, min_rounds)
    return Duel(incumbent_samples, standings, rounds)
