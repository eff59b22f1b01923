"""nvblaslt.torch: FusedLinear, FusedSequential, fuse() and the custom ops behind them.

CPU tests run the torch-ops implementation (the same math, the same op registrations, fake
implementations and autograd formula); GPU tests (marker ``gpu``) run nvblaslt's cuBLASLt path
against nn.Linear, gradcheck, torch.compile, CUDA graphs and checkpoints.
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
from nvblaslt.torch import _composite, _functional, _gemms, _ops  # noqa: E402
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

def _op_arguments(device="cpu", dtype=torch.float32):
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
    first, chained, backward = _op_arguments()
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


# ---- on the GPU -----------------------------------------------------------------------------------------

TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def _cuda_pair(widths, activation, dtype, bias=True, backward="auto"):
    """(nn.Linear model, the fused model sharing nothing with it); ``backward=None``: FusedLinear layers in a
    plain nn.Sequential (no links, each layer's activation backward as torch ops)."""
    reference = mlp(widths, activation, bias=bias).to("cuda", dtype)
    fused = fuse(copy.deepcopy(reference), backward=backward or "unfused")
    if backward is None:
        fused = nn.Sequential(*fused)
    return reference, fused


class _Decided(nn.Module):
    """A ReLU whose decisions are given: z * mask (the float64 model taking the fused model's decisions)."""

    def __init__(self, mask):
        super().__init__()
        self.mask = mask

    def forward(self, z):
        return z * self.mask.reshape(z.shape).to(z.dtype)


def _record_relu_decisions(monkeypatch) -> list:
    """Per ReLU layer the fused model runs, the decisions its backward takes: the bitmask where the next
    layer's GEMM takes the ReLU's backward (DRELU / DRELU_BGRAD mask with it), else the output > 0."""
    decisions = []
    layer = _functional.layer

    def recording(x2, weight, bias, activation, state, chain=None):
        out, passed = layer(x2, weight, bias, activation, state, chain)
        if activation == "relu":
            decisions.append(unpack_relu_mask(passed[1], out.shape[1]).T if passed is not None else out > 0)
        return out, passed

    monkeypatch.setattr(_functional, "layer", recording)
    return decisions


def _float64_preactivations(reference, x) -> list:
    """The float64 model's input to each ReLU, (tokens, features)."""
    exact = copy.deepcopy(reference).double()
    seen = []
    hooks = [m.register_forward_hook(lambda m, args, out: seen.append(args[0].reshape(-1, args[0].shape[-1])))
             for m in exact if isinstance(m, nn.ReLU)]
    with torch.no_grad():
        exact(x.double())
    for hook in hooks:
        hook.remove()
    return seen


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_gpu_forward_and_backward_match_nn_linear(dtype, activation, variant, monkeypatch):
    """Odd widths, leading batch dims, random inputs; the fused result is compared with a float64 run of
    the same model: no further from it than nn.Linear in ``dtype`` is (or the dtype's tolerance).

    ReLU: a decision at z ≈ 0 may go either way in a 16/32-bit result (for some kernels cuBLASLt rounds
    the product to the result type before it adds the bias, so |z| below half an ulp of the product is
    a coin toss; one flipped decision moves the gradients of this small model by ~3 %). So the decisions
    must match float64's wherever |z| exceeds 1 % of the layer's largest, and the gradients are compared
    with the float64 model taking the fused model's own decisions (the bitmask where the backward masks
    with it)."""
    backward, bias = VARIANTS[variant]
    torch.manual_seed(9)
    reference, fused = _cuda_pair((37, 130, 53, 19), activation, dtype, bias=bias, backward=backward)
    decisions = _record_relu_decisions(monkeypatch)
    x = torch.randn(3, 7, 37, device="cuda", dtype=dtype, requires_grad=True)
    upstream = torch.randn(3, 7, 19, device="cuda", dtype=dtype)
    (y_ref, g_ref), (y_ours, g_ours) = run_both(reference, fused, x, upstream)
    y_64, g_64 = forward_backward(copy.deepcopy(reference).double(), x.double(), upstream.double())
    y_given, g_given = y_64, g_64
    if activation == "relu":
        preactivations = _float64_preactivations(reference, x)
        assert len(decisions) == len(preactivations) == 2
        for z, taken in zip(preactivations, decisions):
            decided = z.abs() > 1e-2 * z.abs().max()
            assert torch.equal(taken[decided], (z > 0)[decided])
        given = copy.deepcopy(reference).double()
        for index, mask in zip([i for i, m in enumerate(given) if isinstance(m, nn.ReLU)], decisions):
            given[index] = _Decided(mask)
        y_given, g_given = forward_backward(given, x.double(), upstream.double())
    assert y_ours.dtype == dtype and y_ours.shape == (3, 7, 19)
    assert rel(y_ours, y_given) <= max(3 * rel(y_ref, y_64), TOL[dtype])
    for ours, theirs, exact, given_grad in zip(g_ours, g_ref, g_64, g_given):
        assert ours.dtype == dtype and ours.shape == exact.shape and ours.is_contiguous()
        assert rel(ours, given_grad) <= max(3 * rel(theirs, exact), TOL[dtype])


@pytest.mark.gpu
def test_gpu_relu_aux_matches_the_cpu_implementations_bitmask():
    torch.manual_seed(10)
    x, w, b = torch.randn(33, 20), torch.randn(150, 20), torch.randn(150)
    cpu = torch.ops.nvblaslt.linear(x, w, b, "relu", True, None, "none", None, None)
    gpu = torch.ops.nvblaslt.linear(x.cuda(), w.cuda(), b.cuda(), "relu", True, None, "none", None, None)
    assert gpu[1].shape == cpu[1].shape and gpu[1].stride() == cpu[1].stride() and gpu[1].dtype == torch.int8
    z = (x @ w.T + b).T
    decided = z.abs() > 1e-3
    assert torch.equal(unpack_relu_mask(gpu[1].cpu(), 150)[decided], (z > 0)[decided])
    torch.testing.assert_close(gpu[0].cpu(), cpu[0], rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_gpu_fake_implementations_match_the_real_outputs():
    """opcheck compares every output's shape, strides and dtype with the fake implementation's (the aux
    padding is not compared: cuBLASLt leaves it unwritten)."""
    first, chained, backward = _op_arguments("cuda")
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    for op, args in ((torch.ops.nvblaslt.linear.default, first), (torch.ops.nvblaslt.linear.default, chained),
                     (torch.ops.nvblaslt.linear_backward.default, backward)):
        torch.library.opcheck(op, args, test_utils=utils)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_gpu_gradcheck_float64(activation, capsys):
    """float64 finite differences; where cuBLASLt has no float64 kernel for an epilog, that step runs as
    torch ops (nvblaslt.torch._refused_fp64 lists them)."""
    torch.manual_seed(11)
    model = fuse(mlp((4, 7, 6, 3), activation, last_activation=True).to("cuda", torch.float64))
    names = [n for n, _ in model.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in model.parameters())
    x = torch.randn(5, 4, device="cuda", dtype=torch.float64, requires_grad=True)

    def f(x, *params):
        return torch.func.functional_call(model, dict(zip(names, params)), (x,))

    assert torch.autograd.gradcheck(f, (x, *params), nondet_tol=1e-12)
    with capsys.disabled():
        refused = sorted(e.name for e in _gemms.refused_fp64)
        print(f"\n  float64 epilogs cuBLASLt refused (run as torch ops): {refused or 'none'}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gpu_torch_compile_fullgraph_matches_eager(dtype):
    torch._dynamo.reset()
    torch.manual_seed(12)
    _, model = _cuda_pair((64, 256, 128, 32), "gelu", dtype)
    x = torch.randn(8, 16, 64, device="cuda", dtype=dtype, requires_grad=True)
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    compiled = torch.compile(model, fullgraph=True)
    y0, g0 = forward_backward(model, x)
    for _ in range(2):  # the second call runs the compiled graphs again, without recompiling
        y1, g1 = forward_backward(compiled, x)
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(y1, y0, **tolerance)
    for a, e in zip(g1, g0):
        torch.testing.assert_close(a, e, **tolerance)


@pytest.mark.gpu
@pytest.mark.parametrize("backward", ["auto", "epilog"])
def test_gpu_make_graphed_callables_replays_like_eager(backward):
    torch.manual_seed(13)
    _, model = _cuda_pair((32, 128, 64, 16), "relu", torch.float32, backward=backward)
    eager = copy.deepcopy(model)
    sample = torch.randn(24, 32, device="cuda", requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(model, (sample,))
    for seed in range(3):
        torch.manual_seed(100 + seed)
        x = torch.randn(24, 32, device="cuda", requires_grad=True)
        upstream = torch.randn(24, 16, device="cuda")
        (y0, g0), (y1, g1) = run_both(eager, graphed, x, upstream)
        torch.testing.assert_close(y1, y0, rtol=1e-6, atol=1e-6)
        for a, e in zip(g1, g0):
            torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_gpu_whole_training_step_captured_in_a_cuda_graph():
    """forward + backward + optimizer step captured once, replayed on new inputs written in place."""
    torch.manual_seed(14)
    _, model = _cuda_pair((32, 96, 48, 8), "gelu", torch.float32)
    eager = copy.deepcopy(model)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, eager)]
    static_x = torch.randn(16, 32, device="cuda")
    static_target = torch.randn(16, 8, device="cuda")

    def step(m, optimizer, x, target):
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(m(x), target)
        loss.backward()
        optimizer.step()
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: plans are made outside the capture
        for _ in range(3):
            step(eager, optimizers[1], static_x, static_target)
            step(model, optimizers[0], static_x, static_target)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizers[0].zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = step(model, optimizers[0], static_x, static_target)
    for seed in range(3):
        torch.manual_seed(200 + seed)
        x, target = torch.randn(16, 32, device="cuda"), torch.randn(16, 8, device="cuda")
        static_x.copy_(x)
        static_target.copy_(target)
        graph.replay()
        loss = step(eager, optimizers[1], x, target)
        torch.testing.assert_close(static_loss, loss, rtol=1e-5, atol=1e-6)
    for a, e in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_gpu_checkpoint_of_nn_linear_model_loads():
    torch.manual_seed(15)
    reference = mlp((48, 96, 24), "relu").cuda()
    buffer = io.BytesIO()
    torch.save(reference.state_dict(), buffer)
    buffer.seek(0)
    fused = fuse(mlp((48, 96, 24), "relu")).cuda()
    fused.load_state_dict(torch.load(buffer, map_location="cuda"))
    x = torch.randn(10, 48, device="cuda")
    torch.testing.assert_close(fused(x), reference(x), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_gpu_other_consumers_in_place_and_inference():
    torch.manual_seed(16)
    x = torch.randn(12, 20, device="cuda")
    w1, b1 = torch.randn(40, 20, device="cuda", requires_grad=True), torch.randn(40, device="cuda", requires_grad=True)
    w2, b2 = torch.randn(8, 40, device="cuda", requires_grad=True), torch.randn(8, device="cuda", requires_grad=True)
    params = (w1, b1, w2, b2)
    h, state = _ops.layer(x, w1, b1, "gelu", None, "epilog")
    assert state is not None
    y, _ = _ops.layer(h, w2, b2, "none", state)
    ours = torch.autograd.grad(y.sum() + (h ** 2).sum(), params)
    h_ref = nn.functional.gelu(nn.functional.linear(x, w1, b1), approximate="tanh")
    theirs = torch.autograd.grad(nn.functional.linear(h_ref, w2, b2).sum() + (h_ref ** 2).sum(), params)
    for a, e in zip(ours, theirs):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
    layer = FusedLinear(20, 40, activation="gelu", device="cuda")
    out = layer(x)
    out += 1.0
    out.sum().backward()
    with torch.no_grad():
        expected = nn.functional.gelu(nn.functional.linear(x, layer.weight, layer.bias), approximate="tanh")
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
