"""nvblaslt.torch: FusedLinear, FusedSequential, fuse() and the custom ops behind them.

These run the torch-ops implementation on the CPU (the same math, the same op registrations, fake
implementations and autograd formula), and the CUDA path's orchestration against an emulated
nvblaslt.matmul. The cuBLASLt path on a GPU is tested in tests/gpu/test_torch_gpu.py, with the
helpers here.
"""

from __future__ import annotations

import copy
import io
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from nvblaslt import NvblasltTypeError, NvblasltValueError  # noqa: E402
from nvblaslt import torch as nvtorch  # noqa: E402
from nvblaslt.torch import _composite, _gemms, _ops  # noqa: E402
from nvblaslt.torch import FusedLinear, FusedSequential, fuse, linear  # noqa: E402

ACTIVATION_MODULES = {"relu": nn.ReLU, "gelu": lambda: nn.GELU(approximate="tanh")}


def mlp(widths, activation, bias=True, last_activation=False):
    """nn.Linear → activation → … → nn.Linear (activation after the last one too if asked)."""
    layers = []
    for index, (n_in, n_out) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(n_in, n_out, bias=bias))
        if activation and (last_activation or index < len(widths) - 2):
            layers.append(ACTIVATION_MODULES[activation]())
    return nn.Sequential(*layers)


def rel(a, b) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def forward_backward(model, x, upstream=None):
    """(output, [grad of x if it requires grad, grads of the parameters]) of one step from zeroed gradients."""
    for p in model.parameters():
        p.grad = None
    xi = x.detach().clone().requires_grad_(x.requires_grad)
    y = model(xi)
    y.backward(upstream if upstream is not None else torch.ones_like(y))
    grads = ([xi.grad] if x.requires_grad else []) + [p.grad.clone() for p in model.parameters()]
    return y.detach(), grads


def run_both(reference, fused, x, upstream=None):
    return forward_backward(reference, x, upstream), forward_backward(fused, x, upstream)


# ---- import, module API, state_dict --------------------------------------------------------------------

def test_import_nvblaslt_does_not_import_torch():
    code = "import sys, nvblaslt; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("bias", [True, False])
def test_fused_linear_has_nn_linears_parameters_init_and_keys(bias):
    torch.manual_seed(3)
    ours = FusedLinear(11, 7, bias=bias, activation="relu", dtype=torch.float64)
    torch.manual_seed(3)
    theirs = nn.Linear(11, 7, bias=bias, dtype=torch.float64)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    for key, value in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value) and ours.state_dict()[key].dtype == torch.float64
    assert "activation='relu'" in repr(ours)


def test_checkpoint_of_nn_linear_loads_into_fused_models():
    torch.manual_seed(0)
    reference = mlp((6, 10, 8, 4), "gelu")
    buffer = io.BytesIO()
    torch.save(reference.state_dict(), buffer)
    fresh = fuse(mlp((6, 10, 8, 4), "gelu"))
    buffer.seek(0)
    fresh.load_state_dict(torch.load(buffer))  # strict: the same keys
    x = torch.randn(5, 6)
    torch.testing.assert_close(fresh(x), reference(x))
    single = FusedLinear(6, 10)
    single.load_state_dict(reference[0].state_dict())
    torch.testing.assert_close(single(x), reference[0](x))


def test_fuse_folds_activations_into_identity_slots_and_shares_parameters():
    reference = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 8), nn.GELU(approximate="tanh"),
                              nn.Dropout(0.0), nn.Linear(8, 3), nn.LayerNorm(3), nn.Linear(3, 2))
    fused = fuse(reference)
    assert isinstance(fused, FusedSequential)
    kinds = [type(m).__name__ for m in fused]
    assert kinds == ["FusedLinear", "Identity", "FusedLinear", "Identity", "Dropout", "FusedLinear", "LayerNorm",
                     "FusedLinear"]
    assert [m.activation for m in fused if isinstance(m, FusedLinear)] == ["relu", "gelu", "none", "none"]
    assert list(fused.state_dict()) == list(reference.state_dict())
    assert all(a is b for a, b in zip(fused.parameters(), reference.parameters()))
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(fused(x), reference(x))


