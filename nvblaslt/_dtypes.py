"""The element types nvblaslt multiplies, and how each protocol and framework spells them."""

from __future__ import annotations

from dataclasses import dataclass

from ._errors import NvblasltTypeError


@dataclass(frozen=True)
class DType:
    name: str  # the framework-neutral name; also numpy/torch/cupy's attribute name
    itemsize: int
    cuda: str  # cudaDataType member name in the generated bindings
    dlpack: tuple[int, int]  # (DLDataTypeCode, bits)
    typestr: str | None  # __cuda_array_interface__ typestr; None where it is ambiguous

    @property
    def is_complex(self) -> bool:
        return self.dlpack[0] == 5

    def __repr__(self) -> str:
        return self.name


FLOAT32 = DType("float32", 4, "CUDA_R_32F", (2, 32), "<f4")
FLOAT16 = DType("float16", 2, "CUDA_R_16F", (2, 16), "<f2")
BFLOAT16 = DType("bfloat16", 2, "CUDA_R_16BF", (4, 16), None)  # CAI has no bf16 typestr
FLOAT64 = DType("float64", 8, "CUDA_R_64F", (2, 64), "<f8")
COMPLEX64 = DType("complex64", 8, "CUDA_C_32F", (5, 64), "<c8")
COMPLEX128 = DType("complex128", 16, "CUDA_C_64F", (5, 128), "<c16")
FLOAT8_E4M3 = DType("float8_e4m3fn", 1, "CUDA_R_8F_E4M3", (10, 8), None)
FLOAT8_E5M2 = DType("float8_e5m2", 1, "CUDA_R_8F_E5M2", (12, 8), None)
INT8 = DType("int8", 1, "CUDA_R_8I", (0, 8), "|i1")  # the ReLU bitmask's storage
UINT8 = DType("uint8", 1, "CUDA_R_8U", (1, 8), "|u1")
INT32 = DType("int32", 4, "CUDA_R_32I", (0, 32), "<i4")  # grouped GEMM's offsets
INT64 = DType("int64", 8, "CUDA_R_64I", (0, 64), "<i8")

ALL = (FLOAT32, FLOAT16, BFLOAT16, FLOAT64, COMPLEX64, COMPLEX128, FLOAT8_E4M3, FLOAT8_E5M2, INT8, UINT8, INT32, INT64)
BY_DLPACK = {d.dlpack: d for d in ALL}
BY_TYPESTR = {d.typestr: d for d in ALL if d.typestr}
BY_NAME = {d.name: d for d in ALL}
BY_CUDA = {d.cuda: d for d in ALL}
FLOAT8 = (FLOAT8_E4M3, FLOAT8_E5M2)
COMPLEX = (COMPLEX64, COMPLEX128)
MATMUL_TYPES = (FLOAT32, FLOAT16, BFLOAT16, FLOAT64, COMPLEX64, COMPLEX128, *FLOAT8)
# Spellings other packages use for the same types.
_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32",
            "fp64": "float64", "double": "float64", "float8_e4m3": "float8_e4m3fn", "e4m3": "float8_e4m3fn",
            "e5m2": "float8_e5m2", "cfloat": "complex64", "cdouble": "complex128"}


def from_dlpack(code: int, bits: int, lanes: int) -> DType | None:
    return BY_DLPACK.get((code, bits)) if lanes == 1 else None


def from_typestr(typestr: str) -> DType | None:
    return BY_TYPESTR.get(typestr.replace("=", "<"))


def parse(value, argument: str, cuda_values: dict[int, str] | None = None) -> DType:
    """A DType from a name ('float16'), a NumPy/CuPy/PyTorch/ml_dtypes dtype or type, or a
    ``cudaDataType`` value (as nvmath-python's options take it; ``cuda_values`` maps value -> name)."""
    if isinstance(value, DType):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        name = (cuda_values or {}).get(int(value))
        if name in BY_CUDA:
            return BY_CUDA[name]
        raise NvblasltTypeError(f"{argument}: {value!r} is not a cudaDataType value of a supported type; expected "
                                f"one of {', '.join(d.name for d in MATMUL_TYPES)}")
    text = value if isinstance(value, str) else None
    if text is None:
        text = getattr(value, "name", None) if not isinstance(value, type) else None  # numpy dtype objects
        if not isinstance(text, str):
            text = getattr(value, "__name__", None) or str(value)  # numpy scalar types, torch dtypes
    text = text.rsplit(".", 1)[-1]  # 'torch.float16' -> 'float16', 'CudaDataType.CUDA_R_16F' -> 'CUDA_R_16F'
    if text.upper() in BY_CUDA:
        return BY_CUDA[text.upper()]
    text = text.lower()
    text = _ALIASES.get(text, text)
    if text in BY_NAME:
        return BY_NAME[text]
    raise NvblasltTypeError(f"{argument}: unknown dtype {value!r}; expected one of "
                            f"{', '.join(d.name for d in MATMUL_TYPES)}")
