"""Tuning a grouped plan with ``Matmul``'s engine (``_autotune``): the heuristic list timed in
interleaved rounds with the L2 flushed, and with ``search`` the candidates beyond it (``_search``:
the heuristics' deeper ranking, cluster-shape and swizzle variants, every algorithm id and tile the
library's check accepts for grouped layouts), a challenger kept only when it beats the incumbent
beyond the measured noise.

``_autotune`` drives a plan through a small surface (``launch``, ``trial_run``, ``algorithms``…);
``GroupedTrial`` is that surface for a ``GroupedMatmul``: the plan is its own launch, and every
trial run writes a scratch result, never the caller's.
"""

from __future__ import annotations

from . import _autotune, _cuda, _memory, _tuning_cache
from ._descriptors import HeuristicResult
from ._epilogs import MatmulEpilog
from ._errors import NvblasltStateError, NvblasltValueError


class GroupedTrial:
    """A grouped plan as ``_autotune`` drives it: runs on the plan's last operands into scratch memory."""

    epilog = MatmulEpilog.DEFAULT  # grouped plans have no epilog: no bias-gradient form to choose
    split_form = None

    def __init__(self, plan, bound, stream: int):
        self.launch = plan
        self.device, self.stream = plan.device, stream
        # autotune()'s report, which the plan drops once it runs another algorithm: a search starts from its pick
        self.tuning_report = plan.tuning_report
        self._plan, self._bound = plan, bound
        problem = bound.problem
        self._scratch, _ = _memory.own_allocator(problem.out_shape, problem.out_strides, problem.d.dtype,
                                                 plan.device)(stream, stream)

    @property
    def algorithms(self) -> list[HeuristicResult]:
        return self._plan.algorithms

    @property
    def algorithm(self) -> HeuristicResult | None:
        return self._plan.algorithm

    def trial_run(self, stream: int) -> None:
        """The selected algorithm once, derive kernel included, into the scratch result."""
        self._plan.run(self._bound, out=self._scratch, stream=stream, check_offsets=False)

    def close(self) -> None:
        self._scratch.buffer.release()


def check_arguments(iterations, budget_s) -> None:
    """Refuse ``autotune``'s arguments by name before anything runs."""
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise NvblasltValueError(f"iterations: expected a positive int, got {iterations!r}")
    if budget_s is not None and (isinstance(budget_s, bool) or not isinstance(budget_s, (int, float))
                                 or not budget_s > 0):
        raise NvblasltValueError(f"budget_s: expected a positive number of seconds or None, got {budget_s!r}")


def autotune(plan, bound, stream: int, *, iterations: int, search: bool, remember: bool,
             budget_s: float | None) -> list[tuple[HeuristicResult, float]]:
    """``GroupedMatmul.autotune``'s work: time (and with ``search``, look beyond) the plan's algorithms
    on ``bound``'s operands on ``stream``, select the fastest, remember it; the timings, the selected one
    first."""
    if _cuda.is_capturing(stream):
        raise NvblasltStateError("autotune: waits for the GPU, which a CUDA graph being captured forbids")
    planned, chosen, report = list(plan.algorithms), plan.algorithm, plan.tuning_report
    trial = GroupedTrial(plan, bound, stream)
    try:
        with _cuda.on_device(plan.device):
            timings = _autotune.autotune(trial, iterations=iterations, search=search, remember=False, stream=stream,
                                         budget_s=_autotune.SEARCH_BUDGET_S if budget_s is None else budget_s)
    except BaseException:  # a refusal, a CUDA error, Ctrl-C: the plan keeps the algorithms and the one it ran
        plan.algorithms = planned
        if chosen is not None:
            plan.select(chosen)
        plan.tuning_report = report
        raise
    finally:
        trial.close()
    best, best_ms = timings[0]
    plan.select(best)
    plan.tuning_report = trial.tuning_report
    # the planned algorithms cuBLASLt ran (the engine left out those refused at launch), in timed order after
    # the choice; a searched winner joins them, the other candidates screened do not
    ran, timed = list(plan.algorithms), [result for result, _ in timings]
    plan.algorithms = [best, *(r for r in timed[1:] if any(r is p for p in ran)),
                       *(p for p in ran if all(p is not r for r in timed))]
    report = trial.tuning_report
    assert report is not None  # the engine sets it
    if remember:
        facts = {"confidence": round(report.confidence, 4), "switched": report.switched} if search else {}
        _tuning_cache.remember(plan, best, best_ms, **facts)
    return timings
