"""The measured batch-invariant pin, the part that needs no GPU: which candidates, how they are timed
against the default plan, and which one wins on the timings (``_invariant_tune`` runs it on the GPU).

**Candidates** (per problem with M left out): the heuristics' first ``HEURISTIC_PICKS`` picks at each M
of ``CANDIDATE_M``, the first ``SEARCHED`` configurations ``_search`` finds beyond them at ``REFERENCE``
rows, and today's pin; each with split-K of every count of ``SPLITS`` (1: off; more: a fixed count with
the COMPUTE_TYPE reduction, whose sums do not depend on M). Duplicates are left out by configuration.
Only those cuBLASLt accepts at every extent of ``ACCEPTED_AT`` within the workspace limit are timed.

**The choice**: each candidate's speed × the default plan's at each M of ``SPEED_M`` (the median, over
interleaved rounds, of the default's time over the candidate's in the same round), divided by the
target at that M (``target``: 0.95 at M ≤ 64, 0.85 from 256 on). The pin is the candidate whose worst
such quotient is highest (max-min: the pin closest to meeting both ends); candidates within ``TIE`` of
that worst are ranked by the geometric mean of their speeds. Down that ranking, the first whose rows are
bitwise the same at every M of ``BITWISE_M`` is kept: a candidate whose bits change is never kept.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ._duel import Contestant
from ._descriptors import Algorithm
from ._errors import CublasLtError
from ._timing import shuffled_rounds

REFERENCE = 1024  # rows the search beyond the heuristics runs at
# timed against the default plan, at every power of two the heuristics switch kernels between: a ladder's
# rung serves the M up to its point, and a coarser grid (1, 16, 64, 256, 1024, 8192) left M = 32 and 512 on
# rungs chosen for 64 and 1024, at 0.60-0.74x the default (H200, bench.tuning's invariance part)
# every power of two but 2 and 4, and the M halfway between each two from 8 up: where the default switches
# to split-K (K 14336 → N 4096 at M = 48 on an H200), only a rung timed there can follow it
SPEED_M = (1, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
CANDIDATE_M = SPEED_M  # the heuristics' picks at each
BITWISE_M = (1, 7, 64, 300, 8192)  # rows compared with those at M = 1 (and 7)
ACCEPTED_AT = tuple(sorted({*SPEED_M, *BITWISE_M, 32768}))  # cuBLASLt must accept a pin at each
SPLITS = (1, 2, 4, 8)
HEURISTIC_PICKS = 4
SEARCHED = 16
SMALL_M = 64  # at or below: decode-sized (target 0.95×); from LARGE_M on: prefill-sized (0.85×)
LARGE_M = 256
TARGETS = {"small": 0.95, "large": 0.85}
TIE = 0.01  # worst quotients this close rank by their geometric mean
FINALISTS = 6  # screened candidates timed in full rounds (today's pin always among them)
DEFAULT = "default"  # the contestant every ratio is taken against


@dataclass(frozen=True)
class Candidate:
    """A configuration to time: ``name`` says where it came from, ``algo`` is its 64 bytes."""

    name: str
    algo: bytes


def target(m: int) -> float:
    """The speed × the default that the issue asks of a batch-invariant plan at ``m`` rows."""
    return TARGETS["small"] if m <= SMALL_M else TARGETS["large"]


def with_split(lib, algo: bytes, splits: int) -> bytes | None:
    """``algo`` with split-K ``splits`` (1: off; more: the COMPUTE_TYPE reduction), or None where the
    library does not take the setting."""
    copy = lib.api.cublasLtMatmulAlgo_t.from_buffer_copy(algo)
    algorithm = Algorithm(copy, lib)
    try:
        algorithm.set("SPLITK_NUM", splits)
        algorithm.set("REDUCTION_SCHEME", int(lib.api.CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE) if splits > 1 else 0)
    except CublasLtError:
        return None
    return bytes(copy)


def config_of(lib, algo: bytes) -> tuple:
    """What makes two algorithms one configuration (``_search.config_key``'s form)."""
    return tuple(sorted(Algorithm(lib.api.cublasLtMatmulAlgo_t.from_buffer_copy(algo), lib).config().items()))


def candidates(lib, bases: Iterable[tuple[str, bytes]], splits: Sequence[int] = SPLITS) -> list[Candidate]:
    """Each base (name, algorithm bytes) with every split count of ``splits``, in that order, without
    duplicate configurations (the first name is kept)."""
    found: list[Candidate] = []
    seen: set[tuple] = set()
    for name, algo in bases:
        for count in splits:
            made = with_split(lib, algo, count)
            if made is None:
                continue
            key = config_of(lib, made)
            if key not in seen:
                seen.add(key)
                found.append(Candidate(f"{name}, split-K {count}" if count > 1 else name, made))
    return found


# ---- timing ----------------------------------------------------------------------------------------------
def speeds(timer, contestants: Sequence[Contestant], rounds: int) -> dict[str, float]:
    """{name: the default's time over the contestant's, the median over ``rounds`` interleaved rounds} for
    every contestant but the default (``contestants[0]``, named ``DEFAULT``), after one warm-up run each."""
    for contestant in contestants:  # module loads, first-launch costs
        if contestant.prepare is not None:
            contestant.prepare()
        contestant.run()
    timer.synchronize()
    samples = shuffled_rounds(contestants, rounds, lambda c: timer(c.run, c.prepare))
    default = samples[0]
    return {c.name: statistics.median(d / s for d, s in zip(default, taken))
            for c, taken in zip(contestants[1:], samples[1:])}


def table(timer, contestants_at: Callable[[int, Sequence[str]], list[Contestant]], names: Sequence[str],
          rounds: int, ms: Sequence[int] = SPEED_M) -> dict[str, dict[int, float]]:
    """{name: {M: speed × the default}} for ``names`` at every M of ``ms``; ``contestants_at(m, names)``
    makes the default then each named candidate for the plan at M."""
    found: dict[str, dict[int, float]] = {name: {} for name in names}
    for m in ms:
        for name, ratio in speeds(timer, contestants_at(m, names), rounds).items():
            found[name][m] = ratio
    return found


# ---- the choice ------------------------------------------------------------------------------------------
def score(ratios: dict[int, float], within: Callable[[int], bool] = lambda m: True) -> float:
    """The worst of speed / target over the M that ``within`` admits (the max-min objective)."""
    return min((r / target(m) for m, r in ratios.items() if within(m)), default=0.0)


def geomean(ratios: dict[int, float]) -> float:
    return math.exp(statistics.fmean(math.log(r) for r in ratios.values())) if ratios else 0.0


def ranking(speeds_by_name: dict[str, dict[int, float]],
            within: Callable[[int], bool] = lambda m: True) -> list[str]:
    """The names, best first: by worst speed / target over the M ``within`` admits, those within ``TIE``
    of the best by their geometric mean."""
    scored = sorted(speeds_by_name, key=lambda n: score(speeds_by_name[n], within), reverse=True)
    if not scored:
        return []
    best = score(speeds_by_name[scored[0]], within)
    close = [n for n in scored if score(speeds_by_name[n], within) >= best - TIE]
    close.sort(key=lambda n: geomean({m: r for m, r in speeds_by_name[n].items() if within(m)}), reverse=True)
    return close + [n for n in scored if n not in close]


def choose(speeds_by_name: dict[str, dict[int, float]], invariant: Callable[[str], bool]) -> str | None:
    """The first name down ``ranking`` whose rows ``invariant`` finds bitwise the same at every M; None
    where none is."""
    return next((name for name in ranking(speeds_by_name) if invariant(name)), None)


def finalists(screened: dict[str, dict[int, float]], keep: Iterable[str] = ()) -> list[str]:
    """The ``FINALISTS`` best screened names, and those of ``keep`` that were screened."""
    best = ranking(screened)[:FINALISTS]
    return best + [name for name in keep if name in screened and name not in best]


def small(m: int) -> bool:
    return m <= SMALL_M


def large(m: int) -> bool:
    return m >= LARGE_M
