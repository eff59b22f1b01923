"""What the generator takes from the headers, as data.

Everything specific to cuBLASLt lives here; the parser and template are generic.
"""

import re

# Headers whose declarations (functions, typedefs, structs, #define constants) are bound.
DECLARATION_HEADERS = ("cublasLt.h",)

# Headers whose enums are bound as well: the types cublasLt.h's API is spelled in.
ENUM_HEADERS = ("library_types.h", "cublas_api.h", "cublasLt.h")

# The NVIDIA headers one bindings module is generated from, in include order.
NVIDIA_HEADERS = ("cublasLt.h", "cublas_api.h", "library_types.h")

# C scalar types (after typedef resolution) and their ctypes spelling (LP64).
C_SCALARS = {
    ("void",): "None",
    ("char",): "ctypes.c_char",
    ("signed", "char"): "ctypes.c_byte",
    ("unsigned", "char"): "ctypes.c_ubyte",
    ("short",): "ctypes.c_short",
    ("unsigned", "short"): "ctypes.c_ushort",
    ("int",): "ctypes.c_int",
    ("unsigned",): "ctypes.c_uint",
    ("unsigned", "int"): "ctypes.c_uint",
    ("long",): "ctypes.c_long",
    ("unsigned", "long"): "ctypes.c_ulong",
    ("long", "long"): "ctypes.c_longlong",
    ("unsigned", "long", "long"): "ctypes.c_ulonglong",
    ("float",): "ctypes.c_float",
    ("double",): "ctypes.c_double",
}

# Typedefs of the C library whose ctypes names say more than their resolution would.
LIBC_TYPEDEFS = {
    "int8_t": "ctypes.c_int8",
    "int16_t": "ctypes.c_int16",
    "int32_t": "ctypes.c_int32",
    "int64_t": "ctypes.c_int64",
    "uint8_t": "ctypes.c_uint8",
    "uint16_t": "ctypes.c_uint16",
    "uint32_t": "ctypes.c_uint32",
    "uint64_t": "ctypes.c_uint64",
    "size_t": "ctypes.c_size_t",
    "intptr_t": "ctypes.c_ssize_t",
    "uintptr_t": "ctypes.c_size_t",
}

# #define names with this prefix are the library's constants (others decorate declarations).
CONSTANT_PREFIX = "CUBLASLT_"

# The status type: functions returning it are checked by the loader.
STATUS_TYPE = "cublasStatus_t"

# Enums whose members are descriptor attributes; each member's doc comment states its value type.
ATTRIBUTE_ENUM = re.compile(r"^cublasLt\w*Attributes?_t$")

# Where a member's doc comment states its type in a way the reader does not understand, or
# states one the library disagrees with (tests/cpu/test_library_cpu.py compares every size with
# the library's), the type is given here: {member C name: C type}. Members missing from both
# fail generation.
ATTRIBUTE_TYPE_OVERRIDES: dict[str, str] = {
    # cuBLAS 13.10.0.20 documents these as uint32_t; the library reads and writes 8 bytes.
    "CUBLASLT_MATMUL_PREF_GROUPED_AVERAGE_REDUCTION_DIM": "uint64_t",
    "CUBLASLT_MATMUL_PREF_GROUPED_DESC_D_AVERAGE_ROWS": "uint64_t",
    "CUBLASLT_MATMUL_PREF_GROUPED_DESC_D_AVERAGE_COLS": "uint64_t",
}

# Enums whose members stopped sharing one prefix: members with this prefix lose it, so their
# Python names stay what earlier releases made them (13.10 added CUBLASLT_GROUPED_MATRIX_LAYOUT_*
# to the layout attributes; ORDER must stay ORDER). The others lose the prefix all share.
MEMBER_PREFIXES = {
    "cublasLtMatrixLayoutAttribute_t": "CUBLASLT_MATRIX_LAYOUT_",
}

# Version macros of cublas_api.h, in the order of the version tuple.
VERSION_MACROS = ("CUBLAS_VER_MAJOR", "CUBLAS_VER_MINOR", "CUBLAS_VER_PATCH", "CUBLAS_VER_BUILD")
