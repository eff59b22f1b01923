"""The 16 epilogs as data: what each one reads and writes besides A, B, C and D.

cuBLASLt defines the semantics (see its epilogue docs); GELU is the tanh approximation
0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), not the exact erf form.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._dtypes import DType


class MatmulEpilog(enum.IntEnum):
    """The fusable epilogs; values are cuBLASLt's ``cublasLtEpilogue_t`` (checked by the tests)."""

    DEFAULT = 1
    RELU = 2
    RELU_AUX = 130
    BIAS = 4
    RELU_BIAS = 6
    RELU_AUX_BIAS = 134
    DRELU = 136
    DRELU_BGRAD = 152
    GELU = 32
    GELU_AUX = 160
    GELU_BIAS = 36
    GELU_AUX_BIAS = 164
    DGELU = 192
    DGELU_BGRAD = 208
    BGRADA = 256
    BGRADB = 512


@dataclass(frozen=True)
class EpilogSpec:
    """What one epilog reads and writes besides A, B, C and D, and what it asks of D's order."""

    bias_input: bool = False  # reads epilog_inputs["bias"] (length M) through BIAS_POINTER
    aux_input: str | None = None  # reads this aux (relu_aux / gelu_aux) through EPILOGUE_AUX_POINTER
    aux_output: str | None = None  # writes this aux through EPILOGUE_AUX_POINTER
    bias_output: str | None = None  # writes this bias gradient through BIAS_POINTER
    column_major_bias_gradient: bool = False  # DRELU_BGRAD / DGELU_BGRAD / BGRADB: D must be column-major

    @property
    def inputs(self) -> tuple[str, ...]:
        return (("bias",) if self.bias_input else ()) + ((self.aux_input,) if self.aux_input else ())

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(o for o in (self.aux_output, self.bias_output) if o)

    @property
    def needs_column_major(self) -> bool:
        """Vectors and aux matrices run along D's rows: cuBLASLt needs D column-major for them."""
        return bool(self.bias_input or self.aux_input or self.aux_output or self.column_major_bias_gradient)


SPECS = {
    MatmulEpilog.DEFAULT: EpilogSpec(),
    MatmulEpilog.RELU: EpilogSpec(),
    MatmulEpilog.RELU_AUX: EpilogSpec(aux_output="relu_aux"),
    MatmulEpilog.BIAS: EpilogSpec(bias_input=True),
    MatmulEpilog.RELU_BIAS: EpilogSpec(bias_input=True),
    MatmulEpilog.RELU_AUX_BIAS: EpilogSpec(bias_input=True, aux_output="relu_aux"),
    MatmulEpilog.DRELU: EpilogSpec(aux_input="relu_aux"),
    MatmulEpilog.DRELU_BGRAD: EpilogSpec(aux_input="relu_aux", bias_output="drelu_bgrad",
                                         column_major_bias_gradient=True),
    MatmulEpilog.GELU: EpilogSpec(),
    MatmulEpilog.GELU_AUX: EpilogSpec(aux_output="gelu_aux"),
    MatmulEpilog.GELU_BIAS: EpilogSpec(bias_input=True),
    MatmulEpilog.GELU_AUX_BIAS: EpilogSpec(bias_input=True, aux_output="gelu_aux"),
    MatmulEpilog.DGELU: EpilogSpec(aux_input="gelu_aux"),
    MatmulEpilog.DGELU_BGRAD: EpilogSpec(aux_input="gelu_aux", bias_output="dgelu_bgrad",
                                         column_major_bias_gradient=True),
    MatmulEpilog.BGRADA: EpilogSpec(bias_output="bgrada"),
    # nvmath-python keeps D column-major for BGRADB too: cuBLASLt misbehaves otherwise
    MatmulEpilog.BGRADB: EpilogSpec(bias_output="bgradb", column_major_bias_gradient=True),
}

# The epilog cuBLASLt runs when it computes Dᵀ = Bᵀ·Aᵀ instead: A's column sums become B's.
TRANSPOSED = {MatmulEpilog.BGRADA: MatmulEpilog.BGRADB, MatmulEpilog.BGRADB: MatmulEpilog.BGRADA}


def transposed_epilog(epilog: MatmulEpilog) -> MatmulEpilog:
    return TRANSPOSED.get(epilog, epilog)


