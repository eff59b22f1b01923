"""What a grouped GEMM computes, checked and laid out for cuBLASLt's grouped mode (no GPU needed).

The semantics are ``torch._grouped_mm``'s. Groups split one operand along a ragged extent at the
cumulative ends ``offs`` (a device array: sizes are never read on the host):

=========  =====================  =======================  ==================  ==========
form       a                      b                        out                 ragged
=========  =====================  =======================  ==================  ==========
``2d3d``   (ΣM, K)                (G, K, N)                (ΣM, N)             M
``3d2d``   (G, M, K)              (K, ΣN)                  (M, ΣN)             N
``2d2d``   (M, ΣK)                (ΣK, N)                  (G, M, N)           K
``3d3d``   (G, M, K)              (G, K, N)                (G, M, N)           none
=========  =====================  =======================  ==================  ==========

cuBLASLt is column-major: ``out_g = a_g · b_g`` runs as ``out_gᵀ = b_gᵀ · a_gᵀ``, so cuBLASLt's A
is the caller's b, its B the caller's a, and D the row-major result. Every group's matrix is
described by a ``GroupedMatrix``: extents that are constant or the group's ragged size, and
where the group starts. ``_grouped_arrays`` turns that and ``offs`` into cuBLASLt's per-group
arrays on the GPU; ``reference_arrays`` here does the same on the host, for tests.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from . import _dtypes
from ._dtypes import DType
from ._errors import NvblasltTypeError, NvblasltUnsupportedError, NvblasltValueError, argument_error

FORMS = {(2, 3): "2d3d", (3, 2): "3d2d", (2, 2): "2d2d", (3, 3): "3d3d"}
RAGGED = {"2d3d": "M", "3d2d": "N", "2d2d": "K", "3d3d": None}
# fp8 runs on Hopper with cuBLASLt 13.8 where K is contiguous in both operands: E4M3 × E4M3, and E5M2 (a
# gradient's format) with E4M3 either way; E5M2 × E5M2 has no kernel (tools/probe_grouped_fp8.py)
FP8_TYPES = (_dtypes.FLOAT8_E4M3, _dtypes.FLOAT8_E5M2)
INPUT_TYPES = (_dtypes.BFLOAT16, _dtypes.FLOAT16, *FP8_TYPES)
FP8_RESULT_TYPES = (_dtypes.BFLOAT16, _dtypes.FLOAT16, _dtypes.FLOAT32)  # the first the default
OFFSET_TYPES = (_dtypes.INT32, _dtypes.INT64)


@dataclass(frozen=True)
class GroupedMatrix:
    """One of cuBLASLt's A, B, D for every group, stored column-major: ``rows`` × ``cols`` with
    leading dimension ``ld`` (elements), either extent the group's ragged size where flagged.
    Group g starts ``g * group_stride + start_g * ragged_stride`` elements after the base pointer,
    ``start_g`` being the ragged extent's cumulative start (``offs[g-1]``, 0 for the first)."""

    rows: int
    cols: int
    ld: int
    rows_ragged: bool
    cols_ragged: bool
    group_stride: int
    ragged_stride: int
    dtype: DType
    alignment: int  # bytes every group's pointer and leading dimension are a multiple of, at most 256

    @property
    def contiguous_ragged(self) -> bool:
        """The ragged extent runs along memory: groups start wherever the offsets say, so the plan
        assumes (and the kernel checks) that every boundary is a multiple of ``BOUNDARY_BYTES``."""
        return (self.rows_ragged or self.cols_ragged) and self.ragged_stride == 1

    def extents(self, size: int) -> tuple[int, int]:
        """(rows, cols) of a group whose ragged extent is ``size``."""
        return (size if self.rows_ragged else self.rows), (size if self.cols_ragged else self.cols)

    def offset(self, group: int, start: int) -> int:
        """Elements from the base pointer to the group's first element."""
        ragged = self.rows_ragged or self.cols_ragged
        return group * self.group_stride + (start * self.ragged_stride if ragged else 0)


