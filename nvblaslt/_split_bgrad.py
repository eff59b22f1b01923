"""DRELU_BGRAD and DGELU_BGRAD as two cuBLASLt calls: the masking epilog (DRELU / DGELU), then the
bias gradient as row sums of D, a GEMV with a ones vector. The outputs are the same; on large
problems cuBLASLt's in-kernel bias reduction can cost more than the GEMV (H200, fp16
65536×16384×8192: fused 28.7 ms, split 25.5 ms). ``Matmul.autotune(search=True)`` times both
and keeps the fused form unless the split form is faster beyond noise.
"""

from __future__ import annotations

import dataclasses
import struct

from cuda.bindings import runtime as cudart

from . import _cuda, _memory
from ._epilogs import MatmulEpilog
from ._operands import Operand
from ._options import MatmulOptions

MASKING = {MatmulEpilog.DRELU_BGRAD: MatmulEpilog.DRELU, MatmulEpilog.DGELU_BGRAD: MatmulEpilog.DGELU}
_ONE = {"float32": struct.pack("<f", 1.0), "float64": struct.pack("<d", 1.0), "float16": b"\x00\x3c",
        "bfloat16": b"\x80\x3f"}


class SplitBiasGradient:
    """The masking plan and the row-sum plan that stand in for one fused *_BGRAD plan."""

    def __init__(self, fused, iterations: int):
        """``iterations`` > 0 autotunes the masking plan; 0 keeps what its plan chose (or recalled)."""
        from ._plan import Matmul

        problem, device, stream = fused.problem, fused._device, fused._stream
        self.key = fused._spec.bias_output
        a, b, c = (fused._operands[k] for k in "abc")
        # The function form's fast path rebinds pointers without updating fused._operands: its next call
        # must rebind this masking plan too, even with the arrays it bound last.
        fused._fast_bound = None
        options = dataclasses.replace(fused.options, result_amax=False, logger=None)
        self.masked = Matmul._from_operands(a, b, c, stream=stream, options=options, alpha=fused._alpha.value,
                                            beta=None if c is None else fused._beta.value)
        self.masked.plan(epilog=MASKING[fused.epilog], epilog_inputs=fused._input_operands,
                         preferences={"limit": len(fused.algorithms), "workspace_limit": fused._workspace_limit})
        if iterations:
            self.masked.autotune(iterations=iterations)

        dtype, m, n = problem.types.d, problem.m, problem.n
        self.ones = _memory.DeviceBuffer(n * dtype.itemsize, stream)
        _cuda.check(cudart.cudaMemcpyAsync(self.ones.pointer, _ONE[dtype.name] * n, n * dtype.itemsize,
                                           cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync")
        _cuda.check(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        # D as cuBLASLt wrote it: column-major m×n matrices, one after another
        shape: tuple[int, ...] = (problem.batch_count, m, n) if problem.batch_count > 1 else (m, n)
        strides: tuple[int, ...] = (m * n, 1, m) if problem.batch_count > 1 else (1, m)
        d = Operand(None, self.ones.pointer, shape, strides, dtype, device, False, fused._kind)  # D's pointer per call
        ones = Operand(None, self.ones.pointer, (n,), (1,), dtype, device, True, fused._kind)
        self.row_sums = Matmul._from_operands(d, ones, None, stream=stream, options=MatmulOptions())
        self.row_sums.plan()
        # the row sums land where the fused plan's bias gradient would: same shape and strides
        output = next(o for o in fused._outputs if o.key == self.key)
        self.row_sums._alloc_d = _memory.strided_allocator(fused._kind, output.shape, output.strides, dtype, device)

    def run(self, stream_h: int, framework_stream: int, out):
        d = self.masked._run(stream_h, framework_stream, out)
        self.row_sums._a_pointer.value = self.masked._d_argument.value  # D of the masking call
        return d, {self.key: self.row_sums._run(stream_h, framework_stream, None)}

    def trial_run(self, stream_h: int) -> int:
        """Both calls into the plans' scratch memory (see ``Matmul.trial_run``)."""
        self.row_sums._a_pointer.value = self.masked.trial_run(stream_h)
        return self.row_sums.trial_run(stream_h)

    def reset_operands(self, **operands) -> None:
        self.masked.reset_operands(**operands)

    def free(self) -> None:
        self.masked.free()
        self.row_sums.free()
        self.ones.release()
