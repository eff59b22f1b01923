"""What tuning decided, as values: ``TuningReport`` (what was chosen over what, how sure; ``print`` it)
and ``TuningResult`` (the timings, the report, the bias-gradient form and its split plan), which
``_autotune.tune`` returns and the plan applies. Below both the tuner and ``_protocols``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ._descriptors import HeuristicResult


@dataclass(frozen=True)
class TuningReport:
    """What autotune decided and how sure it is; set as ``plan.tuning_report``."""

    searched: bool
    chosen: str
    chosen_ms: float
    incumbent: str  # autotune's pick over the heuristic list
    incumbent_ms: float
    switched: bool
    ratio: float = 1.0  # chosen / incumbent, median of paired rounds (1.0 when the incumbent stays)
    confidence: float = 0.0  # that the switch is faster (sign test); when kept, that the best challenger was
    interval: tuple[float, float] = (math.nan, math.nan)  # bounds on the best challenger's ratio
    best_challenger: str | None = None
    best_challenger_config: dict | None = None  # its algorithm's config attributes ({name: int})
    rounds: int = 0
    heuristics: int = 0
    screened: int = 0
    seconds: float = 0.0
    bias_gradient_form: tuple | None = None  # (form, its ms, the other form's ms)
    note: str = ""
    first_pick_ratio: float = 1.0  # incumbent / the heuristics' first pick, median of autotune's paired rounds

    def __str__(self) -> str:
        if not self.searched:
            return (f"autotune: {self.chosen} at {self.chosen_ms:.4f} ms, fastest of {self.heuristics} heuristic "
                    f"picks ({self.seconds:.1f} s)")
        lo, hi = self.interval
        if self.switched:
            verdict = (f"switched to {self.chosen}: {self.ratio:.4f}× the incumbent {self.incumbent} "
                       f"(bound [{lo:.4f}, {hi:.4f}], confidence {self.confidence:.1%}, {self.rounds} rounds)")
        elif self.best_challenger:
            verdict = (f"kept {self.incumbent}: no challenger faster beyond noise; best {self.best_challenger} "
                       f"{self.ratio:.4f}× (bound [{lo:.4f}, {hi:.4f}], confidence {self.confidence:.1%}, "
                       f"{self.rounds} rounds)")
        else:
            verdict = f"kept {self.incumbent}: {self.note or 'no challenger came close in screening'}"
        form = ""
        if self.bias_gradient_form:
            name, ms, other = self.bias_gradient_form
            form = f"; {name} bias-gradient form ({ms:.4f} vs {other:.4f} ms)"
        return (f"search: {verdict}; {self.chosen_ms:.4f} ms; {self.screened} candidates screened beyond "
                f"{self.heuristics} heuristic picks in {self.seconds:.1f} s{form}")


@dataclass
class TuningResult:
    """What ``autotune`` chose, for the plan to apply: nothing of the plan is written by the tuner.

    ``timings`` is ``[(algorithm, ms)]``, the chosen one first, then every other one timed, fastest
    first. After a search of a bias-gradient plan, ``bias_gradient_form`` is
    ``(form, its ms, the other form's ms)`` and ``split_form`` the ``SplitBiasGradient`` to run when the
    form is "split" (None for "fused"); without that choice both stay None and the plan keeps its form."""

    timings: list[tuple[HeuristicResult, float]]
    report: TuningReport
    bias_gradient_form: tuple | None = None
    split_form: Any = None

    @property
    def chosen(self) -> HeuristicResult:
        return self.timings[0][0]

    def ordered(self, planned: list[HeuristicResult]) -> list[HeuristicResult]:
        """The chosen algorithm, then those of ``planned`` in timed order (not every candidate a search
        screened): the plan's list once it applies the result."""
        return [self.chosen, *(r for r, _ in self.timings[1:] if any(r is p for p in planned))]


__all__ = ["TuningReport", "TuningResult"]
