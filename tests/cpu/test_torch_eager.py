"""The eager path of nvblaslt.torch (``_eager``): plain tensors in eager mode run the ops' own code and
autograd formula without the custom-op dispatch; anything a mode, transform or compiler can observe
goes through the ops. Both paths must give the same values and gradients (float64, on the CPU, where
the same formulas run as torch ops)."""

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from nvblaslt.torch import FusedSequential, FusedLinear, grouped_mm, linear  # noqa: E402
from nvblaslt.torch import _eager  # noqa: E402

F64 = torch.float64


class _Seen(TorchDispatchMode):
    """Records the ops dispatched under it (a mode active: the calls must go through the ops)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _origin(out) -> str:
    """The name of the autograd node that made ``out``, past linear()'s reshape."""
    node = out.grad_fn
    while type(node).__name__.startswith("View"):
        node = node.next_functions[0][0]
    return type(node).__name__


def _grads(out, *leaves):
    torch.manual_seed(5)
    upstream = torch.randn_like(out)
    return torch.autograd.grad(out, leaves, upstream)


def test_plain_eager_calls_skip_the_op_and_a_dispatch_mode_sees_the_op():
    torch.manual_seed(0)
    x = torch.randn(6, 5, dtype=F64, requires_grad=True)
    weight = torch.randn(4, 5, dtype=F64, requires_grad=True)
    bias = torch.randn(4, dtype=F64, requires_grad=True)
    eager = linear(x, weight, bias, "gelu")
    assert _origin(eager) == "LinearBackward"  # the autograd.Function, not the op's wrapper
    with _Seen() as seen:
        through_op = linear(x, weight, bias, "gelu")
    assert "nvblaslt.linear.default" in seen.ops
    assert "nvblaslt" in _origin(through_op)
    torch.testing.assert_close(eager, through_op)
    for mine, theirs in zip(_grads(eager, x, weight, bias), _grads(through_op, x, weight, bias)):
        torch.testing.assert_close(mine, theirs)


def test_without_grad_the_eager_path_records_nothing_and_gives_the_same_values():
    x, weight = torch.randn(3, 4, dtype=F64), torch.randn(2, 4, dtype=F64)
    out = linear(x, weight, None, "relu")
    assert out.grad_fn is None and not out.requires_grad
    torch.testing.assert_close(out, torch.relu(x @ weight.T))


@pytest.mark.parametrize("backward", ["unfused", "bgradb", "epilog"])
def test_a_fused_sequence_trains_the_same_on_both_paths(backward):
    # the links between layers carry the activation's backward: both paths must keep them exact
    torch.manual_seed(1)
    model = FusedSequential(FusedLinear(5, 7, activation="relu", dtype=F64),
                            FusedLinear(7, 6, activation="gelu", dtype=F64), FusedLinear(6, 3, dtype=F64),
                            backward=backward)
    x = torch.randn(4, 5, dtype=F64, requires_grad=True)
    params = [x, *model.parameters()]
    eager = model(x)
    with _Seen():
        through_op = model(x)
    torch.testing.assert_close(eager, through_op)
    for mine, theirs in zip(_grads(eager, *params), _grads(through_op, *params)):
        torch.testing.assert_close(mine, theirs)


def test_grouped_mm_takes_the_eager_path_with_the_same_gradients():
    torch.manual_seed(2)
    a = torch.randn(9, 4, dtype=F64, requires_grad=True)
    b = torch.randn(3, 4, 5, dtype=F64, requires_grad=True)
    offs = torch.tensor([3, 3, 9], dtype=torch.int32)
    eager = grouped_mm(a, b, offs)
    assert _origin(eager) == "GroupedMMBackward"
    with _Seen() as seen:
        through_op = grouped_mm(a, b, offs)
    assert "nvblaslt.grouped_mm.default" in seen.ops
    torch.testing.assert_close(eager, through_op)
    for mine, theirs in zip(_grads(eager, a, b), _grads(through_op, a, b)):
        torch.testing.assert_close(mine, theirs)
    assert torch.autograd.gradcheck(lambda a, b: grouped_mm(a, b, offs), (a, b))
    # second order: the backward's own grouped GEMMs are differentiable (create_graph)
    assert torch.autograd.gradgradcheck(lambda a, b: grouped_mm(a, b, offs), (a, b))


