"""The bias-gradient epilogs as two cuBLASLt calls: D without the bias gradient, then the bias gradient
as a GEMV with a ones vector (``_epilogs.SPLIT_FORMS``):

- DRELU_BGRAD / DGELU_BGRAD: the masking epilog (DRELU / DGELU), then the row sums of D;
- BGRADA / BGRADB: the plain GEMM, then the caller's A summed over K (its row sums) / B summed over K
  (its column sums), read where the GEMM read them.

The outputs are the same. On large problems cuBLASLt's in-kernel bias reduction can cost more than
the GEMV (H200, fp16 65536×16384×8192 DRELU_BGRAD: fused 28.7 ms, split 25.5 ms; bf16 BGRADB of a
weight gradient over 8192 tokens: torch's mm and a separate sum 3–5 % faster than every fused kernel).
``Matmul.autotune(search=True)`` times both and keeps the fused form unless the split form is faster
beyond noise. cuBLASLt's BGRADA/BGRADB sum the inputs as given (alpha does not scale them), and so
does the GEMV.

The two plans are made by the fused plan's own class (``build`` is handed its constructor), so this
module knows nothing above it.
"""

from __future__ import annotations

import dataclasses
import struct

from . import _cuda, _dtypes, _memory
from ._cuda import cudart
from ._epilogs import SPLIT_FORMS
from ._errors import NvblasltError
from ._logging import logger
from ._operands import Operand
from ._options import MatmulOptions
from ._problem import canonical

_ONE = {"float32": struct.pack("<f", 1.0), "float64": struct.pack("<d", 1.0), "float16": b"\x00\x3c",
        "bfloat16": b"\x80\x3f"}
_SUMMABLE = (_dtypes.FLOAT16, _dtypes.BFLOAT16, _dtypes.FLOAT32, _dtypes.FLOAT64)


def splittable(epilog, operands: dict, problem, problem_operands) -> bool:
    """Whether ``epilog`` on ``problem`` (read from ``problem_operands``) has a two-call form: one of
    SPLIT_FORMS whose first call writes D where the fused plan does (a plain GEMM follows A's order, the
    bias-gradient epilogs write a column-major D: a row-major A would give D another layout), and where an
    input is summed, a real, non-fp8 operand with the problem's own batch shape (a broadcast one would need
    its sums repeated per batch) that is not conjugated."""
    form = SPLIT_FORMS.get(epilog)
    if form is None:
        return False
    try:
        first = canonical(problem_operands, form[0])
    except NvblasltError:
        return False
    if (tuple(first.result_shape), tuple(first.result_strides)) != (tuple(problem.result_shape),
                                                                     tuple(problem.result_strides)):
        return False
    summed = form[1]
    if summed == "d":
        return True
    op = operands[summed]
    return (op.dtype in _SUMMABLE and problem.types.d in _SUMMABLE and not op.conjugated and len(op.shape) >= 2
            and tuple(op.shape[:-2]) == tuple(problem.batch_shape))


