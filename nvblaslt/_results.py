"""What ``execute`` makes for one plan: D (unless in place) and the epilog's outputs, each in the
operands' package and pointed at by the launch; the scratch memory trial launches write instead;
the layouts host results are copied back in.
"""

from __future__ import annotations

from . import _dtypes, _host, _memory
from ._epilogs import Prepared, output_pointer_attributes
from ._frameworks import PROTOCOL, Framework
from ._strides import extent_bytes, span_elements

_ALIGN = 256


class Results:
    """Allocators for one plan's results, built once at plan time."""

    def __init__(self, launch, problem, prepared: Prepared, *, framework: Framework, host: bool, device: int,
                 result_amax: bool):
        kind = PROTOCOL if host else framework  # host results are staged in nvblaslt's own memory
        self.allocate_d = None if problem.inplace else _memory.strided_allocator(
            kind, problem.result_shape, problem.result_strides, problem.types.d, device)
        layouts = [(o.key, o.shape, o.strides, o.dtype) for o in prepared.outputs]
        amax_layout = ((1,), (1,), _dtypes.FLOAT32)
        if prepared.aux_amax:
            layouts.append((f"{prepared.spec.aux_output}_amax", *amax_layout))
        if result_amax:
            layouts.append(("result_amax", *amax_layout))
        attributes = output_pointer_attributes(prepared, result_amax)
        # (key, allocate(stream, framework_stream) -> (array, pointer), set the launch's pointer)
        self.outputs = [(key, _memory.strided_allocator(kind, shape, strides, dtype, device),
                         launch.pointer_setter(attribute))
                        for (key, shape, strides, dtype), attribute in zip(layouts, attributes)]
        # where host results are copied back to: (D's layout, each output's by key)
        self.host_layouts: tuple[tuple, dict] = ((problem.result_shape, problem.result_strides, problem.types.d),
                             {key: (shape, strides, dtype) for key, shape, strides, dtype in layouts})
        self._spans = [span_elements(shape, strides) * dtype.itemsize for _, shape, strides, dtype in layouts]
        self._inplace = problem.inplace
        self._d_bytes = span_elements(problem.result_shape, problem.result_strides) * problem.types.d.itemsize
        self._scratch: _memory.DeviceBuffer | None = None

    def allocate_outputs(self, stream: int, framework_stream: int) -> dict:
        """The epilog's outputs for one launch, the launch pointed at each."""
        found = {}
        for key, allocate, set_pointer in self.outputs:
            array, pointer = allocate(stream, framework_stream)
            set_pointer(pointer)
            found[key] = array
        return found

    def scratch(self, c, stream: int) -> int:
        """Point the launch's outputs into this plan's scratch memory (made on first use); returns
        where D goes there. Trial launches write nothing of the caller's (an in-place D, laid out as
        the operand ``c``, included)."""
        offsets, total = [], 0
        for span in (self._d_bytes if c is None or not self._inplace else
                     extent_bytes(c), *self._spans):
            offsets.append(total)
            total += -(-max(span, 1) // _ALIGN) * _ALIGN
        if self._scratch is None or self._scratch.size < total:
            if self._scratch is not None:
                self._scratch.release()
            self._scratch = _memory.DeviceBuffer(total, stream)
        base = self._scratch.pointer
        for (_, _, set_pointer), offset in zip(self.outputs, offsets[1:]):
            set_pointer(base + offset)
        return base

    def to_host(self, result, framework: Framework, stream: int, in_place):
        """Host operands' results: D or ``(D, aux)`` copied back into new host arrays (see ``_host.to_host``)."""
        d_layout, aux_layouts = self.host_layouts
        return _host.to_host(result, framework, d_layout, aux_layouts, stream, in_place)

    def used_on(self, stream: int) -> None:
        if self._scratch is not None:
            self._scratch.used_on(stream)

    def release(self) -> None:
        if self._scratch is not None:
            self._scratch.release()
            self._scratch = None
