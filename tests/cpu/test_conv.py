"""Conv-Bias-ReLU as GEMMs (issue 25), on the CPU: ``nvblaslt.torch._im2col`` and ``nvblaslt.torch._conv``.

The layouts and index math (channels-last im2col and col2im, the GEMM shapes and transposes of the
forward, input-, weight- and bias-gradient steps, ReLU's backward from the output) are checked with the
cuBLASLt GEMM replaced by a plain float64 torch matmul, against ``nn.functional.conv2d`` + bias +
activation under autograd in float64. Then the real custom ops (torch ops on the CPU), their CUDA
implementation with nvblaslt.matmul emulated, fake implementations, torch.compile, the module's
parameters, the refusals, the example and the bench's smoke run. GPU runs: tests/gpu/test_conv_gpu.py.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional

from nvblaslt import NvblasltError, NvblasltTypeError, NvblasltValueError  # noqa: E402
from nvblaslt.torch import _conv, _conv_ops, _gemms, _im2col, _ops  # noqa: E402
from nvblaslt.torch._conv import FusedConv2d, conv2d  # noqa: E402
from nvblaslt.torch._im2col import Geometry  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CL = torch.channels_last
ACTIVATIONS = {"relu": torch.relu, "gelu": lambda z: F.gelu(z, approximate="tanh"), "none": lambda z: z}

# (N, C, H, W, O, kernel, stride, padding, dilation)
CASES = {
    "pointwise": (2, 5, 7, 6, 4, 1, 1, 0, 1),
    "pointwise-stride2": (2, 5, 7, 6, 4, 1, 2, 0, 1),
    "pointwise-padded": (1, 3, 4, 4, 2, 1, 1, 1, 1),
    "3x3": (2, 4, 8, 7, 6, 3, 1, 1, 1),
    "3x3-stride2": (2, 4, 9, 8, 5, 3, 2, 1, 1),
    "3x3-dilation2": (2, 3, 9, 9, 4, 3, 1, 2, 2),
    "3x2-mixed": (2, 3, 8, 7, 5, (3, 2), (2, 1), (1, 0), (1, 2)),
    "5x5-stride3": (1, 2, 11, 10, 3, 5, 3, 2, 1),
    "padding-beyond-reach": (1, 2, 3, 4, 3, 3, 2, 3, 1),  # some taps see only padding
    "kernel-is-the-image": (2, 3, 4, 5, 6, (4, 5), 1, 0, 1),
    "seed": (1, 1, 3, 3, 1, 2, 1, 0, 1),
}


def pair(v):
    return v if isinstance(v, tuple) else (v, v)


def make(case, dtype=torch.float64, seed=0, weight_format=torch.contiguous_format):
    """(x channels-last, weight, bias, Geometry) for a case."""
    n, c, h, w, o, k, s, p, d = CASES[case] if isinstance(case, str) else case
    generator = torch.Generator().manual_seed(seed)
    kernel = pair(k)
    x = torch.randn(n, c, h, w, dtype=dtype, generator=generator).contiguous(memory_format=CL)
    weight = torch.randn(o, c, *kernel, dtype=dtype, generator=generator).contiguous(memory_format=weight_format)
    bias = torch.randn(o, dtype=dtype, generator=generator)
    return x, weight, bias, Geometry(kernel, pair(s), pair(p), pair(d))


def reference(x, weight, bias, g, activation, grad):
    """(y, dx, dw, db) of F.conv2d + bias + activation under autograd, in x's dtype."""
    leaves = [t.detach().clone().requires_grad_() for t in (x, weight)]
    b = None if bias is None else bias.detach().clone().requires_grad_()
    y = ACTIVATIONS[activation](F.conv2d(leaves[0], leaves[1], b, g.stride, g.padding, g.dilation))
    y.backward(grad)
    return y.detach(), leaves[0].grad, leaves[1].grad, None if b is None else b.grad


# ---- the GEMMs replaced by float64 torch matmuls --------------------------------------------------------------

class ReferenceGemms:
    """The two GEMM steps as plain matmuls (+ bias, activation), recording what they were given."""

    def __init__(self):
        self.calls = []

    def forward(self, cols, w, bias, activation, keep_aux):
        self.calls.append(("forward", cols, w))
        z = cols @ w.T + (0 if bias is None else bias)
        aux = z.T.clone() if keep_aux else cols.new_empty(0)  # what GELU's backward needs: z
        return ACTIVATIONS[activation](z), aux

    def backward(self, dy, cols, w, out, aux, activation, bias_grad, input_grad, weight_grad):
        self.calls.append(("backward", dy, cols, w, out))
        if activation == "relu":
            dz = dy * (out > 0)  # from the output, as the seed argues
        elif activation == "gelu":
            z = aux.T.detach().requires_grad_()
            dz = torch.autograd.grad(ACTIVATIONS["gelu"](z), z, dy)[0]
        else:
            dz = dy
        return (dz @ w if input_grad else None, dz.T @ cols if weight_grad else None,
                dz.sum(0) if bias_grad else None)


