"""What the tuner drives and what a plan launches, declared once (``typing.Protocol``), so that a type
checker reads the two kinds of plan, ``Matmul`` and ``GroupedMatmul``, and the tests' stand-ins against
the same surface instead of duck typing.

``PlannedLaunch`` is what ``_launch.Launch`` offers the tuner, the search and the tuning cache;
``TunablePlan`` is what ``_autotune.tune`` drives: a ``Matmul``, or a grouped plan through
``_grouped_tuning.GroupedTrial``; ``TunedPlan`` also applies what tuning chose (``Matmul``), as
``_autotune.autotune`` has it do. ``PlanInternals`` is the rest of what the package calls on a
``Matmul`` below its public API. The plans' own methods and state among these are underscored: declared
here, they are the package's internal interface, which the layering guard (``tests/cpu/test_layering.py``)
allows any module of the package to call and no user reads on ``dir(Matmul)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ._tuning_result import TuningReport, TuningResult
    from ._descriptors import HeuristicResult


@runtime_checkable
class PlannedLaunch(Protocol):
    """One cuBLASLt call made ready: its algorithms, the selected one, its workspace."""

    @property
    def algorithms(self) -> list[HeuristicResult]: ...

    @property
    def algorithm(self) -> HeuristicResult | None: ...

    @property
    def workspace_limit(self) -> int: ...

    def check(self, algo: Any) -> HeuristicResult | None: ...

    def select(self, result: HeuristicResult) -> None: ...

    def ensure_workspace(self, nbytes: int, stream: int) -> None: ...

    def leave_out(self, refused: list[HeuristicResult]) -> None: ...

    def offer(self, algorithms: list[HeuristicResult]) -> None: ...

    def keep(self, ordered: list[HeuristicResult], prune: int | None) -> None: ...


@runtime_checkable
class TunablePlan(Protocol):
    """A plan the tuner times: trial launches into scratch memory, on its launch's algorithms. The tuner
    selects algorithms on the launch while it times them and returns what it chose (a ``TuningResult``);
    the plan applies it."""

    @property
    def _launch(self) -> PlannedLaunch: ...

    @property
    def device(self) -> int: ...

    @property
    def stream(self) -> int: ...

    @property
    def _epilog(self) -> Any: ...

    @property
    def algorithms(self) -> list[HeuristicResult]: ...

    @property
    def algorithm(self) -> HeuristicResult | None: ...

    @property
    def tuning_report(self) -> TuningReport | None: ...

    @property
    def _split_form(self) -> Any: ...

    def _trial_run(self, stream: int) -> object: ...

    def _splittable(self) -> bool: ...

    def _make_split_form(self, iterations: int) -> Any: ...


@runtime_checkable
class TunedPlan(TunablePlan, Protocol):
    """A plan that applies what tuning chose: selects it, orders its algorithms, takes the report and
    the bias-gradient form; returns the timings. Its options say whether it may be searched (a
    batch-invariant plan runs its pinned algorithm)."""

    @property
    def _options(self) -> Any: ...

    def _apply_tuning(self, result: TuningResult) -> list[tuple[HeuristicResult, float]]: ...


@runtime_checkable
class PlanInternals(Protocol):
    """What the package's own modules call on a ``Matmul`` beside its public API: the function form
    (``_run``, ``_rebind``, ``_set_operands``, ``_forget_arrays``), the split form and the framework
    layers. Underscored, so that the user's object shows nvmath-python's API alone; declared here, so
    that mypy reads the callers against it and the layering guard lets the package, and only through
    these names, reach them. Its state is read the same way: the launch (``_launch``, from the tuner and the
    bench), the function form's binding (``_fast_bound``, ``_several_devices``), the problem and operands
    the tuning tools record (``_problem``, ``_problem_operands``), and the result
    allocator the split form replaces and the bench times (``_allocate_result``)."""

    @property
    def _fast_bound(self) -> list | None: ...

    @property
    def _several_devices(self) -> bool: ...

    @property
    def _problem(self) -> Any: ...

    @property
    def _problem_operands(self) -> Any: ...

    @property
    def _allocate_result(self) -> Any: ...

    def _run(self, stream_h: int, framework_stream: int, out: Any) -> Any: ...

    def _rebind(self, pointers: list, input_names: tuple, alpha: Any, beta: Any, *, keep: bool = False) -> None: ...

    def _set_operands(self, a: Any, b: Any, c: Any, inputs: dict, alpha: Any, beta: Any) -> None: ...

    def _forget_arrays(self) -> None: ...

    def _use_fused_form(self) -> None: ...

    @classmethod
    def _from_operands(cls, a: Any, b: Any, c: Any, *, stream: int, options: Any, alpha: Any = None,
                       beta: Any = None, quantization_scales: Any = None) -> Any: ...

    @classmethod
    def _planned_for(cls, request: Any, stacklevel: int) -> Any: ...


@runtime_checkable
class GroupedPlanInternals(Protocol):
    """What the package calls on a ``GroupedMatmul`` beside its public API: the function forms' hot path
    (``_run_pointers``, the operands as pointers), the problem it was made for, whether a CUDA graph
    captured it (the plan caches then keep it for the graph), and ``grouped_matmul``'s cached plan for
    some operands (``_cached``: the torch layer's bound calls run it)."""

    @property
    def _problem(self) -> Any: ...

    @property
    def _captured(self) -> bool: ...

    def _run_pointers(self, problem: Any, a_pointer: int, b_pointer: int, offs_pointer: int, offs_64: bool, *,
                      out: Any, stream: int, check_offsets: bool | None, scales: tuple[int, int] = (0, 0),
                      trial: bool = False) -> Any: ...

    @classmethod
    def _cached(cls, a: Any, b: Any, offs: Any, out_dtype: Any) -> tuple[Any, Any]: ...


__all__ = ["GroupedPlanInternals", "PlanInternals", "PlannedLaunch", "TunablePlan", "TunedPlan"]
