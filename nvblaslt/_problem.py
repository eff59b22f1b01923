"""Check operands and derive what cuBLASLt is told about them: layouts, types, extents.

Everything here runs before any pointer reaches C. Errors name the argument, what was
given and what was expected.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from . import _dtypes, _memory
from ._dtypes import DType
from ._epilogs import GELU_AUX_LD_MULTIPLE, RELU_AUX_LD_MULTIPLE_BITS
from ._errors import NvblasltTypeError, NvblasltValueError
from ._operands import Operand

OP_N, OP_T = 0, 1

# Compute and scale types by input type: (compute type, scale type) as generated-binding names.
_COMPUTE = {
    "float32": ("CUBLAS_COMPUTE_32F", "CUDA_R_32F"),
    "float16": ("CUBLAS_COMPUTE_32F", "CUDA_R_32F"),
    "bfloat16": ("CUBLAS_COMPUTE_32F", "CUDA_R_32F"),
    "float64": ("CUBLAS_COMPUTE_64F", "CUDA_R_64F"),
    "float8_e4m3fn": ("CUBLAS_COMPUTE_32F", "CUDA_R_32F"),
    "float8_e5m2": ("CUBLAS_COMPUTE_32F", "CUDA_R_32F"),
}
# compute_type= spellings users may give, per input type.
_COMPUTE_CHOICES = {
    "float32": {"float32": "CUBLAS_COMPUTE_32F", "tf32": "CUBLAS_COMPUTE_32F_FAST_TF32",
                "float16": "CUBLAS_COMPUTE_32F_FAST_16F", "bfloat16": "CUBLAS_COMPUTE_32F_FAST_16BF"},
    "float16": {"float32": "CUBLAS_COMPUTE_32F"},
    "bfloat16": {"float32": "CUBLAS_COMPUTE_32F"},
    "float64": {"float64": "CUBLAS_COMPUTE_64F"},
    "float8_e4m3fn": {"float32": "CUBLAS_COMPUTE_32F"},
    "float8_e5m2": {"float32": "CUBLAS_COMPUTE_32F"},
}
_FP8_RESULTS = ("bfloat16", "float16", "float32")


@dataclass(slots=True)
class MatrixSpec:
    """One matrix as cuBLASLt stores it: column-major rows x cols with ``ld``, maybe transposed."""

    trans: int
    rows: int
    cols: int
    ld: int
    batch_stride: int
    dtype: DType


def matrix_spec(op: Operand, name: str) -> MatrixSpec:
    """Row- or column-major (…, R, C) -> cuBLASLt's column-major storage plus a transpose flag."""
    r, c = op.shape[-2:]
    sr, sc = op.strides[-2:]
    if any(s < 0 for s in op.strides):
        raise NvblasltValueError(f"{name}: negative strides are not supported, got strides {op.strides}")
    column_major = (sr == 1 or r == 1) and (c == 1 or sc >= r)
    row_major = (sc == 1 or c == 1) and (r == 1 or sr >= c)
    batch_stride = op.strides[0] if len(op.shape) == 3 and op.shape[0] > 1 else 0
    if column_major:
        return MatrixSpec(OP_N, r, c, sc if c > 1 else r, batch_stride, op.dtype)
    if row_major:
        return MatrixSpec(OP_T, c, r, sr if r > 1 else c, batch_stride, op.dtype)
    raise NvblasltValueError(
        f"{name}: expected a row- or column-major matrix (one unit stride, the other at least the extent), "
        f"got shape {op.shape} with element strides {op.strides}"
    )


def _extent_bytes(op: Operand) -> int:
    return (sum((n - 1) * s for n, s in zip(op.shape, op.strides)) + 1) * op.dtype.itemsize


def overlaps(x: Operand, y: Operand) -> bool:
    return x.ptr < y.ptr + _extent_bytes(y) and y.ptr < x.ptr + _extent_bytes(x)


