"""The 16 epilogs as data: what each one reads and writes besides A, B, C and D.

cuBLASLt defines the semantics (see its epilogue docs); GELU is the tanh approximation
0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), not the exact erf form.
"""

from __future__ import annotations

import enum
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import _dtypes
from ._dtypes import DType
from ._errors import NvblasltArgumentError, NvblasltTypeError, NvblasltValueError
from ._pinned import cublasLtEpilogue_t
from ._strides import batch_stride, c_strides


# The epilogs as cuBLASLt numbers them (the same in 12.x and 13.x), under nvmath-python's name: the
# generated enum's members, so that no number is written twice.
if TYPE_CHECKING:
    MatmulEpilog = cublasLtEpilogue_t
else:
    MatmulEpilog = enum.IntEnum("MatmulEpilog", [(e.name, e.value) for e in cublasLtEpilogue_t], module=__name__)
    MatmulEpilog.__doc__ = """The epilogs cuBLASLt fuses after a multiplication (nvmath-python's ``MatmulEpilog``).

    An ``IntEnum`` whose 16 members are cuBLASLt's ``cublasLtEpilogue_t``, with the same names
    and values (the same in cuBLAS 12.x and 13.x). Wherever an epilog is taken (``matmul``,
    ``Matmul.plan``), a member's name (any case) or its integer value is accepted too.

    With ``z = alpha * a @ b + beta * c``, D is:

    - ``DEFAULT``: ``z``; ``RELU``, ``GELU``: ``act(z)``;
    - ``BIAS``, ``RELU_BIAS``, ``GELU_BIAS``: ``act(z + bias)``, with ``epilog_inputs["bias"]``
      one value per row of D;
    - ``RELU_AUX``, ``RELU_AUX_BIAS``: ``relu(z [+ bias])``, also returning ``aux["relu_aux"]``,
      the bitmask of where the input was positive;
    - ``GELU_AUX``, ``GELU_AUX_BIAS``: ``gelu(z [+ bias])``, also returning ``aux["gelu_aux"]``,
      GELU's input;
    - ``DRELU``, ``DGELU``: ``z * act'(pre-activation)``, reading ``epilog_inputs["relu_aux"]`` /
      ``["gelu_aux"]`` as the forward epilog returned them (the backward pass through the
      activation);
    - ``DRELU_BGRAD``, ``DGELU_BGRAD``: the same, also returning the bias gradient (D's rows
      summed) as ``aux["drelu_bgrad"]`` / ``aux["dgelu_bgrad"]``;
    - ``BGRADA``, ``BGRADB``: ``z``, also returning ``aux["bgrada"]`` (A summed over K, one value
      per row of D) or ``aux["bgradb"]`` (B summed over K, one value per column of D).

    Parameters
    ----------
    value : int
        A ``cublasLtEpilogue_t`` value; ``MatmulEpilog(value)`` is its member. By name:
        ``MatmulEpilog["RELU_BIAS"]``.

    Raises
    ------
    ValueError
        ``value`` is not one of the 16 values.

    Notes
    -----
    cuBLASLt's GELU is the tanh approximation ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))``, not
    the exact erf form. The epilogs that read or write a bias, an aux or a bias gradient run along
    D's rows: nvblaslt makes D column-major for them (a row-major ``c`` is refused there).

    Examples
    --------
    >>> from nvblaslt import MatmulEpilog
    >>> MatmulEpilog.RELU_AUX_BIAS.value
    134
    >>> MatmulEpilog(134)
    <MatmulEpilog.RELU_AUX_BIAS: 134>
    >>> MatmulEpilog["dgelu_bgrad".upper()]
    <MatmulEpilog.DGELU_BGRAD: 208>
    >>> [e.name for e in MatmulEpilog if e.name.endswith("BGRAD")]
    ['DRELU_BGRAD', 'DGELU_BGRAD']
    """


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
    """Accept a MatmulEpilog, its name, its cuBLASLt value (any integer, NumPy's too), or None (DEFAULT)."""
    if epilog is None:
        return MatmulEpilog.DEFAULT
    if isinstance(epilog, str):
        try:
            return MatmulEpilog.__members__[epilog.upper()]
        except KeyError:
            raise NvblasltValueError(f"epilog: expected one of {', '.join(MatmulEpilog.__members__)}, "
                                     f"got {epilog!r}") from None
    try:  # an int, another package's enum member, a NumPy integer: whatever has __index__ (not a bool)
        boolean = isinstance(epilog, bool) or getattr(getattr(epilog, "dtype", None), "kind", "") == "b"
        value = None if boolean else operator.index(epilog)  # (NumPy < 2 gives its bools an __index__)
    except TypeError:
        value = None
    if value is None:
        raise NvblasltTypeError(f"epilog: expected a MatmulEpilog, its name or its value, got "
                                f"{type(epilog).__name__} {epilog!r}")
    try:
        return MatmulEpilog(value)
    except ValueError:
        raise NvblasltValueError(f"epilog: expected one of {', '.join(MatmulEpilog.__members__)}, "
                                 f"got value {value}") from None


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


