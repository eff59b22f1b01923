"""``nvblaslt tune`` for a ``batch_invariant`` problem: a measured ladder of pins (GPU).

The problem is planned with the heuristics alone at every M the choice needs (``_invariant_choice``'s
``SPEED_M``, ``_invariant_ladder``'s ``VERIFY_M``), on one set of arrays made for the largest M, each
smaller M a view of its first tokens: the first tokens of every plan read the same data. The candidates
that cuBLASLt accepts at every extent of ``ACCEPTED_AT`` are screened in one round per M against the
default plan (its first pick); the best single kernels (max-min), each M's fastest and today's pin are
then timed in interleaved rounds within the problem's share of the budget. Each of those is run at every
M of ``VERIFY_M`` and its first ``VERIFY_TOKENS`` tokens compared bitwise with its own at the largest M:
one whose bits change is dropped; the rest are grouped by those bits into classes, and the entry
(``pinned``) records the best class's ladder (``_invariant_ladder``), its best single kernel as ``algo``,
the ladder's and that kernel's speed × the default at each M, today's pin's, and the classes found.
It records the class's ``members`` too: its timed candidates, and the default plan's own first pick at each
M of ``MEMBER_M`` where that pick has the class's split count and its bits, verified the same way, are the
class's (``member_at``: the M whose pick is a member). Split-K candidates are refused where their workspace grows
past the plan's limit before the largest M of ``ACCEPTED_AT``: ``split_refused`` says, per split count,
the largest such M within the limit and the workspace needed at 8192 rows and at the largest M.

Problems this cannot measure (batched, an operand whose tokens are not its outermost axis, C given, or an
epilog input with the tokens in it) record today's pin, as before.
"""
from __future__ import annotations

import ctypes
import hashlib
import time

from . import _batch_invariant, _invariant_choice, _invariant_ladder, _memory, _search, _tuning_db
from ._duel import Contestant
from ._cuda import check, cudart, on_device
from ._descriptors import Algorithm, HeuristicResult
from ._errors import NvblasltError
from ._invariant_choice import DEFAULT, SPEED_M, Candidate
from ._invariant_ladder import MEMBER_M, VERIFY_M, VERIFY_TOKENS
from ._logging import logger
from ._timing import Timer
from ._tune_arrays import device_array

ROUNDS = 9  # full rounds of the finalists, fewer where the budget is short
MIN_ROUNDS = 3
TODAY = "today's pin"
_PLANNED_M = tuple(sorted({*SPEED_M, *VERIFY_M, _invariant_choice.REFERENCE}))


def token_axes(spec: dict, which: str) -> tuple[str, int] | None:
    """(the operand, its axis) that holds the tokens, or None where this tuner cannot vary them: both
    operands must be matrices, no C, no epilog input of more than one axis, and the tokens the operand's
    outermost axis (the largest stride), so that a prefix of tokens is a view with the same strides."""
    if spec.get("c") or any(len(i["shape"]) != 1 for i in spec.get("inputs", {}).values()):
        return None
    name, axis = ("a", 0) if which == "rows" else ("b", 1)
    operand = spec[name]
    if len(spec["a"]["shape"]) != 2 or len(spec["b"]["shape"]) != 2:
        return None
    strides = operand["strides"]
    return (name, axis) if strides[axis] >= strides[1 - axis] else None


def first_tokens(pointer: int, layout: dict, extent: str, tokens: int, itemsize: int) -> bytes:
    """D's first ``tokens`` tokens (its rows for extent "m", columns for "n") copied from the GPU: a line
    per token where the tokens are contiguous (``is_contiguous``), else ``tokens`` elements of every line."""
    column_major = layout.get("ORDER", 0) == 0
    length, lines = (layout["ROWS"], layout["COLS"]) if column_major else (layout["COLS"], layout["ROWS"])
    contiguous = is_contiguous(layout, extent)
    width, height = (length * itemsize, tokens) if contiguous else (tokens * itemsize, lines)
    host = ctypes.create_string_buffer(width * height)
    check(cudart.cudaMemcpy2D(ctypes.addressof(host), width, pointer, layout["LD"] * itemsize, width, height,
                              cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost), "cudaMemcpy2D")
    return host.raw


def is_contiguous(layout: dict, extent: str) -> bool:
    """Whether one token of D is one line along its leading dimension."""
    return (layout.get("ORDER", 0) == 0) == (extent == "n")