def decomposed(x, weight, bias, g, activation, grad, gemms=None, input_grad=True, weight_grad=True):
    gemms = gemms or ReferenceGemms()
    out, aux = _im2col.forward(x, weight, bias, activation, activation == "gelu", g, gemms.forward)
    dx, dw, db = _im2col.backward(grad, x, weight, out if activation == "relu" else None, aux, activation,
                                  bias is not None, input_grad, weight_grad, g, gemms.backward)
    return out, dx, dw, db


def assert_matches_conv2d(case, activation, bias=True, weight_format=torch.contiguous_format, seed=0):
    x, weight, b, g = make(case, seed=seed, weight_format=weight_format)
    b = b if bias else None
    out_shape = F.conv2d(x, weight, None, g.stride, g.padding, g.dilation).shape
    grad = torch.randn(out_shape, dtype=x.dtype, generator=torch.Generator().manual_seed(seed + 1))
    expected = reference(x, weight, b, g, activation, grad)
    got = decomposed(x, weight, b, g, activation, grad)
    for name, a, e in zip(("y", "dx", "dw", "db"), got, expected):
        if e is None:
            assert a is None, name
            continue
        torch.testing.assert_close(a, e, msg=lambda m, name=name: f"{name}: {m}")
    return got


@pytest.mark.parametrize("activation", ["relu", "gelu", "none"])
@pytest.mark.parametrize("case", CASES)
def test_decomposition_matches_conv2d_under_autograd_in_float64(case, activation):
    y, dx, dw, _ = assert_matches_conv2d(case, activation)
    assert y.is_contiguous(memory_format=CL) and dx.is_contiguous(memory_format=CL)
    assert dw.is_contiguous()  # the weight's own format


@pytest.mark.parametrize("case", ["3x3", "3x2-mixed", "pointwise"])
def test_decomposition_without_bias_and_with_channels_last_weights(case):
    assert_matches_conv2d(case, "relu", bias=False)
    _, _, dw, _ = assert_matches_conv2d(case, "gelu", weight_format=CL)
    assert dw.is_contiguous(memory_format=CL)


REAL_IM2COL, REAL_COL2IM = _im2col.im2col, _im2col.col2im
MUTANTS = {
    # weight columns in (c, i, j) order instead of cols' (i, j, c)
    "weight order": ("weight_matrix", lambda weight: weight.reshape(weight.shape[0], -1)),
    # patches of the image upside down
    "im2col rows": ("im2col", lambda x, g: REAL_IM2COL(x.flip(1).contiguous(), g)),
    # each kernel tap's gradient added onto the mirrored tap's pixel
    "col2im taps": ("col2im", lambda cols, g, shape: REAL_COL2IM(
        cols.view(-1, *g.kernel, shape[3]).flip(1, 2).reshape(cols.shape), g, shape)),
}


@pytest.mark.parametrize("mutant", MUTANTS)
def test_the_comparison_catches_a_wrong_layout(monkeypatch, mutant):
    """The check above can fail: each deliberate layout mistake makes it fail."""
    monkeypatch.setattr(_im2col, *MUTANTS[mutant])
    with pytest.raises(AssertionError):
        assert_matches_conv2d("3x2-mixed", "relu")


def test_geometry_gives_nn_conv2ds_output_size():
    for case in CASES:
        x, weight, _, g = make(case)
        assert tuple(F.conv2d(x, weight, None, g.stride, g.padding, g.dilation).shape[2:]) == \
            g.output_size(*x.shape[2:])
    assert Geometry((1, 1), (1, 1), (0, 0), (3, 3)).pointwise
    assert not Geometry((1, 1), (2, 1), (0, 0), (1, 1)).pointwise
    assert not Geometry((1, 1), (1, 1), (0, 1), (1, 1)).pointwise


@pytest.mark.parametrize("case", CASES)
def test_im2col_is_unfold_in_channels_last_order(case):
    x, weight, _, g = make(case)
    n, c = x.shape[:2]
    oh, ow = g.output_size(*x.shape[2:])
    cols = _im2col.im2col(_im2col.nhwc(x), g)
    assert cols.shape == (n * oh * ow, g.kernel[0] * g.kernel[1] * c) and cols.is_contiguous()
    unfolded = F.unfold(x, g.kernel, g.dilation, g.padding, g.stride)  # (N, C·kH·kW, L), columns (c, i, j)
    expected = unfolded.view(n, c, *g.kernel, oh * ow).permute(0, 4, 2, 3, 1).reshape(cols.shape)
    assert torch.equal(cols, expected)