def _batch_stride_of(op, matrix_ndim: int, problem, name: str, what: str) -> int:
    """The batch stride of an epilog input (``what``: "bias", "relu_aux auxiliary input"): 0 for one
    matrix/vector broadcast over the batch. Checked before the matrix's own strides, as nvmath-python does."""
    batch_shape = op.shape[:-matrix_ndim] if matrix_ndim else op.shape
    if not batch_shape:
        return 0
    if tuple(batch_shape) != tuple(problem.batch_shape):
        raise NvblasltValueError(f"{name}: The batch dimensions of the {what} {tuple(batch_shape)} must match with "
                                 f"that of the matrix multiplication definition "
                                 f"{tuple(problem.batch_shape) or '(none)'}, or be absent to use one for every batch")
    if problem.batch_count == 1:
        return 0
    return batch_stride(tuple(batch_shape), op.strides[:len(batch_shape)], name, f"the {what}")


def bias_types(types) -> tuple:
    """The bias dtypes ``types`` may take (the descriptor's BIAS_DATA_TYPE says which was given)."""
    if types.d in _dtypes.FLOAT8:
        return (_dtypes.BFLOAT16, _dtypes.FLOAT16)
    if types.fp8:  # fp8 operands with a wider result: the result's type, or a 16-bit bias as nvmath-python allows
        return tuple(dict.fromkeys((types.d, _dtypes.BFLOAT16, _dtypes.FLOAT16)))
    return (types.d,)  # cuBLASLt 13.1 refuses a float32 bias with a 16-bit result (INVALID_VALUE)


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
        raise NvblasltValueError(f"{name}: The extents {shape} of the bias must match the result's M={m} (one value "
                                 f"per row of the result): expected (M,) or (M, 1), or batched (…, M, 1)")
    batch_stride = _batch_stride_of(op, vector_ndim, problem, name, "bias")
    if stride != 1 and m > 1:
        raise NvblasltValueError(f"{name}: The stride of the bias along M ({stride}, in element strides {strides}) "
                                 f"must be 1: its M values must be contiguous")
    allowed = bias_types(problem.types)
    if op.dtype not in allowed:
        raise NvblasltArgumentError(f"{name}: expected dtype {' or '.join(d.name for d in allowed)} for a "
                          f"{problem.types.d.name} result, got {op.dtype.name}")
    return EpilogInput("bias", op.ptr, op.dtype, 0, batch_stride, op.alignment)


