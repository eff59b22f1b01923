"""DRELU_BGRAD and DGELU_BGRAD as two cuBLASLt calls: the masking epilog (DRELU / DGELU), then the
bias gradient as row sums of D, a GEMV with a ones vector. The outputs are the same; on large
problems cuBLASLt's in-kernel bias reduction can cost more than the GEMV (H200, fp16
65536×16384×8192: fused 28.7 ms, split 25.5 ms). ``Matmul.autotune(search=True)`` times both
and keeps the faster.
"""

from __future__ import annotations

import struct

from cuda.bindings import runtime as cudart

from . import _cuda, _memory
from ._epilogs import MatmulEpilog
from ._operands import Operand

MASKING = {MatmulEpilog.DRELU_BGRAD: MatmulEpilog.DRELU, MatmulEpilog.DGELU_BGRAD: MatmulEpilog.DGELU}
_ONE = {"float32": struct.pack("<f", 1.0), "float64": struct.pack("<d", 1.0), "float16": b"\x00\x3c",
        "bfloat16": b"\x80\x3f"}


class SplitBiasGradient:
    """The masking plan and the row-sum plan that stand in for one fused *_BGRAD plan."""

    def __init__(self, fused, iterations: int):
        """``iterations`` > 0 autotunes the masking plan; 0 keeps what its plan chose (or recalled)."""
        from ._matmul import Matmul

        problem, device, stream = fused.problem, fused._device, fused._stream
        self.key = fused._spec.bias_output
        a, b, c = (fused._operands[k] for k in "abc")
        self.masked = Matmul._from_operands(a, b, c, stream=stream, alpha=fused._alpha.value,
                                            beta=None if c is None else fused._beta.value, compute_type=None,
                                            result_type=None, quantization_scales=None)
        self.masked.problem.compute_type_name = problem.compute_type_name
        self.masked.plan(epilog=MASKING[fused.epilog], epilog_inputs=fused._epilog_inputs,
                         preferences={"limit": len(fused.algorithms), "workspace_limit": fused._workspace_limit})
        if iterations:
            self.masked.autotune(iterations=iterations)

        dtype, n = problem.d.dtype, problem.n
        self.ones = _memory.DeviceBuffer(n * dtype.itemsize, stream)
        _cuda.check(cudart.cudaMemcpyAsync(self.ones.pointer, _ONE[dtype.name] * n, n * dtype.itemsize,
                                           cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync")
        _cuda.check(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        shape, strides = _memory.column_major(problem.batch, problem.m, n, problem.m)
        d = Operand(None, self.ones.pointer, shape, strides, dtype, device, False, fused._kind)  # D's pointer per call
        ones = Operand(None, self.ones.pointer, (n, 1), (1, n), dtype, device, True, fused._kind)
        self.row_sums = Matmul._from_operands(d, ones, None, stream=stream, alpha=1.0, beta=None,
                                              compute_type=None, result_type=None, quantization_scales=None)
        self.row_sums.plan()
        # the row sums come out as a (…, M) vector: the same memory as a (…, M, 1) column-major matrix
        self.row_sums._alloc_d = _memory.vector_allocator(fused._kind, problem.batch, problem.m, dtype, device)

    def run(self, stream_h: int, framework_stream: int, out):
        d = self.masked._run(stream_h, framework_stream, out)
        self.row_sums._a_pointer.value = self.masked._last_d_pointer
        return d, {self.key: self.row_sums._run(stream_h, framework_stream, None)}

    def reset_operands(self, **operands) -> None:
        self.masked.reset_operands(**operands)

    def free(self) -> None:
        self.masked.free()
        self.row_sums.free()
        self.ones.release()