class Problem:
    """A checked (batched) multiplication: extents, types, layouts of A, B, C and D."""

    def __init__(self, lib, a: Operand, b: Operand, c: Operand | None, *, compute_type=None, result_type=None):
        for name, op in (("a", a), ("b", b), ("c", c)):
            if op is not None and len(op.shape) not in (2, 3):
                raise NvblasltValueError(f"{name}: expected a 2-D matrix or a 3-D batch of matrices, got "
                                         f"{len(op.shape)}-D shape {op.shape}")
        for name, op in (("b", b), ("c", c)):
            if op is not None and op.device != a.device:
                raise NvblasltValueError(f"{name}: on GPU {op.device}, but a is on GPU {a.device}")
        self.m, self.k = a.shape[-2:]
        k_b, self.n = b.shape[-2:]
        if k_b != self.k:
            raise NvblasltValueError(f"b: expected {self.k} rows to match a's {self.k} columns (K), got shape {b.shape}")
        if 0 in (self.m, self.n, self.k):
            raise NvblasltValueError(f"a, b: zero-size dimensions are not supported, got M={self.m}, "
                                     f"N={self.n}, K={self.k}")
        self._types(a, b, compute_type, result_type)
        batches = {len(op.shape) == 3 and op.shape[0] for op in (a, b, c) if op is not None} - {False}
        counts = {x for x in batches if x != 1}
        if len(counts) > 1:
            raise NvblasltValueError(f"a, b, c: batch sizes {sorted(batches)} do not match or broadcast")
        self.batch_count = counts.pop() if counts else (1 if batches else 1)
        self.batch = (self.batch_count,) if batches else ()
        self.a = matrix_spec(a, "a")
        self.b = matrix_spec(b, "b")
        self.d = MatrixSpec(OP_N, self.m, self.n, self.m, self.m * self.n if self.batch_count > 1 else 0,
                            self.d_dtype)
        self.c = self.d
        if c is not None:
            if c.shape[-2:] != (self.m, self.n):
                raise NvblasltValueError(f"c: expected shape (…, {self.m}, {self.n}), got {c.shape}")
            if c.dtype != self.d_dtype:
                raise NvblasltTypeError(f"c: expected dtype {self.d_dtype.name} (the result's), got {c.dtype.name}")
            self.c = matrix_spec(c, "c")
            if self.c.trans != OP_N:
                raise NvblasltValueError(
                    f"c: expected a column-major (Fortran-order) matrix, as cuBLASLt reads C untransposed, got "
                    f"strides {c.strides}; pass c.T.copy().T (CuPy/NumPy-style) or an asfortranarray copy"
                )

    def _types(self, a: Operand, b: Operand, compute_type, result_type) -> None:
        ta, tb = a.dtype, b.dtype
        if ta not in _dtypes.MATMUL_TYPES:
            raise NvblasltTypeError(f"a: unsupported dtype {ta.name}; expected one of "
                                    f"{', '.join(t.name for t in _dtypes.MATMUL_TYPES)}")
        fp8 = ta in _dtypes.FLOAT8
        if (fp8 and tb not in _dtypes.FLOAT8) or (not fp8 and tb != ta) or (ta == tb == _dtypes.FLOAT8_E5M2):
            raise NvblasltTypeError(
                f"a, b: dtypes {ta.name} and {tb.name} cannot be multiplied; supported: equal types among float32, "
                f"float16, bfloat16, float64, or fp8 pairs e4m3×e4m3, e4m3×e5m2, e5m2×e4m3"
            )
        self.fp8 = fp8
        self.compute_type_name, self.scale_type_name = _COMPUTE[ta.name]
        if compute_type is not None:
            choices = _COMPUTE_CHOICES[ta.name]
            if compute_type not in choices:
                raise NvblasltValueError(f"compute_type: for {ta.name} operands expected one of "
                                         f"{sorted(choices)}, got {compute_type!r}")
            self.compute_type_name = choices[compute_type]
        if result_type is None:
            self.d_dtype = _dtypes.BFLOAT16 if fp8 else ta
        else:
            name = getattr(result_type, "name", None) or str(result_type).rsplit(".", 1)[-1]
            allowed = _FP8_RESULTS if fp8 else (ta.name,)
            if name not in allowed:
                raise NvblasltValueError(f"result_type: for {ta.name} operands expected one of {allowed}, got "
                                         f"{result_type!r}")
            self.d_dtype = _dtypes.BY_NAME[name]
        self.relu_aux_dtype = _dtypes.INT8
        self.bias_output_dtype = self.d_dtype
        self.bias_dtypes = (self.d_dtype,)

    def quantization_scales(self, scales, stream: int):
        """A device buffer holding the fp8 A and B scales (float32), or None."""
        if scales is None:
            return None
        if not self.fp8:
            raise NvblasltValueError("quantization_scales: only fp8 (float8_e4m3fn/float8_e5m2) operands take scales")
        if not isinstance(scales, dict) or set(scales) - {"a", "b"}:
            raise NvblasltValueError(f"quantization_scales: expected a dict with keys 'a' and/or 'b', got {scales!r}")
        values = []
        for key in ("a", "b"):
            value = scales.get(key, 1.0)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise NvblasltTypeError(f"quantization_scales['{key}']: expected a number, got {value!r}")
            values.append(float(value))
        from cuda.bindings import runtime as cudart

        from . import _cuda

        # Each scale on its own 256-byte boundary: cuBLASLt refuses less aligned scale pointers.
        buffer = _memory.DeviceBuffer(512, stream)
        for offset, value in zip((0, 256), values):
            _cuda.check(cudart.cudaMemcpyAsync(buffer.pointer + offset, struct.pack("<f", value), 4,
                                               cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync")
        _cuda.check(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        return buffer

    def describe(self) -> str:
        batch = f"{self.batch_count}×" if self.batch else ""
        return f"{batch}({self.m}×{self.k} @ {self.k}×{self.n}, {self.a.dtype.name}→{self.d_dtype.name})"


def _check_batch(op: Operand, problem: Problem, name: str, matrix_ndim: int) -> None:
    if len(op.shape) == matrix_ndim + 1 and op.shape[0] not in (1, problem.batch_count):
        raise NvblasltValueError(f"{name}: batch of {op.shape[0]}, but the multiplication has "
                                 f"{problem.batch_count}")
    if len(op.shape) not in (matrix_ndim, matrix_ndim + 1):
        raise NvblasltValueError(f"{name}: expected {matrix_ndim}-D (or batched {matrix_ndim + 1}-D), got shape "
                                 f"{op.shape}")


def check_bias(op: Operand, problem: Problem) -> None:
    name = "epilog_inputs['bias']"
    _check_batch(op, problem, name, 1)
    if op.shape[-1] != problem.m:
        raise NvblasltValueError(f"{name}: expected length M={problem.m} (one value per row of the result), "
                                 f"got shape {op.shape}")
    if op.strides[-1] != 1 and op.shape[-1] > 1:
        raise NvblasltValueError(f"{name}: expected contiguous elements, got strides {op.strides}")
    if op.dtype not in problem.bias_dtypes:
        raise NvblasltTypeError(f"{name}: expected dtype {' or '.join(d.name for d in problem.bias_dtypes)}, "
                                f"got {op.dtype.name}")


def _check_aux_matrix(op: Operand, problem: Problem, name: str, ld_min: int, multiple: int, unit: str) -> None:
    _check_batch(op, problem, name, 2)
    rows, cols = op.shape[-2:]
    if cols != problem.n or op.strides[-2] != 1 or op.strides[-1] != rows:
        raise NvblasltValueError(
            f"{name}: expected a column-major ({rows}, {problem.n}) array as the forward epilog returns it, got "
            f"shape {op.shape} with strides {op.strides}"
        )
    if rows < ld_min or rows % multiple:
        raise NvblasltValueError(f"{name}: leading dimension {rows} {unit} must be ≥ {ld_min} and a multiple of "
                                 f"{multiple} (as the forward epilog makes it for M={problem.m})")
    if len(op.shape) == 3 and op.shape[0] > 1 and op.strides[0] != rows * cols:
        raise NvblasltValueError(f"{name}: expected batch stride {rows * cols}, got {op.strides[0]}")


def check_relu_aux(op: Operand, problem: Problem) -> None:
    name = "epilog_inputs['relu_aux']"
    if op.dtype not in (_dtypes.INT8, _dtypes.UINT8):
        raise NvblasltTypeError(f"{name}: expected the int8 bitmask RELU_AUX returns, got dtype {op.dtype.name}")
    _check_aux_matrix(op, problem, name, -(-problem.m // 8), RELU_AUX_LD_MULTIPLE_BITS // 8, "bytes")


def check_gelu_aux(op: Operand, problem: Problem) -> None:
    name = "epilog_inputs['gelu_aux']"
    if op.dtype != problem.d_dtype:
        raise NvblasltTypeError(f"{name}: expected dtype {problem.d_dtype.name} (as GELU_AUX returns it), got "
                                f"{op.dtype.name}")
    _check_aux_matrix(op, problem, name, problem.m, GELU_AUX_LD_MULTIPLE, "elements")


def check_out(op: Operand, problem: Problem, c: Operand | None, inputs: list[Operand]) -> None:
    """``out=`` must be a writable, contiguous column-major result; it may be C itself (in place)."""
    expected_shape = (*problem.batch, problem.m, problem.n)
    if op.shape != expected_shape:
        raise NvblasltValueError(f"out: expected shape {expected_shape}, got {op.shape}")
    if op.dtype != problem.d_dtype:
        raise NvblasltTypeError(f"out: expected dtype {problem.d_dtype.name}, got {op.dtype.name}")
    expected = _memory.column_major(problem.batch, problem.m, problem.n, problem.m)[1]
    if any(s != e for s, e, n in zip(op.strides, expected, op.shape) if n > 1):
        raise NvblasltValueError(f"out: expected a contiguous column-major array (element strides {expected}), "
                                 f"got strides {op.strides}")
    if op.readonly:
        raise NvblasltValueError("out: the array is read-only (JAX arrays and read-only exports cannot be written)")
    if c is not None and overlaps(op, c) and (op.ptr, op.shape, op.strides) != (c.ptr, c.shape, c.strides):
        raise NvblasltValueError("out: partly overlaps c; pass c itself (in place) or separate memory")
    for other in inputs:
        if overlaps(op, other):
            raise NvblasltValueError(f"out: overlaps an input ({other.describe()}); write to separate memory")


# Layouts cuBLASLt has no kernels for, as seen on cuBLASLt 13.1 (H200): said when planning fails.
_LAYOUT_NEEDS = {
    "BGRADA": ("a", "column-major (Fortran-order)", lambda p: p.a.trans == OP_N),
    "BGRADB": ("b", "row-major (C-order)", lambda p: p.b.trans == OP_T),
}


def unsupported_hint(problem: Problem, epilog) -> str:
    """Why no algorithm was found, where nvblaslt knows a likely reason."""
    need = _LAYOUT_NEEDS.get(epilog.name)
    if need and not need[2](problem):
        name, layout, _ = need
        return f"{epilog.name} has kernels only for a {layout} {name}; pass {name} in that layout"
    if problem.fp8 and problem.a.trans != OP_T:
        return "fp8 kernels need a row-major A and a column-major B (the 'TN' layout)"
    return f"no algorithm for {problem.describe()} with epilog {epilog.name} on this GPU"
