"""``options.batch_invariant``: an algorithm pinned for every M (one, or a tuning database's ladder of one
bit class), so that row i of the result is bitwise the same whatever the number of rows (on the same GPU
and cuBLASLt).

cuBLASLt's heuristics pick their kernel from the whole problem shape, so the kernel, its tile and its
split-K (which changes the order of the K sum) change as M grows; row 0 of ``x[:M] @ W`` then changes
too (issue 35 measured it from M = 31 at 4096×4096, bf16, H200). Here the algorithm is pinned per
the problem with the varying extent left out (the ``pinned key``): N, K, types, layouts' orders,
alignments, epilog, GPU and library. It is, in order: the pin a loaded tuning database records for that
key (where its entry has a ladder, the rung for this plan's M: kernels verified at tune time to give
the same bits, ``_invariant_ladder``), the one this process chose before, or the heuristics' first
pick for the problem at ``REFERENCE`` rows that, with split-K off (``SPLITK_NUM`` 1, no reduction scheme), cuBLASLt accepts at every
extent of ``CHECKED_AT`` (``FP8_CHECKED_AT`` for fp8). Each plan re-checks the pin for its own M, and
refuses where cuBLASLt does not accept it: a different kernel would silently give different bits.

**Members between the ladder's points.** A ladder's rung is timed only at the top of its range; between
two points the default plan may run another tile (wave quantization), which the rung never matches. So
where the database's entry lists its class's verified members, a plan asks the heuristics for its own M
as the default plan does (the launch's own preference) and runs their first pick if it is one of those
members (every config attribute equal, the split count among them; the member's verified bytes run),
else the rung. So wherever the default plan's kernel is in the class, the batch-invariant plan runs that
very kernel, with bits verified at tune time; where the default splits K, or picks a kernel never
verified, the rung runs. (The heuristics' first pick with split-K merely excluded is no substitute: on an
H200 it was a kernel 8–20× slower than the rung at small M.) Plans are cached per M, so this query is
paid once per new M, never per call.

A database's pin (``nvblaslt tune --batch-invariant`` measures one: ``_invariant_tune``) may split K into a
count fixed for every M, with the COMPUTE_TYPE reduction (partial sums in the workspace, summed in a second
step in a fixed order): row i's sums then do not depend on M either. Any other split-K pin is refused.

"The varying extent" is, in cuBLASLt's column-major problem (``_problem``), D's rows (``m``) or
columns (``n``): the caller's rows map to ``n`` when nvblaslt solves the transposed problem.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from . import _tuning_cache, _tuning_db
from ._descriptors import Algorithm, MatmulPreference, MatrixLayout, heuristics
from ._errors import CublasLtError, NvblasltUnsupportedError, NvblasltValueError
from ._logging import logger

REFERENCE = 1024  # rows the pin is chosen at: a prefill-sized batch, where a kernel's tile matters most
CHECKED_AT = (1, 7, REFERENCE)  # a pin must be accepted at each (a single row, an odd count, the reference)
FP8_CHECKED_AT = (16, 48, REFERENCE)  # fp8 extents are multiples of 16 (_problem.FP8_MULTIPLE)
CANDIDATES = 16  # heuristic picks tried, best first
_COL = 0  # CUBLASLT_ORDER_COL
_OP_N = 0  # CUBLAS_OP_N

_pins: dict[str, bytes] = {}  # pinned key -> the algorithm's 64 bytes, chosen in this process
_lock = threading.Lock()


def varying(problem, which: str) -> str:
    """``"m"`` or ``"n"``: the extent of cuBLASLt's D that ``which`` ("rows"/"columns" of the caller's
    result) names, for ``problem`` (a canonical ``_problem.Problem``)."""
    return "n" if (which == "rows") == bool(problem.transposed) else "m"


def _varying_fields(description: dict, extent: str) -> list[str | None]:
    """Per layout (A, B, C, D): the attribute holding the varying extent, or None."""
    desc = description["desc"]
    a = ("ROWS" if desc.get("TRANSA", _OP_N) == _OP_N else "COLS") if extent == "m" else None
    b = ("COLS" if desc.get("TRANSB", _OP_N) == _OP_N else "ROWS") if extent == "n" else None
    cd = "ROWS" if extent == "m" else "COLS"
    return [a, b, cd, cd]


def _leading(layout: dict, attribute: str) -> bool:
    """Whether ``attribute`` is the extent the leading dimension spans (rows, in column-major order)."""
    return (attribute == "ROWS") == (layout.get("ORDER", _COL) == _COL)


def pinned_description(description: dict, extent: str) -> dict:
    """``description`` (``_tuning_cache.problem_description``) with the varying extent, and the leading
    dimensions and batch strides that follow it, left out."""
    layouts = []
    for layout, attribute in zip(description["layouts"], _varying_fields(description, extent)):
        layout = dict(layout)
        if attribute is not None:
            layout[attribute] = "*"
            layout["STRIDED_BATCH_OFFSET"] = "*"
            if _leading(layout, attribute):
                layout["LD"] = "*"
        layouts.append(layout)
    return {**description, "layouts": layouts, "batch_invariant": extent}


def _reference_layouts(launch, extent: str, size: int) -> list[MatrixLayout]:
    """The launch's four layouts with the varying extent set to ``size`` (leading dimensions and batch
    strides following it)."""
    description = _tuning_cache.problem_description(launch)
    made = []
    try:
        for layout, attribute in zip(description["layouts"], _varying_fields(description, extent)):
            rows, cols, ld = layout["ROWS"], layout["COLS"], layout["LD"]
            stride = layout.get("STRIDED_BATCH_OFFSET", 0)
            if attribute is not None:
                rows, cols = (size, cols) if attribute == "ROWS" else (rows, size)
                if _leading(layout, attribute) and ld:  # ld 0: a broadcast C column stays one
                    ld = size
                if stride:
                    stride = ld * (cols if layout.get("ORDER", _COL) == _COL else rows)
            order = layout.get("ORDER", _COL)
            made.append(MatrixLayout(layout["TYPE"], rows, cols, ld, order=order if order != _COL else None,
                                     batch_count=layout.get("BATCH_COUNT", 1), batch_stride=stride, lib=launch.lib))
    except BaseException:
        for layout in made:
            layout.close()
        raise
    return made


def without_split_k(launch, algo):
    """A copy of ``algo`` (a ``cublasLtMatmulAlgo_t``) with split-K off."""
    copy = launch.lib.api.cublasLtMatmulAlgo_t.from_buffer_copy(algo)
    algorithm = Algorithm(copy, launch.lib)
    algorithm.set("SPLITK_NUM", 1)
    algorithm.set("REDUCTION_SCHEME", 0)
    return copy


def split_fault(algorithm: Algorithm, api) -> str | None:
    """Why ``algorithm`` cannot be a pin (its sums would depend on M), or None: split-K is allowed with a
    fixed count and the COMPUTE_TYPE reduction only."""
    if algorithm.get("SPLITK_NUM") <= 1:
        return None
    if algorithm.get("REDUCTION_SCHEME") == int(api.CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE):
        return None
    return "splits K without the COMPUTE_TYPE reduction, so its sums depend on the problem"


@contextlib.contextmanager
def reference_launches(launch, extent: str, sizes) -> Iterator[list]:
    """Launches of ``launch``'s problem with the varying extent set to each of ``sizes``, for
    ``cublasLtMatmulAlgoCheck`` alone (nothing runs on them): the launch's own descriptors over other
    layouts, closed on exit, never through ``Launch.close``."""
    references: list = []
    try:
        for size in sizes:
            layouts = _reference_layouts(launch, extent, size)
            references.append((layouts, type(launch)(launch.lib, launch.problem, launch.handle, launch.desc, layouts,
                                                     launch.preference, workspace_limit=launch.workspace_limit,
                                                     device=launch.device, alpha=None, beta=None)))
        yield [reference for _, reference in references]
    finally:
        for layouts, _ in references:
            for layout in layouts:
                layout.close()


def accepted(references, algo, workspace_limit: int) -> bool:
    """Whether cuBLASLt accepts ``algo`` at every reference launch, within ``workspace_limit``."""
    for reference in references:
        checked = reference.check(algo)
        if checked is None or checked.workspace_size > workspace_limit:
            return False
    return True


def rule_pin(launch, extent: str) -> bytes:
    """Today's rule, where no database has a pin: the first of the heuristics' picks at ``REFERENCE``
    rows that, split-K off, cuBLASLt accepts at every extent of ``CHECKED_AT`` (fp8: ``FP8_CHECKED_AT``)."""
    checked_at = FP8_CHECKED_AT if getattr(launch.problem, "fp8", False) else CHECKED_AT
    with reference_launches(launch, extent, checked_at) as references:
        a, b, c, d = references[checked_at.index(REFERENCE)].layouts
        try:
            offered = heuristics(launch.handle, launch.desc, a, b, c, d, launch.preference, count=CANDIDATES)
        except CublasLtError:
            offered = []
        for result in offered:
            algo = without_split_k(launch, result.algorithm.algo)
            if accepted(references, algo, launch.workspace_limit):
                return bytes(algo)
    raise NvblasltUnsupportedError(f"options.batch_invariant: cuBLASLt offers no algorithm for "
                                   f"{launch.problem.describe()} that, without split-K, it accepts at "
                                   f"{extent.upper()} = {', '.join(map(str, checked_at))}; row-for-row identical "
                                   f"results cannot be guaranteed for this problem")


def default_pick(launch):
    """The heuristics' first pick (a HeuristicResult) for ``launch``'s own layouts and preference: the
    kernel the same plan without ``batch_invariant`` would run; None where they offer none."""
    a, b, c, d = launch.layouts
    try:
        offered = heuristics(launch.handle, launch.desc, a, b, c, d, launch.preference, count=1)
    except CublasLtError:
        return None
    return offered[0] if offered else None


def member_for(launch, entry: dict) -> bytes | None:
    """The verified member of ``entry``'s class (a database's ladder) that is the default plan's own pick
    for ``launch``'s M (``default_pick``), as its recorded bytes; None where that pick is none of them (a
    split-K pick of a class without split-K never is: the split count is a config attribute), or where
    cuBLASLt refuses it here, or where it is not what it says (a hand-edited entry)."""
    if not _tuning_db.members_of(entry):
        return None
    pick = default_pick(launch)
    if pick is None:
        return None
    found = _tuning_db.member_matching(entry, pick.algorithm.config())
    if found is None:
        return None
    raw = bytes.fromhex(found)
    algo = launch.lib.api.cublasLtMatmulAlgo_t.from_buffer_copy(raw)
    algorithm = Algorithm(algo, launch.lib)
    # a hand-edited member: bytes of another kernel than its recorded config, or a split no pin may have;
    # never run, the rung serves (a verified member never has either)
    if algorithm.config() != pick.algorithm.config() or split_fault(algorithm, launch.lib.api) is not None:
        return None
    result = launch.check(algo)
    return raw if result is not None and result.workspace_size <= launch.workspace_limit else None


def pinned_key(launch, which: str) -> tuple[str, dict]:
    """(the pinned key, its description) of ``launch``'s problem, the caller's ``which`` extent varying."""
    description = pinned_description(_tuning_cache.problem_description(launch), varying(launch.problem, which))
    return _tuning_cache.problem_key(description), description


def pinned(launch, which: str):
    """The HeuristicResult a batch-invariant ``launch`` runs (``which``: "rows" or "columns"), checked
    for its own M; NvblasltUnsupportedError where cuBLASLt refuses the pin for it."""
    extent = varying(launch.problem, which)
    size = launch.problem.m if extent == "m" else launch.problem.n
    key, description = pinned_key(launch, which)
    entry = _tuning_db.lookup(description, key)
    source = "tuning database"
    if entry is not None and entry.get("kind") == "pinned":
        member = member_for(launch, entry) if entry.get("ladder") else None
        if member is not None:  # the default's own pick for this M, verified in the ladder's class
            raw = member
            source += f"'s ladder, the class member the default plan picks at {extent.upper()} = {size}"
        else:
            algo, bound = _tuning_db.pinned_algo(entry, size)  # a ladder's rung for this M: verified in one bit class
            raw = bytes.fromhex(algo)
            if entry.get("ladder"):
                source += f"'s ladder, the rung {'for every larger M' if bound is None else f'up to {bound}'}"
    else:
        with _lock:
            known = _pins.get(key)
        source = "this process"
        if known is None:
            chosen = rule_pin(launch, extent)
            with _lock:
                known = _pins.setdefault(key, chosen)  # another thread's pin, if it chose first
        raw = known
    algo = launch.lib.api.cublasLtMatmulAlgo_t.from_buffer_copy(raw)
    fault = split_fault(Algorithm(algo, launch.lib), launch.lib.api)
    if fault is not None:
        raise NvblasltValueError(f"options.batch_invariant: the {source}'s pinned algorithm for "
                                 f"{launch.problem.describe()} {fault}; re-tune the database")
    result = launch.check(algo)
    if result is None or result.workspace_size > launch.workspace_limit:
        raise NvblasltUnsupportedError(f"options.batch_invariant: cuBLASLt does not accept the algorithm pinned for "
                                       f"{launch.problem.describe()} (from {source}) at {extent.upper()} = {size}; "
                                       f"row-for-row identical results cannot be guaranteed here")
    logger.debug("batch_invariant: %s pinned for %s (from %s)", _tuning_cache.describe_algorithm(result),
                 launch.problem.describe(), source)
    return result


def pinned_entry(launch, which: str, result=None, **facts) -> tuple[str, dict]:
    """(pinned key, a database entry) for ``result`` (a HeuristicResult; default the pin ``launch`` runs):
    what ``nvblaslt tune`` records, with ``facts`` for people."""
    key, description = pinned_key(launch, which)
    summary = _tuning_cache.problem_summary(description, launch.lib.api)
    chosen = launch.algorithm if result is None else result
    return key, _tuning_db.entry_for(chosen, "pinned", problem=summary, **facts)
