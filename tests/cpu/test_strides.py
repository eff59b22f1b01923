"""Strided-array arithmetic (``nvblaslt._strides``), checked against what NumPy lays out."""

from __future__ import annotations

import numpy as np
import pytest

from nvblaslt import NvblasltValueError, _operands
from nvblaslt._strides import batch_stride, c_strides, extent_bytes, overlaps, span_elements

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # NumPy before 2.0
    byte_bounds = np.byte_bounds


def element_strides(x: np.ndarray) -> tuple[int, ...]:
    return tuple(s // x.itemsize for s in x.strides)


BASE = np.zeros((6, 8, 10), dtype=np.float32)
VIEWS = {
    "dense": BASE,
    "fortran": np.asfortranarray(BASE),
    "padded rows": BASE[:, :, :7],
    "steps": BASE[::2, 1::3, ::2],
    "transposed": BASE.transpose(2, 0, 1),
    "broadcast": np.broadcast_to(BASE[:1, :, :1], (4, 8, 5)),
    "one element": BASE[2:3, 4:5, 6:7],
    "scalar": BASE[1, 2, 3, ...],
}


@pytest.mark.parametrize("name", VIEWS)
def test_the_span_is_what_numpy_touches(name):
    x = VIEWS[name]
    low, high = byte_bounds(x)
    assert span_elements(x.shape, element_strides(x)) * x.itemsize == high - low


@pytest.mark.parametrize("name", VIEWS)
def test_the_extent_of_an_operand_is_its_span_in_bytes(name):
    x = VIEWS[name]
    op = _operands.read(x, "a", 0)
    low, high = byte_bounds(x)
    assert op.ptr == low
    assert extent_bytes(op) == high - low


def test_an_empty_array_spans_nothing():
    assert span_elements((3, 0, 4), (0, 4, 1)) == 0
    assert extent_bytes(_operands.read(np.zeros((3, 0), np.float64), "a", 0)) == 0


@pytest.mark.parametrize("shape", [(), (5,), (2, 3), (4, 1, 3), (2, 0, 3)])
def test_c_strides_are_numpys_c_order(shape):
    x = np.empty(shape, dtype=np.float64)
    if 0 not in shape:  # NumPy's strides over an empty extent are its own choice
        assert c_strides(shape) == element_strides(x)
    assert c_strides(shape, 7) == tuple(7 * s for s in c_strides(shape))


def test_c_strides_step_over_empty_extents_as_if_they_were_one():
    assert c_strides((2, 0, 3)) == (3, 3, 1)


def test_batch_dimensions_walked_with_one_stride():
    x = np.zeros((2, 3, 4, 5), dtype=np.float32)
    assert batch_stride(x.shape[:-2], element_strides(x)[:-2], "a") == 20
    padded = np.zeros((2, 3, 4, 8), dtype=np.float32)[..., :5]  # matrices 32 elements apart
    assert batch_stride(padded.shape[:-2], element_strides(padded)[:-2], "a") == 32
    assert batch_stride((1, 4), (999, 7), "a") == 7  # extents of one add nothing
    assert batch_stride((), (), "a") == 0


def test_broadcast_batches_have_stride_zero():
    x = np.broadcast_to(np.zeros((4, 5), dtype=np.float32), (2, 3, 4, 5))
    assert batch_stride(x.shape[:-2], element_strides(x)[:-2], "c") == 0
    assert batch_stride((1, 1), (0, 20), "c") == 0


def test_batches_no_single_stride_walks_are_refused_by_name():
    x = np.zeros((3, 2, 4, 5), dtype=np.float32).transpose(1, 0, 2, 3)  # batch axes swapped
    with pytest.raises(NvblasltValueError, match=r"^b: The batch axis order of operand B \(1, 0\) .* must match "
                                                 r"with that of the other operands: nvblaslt walks every batch in C "
                                                 r"order \(0, 1\); got batch dimensions \(2, 3\) with element "
                                                 r"strides \(20, 40\)$"):
        batch_stride(x.shape[:-2], element_strides(x)[:-2], "b", "B", of="operand B")
    with pytest.raises(NvblasltValueError, match="must be positive"):
        batch_stride((3,), (-20,), "a")
    with pytest.raises(NvblasltValueError, match=r"^a: The batch layout for a corresponding to shape \(2, 3\) .* is "
                                                 r"currently not supported because it is not tileable: a batch axis is "
                                                 r"broadcast \(stride 0\) and another not"):
        batch_stride((2, 3), (0, 20), "a")  # broadcast outside, strided inside
    with pytest.raises(NvblasltValueError, match=r"^c: The batch layout for C corresponding to shape \(2, 2\) \(its "
                                                 r"batch dimensions\) with element strides \(45, 15\) is currently "
                                                 r"not supported because it is not tileable: one stride cannot walk "
                                                 r"it"):
        batch_stride((2, 2), (45, 15), "c", "C")  # C order, but a gap between the outer batches


def test_overlaps_reads_the_spans_of_two_views_of_one_buffer():
    buffer = np.zeros((4, 6), dtype=np.float64)

    def op(x):
        return _operands.read(x, "x", 0)
    assert not overlaps(op(buffer[:2]), op(buffer[2:]))  # adjacent halves
    assert overlaps(op(buffer[:3]), op(buffer[2:]))
    assert overlaps(op(buffer[2:]), op(buffer[:3]))
    assert overlaps(op(buffer[:, :3]), op(buffer[:, 3:]))  # interleaved rows: the spans cross
    assert not overlaps(op(buffer[0, :3]), op(buffer[0, 3:]))
    assert overlaps(op(buffer), op(buffer[3, 5:]))  # the last element
    assert not overlaps(op(buffer), op(np.zeros((4, 6))))
