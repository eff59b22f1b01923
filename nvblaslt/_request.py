"""One ``matmul()`` call read and checked once (``MatmulRequest``): the function form's checked path
looks its plan up by it, plans from it on a miss and rebinds from it on a hit, so that no argument is
read or checked twice. Its checks run in the order ``matmul()`` documents: options, preferences and
the epilog, the stream, then the operands and epilog inputs, read once each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import _operands
from ._epilogs import MatmulEpilog, as_epilog
from ._frameworks import Framework, framework_of
from ._options import MatmulOptions, MatmulPlanPreferences, as_options, with_shortcuts
from ._reading import one_package
from ._streams import stream_handle

_DEFAULT_PREFERENCES = MatmulPlanPreferences()
AUX_SCALE = "aux_quantization_scale"  # the fp8 aux scale: a number the plan reads at plan time, not an operand


@dataclass(frozen=True)
class MatmulRequest:
    """A ``matmul()`` call as read: its operands (``_operands.Operand``), options, scalars, epilog,
    epilog inputs, preferences and algorithms, each checked, and where it runs."""

    framework: Framework
    a: _operands.Operand
    b: _operands.Operand
    c: _operands.Operand | None
    inputs: dict[str, Any]  # epilog inputs as read, by key; the fp8 aux scale as given
    options: MatmulOptions
    preferences: MatmulPlanPreferences
    epilog: MatmulEpilog
    alpha: Any
    beta: Any
    algorithms: list | None  # the caller's algorithm, or None: the heuristics are asked
    quantization_scales: Any
    qualifiers: Any
    stream: int  # where the work is queued
    framework_stream: int  # the operands' package's current stream (0 for host operands)
    out: Any
    host: bool  # host operands: staged, and the result copied back

    @property
    def cacheable(self) -> bool:
        """Whether its plan may be cached: not where it holds the call's own state (host copies, scales,
        qualifiers, a chosen algorithm, c written in place, a handle or logger) or an fp8 aux scale."""
        options = self.options
        return not self.host and self.quantization_scales is None and self.qualifiers is None \
            and self.algorithms is None and not options.inplace and options.handle is None \
            and options.logger is None and AUX_SCALE not in self.inputs

    @property
    def plan_arguments(self) -> tuple:
        """What ``Matmul.plan()`` takes: (epilog, epilog inputs, preferences, algorithms)."""
        return self.epilog, self.inputs, self.preferences, self.algorithms

    @property
    def scalars(self) -> tuple:
        """(alpha, beta) as a plan binds them: 1 and, without c, 0 where not given."""
        return 1.0 if self.alpha is None else self.alpha, 0.0 if self.c is None else self.beta


def read_request(a, b, c, *, alpha, beta, epilog, epilog_inputs: dict | None, qualifiers, quantization_scales,
                 options, preferences, algorithm, stream, out, compute_type, result_type) -> MatmulRequest:
    """``matmul()``'s arguments read and checked, each once, before any GPU work."""
    framework = framework_of(a)
    checked_options = with_shortcuts(options, compute_type, result_type)
    prefs = as_options(MatmulPlanPreferences, preferences, "preferences") if preferences is not None else \
        _DEFAULT_PREFERENCES
    checked_epilog = as_epilog(epilog)
    framework_stream = 0 if _operands.is_host_array(a) else framework.stream_of(a)
    stream_h = stream_handle(stream) if stream is not None else framework_stream
    # On the framework's own stream no handshake is needed, so arrays seen before are not re-exported.
    read = _operands.read_cached if stream_h == framework_stream else _operands.read
    one_package([(x, name) for x, name in ((a, "a"), (b, "b"), (c, "c")) if x is not None])
    a_op, b_op = read(a, "a", stream_h), read(b, "b", stream_h)
    c_op = read(c, "c", stream_h) if c is not None else None
    host = a_op.host or b_op.host or (c_op is not None and c_op.host)
    inputs = {k: (v if k == AUX_SCALE else read(v, f"epilog_inputs['{k}']", stream_h))
              for k, v in (epilog_inputs or {}).items()}
    return MatmulRequest(framework, a_op, b_op, c_op, inputs, checked_options, prefs, checked_epilog, alpha, beta,
                         [algorithm] if algorithm is not None else None, quantization_scales, qualifiers, stream_h,
                         framework_stream, out, host)


__all__ = ["MatmulRequest", "read_request"]