def relu_aux_ld_min(m: int) -> int:
    return -(-m // 8)


def check_aux(op, key: str, problem) -> EpilogInput:
    """The aux a forward epilog returned: column-major (…, ld, N), ld padded as cuBLASLt needs."""
    name = f"epilog_inputs['{key}']"
    m, n = problem.m, problem.n
    if key == "relu_aux":
        if op.dtype not in (_dtypes.INT8, _dtypes.UINT8):
            raise NvblasltArgumentError(f"{name}: The dtype of the {key} auxiliary input ({op.dtype.name}) must be "
                                        f"int8 or uint8 (the bitmask RELU_AUX returns)")
        ld_min, multiple, unit = relu_aux_ld_min(m), RELU_AUX_LD_MULTIPLE_BITS // 8, "bytes"
    else:
        if op.dtype != problem.types.d:
            raise NvblasltArgumentError(f"{name}: The dtype of the {key} auxiliary input ({op.dtype.name}) must be "
                                        f"{problem.types.d.name} (as GELU_AUX returns it)")
        ld_min, multiple, unit = m, GELU_AUX_LD_MULTIPLE, "elements"
    if len(op.shape) < 2:
        raise NvblasltValueError(f"{name}: expected a (…, ld, {n}) matrix as the forward epilog returns it, got shape "
                           f"{op.shape}")
    rows, cols = op.shape[-2:]
    batch_stride = _batch_stride_of(op, 2, problem, name, f"{key} auxiliary input")
    if cols != n:
        raise NvblasltValueError(f"{name}: The auxiliary epilog input {key} must have the MM shape, as the forward "
                                 f"epilog returns it: (…, ld, N) with N={n}; got shape {op.shape}")
    for axis, what, stride in ((-2, "M", 1), (-1, "N", rows)):  # contiguous column-major: the ld is the rows
        if op.strides[axis] != stride and op.shape[axis] > 1:
            raise NvblasltValueError(f"{name}: The stride of the {key} auxiliary input of shape {op.shape} must be "
                                     f"{stride} along the dimension {len(op.shape) + axis}, which corresponds to the "
                                     f"{what} dimension (contiguous column-major, as the forward epilog returns it); "
                                     f"got strides {op.strides}")
    if rows < ld_min or rows % multiple:
        raise NvblasltValueError(f"{name}: leading dimension {rows} {unit} must be ≥ {ld_min} and a multiple of "
                           f"{multiple} (as the forward epilog makes it for M={m})")
    ld = rows * 8 if key == "relu_aux" else rows  # cuBLASLt counts the ReLU mask's ld in bits
    return EpilogInput(key, op.ptr, op.dtype, ld, batch_stride * (8 if key == "relu_aux" else 1), op.alignment)


def outputs(spec: EpilogSpec, problem, relu_aux_dtype, aux_dtype=None) -> list[EpilogOutput]:
    """The outputs of ``spec`` on ``problem``, shaped as nvmath-python returns them."""
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


# ---- the split bias-gradient form and the search ---------------------------------------------------
# The bias-gradient epilogs as two calls (``_split_bgrad``): the epilog of the call that writes D, and what the
# GEMV after it sums into the bias gradient (D's rows, or the caller's A or B over K).
SPLIT_FORMS = {MatmulEpilog.DRELU_BGRAD: (MatmulEpilog.DRELU, "d"), MatmulEpilog.DGELU_BGRAD: (MatmulEpilog.DGELU, "d"),
               MatmulEpilog.BGRADA: (MatmulEpilog.DEFAULT, "a"), MatmulEpilog.BGRADB: (MatmulEpilog.DEFAULT, "b")}
# Epilogs whose heuristic picks the search also tries: they include tiles never paired with aux epilogs.
SEARCH_OTHER_EPILOGS = (MatmulEpilog.DEFAULT, MatmulEpilog.RELU_BIAS, MatmulEpilog.BIAS)
BIAS_EPILOGS = (MatmulEpilog.BIAS, MatmulEpilog.RELU_BIAS)


# ---- one plan's epilog: its inputs checked, its outputs shaped, its descriptor attributes -----------
# An output pointer before the first launch: aligned, in the never-mapped first page. cuBLASLt's heuristics
# read whether an output pointer is set (and its alignment): left NULL, an aux epilog with M=1 in 16 bits got
# one algorithm, which cublasLtMatmul then refused (H200, cuBLASLt 13.1).
UNSET_OUTPUT = 256


@dataclass(frozen=True)
class Prepared:
    """An epilog ready for one canonical problem: checked inputs, outputs shaped once."""

    epilog: MatmulEpilog
    spec: EpilogSpec
    inputs: dict  # key -> EpilogInput
    outputs: list  # EpilogOutput, as the caller receives them
    aux_dtype: DType | None  # the GELU aux output's dtype
    aux_amax: bool  # an fp8 GELU aux's amax is an output too


def split_aux_scale(epilog_inputs) -> tuple[dict, object]:
    """(the epilog inputs, the fp8 aux's ``aux_quantization_scale`` or None): the scale is no operand."""
    if not isinstance(epilog_inputs, (dict, type(None))):
        raise NvblasltTypeError(f"epilog_inputs: expected a dict, got {type(epilog_inputs).__name__}")
    given = dict(epilog_inputs or {})
    return given, given.pop("aux_quantization_scale", None)


def aux_output_type(spec: EpilogSpec, types, epilog_preferences, scale, type_names: dict) -> DType | None:
    """The GELU aux output's dtype, nvmath-python's rules: D's type, or C's where D is fp8 (an fp8
    aux needs a scale), unless ``preferences.epilog.aux_type`` names an fp8 type or that default;
    an fp8 aux takes ``aux_quantization_scale`` and may have an amax; nothing else takes either."""
    aux_type = epilog_preferences.aux_type
    default = (types.c if types.d in _dtypes.FLOAT8 else types.d) if spec.aux_output == "gelu_aux" else None
    aux_dtype = default
    if aux_type is not None:
        if spec.aux_output != "gelu_aux":
            raise NvblasltValueError("preferences.epilog.aux_type: only GELU_AUX epilogs take an aux type (the ReLU "
                                     "aux is a bitmask)")
        aux_dtype = _dtypes.parse(aux_type, "preferences.epilog.aux_type", type_names)
        allowed = (*_dtypes.FLOAT8, default)
        if aux_dtype not in allowed:
            raise NvblasltTypeError(f"preferences.epilog.aux_type: expected one of "
                                    f"{', '.join(d.name for d in allowed if d is not None)}, got {aux_dtype.name}")
    narrow = aux_type is not None and aux_dtype in _dtypes.FLOAT8
    if narrow and scale is None:
        raise NvblasltValueError("epilog_inputs['aux_quantization_scale']: required when "
                                 "preferences.epilog.aux_type is an fp8 type")
    if scale is not None and not narrow:
        raise NvblasltValueError("epilog_inputs['aux_quantization_scale']: only an fp8 aux "
                                 "(preferences.epilog.aux_type) takes a scale")
    if epilog_preferences.aux_amax and not narrow:
        raise NvblasltValueError("preferences.epilog.aux_amax: only an fp8 aux (preferences.epilog.aux_type) has "
                                 "an amax")
    return aux_dtype


def input_keys(epilog: MatmulEpilog, given: dict, problem) -> tuple[str, ...]:
    """The inputs ``epilog`` reads, all of which must be ``given``, and nothing else (a key it does not
    take is a mistake to report, not to drop: nvmath-python refuses it too)."""
    spec = check_input_names(epilog, given)
    if spec.aux_input and problem.k == 1:
        raise NvblasltValueError(f"a, b: K=1 is not supported for {epilog.name} epilog (cuBLASLt reads out of "
                                 f"bounds there); got K=1")
    return spec.inputs


def check_input_names(epilog: MatmulEpilog, given) -> EpilogSpec:
    """``epilog``'s spec, once ``given`` (the epilog inputs' names, the fp8 aux scale left out) names
    exactly its inputs: a check with no arrays read, which the function form runs before staging any."""
    spec = SPECS[epilog]
    missing = [k for k in spec.inputs if k not in given]
    if missing:
        raise NvblasltValueError(f"epilog_inputs: The epilog {epilog.name} requires the following input tensors: "
                                 f"{set(spec.inputs)}. Missing {missing}")
    unknown = [k for k in given if k not in spec.inputs]
    if unknown:
        raise NvblasltValueError(f"epilog_inputs: {epilog.name} takes {list(spec.inputs) or 'no inputs'}; got also "
                                 f"{unknown}")
    return spec


def check_input(key: str, op, problem) -> EpilogInput:
    """One epilog input (an operand already read), checked against the problem."""
    if op.conjugated:
        raise NvblasltValueError(f"epilog_inputs['{key}']: a conjugate view cannot be read as an epilog input; "
                                 f"call .resolve_conj() first")
    return check_bias(op, problem) if key == "bias" else check_aux(op, key, problem)


def prepare(epilog: MatmulEpilog, problem, inputs: dict, aux_dtype: DType | None, aux_amax: bool) -> Prepared:
    """The epilog on ``problem``: ``inputs`` (key -> Operand, read) checked, outputs shaped once."""
    spec = SPECS[epilog]
    checked = {key: check_input(key, op, problem) for key, op in inputs.items()}
    return Prepared(epilog, spec, checked, outputs(spec, problem, _dtypes.UINT8, aux_dtype), aux_dtype,
                    bool(aux_amax))


def configure(desc, api, problem, prepared: Prepared, *, result_amax: bool) -> None:
    """The epilog's attributes of the matmul descriptor: inputs' pointers, types, leading dimensions
    and batch strides; outputs' types and layouts, with placeholder pointers (set per launch)."""
    batched = problem.batch_count > 1
    types = problem.types
    aux_dtype = prepared.aux_dtype
    if aux_dtype is not None and (aux_dtype != types.d or types.d in _dtypes.FLOAT8):
        # cuBLASLt's own default with an fp8 D is not the type nvmath-python returns: say it always
        desc.set("EPILOGUE_AUX_DATA_TYPE", int(getattr(api, aux_dtype.cuda)))
    bias = prepared.inputs.get("bias")
    if bias is not None:
        desc.set("BIAS_POINTER", bias.ptr)
        desc.set("BIAS_DATA_TYPE", int(getattr(api, bias.dtype.cuda)))
        if batched:
            desc.set("BIAS_BATCH_STRIDE", bias.batch_stride)
    aux = prepared.inputs.get(prepared.spec.aux_input) if prepared.spec.aux_input else None
    if aux is not None:
        desc.set("EPILOGUE_AUX_POINTER", aux.ptr)
        desc.set("EPILOGUE_AUX_LD", aux.ld)
        if batched:
            desc.set("EPILOGUE_AUX_BATCH_STRIDE", aux.batch_stride)
    for output in prepared.outputs:
        if output.attribute == "BIAS_POINTER":
            desc.set("BIAS_DATA_TYPE", int(getattr(api, output.dtype.cuda)))
            if batched:
                desc.set("BIAS_BATCH_STRIDE", output.batch_stride)
        else:
            desc.set("EPILOGUE_AUX_LD", output.ld)
            if batched:
                desc.set("EPILOGUE_AUX_BATCH_STRIDE", output.batch_stride)
    for attribute in sorted(output_pointer_attributes(prepared, result_amax)):
        desc.set(attribute, UNSET_OUTPUT)


def output_pointer_attributes(prepared: Prepared, result_amax: bool) -> list[str]:
    """The descriptor's pointer attributes each launch points at a new output, in output order."""
    attributes = [o.attribute for o in prepared.outputs]
    if prepared.aux_amax:
        attributes.append("EPILOGUE_AUX_AMAX_POINTER")
    if result_amax:
        attributes.append("AMAX_D_POINTER")
    return attributes