@pytest.mark.parametrize("case", CASES)
def test_col2im_is_the_adjoint_of_im2col_and_fold(case):
    x, _, _, g = make(case)
    n, c, h, w = x.shape
    xh = _im2col.nhwc(x).contiguous()
    cols = _im2col.im2col(xh, g)
    other = torch.randn_like(cols)
    back = _im2col.col2im(other, g, (n, h, w, c))
    assert back.shape == (n, h, w, c) and back.is_contiguous()
    torch.testing.assert_close((cols * other).sum(), (xh * back).sum())  # <im2col x, c> = <x, col2im c>
    oh, ow = g.output_size(h, w)
    as_fold_input = other.view(n, oh * ow, *g.kernel, c).permute(0, 4, 2, 3, 1).reshape(n, -1, oh * ow)
    folded = F.fold(as_fold_input, (h, w), g.kernel, g.dilation, g.padding, g.stride)
    torch.testing.assert_close(_im2col.nchw(back), folded)


def test_gemm_shapes_and_transposes():
    """forward: cols (M, K) and W (O, K), K ordered (i, j, c); backward: dy (M, O) in the output's
    channels-last order, the same cols, and the output's rows for ReLU."""
    x, weight, bias, g = make("3x2-mixed")
    n, c = x.shape[:2]
    o = weight.shape[0]
    oh, ow = g.output_size(*x.shape[2:])
    m, k = n * oh * ow, g.kernel[0] * g.kernel[1] * c
    grad = torch.randn(n, o, oh, ow, dtype=x.dtype)  # channels-first: its rows are a copy
    gemms = ReferenceGemms()
    out, *_ = decomposed(x, weight, bias, g, "relu", grad, gemms)
    (_, cols, w), (_, dy, cols_again, w_again, out_rows) = [call for call in gemms.calls]
    assert cols.shape == (m, k) and w.shape == (o, k) and dy.shape == (m, o) and out_rows.shape == (m, o)
    torch.testing.assert_close(w, weight.permute(0, 2, 3, 1).reshape(o, k))
    assert torch.equal(dy, grad.permute(0, 2, 3, 1).reshape(m, o))
    assert torch.equal(cols_again, cols) and out_rows.data_ptr() == out.data_ptr()


def test_pointwise_convolution_copies_nothing():
    """1×1, stride 1, no padding: cols is x's memory, the output is the GEMM's, dx is dcols."""
    x, weight, bias, g = make("pointwise")
    grad = torch.randn(2, 4, 7, 6, dtype=x.dtype).contiguous(memory_format=CL)
    gemms = ReferenceGemms()
    out, dx, _, _ = decomposed(x, weight, bias, g, "relu", grad, gemms)
    (_, cols, w), (_, dy, cols_again, _, _) = gemms.calls
    assert cols.data_ptr() == x.data_ptr() == cols_again.data_ptr() and cols._base is not None
    assert w.data_ptr() == weight.data_ptr() and dy.data_ptr() == grad.data_ptr()
    dcols = torch.randn(cols.shape, dtype=x.dtype)
    assert _im2col.col2im(dcols, g, (2, 7, 6, 5)).data_ptr() == dcols.data_ptr()


def test_backward_recomputes_no_cols_without_a_weight_gradient():
    x, weight, bias, g = make("3x3")
    grad = torch.randn(2, 6, 8, 7, dtype=x.dtype)
    gemms = ReferenceGemms()
    gemms.backward = lambda dy, cols, *rest: (gemms.calls.append(cols),
                                              (dy @ rest[0], None, dy.sum(0)))[1]  # type: ignore[method-assign]
    _, dx, dw, db = decomposed(x, weight, bias, g, "none", grad, gemms, weight_grad=False)
    assert gemms.calls[-1] is None and dw is None
    torch.testing.assert_close(dx, reference(x, weight, bias, g, "none", grad)[1])


# ---- the custom ops on the CPU (torch ops as the GEMMs) --------------------------------------------------------

def run_module(module, x, grad):
    for p in module.parameters():
        p.grad = None
    xi = x.detach().clone().requires_grad_()
    y = module(xi)
    y.backward(grad)
    return [y.detach(), xi.grad] + [p.grad.clone() for p in module.parameters()]


def conv_pair(case, activation, bias=True, dtype=torch.float64):
    """(nn.Conv2d + activation, FusedConv2d sharing nothing with it, x, grad)."""
    x, weight, b, g = make(case, dtype=dtype)
    conv = nn.Conv2d(x.shape[1], weight.shape[0], g.kernel, g.stride, g.padding, g.dilation, bias=bias, dtype=dtype)
    with torch.no_grad():
        conv.weight.copy_(weight)
        if bias:
            conv.bias.copy_(b)
    act = {"relu": nn.ReLU(), "gelu": nn.GELU(approximate="tanh"), "none": nn.Identity()}[activation]
    fused = FusedConv2d.from_conv(copy.deepcopy(conv), activation)
    grad = torch.randn(conv(x).shape, dtype=dtype).contiguous(memory_format=CL)
    return nn.Sequential(conv, act), fused, x, grad


