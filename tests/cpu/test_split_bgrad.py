"""Which bias-gradient plans have a two-call form (``_split_bgrad.splittable``), without a GPU: the real
libcublasLt reads the operands: the first call must write D where the fused plan does, and a summed operand
must be one the GEMV can sum per batch."""

from __future__ import annotations

import pytest

import nvblaslt
from nvblaslt import _operands
from nvblaslt._epilogs import MatmulEpilog as E
from nvblaslt._problem import Operands, canonical
from nvblaslt._split_bgrad import splittable
from tests.fakes import FakeDLPack, fortran


def verdict(epilog, a, b, c=None, **options) -> bool:
    read = {name: _operands.read(x, name, 0) if x is not None else None for name, x in (("a", a), ("b", b), ("c", c))}
    problem_operands = Operands(nvblaslt.library().api, read["a"], read["b"], read["c"], **options)
    return splittable(epilog, read, canonical(problem_operands, epilog), problem_operands)


def test_bgradb_splits_where_the_plain_gemm_writes_d_as_the_fused_plan_does():
    # xᵀ (a column-major view) @ dz, as nvblaslt.torch's weight gradient: both write a column-major D
    assert verdict(E.BGRADB, fortran((64, 96), "bfloat16"), FakeDLPack((96, 80), dtype="bfloat16"))
    # a row-major A: the plain GEMM would write D row-major, the fused BGRADB column-major
    assert not verdict(E.BGRADB, FakeDLPack((64, 96), dtype="bfloat16"), FakeDLPack((96, 80), dtype="bfloat16"))


def test_a_summed_operand_broadcast_over_the_batch_has_no_split_form():
    """The fused kernel writes one bias gradient per batch; a GEMV over a shared B would write one."""
    a = fortran((3, 64, 96), "float16")
    assert verdict(E.BGRADB, a, FakeDLPack((3, 96, 80), dtype="float16"))
    assert not verdict(E.BGRADB, a, FakeDLPack((96, 80), dtype="float16"))


@pytest.mark.parametrize("epilog", [E.DRELU_BGRAD, E.DGELU_BGRAD])
def test_the_masking_epilogs_split_over_d(epilog):
    assert verdict(epilog, fortran((64, 96), "float16"), FakeDLPack((96, 80), dtype="float16"))


def test_epilogs_without_a_bias_gradient_have_no_split_form():
    assert not verdict(E.BIAS, fortran((64, 96), "float16"), FakeDLPack((96, 80), dtype="float16"))
    assert not verdict(E.DEFAULT, fortran((64, 96), "float16"), FakeDLPack((96, 80), dtype="float16"))
