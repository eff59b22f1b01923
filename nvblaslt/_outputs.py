"""``execute(out=)``: the caller's array checked once to take D as the plan would lay it out, then
its pointer reused while the same array comes back unchanged.
"""

from __future__ import annotations

import weakref

from . import _operands
from ._errors import NvblasltTypeError, NvblasltValueError
from ._frameworks import Framework, framework_of
from ._strides import extent_bytes, overlaps


def check_out_allowed(host: bool, inplace: bool) -> None:
    """``out=`` is refused with host operands (D is copied back into a new host array) and in place
    (D is ``c``): known before anything is staged."""
    if host or inplace:
        raise NvblasltValueError("out: not available for host operands or in-place plans")


class OutputChecker:
    """``out=`` for one plan. ``operands`` and ``epilog_inputs`` are the plan's own dicts, which
    ``reset_operands`` and the function form update in place: the overlap checks see the current ones."""

    __slots__ = ("_framework", "_fingerprint", "_host", "_problem", "_device", "_operands", "_epilog_inputs",
                 "_last")

    def __init__(self, framework: Framework, host: bool, problem, device: int, operands: dict,
                 epilog_inputs: dict):
        self._framework = framework
        self._fingerprint = self._framework.fingerprint
        self._host, self._problem, self._device = host, problem, device
        self._operands, self._epilog_inputs = operands, epilog_inputs
        self._last: tuple | None = None  # (weakref to out, its fingerprint, its pointer)

    def forget(self) -> None:
        """The operands changed: the next ``out=`` is checked again (overlaps included)."""
        self._last = None

    def pointer(self, out, stream_h: int) -> int:
        """Check ``out=`` once per array: the same object with the same fingerprint is not re-read."""
        last = self._last
        if last is not None and last[0]() is out and last[1] == self._fingerprint(out):
            return last[2]  # the same array as last time (so of the operands' package), unchanged
        check_out_allowed(self._host, self._problem.inplace)
        framework = framework_of(out)
        if framework is not self._framework:
            raise NvblasltTypeError(f"out: a {framework.name} array, but the operands are {self._framework.name} "
                                    f"arrays; results stay in the operands' package")
        d_op = _operands.read(out, "out", stream_h)
        self.check(d_op)
        identity = self._fingerprint(out)
        if identity is not None:
            self._last = (weakref.ref(out), identity, d_op.ptr)
        return d_op.ptr

    def check(self, op) -> None:
        """``out=`` must be a writable array laid out as D would be; it may be C itself (in place)."""
        problem = self._problem
        if op.shape != problem.result_shape:
            raise NvblasltValueError(f"out: expected shape {problem.result_shape}, got {op.shape}")
        if op.dtype != problem.types.d:
            raise NvblasltTypeError(f"out: expected dtype {problem.types.d.name}, got {op.dtype.name}")
        if any(s != e for s, e, n in zip(op.strides, problem.result_strides, op.shape) if n > 1):
            raise NvblasltValueError(f"out: expected element strides {problem.result_strides} (D's layout), got "
                                     f"{op.strides}")
        if op.readonly:
            raise NvblasltValueError("out: the array is read-only (JAX arrays and read-only exports cannot be written)")
        if op.device != self._device:
            raise NvblasltValueError(f"out: on GPU {op.device}, but the plan runs on GPU {self._device}")
        c = self._operands["c"]
        if c is not None and overlaps(op, c) and (op.ptr, op.shape, op.strides) != (c.ptr, c.shape, c.strides):
            raise NvblasltValueError("out: partly overlaps c; pass c itself (in place) or separate memory")
        for name in ("a", "b"):
            if overlaps(op, self._operands[name]):
                raise NvblasltValueError(f"out: overlaps {name}; write to separate memory")
        for key, inp in self._epilog_inputs.items():
            if op.ptr <= inp.ptr < op.ptr + extent_bytes(op):
                raise NvblasltValueError(f"out: overlaps epilog_inputs['{key}']; write to separate memory")
        if op.alignment < 256:
            raise NvblasltValueError(f"out: pointer 0x{op.ptr:x} is aligned to {op.alignment} bytes; the plan's "
                                     f"algorithms assume 256 (as fresh allocations are)")
