"""Tuning a grouped plan with ``Matmul``'s engine (``_autotune``): the heuristic list timed in
interleaved rounds with the L2 flushed, and with ``search`` the candidates beyond it (``_search``:
the heuristics' deeper ranking, cluster-shape and swizzle variants, every algorithm id and tile the
library's check accepts for grouped layouts), a challenger kept only when it beats the incumbent
beyond the measured noise.

``_autotune`` drives a plan through ``_protocols.TunablePlan``; ``GroupedTrial`` is that surface for
a ``GroupedMatmul``: the plan's own ``Launch``, and trial runs that write a scratch result, never the
caller's. What the engine chose comes back as a ``TuningResult`` the plan applies.
"""

from __future__ import annotations

from . import _autotune, _cuda, _memory, _tuning_cache
from ._tuning_result import TuningReport, TuningResult
from ._descriptors import HeuristicResult
from ._epilogs import MatmulEpilog
from ._errors import NvblasltStateError, NvblasltValueError
from ._launch import Launch


class GroupedTrial:
    """A grouped plan as ``_autotune`` drives it (a ``TunablePlan``): runs on the plan's last operands into
    scratch memory. Grouped plans have no epilog, so no bias-gradient form to choose."""

    _epilog = MatmulEpilog.DEFAULT
    _split_form = None

    def __init__(self, plan, bound, stream: int):
        self._launch: Launch = plan._launch
        self.device, self.stream = plan.device, stream
        # autotune()'s report, which the plan drops once it runs another algorithm: a search starts from its pick
        self.tuning_report: TuningReport | None = plan.tuning_report
        self._plan, self._bound = plan, bound
        problem = bound.problem
        self._scratch, _ = _memory.own_allocator(problem.out_shape, problem.out_strides, problem.d.dtype,
                                                 plan.device)(stream, stream)

    @property
    def algorithms(self) -> list[HeuristicResult]:
        return self._launch.algorithms

    @property
    def algorithm(self) -> HeuristicResult | None:
        return self._launch.algorithm

    def _trial_run(self, stream: int) -> None:
        """The selected algorithm once, derive kernel included, into the scratch result; a refusal raises."""
        self._plan.run(self._bound, out=self._scratch, stream=stream, check_offsets=False, trial=True)

    def _splittable(self) -> bool:
        return False

    def _make_split_form(self, iterations: int):
        raise NotImplementedError("a grouped plan has no bias-gradient epilog")

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
             budget_s: float | None) -> TuningResult:
    """``GroupedMatmul.autotune``'s work: time (and with ``search``, look beyond) the plan's algorithms
    on ``bound``'s operands on ``stream``, and remember the choice; what was chosen, for the plan to apply
    (``GroupedMatmul._apply_tuning``). The timed runs select algorithms on the plan's launch: if this
    raises, the launch is left with the algorithms and the selection it had."""
    if _cuda.is_capturing(stream):
        raise NvblasltStateError("autotune: waits for the GPU, which a CUDA graph being captured forbids")
    trial = GroupedTrial(plan, bound, stream)
    launch = trial._launch
    planned, selected = list(launch.algorithms), launch.algorithm
    try:
        with _cuda.on_device(plan.device):
            result = _autotune.tune(trial, iterations=iterations, search=search, remember=False, stream=stream,
                                    budget_s=_autotune.SEARCH_BUDGET_S if budget_s is None else budget_s)
    except BaseException:  # a refusal, a CUDA error, Ctrl-C: the launch keeps the algorithms and the one it ran
        launch.offer(planned)
        if selected is not None:
            launch.select(selected)
        raise
    finally:
        trial.close()
    if remember:
        report = result.report
        facts = {"confidence": round(report.confidence, 4), "switched": report.switched} if search else {}
        _tuning_cache.remember(trial._launch, result.chosen, result.timings[0][1], **facts)
    return result