@pytest.mark.parametrize("activation", ["relu", "gelu", "none"])
@pytest.mark.parametrize("case", CASES)
def test_fused_conv2d_matches_nn_conv2d_on_cpu(case, activation):
    reference_model, fused, x, grad = conv_pair(case, activation)
    for got, expected in zip(run_module(fused, x, grad), run_module(reference_model, x, grad)):
        torch.testing.assert_close(got, expected)


def rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_conv2d_in_lower_precision_on_cpu(dtype):
    """No further from the float64 result than nn.Conv2d in ``dtype`` is (or the dtype's rounding)."""
    reference_model, fused, x, grad = conv_pair("3x3", "relu", dtype=dtype)
    exact = run_module(copy.deepcopy(reference_model).double(), x.double(), grad.double())
    theirs = run_module(reference_model, x, grad)
    for got, their, e in zip(run_module(fused, x, grad), theirs, exact):
        assert got.dtype == dtype
        assert rel(got, e) <= max(3 * rel(their, e), 1e-6 if dtype == torch.float32 else 1e-2)


def test_gradcheck_float64_through_the_ops():
    torch.manual_seed(3)
    net = nn.Sequential(FusedConv2d(2, 3, 3, padding=1, activation="gelu", dtype=torch.float64),
                        FusedConv2d(3, 3, 1, activation="relu", dtype=torch.float64),
                        FusedConv2d(3, 2, (2, 3), stride=(2, 1), dilation=(1, 2), dtype=torch.float64))
    names = [n for n, _ in net.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in net.parameters())
    x = torch.randn(2, 2, 4, 5, dtype=torch.float64).contiguous(memory_format=CL).requires_grad_()

    def f(x, *params):
        return torch.func.functional_call(net, dict(zip(names, params)), (x,))

    assert torch.autograd.gradcheck(f, (x, *params), fast_mode=True)


def test_backward_keeps_x_the_weight_and_the_output_only():
    """The seed's point: Conv-Bias-ReLU's backward needs x, w and y, nothing in between."""
    x, weight, bias, _ = make("3x3")
    x.requires_grad_()
    y = conv2d(x, weight, bias, padding=1, activation="relu")
    saved = y.grad_fn.saved_tensors
    kept = [t.data_ptr() for t in saved if t is not None and t.numel()]
    assert kept == [x.data_ptr(), weight.data_ptr(), y.data_ptr()]
    z = conv2d(x, weight, bias, padding=1, activation="gelu")  # GELU's derivative needs z: the aux
    kept = [t for t in z.grad_fn.saved_tensors if t is not None and t.numel()]
    assert [t.data_ptr() for t in kept[:2]] == [x.data_ptr(), weight.data_ptr()] and len(kept) == 3
    assert kept[2].shape[1] == y.numel() // y.shape[1] and kept[2].shape[0] >= y.shape[1]


def test_gradients_arrive_in_any_layout():
    """An expanded gradient (y.sum()) and a channels-first one are read as the output's rows."""
    _, fused, x, _ = conv_pair("3x3", "relu")
    expected = run_module(fused, x, torch.ones(2, 6, 8, 7, dtype=x.dtype).contiguous(memory_format=CL))
    xi = x.detach().clone().requires_grad_()
    fused(xi).sum().backward()
    torch.testing.assert_close(xi.grad, expected[1])
    got = run_module(fused, x, torch.ones(2, 6, 8, 7, dtype=x.dtype))
    for a, e in zip(got, expected):
        torch.testing.assert_close(a, e)


def test_weight_gradient_keeps_the_weights_format():
    _, fused, x, grad = conv_pair("3x3", "relu")
    fused.to(memory_format=CL)
    assert fused.weight.is_contiguous(memory_format=CL) and not fused.weight.is_contiguous()
    run_module(fused, x, grad)
    assert fused.weight.grad.stride() == fused.weight.stride()


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
def test_empty_batch_and_no_output_channels():
    layer = FusedConv2d(3, 4, 3, padding=1, activation="relu")
    x = torch.randn(0, 3, 5, 5).contiguous(memory_format=CL).requires_grad_()
    y = layer(x)
    assert y.shape == (0, 4, 5, 5)
    y.sum().backward()
    assert layer.weight.grad.shape == layer.weight.shape and float(layer.weight.grad.abs().sum()) == 0.0
    none = FusedConv2d(3, 0, 1)
    assert none(torch.randn(2, 3, 4, 4).contiguous(memory_format=CL)).shape == (2, 0, 4, 4)


