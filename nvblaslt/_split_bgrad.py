"""DRELU_BGRAD and DGELU_BGRAD as two cuBLASLt calls: the masking epilog (DRELU / DGELU), then the
bias gradient as row sums of D, a GEMV with a ones vector. The outputs are the same; on large
problems cuBLASLt's in-kernel bias reduction can cost more than the GEMV (H200, fp16
65536×16384×8192: fused 28.7 ms, split 25.5 ms). ``Matmul.autotune(search=True)`` times both
and keeps the fused form unless the split form is faster beyond noise.

The two plans are made by the fused plan's own class (``build`` is handed its constructor), so this
module knows nothing above it.
"""

from __future__ import annotations

import dataclasses
import struct

from . import _cuda, _memory
from ._cuda import cudart
from ._epilogs import MASKING
from ._operands import Operand
from ._options import MatmulOptions

_ONE = {"float32": struct.pack("<f", 1.0), "float64": struct.pack("<d", 1.0), "float16": b"\x00\x3c",
        "bfloat16": b"\x80\x3f"}


class SplitBiasGradient:
    """The masking plan and the row-sum plan that stand in for one fused *_BGRAD plan."""

    def __init__(self, masked, row_sums, key: str, ones: _memory.DeviceBuffer):
        self.masked, self.row_sums, self.key, self.ones = masked, row_sums, key, ones

    @classmethod
    def build(cls, new_plan, operands: dict, inputs: dict, prepared, launch, options, alpha, beta, framework,
              device: int, stream: int, iterations: int) -> SplitBiasGradient:
        """The two plans for a fused plan with these operands and epilog ``prepared`` on ``launch``'s
        problem; ``new_plan`` is ``Matmul._from_operands``. ``iterations`` > 0 autotunes the masking plan."""
        problem = launch.problem
        a, b, c = (operands[k] for k in "abc")
        options = dataclasses.replace(options, result_amax=False, logger=None)
        masked = new_plan(a, b, c, stream=stream, options=options, alpha=alpha, beta=None if c is None else beta)
        masked.plan(epilog=MASKING[prepared.epilog], epilog_inputs=inputs,
                    preferences={"limit": min(len(launch.algorithms), 1024),  # recalled + searched can pass it
                                 "workspace_limit": launch.workspace_limit})
        if iterations:
            masked.autotune(iterations=iterations)

        dtype, m, n = problem.types.d, problem.m, problem.n
        ones = _memory.DeviceBuffer(n * dtype.itemsize, stream)
        _cuda.check(cudart.cudaMemcpyAsync(ones.pointer, _ONE[dtype.name] * n, n * dtype.itemsize,
                                           cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync")
        _cuda.check(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        # D as cuBLASLt wrote it: column-major m×n matrices, one after another (its pointer is set per call)
        shape: tuple[int, ...] = (problem.batch_count, m, n) if problem.batch_count > 1 else (m, n)
        strides: tuple[int, ...] = (m * n, 1, m) if problem.batch_count > 1 else (1, m)
        d = Operand(None, ones.pointer, shape, strides, dtype, device, False, framework.name)
        ones_vector = Operand(None, ones.pointer, (n,), (1,), dtype, device, True, framework.name)
        row_sums = new_plan(d, ones_vector, None, stream=stream, options=MatmulOptions())
        row_sums.plan()
        # the row sums land where the fused plan's bias gradient would: same shape and strides
        output = next(o for o in prepared.outputs if o.key == prepared.spec.bias_output)
        row_sums._allocate_result = _memory.strided_allocator(framework, output.shape, output.strides, dtype, device)
        return cls(masked, row_sums, output.key, ones)

    def run(self, stream_h: int, framework_stream: int, out):
        d = self.masked._run(stream_h, framework_stream, out)
        self.row_sums._launch.a_pointer.value = self.masked._launch.d_argument.value  # D of the masking call
        return d, {self.key: self.row_sums._run(stream_h, framework_stream, None)}

    def trial_run(self, stream_h: int) -> int:
        """Both calls into the plans' scratch memory (see ``Matmul._trial_run``)."""
        self.row_sums._launch.a_pointer.value = self.masked._trial_run(stream_h)
        return self.row_sums._trial_run(stream_h)

    def free(self) -> None:
        self.masked.free()
        self.row_sums.free()
        self.ones.release()