@dataclass(frozen=True)
class GroupedProblem:
    form: str
    groups: int
    total: int  # the ragged extent's size in the operands (ΣM, ΣN or ΣK); the common one where none is ragged
    transa: bool  # cuBLASLt's A (the caller's b) enters transposed
    transb: bool  # cuBLASLt's B (the caller's a) enters transposed
    a: GroupedMatrix  # cuBLASLt's A: the caller's b
    b: GroupedMatrix  # cuBLASLt's B: the caller's a
    d: GroupedMatrix  # the result
    out_shape: tuple[int, ...]
    out_strides: tuple[int, ...]
    average: tuple[int, int, int]  # (K, D rows, D cols) per group on average: the heuristics' only view of shapes

    @property
    def fp8(self) -> bool:
        """Whether the operands are fp8 (per-tensor scales then apply)."""
        return self.a.dtype in FP8_TYPES

    @property
    def ragged(self) -> str | None:
        return RAGGED[self.form]

    @property
    def key(self) -> tuple:
        """What a plan depends on: everything but the ragged total and the leading dimensions, which
        no descriptor holds (the kernel writes them per call; their alignment is in the key)."""
        return (self.form, self.groups, self.transa, self.transb,
                *(dataclasses.replace(m, ld=0) for m in (self.a, self.b, self.d)))


def pointer_alignment(pointer: int) -> int:
    """The largest power of two up to 256 dividing ``pointer``, in bytes."""
    return min(256, pointer & -pointer) if pointer else 256


# Where the ragged extent runs along memory, groups are taken to start on multiples of this many bytes
# (PyTorch's precondition for its grouped GEMM too): cuBLASLt's grouped kernels need 16-byte aligned
# matrices. The kernel checks it on the GPU and empties a group that breaks it.
BOUNDARY_BYTES = 16


def _alignment(pointer: int, itemsize: int, *strides: int) -> int:
    """The largest power of two up to 256 dividing the pointer and every stride, in bytes."""
    value = pointer_alignment(pointer)
    for stride in strides:
        if stride:
            value = math.gcd(value, stride * itemsize)
    return value