def test_no_grad_keeps_no_aux_and_inference_runs():
    layer = FusedConv2d(3, 4, 3, padding=1, activation="gelu")
    x = torch.randn(2, 3, 5, 5).contiguous(memory_format=CL)
    with torch.no_grad():
        y = layer(x)
    aux = torch.ops.nvblaslt.conv2d(x, layer.weight.detach(), layer.bias.detach(), "gelu", False, [1, 1], [1, 1],
                                    [1, 1])[1]
    assert aux.numel() == 0
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), y)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_autocast_casts_as_for_nn_conv2d(compiled):
    torch.manual_seed(4)
    conv = nn.Conv2d(3, 6, 3, padding=1)
    fused = FusedConv2d.from_conv(copy.deepcopy(conv), "relu")
    model = fused
    if compiled:
        torch._dynamo.reset()
        model = torch.compile(fused, fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 3, 8, 8).contiguous(memory_format=CL)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, expected = model(x), torch.relu(conv(x))
    assert y.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(y, expected, rtol=2e-2, atol=2e-2)
    y.float().sum().backward()
    assert fused.weight.grad.dtype == torch.float32


# ---- the CUDA implementation's orchestration, against an emulated nvblaslt.matmul -------------------------------

@pytest.fixture
def emulated_cuda_path(monkeypatch):
    """The ops' CUDA implementation on the CPU: nvblaslt.matmul emulated (tests/cpu/test_torch.py's emulator),
    every call's epilog and operands recorded."""
    from tests.cpu.test_torch import EmulatedMatmul

    emulated = EmulatedMatmul()
    operands = []

    def recording(a, b, *, epilog=None, epilog_inputs=None):
        operands.append((a, b))
        return emulated(a, b, epilog=epilog, epilog_inputs=epilog_inputs)
    monkeypatch.setattr(_gemms, "matmul", recording)
    monkeypatch.setattr(_ops, "uses_cublaslt", lambda x: True)
    monkeypatch.setattr(_conv_ops, "uses_cublaslt", lambda x: True)
    emulated.operands = operands
    return emulated


@pytest.mark.parametrize("activation, bias, forward_epilog", [
    ("relu", True, "RELU_BIAS"), ("gelu", True, "GELU_AUX_BIAS"), ("none", True, "BIAS"), ("relu", False, "RELU")])
@pytest.mark.parametrize("case", ["pointwise", "3x3-stride2", "3x2-mixed"])
def test_cuda_path_runs_the_epilogs_and_matches_nn_conv2d(emulated_cuda_path, case, activation, bias,
                                                         forward_epilog):
    reference_model, fused, x, grad = conv_pair(case, activation, bias=bias)
    for got, expected in zip(run_module(fused, x, grad), run_module(reference_model, x, grad)):
        torch.testing.assert_close(got, expected)
    used = emulated_cuda_path.epilogs
    backward = ["BGRADB", "DEFAULT"] if bias else ["DEFAULT", "DEFAULT"]  # dW (+ db), dcols
    assert used[0] == forward_epilog and sorted(used[1:]) == sorted(backward), used
    assert not {"RELU_AUX_BIAS", "DRELU", "DRELU_BGRAD"} & set(used)  # ReLU's backward reads y: no bitmask


def test_cuda_path_pointwise_gemms_read_x_and_write_the_output_in_place(emulated_cuda_path):
    _, fused, x, grad = conv_pair("pointwise", "relu")
    xi = x.detach().clone().requires_grad_()
    y = fused(xi)
    forward_a, forward_b = emulated_cuda_path.operands[0]
    assert forward_b.data_ptr() == xi.data_ptr()  # D = W xᵀ: B is x's own memory
    y.backward(grad)
    assert any(b.data_ptr() == xi.data_ptr() or a.data_ptr() == xi.data_ptr()
               for a, b in emulated_cuda_path.operands[1:])  # dW = dzᵀ x, x read in place again


def test_cuda_path_float64_fallback_where_cublaslt_refuses(emulated_cuda_path, monkeypatch):
    monkeypatch.setattr(_gemms, "refused_fp64", set())
    emulated_cuda_path.refuse = {"RELU_BIAS", "BGRADB"}
    reference_model, fused, x, grad = conv_pair("3x3", "relu")
    for got, expected in zip(run_module(fused, x, grad), run_module(reference_model, x, grad)):
        torch.testing.assert_close(got, expected)


# ---- fake implementations, opcheck, torch.compile -----------------------------------------------------------------

def op_arguments(case="3x2-mixed", activation="gelu", bias=True, weight_format=torch.contiguous_format):
    x, weight, b, g = make(case, dtype=torch.float32, weight_format=weight_format)
    forward = (x, weight, b if bias else None, activation, activation == "gelu", list(g.stride), list(g.padding),
               list(g.dilation))
    out, aux = torch.ops.nvblaslt.conv2d(*forward)
    backward = (torch.randn_like(out), x, weight, out if activation == "relu" else None, aux, activation, bias,
                list(g.stride), list(g.padding), list(g.dilation), True, True)
    return forward, backward


@pytest.mark.parametrize("variant", [("3x2-mixed", "gelu", True, torch.contiguous_format),
                                     ("pointwise", "relu", False, torch.contiguous_format),
                                     ("3x3", "none", True, CL)])