@pytest.mark.parametrize("kernel, activation", [(1, "relu"), (1, "gelu"), (3, "relu")])
def test_a_convolution_takes_the_eager_path_with_the_same_values_and_gradients(kernel, activation):
    from nvblaslt.torch._conv import FusedConv2d

    torch.manual_seed(3)
    layer = FusedConv2d(3, 4, kernel, padding=kernel // 2, activation=activation, dtype=F64)
    x = torch.randn(2, 3, 5, 5, dtype=F64).contiguous(memory_format=torch.channels_last).requires_grad_()
    params = [x, *layer.parameters()]
    eager = layer(x)
    assert _origin(eager) == "Conv2dBackward"  # the autograd.Function, not the op's wrapper
    with _Seen() as seen:
        through_op = layer(x)
    assert "nvblaslt.conv2d.default" in seen.ops
    assert "nvblaslt" in _origin(through_op)
    torch.testing.assert_close(eager, through_op)
    for mine, theirs in zip(_grads(eager, *params), _grads(through_op, *params)):
        torch.testing.assert_close(mine, theirs)
    with torch.no_grad():
        inference = layer(x)
    assert inference.grad_fn is None and inference.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(inference, eager.detach())
    expected = torch.nn.functional.conv2d(x, layer.weight, layer.bias, padding=kernel // 2)
    expected = torch.relu(expected) if activation == "relu" else torch.nn.functional.gelu(expected, approximate="tanh")
    torch.testing.assert_close(eager, expected)


def test_a_convolutions_second_order_gradient_runs_the_backward_op():
    from nvblaslt.torch._conv import FusedConv2d

    layer = FusedConv2d(3, 2, 1, activation="gelu", dtype=F64)
    x = torch.randn(2, 3, 4, 4, dtype=F64).contiguous(memory_format=torch.channels_last)
    grad_weight, = torch.autograd.grad(layer(x).sum(), layer.weight, create_graph=True)
    assert "nvblaslt_conv2d_backward" in type(grad_weight.grad_fn).__name__


def test_a_second_order_gradient_runs_the_backward_op_which_says_it_has_no_formula():
    # under create_graph the backward must not run directly: on CUDA its GEMMs record no graph
    x = torch.randn(3, 4, dtype=F64, requires_grad=True)
    weight = torch.randn(2, 4, dtype=F64, requires_grad=True)
    grad_weight, = torch.autograd.grad(linear(x, weight, None, "gelu").sum(), weight, create_graph=True)
    assert "nvblaslt_linear_backward" in type(grad_weight.grad_fn).__name__


def test_meta_tensors_get_the_ops_fake_shapes():
    a, b = torch.empty(9, 4, device="meta"), torch.empty(3, 4, 5, device="meta")
    assert grouped_mm(a, b, torch.empty(3, dtype=torch.int32, device="meta")).shape == (9, 5)
    assert not _eager.direct(a)


def test_what_decides_the_path():
    plain = torch.ones(2)
    assert _eager.direct(plain, None, torch.nn.Parameter(torch.ones(2)))
    with _Seen():
        assert not _eager.direct(plain)

    class Sub(torch.Tensor):
        pass

    assert not _eager.direct(plain.as_subclass(Sub))
    assert not torch.func.vmap(lambda t: torch.tensor(_eager.direct(t)))(torch.ones(3, 2)).any()
    traced = torch.jit.trace(lambda x: linear(x, torch.ones(2, 3, dtype=F64)), torch.ones(4, 3, dtype=F64))
    assert "nvblaslt::linear" in str(traced.graph)  # a trace records the op, not a call it cannot see
    assert _eager.wants_grad(torch.ones(1, requires_grad=True)) and not _eager.wants_grad(plain, None)
    with torch.no_grad():
        assert not _eager.wants_grad(torch.ones(1, requires_grad=True))
