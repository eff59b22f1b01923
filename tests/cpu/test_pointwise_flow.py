"""The bound pointwise step's control flow without a GPU: stand-in GEMMs record each launch (epilog and
pointers, no math), so which GEMMs a forward and backward run, in which operand order, which gradients
come back and when the custom op's path takes over are checked on CPU tensors. The math runs on the GPU
(tests/gpu/test_pointwise_gpu.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from nvblaslt.torch import _bound, _pointwise  # noqa: E402

CL = torch.channels_last


def aligned(shape, memory_format=torch.contiguous_format):
    """A tensor at a 256-byte aligned address (CPU allocations are 64-byte aligned; CUDA's caching
    allocator's 512), random values."""
    count = 1
    for extent in shape:
        count *= extent
    buffer = torch.empty(count + 64, dtype=torch.float32)
    start = (-buffer.data_ptr() % 256) // 4
    flat = buffer[start:start + count]
    if memory_format is CL:
        n, c, h, w = shape
        return flat.view(n, h, w, c).permute(0, 3, 1, 2).normal_()
    return flat.view(*shape).normal_()


class StandInGemm:
    def __init__(self, epilog, attributes, launches):
        self.epilog, self.attributes, self.launches = epilog, tuple(attributes), launches

    def __call__(self, a, b, d, stream, *pointers):
        assert len(pointers) == len(self.attributes)
        self.launches.append((self.epilog.name, a, b))


@pytest.fixture
def launches(monkeypatch):
    found: list = []
    monkeypatch.setattr(_bound, "bind", lambda a, b, epilog, inputs, stream, result, attributes=():
                        StandInGemm(epilog, attributes, found))
    monkeypatch.setattr(_pointwise, "_raw_stream", lambda device: 0)
    monkeypatch.setattr(_pointwise, "_current_stream", lambda device: 0)
    monkeypatch.setattr(_pointwise, "_capturing", lambda: False)
    monkeypatch.setattr(_pointwise, "_several_devices", lambda: False)
    monkeypatch.setattr(_bound._cuda, "is_capturing", lambda stream: False)
    monkeypatch.setattr(_pointwise._cuda, "is_capturing", lambda stream: False)
    derivative = _pointwise._derivative

    def aligned_derivative(grad, ctx, out, aux):  # as the GPU's allocator would place it
        dz = derivative(grad, ctx, out, aux)
        return dz if dz is grad or dz.data_ptr() % 256 == 0 else aligned(tuple(dz.shape), CL).copy_(dz)
    monkeypatch.setattr(_pointwise, "_derivative", aligned_derivative)
    _bound.clear()
    yield found
    _bound.clear()


FORWARD = {("relu", True): "RELU_BIAS", ("relu", False): "RELU", ("gelu", True): "GELU_AUX_BIAS",
           ("gelu", False): "GELU_AUX", ("none", True): "BIAS", ("none", False): "DEFAULT"}


@pytest.mark.parametrize("wanted", [(True, True, True), (False, True, True), (True, False, True), (True, True, False)],
                         ids=["all", "no-dx", "no-dW", "no-db"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("activation", ["relu", "gelu", "none"])
def test_the_step_launches_the_gemms_its_gradients_need(launches, activation, bias, wanted):
    x = aligned((2, 8, 3, 5), CL).requires_grad_(wanted[0])
    weight = aligned((6, 8, 1, 1)).requires_grad_(wanted[1])
    b = aligned((6,)).requires_grad_(wanted[2]) if bias else None
    out = _pointwise.conv(x, weight, b, activation, True)
    assert out.shape == (2, 6, 3, 5) and out.is_contiguous(memory_format=CL)
    forward = FORWARD[activation, bias]
    assert launches[0][0] == forward
    # elementwise epilogs: D = X Wᵀ (A is x); with a vector along D: D = W Xᵀ (A is the weight)
    first = (x.data_ptr(), weight.data_ptr()) if forward in ("DEFAULT", "RELU", "GELU") else \
        (weight.data_ptr(), x.data_ptr())
    assert launches[0][1:] == first
    out.backward(aligned((2, 6, 3, 5), CL))
    expected = (["BGRADB" if bias and wanted[2] else "DEFAULT"] if wanted[1] else []) + (["DEFAULT"] if wanted[0] else [])
    assert sorted(name for name, _, _ in launches[1:]) == sorted(expected)
    for name, a, b_pointer in launches[1:]:  # dW = dZᵀ X reads x as A; dX = dZ W reads the weight as A
        assert a in (x.data_ptr(), weight.data_ptr())
    for tensor, want in zip((x, weight, b), wanted):
        if tensor is not None:
            assert (tensor.grad is not None) == want and (tensor.grad is None or tensor.grad.shape == tensor.shape)


def test_a_gradient_at_an_offset_takes_the_ops_path(launches, monkeypatch):
    taken = []
    monkeypatch.setattr(_pointwise, "_as_op", lambda *arguments: taken.append(1) or (None,) * 7)
    x = aligned((2, 8, 3, 5), CL).requires_grad_()
    weight, b = aligned((6, 8, 1, 1)).requires_grad_(), aligned((6,)).requires_grad_()
    out = _pointwise.conv(x, weight, b, "none", True)
    out.backward(aligned((3, 6, 3, 5), CL)[1:])  # 360 bytes into its storage
    assert taken and [name for name, _, _ in launches] == ["BIAS"]


def test_linear_inference_runs_one_bound_forward(launches):
    x, weight, b = aligned((4, 8)), aligned((6, 8)), aligned((6,))
    y = _pointwise.inference(x, weight, b, "gelu")
    assert y.shape == (4, 6) and y.is_contiguous() and launches == [("GELU_BIAS", weight.data_ptr(), x.data_ptr())]
    assert _pointwise.inference(x.T.contiguous().T, weight, b, "gelu") is None  # column-major x: not bound


def test_steps_leave_the_cache_least_recently_used_first(launches, monkeypatch):
    monkeypatch.setattr(_bound, "_CACHE_SIZE", 2)
    weight = aligned((6, 8))
    xs = [aligned((rows, 8)) for rows in (1, 2, 3)]
    for x in (xs[0], xs[1], xs[0], xs[2]):  # the 1-row step is used again before the 3-row one comes
        _pointwise.inference(x, weight, None, "relu")
    assert sorted(key[0][0][0] for key in _bound._local.entries) == [1, 3]