def test_opcheck_on_cpu(variant):
    forward, backward = op_arguments(*variant)
    torch.library.opcheck(torch.ops.nvblaslt.conv2d.default, forward)
    torch.library.opcheck(torch.ops.nvblaslt.conv2d_backward.default, backward)


def test_fake_tensors_give_shapes_and_strides_without_computing():
    from torch._subclasses.fake_tensor import FakeTensorMode

    forward, backward = op_arguments()
    real = torch.ops.nvblaslt.conv2d(*forward)
    real_grads = torch.ops.nvblaslt.conv2d_backward(*backward)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = torch.ops.nvblaslt.conv2d(*(mode.from_tensor(t) if isinstance(t, torch.Tensor) else t
                                           for t in forward))
        fake_grads = torch.ops.nvblaslt.conv2d_backward(*(mode.from_tensor(t) if isinstance(t, torch.Tensor) else t
                                                          for t in backward))
    for f, r in zip((*fake, *fake_grads), (*real, *real_grads)):
        assert f.shape == r.shape and f.stride() == r.stride() and f.dtype == r.dtype


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph_without_graph_breaks_on_cpu(backend):
    torch._dynamo.reset()
    torch.manual_seed(5)
    net = nn.Sequential(FusedConv2d(4, 8, 1, activation="relu"), FusedConv2d(8, 8, 3, padding=1, activation="gelu"),
                        FusedConv2d(8, 3, 1, stride=2))
    x = torch.randn(2, 4, 8, 8).contiguous(memory_format=CL).requires_grad_()
    explanation = torch._dynamo.explain(net)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    compiled = torch.compile(net, fullgraph=True, backend=backend)
    grad = torch.randn(2, 3, 4, 4).contiguous(memory_format=CL)
    for got, expected in zip(run_module(compiled, x, grad), run_module(net, x, grad)):
        torch.testing.assert_close(got, expected)


# ---- the module ---------------------------------------------------------------------------------------------

def test_a_layer_whose_settings_change_after_it_was_made_convolves_with_the_new_ones():
    # forward reuses the geometry parsed at construction only while the layer still matches it
    torch.manual_seed(6)
    layer = FusedConv2d(3, 4, 1, activation="relu", dtype=torch.float64)
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64).contiguous(memory_format=CL)
    assert layer(x).shape == (2, 4, 6, 6)
    layer.stride = (2, 2)
    torch.testing.assert_close(layer(x), torch.relu(nn.functional.conv2d(x, layer.weight, layer.bias, stride=2)))
    layer.activation = "gelu"
    expected = nn.functional.gelu(nn.functional.conv2d(x, layer.weight, layer.bias, stride=2), approximate="tanh")
    torch.testing.assert_close(layer(x), expected)
    layer.stride = (0, 1)
    with pytest.raises(NvblasltValueError, match="stride"):
        layer(x)


@pytest.mark.parametrize("bias", [True, False])
def test_fused_conv2d_has_nn_conv2ds_parameters_init_and_keys(bias):
    torch.manual_seed(3)
    ours = FusedConv2d(5, 7, 3, stride=2, padding="valid", bias=bias, activation="relu", dtype=torch.float64)
    torch.manual_seed(3)
    theirs = nn.Conv2d(5, 7, 3, stride=2, padding="valid", bias=bias, dtype=torch.float64)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for key, value in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value)
    assert repr(ours) == "FusedConv2d(5, 7, kernel_size=(3, 3), stride=(2, 2), padding=valid" + \
        (", bias=False" if not bias else "") + ", activation='relu')"
    assert ours.padding == theirs.padding == "valid" and ours.resolved_padding == (0, 0)


def test_from_conv_shares_parameters_and_checkpoints_load():
    conv = nn.Conv2d(4, 6, 3, padding="same", dilation=2)
    fused = FusedConv2d.from_conv(conv, "relu")
    assert fused.weight is conv.weight and fused.bias is conv.bias and fused.resolved_padding == (2, 2)
    fresh = FusedConv2d(4, 6, 3, padding="same", dilation=2, activation="relu")
    fresh.load_state_dict(conv.state_dict())
    x = torch.randn(2, 4, 7, 7).contiguous(memory_format=CL)
    torch.testing.assert_close(fresh(x), torch.relu(conv(x)))
    torch.testing.assert_close(fused(x), torch.relu(conv(x)))


def test_pays_to_fuse_only_pointwise_convolutions_that_copy_nothing():
    assert _conv.pays_to_fuse(nn.Conv2d(8, 16, 1)) and _conv.pays_to_fuse(nn.Conv2d(8, 16, 1, padding="valid"))
    assert _conv.pays_to_fuse(nn.Conv2d(8, 16, 1, padding="same", bias=False))
    for conv in (nn.Conv2d(8, 16, 3, padding=1), nn.Conv2d(8, 16, 1, stride=2), nn.Conv2d(8, 16, 1, groups=2),
                 nn.Conv2d(8, 16, 1, padding=1, padding_mode="reflect"), nn.Linear(8, 16)):
        assert not _conv.pays_to_fuse(conv), conv