class SplitBiasGradient:
    """The plan that writes D and the GEMV plan that writes the bias gradient, standing in for one fused
    *_BGRAD plan. ``summed``: what the GEMV reads, ``"d"`` (D as the first plan wrote it), ``"a"`` or ``"b"``
    (the caller's operand, where the first plan reads it)."""

    def __init__(self, main, sums, key: str, ones: _memory.DeviceBuffer, summed: str):
        self.main, self.sums, self.key, self.ones, self.summed = main, sums, key, ones, summed

    @classmethod
    def build(cls, new_plan, operands: dict, inputs: dict, prepared, launch, options, alpha, beta, framework,
              device: int, stream: int, iterations: int) -> SplitBiasGradient | None:
        """The two plans for a fused plan with these operands and epilog ``prepared`` on ``launch``'s
        problem (``splittable`` must hold); ``new_plan`` is ``Matmul._from_operands``. ``iterations`` > 0
        autotunes the plan that writes D. None where either plan cannot be made (said in the log): the
        fused form stays, for a remembered choice never breaks a plan."""
        made: list = []  # what to free if a later step refuses
        try:
            return cls._build(new_plan, operands, inputs, prepared, launch, options, alpha, beta, framework, device,
                              stream, iterations, made)
        except NvblasltError as error:
            logger.info("the split bias-gradient form could not be made (%s); the fused kernel runs", error)
            for part in made:
                if isinstance(part, _memory.DeviceBuffer):
                    part.release()
                else:
                    part.free()
            return None

    @classmethod
    def _build(cls, new_plan, operands: dict, inputs: dict, prepared, launch, options, alpha, beta, framework,
               device: int, stream: int, iterations: int, made: list) -> SplitBiasGradient:
        problem = launch.problem
        main_epilog, summed = SPLIT_FORMS[prepared.epilog]
        a, b, c = (operands[k] for k in "abc")
        options = dataclasses.replace(options, result_amax=False, logger=None)
        main = new_plan(a, b, c, stream=stream, options=options, alpha=alpha, beta=None if c is None else beta)
        made.append(main)
        main.plan(epilog=main_epilog, epilog_inputs=inputs or None,
                  preferences={"limit": min(len(launch.algorithms), 1024),  # recalled + searched can pass it
                               "workspace_limit": launch.workspace_limit})
        if iterations:
            main.autotune(iterations=iterations)

        dtype = problem.types.d
        if summed == "d":  # D as cuBLASLt wrote it: column-major m×n matrices, one after another
            rows, length, summed_dtype = problem.m, problem.n, dtype
            shape: tuple[int, ...] = (problem.batch_count, rows, length) if problem.batch_count > 1 else (rows, length)
            strides: tuple[int, ...] = (rows * length, 1, rows) if problem.batch_count > 1 else (1, rows)
            pointer = 0  # set per call: where the first plan wrote D
        else:  # the caller's A as given, or B transposed: K last, summed by the GEMV
            op = operands[summed]
            length, summed_dtype = problem.k, op.dtype
            shape, strides = tuple(op.shape), tuple(op.strides)
            if summed == "b":
                shape, strides = (*shape[:-2], shape[-1], shape[-2]), (*strides[:-2], strides[-1], strides[-2])
            pointer = op.ptr  # alignment as the first plan's; set per call from where it reads the operand
        ones = _memory.DeviceBuffer(length * summed_dtype.itemsize, stream)
        made.append(ones)
        _cuda.check(cudart.cudaMemcpyAsync(ones.pointer, _ONE[summed_dtype.name] * length,
                                           length * summed_dtype.itemsize,
                                           cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync")
        _cuda.check(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        matrix = Operand(None, pointer or ones.pointer, shape, strides, summed_dtype, device, True, framework.name)
        ones_vector = Operand(None, ones.pointer, (length,), (1,), summed_dtype, device, True, framework.name)
        result_type = None if summed_dtype == dtype else dtype.name  # the fused plan's bias gradient is D's type
        sums = new_plan(matrix, ones_vector, None, stream=stream, options=MatmulOptions(result_type=result_type))
        made.append(sums)
        sums.plan()
        # the sums land where the fused plan's bias gradient would: same shape and strides
        output = next(o for o in prepared.outputs if o.key == prepared.spec.bias_output)
        sums._allocate_result = _memory.strided_allocator(framework, output.shape, output.strides, dtype, device)
        return cls(main, sums, output.key, ones, summed)

    def _point_sums(self, d_pointer: int) -> None:
        """The GEMV reads what the first plan wrote (D) or read (the caller's A or B) in this call."""
        summed = self.summed
        self.sums._launch.point_caller("a", d_pointer if summed == "d" else self.main._launch.caller_pointer(summed))

    def run(self, stream_h: int, framework_stream: int, out):
        d = self.main._run(stream_h, framework_stream, out)
        self._point_sums(self.main._launch.d_argument.value)
        self.ones.used_on(stream_h)  # released after the last GEMV that reads it, on whichever stream that ran
        return d, {self.key: self.sums._run(stream_h, framework_stream, None)}

    def trial_run(self, stream_h: int) -> int:
        """Both calls into the plans' scratch memory (see ``Matmul._trial_run``)."""
        self._point_sums(self.main._trial_run(stream_h))
        self.ones.used_on(stream_h)
        return self.sums._trial_run(stream_h)

    def free(self) -> None:
        self.main.free()
        self.sums.free()
        self.ones.release()