def test_fuse_converts_inside_other_modules():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 4))
            self.head = nn.Linear(4, 2)

        def forward(self, x):
            return self.head(self.mlp(x) + x)

    torch.manual_seed(0)
    block = Block()
    expected = block(torch.ones(3, 4))
    keys = list(block.state_dict())
    converted = fuse(block)
    assert converted is block and isinstance(block.mlp, FusedSequential) and isinstance(block.head, FusedLinear)
    assert list(block.state_dict()) == keys
    torch.testing.assert_close(block(torch.ones(3, 4)), expected)


# ---- exact GELU and bad arguments are refused ------------------------------------------------------------

@pytest.mark.parametrize("request_", ["gelu_erf", "gelu_exact", "GELU_ERF"])
def test_exact_gelu_is_refused_not_approximated(request_):
    with pytest.raises(NvblasltValueError, match="activation: .*exact \\(erf\\) GELU.*tanh"):
        FusedLinear(3, 4, activation=request_)
    with pytest.raises(NvblasltValueError, match="activation: "):
        linear(torch.ones(2, 3), torch.ones(4, 3), activation=request_)


def test_fuse_refuses_an_exact_gelu_after_a_linear():
    with pytest.raises(NvblasltValueError, match=r"module\[1\]: nn.GELU\(approximate='none'\) is exact"):
        fuse(nn.Sequential(nn.Linear(3, 4), nn.GELU(), nn.Linear(4, 2)))
    with pytest.raises(NvblasltValueError, match=r"module.body\[3\]"):
        holder = nn.Module()
        holder.body = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 4), nn.GELU())
        fuse(holder)


def test_bad_arguments_name_themselves():
    with pytest.raises(NvblasltValueError, match="activation: expected None, 'relu' or 'gelu'"):
        FusedLinear(3, 4, activation="tanh")
    with pytest.raises(NvblasltTypeError, match="weight: expected dtype torch.float32"):
        linear(torch.ones(2, 3), torch.ones(4, 3, dtype=torch.float64))
    with pytest.raises(NvblasltValueError, match=r"x: expected shape \(…, 3\)"):
        linear(torch.ones(2, 5), torch.ones(4, 3))
    with pytest.raises(NvblasltValueError, match=r"bias: expected shape \(4,\)"):
        linear(torch.ones(2, 3), torch.ones(4, 3), torch.ones(5))
    with pytest.raises(NvblasltTypeError, match="x: expected float16, bfloat16, float32 or float64"):
        linear(torch.ones(2, 3, dtype=torch.int32), torch.ones(4, 3, dtype=torch.int32))
    with pytest.raises(NvblasltValueError, match="backward: expected one of"):
        FusedSequential(nn.Linear(2, 2), backward="fused")
    with pytest.raises(NvblasltValueError, match="backward: expected one of"):
        fuse(nn.Sequential(nn.Linear(2, 2)), backward="bias_gradient")


