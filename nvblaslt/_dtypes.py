"""The element types nvblaslt multiplies, and how each protocol and framework spells them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str  # the framework-neutral name; also numpy/torch/cupy's attribute name
    itemsize: int
    cuda: str  # cudaDataType member name in the generated bindings
    dlpack: tuple[int, int]  # (DLDataTypeCode, bits)
    typestr: str | None  # __cuda_array_interface__ typestr; None where it is ambiguous


FLOAT32 = DType("float32", 4, "CUDA_R_32F", (2, 32), "<f4")
FLOAT16 = DType("float16", 2, "CUDA_R_16F", (2, 16), "<f2")
BFLOAT16 = DType("bfloat16", 2, "CUDA_R_16BF", (4, 16), None)  # CAI has no bf16 typestr
FLOAT64 = DType("float64", 8, "CUDA_R_64F", (2, 64), "<f8")
FLOAT8_E4M3 = DType("float8_e4m3fn", 1, "CUDA_R_8F_E4M3", (10, 8), None)
FLOAT8_E5M2 = DType("float8_e5m2", 1, "CUDA_R_8F_E5M2", (12, 8), None)
INT8 = DType("int8", 1, "CUDA_R_8I", (0, 8), "|i1")  # the ReLU bitmask's storage
UINT8 = DType("uint8", 1, "CUDA_R_8U", (1, 8), "|u1")

ALL = (FLOAT32, FLOAT16, BFLOAT16, FLOAT64, FLOAT8_E4M3, FLOAT8_E5M2, INT8, UINT8)
BY_DLPACK = {d.dlpack: d for d in ALL}
BY_TYPESTR = {d.typestr: d for d in ALL if d.typestr}
BY_NAME = {d.name: d for d in ALL}
FLOAT8 = (FLOAT8_E4M3, FLOAT8_E5M2)
MATMUL_TYPES = (FLOAT32, FLOAT16, BFLOAT16, FLOAT64, *FLOAT8)


def from_dlpack(code: int, bits: int, lanes: int) -> DType | None:
    return BY_DLPACK.get((code, bits)) if lanes == 1 else None


def from_typestr(typestr: str) -> DType | None:
    return BY_TYPESTR.get(typestr.replace("=", "<"))