# ---- refusals ---------------------------------------------------------------------------------------------------

def refused(cls, match, call):
    with pytest.raises(cls, match=match) as info:
        call()
    assert isinstance(info.value, NvblasltError)
    assert isinstance(info.value, ValueError if cls is NvblasltValueError else TypeError)


def test_unsupported_arguments_are_refused_by_name():
    x = torch.randn(2, 4, 6, 6).contiguous(memory_format=CL)
    w = torch.randn(6, 4, 3, 3)
    refused(NvblasltValueError, "groups: only 1", lambda: FusedConv2d(4, 6, 3, groups=2))
    refused(NvblasltValueError, "groups: only 1", lambda: conv2d(x, torch.randn(6, 2, 3, 3), groups=2))
    refused(NvblasltValueError, "groups: only 1", lambda: FusedConv2d.from_conv(nn.Conv2d(4, 6, 3, groups=2)))
    refused(NvblasltTypeError, "groups: expected an int", lambda: FusedConv2d(4, 6, 3, groups=1.0))
    refused(NvblasltValueError, "padding_mode: only 'zeros'", lambda: FusedConv2d(4, 6, 3, padding_mode="reflect"))
    refused(NvblasltValueError, "padding_mode: only 'zeros'",
            lambda: FusedConv2d.from_conv(nn.Conv2d(4, 6, 3, padding_mode="circular")))
    refused(NvblasltTypeError, "conv: expected a torch.nn.Conv2d", lambda: FusedConv2d.from_conv(nn.Linear(2, 2)))
    refused(NvblasltValueError, "activation: .*exact \\(erf\\) GELU",
            lambda: FusedConv2d(4, 6, 3, activation="gelu_erf"))
    refused(NvblasltValueError, "padding: 'same' needs stride 1", lambda: FusedConv2d(4, 6, 3, 2, padding="same"))
    refused(NvblasltValueError, "padding: 'same' with kernel \\(2, 2\\)", lambda: FusedConv2d(4, 6, 2, padding="same"))
    refused(NvblasltValueError, "padding: expected 'valid', 'same'", lambda: conv2d(x, w, padding="full"))
    refused(NvblasltValueError, "stride: expected values ≥ 1", lambda: conv2d(x, w, stride=0))
    refused(NvblasltValueError, "padding: expected values ≥ 0", lambda: conv2d(x, w, padding=(1, -1)))
    refused(NvblasltTypeError, "dilation: expected an int or a pair", lambda: conv2d(x, w, dilation="2"))
    refused(NvblasltTypeError, "stride: expected an int or a pair", lambda: conv2d(x, w, stride=(1, 2, 3)))
    refused(NvblasltTypeError, "kernel_size: expected an int or a pair", lambda: FusedConv2d(4, 6, 2.5))
    refused(NvblasltValueError, "kernel_size: expected values ≥ 1", lambda: FusedConv2d(4, 6, 0))
    refused(NvblasltValueError, "in_channels: expected an int ≥ 0", lambda: FusedConv2d(-1, 6, 3))
    refused(NvblasltTypeError, "out_channels: expected an int ≥ 0", lambda: FusedConv2d(4, True, 3))


def test_bad_tensors_are_refused_by_name():
    x = torch.randn(2, 4, 6, 6).contiguous(memory_format=CL)
    w, b = torch.randn(6, 4, 3, 3), torch.randn(6)
    refused(NvblasltTypeError, "x: expected a torch.Tensor, got numpy", lambda: conv2d(x.numpy(), w))
    refused(NvblasltTypeError, "bias: expected a torch.Tensor or None", lambda: conv2d(x, w, [0.0] * 6))
    refused(NvblasltValueError, "weight: expected a 4-D", lambda: conv2d(x, w[0]))
    refused(NvblasltValueError, r"x: expected a 4-D \(N, 4, H, W\)", lambda: conv2d(x[0], w))
    refused(NvblasltValueError, r"x: expected a 4-D \(N, 5, H, W\)", lambda: conv2d(x, torch.randn(6, 5, 3, 3)))
    refused(NvblasltTypeError, "weight: expected dtype torch.float32", lambda: conv2d(x, w.double()))
    refused(NvblasltTypeError, "x: expected float16, bfloat16, float32 or float64",
            lambda: conv2d(x.int(), w.int()))
    refused(NvblasltValueError, r"bias: expected shape \(6,\)", lambda: conv2d(x, w, b[:5]))
    refused(NvblasltValueError, "bias: on meta", lambda: conv2d(x, w, b.to("meta")))
    refused(NvblasltValueError, "x: its \\(6, 6\\) pixels are smaller than the kernel's reach",
            lambda: conv2d(x, torch.randn(6, 4, 7, 7)))


