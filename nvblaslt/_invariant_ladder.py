"""The batch-invariant ladder, the part that needs no GPU: which kernel serves which range of M, and which
bit class the ladder is drawn from (``_invariant_tune`` times and verifies the candidates on the GPU).

**Why a ladder may mix kernels.** Without split-K each output is one CTA's sequential sum over K, whatever
the tile: on an H200 (cuBLASLt 13.1, bf16 RELU_BIAS) the heuristics' first four picks at M = 1 … 8192,
18–22 kernels per (N, K), gave token 0 bitwise the same outputs at every M, one bit class per shape
(``tools/probe_invariant_pairs``). No single kernel is fast at both ends (0.55–0.96× the default at
M ≤ 64, 0.59–1.02× from 256), but the best of the class at each M is 0.88–1.09× on three of the four pairs.
Equal bits on one input are evidence, not proof: every member's bits are checked at tune time.

**Classes.** A candidate whose first tokens change with M is dropped. The others are grouped by their
bits (and their split count and reduction scheme: a fixed split count sums in another order); each group
is a class, and one class is kept: the one whose ladder scores best.

**The ladder of a class**: at each M of ``SPEED_M`` (ascending), its fastest member, except that the
member of the previous M stays while it is within ``KEEP_WITHIN`` of the fastest (fewer rungs, and noise
does not switch kernels). M between two points of ``SPEED_M`` goes to the member chosen at the point
above: a kernel's time does not grow as M shrinks (its grid along M only shrinks), so the measured time at
the range's top bounds it over the whole range, while the member of the point below was never timed
above its point (``tools/probe_invariant_pairs``: the best at M = 64 ran at 0.56× at M = 256 on
4096×4096). M beyond the last point goes to the last point's member. Consecutive points with one member
make one rung. A class's ladder is scored like a single pin (``_invariant_choice.score``: the worst speed
over target, ties within ``TIE`` by the geometric mean), with each M's speed that of the member serving it.

**Members.** Between the points the default plan may run a tile no rung matches (0.66–0.83× the default
at M = 192, 768 and 1536 on an H200). So the kept class's members are recorded too: the timed ones, and
the default plan's own first pick at each M of ``MEMBER_M`` (the ladder's points, the M between them that
the bench times, and quarter steps besides) where it has the class's split count, each verified like a
candidate; a plan runs the default's pick for its own M where it is one of them
(``_batch_invariant.member_for``), so a member runs only where it is what the default itself runs.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from ._invariant_choice import BITWISE_M, SPEED_M, TIE, finalists, ranking, score

KEEP_WITHIN = TIE  # a member stays at the next M while this close to the fastest there
PER_M = 2  # besides the max-min finalists, each M's fastest screened candidates are timed in full
VERIFY_M = tuple(sorted({*BITWISE_M, *SPEED_M, *(m + 1 for m in SPEED_M[:-1])}))  # each range's two ends too
VERIFY_TOKENS = 128  # tokens compared at each M: a whole tile along M for the tiles seen (64, 128)
# where the default plan's own picks are verified as members: 1 … 8, then 1, 1.25, 1.5 and 1.75 times each
# power of two (the bench's M between points are the 1.5 steps; the others catch wave-count changes between)
MEMBER_M = (*range(1, 8), *(2 ** e * q // 4 for e in range(3, 13) for q in (4, 5, 6, 7)), SPEED_M[-1])


@dataclass(frozen=True)
class Ladder:
    """``rungs``: (upper M bound, None for every larger M; member name), bounds ascending; ``speed``: at
    each M of ``SPEED_M``, the speed × the default of the member serving it."""

    rungs: tuple[tuple[int | None, str], ...]
    speed: dict[int, float] = field(default_factory=dict)

    def serving(self, m: int) -> str:
        return next(name for bound, name in self.rungs if bound is None or m <= bound)


@dataclass(frozen=True)
class Outcome:
    """The kept class's ``ladder`` (None: no candidate kept its bits) and ``reference`` (its best single
    kernel, the entry's ``algo``), every class found (``classes``: its members, best single first, and its
    ladder's score) and the candidates dropped because their bits changed with M."""

    ladder: Ladder | None
    reference: str | None
    classes: list[dict]
    dropped: list[str]


def ladder(members: Sequence[str], speeds: dict[str, dict[int, float]], ms: Sequence[int] = SPEED_M) -> Ladder:
    """The ladder of ``members`` (one class) on ``speeds`` ({name: {M: speed × the default}})."""
    chosen: list[tuple[int, str]] = []
    current: str | None = None
    for m in ms:
        fastest = max(members, key=lambda name: speeds[name].get(m, 0.0))
        if current is None or speeds[current].get(m, 0.0) < speeds[fastest].get(m, 0.0) * (1 - KEEP_WITHIN):
            current = fastest
        chosen.append((m, current))
    rungs: list[tuple[int | None, str]] = []
    for m, name in chosen:
        if rungs and rungs[-1][1] == name:
            rungs[-1] = (m, name)
        else:
            rungs.append((m, name))
    rungs[-1] = (None, rungs[-1][1])
    return Ladder(tuple(rungs), {m: speeds[name].get(m, 0.0) for m, name in chosen})


def build(speeds: dict[str, dict[int, float]], bits: Callable[[str], Hashable | None]) -> Outcome:
    """The ladder of the best class: ``bits(name)`` is a candidate's class key (its verified bits, split
    count and reduction scheme), None where its bits change with M (dropped)."""
    groups: dict[Hashable, list[str]] = {}
    dropped = []
    for name in ranking(speeds):  # best single kernel first: each class's first member is its reference
        key = bits(name)
        if key is None:
            dropped.append(name)
        else:
            groups.setdefault(key, []).append(name)
    ladders = {f"class {i}": (ladder(members, speeds), members) for i, members in enumerate(groups.values())}
    classes = [{"members": members, "worst_over_target": round(score(found.speed), 4)}
               for found, members in ladders.values()]
    if not ladders:
        return Outcome(None, None, classes, dropped)
    best = ranking({name: found.speed for name, (found, _) in ladders.items()})[0]
    found, members = ladders[best]
    return Outcome(found, members[0], classes, dropped)


def timed_finalists(screened: dict[str, dict[int, float]], keep: Sequence[str] = ()) -> list[str]:
    """``_invariant_choice.finalists`` (the best single kernels and ``keep``), then each M's ``PER_M``
    fastest screened candidates: a ladder needs the fastest at each M, not only the best all-rounders."""
    names = finalists(screened, keep)
    for m in SPEED_M:
        for name in sorted(screened, key=lambda n: screened[n].get(m, 0.0), reverse=True)[:PER_M]:
            if name not in names:
                names.append(name)
    return names


def prefix(block: bytes, contiguous: bool, tokens: int, wanted: int, itemsize: int) -> bytes:
    """The first ``wanted`` tokens of a copy ``block`` of ``tokens`` tokens: a line per token where
    ``contiguous``, else ``tokens`` elements of every line."""
    if contiguous:
        return block[:len(block) // tokens * wanted]
    width, keep = tokens * itemsize, wanted * itemsize
    return b"".join(block[start:start + keep] for start in range(0, len(block), width))

