"""cuBLASLt's per-group arrays for a grouped GEMM, derived on the GPU from device-side offsets.

cuBLASLt's grouped mode reads every group's rows, columns, leading dimension and matrix pointer
from device arrays. The offsets that split the tokens are on the GPU too, and reading them on the
host would cost a synchronization per call (and break CUDA-graph capture). So one small kernel
(``_jit``) writes the arrays in stream order, right before the GEMM: one thread per group.

Offsets out of order or outside the operands are clamped, so no group reads or writes outside its
operand (the result is then wrong for those groups, never memory outside it), and flagged in a
status word that ``check`` reads at the cost of a synchronization.

In the weight-gradient form (ragged K) a group with no tokens still has a result, zeros. A second
kernel writes them after the GEMM, into those groups' matrices only: cuBLASLt is not relied on to
write a product over an empty K, and clearing the whole result first would cost a pass over it.
"""

from __future__ import annotations

import ctypes

from . import _cuda, _jit
from ._cuda import cudart
from ._errors import NvblasltStateError, NvblasltValueError
from ._grouped_problem import GroupedMatrix, GroupedProblem
from ._memory import DeviceBuffer

KERNEL = "nvblaslt_grouped_arrays"
ZERO_KERNEL = "nvblaslt_grouped_zero_empty"
SOURCE = _jit.ZERO_SPAN_SOURCE + r"""
struct Spec {  // one GroupedMatrix: extents, raggedness and strides in bytes (leading dimensions come per call)
    long long rows, cols, ld_unused, rows_ragged, cols_ragged, group_stride, ragged_stride, contiguous;
};

extern "C" __global__ void nvblaslt_grouped_arrays(
        const void* offs, int offs_64, int groups, long long total, const Spec* specs,
        unsigned long long base_a, unsigned long long base_b, unsigned long long base_d,
        long long ld_a, long long ld_b, long long ld_d,
        long long* shapes, unsigned long long* pointers, long long* sizes, int* status) {
    const int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= groups) return;
    long long start = 0, end = total;
    if (offs != nullptr) {
        const long long* o64 = static_cast<const long long*>(offs);
        const int* o32 = static_cast<const int*>(offs);
        end = offs_64 ? o64[g] : o32[g];
        start = g == 0 ? 0 : (offs_64 ? o64[g - 1] : o32[g - 1]);
        if (start < 0 || end < start || end > total) {
            atomicOr(status, 1);  // out of order or outside the operand: clamped below
        }
        if (g == groups - 1 && end != total) {
            atomicOr(status, 2);  // the operand goes on past the last group
        }
        start = start < 0 ? 0 : (start > total ? total : start);
        end = end < start ? start : (end > total ? total : end);
    }
    long long size = end - start;
    const unsigned long long bases[3] = {base_a, base_b, base_d};
    const long long lds[3] = {ld_a, ld_b, ld_d};
    for (int x = 0; x < 3; ++x) {  // a start along memory off 16 bytes: the group would be misaligned
        const Spec s = specs[x];
        if (s.contiguous && (start * s.ragged_stride) % 16 != 0) {
            atomicOr(status, 4);
            size = 0;  // emptied, at its group's aligned base: cuBLASLt never sees a misaligned matrix
            start = 0;
        }
    }
    sizes[g] = size;
    for (int x = 0; x < 3; ++x) {
        const Spec s = specs[x];
        const bool ragged = s.rows_ragged || s.cols_ragged;
        shapes[(3 * x + 0) * groups + g] = s.rows_ragged ? size : s.rows;
        shapes[(3 * x + 1) * groups + g] = s.cols_ragged ? size : s.cols;
        shapes[(3 * x + 2) * groups + g] = lds[x];
        pointers[x * groups + g] = bases[x] + g * s.group_stride + (ragged ? start * s.ragged_stride : 0);
    }
}

// Zeros in D for every group the derive kernel sized 0. Every thread of the grid takes part in each
// empty group in turn (a group's matrix is large, M x N; the others cost one read each): 16-byte
// stores over a dense matrix (zero_span, _jit's), element stores where columns are padded (ld > rows).
extern "C" __global__ void nvblaslt_grouped_zero_empty(
        int groups, int itemsize, const long long* shapes, const unsigned long long* pointers,
        const long long* sizes) {
    const long long thread = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long threads = (long long)gridDim.x * blockDim.x;
    for (int g = 0; g < groups; ++g) {
        if (sizes[g] != 0) continue;
        const long long rows = shapes[6 * groups + g], cols = shapes[7 * groups + g], ld = shapes[8 * groups + g];
        char* d = reinterpret_cast<char*>(pointers[2 * groups + g]);
        if (ld == rows || cols <= 1) {
            zero_span(d, rows * cols * itemsize, thread, threads);
            continue;
        }
        for (long long i = thread; i < rows * cols; i += threads) {  // column-major, columns padded to ld
            char* element = d + ((i / rows) * ld + i % rows) * itemsize;
            if (itemsize == 2) *reinterpret_cast<unsigned short*>(element) = 0;
            else if (itemsize == 4) *reinterpret_cast<unsigned int*>(element) = 0;
            else for (int byte = 0; byte < itemsize; ++byte) element[byte] = 0;
        }
    }
}
"""
_SPEC_WORDS = 8
_THREADS = 128
_ZERO_THREADS, _ZERO_MOST_BLOCKS = 256, 1024  # the grid zeroes one empty group after another, all of it at once
_ARGUMENT_TYPES = (_jit.POINTER, _jit.INT32, _jit.INT32, _jit.INT64, _jit.POINTER, _jit.INT64, _jit.INT64,
                   _jit.INT64, _jit.INT64, _jit.INT64, _jit.INT64, _jit.POINTER, _jit.POINTER, _jit.POINTER,
                   _jit.POINTER)