def test_channels_first_input_is_refused_with_the_copy_it_would_hide():
    x = torch.randn(2, 4, 6, 6)  # contiguous NCHW
    layer = FusedConv2d(4, 6, 1)
    for call in (lambda: layer(x), lambda: conv2d(x, layer.weight), lambda: layer(x[:, :, ::2])):
        refused(NvblasltValueError, r"x: expected channels-last memory.*x.contiguous\(memory_format=torch."
                                    r"channels_last\) \(one copy of x\)", call)
    layer(x.contiguous(memory_format=CL))
    layer(torch.randn(2, 4, 1, 1))  # one pixel: both layouts at once
    FusedConv2d(1, 3, 3)(torch.randn(2, 1, 5, 5))  # one channel: likewise


# ---- the example and the bench, without a GPU ----------------------------------------------------------------------

def test_example_runs_its_cpu_part_and_says_the_gemms_need_a_gpu():
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "conv_bias_relu.py"), "--device", "cpu"],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for line in ("y = [[8.0, 12.0], [20.0, 24.0]]", "dw for dy = ones: [[8.0, 12.0], [20.0, 24.0]]",
                 "dy = ones: [[0.0, 1.0, 1.0], [2.0, 6.0, 4.0], [2.0, 5.0, 3.0]]",
                 "the backward keeps x, w, y and nothing else (no other tensor): True",
                 "the GEMMs need a GPU", "all checks passed: True"):
        assert line in out, out
    assert "False" not in out, out


def test_conv_bench_runs_as_a_smoke_test_on_cpu(capsys):
    from nvblaslt.bench import conv as bench

    results = bench.main(["--device", "cpu", "--quick", "--no-compile", "--rounds", "2", "--shapes", "tiny"])
    labels = {row["label"] for row in results["rows"]}
    assert labels == {"pointwise 8→16 @6², N 2", "3×3 8→8 @6², N 2"}
    for row in results["rows"]:
        assert row["check"] < 1e-5 and {"eager", "fused"} <= set(row["ms"])
    assert [("im2col_share" in row) for row in results["rows"]] == [False, True]
    out = capsys.readouterr().out
    assert "FusedConv2d" in out and "×eager" in out
    assert "timed: wall clock to a synchronize after each step (host time paid)" in out  # the default pays host time
    assert all(row["timing"] == "sync" and set(row["by_timing"]) == {"sync"} for row in results["rows"])


def test_conv_bench_times_both_ways_when_asked_and_labels_each(capsys):
    from nvblaslt.bench import conv as bench

    results = bench.main(["--device", "cpu", "--no-compile", "--rounds", "1", "--shapes", "tiny", "--timing", "both"])
    for row in results["rows"]:
        assert set(row["by_timing"]) == {"sync", "spin"} and row["x_eager"] == row["by_timing"]["sync"]["x_eager"]
    out = capsys.readouterr().out
    assert "×eager spin" in out and any(line.startswith("[spin] pointwise:") for line in out.splitlines())


def test_conv_bench_drops_a_failing_compile_row_and_says_so(monkeypatch, capsys):
    from nvblaslt.bench import conv as bench

    class Broken(nn.Module):  # what torch.compile returns, failing at its first call
        def __init__(self, model, **kwargs):
            super().__init__()
            self.model = model

        def forward(self, x):
            raise RuntimeError("inductor says no\nmore detail")
    monkeypatch.setattr(torch, "compile", Broken)
    results = bench.main(["--device", "cpu", "--quick", "--rounds", "1", "--shapes", "tiny"])
    assert all(set(row["ms"]) >= {"eager", "fused"} and "compile" not in row["ms"] for row in results["rows"])
    assert results["rows"][0]["compile_error"] == "RuntimeError: inductor says no"
    out = capsys.readouterr().out
    assert "torch.compile failed for pointwise 8→16 @6², N 2: RuntimeError: inductor says no" in out


def test_fuse_converts_pointwise_conv_and_activation_pairs_only_when_asked():
    from nvblaslt.torch import FusedConv2d, fuse

    def model():
        return nn.Sequential(nn.Conv2d(8, 16, 1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                             nn.Conv2d(16, 4, 1), nn.GELU(approximate="tanh"), nn.Conv2d(4, 4, 1))
    plain = model()
    keys = list(plain.state_dict())
    untouched = fuse(model())
    assert not any(isinstance(m, FusedConv2d) for m in untouched.modules())  # opt-in: NCHW models keep working
    fused = fuse(plain, convolutions=True)
    kinds = [type(m).__name__ for m in fused]
    assert kinds == ["FusedConv2d", "Identity", "Conv2d", "ReLU", "FusedConv2d", "Identity", "Conv2d"]
    assert fused[0].activation == "relu" and fused[4].activation == "gelu"
    assert list(fused.state_dict()) == keys
    assert fused[0].weight is plain[0].weight  # shared, not copied
    with pytest.raises(TypeError, match="convolutions"):
        fuse(model(), convolutions="yes")
