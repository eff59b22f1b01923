"""The half of ``Matmul`` that replaces what a plan reads: ``reset_operands`` (checked),
``reset_operands_unchecked`` (the caller vouches for the arrays) and ``release_operands``. A base
class of ``Matmul``, apart so that each half stays readable; it acts on the plan's own state."""

from __future__ import annotations

from typing import Any

from . import _cuda, _epilogs, _host, _memory, _operands, _reading
from ._errors import NvblasltValueError
from ._hints import Array, QuantizationScales, ScalarLike, Stream
from ._scales import Scalar
from ._streams import stream_handle


class OperandResets:
    """``reset_operands``, ``reset_operands_unchecked`` and ``release_operands`` of ``Matmul``."""

    # The plan's state this half reads and replaces (``Matmul`` sets it up and owns it).
    _released: set[str] | None
    _operands: dict[str, Any]
    _host_operands: dict[str, Any]
    _input_operands: dict[str, Any]
    _input_setters: dict[str, Any]
    _framework: Any
    _host: bool
    _planned: bool
    _prepared: Any
    _scales: Any
    _out_checker: Any
    _last_stream: int
    operands: Any
    problem: Any
    epilog: Any
    launch: Any
    split_form: Any
    alpha: Any
    beta: Any
    device: int
    stream: int
    fast_bound: list | None

    def _check_alive(self) -> None:
        raise NotImplementedError

    def _bind(self) -> None:
        raise NotImplementedError

    def forget_arrays(self) -> None:
        raise NotImplementedError

    def reset_operands(self, a: Array | None = None, b: Array | None = None, c: Array | None = None, *,
                       alpha: ScalarLike | None = None, beta: ScalarLike | None = None,
                       epilog_inputs: dict[str, Any] | None = None, quantization_scales: QuantizationScales = None,
                       stream: Stream | None = None) -> None:
        """Point the plan at new arrays of the same shapes, dtypes, strides, device and alignment
        (nvmath-python's ``reset_operands``); new alpha, beta or fp8 scale values (the fp8 aux's
        as ``epilog_inputs['aux_quantization_scale']``)."""
        self._reset(dict(a=a, b=b, c=c), alpha, beta, epilog_inputs, quantization_scales, stream, True)

    def reset_operands_unchecked(self, a: Array | None = None, b: Array | None = None, c: Array | None = None, *,
                                 alpha: ScalarLike | None = None, beta: ScalarLike | None = None,
                                 epilog_inputs: dict[str, Any] | None = None,
                                 quantization_scales: QuantizationScales = None, stream: Stream | None = None) -> None:
        """``reset_operands`` for callers who guarantee that each new GPU array is like the one it
        replaces (package, shape, strides, dtype, device, alignment): those comparisons are skipped.
        Host operands, copied into the plan's device copies, are checked as by ``reset_operands``."""
        self._reset(dict(a=a, b=b, c=c), alpha, beta, epilog_inputs, quantization_scales, stream, False)

    def _reset(self, new: dict, alpha, beta, epilog_inputs, quantization_scales, stream, checked: bool) -> None:
        self._check_alive()
        stream_h = self.stream if stream is None else stream_handle(stream)
        with _cuda.on_device(self.device):
            self._take_reset(new, alpha, beta, epilog_inputs, quantization_scales, stream_h, checked)

    def _take_reset(self, new: dict, alpha, beta, epilog_inputs, quantization_scales, stream_h: int,
                    checked: bool) -> None:
        # Everything is read and checked first; the plan changes only once nothing can refuse, so a refused
        # reset leaves it pointing at the operands it had.
        operands = _reading.read_reset(new, self._operands, self._host_operands, self._released, self._framework,
                                       self._host, stream_h, checked)
        given, aux_scale = _epilogs.split_aux_scale(epilog_inputs)
        if (given or aux_scale is not None) and not self._planned:
            raise NvblasltValueError("epilog_inputs: call plan() before resetting epilog inputs")
        inputs = _reading.read_reset_inputs(given, self._planned, self.epilog, self._prepared.inputs,
                                            self._input_operands, self.problem, self._framework, self._host,
                                            stream_h) if given else {}
        scales = self._scales.check(quantization_scales, self.stream, on_reset=True) \
            if quantization_scales is not None else {}
        if aux_scale is not None:
            scales.update(self._scales.check_aux(aux_scale, self.stream))
        if beta is not None and self._operands["c"] is None:
            raise NvblasltValueError("beta: the plan has no c for beta to scale")
        for value, argument in ((alpha, "alpha"), (beta, "beta")):
            if value is not None:
                Scalar(self.operands.types.scale, argument).set(value)  # refuses what the plan's own would
        if self.split_form is not None:  # its masking plan checks the same things, then takes them
            self.split_form.masked.reset_operands(**new, alpha=alpha, beta=beta, epilog_inputs=epilog_inputs,
                                                  stream=stream_h)
        # Commit. Copies into device memory a queued kernel may still read wait for the last stream's work.
        if self._last_stream != stream_h and not _cuda.is_capturing(stream_h):
            _memory.wait_for(self._last_stream, stream_h)
        self._released = None
        for name, op in operands.items():
            if op.host:  # into the device copy's layout
                old = self._operands[name]
                self._host_operands[name] = op
                _host.refresh(op, old.ptr, old.strides, stream_h)
                op = _operands.Operand(op.obj, old.ptr, op.shape, old.strides, op.dtype, self.device, op.readonly,
                                       op.kind)
            self._operands[name] = op
        for key, (op, entry) in inputs.items():
            if entry is None:  # a host input: into its device copy's layout
                staged = self._input_operands[key]
                _host.refresh(op, staged.ptr, staged.strides, stream_h)
                continue
            self._prepared.inputs[key] = entry
            self._input_operands[key] = op
            self._input_setters[key](entry.ptr)
        if scales:  # new values replace the old for the keys given (numbers or arrays alike)
            if self._last_stream != self.stream:
                _memory.wait_for(self._last_stream, self.stream)
            self._scales.write(scales, self.stream)
            if self._planned:
                for attribute, pointer in self._scales.descriptor_pointers(self.problem).items():
                    self.launch.desc.set(attribute, pointer)
                if "aux" in scales:
                    self.launch.desc.set("EPILOGUE_AUX_SCALE_POINTER", self._scales.pointer("aux"))
        if alpha is not None:
            self.alpha.set(alpha)
        if beta is not None:
            self.beta.set(beta)
        self.fast_bound = None
        if self._planned:
            self._out_checker.forget()  # a new operand may overlap an out= checked before
            self._bind()

    def release_operands(self) -> None:
        """Drop the references to the operands (nvmath-python's ``release_operands``): the plan
        stays; ``reset_operands`` must give new operands before the next ``execute``."""
        self._check_alive()
        self.forget_arrays()
        self._released = {name for name, op in self._operands.items() if op is not None}


__all__ = ["OperandResets"]