_PER_CALL = (0, 1, 3, 5, 6, 7, 8, 9, 10)  # the derive kernel's arguments that change between calls
_ZERO_ARGUMENT_TYPES = (_jit.INT32, _jit.INT32, _jit.POINTER, _jit.POINTER, _jit.POINTER)
STATUS_MESSAGES = {
    1: "offsets out of order, negative, or past the operand's extent (those groups were clamped into it)",
    2: "the last offset is not the operand's extent along the groups (what lies past it takes part in no group, "
       "and a result's rows there are left uninitialised)",
    4: "a group starts along the operands' contiguous extent off a multiple of 16 bytes (such groups were "
       "emptied: cuBLASLt's grouped kernels need aligned matrices)",
}


def _spec(matrix: GroupedMatrix) -> list[int]:
    size = matrix.dtype.itemsize
    return [matrix.rows, matrix.cols, matrix.ld, int(matrix.rows_ragged), int(matrix.cols_ragged),
            matrix.group_stride * size, matrix.ragged_stride * size, int(matrix.contiguous_ragged)]


class GroupedArrays:
    """The device arrays of one grouped plan: shapes (rows, cols, ld of A, B, D), pointers (A, B,
    D; C shares D's), the groups' sizes along the ragged extent, the matrices' specs and a status
    word. Made once per plan; every execute rewrites shapes, pointers and sizes on its stream."""

    def __init__(self, problem: GroupedProblem, device: int, stream: int):
        groups = problem.groups
        self.groups, self.device = groups, device
        self.kernel = _jit.kernel(SOURCE, KERNEL, device)
        self._zero: tuple[_jit.Kernel, _jit.Arguments] | None = None  # weight gradients' second kernel
        d = problem.d  # the result's extent per group, where no extent of it is ragged (the weight gradient)
        self.group_bytes = max(1, d.rows) * max(1, d.cols) * d.dtype.itemsize
        words = 13 * groups + 3 * _SPEC_WORDS + 1
        self.buffer = DeviceBuffer(8 * words, stream)
        base = self.buffer.pointer
        self.shapes = base
        self.pointers = base + 8 * 9 * groups
        self.sizes = base + 8 * 12 * groups
        self.specs = base + 8 * 13 * groups
        self.status = self.specs + 8 * 3 * _SPEC_WORDS
        values = _spec(problem.a) + _spec(problem.b) + _spec(problem.d) + [0]
        host = (ctypes.c_longlong * len(values))(*values)
        _cuda.check(cudart.cudaMemcpyAsync(self.specs, ctypes.addressof(host), ctypes.sizeof(host),
                                           cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync")
        _cuda.check(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")  # before `host` goes
        if problem.form == "2d2d":  # loaded with the plan: never inside a CUDA graph capture
            self._zero = (_jit.kernel(SOURCE, ZERO_KERNEL, device), _jit.Arguments(
                _ZERO_ARGUMENT_TYPES, (groups, problem.d.dtype.itemsize, self.shapes, self.pointers, self.sizes)))
        # per call: offsets, their width, the total, the three bases and leading dimensions (_PER_CALL)
        self._last_values: tuple = ()  # the per-call arguments the derive kernel's parameters hold
        self._derive_arguments = _jit.Arguments(_ARGUMENT_TYPES, (
            0, 0, groups, 0, self.specs, 0, 0, 0, 0, 0, 0, self.shapes, self.pointers, self.sizes, self.status))

    def array(self, matrix: int, field: int) -> int:
        """Device pointer of one shape array: ``matrix`` 0/1/2 for A/B/D, ``field`` 0/1/2 for rows/cols/ld."""
        return self.shapes + 8 * (3 * matrix + field) * self.groups

    def pointer_array(self, matrix: int) -> int:
        """Device pointer of A's (0), B's (1) or D's (2) array of per-group matrix pointers."""
        return self.pointers + 8 * matrix * self.groups

    def derive(self, offsets: int, offsets_64: bool, total: int, bases: tuple[int, int, int],
               lds: tuple[int, int, int], stream: int, *, check: bool = False) -> None:
        """Queue the kernel that writes shapes and pointers for these operands on ``stream``: ``bases``
        and ``lds`` are A's, B's and D's pointers and leading dimensions."""
        if check:
            _cuda.check(cudart.cudaMemsetAsync(self.status, 0, 4, stream), "cudaMemsetAsync")
        arguments = self._derive_arguments
        values = (offsets, int(offsets_64), total, *bases, *lds)
        last = self._last_values
        if values != last:  # a training loop passes the same arrays step after step
            if not last:
                last = (None,) * len(values)
            for index, value, held in zip(_PER_CALL, values, last):
                if value != held:  # most calls change a few pointers: the result's and the tokens'
                    arguments.set(index, value)
            self._last_values = values
        self.kernel.launch(self.device, (self.groups + _THREADS - 1) // _THREADS, _THREADS, stream, arguments)
        self.buffer.used_on(stream)
        if check:
            self.raise_on_status(stream, total)

    def zero_empty(self, itemsize: int, stream: int) -> None:
        """Queue the kernel that writes zeros into D for the groups ``derive`` sized 0 (after the GEMM)."""
        if self._zero is None:
            raise NvblasltStateError("zero_empty: only a weight gradient's arrays (ragged K) have the kernel")
        kernel, arguments = self._zero
        arguments.set(1, itemsize)
        # enough 16-byte stores for one group's matrix, up to a grid that fills the GPU
        blocks = min(_ZERO_MOST_BLOCKS, max(1, -(-self.group_bytes // (16 * _ZERO_THREADS))))
        kernel.launch(self.device, blocks, _ZERO_THREADS, stream, arguments)
        self.buffer.used_on(stream)

    def raise_on_status(self, stream: int, total: int) -> None:
        """Wait for ``stream`` and refuse offsets the kernel flagged (the debug check)."""
        value = ctypes.c_int(0)
        _cuda.check(cudart.cudaMemcpyAsync(ctypes.addressof(value), self.status, 4,
                                           cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync")
        _cuda.check(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        problems = [text for bit, text in STATUS_MESSAGES.items() if value.value & bit]
        if problems:
            raise NvblasltValueError(f"offs: {'; '.join(problems)} (the operand's extent along the groups is "
                                     f"{total})")

    def release(self) -> None:
        self.buffer.release()
