"""The normalizing step: any call -> one canonical cuBLASLt problem.

``Operands`` reads what the caller gave once (vectors promoted, batch dimensions collapsed
into one stride each, C's broadcast recognised, types settled). ``canonical(operands,
epilog)`` then fixes everything that depends on the epilog: the order of the result
(nvmath-python's rule: C's order, else the epilog's, else A's), whether to solve the
transposed problem Dᵀ = Bᵀ·Aᵀ + Cᵀ so that cuBLASLt always writes a column-major D, the
operation and storage order of each of A and B, and the user-facing shape of D. Nothing
after this module looks at the caller's shapes or strides again.

Everything here runs before any pointer reaches C; errors name the argument, what was given
and what was expected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import _types
from ._dtypes import DType
from ._epilogs import SPECS, MatmulEpilog, transposed_epilog
from ._errors import NvblasltUnsupportedError, NvblasltValueError
from ._pinned import cublasLtOrder_t, cublasOperation_t
from ._strides import batch_order, batch_stride, c_strides
from ._operands import Operand

OP_N, OP_T, OP_C = cublasOperation_t.N, cublasOperation_t.T, cublasOperation_t.C
COL, ROW = cublasLtOrder_t.COL, cublasLtOrder_t.ROW


@dataclass(slots=True)
class Matrix:
    """One operand as a (batch of) R×C matrix: element strides, collapsed batch stride."""

    op: Operand
    rows: int
    cols: int
    row_stride: int
    col_stride: int
    batch_shape: tuple[int, ...]
    batch_stride: int  # 0 when one matrix serves every batch

    def orders(self) -> dict[int, int]:
        """{order: leading dimension} for each storage order that describes this matrix."""
        r, c, sr, sc = self.rows, self.cols, self.row_stride, self.col_stride
        found: dict[int, int] = {}
        if (sr == 1 or r == 1) and (c == 1 or sc >= r):
            found[COL] = sc if c > 1 else max(r, 1)
        if (sc == 1 or c == 1) and (r == 1 or sr >= c):
            found[ROW] = sr if r > 1 else max(c, 1)
        return found

    def natural_order(self) -> int:
        """The order nvmath-python reads off the strides: unit row stride first."""
        if self.row_stride == 1 and (self.cols == 1 or self.col_stride >= self.rows):
            return COL
        if self.col_stride == 1 and (self.rows == 1 or self.row_stride >= self.cols):
            return ROW
        return COL if self.rows == 1 else ROW


@dataclass(frozen=True, slots=True)
class Layout:
    """What one ``cublasLtMatrixLayout_t`` says."""

    dtype: DType
    rows: int
    cols: int
    ld: int
    order: int
    batch_stride: int


@dataclass(frozen=True, slots=True)
class Side:
    """A or B of the canonical problem: its layout, operation, and whose memory it is."""

    layout: Layout
    op: int
    source: str  # "a" or "b": the caller's operand holding this memory


def _matrix(op: Operand, name: str, promote: str | None = None) -> Matrix:
    shape, strides = op.shape, op.strides
    if promote == "row":  # a 1-D A is a 1×K matrix (NumPy matmul)
        shape, strides = (1, shape[0]), (shape[0] * strides[0], strides[0])
    elif promote == "col":  # a 1-D B is a K×1 matrix
        shape, strides = (shape[0], 1), (strides[0], shape[0] * strides[0])
    if any(s < 0 for n, s in zip(shape, strides) if n > 1):
        raise NvblasltValueError(f"{name}: negative strides are not supported, got shape {op.shape} with element "
                                 f"strides {op.strides}")
    label = name.upper()  # nvmath-python's name for the operand: A, B, C
    matrix = Matrix(op, shape[-2], shape[-1], strides[-2], strides[-1], tuple(shape[:-2]),
                    batch_stride(shape[:-2], strides[:-2], name, label, of=f"operand {label}"))
    return matrix


def _check_batch_orders(a: Operand, b: Operand) -> None:
    """A and B with the same batch dimensions, refused as a pair where their batch axis orders differ
    or share one nvblaslt cannot walk (any other batch layout is refused by ``_matrix``, one by one)."""
    ab, bb = a.shape[:-2], b.shape[:-2]
    if not ab or ab != bb or any(s <= 0 for x in (a, b) for n, s in zip(x.shape[:-2], x.strides[:-2]) if n != 1):
        return  # nothing to pair, other batch dimensions, or broadcast / reversed axes
    oa, ob = batch_order(ab, a.strides[:-2]), batch_order(bb, b.strides[:-2])
    c_order = tuple(sorted(oa))
    given = f"a: shape {a.shape} with element strides {a.strides}, b: shape {b.shape} with element strides {b.strides}"
    if oa != ob:
        raise NvblasltValueError(f"a, b: The batch order of operands A {oa} and B {ob} (their batch axes by "
                                 f"decreasing stride) must match, and be C order {c_order}; got {given}")
    if oa != c_order:  # nvmath-python takes any order all operands share: nvblaslt, C order only
        raise NvblasltValueError(f"a, b: The batch order {oa} of operands A and B (their batch axes by decreasing "
                                 f"stride) is not supported: nvblaslt walks batches in C order {c_order} only; got "
                                 f"{given}")


def _check_extents(op: Operand, name: str) -> None:
    if 0 in op.shape:
        raise NvblasltValueError(f"{name}: The extents must be strictly positive (cuBLASLt has no empty matmul), "
                                 f"got shape {op.shape}")


class Operands:
    """A, B and C of one call, read and checked once; the epilog is not known yet."""

    def __init__(self, api, a: Operand, b: Operand, c: Operand | None, *, compute_type=None, scale_type=None,
                 result_type=None, inplace: bool = False, conjugate=(False, False)):
        if len(a.shape) < 1 or len(b.shape) < 1:
            which, op = ("a", a) if len(a.shape) < 1 else ("b", b)
            raise NvblasltValueError(f"{which}: expected at least 1 dimension, got shape {op.shape}")
        if c is not None and len(c.shape) < 2:
            raise NvblasltValueError(f"c: `c` must be at least 2-D. Expected (M, N), (M, 1) or batched, got shape "
                                     f"{c.shape}; add a dimension to make a column")
        if inplace and c is None:
            raise NvblasltValueError("options.inplace: the result is written into c, but no c was given")
        for name, given in (("a", a), ("b", b), ("c", c)):
            if given is not None:
                _check_extents(given, name)
        self.a_vector, self.b_vector = len(a.shape) == 1, len(b.shape) == 1
        _check_batch_orders(a, b)
        self.a = _matrix(a, "a", "row" if self.a_vector else None)
        self.b = _matrix(b, "b", "col" if self.b_vector else None)
        self.m, self.k = self.a.rows, self.a.cols
        if self.b.rows != self.k:
            raise NvblasltValueError(f"a, b: The 'K' extent must match for the operands: K={self.k} in operand A is "
                                     f"not equal to K={self.b.rows} in operand B (a: shape {a.shape}, b: shape "
                                     f"{b.shape})")
        self.n = self.b.cols
        ab, bb = self.a.batch_shape, self.b.batch_shape
        if ab and bb and ab != bb:
            raise NvblasltValueError(f"a, b: The batch dimensions of operands A {ab} and B {bb} must match (or one "
                                     f"operand must be a single matrix, which is broadcast)")
        self.batch_shape = ab or bb
        self.batch_count = math.prod(self.batch_shape) if self.batch_shape else 1
        self.inplace = inplace
        self.c: Matrix | None = None
        self.c_broadcast_columns = False
        if c is not None:
            self.c = _matrix(c, "c")
            mc, nc = self.c.rows, self.c.cols
            if mc != self.m or nc not in (self.n, 1) or (inplace and nc != self.n):
                want = f"({self.m}, {self.n})" if inplace else f"({self.m}, {self.n}) or ({self.m}, 1)"
                which = f"M dimension of the C matrix ({mc}) must match the M dimension of A ({self.m})" \
                    if mc != self.m else \
                    f"N dimension of the C matrix ({nc}) must match the N dimension of B ({self.n})"
                raise NvblasltValueError(f"c: The {which}. Expected shape (…, {want[1:-1]}) for a {self.m}×{self.k} @ "
                                         f"{self.k}×{self.n} product, got {c.shape}"
                                         + ("; in place, c must hold the whole result" if inplace else ""))
            if self.c.batch_shape and self.c.batch_shape != self.batch_shape:
                raise NvblasltValueError(f"c: The batch dimension of operand C {self.c.batch_shape} must match with "
                                         f"that of the other operands {self.batch_shape or '(none: single matrices)'}, "
                                         f"or be absent to use one c for every batch")
            if inplace and self.batch_shape and self.c.batch_shape != self.batch_shape:
                raise NvblasltValueError(f"c: in place, c must hold every batch {self.batch_shape}, got shape "
                                         f"{c.shape}")
            self.c_broadcast_columns = nc == 1 and self.n > 1
            if self.c_broadcast_columns and not (self.c.row_stride == 1 or self.m == 1):
                raise NvblasltValueError(f"c: a broadcast column (M, 1) must have unit element stride, got strides "
                                         f"{c.strides}")
            if not self.c_broadcast_columns and not self.c.orders():
                raise NvblasltValueError(f"c: Unsupported layout. Expected a row- or column-major matrix (one unit "
                                         f"stride, the other at least the extent), got shape {c.shape} with element "
                                         f"strides {c.strides}")
            if inplace and self.c.batch_stride == 0 and self.batch_count > 1:
                raise NvblasltValueError("c: in place, c cannot be broadcast over the batch")
        for name, matrix in (("a", self.a), ("b", self.b)):
            if not matrix.orders():
                raise NvblasltValueError(
                    f"{name}: Unsupported layout. Expected a row- or column-major matrix (one unit stride, the other "
                    f"at least the extent), got shape {matrix.op.shape} with element strides {matrix.op.strides}")
        self.types = _types.resolve(api, a.dtype, b.dtype, c.dtype if c is not None else None,
                                    compute_type=compute_type, scale_type=scale_type, result_type=result_type,
                                    inplace=inplace)
        complex_ = a.dtype.is_complex
        self.conjugate = (bool(conjugate[0]) and complex_, bool(conjugate[1]) and complex_)

    @property
    def c_order(self) -> int | None:
        if self.c is None:
            return None
        return COL if self.c_broadcast_columns else self.c.natural_order()

    def describe(self) -> str:
        batch = "×".join(map(str, self.batch_shape)) + "×" if self.batch_shape else ""
        t = self.types
        return f"{batch}({self.m}×{self.k} @ {self.k}×{self.n}, {t.a.name}→{t.d.name})"


# ---- the canonical problem ---------------------------------------------------------------------
def _side(matrix: Matrix, dtype: DType, transpose: bool, conjugate: bool, need_op: int | None, source: str,
          name: str, why: str) -> Side:
    """Describe op(S) = the logical operand (the caller's matrix U, transposed and/or conjugated)
    with a stored matrix S that is U or Uᵀ read in either order; prefer column-major storage."""
    options = []
    for order, ld in matrix.orders().items():
        flipped = ROW if order == COL else COL
        same = Layout(dtype, matrix.rows, matrix.cols, ld, order, matrix.batch_stride)  # S = U
        other = Layout(dtype, matrix.cols, matrix.rows, ld, flipped, matrix.batch_stride)  # S = Uᵀ, same memory
        if conjugate:  # op C is the conjugate transpose: Uᴴ from S = U, conj(U) from S = Uᵀ
            options.append((same, OP_C) if transpose else (other, OP_C))
        elif transpose:
            options += [(same, OP_T), (other, OP_N)]
        else:
            options += [(same, OP_N), (other, OP_T)]
    if need_op is not None:
        options = [(layout, op) for layout, op in options if op == need_op or (need_op == OP_T and op == OP_C)]
    if not options:
        raise NvblasltValueError(f"{name}: {why}; the given layout (strides {matrix.op.strides}) cannot be read "
                                 f"that way")
    # Prefer column-major storage (row-major only where nothing else describes the operand), then
    # column starts on 16-byte boundaries (a 1×K row stored with ld 1 has none, and cuBLASLt's kernels
    # refuse it at launch), then no transpose.
    options.sort(key=lambda item: (item[0].order != COL,
                                   (item[0].ld * dtype.itemsize) % 16 != 0 and item[0].cols > 1, item[1] != OP_N))
    layout, op = options[0]
    return Side(layout, op, source)


@dataclass(frozen=True, slots=True)
class Problem:
    """One cuBLASLt matmul: D (column-major, M×N) = epilog(alpha·op(A)·op(B) + beta·C)."""

    types: _types.Types
    m: int
    n: int
    k: int
    batch_count: int
    batch_shape: tuple[int, ...]
    transposed: bool  # the caller's D is row-major: cuBLASLt computes Dᵀ = Bᵀ·Aᵀ
    epilog: MatmulEpilog  # as cuBLASLt runs it (BGRADA and BGRADB trade places when transposed)
    a: Side
    b: Side
    c: Layout | None
    d: Layout
    inplace: bool
    result_shape: tuple[int, ...]  # the caller's D
    result_strides: tuple[int, ...]  # element strides of the caller's D

    @property
    def fp8(self) -> bool:
        return self.types.fp8

    def describe(self) -> str:
        batch = f"{self.batch_count}×" if self.batch_shape else ""
        t = "ᵀ" if self.transposed else ""
        return (f"{batch}({self.m}×{self.k} @ {self.k}×{self.n}{t}, {self.types.a.name}→{self.types.d.name}, "
                f"{self.epilog.name})")


def result_order(operands: Operands, epilog: MatmulEpilog) -> int:
    """nvmath-python's rule: C's order, else the order the epilog needs, else A's order."""
    c_order = operands.c_order
    if c_order is not None:
        return c_order
    if SPECS[epilog].needs_column_major:
        return COL
    return operands.a.natural_order()


def canonical(operands: Operands, epilog: MatmulEpilog) -> Problem:
    problem = _chosen(operands, epilog)
    rows = [side for side in (problem.a, problem.b) if side.layout.order != COL]
    if problem.fp8 and rows:  # refused here, before any GPU work, rather than by the heuristics
        names = " and ".join(side.source for side in rows)
        raise NvblasltValueError(f"{names}: fp8 matmuls need a row-major (C-order) a and a column-major (Fortran-order) "
                                 f"b (cuBLASLt's 'TN' layout); got a with strides {operands.a.op.strides}, b with "
                                 f"strides {operands.b.op.strides}")
    if problem.fp8:
        _check_fp8_sizes(operands)
    return problem


FP8_MULTIPLE = 16  # M, N and K of an fp8 matmul; its operands' pointers (bytes): nvmath-python's rule


def _check_fp8_sizes(operands: Operands) -> None:
    """nvmath-python's fp8 rules, checked before cuBLASLt would refuse (or not find) a kernel."""
    sizes = {"M": operands.m, "N": operands.n, "K": operands.k}
    odd = [f"{name}={size}" for name, size in sizes.items() if size % FP8_MULTIPLE]
    if odd:
        raise NvblasltValueError(f"a, b: the sizes of an fp8 matmul must be divisible by {FP8_MULTIPLE}; got "
                                 f"{', '.join(odd)} (M={operands.m}, N={operands.n}, K={operands.k})")
    for name, side in (("a", operands.a), ("b", operands.b)):
        if side.op.alignment < FP8_MULTIPLE:
            raise NvblasltValueError(f"{name}: fp8 operands should be aligned to {FP8_MULTIPLE} bytes; pointer "
                                     f"0x{side.op.ptr:x} is aligned to {side.op.alignment}")


def _chosen(operands: Operands, epilog: MatmulEpilog) -> Problem:
    spec = SPECS[epilog]
    order = result_order(operands, epilog)
    if order == ROW and spec.needs_column_major:
        c_strides_given = operands.c.op.strides if operands.c is not None else ()
        raise NvblasltUnsupportedError(f"c: {epilog.name} needs a column-major (Fortran-order) result, and the "
                                       f"result takes c's order; got a row-major c (strides {c_strides_given}); "
                                       f"pass c in column-major order")
    preferred = _variant(operands, epilog, transposed=order == ROW)
    fixed = operands.c is not None or spec.needs_column_major
    if not fixed and any(side.layout.order != COL for side in (preferred.a, preferred.b)):
        # Only cuBLASLt's row-major storage could give D in A's order (seen with conjugated operands, which
        # cuBLASLt then refuses): D in the other order is the same numbers, in layouts cuBLASLt runs.
        try:
            other = _variant(operands, epilog, transposed=order != ROW)
        except NvblasltValueError:
            return preferred
        if all(side.layout.order == COL for side in (other.a, other.b)):
            return other
    return preferred


def _variant(operands: Operands, epilog: MatmulEpilog, transposed: bool) -> Problem:
    t = operands.types
    m, n, k = operands.m, operands.n, operands.k
    cuda_epilog = transposed_epilog(epilog) if transposed else epilog
    order = ROW if transposed else COL
    conj_a, conj_b = operands.conjugate
    # constraints cuBLASLt puts on the operations (as nvmath-python observes them)
    need_a = OP_T if t.fp8 else (OP_N if cuda_epilog == MatmulEpilog.BGRADA else None)
    need_b = OP_N if t.fp8 else (OP_T if cuda_epilog == MatmulEpilog.BGRADB else None)
    why_a = "fp8 matmuls need A transposed (the 'TN' layout)" if t.fp8 else "BGRADA needs A untransposed"
    why_b = "fp8 matmuls need B untransposed" if t.fp8 else "BGRADB needs B transposed"
    if not transposed:
        a = _side(operands.a, t.a, False, conj_a, need_a, "a", "a", why_a)
        b = _side(operands.b, t.b, False, conj_b, need_b, "b", "b", why_b)
        rows, cols = m, n
    else:  # Dᵀ = Bᵀ·Aᵀ: cuBLASLt's A is the caller's B, transposed, and the other way round
        a = _side(operands.b, t.b, True, conj_b, need_a, "b", "b", why_a)
        b = _side(operands.a, t.a, True, conj_a, need_b, "a", "a", why_b)
        rows, cols = n, m
    batched = operands.batch_count > 1
    if operands.inplace:
        c_matrix = operands.c
        assert c_matrix is not None  # Operands refuses inplace without c
        ld = c_matrix.orders()[order]
        d = Layout(t.d, rows, cols, ld, COL, c_matrix.batch_stride if batched else 0)
        c = d
        result_shape, result_strides = c_matrix.op.shape, c_matrix.op.strides
    else:
        d = Layout(t.d, rows, cols, rows, COL, rows * cols if batched else 0)
        c = None
        if operands.c is not None:
            cm: Matrix = operands.c
            batch_stride = cm.batch_stride if batched else 0
            if operands.c_broadcast_columns:  # ld 0: every column reads the same (M, 1) vector
                c = Layout(t.c, rows, cols, 0, COL, batch_stride)
            else:
                c = Layout(t.c, rows, cols, cm.orders()[order], COL, batch_stride)
        matrix_strides = (rows, 1) if transposed else (1, rows)  # rows: the caller's N when transposed
        shape = [*operands.batch_shape, m, n]
        strides = [*c_strides(operands.batch_shape, m * n), *matrix_strides]
        if operands.b_vector:  # NumPy matmul: the promoted dimensions leave the result
            del shape[-1], strides[-1]
        if operands.a_vector:
            del shape[-2 if not operands.b_vector else -1], strides[-2 if not operands.b_vector else -1]
        result_shape, result_strides = tuple(shape), tuple(strides)
    return Problem(t, rows, cols, k, operands.batch_count, operands.batch_shape, transposed, cuda_epilog, a, b, c,
                   d, operands.inplace, result_shape, result_strides)


def unsupported_hint(problem, epilog, refused_known_bad: bool = False) -> str:
    """Why cuBLASLt has no algorithm for ``problem``, as far as it is known."""
    rows = [side.layout.order != COL for side in (problem.a, problem.b)]
    if any(rows) and any(side.op == OP_C for side in (problem.a, problem.b)):
        return ("conjugating a column-major operand needs cuBLASLt's row-major order (OP_C also transposes), "
                "which has no kernel here; conjugate a row-major A/B, or pass both in the same order")
    if refused_known_bad:
        return ("every algorithm cuBLASLt offers for this problem is one seen to give wrong results here "
                "(nvblaslt._known_bad), so nvblaslt refuses rather than return them")
    if problem.fp8:
        return "fp8 kernels need a row-major A and a column-major B (the 'TN' layout) and a supported result type"
    if epilog.name in ("BGRADA", "BGRADB"):
        return (f"{epilog.name} has kernels only for some layouts (on cuBLASLt 13.1: BGRADA with a column-major A, "
                f"BGRADB with a row-major B)")
    rows = [problem.a.layout.order, problem.b.layout.order]
    if any(o != COL for o in rows):
        return "this layout needed cuBLASLt's row-major order, which has no kernel here; pass column-major operands"
    return f"no algorithm for {problem.describe()} on this GPU"
