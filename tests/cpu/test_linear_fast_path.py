"""linear()'s fast path without a GPU: a call like one already checked skips the checks its key proves,
and nothing else. Calls without a gradient run stand-in bound GEMMs on CPU tensors read as CUDA ones
(they record each launch's pointers, no math); calls with one run the ops' CPU math, compared with torch's.
The math of the bound path runs on the GPU (tests/gpu/test_torch_gpu.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from nvblaslt import NvblasltTypeError, NvblasltValueError  # noqa: E402
from nvblaslt.torch import _bound, _functional, _ops, _pointwise, autotune, linear  # noqa: E402

F64 = torch.float64


def aligned(*shape, dtype=torch.float32):
    """A tensor at a 256-byte aligned address (CPU allocations are 64-byte aligned), random values."""
    count = 1
    for extent in shape:
        count *= extent
    buffer = torch.empty(count + 256, dtype=dtype)
    start = (-buffer.data_ptr() % 256) // buffer.element_size()
    return buffer[start:start + count].view(*shape).normal_()


class _Cuda:  # what x.device says of a CUDA tensor
    type, index = "cuda", 0


class Recorder:
    """Counts the checked path's calls and records the stand-in GEMMs' launches."""

    def __init__(self):
        self.checked = 0
        self.launches: list[tuple] = []


@pytest.fixture
def seen(monkeypatch):
    """CPU tensors taken as CUDA ones by the bound path, stand-in GEMMs, and the checked path counted."""
    found = Recorder()

    class StandInGemm:
        def __init__(self, epilog, attributes):
            self.epilog, self.attributes = epilog, tuple(attributes)

        def __call__(self, a, b, d, stream, *pointers):
            assert len(pointers) == len(self.attributes)
            found.launches.append((self.epilog.name, a, b, d, pointers))

    monkeypatch.setattr(_bound, "bind", lambda a, b, epilog, inputs, stream, result, attributes=():
                        StandInGemm(epilog, attributes))
    monkeypatch.setattr(_pointwise, "_raw_stream", lambda device: 0)
    monkeypatch.setattr(_pointwise, "_current_stream", lambda device: 0)
    monkeypatch.setattr(_pointwise, "_capturing", lambda: False)
    monkeypatch.setattr(_pointwise, "_several_devices", lambda: False)
    monkeypatch.setattr(_pointwise, "_several", False)
    monkeypatch.setattr(_bound._cuda, "is_capturing", lambda stream: False)
    monkeypatch.setattr(_ops, "uses_cublaslt", lambda x: True)
    inference = _pointwise.linear_inference
    monkeypatch.setattr(_functional, "linear_inference",
                        lambda key, x, weight, bias, device: inference(key, x, weight, bias, _Cuda))
    check = _functional._check

    def counted(x, weight, bias):
        found.checked += 1
        return check(x, weight, bias)
    monkeypatch.setattr(_functional, "_check", counted)
    _bound.clear()
    yield found
    _bound.clear()


@pytest.mark.parametrize("lead", [(16,), (2, 8), ()], ids=["2-D", "3-D", "1-D"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_a_like_call_skips_the_checks_and_launches_on_its_own_pointers(seen, lead, bias):
    weight, b = aligned(32, 64), aligned(32) if bias else None
    for call in range(3):
        x = aligned(*lead, 64)
        out = linear(x, weight, b, "relu")
        assert out.shape == (*lead, 32) and out.is_contiguous()
        assert seen.checked == 1  # the first call only
        epilog, first, second, d, vectors = seen.launches[-1]
        assert len(seen.launches) == call + 1
        # with a bias, D = W Xᵀ (A is the weight); without one, D = X Wᵀ
        assert (epilog, first, second) == (("RELU_BIAS", weight.data_ptr(), x.data_ptr()) if bias else
                                           ("RELU", x.data_ptr(), weight.data_ptr()))
        assert d == out.data_ptr() and vectors == ((b.data_ptr(),) if bias else ())


@pytest.mark.parametrize("change", ["bias dtype", "bias shape", "weight dtype", "x features", "activation",
                                    "non-contiguous x", "non-contiguous weight", "subclass", "batch_invariant",
                                    "autocast"])
def test_a_call_unlike_the_checked_one_is_checked_again(seen, change, monkeypatch):
    x, weight, bias = aligned(16, 64), aligned(32, 64), aligned(32)
    linear(x, weight, bias, "relu")
    linear(x, weight, bias, "relu")
    assert seen.checked == 1
    activation, expected = "relu", None
    if change == "bias dtype":
        bias, expected = aligned(32, dtype=F64), NvblasltTypeError
    elif change == "bias shape":
        bias, expected = aligned(31), NvblasltValueError
    elif change == "weight dtype":
        weight, expected = aligned(32, 64, dtype=F64), NvblasltTypeError
    elif change == "x features":
        x, expected = aligned(16, 63), NvblasltValueError
    elif change == "activation":
        activation, expected = "gelu_erf", NvblasltValueError
    elif change == "non-contiguous x":
        x = aligned(64, 16).T
    elif change == "non-contiguous weight":
        weight = aligned(64, 32).T
    elif change == "subclass":
        class Sub(torch.Tensor):
            pass
        x = x.as_subclass(Sub)
    if expected is not None:
        with pytest.raises(expected):
            linear(x, weight, bias, activation)
    elif change == "batch_invariant":
        with pytest.raises(NvblasltTypeError, match="batch_invariant"):
            linear(x, weight, bias, activation, batch_invariant=1)
    else:  # the layouts a bound step cannot take (a copy of x is not 256-byte aligned on the CPU) go to matmul()
        monkeypatch.setattr(_ops, "forward_inference", lambda x, weight, bias, activation, cuda:
                            torch.relu(torch.nn.functional.linear(x, weight, bias)))
        monkeypatch.setattr(_ops, "forward_cuda", _ops.forward_composite)  # a subclass's: the op's
        launched = len(seen.launches)
        if change == "autocast":  # the inputs cast to bfloat16, as nn.Linear's are
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = linear(x, weight, bias, activation)
            assert out.dtype == torch.bfloat16
        else:
            out = linear(x, weight, bias, activation)
            torch.testing.assert_close(out, torch.relu(torch.nn.functional.linear(x, weight, bias)))
        assert len(seen.launches) == launched
    assert seen.checked == (1 if change == "activation" else 2)  # an unknown activation is refused first


def test_what_the_key_cannot_prove_is_read_on_every_call(seen, monkeypatch):
    x, weight, bias = aligned(16, 64), aligned(32, 64), aligned(32)
    key_call = (x, weight, bias, _Cuda)
    linear(x, weight, bias, "relu")
    key = next(iter(_bound._local.entries))[0]
    assert _pointwise.linear_inference(key, *key_call) is not None
    # a pointer aligned to less than 256 bytes
    shifted = aligned(16 * 64 + 16)[16:].view(16, 64)
    assert _pointwise.linear_inference(key, shifted, weight, bias, _Cuda) is None
    # another device type
    assert _pointwise.linear_inference(key, x, weight, bias, x.device) is None
    # an autotune() context: _gemms searches the GEMM
    with autotune(iterations=1):
        assert _pointwise.linear_inference(key, *key_call) is None
    # another current stream: its own step, made after the checks
    monkeypatch.setattr(_pointwise, "_raw_stream", lambda device: 7)
    assert _pointwise.linear_inference(key, *key_call) is None
    monkeypatch.setattr(_pointwise, "_raw_stream", lambda device: 0)
    # a graph capturing the call keeps its step for the thread's life
    monkeypatch.setattr(_pointwise, "_capturing", lambda: True)
    assert _pointwise.linear_inference(key, *key_call) is not None
    step = _bound.steps()[key, 0]
    assert step.captured and any(kept is step for kept in _bound._local.captured)


def test_requires_grad_flipping_and_autocast_take_their_own_paths():
    """With CPU tensors (the ops' torch math): a call recorded by autograd once, then without a gradient,
    then under autocast, then recorded again, each gives torch's values (and gradients)."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, dtype=torch.float32)
    weight = torch.randn(4, 5, dtype=torch.float32, requires_grad=True)
    bias = torch.randn(4, dtype=torch.float32, requires_grad=True)

    def expected(x_, weight_, bias_):
        return torch.nn.functional.gelu(torch.nn.functional.linear(x_, weight_, bias_), approximate="tanh")
    for _ in range(2):
        out = linear(x, weight, bias, "gelu")
        assert out.grad_fn is not None and out.shape == (2, 3, 4)
        torch.testing.assert_close(out, expected(x, weight, bias))
        grads = torch.autograd.grad(out.sum(), (weight, bias))
        torch.testing.assert_close(grads, torch.autograd.grad(expected(x, weight, bias).sum(), (weight, bias)))
    with torch.no_grad():
        out = linear(x, weight, bias, "gelu")
    assert out.grad_fn is None and not out.requires_grad
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = linear(x, weight, bias, "gelu")
    assert out.dtype == torch.bfloat16 and out.grad_fn is not None
    x.requires_grad_()
    out = linear(x, weight, bias, "gelu")
    assert out.dtype == torch.float32
    torch.testing.assert_close(torch.autograd.grad(out.sum(), x)[0],
                               torch.autograd.grad(expected(x, weight, bias).sum(), x)[0])


def test_the_record_of_calls_with_a_gradient_is_bounded(monkeypatch):
    monkeypatch.setattr(_functional, "_GRAD_CALLS", 3)
    weight = torch.randn(4, 5, requires_grad=True)
    for rows in range(1, 8):
        linear(torch.randn(rows, 5), weight)
        assert 1 <= len(_functional._checked.grad_calls) <= 3