class _Problem:
    """One problem's plans at every M, with the default options (the heuristics' first pick)."""

    def __init__(self, spec: dict, which: str, tokens: tuple[str, int], device: int, patterns: dict):
        from ._plan import Matmul

        self.plans: dict[int, Matmul] = {}
        self.which = which
        name, axis = tokens
        largest = max(_PLANNED_M)
        full = {**spec[name], "shape": [largest if i == axis else n for i, n in enumerate(spec[name]["shape"])]}
        made = {name: device_array(full, device, 0, patterns)}
        other = "b" if name == "a" else "a"
        made[other] = device_array(spec[other], device, 0, patterns)
        inputs = {key: device_array(value, device, 0, patterns) for key, value in spec.get("inputs", {}).items()}
        options = {k: v for k, v in (spec.get("options") or {}).items() if k != "batch_invariant"}
        fp8 = {n for n in ("a", "b") if spec[n]["dtype"].startswith("float8")}
        scales = {n: 1.0 for n in fp8 | ({"d"} if str(options.get("result_type", "")).startswith("float8") else set())}
        self.arrays = (made, inputs)  # alive as long as the plans that read them
        try:
            for m in _PLANNED_M:
                source = made[name]
                shape = [m if i == axis else n for i, n in enumerate(source.shape)]
                view = _memory.DeviceArray(source.buffer, shape, source.strides_elements, source.dtype, device, 0)
                arrays = {name: view, other: made[other]}
                plan = Matmul(arrays["a"], arrays["b"], options=options or None, quantization_scales=scales or None,
                              stream=0)
                self.plans[m] = plan
                plan.plan(epilog=spec.get("epilog", "DEFAULT"), epilog_inputs=inputs or None)
        except BaseException:
            self.free()
            raise
        reference = self.plans[_invariant_choice.REFERENCE]._launch
        self.extent = _batch_invariant.varying(reference.problem, which)
        self.itemsize = self.plans[1]._problem.types.d.itemsize

    @property
    def reference(self):
        return self.plans[_invariant_choice.REFERENCE]._launch

    def checked(self, m: int, algo: bytes) -> HeuristicResult | None:
        launch = self.plans[m]._launch
        return launch.check(launch.lib.api.cublasLtMatmulAlgo_t.from_buffer_copy(algo))

    def contestant(self, m: int, name: str, result: HeuristicResult) -> Contestant:
        plan = self.plans[m]
        return Contestant(name, lambda: plan._trial_run(0), lambda: plan._launch.select(result), result)

    def outputs(self, m: int, result: HeuristicResult, tokens: int) -> bytes:
        """The first ``tokens`` tokens' outputs of the plan at ``m`` running ``result`` (``first_tokens``)."""
        plan = self.plans[m]
        plan._launch.ensure_workspace(result.workspace_size, 0)
        plan._launch.select(result)
        pointer = plan._trial_run(0)
        return first_tokens(pointer, self.layout(m), self.extent, tokens, self.itemsize)

    def layout(self, m: int) -> dict:
        d = self.plans[m]._launch.layouts[3]
        return {name: d.get(name) for name in ("ROWS", "COLS", "LD", "ORDER")}

    def free(self) -> None:
        for plan in self.plans.values():
            plan.free()
        self.plans.clear()


def _bases(problem: _Problem, today: bytes | None) -> list[tuple[str, bytes]]:
    bases = [(TODAY, today)] if today is not None else []
    for m in _invariant_choice.CANDIDATE_M:
        bases += [(f"heuristics at M={m} #{i + 1}", r.as_bytes())
                  for i, r in enumerate(problem.plans[m].algorithms[:_invariant_choice.HEURISTIC_PICKS])]
    launch = problem.reference
    try:
        for index, result in enumerate(_search.candidates(launch, workspace_limit=launch.workspace_limit)):
            if index >= _invariant_choice.SEARCHED:
                break
            bases.append((f"search at M={_invariant_choice.REFERENCE} #{index + 1}", result.as_bytes()))
    except NvblasltError as error:  # the search is an extra: its failure leaves the heuristics' picks
        logger.info("batch-invariant tune: search beyond the heuristics failed (%s)", error)
    return bases


def _accepted(problem: _Problem, found: list[Candidate]) -> tuple[list[Candidate], dict]:
    """(the candidates cuBLASLt accepts at every extent of ``ACCEPTED_AT`` within the workspace limit, and
    ``_split_refused``'s figures for the split counts of which none is)."""
    launch, api = problem.reference, problem.reference.lib.api
    kept, needs = [], []
    ms = _invariant_choice.ACCEPTED_AT
    with _batch_invariant.reference_launches(launch, problem.extent, ms) as references:
        for candidate in found:
            algo = api.cublasLtMatmulAlgo_t.from_buffer_copy(candidate.algo)
            if _batch_invariant.accepted(references, algo, launch.workspace_limit):
                kept.append(candidate)
                continue
            splits = max(1, int(Algorithm(algo, launch.lib).get("SPLITK_NUM")))
            if splits > 1:  # why: the workspace a split's partial sums need at each M
                checks = [reference.check(algo) for reference in references]
                needs.append((splits, {m: (c.workspace_size if c is not None else None) for m, c in zip(ms, checks)}))
    kept_splits = {max(1, int(Algorithm(api.cublasLtMatmulAlgo_t.from_buffer_copy(c.algo), launch.lib)
                               .get("SPLITK_NUM"))) for c in kept}
    return kept, _split_refused([(s, n) for s, n in needs if s not in kept_splits], launch.workspace_limit)