def _orientation(name: str, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[bool, int]:
    """(row-major, leading dimension) of one group's ``shape`` matrix with element ``strides``."""
    rows, cols = shape
    s0, s1 = strides
    # One contiguous column (or row) is either order. Its other stride is the lead where it is one (at least
    # the extent); where it is not (a (K, 1) weight's strides are (1, 1)), the lead is never stepped over and
    # may be any value from the extent up: the extent rounded up to 16 bytes. (Taken row-major, such a
    # column has a lead of 1 element, for which cuBLASLt has no kernel.)
    per_boundary = max(1, BOUNDARY_BYTES // itemsize)
    if cols == 1 < rows and s0 == 1:
        return False, s1 if s1 >= rows else -(-rows // per_boundary) * per_boundary
    if rows == 1 < cols and s1 == 1:
        return True, s0 if s0 >= cols else -(-cols // per_boundary) * per_boundary
    if cols <= 1:
        s1 = 1  # a column: any stride across the one column is as good as 1
    if s1 == 1 and s0 >= max(cols, 1):
        return True, s0
    if rows <= 1:
        s0 = 1
    if s0 == 1 and s1 >= max(rows, 1):
        return False, s1
    if cols <= 1 and rows <= 1:
        return True, 1
    raise NvblasltValueError(
        f"{name}: expected each group's matrix row- or column-major (one of its last two strides 1, the other "
        f"at least that extent), got strides {strides} for extents {shape}; copy it contiguous first")


def _operand_matrix(name: str, shape: tuple[int, ...], strides: tuple[int, ...], *, ragged: str | None,
                    group_stride: int, pointer: int, dtype: DType) -> tuple[GroupedMatrix, bool]:
    """cuBLASLt's column-major view of the transpose of the caller's (R × C) group matrix, and whether
    cuBLASLt must transpose it back. ``ragged`` is "rows", "cols" or None: which of R, C varies."""
    row_major, ld = _orientation(name, shape, strides, dtype.itemsize)
    rows, cols = shape
    ragged_stride = {"rows": strides[0], "cols": strides[1], None: 0}[ragged]
    if ragged == "rows" and rows <= 1:
        ragged_stride = ld if row_major else 1
    if ragged == "cols" and cols <= 1:
        ragged_stride = 1 if row_major else ld
    boundary = ragged_stride if ragged_stride != 1 else max(1, BOUNDARY_BYTES // dtype.itemsize)
    alignment = _alignment(pointer, dtype.itemsize, ld, group_stride, boundary)
    # a ragged extent's size comes from the offsets: the total is no part of the layout (nor of a plan)
    rows, cols = (0 if ragged == "rows" else rows), (0 if ragged == "cols" else cols)
    if row_major:  # the memory already holds Xᵀ column-major: (C × R), lead ld
        matrix = GroupedMatrix(cols, rows, ld, ragged == "cols", ragged == "rows", group_stride, ragged_stride,
                               dtype, alignment)
        return matrix, False
    matrix = GroupedMatrix(rows, cols, ld, ragged == "rows", ragged == "cols", group_stride, ragged_stride,
                           dtype, alignment)
    return matrix, True


def _check_dtype(name: str, dtype: DType) -> None:
    if dtype not in INPUT_TYPES:
        raise NvblasltUnsupportedError(
            f"{name}: grouped GEMM runs bfloat16, float16, float8_e4m3fn and float8_e5m2 operands, got {dtype.name}")


def _check_pair(a: DType, b: DType) -> None:
    """The same dtype for both, but for fp8: E4M3 and E5M2 in either operand, not E5M2 in both."""
    if a in FP8_TYPES and b in FP8_TYPES:
        if a == b == _dtypes.FLOAT8_E5M2:
            raise NvblasltUnsupportedError("a, b: cuBLASLt has no fp8 kernel for float8_e5m2 × float8_e5m2; make "
                                           "one of them float8_e4m3fn")
    elif a != b:
        raise NvblasltTypeError(f"b: expected the dtype of a ({a.name}), got {b.name}")


def describe(a, b, offs, *, out_dtype: DType | None = None, out_pointer: int = 256) -> GroupedProblem:
    """The grouped problem ``a`` × ``b`` split at ``offs`` (Operands, ``offs`` None for 3-D × 3-D);
    ``out_pointer`` is where the result will live (its alignment enters cuBLASLt's preference)."""
    form = FORMS.get((len(a.shape), len(b.shape)))
    if form is None:
        raise NvblasltValueError(
            f"a, b: expected 2-D or 3-D operands (2-D × 3-D, 3-D × 2-D, 2-D × 2-D or 3-D × 3-D), got a of "
            f"{len(a.shape)} and b of {len(b.shape)} dimensions")
    _check_dtype("a", a.dtype)
    _check_dtype("b", b.dtype)
    _check_pair(a.dtype, b.dtype)
    if a.dtype in FP8_TYPES:
        out_dtype = out_dtype or FP8_RESULT_TYPES[0]
        if out_dtype not in FP8_RESULT_TYPES:
            raise NvblasltUnsupportedError(f"out_dtype: expected bfloat16 (the default for fp8 operands), float16 or "
                                           f"float32, got {out_dtype.name}")
    else:
        out_dtype = out_dtype or a.dtype
        if out_dtype not in (a.dtype, _dtypes.FLOAT32):
            raise NvblasltUnsupportedError(
                f"out_dtype: expected {a.dtype.name} (the operands' dtype) or float32, got {out_dtype.name}")
    k_a, k_b = a.shape[-1], b.shape[-2]
    if k_a != k_b:
        raise NvblasltValueError(f"b: expected {k_a} rows (a's last extent) per group, got b of shape {b.shape}")

    out_shape: tuple[int, ...]
    if form == "2d3d":
        groups, n = b.shape[0], b.shape[2]
        total, m = a.shape[0], a.shape[0]
        out_shape = (total, n)
    elif form == "3d2d":
        groups, m = a.shape[0], a.shape[1]
        total, n = b.shape[1], b.shape[1]
        out_shape = (m, total)
    elif form == "2d2d":
        groups, m, n = (offs.shape[0] if offs is not None else 0), a.shape[0], b.shape[1]
        total = k_a
        out_shape = (groups, m, n)
    else:
        if a.shape[0] != b.shape[0]:
            raise NvblasltValueError(f"b: expected {a.shape[0]} groups (a's first extent), got b of shape {b.shape}")
        groups, m, n, total = a.shape[0], a.shape[1], b.shape[2], k_a
        out_shape = (groups, m, n)
    _check_offsets(form, offs, groups)
    if groups < 1:
        raise NvblasltValueError(f"a, b: expected at least one group, got {groups}")

    out_strides = padded_strides(out_shape, out_dtype.itemsize)
    ragged = RAGGED[form]
    a_group = a.strides[0] if len(a.shape) == 3 else 0
    b_group = b.strides[0] if len(b.shape) == 3 else 0
    d_group = out_strides[0] if len(out_shape) == 3 else 0
    # the caller's per-group matrices: a_g (R × K-ish), b_g, out_g; which extent of each is ragged
    a_ragged = {"M": "rows", "K": "cols"}.get(ragged or "")
    b_ragged = {"N": "cols", "K": "rows"}.get(ragged or "")
    d_ragged = {"M": "rows", "N": "cols"}.get(ragged or "")
    cublas_b, transb = _operand_matrix("a", a.shape[-2:], a.strides[-2:], ragged=a_ragged, group_stride=a_group,
                                       pointer=a.ptr, dtype=a.dtype)
    cublas_a, transa = _operand_matrix("b", b.shape[-2:], b.strides[-2:], ragged=b_ragged, group_stride=b_group,
                                       pointer=b.ptr, dtype=b.dtype)
    cublas_d, _ = _operand_matrix("out", out_shape[-2:], out_strides[-2:], ragged=d_ragged, group_stride=d_group,
                                  pointer=out_pointer, dtype=out_dtype)
    per_group = {"M": (k_a, n, max(1, m // groups)), "N": (k_a, max(1, n // groups), m),
                 "K": (max(1, k_a // groups), n, m), None: (k_a, n, m)}[ragged]
    return GroupedProblem(form, groups, total, transa, transb, cublas_a, cublas_b, cublas_d, out_shape, out_strides,
                          per_group)


def padded_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """Row-major element strides for a result, each row starting on a ``BOUNDARY_BYTES`` boundary
    (as PyTorch pads its grouped GEMM's result), so that every group's matrix is aligned."""
    per_row = max(1, BOUNDARY_BYTES // itemsize)
    row = -(-shape[-1] // per_row) * per_row if shape[-1] > 0 else 1
    strides = [1, row]
    for extent in reversed(shape[1:-1]):
        strides.append(strides[-1] * extent)
    return tuple(reversed(strides))[-len(shape):]


def _check_offsets(form: str, offs, groups: int) -> None:
    if form == "3d3d":
        if offs is not None:
            raise NvblasltValueError("offs: expected None for 3-D × 3-D operands (every group is the same size), "
                                     f"got an array of shape {offs.shape}")
        return
    if offs is None:
        raise NvblasltValueError(f"offs: expected the groups' cumulative ends along {RAGGED[form]} (a 1-D int32 "
                                 f"array on the GPU) for {form[0]}-D × {form[2]}-D operands, got None")
    if offs.dtype not in OFFSET_TYPES:
        raise argument_error(NvblasltTypeError, "offs", f"dtype {offs.dtype.name}", "int32 or int64")
    if len(offs.shape) != 1 or offs.shape[0] != groups:
        raise NvblasltValueError(f"offs: expected shape ({groups},) (one end per group), got {offs.shape}")


def group_bounds(offsets, groups: int, total: int) -> list[tuple[int, int, bool]]:
    """(start, size, in order) per group, as the GPU derives them: bad offsets are clamped into
    [0, total] so no group reaches outside the operands, and flagged."""
    bounds = []
    for g in range(groups):
        start = 0 if offsets is None or g == 0 else int(offsets[g - 1])
        end = total if offsets is None else int(offsets[g])
        good = 0 <= start <= end <= total
        start = min(max(start, 0), total)
        end = min(max(end, start), total)
        bounds.append((start, end - start, good))
    return bounds


def reference_arrays(problem: GroupedProblem, offsets) -> dict[str, list[tuple[int, int, int, int]]]:
    """{"a"|"b"|"d": [(rows, cols, ld, element offset) per group]}: what the GPU writes, on the host."""
    arrays: dict[str, list[tuple[int, int, int, int]]] = {"a": [], "b": [], "d": []}
    if problem.form == "3d3d":
        offsets = None
    for g, (start, size, _) in enumerate(group_bounds(offsets, problem.groups, problem.total)):
        for name in arrays:
            matrix = getattr(problem, name)
            step = matrix.ragged_stride * matrix.dtype.itemsize
            if matrix.contiguous_ragged and start * step % BOUNDARY_BYTES:
                start, size = 0, 0  # the kernel empties a group it could not align, at its group's base
        for name in arrays:
            matrix = getattr(problem, name)
            rows, cols = matrix.extents(size)
            arrays[name].append((rows, cols, matrix.ld, matrix.offset(g, start)))
    return arrays