# ---- the math on CPU ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_nn_functional_on_cpu(dtype, activation, bias):
    torch.manual_seed(1)
    x = torch.randn(2, 3, 5, 7, dtype=dtype, requires_grad=True)
    w = torch.randn(6, 7, dtype=dtype, requires_grad=True)
    b = torch.randn(6, dtype=dtype, requires_grad=True) if bias else None
    ours = linear(x, w, b, activation)
    z = nn.functional.linear(x, w, b)
    theirs = {None: z, "relu": torch.relu(z), "gelu": nn.functional.gelu(z, approximate="tanh")}[activation]
    assert ours.shape == (2, 3, 5, 6) and ours.dtype == dtype
    torch.testing.assert_close(ours, theirs)
    g = torch.randn_like(ours)
    grads = torch.autograd.grad(ours, [x, w] + ([b] if bias else []), g)
    expected = torch.autograd.grad(theirs, [x, w] + ([b] if bias else []), g)
    for a, e in zip(grads, expected):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("backward", nvtorch.BACKWARDS)
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_fused_sequential_matches_nn_sequential_on_cpu(activation, backward):
    torch.manual_seed(2)
    reference = mlp((9, 16, 12, 5), activation, last_activation=True).double()
    fused = fuse(copy.deepcopy(reference), backward=backward)
    x = torch.randn(4, 3, 9, dtype=torch.float64, requires_grad=True)
    (y0, g0), (y1, g1) = run_both(reference, fused, x, torch.randn(4, 3, 5, dtype=torch.float64))
    torch.testing.assert_close(y1, y0)
    for a, e in zip(g1, g0):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("chain", ["epilog", "bgradb"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_gradient_is_exact_when_an_activation_output_has_other_consumers(activation, chain):
    """The link carries the next layer's part of the gradient; a second consumer's part arrives on the
    output itself and goes through the activation's derivative: both must add up."""
    torch.manual_seed(4)
    x = torch.randn(6, 5, dtype=torch.float64)
    w1, b1 = torch.randn(8, 5, dtype=torch.float64, requires_grad=True), torch.randn(8, dtype=torch.float64,
                                                                                    requires_grad=True)
    w2, b2 = torch.randn(3, 8, dtype=torch.float64, requires_grad=True), torch.randn(3, dtype=torch.float64,
                                                                                    requires_grad=True)

    def ours(w1, b1, w2, b2):
        h, state = _ops.layer(x, w1, b1, activation, None, chain)
        assert state is not None  # the second layer is linked to the first
        y, _ = _ops.layer(h, w2, b2, "none", state)
        return y.sum() + (h ** 2).sum()

    def theirs(w1, b1, w2, b2):
        h = _composite.activate(nn.functional.linear(x, w1, b1), activation)
        return nn.functional.linear(h, w2, b2).sum() + (h ** 2).sum()

    params = (w1, b1, w2, b2)
    for a, e in zip(torch.autograd.grad(ours(*params), params), torch.autograd.grad(theirs(*params), params)):
        torch.testing.assert_close(a, e)
    assert torch.autograd.gradcheck(ours, params)


@pytest.mark.parametrize("backward", nvtorch.BACKWARDS)
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("bias", [True, False])
def test_gradcheck_float64_on_cpu(activation, bias, backward):
    torch.manual_seed(5)
    model = fuse(mlp((4, 7, 6, 3), activation, bias=bias, last_activation=True).double(), backward=backward)
    names = [n for n, _ in model.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in model.parameters())
    x = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)

    def f(x, *params):
        return torch.func.functional_call(model, dict(zip(names, params)), (x,))

    assert torch.autograd.gradcheck(f, (x, *params))


@pytest.mark.parametrize("activation", [None, "gelu"])
def test_in_place_ops_on_the_output_work(activation):
    """(ReLU keeps its output for the backward pass, as torch.relu does: modifying it in place is refused
    by autograd there too.)"""
    torch.manual_seed(6)
    layer = FusedLinear(5, 4, activation=activation)
    x = torch.randn(3, 5)
    y = layer(x)
    y += 1.0
    y.mul_(2.0)
    y.sum().backward()
    assert layer.weight.grad is not None


def test_inference_keeps_no_aux_and_no_link():
    layer = FusedLinear(5, 4, activation="gelu")
    x = torch.randn(3, 5)
    with torch.no_grad():
        out, state = _ops.layer(x, layer.weight, layer.bias, "gelu", None)
    assert state is None
    aux = torch.ops.nvblaslt.linear(x, layer.weight.detach(), layer.bias.detach(), "gelu", False, None, "none",
                                    None, None)[1]
    assert aux.numel() == 0
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), out)


def test_zero_tokens():
    layer = FusedLinear(5, 4, activation="relu")
    empty = layer(torch.randn(0, 5, requires_grad=True))
    assert empty.shape == (0, 4)
    empty.sum().backward()


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_autocast_casts_as_for_nn_linear(compiled):
    torch.manual_seed(20)
    reference = mlp((5, 8, 3), "relu")
    model = fuse(copy.deepcopy(reference))
    if compiled:
        torch._dynamo.reset()
        model = torch.compile(model, fullgraph=True, backend="aot_eager")
    x = torch.randn(4, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, expected = model(x), reference(x)
    assert y.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(y, expected)
    y.float().sum().backward()
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())


def test_relu_aux_is_cublaslts_bitmask_layout():
    """The CPU aux is what cuBLASLt returns: column-major (ld_bytes, T), ld a multiple of 16 bytes,
    bit i of byte j in column t set when z[t, 8j + i] > 0."""
    torch.manual_seed(7)
    x, w = torch.randn(5, 3), torch.randn(21, 3)
    out, aux = torch.ops.nvblaslt.linear(x, w, None, "relu", True, None, "none", None, None)[:2]
    assert aux.shape == (16, 5) and aux.stride() == (1, 16) and aux.dtype == torch.int8
    z = x @ w.T
    torch.testing.assert_close(unpack_relu_mask(aux, 21), (z > 0).T)
    gelu_aux = torch.ops.nvblaslt.linear(x, w, None, "gelu", True, None, "none", None, None)[1]
    assert gelu_aux.shape == (24, 5) and gelu_aux.stride() == (1, 24)
    torch.testing.assert_close(gelu_aux[:21], z.T)