def _split_refused(needs: list[tuple[int, dict]], limit: int) -> dict:
    """Per split count (of candidates all refused): the largest M of ``ACCEPTED_AT`` up to which its best
    candidate is accepted within ``limit``, and that candidate's workspace in MiB at 8192 rows and at the
    largest M (None: cuBLASLt refuses it there whatever the workspace)."""
    def reach(workspace: dict) -> int:
        return max((m for m in workspace if all(w is not None and w <= limit for n, w in workspace.items() if n <= m)),
                   default=0)

    def mib(value: int | None) -> float | None:
        return None if value is None else round(value / (1 << 20), 1)
    found: dict[str, dict] = {}
    largest = max(_invariant_choice.ACCEPTED_AT)
    for splits in sorted({s for s, _ in needs}):
        workspace = max((n for s, n in needs if s == splits), key=reach)
        found[str(splits)] = {"within_limit_up_to_m": reach(workspace), "limit_mib": mib(limit),
                              "mib_at_8192": mib(workspace.get(8192)), f"mib_at_{largest}": mib(workspace.get(largest))}
    return found


def _members(problem: _Problem, class_key, timed: list[bytes]) -> tuple[list[dict], list[int]]:
    """(the kept class's verified members: ``_tuning_db.algorithm_fields`` of each, one per configuration,
    the M of ``MEMBER_M`` whose default pick (``_batch_invariant.default_pick``) is one of them): ``timed``
    (of the class already) and each pick with the class's split count whose bits (``_bits``) are the class's."""
    found: dict[tuple, dict] = {}

    def add(algo: bytes) -> tuple:
        result = problem.checked(_invariant_choice.REFERENCE, algo)
        assert result is not None  # accepted at every extent of VERIFY_M, REFERENCE among them
        fields = _tuning_db.algorithm_fields(result)
        config = tuple(sorted(fields["config"].items()))
        found.setdefault(config, fields)
        return config
    for algo in timed:
        add(algo)
    picks: dict[tuple, tuple[bytes, list[int]]] = {}
    with _batch_invariant.reference_launches(problem.reference, problem.extent, MEMBER_M) as references:
        for m, reference in zip(MEMBER_M, references):
            pick = _batch_invariant.default_pick(reference)
            # why: another split count is another summation order, never this class (and may need a workspace
            # that grows past the limit with M, which _bits would run into)
            if pick is not None and max(1, int(pick.algorithm.get("SPLITK_NUM"))) == class_key[0]:
                config = tuple(sorted((k, int(v)) for k, v in pick.algorithm.config().items()))
                picks.setdefault(config, (pick.as_bytes(), []))[1].append(m)
    member_at = []
    for config, (algo, ms) in picks.items():
        if config in found or _bits(problem, algo) == class_key:
            add(algo)
            member_at += ms
    return list(found.values()), sorted(member_at)


def _bits(problem: _Problem, algo: bytes):
    """``algo``'s class key: (split count, reduction scheme, a digest of D's first ``VERIFY_TOKENS`` tokens at
    the largest M of ``VERIFY_M``), where its first tokens at every M of ``VERIFY_M`` are bitwise those;
    None where they change with M, or cuBLASLt refuses it at one."""
    largest = VERIFY_M[-1]
    whole = min(largest, VERIFY_TOKENS)
    contiguous = is_contiguous(problem.layout(largest), problem.extent)
    found = {}
    for m in (largest, *VERIFY_M[:-1]):
        result = problem.checked(m, algo)
        if result is None:
            return None
        found[m] = problem.outputs(m, result, min(m, whole))
        expected = _invariant_ladder.prefix(found[largest], contiguous, whole, min(m, whole), problem.itemsize)
        if found[m] != expected:
            return None
        if m != largest:
            del found[m]
    lib = problem.reference.lib
    algorithm = Algorithm(lib.api.cublasLtMatmulAlgo_t.from_buffer_copy(algo), lib)
    splits = max(1, int(algorithm.get("SPLITK_NUM")))
    scheme = int(algorithm.get("REDUCTION_SCHEME")) if splits > 1 else 0
    return splits, scheme, hashlib.sha256(found[largest]).hexdigest()


