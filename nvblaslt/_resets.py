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
        """Point the plan at new operands, or give it new alpha, beta, epilog inputs or scales.

        nvmath-python's ``reset_operands``: the plan, its algorithms and its workspace stay, and
        the next ``execute()`` reads the new arrays. Each new GPU array is compared with the one
        it replaces; a new host array is copied into the plan's device copy of that operand. The
        reset is all or nothing: everything given is read and checked before the plan changes, so
        a refused reset leaves the plan as it was.

        Parameters
        ----------
        a, b, c : array, optional
            New operands; None keeps the current one. Each must be of the same package and memory
            space as the one it replaces, with the same shape, strides, dtype, device and lazy
            conjugation, and a pointer aligned at least as well (the algorithms were chosen for
            that alignment). A host operand needs the same shape and dtype only (it is copied).
            After ``release_operands()``, every operand the plan had must be given. GPU arrays are
            read in place at each ``execute()``: keep them alive while the plan uses them.
        alpha : number or one-element array, optional
            A new alpha, checked against the plan's scale type.
        beta : number or one-element array, optional
            A new beta; only for a plan with ``c``.
        epilog_inputs : dict, optional
            New arrays for any of the inputs the planned epilog reads (``"bias"``, ``"relu_aux"``,
            ``"gelu_aux"``), each laid out as the one it replaces (dtype, leading dimension,
            batch stride, alignment at least as good); and ``"aux_quantization_scale"``, a new
            scale for an fp8 GELU aux. Needs ``plan()`` first.
        quantization_scales : MatmulQuantizationScales or dict, optional
            New fp8 scales for any of the keys the plan has (``"a"``, ``"b"``, ``"c"``, ``"d"``):
            numbers, or float32 GPU arrays of shape () or (1,).
        stream : int or stream object, optional
            The stream the new arrays are read on and host operands copied on, ordered after the
            work the plan queued last; default the plan's stream. The plan's stream is unchanged.

        Raises
        ------
        NvblasltStateError
            The plan was freed.
        NvblasltValueError
            A new operand differs from the one it replaces (shape, strides, dtype, device,
            conjugation) or is less aligned; ``c`` or ``beta`` for a plan without ``c``; operands
            missing after ``release_operands()``; epilog inputs before ``plan()``, unknown to the
            epilog, or laid out otherwise; scales for keys the plan has none of, or invalid values.
        NvblasltTypeError
            A new operand of another package or memory space, a new epilog input of another
            package, or a value that is not a number (alpha, beta, scales).
        NvblasltArgumentError
            A new epilog input in the other memory space than the plan's operands.
        CudaError
            Copying a host operand to the GPU failed.

        See Also
        --------
        reset_operands_unchecked : the same without comparing new GPU arrays.
        release_operands : drops the references to the operands.

        Examples
        --------
        .. code-block:: python

            with Matmul(x, w) as mm:
                mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
                for batch in batches:                  # arrays shaped and laid out as x
                    mm.reset_operands(a=batch)
                    y = mm.execute()
                mm.reset_operands(alpha=0.5, epilog_inputs={"bias": other_bias})
        """
        self._reset(dict(a=a, b=b, c=c), alpha, beta, epilog_inputs, quantization_scales, stream, True)

    def reset_operands_unchecked(self, a: Array | None = None, b: Array | None = None, c: Array | None = None, *,
                                 alpha: ScalarLike | None = None, beta: ScalarLike | None = None,
                                 epilog_inputs: dict[str, Any] | None = None,
                                 quantization_scales: QuantizationScales = None, stream: Stream | None = None) -> None:
        """``reset_operands`` without comparing the new GPU operands with the old (nvblaslt's addition).

        For hot loops whose caller guarantees that each new GPU array ``a``, ``b``, ``c`` is like
        the one it replaces: same package, memory space, shape, strides, dtype, device and
        lazy conjugation, and a pointer aligned at least as well. Those comparisons are skipped;
        the array is only read for its pointer. Host operands (copied into the plan's device
        copies), a host array given to a GPU plan (refused), epilog inputs, alpha, beta and scales
        are checked as by ``reset_operands``.

        Parameters
        ----------
        a, b, c : array, optional
            New operands, each like the one it replaces (unchecked for GPU operands); None keeps
            the current one. After ``release_operands()``, every operand the plan had must be
            given.
        alpha, beta : number or one-element array, optional
            New scalars, as for ``reset_operands``.
        epilog_inputs : dict, optional
            New epilog inputs or fp8 aux scale, checked as by ``reset_operands``.
        quantization_scales : MatmulQuantizationScales or dict, optional
            New fp8 scales, checked as by ``reset_operands``.
        stream : int or stream object, optional
            As for ``reset_operands``.

        Raises
        ------
        NvblasltStateError
            The plan was freed.
        NvblasltValueError, NvblasltTypeError
            As ``reset_operands`` raises them, less the comparisons of new GPU operands; an
            object that is no array.

        Warnings
        --------
        A GPU operand that is not like the one it replaces is not detected: the next
        ``execute()`` reads (and writes) memory as the plan's layout says, which gives wrong
        results or faults. Use ``reset_operands`` unless the arrays are known to match.

        See Also
        --------
        reset_operands : the checked form.

        Examples
        --------
        .. code-block:: python

            buffers = [cupy.empty_like(x) for _ in range(2)]   # like x: same layout and alignment
            for i, batch in enumerate(batches):
                buffers[i % 2][...] = batch
                mm.reset_operands_unchecked(a=buffers[i % 2])
                y = mm.execute()
        """
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
        dropped = sorted(key for key in self._input_operands if f"epilog_inputs['{key}']" in (self._released or ())
                         and key not in given)
        if dropped:  # their pointers are still bound: the arrays they point to may be gone
            raise NvblasltValueError(f"epilog_inputs: release_operands() dropped the epilog inputs {dropped} too; give "
                                     f"them again with the operands")
        inputs = _reading.read_reset_inputs(given, self._planned, self.epilog, self._prepared.inputs,
                                            self._input_operands, self.problem, self._host, stream_h) \
            if given else {}
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
        """Drop the plan's references to the caller's arrays (nvmath-python's ``release_operands``).

        The operands, their host originals, the epilog inputs and any scale arrays are no longer
        kept alive by the plan, so their memory can be freed while the plan (descriptors,
        algorithms, workspace) stays. ``execute()`` and ``autotune()`` then raise
        ``NvblasltStateError`` until ``reset_operands()`` (or ``reset_operands_unchecked()``)
        gives every operand the plan had (``a``, ``b`` and ``c`` if it has one) again.

        Raises
        ------
        NvblasltStateError
            The plan was freed.

        Notes
        -----
        Only ``a``, ``b`` and ``c`` must be given again: the epilog inputs and scale arrays the
        plan was given stay bound by address. If their memory is freed after this call, give new
        ones with ``reset_operands(epilog_inputs=…, quantization_scales=…)`` before executing.

        Examples
        --------
        .. code-block:: python

            mm.release_operands()                      # x and w may be freed now
            del x, w
            mm.reset_operands(a=new_x, b=new_w)        # every operand again
            y = mm.execute()
        """
        self._check_alive()
        self.forget_arrays()
        self._released = {name for name, op in self._operands.items() if op is not None}
        self._released.update(f"epilog_inputs['{key}']" for key in self._input_operands)


__all__ = ["OperandResets"]
