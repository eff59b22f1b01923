"""Property-based: random bad calls with stand-in arrays over fake device pointers must all be
refused with an nvblaslt error before any pointer is used (a use would crash this process)."""

from __future__ import annotations

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from nvblaslt import MatmulEpilog, MatmulEpilogPreferences, MatmulOptions, NvblasltError, _operands  # noqa: E402
from nvblaslt._plan import Matmul  # noqa: E402
from nvblaslt._problem import canonical  # noqa: E402
from nvblaslt import _epilogs  # noqa: E402
from nvblaslt._epilogs import SPECS, as_epilog  # noqa: E402

from tests.fakes import FakeCAI, FakeDLPack  # noqa: E402

dims = st.integers(min_value=0, max_value=40)
dtypes = st.sampled_from(["float32", "float16", "bfloat16", "float64", "float8_e4m3fn", "int8"])


@st.composite
def plausible(draw):
    """Mostly well-formed matrices (so the checks past reading are reached), sometimes odd ones."""
    m, k = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    shape = (m, k) if draw(st.booleans()) else (draw(st.integers(1, 4)), m, k)
    dtype = draw(st.sampled_from(["float32", "float32", "float16", "bfloat16", "int8"]))
    array = FakeDLPack(shape, dtype=dtype, ptr=draw(st.sampled_from([0x7F0000000000, 0x7F0000000008])))
    return array.T if len(shape) == 2 and draw(st.booleans()) else array


@st.composite
def arrays(draw):
    if draw(st.integers(0, 9)) < 6:
        return draw(plausible())
    ndim = draw(st.integers(min_value=0, max_value=4))
    shape = tuple(draw(dims) for _ in range(ndim))
    strides = tuple(draw(st.integers(min_value=-4, max_value=64)) for _ in range(ndim))
    ptr = draw(st.sampled_from([0x7F0000000000, 0x7F0000000002, 0x7F0000000100]))
    device_type = draw(st.sampled_from([2, 2, 2, 1, 3]))
    return FakeDLPack(shape, strides, draw(dtypes), ptr, device_type=device_type)


operands = st.one_of(arrays(), st.none(), st.just([[1.0]]), st.integers(), st.just(FakeCAI((2, 2), mask=1)))


def _plan_without_gpu(a, b, c, epilog, inputs, alpha, beta, compute_type):
    """Everything the function form checks, up to (not including) the first call into cuBLASLt
    that needs a device: reading, problem checks, epilog-input checks."""
    read = lambda x, n: _operands.read(x, n, 0) if x is not None else None  # noqa: E731
    a_op, b_op = _operands.read(a, "a", 0), _operands.read(b, "b", 0)
    plan = Matmul._from_operands(a_op, b_op, read(c, "c"), stream=0, alpha=alpha, beta=beta,
                                options=MatmulOptions(compute_type=compute_type))
    epilog = as_epilog(epilog)
    plan._problem = canonical(plan._problem_operands, epilog)
    given, scale = _epilogs.split_aux_scale(inputs)
    aux_dtype = _epilogs.aux_output_type(SPECS[epilog], plan._problem.types, MatmulEpilogPreferences(), scale, {})
    keys = _epilogs.input_keys(epilog, given, plan._problem)
    read_inputs = {key: _operands.read(given[key], f"epilog_inputs['{key}']", 0) for key in keys}
    _epilogs.prepare(epilog, plan._problem, read_inputs, aux_dtype, False)
    return plan


@settings(max_examples=400, deadline=None)
@given(a=operands, b=operands, c=st.one_of(st.none(), arrays()),
       epilog=st.one_of(st.sampled_from(list(MatmulEpilog)), st.sampled_from(["RELU", "nope", 3, 99, None, 1.5])),
       inputs=st.one_of(st.none(), st.dictionaries(st.sampled_from(["bias", "relu_aux", "gelu_aux", "x"]), arrays(),
                                                   max_size=2), st.just([1])),
       alpha=st.one_of(st.floats(allow_nan=False), st.just("2"), st.none()),
       beta=st.one_of(st.none(), st.floats(allow_nan=False), st.just(object())),
       compute_type=st.sampled_from([None, "tf32", "float64", "bad"]))
def test_bad_calls_are_refused_before_any_pointer_is_used(a, b, c, epilog, inputs, alpha, beta, compute_type):
    try:
        _plan_without_gpu(a, b, c, epilog, inputs, alpha, beta, compute_type)
    except NvblasltError as error:
        assert str(error)  # every refusal says something
        hypothesis.event("refused")
    else:
        hypothesis.event("accepted")  # a valid problem: it would go on to planning (tested on the GPU)


def test_the_property_reaches_accepted_calls_too():
    """Guard against a generator that only ever makes hopeless calls."""
    a, b = FakeDLPack((8, 4)), FakeDLPack((4, 6))
    plan = _plan_without_gpu(a, b, None, MatmulEpilog.RELU_BIAS, {"bias": FakeDLPack((8,))}, 1.0, None, None)
    assert plan._problem.m == 8 and plan._problem.n == 6