def measure(spec: dict, which: str, budget_s: float, device: int, patterns: dict, skip):
    """(pinned key, database entry) of the measured pin for ``spec``, None where ``skip(key)``; or
    NotImplemented where this tuner cannot vary the problem's tokens (the caller records today's pin)."""
    tokens = token_axes(spec, which)
    if tokens is None:
        return NotImplemented
    started = time.perf_counter()
    deadline = started + budget_s
    with on_device(device):
        problem = _Problem(spec, which, tokens, device, patterns)
        try:
            return _measure(problem, which, started, deadline, skip)
        finally:
            problem.free()


def _measure(problem: _Problem, which: str, started: float, deadline: float, skip):
    launch = problem.reference
    key, _ = _batch_invariant.pinned_key(launch, which)
    if skip(key):
        return None
    try:
        today = _batch_invariant.rule_pin(launch, problem.extent)
    except NvblasltError:
        today = None  # no pin without split-K: the measured candidates may still hold one
    offered = _invariant_choice.candidates(launch.lib, _bases(problem, today))
    kept, split_refused = _accepted(problem, offered)
    by_name = {c.name: c for c in kept}
    if not kept:
        raise _no_pin(launch, len(offered))
    results: dict[int, dict[str, HeuristicResult]] = {m: {} for m in SPEED_M}
    for candidate in list(kept):  # the plans' own launches (their operands' alignments) check again
        checks = {m: problem.checked(m, candidate.algo) for m in SPEED_M}
        if any(r is None for r in checks.values()):
            kept.remove(candidate)
            del by_name[candidate.name]
            continue
        for m, result in checks.items():
            assert result is not None
            results[m][candidate.name] = result
    if not kept:
        raise _no_pin(launch, len(offered))
    for m, found in results.items():
        problem.plans[m]._launch.ensure_workspace(max(r.workspace_size for r in found.values()), 0)

    def contestants_at(m: int, names) -> list[Contestant]:
        plan = problem.plans[m]
        made = [problem.contestant(m, DEFAULT, plan.algorithms[0])]
        return made + [problem.contestant(m, n, results[m][n]) for n in names]

    with Timer(device=launch.device, stream=0) as timer:
        screen_begun = time.perf_counter()
        screened = _invariant_choice.table(timer, contestants_at, list(by_name), 1)
        per_sample = (time.perf_counter() - screen_begun) / (2 * (len(by_name) + 1))
        names = _invariant_ladder.timed_finalists(screened, keep=[TODAY])
        affordable = int(0.6 * (deadline - time.perf_counter()) / max(per_sample * (len(names) + 1), 1e-6))
        rounds = max(MIN_ROUNDS, min(ROUNDS, affordable))
        timed = _invariant_choice.table(timer, contestants_at, names, rounds)
    keys: dict[str, object] = {}

    def bits(name: str):
        if name not in keys:
            keys[name] = _bits(problem, by_name[name].algo)
        return keys[name]
    outcome = _invariant_ladder.build(timed, bits)
    if outcome.ladder is None or outcome.reference is None:
        raise _no_pin(launch, len(offered), f"; {len(outcome.dropped)} timed ones changed row bits with M")
    class_key = keys[outcome.reference]
    members, member_at = _members(problem, class_key, [by_name[n].algo for n in timed if keys.get(n) == class_key])

    def at_reference(name: str) -> HeuristicResult:
        result = problem.checked(_invariant_choice.REFERENCE, by_name[name].algo)
        assert result is not None  # accepted at every extent of ACCEPTED_AT, REFERENCE among them
        return result
    ladder = [{"up_to": bound, "source": name, "speed": _rounded(timed[name]),
               **_tuning_db.algorithm_fields(at_reference(name))} for bound, name in outcome.ladder.rungs]
    reference = outcome.reference
    facts = {"source": reference, "ladder": ladder, "speed": _rounded(outcome.ladder.speed),
             "worst_over_target": round(_invariant_choice.score(outcome.ladder.speed), 4),
             "single_speed": _rounded(timed[reference]), "rounds": rounds, "candidates": len(offered),
             "accepted": len(kept), "bits_differ": outcome.dropped,
             "classes": [{**found, "members": len(found["members"])} for found in outcome.classes],
             "members": members, "member_at": member_at, "seconds": round(time.perf_counter() - started, 1)}
    if split_refused:
        facts["split_refused"] = split_refused
    if TODAY in timed:
        facts["today_speed"] = _rounded(timed[TODAY])
    return _batch_invariant.pinned_entry(launch, which, at_reference(reference), **facts)


def _rounded(speeds: dict[int, float]) -> dict[str, float]:
    return {str(m): round(r, 4) for m, r in sorted(speeds.items())}


def _no_pin(launch, offered: int, why: str = "") -> NvblasltError:
    from ._errors import NvblasltUnsupportedError

    return NvblasltUnsupportedError(f"batch_invariant tune: none of {offered} candidates for "
                                    f"{launch.problem.describe()} is accepted at every M of "
                                    f"{_invariant_choice.ACCEPTED_AT} with the same bits{why}")
