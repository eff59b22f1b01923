"""Which type combinations cuBLASLt multiplies: A/B types, compute type, scale type, C and D types.

The table follows cuBLASLt's documented ``cublasLtMatmul`` type combinations; what it admits
the heuristics may still refuse on a given GPU, and that refusal is reported as it comes.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

from . import _dtypes
from ._dtypes import BFLOAT16, COMPLEX64, COMPLEX128, FLOAT8_E4M3, FLOAT8_E5M2, FLOAT16, FLOAT32, FLOAT64, DType
from ._errors import NvblasltArgumentError, NvblasltTypeError, NvblasltValueError
from ._pinned import cublasComputeType_t

F8 = (FLOAT8_E4M3, FLOAT8_E5M2)
# (A, B) -> default compute type (without the CUBLAS_ prefix)
_DEFAULT_COMPUTE = {
    (FLOAT32, FLOAT32): "COMPUTE_32F", (FLOAT16, FLOAT16): "COMPUTE_32F", (BFLOAT16, BFLOAT16): "COMPUTE_32F",
    (FLOAT64, FLOAT64): "COMPUTE_64F", (COMPLEX64, COMPLEX64): "COMPUTE_32F",
    (COMPLEX128, COMPLEX128): "COMPUTE_64F", (FLOAT8_E4M3, FLOAT8_E4M3): "COMPUTE_32F",
    (FLOAT8_E4M3, FLOAT8_E5M2): "COMPUTE_32F", (FLOAT8_E5M2, FLOAT8_E4M3): "COMPUTE_32F",
}
# compute type -> scale type for real / complex operands
_SCALE_OF_COMPUTE = {
    "COMPUTE_16F": ("CUDA_R_16F", None), "COMPUTE_16F_PEDANTIC": ("CUDA_R_16F", None),
    **{c: ("CUDA_R_32F", "CUDA_C_32F") for c in ("COMPUTE_32F", "COMPUTE_32F_PEDANTIC", "COMPUTE_32F_FAST_16F",
                                                 "COMPUTE_32F_FAST_16BF", "COMPUTE_32F_FAST_TF32",
                                                 "COMPUTE_32F_EMULATED_16BFX9")},
    **{c: ("CUDA_R_64F", "CUDA_C_64F") for c in ("COMPUTE_64F", "COMPUTE_64F_PEDANTIC",
                                                 "COMPUTE_64F_EMULATED_FIXEDPOINT")},
}
_COMPUTE_OF_SCALE = {"CUDA_R_16F": "COMPUTE_16F", "CUDA_R_16BF": "COMPUTE_32F", "CUDA_R_32F": "COMPUTE_32F",
                     "CUDA_C_32F": "COMPUTE_32F", "CUDA_R_64F": "COMPUTE_64F", "CUDA_C_64F": "COMPUTE_64F"}
# Short spellings of compute types, by input type.
_COMPUTE_ALIASES = {"float32": "COMPUTE_32F", "tf32": "COMPUTE_32F_FAST_TF32", "float16": "COMPUTE_32F_FAST_16F",
                    "bfloat16": "COMPUTE_32F_FAST_16BF", "float64": "COMPUTE_64F"}


def _fp8_results(a: DType, b: DType) -> tuple[DType, ...]:
    both_e4m3 = a == b == FLOAT8_E4M3
    return (FLOAT32, FLOAT16, BFLOAT16, FLOAT8_E4M3) + (() if both_e4m3 else (FLOAT8_E5M2,))


def _admits(a: DType, b: DType, compute: str, scale: str) -> bool:
    """Whether cuBLASLt multiplies A, B with this compute and scale type (C/D checked apart)."""
    ab = a if a == b else (a, b)
    if compute in ("COMPUTE_16F", "COMPUTE_16F_PEDANTIC"):
        return scale == "CUDA_R_16F" and ab == FLOAT16
    if compute in ("COMPUTE_32F", "COMPUTE_32F_PEDANTIC"):
        if scale == "CUDA_R_32F":
            return ab in (FLOAT32, FLOAT16, BFLOAT16, FLOAT8_E4M3) or (compute == "COMPUTE_32F" and (
                (FLOAT8_E4M3, FLOAT8_E5M2) == ab or (FLOAT8_E5M2, FLOAT8_E4M3) == ab))
        return scale == "CUDA_C_32F" and ab == COMPLEX64
    if compute.startswith("COMPUTE_32F_"):
        return (scale == "CUDA_R_32F" and ab == FLOAT32) or (scale == "CUDA_C_32F" and ab == COMPLEX64)
    if compute.startswith("COMPUTE_64F"):
        return (scale == "CUDA_R_64F" and ab == FLOAT64) or (scale == "CUDA_C_64F" and ab == COMPLEX128)
    return False


def result_types(a: DType, b: DType, compute: str) -> tuple[DType, ...]:
    """The D types cuBLASLt produces from A, B with this compute type (first: the default)."""
    if a in F8:
        return _fp8_results(a, b)
    if compute in ("COMPUTE_16F", "COMPUTE_16F_PEDANTIC"):
        return (FLOAT16,)
    if a in (FLOAT16, BFLOAT16):
        return (a, FLOAT32)
    return (a,)


def c_types(d: DType) -> tuple[DType, ...]:
    """The C types cuBLASLt pairs with a D type: C = D, except fp8 results take a 16-bit C."""
    return (FLOAT16, BFLOAT16) if d in F8 else (d,)


@dataclass(frozen=True, slots=True)
class Types:
    a: DType
    b: DType
    c: DType  # also when there is no C: cuBLASLt still needs its type
    d: DType
    compute: str  # generated-binding name without the CUBLAS_ prefix, e.g. COMPUTE_32F
    scale: str  # generated-binding name, e.g. CUDA_R_32F

    @property
    def fp8(self) -> bool:
        return self.a in F8

    @property
    def scale_dtype(self) -> DType:
        return _dtypes.BY_CUDA[self.scale] if self.scale in _dtypes.BY_CUDA else FLOAT16


def _integer(value) -> int | None:
    """``value`` as an int where it is one (an enum member, a NumPy integer; not a bool), else None."""
    if isinstance(value, bool) or isinstance(value, str):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def enum_name(value, enum, prefix: str, argument: str, aliases: dict[str, str] | None = None,
              where: str = " in the loaded cuBLASLt") -> str:
    """A member name of the generated ``enum`` (without ``prefix``) from a name, an alias or a value."""
    members = {name.removeprefix(prefix): int(member) for name, member in enum.__members__.items()}
    number = _integer(value)
    if number is not None:
        for name, member in members.items():
            if member == number:
                return name
        raise NvblasltValueError(f"{argument}: {number} is not a value of {enum.__name__}{where}; expected one "
                                 f"of {sorted(members)}")
    if not isinstance(value, str):
        name = getattr(value, "name", None)  # an enum member of another package (nvmath's)
        if not isinstance(name, str):
            raise NvblasltTypeError(f"{argument}: expected a name or a {enum.__name__} value, got "
                                    f"{type(value).__name__} {value!r}")
        value = name
    text = (aliases or {}).get(value, value)
    text = text.upper().removeprefix("CUBLAS_").removeprefix(prefix)
    for candidate in (text, text.removeprefix("COMPUTE_")):
        if candidate in members:
            return candidate
        if f"COMPUTE_{candidate}" in members and prefix == "":
            return f"COMPUTE_{candidate}"
    raise NvblasltValueError(f"{argument}: {value!r} is not a member of {enum.__name__}{where}; expected one of "
                             f"{sorted(members)}")


def compute_type_name(value, compute_types, argument: str = "compute_type",
                      where: str = " in the loaded cuBLASLt") -> str:
    """The name (``COMPUTE_32F_FAST_TF32``) of a floating-point compute type given as a name, an
    alias (``"tf32"``), a value or another package's enum member, from ``compute_types`` (a
    ``cublasComputeType_t``)."""
    compute = enum_name(value, compute_types, "CUBLAS_", argument, _COMPUTE_ALIASES, where)
    if compute not in _SCALE_OF_COMPUTE:
        raise NvblasltValueError(f"{argument}: {compute} is not a compute type for floating-point matmuls; "
                                 f"expected one of {sorted(_SCALE_OF_COMPUTE)}")
    return compute


def check_compute_type(value, argument: str = "compute_type") -> None:
    """Refuse a compute type no cuBLAS release nvblaslt knows has, without loading the library (the
    newest bindings' enum holds every older one's members); ``resolve`` checks it against the loaded one."""
    compute_type_name(value, cublasComputeType_t, argument, " in any cuBLAS release nvblaslt knows")


def cuda_type_names(api) -> dict[int, str]:
    """``cudaDataType`` value -> its C name (``CUDA_R_16F``), for dtypes given as values."""
    names: dict[int, str] = {}
    for name, member in api.cudaDataType.__members__.items():
        name = name if name.startswith("CUDA_") else f"CUDA_{name}"
        if int(member) not in names or name in _dtypes.BY_CUDA:  # aliases (E4M3 = UE4M3): the one we know
            names[int(member)] = name
    return names


def resolve(api, a: DType, b: DType, c: DType | None, *, compute_type=None, scale_type=None, result_type=None,
            inplace: bool = False) -> Types:
    """Check the operand types and settle compute, scale, C and D types as nvmath-python does:
    D is ``result_type``, else C's type, else A's; compute and scale types follow each other."""
    for name, dtype in (("a", a), ("b", b)):
        if dtype not in _dtypes.MATMUL_TYPES:
            # nvmath-python's own test anchors its regex at "The dtype of operand", so the argument's
            # name follows the phrase instead of leading the message.
            raise NvblasltArgumentError(f"The dtype of operand {name.upper()} (argument {name}: {dtype.name}) is not "
                                        f"supported; expected one of {', '.join(t.name for t in _dtypes.MATMUL_TYPES)}")
    if (a, b) not in _DEFAULT_COMPUTE:
        raise NvblasltArgumentError(f"a, b: Unsupported combination of dtypes for operands A {a.name} and B {b.name}: "
                                    f"they cannot be multiplied; supported: equal types "
                                f"among float32, float16, bfloat16, float64, complex64, complex128, or fp8 pairs "
                                f"e4m3×e4m3, e4m3×e5m2, e5m2×e4m3")
    complex_ = a in _dtypes.COMPLEX
    cuda_values = cuda_type_names(api)
    compute = scale = None
    if compute_type is not None:
        compute = compute_type_name(compute_type, api.cublasComputeType_t)
    if scale_type is not None:
        if isinstance(scale_type, int) and not isinstance(scale_type, bool):
            scale = cuda_values.get(int(scale_type))
        else:
            try:
                scale = _dtypes.parse(scale_type, "scale_type").cuda
            except NvblasltTypeError:
                scale = str(getattr(scale_type, "name", scale_type)).upper()
                scale = scale if scale.startswith("CUDA_") else f"CUDA_{scale}"
        if scale not in _COMPUTE_OF_SCALE:
            raise NvblasltValueError(f"scale_type: expected one of {sorted(_COMPUTE_OF_SCALE)}, got {scale_type!r}")
    if compute is None:
        compute = _COMPUTE_OF_SCALE[scale] if scale is not None else _DEFAULT_COMPUTE[a, b]
    if scale is None:
        real, cplx = _SCALE_OF_COMPUTE[compute]
        scale = cplx if complex_ else real
    if scale is None or not _admits(a, b, compute, scale):
        raise NvblasltValueError(f"compute_type, scale_type: not supported: cuBLASLt does not multiply {a.name} × "
                                 f"{b.name} with {compute} and scale type {scale}")
    allowed = result_types(a, b, compute)
    if inplace:
        d = c
    elif result_type is not None:
        d = _dtypes.parse(result_type, "result_type", cuda_values)
    else:
        d = c if c is not None else a
    assert d is not None  # in place, Operands made sure there is a c
    if d not in allowed:
        what = "c (the in-place result)" if inplace else ("result_type" if result_type is not None else "c")
        raise NvblasltArgumentError(f"{what}: {a.name} × {b.name} with {compute} gives one of "
                                f"{', '.join(t.name for t in allowed)}, not {d.name}")
    c_allowed = c_types(d)
    if c is not None and c not in c_allowed:
        raise NvblasltArgumentError(f"c: expected dtype {' or '.join(t.name for t in c_allowed)} for a {d.name} result, "
                                f"got {c.name}")
    return Types(a, b, c if c is not None else c_allowed[0], d, compute, scale)