def unpack_relu_mask(aux, rows):
    """(ld_bytes, T) int8 bitmask -> (rows, T) booleans."""
    shifts = torch.arange(8, device=aux.device, dtype=torch.int32).view(1, 8, 1)
    bits = (aux.to(torch.int32).unsqueeze(1) & 0xFF) >> shifts & 1
    return bits.reshape(-1, aux.shape[1])[:rows].bool()


# ---- the CUDA path's orchestration, against an emulated nvblaslt.matmul on the CPU -------------------------

class EmulatedMatmul:
    """nvblaslt.matmul's contract, emulated with torch ops on CPU tensors: the epilogs' math, the aux and
    bias-gradient layouts, and the checks whose failure would mean the CUDA path calls it wrongly (operands
    autograd would record; BGRADB without a row-major B; an aux not as the forward made it).
    ``order``: how D is laid out — nvmath-python's rule ("nvmath"), always column-major ("column", the
    rule before it) or always row-major ("row"); the CUDA path must be right under each."""

    def __init__(self, order="nvmath", bias_gradient_shape="vector", relu_aux_dtype=torch.int8):
        self.order, self.bias_gradient_shape, self.relu_aux_dtype = order, bias_gradient_shape, relu_aux_dtype
        self.epilogs = []
        self.refuse = set()  # epilog names answered with CUBLAS_STATUS_NOT_SUPPORTED

    def __call__(self, a, b, *, epilog=None, epilog_inputs=None):
        from nvblaslt import CublasLtError, MatmulEpilog

        name = MatmulEpilog(epilog).name
        self.epilogs.append(name)
        if name in self.refuse:
            raise CublasLtError("cublasLtMatmulAlgoGetHeuristic", 15, "CUBLAS_STATUS_NOT_SUPPORTED", "emulated")
        inputs = dict(epilog_inputs or {})
        for t in (a, b, *inputs.values()):  # nvblaslt reads their memory; a view autograd records is waste
            assert not (t.requires_grad and torch.is_grad_enabled()), "an operand autograd records"
        z = a @ b
        m, n = z.shape
        outputs = {}
        if "bias" in inputs:
            assert inputs["bias"].shape == (m,) and inputs["bias"].dtype == z.dtype
            z = z + inputs["bias"][:, None]
        if name in ("RELU", "RELU_BIAS", "RELU_AUX", "RELU_AUX_BIAS"):
            if "AUX" in name:
                aux = torch.empty_strided((-(-m // 128) * 16, n), (1, -(-m // 128) * 16), dtype=torch.int8)
                _composite.pack_relu_mask((z > 0).T, aux)
                outputs["relu_aux"] = aux.view(self.relu_aux_dtype)
            z = torch.relu(z)
        elif name in ("GELU", "GELU_BIAS", "GELU_AUX", "GELU_AUX_BIAS"):
            if "AUX" in name:
                ld = -(-m // 8) * 8
                aux = torch.full((n, ld), float("nan"), dtype=z.dtype).T  # padding never read
                aux[:m] = z
                outputs["gelu_aux"] = aux
            z = nn.functional.gelu(z, approximate="tanh")
        elif name in ("DRELU", "DRELU_BGRAD"):
            aux = inputs["relu_aux"]
            assert aux.dtype in (torch.int8, torch.uint8) and aux.shape[1] == n and aux.stride() == (1, aux.shape[0])
            z = z * unpack_relu_mask(aux.view(torch.int8), m)
            if name == "DRELU_BGRAD":
                outputs["drelu_bgrad"] = z.sum(1)
        elif name in ("DGELU", "DGELU_BGRAD"):
            aux = inputs["gelu_aux"]
            assert aux.dtype == z.dtype and aux.shape[1] == n and aux.stride() == (1, aux.shape[0])
            z = torch.ops.aten.gelu_backward(z, aux[:m], approximate="tanh")
            if name == "DGELU_BGRAD":
                outputs["dgelu_bgrad"] = z.sum(1)
        elif name == "BGRADB":
            assert b.stride()[1] == 1, "BGRADB has kernels only for a row-major B"
            outputs["bgradb"] = b.sum(0)
        else:
            assert name in ("DEFAULT", "BIAS"), name
        for key in ("drelu_bgrad", "dgelu_bgrad", "bgradb"):
            if key in outputs and self.bias_gradient_shape == "column":
                outputs[key] = outputs[key][:, None]
        column = {"column": True, "row": False}.get(self.order, bool(inputs or outputs) or a.stride()[0] == 1)
        d = z.T.contiguous().T if column else z.contiguous()
        return (d, outputs) if outputs else d


@pytest.fixture(params=[("nvmath", "vector", torch.int8), ("column", "column", torch.uint8),
                        ("row", "vector", torch.int8)], ids=["nvmath-order", "column-major", "row-major"])
def emulated_cuda_path(request, monkeypatch):
    """Run the ops' CUDA implementation on the CPU, with nvblaslt.matmul emulated."""
    emulated = EmulatedMatmul(*request.param)
    monkeypatch.setattr(_gemms, "matmul", emulated)
    monkeypatch.setattr(_ops, "uses_cublaslt", lambda x: True)
    return emulated


# (variant, FusedSequential.backward or None for FusedLinear layers in a plain nn.Sequential, bias)
VARIANTS = {"auto": ("auto", True), "epilog": ("epilog", True), "bgradb": ("bgradb", True),
            "unfused": ("unfused", True), "standalone": (None, True), "no-bias": ("auto", False)}


def _expected_epilogs(activation: str, backward: str | None, bias: bool) -> tuple[set, set]:
    """(epilogs a step must use, epilogs it must not) for a ``mlp(…, activation)`` step."""
    mode = {"auto": nvtorch.AUTO_BACKWARD[activation] or "unfused", None: "unfused"}.get(backward, backward)
    prefix, masking = activation.upper(), {"relu": "DRELU", "gelu": "DGELU"}[activation]
    keeps_aux = mode != "unfused" or activation == "gelu"
    forward = f"{prefix}{'_AUX' if keeps_aux else ''}{'_BIAS' if bias else ''}"
    must = {forward} | ({"BIAS", "BGRADB"} if bias else set())
    if mode == "epilog" and bias:
        must.add(f"{masking}_BGRAD")
    elif mode != "unfused":
        must.add(masking)
    never = {masking, f"{masking}_BGRAD"} - must
    if not keeps_aux:
        never.add(f"{prefix}_AUX_BIAS" if bias else f"{prefix}_AUX")
    return must, never


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_cuda_path_orchestration_matches_nn_linear(emulated_cuda_path, activation, variant):
    backward, bias = VARIANTS[variant]
    torch.manual_seed(17)
    reference = mlp((7, 20, 9, 4), activation, bias=bias).double()
    fused = fuse(copy.deepcopy(reference), backward=backward or "unfused")
    if backward is None:
        fused = nn.Sequential(*fused)
    x = torch.randn(2, 5, 7, dtype=torch.float64, requires_grad=True)
    (y0, g0), (y1, g1) = run_both(reference, fused, x, torch.randn(2, 5, 4, dtype=torch.float64))
    torch.testing.assert_close(y1, y0)
    for a, e in zip(g1, g0):
        torch.testing.assert_close(a, e)
        assert a.is_contiguous()
    used = set(emulated_cuda_path.epilogs)
    must, never = _expected_epilogs(activation, backward, bias)
    assert must <= used and not used & never, (sorted(used), sorted(must), sorted(never))


def test_cuda_path_gradcheck_and_inference(emulated_cuda_path):
    torch.manual_seed(18)
    model = fuse(mlp((4, 9, 6, 3), "gelu", last_activation=True).double())
    names = [n for n, _ in model.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in model.parameters())
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)

    def f(x, *params):
        return torch.func.functional_call(model, dict(zip(names, params)), (x,))

    assert torch.autograd.gradcheck(f, (x, *params))
    emulated_cuda_path.epilogs.clear()
    with torch.no_grad():
        model(x)
    assert emulated_cuda_path.epilogs == ["GELU_BIAS", "GELU_BIAS", "GELU_BIAS"]


@pytest.mark.parametrize("bias", [False, True])
def test_cuda_path_inference_returns_row_major_results_whatever_ds_order(emulated_cuda_path, bias):
    # no gradient recorded: the forward GEMM alone, and still the row-major result the op gives
    torch.manual_seed(20)
    x, weight = torch.randn(8, 1, dtype=torch.float64), torch.randn(16, 1, dtype=torch.float64)
    b = torch.randn(16, dtype=torch.float64) if bias else None
    with torch.no_grad():
        y = linear(x, weight, b, activation="relu")
    assert y.stride() == (16, 1)
    torch.testing.assert_close(y, torch.relu(nn.functional.linear(x, weight, b)))
    assert emulated_cuda_path.epilogs == ["RELU_BIAS" if bias else "RELU"]


@pytest.mark.parametrize("refused", [("DRELU_BGRAD", "BGRADB"), ("RELU_AUX_BIAS", "DRELU_BGRAD"), ("BIAS",)])
def test_cuda_path_runs_refused_float64_epilogs_as_torch_ops(emulated_cuda_path, monkeypatch, refused):
    monkeypatch.setattr(_gemms, "refused_fp64", set())
    emulated_cuda_path.refuse = set(refused)
    torch.manual_seed(19)
    reference = mlp((5, 12, 8, 3), "relu").double()
    fused = fuse(copy.deepcopy(reference), backward="epilog")  # the mode that uses every refused epilog
    x = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    for _ in range(2):  # the second time, refused epilogs are not asked for again
        (y0, g0), (y1, g1) = run_both(reference, fused, x)
        torch.testing.assert_close(y1, y0)
        for a, e in zip(g1, g0):
            torch.testing.assert_close(a, e)
    assert {e.name for e in _gemms.refused_fp64} == set(refused)
    assert emulated_cuda_path.epilogs.count(refused[0]) == 1


def test_cuda_path_lets_other_errors_through(emulated_cuda_path):
    from nvblaslt import CublasLtError

    emulated_cuda_path.refuse = {"RELU_BIAS"}
    layer = FusedLinear(4, 6, activation="relu")  # float32: no fallback
    with pytest.raises(CublasLtError, match="NOT_SUPPORTED"):
        layer(torch.randn(3, 4))


# ---- fake implementations, opcheck, torch.compile -----------------------------------------------------------

def op_arguments(device="cpu", dtype=torch.float32):
    """Arguments of a plain and a chained nvblaslt::linear, and of a nvblaslt::linear_backward."""
    make = lambda *s: torch.randn(*s, device=device, dtype=dtype)  # noqa: E731
    x, w1, b1, w2, b2 = make(6, 5), make(9, 5), make(9), make(4, 9), make(4)
    first = (x, w1, b1, "gelu", True, None, "none", None, None)
    out, aux, link, link_bias = torch.ops.nvblaslt.linear(*first)
    chained = (out, w2.requires_grad_(), b2.requires_grad_(), "relu", True, aux, "gelu", link.requires_grad_(),
               link_bias.requires_grad_())
    out2, aux2 = torch.ops.nvblaslt.linear(*(t.detach() if isinstance(t, torch.Tensor) else t for t in chained))[:2]
    backward = (make(6, 4), None, out, w2.detach(), out2, aux2, "relu", True, aux, "gelu", True, True, True)
    return first, chained, backward


def test_opcheck_on_cpu():
    first, chained, backward = op_arguments()
    torch.library.opcheck(torch.ops.nvblaslt.linear.default, first)
    torch.library.opcheck(torch.ops.nvblaslt.linear.default, chained)
    torch.library.opcheck(torch.ops.nvblaslt.linear_backward.default, backward)


def test_fake_tensors_give_shapes_without_computing():
    from torch._subclasses.fake_tensor import FakeTensorMode

    model = fuse(mlp((5, 9, 4), "relu"))
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        x = mode.from_tensor(torch.randn(2, 3, 5))
        y = model(x)
        out, aux, link, link_bias = torch.ops.nvblaslt.linear(mode.from_tensor(torch.randn(6, 5)),
                                                              model[0].weight.detach(), model[0].bias.detach(),
                                                              "relu", True, None, "none", None, None)
    assert y.shape == (2, 3, 4)
    assert aux.shape == (16, 6) and aux.stride() == (1, 16) and aux.dtype == torch.int8
    assert link.shape == (6, 9) and link.stride() == (0, 0) and link_bias.shape == (9,)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph_without_graph_breaks_on_cpu(backend):
    torch._dynamo.reset()
    torch.manual_seed(8)
    model = fuse(mlp((6, 12, 10, 3), "gelu"))
    x = torch.randn(4, 6, requires_grad=True)
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    (y0, g0), (y1, g1) = run_both(model, compiled, x)
    torch.testing.assert_close(y1, y0)
    for a, e in zip(g1, g0):
        torch.testing.assert_close(a, e)