def bias_gradient_length_is_n(cuda_epilog: MatmulEpilog) -> bool:
    """BGRADB sums B over K: one value per column of D; every other bias gradient is per row."""
    return cuda_epilog == MatmulEpilog.BGRADB


# Aux leading dimensions cuBLASLt accepts: the ReLU bitmask in bits, a multiple of 128;
# the GELU pre-activation in elements, a multiple of 8.
RELU_AUX_LD_MULTIPLE_BITS = 128
GELU_AUX_LD_MULTIPLE = 8


def relu_aux_ld_bytes(m: int) -> int:
    return -(-m // RELU_AUX_LD_MULTIPLE_BITS) * RELU_AUX_LD_MULTIPLE_BITS // 8


def gelu_aux_ld(m: int) -> int:
    return -(-m // GELU_AUX_LD_MULTIPLE) * GELU_AUX_LD_MULTIPLE


def as_epilog(epilog) -> MatmulEpilog:
    """Accept a MatmulEpilog, its name, its cuBLASLt value, or None (DEFAULT)."""
    from ._errors import NvblasltTypeError, NvblasltValueError

    if epilog is None:
        return MatmulEpilog.DEFAULT
    if isinstance(epilog, str):
        try:
            return MatmulEpilog[epilog.upper()]
        except KeyError:
            raise NvblasltValueError(f"epilog: expected one of {', '.join(MatmulEpilog.__members__)}, "
                                     f"got {epilog!r}") from None
    if isinstance(epilog, bool) or not isinstance(epilog, int):
        raise NvblasltTypeError(f"epilog: expected a MatmulEpilog, got {type(epilog).__name__} {epilog!r}")
    try:
        return MatmulEpilog(int(epilog))
    except ValueError:
        raise NvblasltValueError(f"epilog: expected one of {', '.join(MatmulEpilog.__members__)}, "
                                 f"got value {int(epilog)}") from None


# ---- the rules for epilog inputs and outputs on a canonical problem ------------------------------
@dataclass(frozen=True, slots=True)
class EpilogInput:
    """A checked epilog input: its operand, and how cuBLASLt walks it over the batch."""

    key: str
    ptr: int
    dtype: DType
    ld: int  # aux inputs: leading dimension in elements (bytes for the ReLU mask); 0 for the bias
    batch_stride: int  # 0: one vector or matrix for every batch
    alignment: int


@dataclass(frozen=True, slots=True)
class EpilogOutput:
    """An output the epilog writes: shape and element strides as the caller receives it."""

    key: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: DType
    attribute: str  # the MatmulDesc pointer attribute it is written through
    ld: int
    batch_stride: int


def _batch_stride_of(op, matrix_ndim: int, problem, name: str) -> int:
    """The batch stride of an epilog input: 0 for one matrix/vector broadcast over the batch."""
    from ._problem import _batch

    batch_shape = op.shape[:-matrix_ndim] if matrix_ndim else op.shape
    if not batch_shape:
        return 0
    if tuple(batch_shape) != tuple(problem.batch_shape):
        raise _value_error(f"{name}: batch dimensions {tuple(batch_shape)} must match the multiplication's "
                           f"{tuple(problem.batch_shape) or '(none)'}, or be absent to use one for every batch")
    return _batch(tuple(batch_shape), op.strides[:len(batch_shape)], name) if problem.batch_count > 1 else 0


def _value_error(text: str):
    from ._errors import NvblasltValueError

    return NvblasltValueError(text)


def _type_error(text: str):
    from ._errors import NvblasltTypeError

    return NvblasltTypeError(text)


def bias_types(d_dtype) -> tuple:
    from . import _dtypes

    if d_dtype in _dtypes.FLOAT8:
        return (_dtypes.BFLOAT16, _dtypes.FLOAT16)
    return (d_dtype,)  # cuBLASLt 13.1 refuses a float32 bias with a 16-bit result (INVALID_VALUE)


def check_bias(op, problem) -> EpilogInput:
    """A bias of one value per row of D: (M,), (M, 1), or batched (…, M, 1) / (…, M)."""
    name = "epilog_inputs['bias']"
    m = problem.m
    shape, strides = op.shape, op.strides
    if len(shape) >= 2 and shape[-1] == 1 and shape[-2] == m:
        vector_ndim, stride = 2, strides[-2]
    elif len(shape) >= 1 and shape[-1] == m:
        vector_ndim, stride = 1, strides[-1]
    else:
        raise _value_error(f"{name}: expected shape (M,) or (M, 1) with M={m} (one value per row of the result), "
                           f"or batched (…, M, 1), got {shape}")
    if stride != 1 and m > 1:
        raise _value_error(f"{name}: expected unit stride along M, got strides {strides}")
    batch_stride = _batch_stride_of(op, vector_ndim, problem, name)
    allowed = bias_types(problem.types.d)
    if op.dtype not in allowed:
        raise _type_error(f"{name}: expected dtype {' or '.join(d.name for d in allowed)} for a "
                          f"{problem.types.d.name} result, got {op.dtype.name}")
    return EpilogInput("bias", op.ptr, op.dtype, 0, batch_stride, op.alignment)


def relu_aux_ld_min(m: int) -> int:
    return -(-m // 8)


def check_aux(op, key: str, problem) -> EpilogInput:
    """The aux a forward epilog returned: column-major (…, ld, N), ld padded as cuBLASLt needs."""
    from . import _dtypes

    name = f"epilog_inputs['{key}']"
    m, n = problem.m, problem.n
    if key == "relu_aux":
        if op.dtype not in (_dtypes.INT8, _dtypes.UINT8):
            raise _type_error(f"{name}: expected the int8/uint8 bitmask RELU_AUX returns, got dtype {op.dtype.name}")
        ld_min, multiple, unit = relu_aux_ld_min(m), RELU_AUX_LD_MULTIPLE_BITS // 8, "bytes"
    else:
        if op.dtype != problem.types.d:
            raise _type_error(f"{name}: expected dtype {problem.types.d.name} (as GELU_AUX returns it), got "
                              f"{op.dtype.name}")
        ld_min, multiple, unit = m, GELU_AUX_LD_MULTIPLE, "elements"
    if len(op.shape) < 2:
        raise _value_error(f"{name}: expected a (…, ld, {n}) matrix as the forward epilog returns it, got shape "
                           f"{op.shape}")
    rows, cols = op.shape[-2:]
    if cols != n or (op.strides[-2] != 1 and rows > 1) or (op.strides[-1] != rows and cols > 1):
        raise _value_error(f"{name}: expected a contiguous column-major ({rows}, {n}) matrix as the forward epilog "
                           f"returns it, got shape {op.shape} with strides {op.strides}")
    if rows < ld_min or rows % multiple:
        raise _value_error(f"{name}: leading dimension {rows} {unit} must be ≥ {ld_min} and a multiple of "
                           f"{multiple} (as the forward epilog makes it for M={m})")
    batch_stride = _batch_stride_of(op, 2, problem, name)
    ld = rows * 8 if key == "relu_aux" else rows  # cuBLASLt counts the ReLU mask's ld in bits
    return EpilogInput(key, op.ptr, op.dtype, ld, batch_stride * (8 if key == "relu_aux" else 1), op.alignment)


def outputs(spec: EpilogSpec, problem, relu_aux_dtype, aux_dtype=None) -> list[EpilogOutput]:
    """The outputs of ``spec`` on ``problem``, shaped as nvmath-python returns them."""
    from ._memory import c_strides

    batch = tuple(problem.batch_shape)
    batch_count = problem.batch_count
    found = []
    if spec.aux_output:
        relu = spec.aux_output == "relu_aux"
        rows = relu_aux_ld_bytes(problem.m) if relu else gelu_aux_ld(problem.m)
        dtype = relu_aux_dtype if relu else (aux_dtype or problem.types.d)
        matrix = rows * problem.n
        strides = (*c_strides(batch, matrix), 1, rows)
        ld = rows * 8 if relu else rows
        found.append(EpilogOutput(spec.aux_output, (*batch, rows, problem.n), strides, dtype,
                                  "EPILOGUE_AUX_POINTER", ld, (matrix * (8 if relu else 1)) if batch_count > 1 else 0))
    if spec.bias_output:
        length = problem.n if bias_gradient_length_is_n(problem.epilog) else problem.m
        if batch:
            shape, strides = (*batch, length, 1), (*c_strides(batch, length), 1, length)
        else:
            shape, strides = (length,), (1,)
        found.append(EpilogOutput(spec.bias_output, shape, strides, problem.types.d, "BIAS_POINTER", 0,
                                  length if batch_count > 1 else 0))
    return found
